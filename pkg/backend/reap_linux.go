package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/procrec"
)

// Reaping the fibers of an ended zygote.
//
// A fiber is the zygote's child. When the zygote ends, its fibers (killed
// by then) are reparented to the nearest child subreaper above it, else to
// the init of the pid namespace: fiberd in both of the cases that matter
// (PID 1 of a grant Pod, or a host fiberd that marked itself a subreaper at
// start-up). Nobody else will wait for them, so the proc backend does, but
// only for the fibers it knows of, each by a pidfd opened when the zygote
// reported it (CLONED). A pidfd names one process for good: waitid(P_PIDFD)
// can neither reap a process that later got the same pid number, nor steal
// the status of a child some os/exec waiter (a zygote's, an exec fiber's)
// is waiting for, as waiting for any child (wait4(-1)) or for a bare pid
// would. And a pidfd can be polled, so one goroutine waits for all of a
// zygote's fibers at once, bounded by a context, instead of a thread per
// fiber blocked in wait4.

// reapPollMillis is how long one poll of the pidfds lasts before the
// context is checked again.
const reapPollMillis = 100

// fiberPidfd opens a pidfd on the process a zygote reported as its fiber
// and checks it is that process: a child of the zygote that has not been
// reaped. A child of anyone else is refused, fiberd's own included (another
// grant's zygote is one): what a zygote reports is the template's word, and
// fiberd acts on no process the template did not fork (should the zygote
// have died meanwhile, its grant goes cold and the Clone fails anyway).
// The check closes the window in which the fiber ended, was reaped by the
// zygote and its pid was reused before the pidfd was opened: the pidfd's
// process, alive (or a zombie) both when the pidfd was opened and after
// /proc was read, is the one /proc described. It returns -1 and why when
// the fiber is already gone or is not what the zygote said; the proc
// backend calls it on CLONED. It also returns the fiber's start time (see
// procrec), read in the same look at /proc, 0 when it failed.
func fiberPidfd(pid, zygote int) (int, uint64, error) {
	fd, err := unix.PidfdOpen(pid, 0) // always close-on-exec
	if err != nil {
		return -1, 0, os.NewSyscallError("pidfd_open", err)
	}
	st, err := procrec.ReadStat(pid)
	if err == nil && st.PPid != zygote {
		err = fmt.Errorf("process %d is a child of %d, not of the zygote %d: %w", pid, st.PPid, zygote, errNotChild)
	}
	if err == nil {
		// EPERM says it exists too (a zygote that changed user).
		if serr := unix.PidfdSendSignal(fd, 0, nil, 0); serr != nil && !errors.Is(serr, unix.EPERM) {
			err = os.NewSyscallError("pidfd_send_signal", serr)
		}
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, 0, err
	}
	return fd, st.Start, nil
}

// fiberProcess finds the process a zygote reported with CLONED, in
// fiberd's PID namespace, and a pidfd on it. pid is what the zygote said
// (a pid in its own namespace when it is isolated), pidfd the descriptor
// it attached or -1. A pidfd is taken when it names a child of the zygote;
// without one, the pid is looked up among the zygote's children (by the
// NSpid of each) when the zygote has a PID namespace of its own, and used
// as is otherwise. It also returns the fiber's start time (see procrec),
// 0 when it could not be read. It returns pid 0 when an isolated zygote's
// fiber cannot be found; a pidfd of -1 with a pid means the fiber is not
// tracked for reaping (why in err). A pid or pidfd naming a process that is
// not the zygote's child is refused (pid 0), whatever the isolation.
func (z *zygote) fiberProcess(pid, pidfd int) (int, int, uint64, error) {
	zpid := z.proc.Pid
	if pidfd >= 0 {
		host, err := pidfdPID(pidfd)
		var st procrec.Stat
		if err == nil {
			st, err = procrec.ReadStat(host)
			if err == nil && st.PPid != zpid {
				err = fmt.Errorf("pidfd names process %d, which is a child of %d, not of the zygote %d: %w", host, st.PPid, zpid, errNotChild)
			}
		}
		if err == nil {
			return host, pidfd, st.Start, nil
		}
		_ = unix.Close(pidfd)
		if z.level == IsolationNone && !errors.Is(err, errNotChild) {
			return z.unisolatedChild(pid, err)
		}
		return 0, -1, 0, err
	}
	if z.level != IsolationNone {
		host, err := childByNSpid(zpid, pid)
		if err != nil {
			return 0, -1, 0, err
		}
		fd, start, err := fiberPidfd(host, zpid)
		if errors.Is(err, errNotChild) {
			return 0, -1, 0, err
		}
		return host, fd, start, err
	}
	return z.unisolatedChild(pid, nil)
}

