package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// fix is the advice every delegation error ends with.
const fix = "give fiberd a delegated, writable cgroup v2 subtree, or set -cgroup-root"

// wanted are the controllers fiberd relies on; each one the root does not
// offer is logged once. Every other offered controller is enabled silently.
var wanted = []string{"cpu", "io", "memory", "pids"}

// warnFunc logs msg the first time key is seen.
type warnFunc func(key, msg string, kv ...any)

func mountInfo() (point, root string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "", fmt.Errorf("cgroup: %w", err)
	}
	defer f.Close()
	return ParseMountInfo(f)
}

func mount() (string, error) {
	point, _, err := mountInfo()
	return point, err
}

func self() (string, error) {
	point, root, err := mountInfo()
	if err != nil {
		return "", err
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	defer f.Close()
	p, err := ParseProcCgroup(f)
	if err != nil {
		return "", err
	}
	return selfDir(point, root, p)
}

func delegate(root string, log logr.Logger) (string, error) {
	root = filepath.Clean(root)
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("cgroup: delegate %q: path is not absolute; %s", root, fix)
	}
	if err := checkDir(root); err != nil {
		return "", err
	}
	leaf := filepath.Join(root, "fiberd")
	if err := makeDir(leaf); err != nil {
		return "", fmt.Errorf("cgroup: delegate %s: %w; %s", root, err, fix)
	}
	if err := moveAll(root, leaf); err != nil {
		return "", err
	}
	grants := filepath.Join(root, "grants")
	if err := makeDir(grants); err != nil {
		return "", fmt.Errorf("cgroup: delegate %s: %w; %s", root, err, fix)
	}
	warned := map[string]bool{}
	warn := func(key, msg string, kv ...any) {
		if !warned[key] {
			warned[key] = true
			log.Info(msg, kv...)
		}
	}
	for _, dir := range []string{root, grants} {
		if err := enableControllers(dir, warn); err != nil {
			return "", fmt.Errorf("cgroup: delegate %s: %w; %s", root, err, fix)
		}
	}
	return grants, nil
}

// moveAll moves every process in from/cgroup.procs into to, repeating while
// processes keep appearing (a process forking while it is moved).
func moveAll(from, to string) error {
	const rounds = 20
	for range rounds {
		pids, err := readProcs(from)
		if err != nil {
			return fmt.Errorf("cgroup: delegate %s: %w; %s", from, err, fix)
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			err := addProc(to, pid)
			if err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cgroup: delegate %s: moving pid %d into %s: %w; %s", from, pid, to, err, fix)
			}
		}
	}
	return fmt.Errorf("cgroup: delegate %s: processes kept appearing in cgroup.procs after %d rounds of moving them into %s; %s", from, rounds, to, fix)
}

// checkDir fails unless dir is a cgroup v2 directory.
func checkDir(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return fmt.Errorf("cgroup: %s is not a cgroup v2 directory: %w; %s", dir, err, fix)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err != nil {
		return fmt.Errorf("cgroup: %s is not a cgroup v2 directory (a cgroup v1 hierarchy?): %w; %s", dir, err, fix)
	}
	return nil
}

func makeDir(dir string) error {
	err := os.Mkdir(dir, 0o755)
	if err == nil || errors.Is(err, fs.ErrExist) {
		return nil
	}
	return err
}

// enableControllers enables in dir/cgroup.subtree_control each controller
// offered in dir/cgroup.controllers, one write per controller. A refused or
// absent one goes to warn; only an unreadable cgroup.controllers fails.
func enableControllers(dir string, warn warnFunc) error {
	offered, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	have := splitWords(offered)
	on := splitWords(enabled)
	for _, c := range wanted {
		if !slices.Contains(have, c) {
			warn("controller:"+c, "cgroup controller not offered; skipped", "controller", c, "cgroup", dir)
		}
	}
	for _, c := range have {
		if slices.Contains(on, c) {
			continue
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+c); err != nil {
			warn("controller:"+c, "cgroup controller cannot be enabled; skipped", "controller", c, "cgroup", dir, "err", err.Error())
		}
	}
	return nil
}

