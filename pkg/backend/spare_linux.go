package backend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// Spare fibers (the grant's fibers.warm).
//
// A zygote that says "READY spares" forks, on "SPARE s<n>", a spare: a
// child set up as a fiber is (parent-death signal, session, isolation)
// but for its identity, blocked on a hand-over socket of its own whose
// other end the zygote sends fiberd with "SPARED s<n> <pid>". A Clone that
// finds a spare moves it into the fiber's leaf, sends it "TAKE <fence>
// <payload>" with the listener on that socket and closes the socket; the
// spare moves the listener to descriptor 3, sets the fiber's environment
// and runs the template's fiber code. One message and one wake-up on the
// Clone's path (the spare's, while the caller connects), instead of a fork
// and its copy-on-write faults. The
// zygote still reaps it and reports its end as "EXITED s<n>", which the
// backend maps to the fence it was given.
//
// The zygote keeps min(W, max - fibers) spares, W and max the warmed
// grant's fibers.warm and fibers.max until SetSpares says otherwise. A replacement is asked for after each take,
// off the Clone's path, by the zygote's spare loop, which is also what
// asks for spares after READY, replaces one that died, and drops extra
// ones (closing a spare's socket ends it). A spare that fails to start,
// or dies untaken, counts as a failure; after maxSpareFailures in a row
// the zygote gets no more spares until one is taken or SetSpares is
// called again. Spares die with their zygote (parent-death signal) and are
// reaped with its fibers; they live in the zygote's leaf until taken, so
// their memory counts in the grant's cgroup.

// spareSettle is how long after a take the spare loop waits before it
// forks replacements, while at least half the wanted spares are still
// ready: a fork (and, for Python, its page faults) competes for the CPU
// with the fiber just handed over, and with the rest of a burst, which
// are what a spare is for. Below half, it forks at once.
const spareSettle = 10 * time.Millisecond

// maxForking is how many SPAREs a zygote is asked at once; SPARED asks for
// the next. Two keep the zygote forking while fiberd takes in the last
// spare, and a Clone that finds none waits behind at most two forks.
const maxForking = 2

// maxSpareFailures is how many spares in a row may fail to start, or die
// untaken, before a zygote gets no more.
const maxSpareFailures = 5

// spares is a zygote's spare pool: the spares forked ahead and waiting to
// be taken, those on their way, and what the spare loop needs to keep the
// pool at its size.
//
// Its fields but wake and settling are guarded by the zygote's mu, not by
// a lock of their own: a take moves a spare from the pool into the
// zygote's fibers and out of its pending Clones in one step (handOver),
// an ended spare's fiber leaves the fibers (spareEnded), and the zygote's
// teardown fails pending Clones and drops spares together; a lock of the
// pool's own would be taken inside mu in every one of these, and held for
// nothing else. wake is never replaced (a send needs no lock); settling is
// atomic.
type spares struct {
	handover bool   // the zygote said "READY spares": it hands spares over
	w, max   int    // SetSpares's warm and max
	fails    int    // spares in a row that failed to start or died untaken
	next     uint64 // the last spare number asked for

	forking  map[string]bool   // SPARE sent, SPARED not yet seen
	waiting  []*spare          // waiting to be taken, oldest first
	taking   map[string]*spare // being handed over by a Clone
	dropping map[string]*spare // ended by fiberd, EXITED not yet seen
	takenBy  map[string]string // spare name -> fence of the fiber it became
	taken    uint64            // Clones served by a spare
	lastTake time.Time         // when a Clone last took a spare

	// arrived is closed (and replaced) when a SPARE was answered, or the
	// zygote ended: a Clone waiting for a spare being forked waits on it.
	arrived chan struct{}

	wake     chan struct{} // wakes spareLoop; buffered 1
	settling atomic.Bool   // a wake of spareLoop is scheduled after spareSettle
}

// newSpares returns an empty pool, its maps and channels made.
func newSpares() spares {
	return spares{
		forking: map[string]bool{}, taking: map[string]*spare{}, dropping: map[string]*spare{}, takenBy: map[string]string{},
		wake: make(chan struct{}, 1), arrived: make(chan struct{}),
	}
}

// spare is one forked spare fiber of a zygote.
type spare struct {
	name  string
	pid   int // in fiberd's PID namespace
	pidfd int // -1 when none; closed by whoever ends the spare's record
	start uint64
	conn  *net.UnixConn // the hand-over socket
	// rec is the spare's process record (z.recs), made once it is spared
	// and kept by the fiber it becomes, so that a take writes no file.
	rec procrec.Record
	// exited is the spare's end when the zygote reported it while the
	// spare was being taken.
	exited *ExitReason
	// dropped is set when fiberd ended it (too many spares, an epoch
	// bump): its end is not a failure.
	dropped bool
}