// unisolatedChild is fiberProcess for the pid an unisolated zygote said,
// in fiberd's own namespace: a child of the zygote is taken with a pidfd; a
// process that is not one is refused (pid 0); a pid no process has any
// more is the fiber already gone, kept without a pidfd (the zygote's EXITED
// follows). prior is why the zygote's own pidfd could not serve.
func (z *zygote) unisolatedChild(pid int, prior error) (int, int, uint64, error) {
	fd, start, err := fiberPidfd(pid, z.proc.Pid)
	err = errors.Join(prior, err)
	if fd < 0 && errors.Is(err, errNotChild) {
		return 0, -1, 0, err
	}
	return pid, fd, start, err
}

// errNotChild is a process a zygote reported that is not its child.
var errNotChild = errors.New("not a child of the zygote")

// pidfdPID reads the pid, in fiberd's namespace, of the process a pidfd
// refers to, from /proc/self/fdinfo; it fails for a descriptor that is no
// pidfd, or whose process has ended.
func pidfdPID(fd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pid <= 0 {
				return 0, fmt.Errorf("pidfd %d: process ended or not in fiberd's namespace (Pid: %s)", fd, strings.TrimSpace(v))
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("descriptor %d is not a pidfd", fd)
}

// childByNSpid finds the child of zygote whose pid in the zygote's own PID
// namespace (the second NSpid field) is nspid.
func childByNSpid(zygote, nspid int) (int, error) {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(zygote) + "/task")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(nspid)
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(zygote) + "/task/" + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(b)) {
			st, err := os.ReadFile("/proc/" + c + "/status")
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
					if f := strings.Fields(v); len(f) >= 2 && f[1] == want {
						return strconv.Atoi(c)
					}
				}
			}
		}
	}
	return 0, fmt.Errorf("no child of the zygote %d has pid %d in its namespace", zygote, nspid)
}

// closePidfd closes the fiber's pidfd, if any. Only the one path that ends
// the fiber's record calls it.
func (f *fiber) closePidfd() {
	if f.pidfd >= 0 {
		_ = unix.Close(f.pidfd)
		f.pidfd = -1
	}
}

// reapOrphans is called by a dead zygote's teardown once its fibers have
// been sent SIGKILL. For each fiber it waits until the fiber's main process
// has ended and reaps it when it has become fiberd's child; one that is
// not (ECHILD: the host's init has it, or the zygote reaped it before it
// died) is left to its parent. It then closes the pidfd and calls ended,
// in this goroutine, as soon as that fiber is done with, so each fiber's
// Exit follows its own end. Fibers without a pidfd are ended at once. When
// ctx ends first, the fibers still running are logged and ended without
// being reaped.
func (p *Proc) reapOrphans(ctx context.Context, fibers []*fiber, ended func(*fiber)) {
	var left []*fiber
	for _, f := range fibers {
		if f.pidfd < 0 {
			ended(f)
			continue
		}
		left = append(left, f)
	}
	pfds := make([]unix.PollFd, 0, len(left))
	for len(left) > 0 {
		pfds = pfds[:0]
		for _, f := range left {
			pfds = append(pfds, unix.PollFd{Fd: int32(f.pidfd), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(pfds, reapPollMillis); err != nil && !errors.Is(err, unix.EINTR) {
			p.log.Error(os.NewSyscallError("poll", err), "Fibers of an ended zygote not reaped", "fibers", len(left))
			for _, f := range left {
				f.closePidfd()
				ended(f)
			}
			return
		}
		next := left[:0]
		for i, f := range left {
			if pfds[i].Revents == 0 { // still running
				next = append(next, f)
				continue
			}
			p.reap(f)
			f.closePidfd()
			ended(f)
		}
		left = next
		if len(left) > 0 && ctx.Err() != nil {
			for _, f := range left {
				p.log.Error(ctx.Err(), "Fiber of an ended zygote still running after SIGKILL; not reaped", "fence", f.fence.String(), "pid", f.pid)
				f.closePidfd()
				ended(f)
			}
			return
		}
	}
}

// reap waits, without blocking, for the ended process behind f.pidfd.
func (p *Proc) reap(f *fiber) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, f.pidfd, &info, unix.WEXITED|unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			p.log.V(2).Info("Fiber of an ended zygote is not fiberd's child; left to its parent", "fence", f.fence.String(), "pid", f.pid)
		case err != nil:
			p.log.Error(os.NewSyscallError("waitid", err), "Fiber of an ended zygote not reaped", "fence", f.fence.String(), "pid", f.pid)
		case info.Signo == 0:
			// Linux leaves si_signo 0 when nothing was waitable.
			p.log.V(1).Info("Fiber of an ended zygote ended but was not waitable; not reaped", "fence", f.fence.String(), "pid", f.pid)
		default:
			p.log.V(2).Info("Reaped a fiber of an ended zygote", "fence", f.fence.String(), "pid", f.pid)
		}
		return
	}
}
