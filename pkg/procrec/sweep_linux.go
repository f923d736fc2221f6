//go:build linux

package procrec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// sweepPollMillis is how long one poll of the killed processes lasts before
// ctx is checked again.
const sweepPollMillis = 100

// Swept is what Sweep ended.
type Swept struct {
	// Cgroups is how many recorded cgroups were killed and removed.
	Cgroups int
	// Processes is how many live processes were killed: recorded ones and
	// the members of their sessions.
	Processes int
	// Records is how many records were read.
	Records int
	// Left lists the cgroup records Sweep left alone because the cgroup
	// they name does not lie strictly under the cgroup root it was given;
	// their records are kept.
	Left []Left
}

// Left is a cgroup record Sweep did not act on: the cgroup it names exists
// but does not lie strictly under the cgroup root Sweep was given.
type Left struct {
	// Record is the record's file.
	Record string
	// Cgroup is the directory it names.
	Cgroup string
}

// Sweep ends what the records of d name, as the package doc says, and
// removes the records of what is gone. It returns once everything it
// killed has ended, or fails when ctx ends first (the records of what still
// runs are kept for the next Sweep) or a cgroup cannot be removed. A nil
// Dir sweeps nothing.
//
// A cgroup record is acted on only when the directory it names lies
// strictly under cgroupRoot (the agent's cgroup root; "" for none): below
// it, compared path element by path element once both are resolved (so
// neither ".." nor a symbolic link leads out of it), and not the root
// itself. A record naming a directory that exists elsewhere is left alone
// and kept, and listed in Swept.Left for the caller to report: it is either
// from a run whose cgroup root was another (whatever still runs in it is
// the operator's to end, and the record the only trace of it) or not
// fiberd's at all. A record naming a directory that no longer exists is
// removed wherever it pointed.
func (d *Dir) Sweep(ctx context.Context, cgroupRoot string) (Swept, error) {
	var sw Swept
	if d == nil {
		return sw, nil
	}
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return sw, fmt.Errorf("process records %s: %w", d.path, err)
	}
	type proc struct {
		pid   int
		start uint64
		path  string
		// after: a restore record (AddRestoring): start is the earliest
		// start time, and the process must lead its own session.
		after bool
	}
	var procs []proc
	var errs []error
	for _, e := range entries {
		name, path := e.Name(), filepath.Join(d.path, e.Name())
		switch {
		case strings.HasPrefix(name, "p-"):
			pid, start, ok := parseProcName(name)
			if !ok {
				_ = os.Remove(path)
				continue
			}
			sw.Records++
			procs = append(procs, proc{pid, start, path, false})
		case strings.HasPrefix(name, "r-"):
			pid, start, ok := parseProcName("p-" + strings.TrimPrefix(name, "r-"))
			if !ok {
				_ = os.Remove(path)
				continue
			}
			sw.Records++
			procs = append(procs, proc{pid, start, path, true})
		case strings.HasPrefix(name, "c-"):
			sw.Records++
			b, err := core.ReadFileBounded(path, 4096)
			dir := strings.TrimSpace(string(b))
			if err != nil || !filepath.IsAbs(dir) {
				_ = os.Remove(path) // unreadable: nothing to go on
				continue
			}
			if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(path) // gone: nothing to end
				continue
			}
			real, ok := under(cgroupRoot, dir)
			if !ok {
				sw.Left = append(sw.Left, Left{Record: path, Cgroup: dir})
				continue
			}
			switch err := cgroup.At(real).Destroy(ctx); {
			case err == nil:
				sw.Cgroups++
				_ = os.Remove(path)
			case errors.Is(err, fs.ErrNotExist):
				_ = os.Remove(path)
			default:
				errs = append(errs, fmt.Errorf("cgroup %s: %w", dir, err))
			}
		default:
			// A temporary file of an interrupted AddCgroup.
			_ = os.Remove(path)
		}
	}
	if len(procs) == 0 {
		return sw, errors.Join(errs...)
	}
	killed := map[int]bool{}

	// Whom to kill: each recorded process that is still itself, and the
	// members of its session started after it. A member may fork while
	// the sweep runs: the /proc scan is made again after each round of
	// kills, until one finds nothing left (a killed process forks no more,
	// so this ends).
	for {
		table := scanProc()
		targets := map[int]uint64{} // pid -> start
		for _, r := range procs {
			st, ok := table[r.pid]
			switch {
			case r.after && ok && (st.Start < r.start || st.Session != r.pid):
				continue // not what the restore brought back
			case !r.after && ok && st.Start != r.start:
				continue // the pid names another process, and so its session
			case ok && !st.Zombie:
				targets[r.pid] = st.Start
			}
			for pid, st := range table {
				if st.Session == r.pid && st.Start >= r.start && !st.Zombie {
					targets[pid] = st.Start
				}
			}
		}
		if len(targets) == 0 {
			break
		}
		var fds []int
		for pid, start := range targets {
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone meanwhile
			}
			if st, err := ReadStat(pid); err != nil || st.Start != start {
				_ = unix.Close(fd) // gone, and the pid reused, before the pidfd named it
				continue
			}
			if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err == nil && !killed[pid] {
				sw.Processes++
				killed[pid] = true
			}
			fds = append(fds, fd)
		}
		if err := waitGone(ctx, fds); err != nil {
			return sw, errors.Join(append(errs, err)...)
		}
	}
	for _, r := range procs {
		_ = os.Remove(r.path)
	}
	return sw, errors.Join(errs...)
}