// SetSpares sets how many spares grant grantUID keeps: min(warm, max -
// running fibers); warm 0 keeps none. It ends extra spares and asks for
// missing ones in the background, and clears a previous give-up. It does
// nothing for a grant that is not warm or whose zygote does not hand
// spares over. The agent calls it when a grant is warm and whenever the
// grant's fibers.warm or max may have changed (a renewal).
func (p *Proc) SetSpares(grantUID string, warm, max int) {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return
	}
	z.mu.Lock()
	z.sp.w, z.sp.max = max0(warm), max0(max)
	z.sp.fails = 0
	z.mu.Unlock()
	z.kick()
}

// RenewSpares ends every spare of grant grantUID and lets the spare loop
// fork new ones: an epoch bump ends what ran before it, spares too. It does
// nothing for a grant that is not warm.
func (p *Proc) RenewSpares(grantUID string) {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return
	}
	z.mu.Lock()
	old := z.sp.waiting
	z.sp.waiting = nil
	for _, sp := range old {
		sp.dropped = true
		z.sp.dropping[sp.name] = sp
	}
	z.mu.Unlock()
	for _, sp := range old {
		_ = sp.conn.Close()
	}
	z.kick()
}

// Spares reports grant grantUID's spares; the zero SpareStatus for a grant
// that is not warm.
func (p *Proc) Spares(grantUID string) SpareStatus {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return SpareStatus{}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.warmLocked() {
		return SpareStatus{}
	}
	return SpareStatus{Supported: z.sp.handover, Want: z.spareWantLocked(), Ready: len(z.sp.waiting),
		Failed: z.sp.handover && z.sp.fails >= maxSpareFailures, Taken: z.sp.taken}
}

// SparePIDs lists the pids of grant grantUID's waiting spares, for
// measuring their memory.
func (p *Proc) SparePIDs(grantUID string) []int {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	out := make([]int, 0, len(z.sp.waiting))
	for _, sp := range z.sp.waiting {
		out = append(out, sp.pid)
	}
	return out
}

func max0(n int) int { return max(n, 0) }

// spareWantLocked is how many spares z should have: min(W, max - fibers
// running or being made), 0 without hand-over or after too many failures.
// z.mu is held.
func (z *zygote) spareWantLocked() int {
	if !z.sp.handover || !z.warmLocked() || z.sp.fails >= maxSpareFailures {
		return 0
	}
	return max0(min(z.sp.w, z.sp.max-len(z.fibers)-len(z.pending)))
}

// spareAnsweredLocked wakes the Clones waiting for a spare being forked
// (see Clone): it arrived, failed, or the zygote ended. z.mu is held.
func (z *zygote) spareAnsweredLocked() {
	close(z.sp.arrived)
	z.sp.arrived = make(chan struct{})
}

// kick wakes the zygote's spare loop.
func (z *zygote) kick() {
	select {
	case z.sp.wake <- struct{}{}:
	default:
	}
}

// spareLoop keeps z's spares at spareWantLocked until the zygote is dead:
// it asks for missing ones (SPARE) and ends extra ones. It is the only
// writer of SPARE, so a slow zygote never stalls the reader or a Clone.
func (z *zygote) spareLoop() {
	for {
		select {
		case <-z.dead:
			return
		case <-z.sp.wake:
		}
		z.mu.Lock()
		want := z.spareWantLocked()
		if len(z.sp.waiting)+len(z.sp.forking) < want && 2*len(z.sp.waiting) >= want {
			if since := z.p.cfg.Clock.Since(z.sp.lastTake); since < spareSettle {
				z.mu.Unlock()
				if z.sp.settling.CompareAndSwap(false, true) {
					z.p.cfg.Clock.AfterFunc(spareSettle-since, func() { z.sp.settling.Store(false); z.kick() })
				}
				continue
			}
		}
		var ask []string
		// Few SPAREs at a time: a Clone that finds no spare forks, and its
		// CLONE waits behind the SPAREs the zygote has queued.
		for have := len(z.sp.waiting) + len(z.sp.forking); have < want && len(z.sp.forking) < maxForking; have++ {
			z.sp.next++
			name := spareName(z.sp.next)
			z.sp.forking[name] = true
			ask = append(ask, name)
		}
		var drop []*spare
		for len(z.sp.waiting) > 0 && len(z.sp.waiting)+len(z.sp.forking) > want {
			sp := z.sp.waiting[len(z.sp.waiting)-1] // the newest: the oldest have faulted in the most
			z.sp.waiting = z.sp.waiting[:len(z.sp.waiting)-1]
			sp.dropped = true
			z.sp.dropping[sp.name] = sp
			drop = append(drop, sp)
		}
		z.mu.Unlock()
		for _, sp := range drop {
			_ = sp.conn.Close() // the spare exits 0; EXITED closes its record
		}
		for _, name := range ask {
			if _, err := z.conn.Write([]byte(formatSpare(name))); err != nil {
				z.mu.Lock()
				delete(z.sp.forking, name)
				z.mu.Unlock()
				break // the zygote is ending
			}
		}
	}
}

