package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// maxLine bounds one line of the files parsed here; longer lines are an
// error rather than a large allocation.
const maxLine = 64 << 10

// ParseMountInfo reads /proc/<pid>/mountinfo text from r and returns the
// mount point of the first cgroup2 filesystem and the root of the hierarchy
// it shows (usually "/"; another path when a subtree is bind-mounted). Octal
// escapes such as \040 for a space are decoded. It fails when no line has
// fstype cgroup2 (the error wraps errors.ErrUnsupported) or r fails. Lines
// that are not well formed are skipped: the text is untrusted.
func ParseMountInfo(r io.Reader) (point, root string, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		// ID parent major:minor root point options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		root, point = unescapeOctal(fields[3]), unescapeOctal(fields[4])
		if !strings.HasPrefix(point, "/") || !strings.HasPrefix(root, "/") {
			continue
		}
		return path.Clean(point), path.Clean(root), nil
	}
	if err := sc.Err(); err != nil {
		return "", "", fmt.Errorf("cgroup: reading mountinfo: %w", err)
	}
	return "", "", fmt.Errorf("cgroup: no cgroup2 filesystem in mountinfo: %w", errors.ErrUnsupported)
}

// unescapeOctal decodes the kernel's \ooo escapes (space, tab, newline,
// backslash) in a mountinfo field; a malformed escape is kept as written.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			if s[i+1] <= '3' { // fits in a byte
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// ParseProcCgroup reads /proc/<pid>/cgroup text from r and returns the
// process's cgroup v2 path, the path of the "0::" line (e.g. "/" or
// "/kubepods/pod1/c1"), relative to the hierarchy's root. Both the v2-only
// form (one line) and the hybrid form (v1 lines first) are accepted. It fails
// when there is no "0::" line (cgroup v1 only; the error wraps
// errors.ErrUnsupported), the path is not absolute or clean, or r fails.
func ParseProcCgroup(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || id != "0" {
			continue
		}
		ctrls, p, ok := strings.Cut(rest, ":")
		if !ok || ctrls != "" {
			continue
		}
		p = strings.TrimSuffix(p, " (deleted)")
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p {
			return "", fmt.Errorf("cgroup: v2 path %q in /proc/self/cgroup is not an absolute clean path (is this process outside its cgroup namespace?)", p)
		}
		return p, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroup: reading /proc/self/cgroup: %w", err)
	}
	return "", fmt.Errorf("cgroup: no cgroup v2 (0::) line in /proc/self/cgroup: %w", errors.ErrUnsupported)
}

// selfDir joins the cgroup2 mount point with the process's cgroup path,
// taking away the part of the path above the mount's root.
func selfDir(point, root, p string) (string, error) {
	rel := p
	if root != "/" {
		switch {
		case p == root:
			rel = "/"
		case strings.HasPrefix(p, root+"/"):
			rel = strings.TrimPrefix(p, root)
		default:
			return "", fmt.Errorf("cgroup: this process's cgroup %q is outside the cgroup2 mount at %s (root %q)", p, point, root)
		}
	}
	return path.Join(point, rel), nil
}

// parsePressure returns the "some avg10" value of a PSI file
// ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0").
func parsePressure(data []byte) (float64, error) {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		fields := strings.Fields(string(line))
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, f := range fields[1:] {
			v, ok := strings.CutPrefix(f, "avg10=")
			if !ok {
				continue
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || !(x >= 0 && x <= 100) {
				return 0, fmt.Errorf("bad avg10 %q", v)
			}
			return x, nil
		}
	}
	return 0, errors.New(`no "some avg10=" in pressure file`)
}

// eventValue returns the value of key in cgroup.events text
// ("populated 1\nfrozen 0\n").
func eventValue(data []byte, key string) (string, bool) {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		k, v, ok := strings.Cut(strings.TrimSpace(string(line)), " ")
		if ok && k == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// parseProcs parses a cgroup.procs file: one decimal pid per line.
func parseProcs(data []byte) ([]int, error) {
	var pids []int
	for f := range strings.FieldsSeq(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("bad pid %q in cgroup.procs", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
