package backend

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// fiber is the backends' record of one running fiber.
type fiber struct {
	fence core.Fence
	pid   int
	leaf  string // "" = none: the fiber is killed by process group
	// pidfd refers to the fiber's main process; -1 when none. Only Proc
	// sets it (see reapOrphans), so it can reap a fiber its zygote left
	// behind; whoever ends the fiber's record closes it.
	pidfd int
	// rec is the fiber's process record (see procrec), the zero Record
	// when it has a leaf or none was made; finish removes it.
	rec procrec.Record
	// level is the isolation the fiber got.
	level Isolation

	killed atomic.Bool   // set by Kill or Stop before the kill is sent
	silent atomic.Bool   // a fiber whose Clone was abandoned: no Exit
	done   chan struct{} // closed once it is gone, its leaf removed and its Exit queued

	ck fiberCkpt // park and resume state (checkpoint_linux.go)
}

func newFiber(fence core.Fence, pid int, leaf string) *fiber {
	return &fiber{fence: fence, pid: pid, leaf: leaf, pidfd: -1, done: make(chan struct{})}
}

// signal ends the fiber's processes now: cgroup.kill on its leaf, or SIGKILL
// to its process group (every fiber leads its own session, so its group is
// its pid) and to itself.
func (f *fiber) signal(ctx context.Context) error {
	if f.leaf != "" {
		err := cgroup.At(f.leaf).Kill(ctx)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, target := range []int{-f.pid, f.pid} {
		if err := syscall.Kill(target, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return os.NewSyscallError("kill", err)
		}
	}
	return nil
}

// waitEnded returns once a fiber's main process has ended, as pidfd tells
// (ended counts, reaped or not), or, without one (-1), once its leaf is
// empty; it fails when ctx ends first, or at once with neither.
func waitEnded(ctx context.Context, pidfd int, leaf string) error {
	if pidfd >= 0 {
		for ctx.Err() == nil {
			pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, reapPollMillis)
			if err != nil && !errors.Is(err, unix.EINTR) {
				return os.NewSyscallError("poll", err)
			}
			if n > 0 {
				return nil
			}
		}
		return ctx.Err()
	}
	if leaf != "" {
		return cgroup.At(leaf).WaitEmpty(ctx)
	}
	return errors.New("fiberd holds no pidfd and no leaf of it")
}

// finish runs once the fiber's main process has ended: it ends whatever is
// left of it (processes it started that are still in its leaf or process
// group), removes its leaf, queues its Exit and closes done.
func (c *common) finish(f *fiber, r ExitReason) {
	r = f.ck.reason(r)
	if f.killed.Load() {
		r.Killed = true
	}
	ctx, cancel := core.WithTimeout(context.Background(), c.cfg.Clock, c.cfg.KillTimeout)
	defer cancel()
	if f.leaf != "" {
		if n, _, err := cgroup.At(f.leaf).OOMKills(); err == nil && n > 0 {
			r.MemoryMax = true
		}
		if err := cgroup.At(f.leaf).Destroy(ctx); err != nil {
			c.log.Error(err, "Fiber leaf not removed", "fence", f.fence.String(), "leaf", f.leaf)
		}
	} else {
		// The pid was reaped, but the group lives on while a member does.
		_ = syscall.Kill(-f.pid, syscall.SIGKILL)
	}
	if err := f.rec.Remove(); err != nil {
		c.log.Error(err, "Fiber record not removed", "fence", f.fence.String())
	}
	if !f.silent.Load() {
		c.exits.push(Exit{GrantUID: f.fence.GrantUID, Fence: f.fence, Reason: r})
	}
	c.log.V(2).Info("Fiber ended", "fence", f.fence.String(), "pid", f.pid, "reason", r.String())
	close(f.done)
}
