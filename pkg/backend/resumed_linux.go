package backend

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// Resumed fibers: the watcher that reaps them, and the zygote teardown's
// share of them (see checkpoint_linux.go for why they need one).

// reapBlocking waits, polling the pidfd until ctx ends, for its process to
// end and reaps it.
func (p *Proc) reapBlocking(ctx context.Context, pidfd int) {
	for ctx.Err() == nil {
		pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, reapPollMillis); err != nil && !errors.Is(err, unix.EINTR) {
			return
		} else if n > 0 {
			if _, ok := waitPidfd(pidfd); ok {
				return
			}
			// Ended but still traced: wait for the tracer to let go.
			select {
			case <-ctx.Done():
			case <-p.cfg.Clock.After(heldPollMillis * time.Millisecond):
			}
		}
	}
}

// waitPidfd reaps an ended process by its pidfd, without blocking, and
// says how it ended; ok false when it was not waitable.
func waitPidfd(pidfd int) (ExitReason, bool) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || info.Signo == 0 {
			return ExitReason{Code: -1}, false
		}
		return siginfoReason(&info), true
	}
}

// siginfoReason reads a waitid result: si_code CLD_EXITED carries the exit
// code in si_status, the others the signal.
func siginfoReason(info *unix.Siginfo) ExitReason {
	// struct siginfo for SIGCHLD: si_signo, si_errno, si_code, then pid,
	// uid, status (ints) in the union.
	code := info.Code
	raw := (*[unsafe.Sizeof(*info)]byte)(unsafe.Pointer(info))
	off := 12 + 2*4 // the union follows si_code, aligned to a pointer; si_status follows si_pid and si_uid
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16 + 2*4
	}
	status := int32(binary.NativeEndian.Uint32(raw[off : off+4]))
	if code == 1 { // CLD_EXITED
		return ExitReason{Code: int(status)}
	}
	name := unix.SignalName(syscall.Signal(status))
	if name == "" {
		name = fmt.Sprintf("SIG%d", status)
	}
	return ExitReason{Signal: name}
}

// heldPollMillis is how often the watcher retries reaping a resumed fiber
// that has ended but is still held by a tracer: criu dump kills the fiber
// and lets go of it only when it exits itself, a few milliseconds later.
const heldPollMillis = 2

// watch hands a resumed fiber to the watcher, starting it when needed. It
// refuses, returning false, once Close has reached the watcher.
func (p *Proc) watch(f *fiber, z *zygote) bool {
	c := &p.ck
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	if c.watched == nil {
		c.watched = map[*fiber]*zygote{}
	}
	c.watched[f] = z
	if !c.started {
		r, w, err := os.Pipe()
		if err != nil {
			// Without a wake pipe the watcher polls on a timer.
			p.log.Error(err, "Watcher wake pipe")
		}
		c.wakeR, c.wakeW = r, w
		c.started = true
		c.stopped = make(chan struct{})
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.watcher() }()
	}
	c.wakeLocked()
	return true
}

func (c *procCkpt) wakeLocked() {
	if c.wakeW != nil {
		_, _ = c.wakeW.Write([]byte{0})
	}
}

// watcher polls the pidfds of every resumed fiber and, as each ends, reaps
// it, takes it out of its grant's fibers and finishes it (its Exit). It
// returns once Close asked and no fiber is left, or Close's time is up
// (endWatcher). Each round is read under c.mu (roundLocked), and its
// orphans swept and its pidfds polled without it.
func (p *Proc) watcher() {
	c := &p.ck
	defer close(c.stopped)
	stop := p.forwardSIGCHLD()
	defer stop()
	buf := make([]byte, 64)
	exited := map[*fiber]bool{} // ended, not yet waitable
	for {
		c.mu.Lock()
		if c.abandon || (c.closing && len(c.watched) == 0) {
			left := c.watched
			c.watched = nil
			c.mu.Unlock()
			p.endWatcher(left)
			return
		}
		r := c.roundLocked(exited)
		c.mu.Unlock()
		r.sweepOrphans()
		if _, err := unix.Poll(r.pfds, r.timeout); err != nil && !errors.Is(err, unix.EINTR) {
			p.log.Error(os.NewSyscallError("poll", err), "Resumed fibers' watcher")
			<-p.cfg.Clock.After(reapPollMillis * time.Millisecond)
			continue
		}
		for _, f := range r.ended(c.wakeR, buf) {
			p.reapResumed(f, exited)
		}
	}
}