// waitGone waits until every pidfd's process has ended (a zombie counts:
// the process's parent reaps it), closing the pidfds, or fails when ctx
// ends first.
func waitGone(ctx context.Context, fds []int) error {
	defer func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}()
	left := fds
	pfds := make([]unix.PollFd, 0, len(fds))
	for len(left) > 0 {
		pfds = pfds[:0]
		for _, fd := range left {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(pfds, sweepPollMillis); err != nil && !errors.Is(err, unix.EINTR) {
			return os.NewSyscallError("poll", err)
		}
		next := left[:0]
		for i, fd := range left {
			if pfds[i].Revents == 0 {
				next = append(next, fd)
			}
		}
		left = next
		if len(left) > 0 && ctx.Err() != nil {
			return fmt.Errorf("%d killed processes still running: %w", len(left), ctx.Err())
		}
	}
	return nil
}

// scanProc reads the stat of every process.
func scanProc() map[int]Stat {
	out := map[int]Stat{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := ReadStat(pid); err == nil {
			out[pid] = st
		}
	}
	return out
}

// under reports whether dir lies strictly under root, and returns dir
// resolved. Both must be absolute, and dir clean (as AddCgroup wrote it: a
// recorded path holding "." or ".." elements is not one fiberd wrote). dir
// must lie under root as written and also once both are resolved
// (filepath.EvalSymlinks), compared path element by path element: a
// symbolic link that leads out of the root, or into it from elsewhere, is
// not under it. The root itself is not under the root, an empty root has
// nothing under it, and a path that cannot be resolved is not under
// anything.
func under(root, dir string) (string, bool) {
	if root == "" || !filepath.IsAbs(root) || dir != filepath.Clean(dir) || !strictlyUnder(filepath.Clean(root), dir) {
		return "", false
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", false
	}
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil || !strictlyUnder(realRoot, realDir) {
		return "", false
	}
	return realDir, true
}

// strictlyUnder reports whether the clean absolute path p lies below the
// clean absolute directory root, element by element ("/a/bc" is not under
// "/a/b"), and is not root itself.
func strictlyUnder(root, p string) bool {
	if !filepath.IsAbs(root) || !filepath.IsAbs(p) {
		return false
	}
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// parseProcName reads "p-<pid>-<start>".
func parseProcName(name string) (pid int, start uint64, ok bool) {
	rest, _ := strings.CutPrefix(name, "p-")
	a, b, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	pid, err := strconv.Atoi(a)
	if err != nil || pid <= 0 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(b, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return pid, start, true
}