func splitWords(b []byte) []string { return strings.Fields(string(b)) }

// writeFile writes s to an existing kernel file in one write(2).
func writeFile(name, s string) error {
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func openDir(dir string) (*os.File, error) {
	return os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

func openEntry(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, "cgroup.procs"), unix.O_PATH|unix.O_CLOEXEC, 0)
}

func chownProcs(dir string, id int) error {
	if err := os.Lchown(filepath.Join(dir, "cgroup.procs"), id, id); err != nil {
		return fmt.Errorf("cgroup: give user %d %s/cgroup.procs: %w", id, dir, err)
	}
	return nil
}

func enterFD(dirfd int) error {
	fd, err := unix.Openat(dirfd, "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup: enter: open cgroup.procs: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte("0")); err != nil {
		return fmt.Errorf("cgroup: enter: write cgroup.procs: %w", err)
	}
	return nil
}

func addProc(dir string, pid int) error {
	if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("cgroup %s: add pid %d: %w", dir, pid, err)
	}
	return nil
}

func readProcs(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	pids, err := parseProcs(data)
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	return pids, nil
}

func kill(ctx context.Context, dir string) error {
	err := writeFile(filepath.Join(dir, "cgroup.kill"), "1")
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cgroup %s: kill: %w", dir, err)
	}
	if _, serr := os.Stat(dir); serr != nil {
		return fmt.Errorf("cgroup %s: kill: %w", dir, serr)
	}
	return killEach(ctx, dir)
}

// killEach is Kill where cgroup.kill is absent: SIGKILL every pid in the
// subtree, then look again, until no pid is listed. Between rounds it waits
// a little (1 ms doubling to 50 ms) for the killed to exit; this pause only
// paces the loop and decides nothing.
func killEach(ctx context.Context, dir string) error {
	pause := time.Millisecond
	for {
		pids, err := subtreeProcs(dir)
		if err != nil {
			return fmt.Errorf("cgroup %s: kill: %w", dir, err)
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cgroup %s: kill pid %d: %w", dir, pid, err)
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cgroup %s: kill: %w", dir, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// subtreeProcs lists the pids in dir and every cgroup below it. A cgroup
// removed while walking is skipped.
func subtreeProcs(dir string) ([]int, error) {
	pids, err := readProcs(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return pids, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		more, err := subtreeProcs(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		pids = append(pids, more...)
	}
	return pids, nil
}

func freeze(ctx context.Context, dir string, on bool) error {
	val, verb := "0", "thaw"
	if on {
		val, verb = "1", "freeze"
	}
	if err := writeFile(filepath.Join(dir, "cgroup.freeze"), val); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir); serr == nil {
				return fmt.Errorf("cgroup %s: %s: cgroup.freeze is absent (kernel before 5.2): %w", dir, verb, errors.ErrUnsupported)
			}
		}
		return fmt.Errorf("cgroup %s: %s: %w", dir, verb, err)
	}
	if err := waitEvent(ctx, dir, "frozen", val); err != nil {
		return fmt.Errorf("cgroup %s: %s: %w", dir, verb, err)
	}
	return nil
}

// waitEvent returns once cgroup.events in dir shows key with value want.
// It sleeps in poll(2) on an inotify watch of cgroup.events (the kernel
// signals every change of the file as a modification) and an eventfd that
// ctx's end writes to. For "populated", a dir that is gone counts as "0".
func waitEvent(ctx context.Context, dir, key, want string) error {
	events := filepath.Join(dir, "cgroup.events")
	goneOK := key == "populated" && want == "0"

	// Usually the state is already there (a fiber's leaf is empty by the
	// time its end is handled): one read, and no inotify or eventfd set up.
	// Anything else falls through to the loop, which reads again once the
	// watch is in place, so no change is missed.
	if data, err := os.ReadFile(events); err == nil {
		if v, ok := eventValue(data, key); ok && v == want {
			return nil
		}
	} else if goneOK && errors.Is(err, fs.ErrNotExist) {
		return nil
	}

	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cgroup %s: inotify: %w", dir, err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, events, unix.IN_MODIFY); err != nil {
		if goneOK && errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("cgroup %s: watch cgroup.events: %w", dir, err)
	}

	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("cgroup %s: eventfd: %w", dir, err)
	}
	defer unix.Close(efd)
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(woke)
		var one = [8]byte{1}
		_, _ = unix.Write(efd, one[:])
	})
	defer func() {
		if !stop() {
			<-woke // the func ran or runs: let it finish before efd closes
		}
	}()

	buf := make([]byte, 4096)
	for {
		data, err := os.ReadFile(events)
		switch {
		case goneOK && errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if v, ok := eventValue(data, key); !ok {
			return fmt.Errorf("cgroup %s: no %q in cgroup.events", dir, key)
		} else if v == want {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("cgroup %s: poll: %w", dir, err)
		}
		for { // drain; the contents do not matter, only that something changed
			if _, err := unix.Read(in, buf); err != nil {
				break
			}
		}
	}
}