// spared handles SPARED: the spare is ready to be taken. fds are what the
// message carried: the hand-over socket, then maybe a pidfd; spared owns
// them.
func (z *zygote) spared(m message, fds []int) {
	p := z.p
	z.mu.Lock()
	asked := z.sp.forking[m.fence]
	delete(z.sp.forking, m.fence)
	if !asked || len(fds) < 1 || len(fds) > 2 {
		z.spareAnsweredLocked()
	}
	z.mu.Unlock()
	if !asked || len(fds) < 1 || len(fds) > 2 {
		closeAll(fds)
		z.complain("Zygote reported a spare nobody asked for, or without its hand-over socket; ignored", "spare", m.fence)
		z.kick()
		return
	}
	conn, err := socketConn(fds[0])
	if err != nil {
		closeAll(fds[1:])
		z.complain("Spare's hand-over socket unusable; dropped", "spare", m.fence, "err", err.Error())
		z.spareFailed()
		return
	}
	pidfd := -1
	if len(fds) == 2 {
		pidfd = fds[1]
	}
	pid, pidfd, start, perr := z.fiberProcess(m.pid, pidfd)
	if pid != 0 && pidfd < 0 {
		// A spare waits to be taken: one fiberd holds no pidfd of is gone,
		// and taking it would move whatever has its pid now.
		pid = 0
	}
	if pid == 0 {
		_ = conn.Close()
		z.complain("Zygote reported a spare that is no live child of it; dropped", "spare", m.fence, "err", fmt.Sprint(perr))
		z.spareFailed()
		return
	}
	sp := &spare{name: m.fence, pid: pid, pidfd: pidfd, start: start, conn: conn}
	if start != 0 {
		if sp.rec, err = z.recs.AddProcess(pid, start); err != nil {
			p.log.Error(err, "Spare not recorded: a crash of fiberd would leave what its fiber starts", "grant", z.uid, "spare", m.fence)
		}
	}
	z.mu.Lock()
	if z.cold || z.stopping {
		z.mu.Unlock()
		_ = conn.Close()
		if pidfd >= 0 {
			_ = unix.Close(pidfd)
		}
		_ = sp.rec.Remove() // the zygote's end ends it
		return
	}
	if !z.sp.handover || z.sp.fails >= maxSpareFailures {
		// Spares were given up (too many failed) while this one was being
		// made: it is dropped at once, as the loop drops an extra one, and
		// never offered to a Clone. A spare of a template whose spares fail
		// (the Python SDK's on_spare raising after the spare reported
		// ready) is a fiber already ending; a Clone that took it would be
		// handed a fiber that never serves. Other extra spares (W lowered,
		// fibers near max) stay to the loop: a Clone waiting for this one
		// may take it first.
		sp.dropped = true
		z.sp.dropping[sp.name] = sp
		z.spareAnsweredLocked()
		z.mu.Unlock()
		_ = conn.Close() // the spare exits 0; EXITED closes its record
		return
	}
	z.sp.waiting = append(z.sp.waiting, sp)
	z.spareAnsweredLocked()
	z.mu.Unlock()
	z.kick() // more may be wanted, or fewer by now
}

// socketConn makes a net.UnixConn of a received socket descriptor, which it
// owns from then on.
func socketConn(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "spare")
	defer f.Close() // FileConn dups it
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("hand-over socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("hand-over socket is a %T, not a unix socket", c)
	}
	return uc, nil
}

// spareFailed counts a spare that could not be made or died untaken, and
// wakes the loop to replace it unless too many failed in a row.
func (z *zygote) spareFailed() {
	z.mu.Lock()
	z.sp.fails++
	gaveUp := z.sp.fails == maxSpareFailures
	z.spareAnsweredLocked()
	z.mu.Unlock()
	if gaveUp {
		z.p.log.Info("Spares keep failing; this zygote gets none until one is taken or the grant's spares are set again (Clones fork meanwhile)",
			"grant", z.uid, "failures", maxSpareFailures, "log", z.out.path)
	}
	z.kick()
}