// forwardSIGCHLD makes every SIGCHLD ask the watcher to sweep: orphans of
// a resumed fiber (processes it started and outlived) are reparented to
// fiberd, the nearest child subreaper, not to the zygote, and the watcher
// reaps those that died in a resumed fiber's leaf or session. The function
// returned stops the forwarding.
func (p *Proc) forwardSIGCHLD() (stop func()) {
	c := &p.ck
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	fwdDone := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			select {
			case <-sigc:
				c.mu.Lock()
				c.sweep = true
				c.wakeLocked()
				c.mu.Unlock()
			case <-fwdDone:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigc)
		close(fwdDone)
	}
}

// endWatcher finishes the fibers left when the watcher ends (Close's time
// is up: they were not reaped) with exit code -1, and closes the wake
// pipe.
func (p *Proc) endWatcher(left map[*fiber]*zygote) {
	c := &p.ck
	for f := range left {
		p.log.Error(errors.New("still running at close"), "Resumed fiber not reaped", "fence", f.fence.String(), "pid", f.pid)
		f.closePidfd()
		p.finish(f, ExitReason{Code: -1})
	}
	if c.wakeR != nil {
		_ = c.wakeR.Close()
		_ = c.wakeW.Close()
	}
}

// watchRound is one round of the watcher, read under procCkpt.mu.
type watchRound struct {
	fibers  []*fiber      // polled: pfds (after the wake pipe's, if any)
	pfds    []unix.PollFd // the wake pipe's first when there is one
	timeout int           // poll's, in milliseconds; -1 for none
	held    []*fiber      // ended but held by a tracer: waited for again
	// leaves and sessions are where to sweep for orphans (a SIGCHLD
	// came), skip the fibers' own pids.
	leaves   []string
	sessions []int
	skip     map[int]bool
}

// roundLocked reads the next round: the pidfds of the watched fibers not
// known to have ended, the wake pipe's, and, when a SIGCHLD came (c.sweep,
// cleared), the leaves and sessions to sweep. Without a wake pipe poll
// times out after reapPollMillis; with fibers held by a tracer, after
// heldPollMillis. c.mu must be held.
func (c *procCkpt) roundLocked(exited map[*fiber]bool) *watchRound {
	r := &watchRound{timeout: -1, skip: map[int]bool{}}
	if c.wakeR != nil {
		r.pfds = append(r.pfds, unix.PollFd{Fd: int32(c.wakeR.Fd()), Events: unix.POLLIN})
	} else {
		r.timeout = reapPollMillis
	}
	for f := range c.watched {
		if exited[f] {
			r.held = append(r.held, f)
			continue
		}
		r.fibers = append(r.fibers, f)
		r.pfds = append(r.pfds, unix.PollFd{Fd: int32(f.pidfd), Events: unix.POLLIN})
	}
	if c.sweep {
		for f := range c.watched {
			r.skip[f.pid] = true
			if f.leaf != "" {
				r.leaves = append(r.leaves, f.leaf)
			} else {
				r.sessions = append(r.sessions, f.pid)
			}
		}
	}
	c.sweep = false
	if len(r.held) > 0 {
		r.timeout = heldPollMillis
	}
	return r
}

// sweepOrphans reaps the zombie orphans in the round's leaves and
// sessions, but for the fibers themselves.
func (r *watchRound) sweepOrphans() {
	for _, leaf := range r.leaves {
		reapZombiesIn(leaf, r.skip)
	}
	for _, sid := range r.sessions {
		reapZombies(childrenInSession(sid, true), r.skip)
	}
}

// ended returns, after the round's poll, the fibers whose pidfd said they
// ended and those held before; it drains the wake pipe wakeR (nil: none)
// into buf.
func (r *watchRound) ended(wakeR *os.File, buf []byte) []*fiber {
	pfds := r.pfds
	if wakeR != nil {
		if pfds[0].Revents != 0 {
			_, _ = unix.Read(int(wakeR.Fd()), buf)
		}
		pfds = pfds[1:]
	}
	var out []*fiber
	for i, f := range r.fibers {
		if pfds[i].Revents != 0 {
			out = append(out, f)
		}
	}
	return append(out, r.held...)
}

// reapResumed reaps the ended resumed fiber f, takes it out of the watched
// fibers and of its grant's, and finishes it off the watcher's goroutine.
// A fiber a tracer (criu dumping it) has not let go yet is marked in
// exited, to be tried again shortly.
func (p *Proc) reapResumed(f *fiber, exited map[*fiber]bool) {
	c := &p.ck
	r, ok := waitPidfd(f.pidfd)
	if !ok {
		exited[f] = true
		return
	}
	delete(exited, f)
	c.mu.Lock()
	z := c.watched[f]
	delete(c.watched, f)
	c.mu.Unlock()
	z.mu.Lock()
	if z.fibers[f.fence.String()] == f {
		delete(z.fibers, f.fence.String())
	}
	z.mu.Unlock()
	f.closePidfd()
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.finishResumed(f, r) }()
}