// removeTree removes dir and every cgroup below it, children first. A leaf
// without child cgroups (a fiber's, usually) goes with one rmdir; only when
// that fails is the directory listed for children.
func removeTree(dir string) error {
	if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: remove: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroup %s: remove: %w", dir, err)
	}
	return nil
}

// readPressure returns "some avg10" of dir/name, or ok=false when the file
// is absent or PSI is off (EOPNOTSUPP).
func readPressure(dir, name string) (avg10 float64, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EOPNOTSUPP) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	v, err := parsePressure(data)
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %s: %w", dir, name, err)
	}
	return v, true, nil
}

func enabled(dir, controller string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return false, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	return slices.Contains(splitWords(b), controller), nil
}

func setMemoryLimit(dir string, max, high int64) error {
	if max <= 0 || high <= 0 || high > max {
		return fmt.Errorf("cgroup %s: memory limit high %d, max %d: want 0 < high <= max", dir, high, max)
	}
	for _, w := range []struct{ file, value string }{
		{"memory.high", strconv.FormatInt(high, 10)},
		{"memory.max", strconv.FormatInt(max, 10)},
	} {
		if err := writeFile(filepath.Join(dir, w.file), w.value); err != nil {
			return fmt.Errorf("cgroup %s: %s: %w", dir, w.file, err)
		}
	}
	if err := writeFile(filepath.Join(dir, "memory.oom.group"), "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cgroup %s: memory.oom.group: %w", dir, err)
	}
	return nil
}

func setPidsMax(dir string, n int64) error {
	if n <= 0 {
		return fmt.Errorf("cgroup %s: pids.max %d: want a positive count", dir, n)
	}
	if err := writeFile(filepath.Join(dir, "pids.max"), strconv.FormatInt(n, 10)); err != nil {
		return fmt.Errorf("cgroup %s: pids.max: %w", dir, err)
	}
	return nil
}

func setCPUWeight(dir string, w int) error {
	if w < 1 || w > 10000 {
		return fmt.Errorf("cgroup %s: cpu.weight %d: want 1 to 10000", dir, w)
	}
	if err := writeFile(filepath.Join(dir, "cpu.weight"), strconv.Itoa(w)); err != nil {
		return fmt.Errorf("cgroup %s: cpu.weight: %w", dir, err)
	}
	return nil
}

func oomKills(dir string) (int64, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "memory.events"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	v, found := eventValue(b, "oom_kill")
	if !found {
		return 0, true, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("cgroup %s: memory.events: oom_kill %q is not a count", dir, v)
	}
	return n, true, nil
}