// spareEnded handles ERROR or EXITED for a spare's name. It returns the
// fiber the spare became and true when it was taken (its fence is in
// z.fibers no more); the caller finishes that fiber.
func (z *zygote) spareEnded(m message) (*fiber, bool) {
	z.mu.Lock()
	if fs, ok := z.sp.takenBy[m.fence]; ok {
		delete(z.sp.takenBy, m.fence)
		f := z.fibers[fs]
		delete(z.fibers, fs)
		z.mu.Unlock()
		return f, f != nil
	}
	if m.kind == msgError {
		delete(z.sp.forking, m.fence)
		z.mu.Unlock()
		z.p.log.Info("Zygote could not fork a spare", "grant", z.uid, "spare", m.fence, "reason", m.reason)
		z.spareFailed()
		return nil, false
	}
	if sp := z.sp.taking[m.fence]; sp != nil {
		r := m.exit
		sp.exited = &r // handOver finishes it
		z.mu.Unlock()
		return nil, false
	}
	var sp *spare
	if d := z.sp.dropping[m.fence]; d != nil {
		sp = d
		delete(z.sp.dropping, m.fence)
	}
	for i, s := range z.sp.waiting {
		if s.name == m.fence {
			sp = s
			z.sp.waiting = append(z.sp.waiting[:i], z.sp.waiting[i+1:]...)
			break
		}
	}
	z.mu.Unlock()
	if sp == nil {
		return nil, false
	}
	_ = sp.conn.Close()
	if sp.pidfd >= 0 {
		_ = unix.Close(sp.pidfd) // the zygote reaped it
	}
	if err := sp.rec.Remove(); err != nil {
		z.p.log.Error(err, "Spare record not removed", "grant", z.uid, "spare", sp.name)
	}
	if sp.dropped {
		z.kick()
		return nil, false
	}
	z.p.log.Info("Spare died untaken; replacing it", "grant", z.uid, "spare", sp.name, "pid", sp.pid, "reason", m.exit.String())
	z.spareFailed()
	return nil, false
}

// popSpare takes the oldest waiting spare for a Clone, or nil. z.mu is
// held.
func (z *zygote) popSpareLocked() *spare {
	if len(z.sp.waiting) == 0 {
		return nil
	}
	sp := z.sp.waiting[0]
	z.sp.waiting[0] = nil
	z.sp.waiting = z.sp.waiting[1:]
	z.sp.taking[sp.name] = sp
	return sp
}

// errSpareGone says a spare ended before it was handed the fiber; the
// Clone forks instead.
var errSpareGone = errors.New("spare ended before the hand-over")

// handOver makes spare sp the fiber of req: it moves the spare into the
// leaf (so the fiber is in it when Clone returns, as a forked one is),
// sends TAKE with the listener, and closes its end of the hand-over
// socket. It does not wait for the spare: the spare does the rest of its
// set-up before any user code runs, while the caller's first connection
// queues on the listener; a spare that fails it exits 127, which is its
// fiber's Exit. pc is the Clone's pending entry (z.pending[fence]),
// removed here. It returns errSpareGone when the spare ended before it
// was handed the fiber, so the caller may fork instead; the spare's record
// is closed either way. Its steps: intoLeaf, sendTake, publishTaken; a
// failed step's take is ended by failTake.
func (z *zygote) handOver(ctx context.Context, sp *spare, req CloneRequest, pc *pendingClone) (*fiber, error) {
	if err := sp.intoLeaf(req.Leaf); err != nil {
		return nil, z.failTake(sp, pc, err)
	}
	if err := sp.sendTake(ctx, req); err != nil {
		return nil, z.failTake(sp, pc, err)
	}
	_ = sp.conn.Close() // it reads TAKE, then end-of-file: nothing more is said
	f := newFiber(req.Fence, sp.pid, req.Leaf)
	f.pidfd = sp.pidfd
	f.level = fiberLevel(z.level, sp.pid, z.proc.Pid)
	// The spare's record is the fiber's now, set before the fiber is
	// published (also in a leaf, where the cgroup would do: keeping it
	// costs nothing on the Clone's path, removing it a file operation);
	// it is removed when the fiber is reaped.
	f.rec = sp.rec
	if err := z.publishTaken(sp, f, pc); err != nil {
		return nil, err
	}
	return f, nil
}

