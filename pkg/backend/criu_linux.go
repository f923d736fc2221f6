package backend

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/procnet"
	"fiberd.io/fiberd/pkg/procrec"
)

// Driving CRIU.
//
// fiberd runs the criu command line, one process per park or resume, rather
// than CRIU's RPC service (criu swrk, go-criu): the command needs no new
// dependency, and the RPC saves only the fork+exec of criu (about 1-2 ms
// of the 11-26 ms a park or resume takes, measured in the recipe), since
// swrk also starts one criu per request. The flags, and why:
//
//	--tcp-close          live TCP connections are closed, not repaired: a resumed
//	                     fiber's peers are gone anyway (no TCP_REPAIR, no iptables)
//	--skip-in-flight     connections still in the listener's accept queue are reset
//	                     instead of failing the dump
//	--manage-cgroups=ignore  cgroups are fiberd's: the fiber is restored into the
//	                     cgroup criu runs in, which Resume starts in the fiber's leaf
//	--restore-sibling    the restored fiber becomes fiberd's child (criu's sibling),
//	                     so fiberd reaps it by pidfd
//	--inherit-fd         descriptors fiberd hands over: the unix listener, the log pipe
//
// criu runs with a minimal environment and dies with fiberd (Pdeathsig).
// Its log (dump.log, restore.log) stays in the image directory; on failure
// its error lines are quoted in the error. What kind of failure it was
// (ErrNoSpace, ErrBusy, a pid taken) is read from criu's exit and the state
// it left, never from that text (decision 99): criuFailure, dumpFailure,
// restoreFailure.

// criuKdatDir is where the CRIU that hack/criu.sh builds keeps its kerndat
// cache (its RUNDIR). The probe creates it, 0700, when fiberd runs with
// CAP_SYS_ADMIN; the cache must be on a tmpfs, and saves about 12 ms per
// call. An unprivileged criu keeps it in $XDG_RUNTIME_DIR, which fiberd
// points at the same directory.
const criuKdatDir = "/dev/shm/fiberd-criu"

// minCRIU is the oldest CRIU that works here: 3.17 fails on kernels 6.13
// and later (vdso), 4.1 cannot dump a TCP socket on 6.18.
var minCRIU = [2]int{4, 2}

// criu is a probed, working CRIU.
type criu struct {
	path    string
	version string
	// unprivileged: fiberd lacks CAP_SYS_ADMIN but has
	// CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE; criu runs with
	// --unprivileged.
	unprivileged bool
	// patched: the build carries fiberd's patches (its --version says
	// "GitID: fiberd1", see hack/criu.sh), which parking a fiber of an
	// isolated grant needs.
	patched bool
	env     []string
}

// probeCRIU checks that the criu at path can park and resume fibers here.
// Every error names what is missing and how to fix it.
func probeCRIU(ctx context.Context, path, envPath string) (*criu, error) {
	if path == "" {
		return nil, errors.New("no CRIU configured (Config.CRIU is empty): build one with hack/criu.sh and give its path")
	}
	if err := isExecutable(path); err != nil {
		return nil, fmt.Errorf("no CRIU at %s (%v): build it with hack/criu.sh (make criu)", path, err)
	}
	c := &criu{path: path, env: []string{"PATH=" + envPath}}
	out, err := c.command(ctx, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --version failed: %v: %s", path, err, firstLine(out))
	}
	c.version, err = parseCRIUVersion(out)
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", path, err)
	}
	c.patched = criuGitID(out) == criuPatches
	if !versionAtLeast(c.version, minCRIU) {
		return nil, fmt.Errorf("CRIU at %s is %s; fiberd needs %d.%d or later (3.17 fails on kernels 6.13 and later, 4.1 cannot dump TCP sockets on 6.18): build 4.2.1 with hack/criu.sh", path, c.version, minCRIU[0], minCRIU[1])
	}
	caps, err := effectiveCaps()
	if err != nil {
		return nil, fmt.Errorf("reading fiberd's capabilities: %w", err)
	}
	switch {
	case caps&(1<<unix.CAP_SYS_ADMIN) != 0:
		// Without /dev/shm criu just keeps no cache; a directory someone
		// else made would feed criu a cache of theirs.
		if err := ownDir(criuKdatDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	case caps&(1<<unix.CAP_CHECKPOINT_RESTORE) != 0 && caps&(1<<unix.CAP_SYS_PTRACE) != 0:
		c.unprivileged = true
		if err := ownDir(criuKdatDir); err == nil {
			c.env = append(c.env, "XDG_RUNTIME_DIR="+criuKdatDir)
		}
	default:
		var miss []string
		if caps&(1<<unix.CAP_CHECKPOINT_RESTORE) == 0 {
			miss = append(miss, "CAP_CHECKPOINT_RESTORE")
		}
		if caps&(1<<unix.CAP_SYS_PTRACE) == 0 {
			miss = append(miss, "CAP_SYS_PTRACE")
		}
		return nil, fmt.Errorf("fiberd lacks %s (or CAP_SYS_ADMIN): CRIU cannot park fibers; add them to the container's securityContext.capabilities", strings.Join(miss, " and "))
	}
	out, err = c.command(ctx, c.flags("check")...).CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("criu check failed (%v): %s", err, lastLines(out, 3))
	}
	return c, nil
}

