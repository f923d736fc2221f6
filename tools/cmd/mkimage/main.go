// Command mkimage packages files, typically static binaries, as a one-layer
// container image tarball that `ctr -n k8s.io images import` reads, with no
// registry and no container engine. The same inputs give the same digest
// (package image).
//
// Usage:
//
//	mkimage -ref REF -out FILE [-base] [-entrypoint PATH[,ARG...]] [-user UID[:GID]]
//	        [-env KEY=VALUE]... [-workdir DIR] [-dir PATH[:MODE]]... DEST=SRC[:MODE]...
//
// Each DEST=SRC copies the file SRC to the absolute path DEST in the image
// with MODE (octal; default: 0755 when SRC is executable, else 0644). -dir
// adds an empty directory (MODE default 0755; 1777 for a sticky,
// world-writable one). -base adds the base layout: /etc/passwd and
// /etc/group with root and nonroot (65532), /tmp, and the mount points a
// runtime expects. It prints the image's reference and manifest digest.
//
// Exit status: 0 when the tarball is written, 1 when it cannot be, 2 on bad
// usage (the message names the flag or argument).
package main

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"

	"fiberd.io/fiberd/tools/image"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var (
		ref, out, entry, user, workdir string
		base                           bool
		env, dirs, caps                listFlag
	)
	flags.StringVar(&ref, "ref", "", "image reference, e.g. fiberd.local/fiberd:dev (required)")
	flags.StringVar(&out, "out", "", "tarball to write (required)")
	flags.BoolVar(&base, "base", false, "add the base layout: /etc/passwd, /etc/group (root, nonroot 65532), /tmp, mount points")
	flags.StringVar(&entry, "entrypoint", "", "ENTRYPOINT: the program's path, then its arguments, comma-separated")
	flags.StringVar(&user, "user", "", "USER, uid[:gid] (default root)")
	flags.StringVar(&workdir, "workdir", "", "working directory (default /)")
	flags.Var(&env, "env", "KEY=VALUE of the image's environment (repeatable; default PATH only)")
	flags.Var(&dirs, "dir", "PATH[:MODE] of an empty directory (repeatable)")
	flags.Var(&caps, "caps", "DEST=CAP,... file capabilities (permitted and effective) of a file given as DEST=SRC, e.g. /usr/local/bin/fiberd=sys_admin,setuid,setgid (repeatable)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mkimage: "+format+"\n", a...)
		return 2
	}
	if ref == "" || out == "" {
		return usage("-ref and -out are required")
	}
	spec := image.Spec{Ref: ref, Base: base, User: user, WorkingDir: workdir, Env: env}
	if entry != "" {
		spec.Entrypoint = strings.Split(entry, ",")
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return usage("-env %q: want KEY=VALUE", e)
		}
	}
	for _, d := range dirs {
		p, mode, err := pathMode(d, 0o755)
		if err != nil {
			return usage("-dir %q: %v", d, err)
		}
		spec.Dirs = append(spec.Dirs, image.Dir{Path: p, Mode: mode})
	}
	if flags.NArg() == 0 {
		return usage("no DEST=SRC given: name at least one file")
	}
	for _, a := range flags.Args() {
		dest, src, ok := strings.Cut(a, "=")
		if !ok || dest == "" || src == "" {
			return usage("%q: want DEST=SRC[:MODE]", a)
		}
		src, mode, err := pathMode(src, 0)
		if err != nil {
			return usage("%q: %v", a, err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			fmt.Fprintf(stderr, "mkimage: %s: %v\n", dest, err)
			return 1
		}
		if mode == 0 {
			mode = 0o644
			if fi, err := os.Stat(src); err == nil && fi.Mode()&0o111 != 0 {
				mode = 0o755
			}
		}
		spec.Files = append(spec.Files, image.File{Path: dest, Mode: mode, Data: data})
	}
	for _, c := range caps {
		dest, names, ok := strings.Cut(c, "=")
		bits, err := capBits(names)
		if !ok || err != nil {
			return usage("-caps %q: want DEST=CAP,... (%v)", c, err)
		}
		i := slices.IndexFunc(spec.Files, func(f image.File) bool { return f.Path == dest })
		if i < 0 {
			return usage("-caps %q: no file %s is given", c, dest)
		}
		spec.Files[i].Caps |= bits
	}
	d, err := image.WriteFile(out, spec)
	if err != nil {
		fmt.Fprintf(stderr, "mkimage: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s\n", ref, d)
	return 0
}

// pathMode splits "PATH[:MODE]" with MODE in octal; def when absent.
func pathMode(s string, def fs.FileMode) (string, fs.FileMode, error) {
	p, m, ok := strings.Cut(s, ":")
	if !ok {
		return p, def, nil
	}
	n, err := strconv.ParseUint(m, 8, 32)
	if err != nil || n > 0o7777 {
		return "", 0, fmt.Errorf("mode %q is not octal permission bits (e.g. 0755, 1777)", m)
	}
	mode := fs.FileMode(n & 0o777)
	if n&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	if n&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if n&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	return p, mode, nil
}

// capNumbers are the capabilities -caps knows, by name without "cap_".
var capNumbers = map[string]uint{
	"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "kill": 5, "setgid": 6, "setuid": 7,
	"net_bind_service": 10, "net_admin": 12, "net_raw": 13, "sys_chroot": 18, "sys_ptrace": 19,
	"sys_admin": 21, "sys_resource": 24,
}

// capBits reads "sys_admin,setuid" (cap_ prefixes allowed) as a bit set.
func capBits(names string) (uint64, error) {
	var bits uint64
	for _, n := range strings.Split(names, ",") {
		c, ok := capNumbers[strings.TrimPrefix(strings.ToLower(strings.TrimSpace(n)), "cap_")]
		if !ok {
			return 0, fmt.Errorf("unknown capability %q", n)
		}
		bits |= 1 << c
	}
	return bits, nil
}