// finishResumed finishes a resumed fiber that ended, and reaps its orphans
// (fiberd's children now) in its leaf, or without a leaf in its session:
// the dead ones at once, the living ones once finish has killed them with
// the leaf or the fiber's process group.
func (p *Proc) finishResumed(f *fiber, r ExitReason) {
	var pids []int
	if f.leaf == "" {
		reapZombies(childrenInSession(f.pid, true), map[int]bool{f.pid: true})
		for _, pid := range childrenInSession(f.pid, false) {
			if pid != f.pid {
				pids = append(pids, pid)
			}
		}
	} else {
		reapZombiesIn(f.leaf, map[int]bool{f.pid: true})
		pids, _ = cgroup.At(f.leaf).Procs()
	}
	var fds []int
	for _, pid := range pids {
		if fd, _, err := fiberPidfd(pid, os.Getpid()); err == nil {
			fds = append(fds, fd)
		}
	}
	p.finish(f, r)
	if f.leaf == "" {
		// finish killed the fiber's process group; what it started in
		// another group of its session goes too, as procrec's sweep
		// would end it.
		for _, fd := range fds {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
	}
	ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	defer cancel()
	for _, fd := range fds {
		p.reapBlocking(ctx, fd)
		_ = unix.Close(fd)
	}
}

// reapZombiesIn reaps fiberd's zombie children that died in a leaf, but
// those in skip.
func reapZombiesIn(leaf string, skip map[int]bool) {
	reapZombies(zombieChildrenIn(leaf), skip)
}

// childrenInSession lists fiberd's children in session sid (the zombies
// only, with zombies): what a resumed fiber without a leaf left behind is
// found there, as procrec finds it after a crash.
func childrenInSession(sid int, zombies bool) []int {
	var out []int
	for _, pid := range fiberdChildren() {
		if st, err := procrec.ReadStat(pid); err == nil && st.Session == sid && (!zombies || st.Zombie) {
			out = append(out, pid)
		}
	}
	return out
}

// fiberdChildren lists fiberd's child processes: those in the children
// file of each of its threads (a child is listed under the thread that
// forked it).
func fiberdChildren() []int {
	var out []int
	self := os.Getpid()
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", self))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", self, task.Name()))
		for _, field := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(field); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// reapZombies reaps the zombie children pids of fiberd, but those in skip.
func reapZombies(pids []int, skip map[int]bool) {
	for _, pid := range pids {
		if skip[pid] {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		_, _ = waitPidfd(fd)
		_ = unix.Close(fd)
	}
}

// closeCheckpoint is the last of Close's stops: every zygote has been
// stopped (its resumed fibers killed), so the watcher ends once it has
// finished them, or when ctx ends.
func (p *Proc) closeCheckpoint(ctx context.Context) error {
	c := &p.ck
	c.mu.Lock()
	c.closing = true
	started := c.started
	c.wakeLocked()
	c.mu.Unlock()
	defer c.spawn.close()      // after every resumed fiber: its thread is their parent
	defer c.shelfSpawn.close() // the same, for the isolated ones
	if !started {
		return nil
	}
	select {
	case <-c.stopped:
		return nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.abandon = true
	c.wakeLocked()
	c.mu.Unlock()
	<-c.stopped
	return fmt.Errorf("resumed fibers still running at close: %w", ctx.Err())
}

// splitResumed takes the resumed fibers out of a dead zygote's fibers, for
// its teardown: the watcher, not reapOrphans, reaps them. When the zygote
// died on its own they are marked so their Exits say TemplateDied.
func splitResumed(fibers map[string]*fiber, templateDied bool) []*fiber {
	var out []*fiber
	for k, f := range fibers {
		if f.ck.resumed {
			if templateDied {
				f.ck.templateDied.Store(true)
			}
			out = append(out, f)
			delete(fibers, k)
		}
	}
	return out
}

// awaitResumed kills a dead zygote's resumed fibers and waits, until ctx
// ends, for the watcher to have finished each (their Exits queued).
func (p *Proc) awaitResumed(ctx context.Context, fibers []*fiber, stopping bool) {
	for _, f := range fibers {
		if stopping {
			f.killed.Store(true)
		}
		if err := f.signal(ctx); err != nil {
			p.log.Error(err, "Resumed fiber of a dead zygote not killed", "fence", f.fence.String())
		}
	}
	for _, f := range fibers {
		select {
		case <-f.done:
		case <-ctx.Done():
			p.log.Error(ctx.Err(), "Resumed fiber of a dead zygote still running", "fence", f.fence.String(), "pid", f.pid)
		}
	}
}