// command is criu with args, killed when ctx ends or fiberd dies.
func (c *criu) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.path, args...)
	cmd.Env = c.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// flags puts --unprivileged after the action when needed.
func (c *criu) flags(action string, args ...string) []string {
	out := []string{action}
	if c.unprivileged {
		out = append(out, "--unprivileged")
	}
	return append(out, args...)
}

// criuPatches is the GitID hack/criu.sh gives the CRIU it builds with
// fiberd's patches (hack/criu-patches).
const criuPatches = "fiberd1"

// criuGitID reads "GitID: ..." from criu --version; "" when absent.
func criuGitID(out []byte) string {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "GitID:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// parseCRIUVersion reads "Version: 4.2.1" from criu --version.
func parseCRIUVersion(out []byte) (string, error) {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			v = strings.TrimSpace(v)
			if v != "" {
				return v, nil
			}
		}
	}
	return "", fmt.Errorf("no version in %q", firstLine(out))
}

// versionAtLeast compares the major.minor of a dotted version.
func versionAtLeast(v string, min [2]int) bool {
	parts := strings.SplitN(v, ".", 3)
	var n [2]int
	for i := 0; i < 2; i++ {
		if i >= len(parts) {
			break
		}
		d := parts[i]
		if j := strings.IndexFunc(d, func(r rune) bool { return r < '0' || r > '9' }); j >= 0 {
			d = d[:j]
		}
		n[i], _ = strconv.Atoi(d)
	}
	return n[0] > min[0] || (n[0] == min[0] && n[1] >= min[1])
}

// effectiveCaps reads CapEff from /proc/self/status.
func effectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("/proc/self/status has no CapEff")
}

// ownDir makes dir (0700) or checks that it is a directory of this user
// that nobody else can write: criu (as root) trusts the cache in it.
func ownDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("CRIU's kerndat cache directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("CRIU's kerndat cache directory: %w", err)
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || sys == nil || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("CRIU's kerndat cache directory %s is not a directory of uid %d writable only by it (mode %v): remove it", dir, os.Geteuid(), st.Mode())
	}
	return nil
}

// criuFailure turns a failed criu run into an error: criu's exit, the
// error lines of its log and, when criu exited by itself and the image's
// filesystem is full (filesystemFull, read from dir, a directory on it),
// that; the error then wraps ErrNoSpace. The log's path is named when it is
// kept. The log's lines are shown to say what went wrong; they decide
// nothing (decision 99): the classes come from criu's exit and the state
// it left.
func criuFailure(action string, runErr error, logPath, dir string, kept bool) error {
	msg := errorLines(logPath, 4)
	full := criuExited(runErr) && filesystemFull(dir)
	if full {
		msg = "the image's filesystem is full (no space left on device)" + prefixed("; ", msg)
	}
	if msg == "" {
		msg = "its log has no error line"
	}
	if kept {
		msg += " (log " + logPath + ")"
	}
	if full {
		return fmt.Errorf("criu %s failed (%v): %s: %w", action, runErr, msg, ErrNoSpace)
	}
	return fmt.Errorf("criu %s failed (%v): %s", action, runErr, msg)
}