// failTake ends a take of spare sp that failed with err, and returns err:
// the take and pc's reservation are dropped, the hand-over socket closed,
// the spare killed (the zygote reaps it; its EXITED is then ignored) and
// its record removed.
func (z *zygote) failTake(sp *spare, pc *pendingClone, err error) error {
	z.mu.Lock()
	delete(z.sp.taking, sp.name)
	z.unreserveLocked(pc)
	z.mu.Unlock()
	_ = sp.conn.Close()
	if sp.pidfd >= 0 {
		_ = unix.PidfdSendSignal(sp.pidfd, unix.SIGKILL, nil, 0)
		_ = unix.Close(sp.pidfd)
	} else {
		_ = syscall.Kill(-sp.pid, syscall.SIGKILL)
	}
	_ = sp.rec.Remove()
	return err
}

// intoLeaf moves the spare into leaf ("" : none). It returns errSpareGone
// when the spare has ended, else the cgroup's error.
func (sp *spare) intoLeaf(leaf string) error {
	if leaf == "" {
		return nil
	}
	// The pidfd keeps the pid from naming another process: checked alive
	// first, a spare that ends meanwhile leaves its pid unused until the
	// pid space wraps around.
	if sp.pidfd >= 0 {
		if err := unix.PidfdSendSignal(sp.pidfd, 0, nil, 0); err != nil && !errors.Is(err, unix.EPERM) {
			return errSpareGone
		}
	}
	if err := cgroup.At(leaf).AddProc(sp.pid); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return errSpareGone
		}
		return fmt.Errorf("spare into its leaf: %w", err)
	}
	return nil
}

// sendTake sends the spare TAKE for req with the listener, by ctx's
// deadline. It returns ctx's error when ctx ended, else errSpareGone: a
// write fails when the spare's end is closed, as it died.
func (sp *spare) sendTake(ctx context.Context, req CloneRequest) error {
	if d, ok := ctx.Deadline(); ok {
		_ = sp.conn.SetWriteDeadline(d)
	}
	_, _, err := sp.conn.WriteMsgUnix([]byte(formatTake(req.Fence, req.Payload)), unix.UnixRights(int(req.Listener.Fd())), nil)
	runtime.KeepAlive(req.Listener)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return errSpareGone
}

// publishTaken makes f, the fiber taken spare sp became, one of z's fibers
// in place of pc's reservation, and counts the take. A spare the zygote
// reported ended while it was taken is finished at once with that end.
// It fails with ErrCold when the zygote ended meanwhile (its teardown
// failed pc): f is then killed without an Exit and its record removed.
func (z *zygote) publishTaken(sp *spare, f *fiber, pc *pendingClone) error {
	p := z.p
	fs := pc.fence.String()
	z.mu.Lock()
	delete(z.sp.taking, sp.name)
	if z.pending[fs] != pc {
		z.mu.Unlock()
		f.killed.Store(true)
		f.silent.Store(true)
		kctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
		_ = f.signal(kctx)
		cancel()
		f.closePidfd()
		_ = f.rec.Remove()
		return fmt.Errorf("zygote ended: %w", ErrCold)
	}
	delete(z.pending, fs)
	exited := sp.exited
	if exited == nil {
		z.fibers[fs] = f
		z.sp.takenBy[sp.name] = fs
	}
	z.sp.taken++
	z.sp.fails = 0
	z.sp.lastTake = p.cfg.Clock.Now()
	z.mu.Unlock()
	if exited != nil {
		// It ended as soon as it was taken (the zygote reaped it).
		f.closePidfd()
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.finish(f, *exited) }()
	}
	return nil
}

// sparesOfDeadZygote takes every spare of an ended zygote out of it, as
// fiber records its teardown kills and reaps without an Exit. z.mu is held.
func (z *zygote) sparesOfDeadZygoteLocked() []*fiber {
	var out []*fiber
	add := func(sp *spare) {
		_ = sp.conn.Close()
		f := newFiber(core.Fence{GrantUID: z.uid}, sp.pid, "")
		f.pidfd = sp.pidfd
		f.rec = sp.rec // removed with it
		f.silent.Store(true)
		f.killed.Store(true)
		out = append(out, f)
	}
	for _, sp := range z.sp.waiting {
		add(sp)
	}
	for _, sp := range z.sp.dropping {
		add(sp)
	}
	z.sp.waiting, z.sp.dropping, z.sp.forking = nil, map[string]*spare{}, map[string]bool{}
	// Spares being taken are handOver's: their socket ends with them.
	return out
}