// criuExited reports whether a criu run failed by exiting with a status of
// its own, rather than being killed by a signal or never starting: only
// then did criu find something wrong with the fiber or the image, and only
// then does the state it left say why.
func criuExited(runErr error) bool {
	var ee *exec.ExitError
	return errors.As(runErr, &ee) && ee.Exited()
}

// filesystemFull reports whether the filesystem holding dir takes no more
// of fiberd's data: statfs shows no block available to it, or one more
// block cannot be allocated in dir (ENOSPC, or EDQUOT when it is a quota
// that ran out, which statfs does not show). The probe file is removed.
func filesystemFull(dir string) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return false
	}
	if st.Bavail == 0 {
		return true
	}
	f, err := os.CreateTemp(dir, ".fiberd-space-*")
	if err != nil {
		return noSpace(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n := min(max(int64(st.Bsize), 512), 1<<20)
	err = unix.Fallocate(int(f.Fd()), 0, 0, n)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = f.Write(make([]byte, n))
	}
	return noSpace(err)
}

// noSpace reports whether err says a filesystem or a quota is full.
func noSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}

// pidHolder is what held a pid just before a criu restore started that
// must give a fiber that pid back.
type pidHolder struct {
	held  bool   // a process (or thread) had the pid
	start uint64 // its start time, in clock ticks after boot
}

// holderOf reads what holds pid now.
func holderOf(pid int) pidHolder {
	st, err := procrec.ReadStat(pid)
	if err != nil {
		return pidHolder{}
	}
	return pidHolder{held: true, start: st.Start}
}

// stillHeld reports whether the process that held pid before the restore
// holds it still (the same start time): the restore then could not give
// the fiber its pid back.
func (h pidHolder) stillHeld(pid int) bool {
	now := holderOf(pid)
	return h.held && now.held && now.start == h.start
}

// unixPeersOf counts the stream sockets in the network namespace of pid
// that are bound to addr, the address of the fiber's unix listener, other
// than the listener (inode ino) itself: the server ends of connections to
// it, accepted or waiting to be (a connection's server end shares its
// listener's address from the connect on). CRIU cannot dump those, as it
// cannot dump the client end outside the fiber.
func unixPeersOf(pid int, addr string, ino uint64) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil || addr == "" {
		return 0
	}
	defer f.Close()
	n := 0
	procnet.ScanUnix(f, func(s procnet.UnixSocket) {
		if s.Type == "0001" && s.Path == addr && s.Inode != ino {
			n++
		}
	})
	return n
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// errorLines returns up to n "Error" lines of a criu log, without their
// timestamps and source positions, joined by "; ".
func errorLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "Error (")
		if i < 0 {
			continue
		}
		rest := line[i+len("Error ("):]
		if j := strings.Index(rest, "): "); j >= 0 {
			rest = rest[j+3:]
		}
		rest = strings.TrimSpace(rest)
		if strings.HasPrefix(rest, "rlimit: Can't setup RLIMIT_NOFILE") {
			continue // criu raising its own limit; harmless
		}
		if len(out) == 0 || out[len(out)-1] != rest {
			out = append(out, rest)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "; ")
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return string(line)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// imageFiles lists the regular files of an image directory with their
// sizes, skipping the manifest.
func imageFiles(dir string) (map[string]int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := make(map[string]int64, len(ents))
	for _, e := range ents {
		if e.Name() == manifestName || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		files[e.Name()] = info.Size()
	}
	return files, nil
}

// checkFiles compares an image directory with its manifest's list.
func checkFiles(dir string, want map[string]int64) error {
	for name, size := range want {
		st, err := os.Lstat(filepath.Join(dir, name))
		switch {
		case err != nil:
			return fmt.Errorf("image file %s: %v: %w", name, err, ErrImageUnusable)
		case !st.Mode().IsRegular() || st.Size() != size:
			return fmt.Errorf("image file %s has %d bytes, the manifest says %d: %w", name, st.Size(), size, ErrImageUnusable)
		}
	}
	return nil
}
