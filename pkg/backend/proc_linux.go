package backend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// Proc is the WARM tier backend: one zygote per grant, fibers forked from
// it. Create it with NewProc; Close it to end every zygote and fiber.
type Proc struct {
	common

	mu      sync.Mutex
	zygotes map[string]*zygote
	closed  bool

	ck procCkpt // the CHECKPOINT tier (checkpoint_linux.go)

	closeOnce sync.Once
	closeErr  error
}

var (
	_ Backend = (*Proc)(nil)
	_ Sparer  = (*Proc)(nil)
)

// NewProc validates cfg and returns a Proc with no grant warm. It starts no
// process; the exit queue's goroutine runs until Close.
func NewProc(cfg Config) (*Proc, error) {
	p := &Proc{zygotes: map[string]*zygote{}}
	if err := p.init(cfg, "proc", false); err != nil {
		return nil, err
	}
	return p, nil
}

// Tier implements Backend: TierWarm.
func (p *Proc) Tier() core.Tier { return core.TierWarm }

// zygote is one grant's warm template process and its fibers.
type zygote struct {
	p    *Proc
	uid  string
	spec template.Spec
	cmd  *exec.Cmd
	conn *net.UnixConn
	leaf string         // <Cgroup>/zygote, or ""
	out  *logPipe       // zygote.log, its stdout and stderr; set by start
	recs *procrec.Dir   // where the zygote and its fibers without a leaf are recorded; may be nil
	rec  procrec.Record // the zygote's own record; set by start, removed by wait
	// level is the grant's isolation; id its user and group when isolated
	// (held in the pool from start until wait has torn down).
	level Isolation
	id    uint32

	// complaints counts what complain was asked to log since its last
	// line; complaintsLog limits its lines.
	complaints    atomic.Int64
	complaintsLog rate.Sometimes

	ready      chan struct{} // closed on READY
	readerDone chan struct{} // closed when the reader has stopped
	dead       chan struct{} // closed when the zygote and its fibers are gone

	mu       sync.Mutex
	proc     *os.Process // set once started
	warm     bool
	cold     bool // the zygote process has ended
	stopping bool // Stop or Close ended it
	pending  map[string]*pendingClone
	fibers   map[string]*fiber

	// Spares (spare_linux.go). handover is set when the zygote said
	// "READY spares"; spareW and spareMax are SetSpares's.
	handover         bool
	spareW, spareMax int
	spareFails       int               // spares in a row that failed to start or died untaken
	nextSpare        uint64            // the last spare number asked for
	forking          map[string]bool   // SPARE sent, SPARED not yet seen
	spares           []*spare          // waiting to be taken, oldest first
	taking           map[string]*spare // being handed over by a Clone
	dropping         map[string]*spare // ended by fiberd, EXITED not yet seen
	takenBy          map[string]string // spare name -> fence of the fiber it became
	taken            uint64            // Clones served by a spare
	spareWake        chan struct{}     // wakes spareLoop; buffered 1
	lastTake         time.Time         // when a Clone last took a spare
	settling         atomic.Bool       // a wake of spareLoop is scheduled after spareSettle
	spareArrived     chan struct{}     // closed (and replaced) when a SPARE was answered, or the zygote ended
}

type pendingClone struct {
	fence     core.Fence
	leaf      string
	ch        chan cloneResult // buffered 1
	abandoned bool             // Clone's ctx ended first
}

type cloneResult struct {
	f   *fiber
	err error
}

// Warmed implements Backend.
func (p *Proc) Warmed(grantUID string) bool {
	p.mu.Lock()
	z := p.zygotes[grantUID]
	p.mu.Unlock()
	if z == nil {
		return false
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.warm && !z.cold && !z.stopping
}

// GrantIsolation implements Backend.
func (p *Proc) GrantIsolation(grantUID string) Isolation {
	p.mu.Lock()
	z := p.zygotes[grantUID]
	p.mu.Unlock()
	if z == nil {
		return ""
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.warm || z.cold || z.stopping {
		return ""
	}
	return z.level
}

// Warm implements Backend: it starts the zygote with the control socket as
// descriptor 3 and waits for READY. An isolated zygote is started through
// nsinit (see isolate_linux.go).
func (p *Proc) Warm(ctx context.Context, req WarmRequest) error {
	if err := checkWarm(req); err != nil {
		return err
	}
	uid := req.Grant.UID
	if !req.Spec.Zygote {
		return fmt.Errorf("grant %q: template %q is not a zygote (spec says zygote: false), so it cannot be served warm: %w", uid, req.Grant.Template, core.ErrTierGap)
	}
	level, err := p.iso.grantLevel(req)
	if err != nil {
		return err
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return fmt.Errorf("grant %q: %w", uid, errClosed)
		}
		z := p.zygotes[uid]
		if z == nil {
			z = p.newZygote(uid, req.Spec, level)
			z.recs = req.Records
			z.spareW, z.spareMax = max0(req.Grant.Fibers.Warm), max0(req.Grant.Fibers.Max)
			p.zygotes[uid] = z
			p.mu.Unlock()
			err := z.start(ctx, req)
			if err != nil {
				p.mu.Lock()
				if p.zygotes[uid] == z {
					delete(p.zygotes, uid)
				}
				p.mu.Unlock()
			}
			return err
		}
		p.mu.Unlock()

		z.mu.Lock()
		ending := z.cold || z.stopping
		z.mu.Unlock()
		if ending {
			// Let the old zygote's teardown finish (it owns the zygote
			// leaf), then start afresh.
			select {
			case <-z.dead:
			case <-ctx.Done():
				return fmt.Errorf("grant %q: warm: waiting for the previous zygote to end: %w", uid, ctx.Err())
			}
			p.mu.Lock()
			if p.zygotes[uid] == z {
				delete(p.zygotes, uid)
			}
			p.mu.Unlock()
			continue
		}
		if !reflect.DeepEqual(z.spec, req.Spec) {
			return fmt.Errorf("grant %q: already warm with another template spec; Stop it first: %w", uid, core.ErrInvalid)
		}
		select {
		case <-z.ready:
			return nil
		case <-z.dead:
			return fmt.Errorf("grant %q: zygote ended while warming: %w", uid, ErrCold)
		case <-ctx.Done():
			return fmt.Errorf("grant %q: warm: %w", uid, ctx.Err())
		}
	}
}

func (p *Proc) newZygote(uid string, spec template.Spec, level Isolation) *zygote {
	return &zygote{
		p: p, uid: uid, spec: spec, level: level,
		ready: make(chan struct{}), readerDone: make(chan struct{}), dead: make(chan struct{}),
		pending: map[string]*pendingClone{}, fibers: map[string]*fiber{},
		forking: map[string]bool{}, taking: map[string]*spare{}, dropping: map[string]*spare{}, takenBy: map[string]string{},
		spareWake: make(chan struct{}, 1), spareArrived: make(chan struct{}),
		complaintsLog: rate.Sometimes{First: complaintsFirst, Interval: complaintsEvery},
	}
}

// start launches the zygote and waits for READY. On failure nothing is
// left running and z.dead is closed.
func (z *zygote) start(ctx context.Context, req WarmRequest) (err error) {
	p := z.p
	wrap := func(err error) error { return fmt.Errorf("grant %q: warm: %w", z.uid, err) }
	launched := false
	defer func() {
		if err != nil && !launched {
			if z.level != IsolationNone {
				p.cfg.IDs.release(z.uid)
			}
			close(z.readerDone)
			close(z.dead)
		}
	}()
	if z.level != IsolationNone {
		if z.id, err = p.cfg.IDs.acquire(z.uid); err != nil {
			return wrap(err)
		}
	}

	path, lp, err := p.prepare(req, "zygote.log")
	if err != nil {
		return wrap(err)
	}
	z.out = lp
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	cleanupOnError := func(c func() error) {
		closers = append(closers, func() error {
			if err != nil {
				return c()
			}
			return nil
		})
	}
	cleanupOnError(lp.abort)

	afterStart := []func() error{lp.w.Close} // the child's copies, closed once it has them
	defer func() {
		for _, c := range afterStart {
			_ = c()
		}
	}()

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return wrap(os.NewSyscallError("socketpair", err))
	}
	parent := os.NewFile(uintptr(pair[0]), "fiberd-control")
	child := os.NewFile(uintptr(pair[1]), "zygote-control")
	closers = append(closers, parent.Close) // FileConn dups it
	afterStart = append(afterStart, child.Close)
	c, err := net.FileConn(parent)
	if err != nil {
		return wrap(fmt.Errorf("control socket: %w", err))
	}
	z.conn = c.(*net.UnixConn)
	cleanupOnError(z.conn.Close)

	cgroupFD := -1
	if req.Cgroup != "" {
		z.leaf = filepath.Join(req.Cgroup, "zygote")
		if err := os.Mkdir(z.leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return wrap(fmt.Errorf("zygote cgroup: %w", err))
		}
		if z.level != IsolationNone {
			// The grant's user moves its fibers from the zygote's leaf
			// into theirs, so it may write the cgroup.procs of their
			// common ancestor, the grant's cgroup (see Clone).
			if err := cgroup.At(req.Cgroup).ChownProcs(int(z.id)); err != nil {
				return wrap(err)
			}
		}
		lf, err := cgroup.At(z.leaf).Open()
		if err != nil {
			return wrap(fmt.Errorf("zygote cgroup: %w", err))
		}
		afterStart = append(afterStart, lf.Close)
		cgroupFD = int(lf.Fd())
	}
	env := append(zygoteEnv(p.cfg.Path, req), isolationEnv(z.level, p.cfg.scratchSize(req.Grant))...)
	argv := append([]string{req.Spec.Command}, req.Spec.Args...)
	var status *started
	if z.level == IsolationNone {
		attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
		if cgroupFD >= 0 {
			attr.UseCgroupFD = true
			attr.CgroupFD = cgroupFD
		}
		z.cmd = &exec.Cmd{
			Path:        path,
			Args:        argv,
			Env:         env,
			Dir:         workdir(req.Spec, req.RunDir),
			Stdout:      lp.w,
			Stderr:      lp.w,
			ExtraFiles:  []*os.File{child},
			SysProcAttr: attr,
		}
		err = z.cmd.Start()
	} else {
		status, err = z.isolated(req, path, argv, env, child, cgroupFD, &afterStart)
		if err != nil {
			return wrap(err)
		}
		st := status
		cleanupOnError(func() error { st.closeParent(); return nil })
		z.cmd = status.cmd
		err = p.iso.start(z.cmd, req.Cgroup)
		status.closeChild()
	}
	for _, c := range afterStart {
		_ = c()
	}
	afterStart = nil
	if err != nil {
		if z.leaf != "" {
			_ = cgroup.At(z.leaf).Remove()
		}
		return wrap(err)
	}
	launched = true
	if st, err := procrec.ReadStat(z.cmd.Process.Pid); err == nil {
		if z.rec, err = z.recs.AddProcess(z.cmd.Process.Pid, st.Start); err != nil {
			p.log.Error(err, "Zygote not recorded: a crash of fiberd would leave what it started", "grant", z.uid)
		}
	}
	z.mu.Lock()
	z.proc = z.cmd.Process
	stopped := z.stopping
	z.mu.Unlock()
	if stopped {
		z.kill() // Stop came while it was starting
	}
	// What nsinit reports, when isolated: "" once the template runs.
	setup := make(chan string, 1)
	if status != nil {
		st := status
		status = nil
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			msg, _ := readStatus(st.status) // ends at the exec, or when the process dies
			st.closeParent()
			setup <- msg
		}()
	}
	p.wg.Add(4)
	go func() { defer p.wg.Done(); lp.copy() }()
	go func() { defer p.wg.Done(); z.read() }()
	go func() { defer p.wg.Done(); z.wait() }()
	go func() { defer p.wg.Done(); z.spareLoop() }()
	p.log.Info("Zygote started", "grant", z.uid, "pid", z.cmd.Process.Pid, "cgroup", z.leaf, "log", lp.path,
		"isolation", z.level.String(), "uid", z.id)

	wctx, cancel := core.WithTimeout(ctx, p.cfg.Clock, p.cfg.WarmTimeout)
	defer cancel()
	select {
	case <-z.ready:
		p.log.Info("Template warm", "grant", z.uid, "pid", z.cmd.Process.Pid)
		return nil
	case <-z.dead:
		why := ""
		select {
		case msg := <-setup:
			if msg != "" {
				why = "; isolation: " + msg
			}
		default:
		}
		if why == "" && z.level != IsolationNone {
			why = isolatedHint(z.id)
		}
		err = fmt.Errorf("zygote exited before READY (log %s: %q%s): %w", lp.path, logTail(lp.path), why, ErrCold)
	case <-wctx.Done():
		why := ctx.Err()
		if why == nil {
			why = fmt.Errorf("no READY within %v", p.cfg.WarmTimeout)
		}
		z.kill()
		<-z.dead
		err = fmt.Errorf("zygote not ready: %w (log %s)", why, lp.path)
	}
	return wrap(err)
}

// isolated builds the command that starts the zygote through nsinit: its
// home directory, its command opened here, its namespaces. Descriptors the
// child gets are appended to afterStart.
func (z *zygote) isolated(req WarmRequest, path string, argv, env []string, control *os.File, cgroupFD int, afterStart *[]func() error) (*started, error) {
	command, err := openCommand(path)
	if err != nil {
		return nil, err
	}
	*afterStart = append(*afterStart, command.Close)
	var home *os.File
	if req.Spec.Workdir == "" {
		if home, err = homeDir(req.RunDir, z.id); err != nil {
			return nil, err
		}
		*afterStart = append(*afterStart, home.Close)
	}
	network := req.Spec.Network == template.NetworkNone
	return z.p.iso.prepare(isoStart{
		id: z.id, network: network, keepAdmin: z.level == IsolationFiber,
		cfg: nsinitConfig{Hostname: hostname(z.uid), Loopback: network, KeepAdmin: z.level == IsolationFiber, Workdir: req.Spec.Workdir,
			ScratchSize: z.p.cfg.scratchSize(req.Grant)},
		fd3: control, command: command, home: home, argv: argv, env: env, out: z.out.w, cgroupFD: cgroupFD,
	})
}

// hostname is a grant's host name in its UTS namespace: its UID, which is a
// DNS label of at most 63 characters.
func hostname(uid string) string {
	if len(uid) > 63 {
		return uid[:63]
	}
	return uid
}

// kill ends the zygote process (and anything left in its leaf). Before the
// process exists it does nothing; start checks stopping once it does.
func (z *zygote) kill() {
	z.mu.Lock()
	proc := z.proc
	z.mu.Unlock()
	if proc == nil {
		return
	}
	if z.leaf != "" {
		ctx, cancel := core.WithTimeout(context.Background(), z.p.cfg.Clock, z.p.cfg.KillTimeout)
		_ = cgroup.At(z.leaf).Kill(ctx)
		cancel()
	}
	_ = proc.Kill() // pidfd-backed: never hits a reused pid
}

// Complaints about what a zygote sent: the first complaintsFirst are
// logged, then one per complaintsEvery, which says how many it stands for.
const (
	complaintsFirst = 5
	complaintsEvery = time.Minute
)

// complain logs a line about something the zygote sent that fiberd dropped
// or refused, rate-limited: what a template writes is its own, and a
// template that floods its control socket with garbage costs fiberd's log a
// few lines a minute, not one a message. "dropped" counts what the line
// stands for, itself included.
func (z *zygote) complain(msg string, kv ...any) {
	z.complaints.Add(1)
	z.complaintsLog.Do(func() {
		z.p.log.Info(msg, append(kv, "grant", z.uid, "dropped", z.complaints.Swap(0))...)
	})
}

// read handles the zygote's messages until the control socket ends.
func (z *zygote) read() {
	defer close(z.readerDone)
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(4*8))
	for {
		n, oobn, flags, _, err := z.conn.ReadMsgUnix(buf, oob)
		var fds []int
		if oobn > 0 {
			fds = rights(oob[:oobn])
		}
		if err != nil || (n == 0 && oobn == 0) {
			closeAll(fds)
			return
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			z.complain("Zygote message too long; dropped")
			continue
		}
		m, err := parseMessage(buf[:n])
		if err != nil {
			closeAll(fds)
			z.complain("Zygote message malformed; dropped", "err", err.Error())
			continue
		}
		// CLONED may carry one descriptor, a pidfd of the fiber; SPARED
		// the spare's hand-over socket and maybe its pidfd; a zygote
		// sends no other.
		if m.kind == msgSpared {
			z.spared(m, fds)
			continue
		}
		pidfd := -1
		if m.kind == msgCloned && len(fds) == 1 {
			pidfd, fds = fds[0], nil
		}
		closeAll(fds)
		z.handle(m, pidfd)
	}
}

// rights returns the descriptors an SCM_RIGHTS message carried.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var out []int
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		out = append(out, fds...)
	}
	return out
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// handle acts on one message of the zygote; pidfd is the descriptor a
// CLONED carried, or -1, and handle owns it.
func (z *zygote) handle(m message, pidfd int) {
	p := z.p
	switch m.kind {
	case msgReady:
		z.mu.Lock()
		if !z.warm {
			z.warm = true
			z.handover = m.spares
			close(z.ready)
		}
		z.mu.Unlock()
		z.kick()
	case msgCloned:
		// The pidfd lets wait reap the fiber should the zygote die first
		// (see reapOrphans). z.proc was set before this reader started.
		pid, pidfd, start, perr := z.fiberProcess(m.pid, pidfd)
		z.mu.Lock()
		pc := z.pending[m.fence]
		if pc == nil {
			z.mu.Unlock()
			if pidfd >= 0 {
				_ = unix.Close(pidfd)
			}
			z.complain("Zygote reported a fiber nobody asked for; ignored", "fence", m.fence, "pid", m.pid)
			return
		}
		delete(z.pending, m.fence)
		if pid == 0 {
			// The process is not the zygote's child (or, for an isolated
			// zygote, cannot be found among its children): refuse the
			// fiber, end what it can.
			abandoned := pc.abandoned
			z.mu.Unlock()
			z.complain("Zygote reported a fiber fiberd cannot find among its children; refused", "fence", m.fence, "zygotePid", m.pid, "err", perr.Error())
			if pc.leaf != "" {
				ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
				_ = cgroup.At(pc.leaf).Kill(ctx)
				cancel()
			}
			if !abandoned {
				pc.ch <- cloneResult{err: fmt.Errorf("zygote reported fiber %d, which is not a child of it that fiberd can find: %v", m.pid, perr)}
			}
			return
		}
		f := newFiber(pc.fence, pid, pc.leaf)
		f.pidfd = pidfd
		f.level = fiberLevel(z.level, pid, z.proc.Pid)
		z.fibers[m.fence] = f
		if pc.abandoned {
			f.silent.Store(true)
			f.killed.Store(true)
		}
		z.mu.Unlock()
		if perr != nil {
			p.log.V(1).Info("Fiber not tracked for reaping: it would stay a zombie of fiberd if its zygote died first", "fence", m.fence, "pid", m.pid, "err", perr.Error())
		}
		if pc.leaf == "" && start != 0 {
			// Without a leaf nothing else finds what the fiber starts
			// after a crash of fiberd: record its session. finish removes
			// the record; it runs on this reader's EXITED, or after the
			// reader stopped, so never before this.
			rec, err := z.recs.AddProcess(pid, start)
			if err != nil {
				p.log.Error(err, "Fiber not recorded: a crash of fiberd would leave what it started", "fence", m.fence)
			}
			f.rec = rec
		}
		if pc.abandoned {
			p.log.Info("Fiber arrived after its Clone gave up; killing it", "fence", m.fence, "pid", m.pid)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
				defer cancel()
				_ = f.signal(ctx)
			}()
			return
		}
		pc.ch <- cloneResult{f: f}
	case msgError, msgExited:
		if m.spare {
			f, ok := z.spareEnded(m)
			if ok {
				f.closePidfd() // the zygote reaped it
				p.wg.Add(1)
				go func() { defer p.wg.Done(); p.finish(f, m.exit) }()
			}
			z.kick()
			return
		}
		if m.kind == msgExited {
			z.exited(m)
			return
		}
		z.mu.Lock()
		pc := z.pending[m.fence]
		delete(z.pending, m.fence)
		z.mu.Unlock()
		if pc != nil {
			pc.ch <- cloneResult{err: fmt.Errorf("zygote refused: %s", m.reason)}
		}
	}
}

// exited handles EXITED of a fiber the zygote forked on CLONE.
func (z *zygote) exited(m message) {
	p := z.p
	z.mu.Lock()
	f := z.fibers[m.fence]
	delete(z.fibers, m.fence)
	z.mu.Unlock()
	if f == nil {
		z.complain("Zygote reported the exit of an unknown fiber; ignored", "fence", m.fence)
		return
	}
	f.closePidfd() // the zygote reaped it
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.finish(f, m.exit) }()
	z.kick() // room for a spare again
}

// wait reaps the zygote and tears everything down: the grant goes cold,
// pending clones fail, fibers are killed, reaped when they were left to
// fiberd (reapOrphans) and their leaves removed, the zygote's leaf removed,
// the log closed.
func (z *zygote) wait() {
	p := z.p
	_ = z.cmd.Wait()
	reason := statusReason(z.cmd.ProcessState)

	// EXITED messages the zygote sent before it died are still queued;
	// read them (the socket ends once the zygote's copy is closed).
	ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, 2*time.Second)
	select {
	case <-z.readerDone:
	case <-ctx.Done():
	}
	cancel()
	_ = z.conn.Close()
	<-z.readerDone

	z.mu.Lock()
	z.cold = true
	stopping, wasWarm := z.stopping, z.warm
	pending, fibers := z.pending, z.fibers
	z.pending, z.fibers = map[string]*pendingClone{}, map[string]*fiber{}
	spares := z.sparesOfDeadZygoteLocked()
	z.takenBy = map[string]string{}
	z.spareAnsweredLocked()
	z.mu.Unlock()

	for _, pc := range pending {
		pc.ch <- cloneResult{err: fmt.Errorf("zygote ended: %w", ErrCold)}
	}
	ctx, cancel = core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	resumed := splitResumed(fibers, !stopping) // the watcher reaps these
	var fw sync.WaitGroup
	list := make([]*fiber, 0, len(fibers))
	for _, f := range fibers {
		if stopping {
			f.killed.Store(true)
		}
		if err := f.signal(ctx); err != nil {
			p.log.Error(err, "Fiber of a dead zygote not killed", "fence", f.fence.String())
		}
		list = append(list, f)
	}
	for _, f := range spares {
		_ = f.signal(ctx)
		list = append(list, f)
	}
	// The zygote is reaped, so its fibers have their last parent by now.
	p.reapOrphans(ctx, list, func(f *fiber) {
		fw.Add(1)
		go func() { defer fw.Done(); p.finish(f, ExitReason{TemplateDied: !stopping}) }()
	})
	fw.Wait()
	p.awaitResumed(ctx, resumed, stopping)
	if z.leaf != "" {
		if err := cgroup.At(z.leaf).Destroy(ctx); err != nil {
			p.log.Error(err, "Zygote leaf not removed", "grant", z.uid, "leaf", z.leaf)
		}
	}
	cancel()

	z.out.drain(context.Background(), p.cfg.Clock)
	if err := z.rec.Remove(); err != nil {
		p.log.Error(err, "Zygote record not removed", "grant", z.uid)
	}

	if !stopping {
		p.log.Info("Zygote died; template is cold", "grant", z.uid, "reason", reason.String(), "fibers", len(fibers), "log", z.out.path)
		if wasWarm {
			p.exits.push(Exit{GrantUID: z.uid, Template: true, Reason: reason})
		}
	} else {
		p.log.Info("Zygote stopped", "grant", z.uid, "fibers", len(fibers))
	}
	if z.level != IsolationNone {
		p.cfg.IDs.release(z.uid)
	}
	close(z.dead)
}

// Clone implements Backend: it sends CLONE with the listener and the leaf
// and waits for CLONED or ERROR.
func (p *Proc) Clone(ctx context.Context, req CloneRequest) (Fiber, error) {
	if err := checkClone(req); err != nil {
		return Fiber{}, err
	}
	fs := req.Fence.String()
	p.mu.Lock()
	z := p.zygotes[req.Fence.GrantUID]
	p.mu.Unlock()
	if z == nil {
		return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
	}
	z.mu.Lock()
	switch {
	case !z.warm || z.cold || z.stopping:
		z.mu.Unlock()
		return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
	case z.pending[fs] != nil || z.fibers[fs] != nil:
		z.mu.Unlock()
		return Fiber{}, fmt.Errorf("fiber %s: already running: %w", fs, core.ErrInvalid)
	}
	pc := &pendingClone{fence: req.Fence, leaf: req.Leaf, ch: make(chan cloneResult, 1)}
	z.pending[fs] = pc
	sp := z.popSpareLocked()
	var arriving chan struct{}
	if sp == nil && len(z.forking) > 0 {
		// A spare is being forked, and a CLONE would wait behind it in
		// the zygote's queue: wait for it instead, then take it (or, if
		// another Clone did, fork).
		arriving = z.spareArrived
	}
	z.mu.Unlock()
	if arriving != nil {
		select {
		case <-arriving:
		case <-ctx.Done():
		}
		z.mu.Lock()
		switch {
		case z.pending[fs] != pc: // the zygote ended
			z.mu.Unlock()
			return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
		case ctx.Err() != nil:
			delete(z.pending, fs)
			z.mu.Unlock()
			return Fiber{}, fmt.Errorf("fiber %s: clone: waiting for a spare: %w", fs, ctx.Err())
		}
		sp = z.popSpareLocked()
		z.mu.Unlock()
	}
	if sp != nil {
		f, err := z.handOver(ctx, sp, req, pc)
		z.kick() // a replacement, off this Clone's path
		switch {
		case err == nil:
			return Fiber{Fence: req.Fence, PID: f.pid, Isolation: f.level}, nil
		case !errors.Is(err, errSpareGone):
			return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
		}
		// The spare died: fork as without one.
		z.mu.Lock()
		if !z.warm || z.cold || z.stopping || z.pending[fs] != nil || z.fibers[fs] != nil {
			z.mu.Unlock()
			return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
		}
		z.pending[fs] = pc
		z.mu.Unlock()
	}
	drop := func() {
		z.mu.Lock()
		if z.pending[fs] == pc {
			delete(z.pending, fs)
		}
		z.mu.Unlock()
	}

	fds := []int{int(req.Listener.Fd())}
	if req.Leaf != "" {
		// The child enters the leaf itself, with its own credentials: it
		// gets an O_PATH descriptor of the leaf's cgroup.procs, which
		// carries none of fiberd's (a descriptor fiberd opened for
		// writing would let whoever the template passed it to move any
		// process of the host into the leaf, and the release kill it).
		// An isolated grant's user is given the leaf's cgroup.procs for
		// that.
		leaf := cgroup.At(req.Leaf)
		var err error
		if z.level != IsolationNone {
			err = leaf.ChownProcs(int(z.id))
		}
		var leafF *os.File
		if err == nil {
			leafF, err = leaf.OpenEntry()
		}
		if err != nil {
			drop()
			return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
		}
		defer leafF.Close()
		fds = append(fds, int(leafF.Fd()))
	}
	_, _, err := z.conn.WriteMsgUnix([]byte(formatClone(req.Fence, req.Payload)), unix.UnixRights(fds...), nil)
	runtime.KeepAlive(req.Listener)
	if err != nil {
		drop()
		return Fiber{}, fmt.Errorf("fiber %s: control socket: %v: %w", fs, err, ErrCold)
	}
	select {
	case r := <-pc.ch:
		if r.err != nil {
			return Fiber{}, fmt.Errorf("fiber %s: %w", fs, r.err)
		}
		z.kick()
		return Fiber{Fence: req.Fence, PID: r.f.pid, Isolation: r.f.level}, nil
	case <-ctx.Done():
	}
	z.mu.Lock()
	if z.pending[fs] == pc {
		pc.abandoned = true
		z.mu.Unlock()
		return Fiber{}, fmt.Errorf("fiber %s: clone: %w", fs, ctx.Err())
	}
	z.mu.Unlock()
	if r := <-pc.ch; r.err == nil {
		// It arrived just as ctx ended: the caller will not know it, so end it.
		r.f.silent.Store(true)
		r.f.killed.Store(true)
		kctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
		_ = r.f.signal(kctx)
		cancel()
	}
	return Fiber{}, fmt.Errorf("fiber %s: clone: %w", fs, ctx.Err())
}

// reportWait is how long Kill waits for a zygote to report the end of a
// fiber it killed (EXITED) before it looks for itself.
const reportWait = time.Second

// Kill implements Backend. It returns once the fiber is finished, within
// KillTimeout whatever its zygote does: a fiber whose end the zygote has not
// reported reportWait after the kill is finished by fiberd itself once its
// process is gone (its pidfd says so, or its leaf is empty), with
// ExitReason.Unreported; the zygote's late EXITED is then ignored.
func (p *Proc) Kill(ctx context.Context, fence core.Fence) error {
	fs := fence.String()
	p.mu.Lock()
	z := p.zygotes[fence.GrantUID]
	p.mu.Unlock()
	var f *fiber
	if z != nil {
		z.mu.Lock()
		f = z.fibers[fs]
		z.mu.Unlock()
	}
	if f == nil {
		return fmt.Errorf("fiber %s: %w", fs, core.ErrNotFound)
	}
	ctx, cancel := core.WithTimeout(ctx, p.cfg.Clock, p.cfg.KillTimeout)
	defer cancel()
	f.killed.Store(true)
	if err := f.signal(ctx); err != nil {
		return fmt.Errorf("fiber %s: kill: %w", fs, err)
	}
	t := p.cfg.Clock.NewTimer(reportWait)
	defer t.Stop()
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fiber %s: kill: %w", fs, ctx.Err())
	case <-t.C():
	}
	// The zygote has said nothing: see whether the fiber is gone, on a
	// pidfd of its own (the zygote's EXITED closes the fiber's).
	z.mu.Lock()
	pidfd := -1
	if z.fibers[fs] == f && f.pidfd >= 0 {
		pidfd, _ = unix.FcntlInt(uintptr(f.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	}
	z.mu.Unlock()
	err := waitEnded(ctx, pidfd, f.leaf)
	if pidfd >= 0 {
		_ = unix.Close(pidfd)
	}
	if err != nil {
		select {
		case <-f.done: // reported meanwhile
			return nil
		default:
		}
		return fmt.Errorf("fiber %s: kill: its zygote did not report its end, and it is not gone: %w", fs, err)
	}
	z.mu.Lock()
	mine := z.fibers[fs] == f
	if mine {
		delete(z.fibers, fs)
	}
	z.mu.Unlock()
	if mine {
		z.complain("Zygote did not report the end of a fiber fiberd killed; fiberd ended it itself", "fence", fs)
		f.closePidfd() // its zygote's to reap, if ever
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.finish(f, ExitReason{Signal: "SIGKILL", Unreported: true}) }()
	}
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fiber %s: kill: %w", fs, ctx.Err())
	}
}

// killAndWait kills a fiber and waits until finish has run for it.
func killAndWait(ctx context.Context, f *fiber) error {
	f.killed.Store(true)
	if err := f.signal(ctx); err != nil {
		return fmt.Errorf("fiber %s: kill: %w", f.fence, err)
	}
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fiber %s: kill: %w", f.fence, ctx.Err())
	}
}

// Stop implements Backend.
func (p *Proc) Stop(ctx context.Context, grantUID string) error {
	p.mu.Lock()
	z := p.zygotes[grantUID]
	p.mu.Unlock()
	if z == nil {
		return nil
	}
	err := z.stop(ctx)
	if err == nil {
		p.mu.Lock()
		if p.zygotes[grantUID] == z {
			delete(p.zygotes, grantUID)
		}
		p.mu.Unlock()
	}
	return err
}

func (z *zygote) stop(ctx context.Context) error {
	z.mu.Lock()
	z.stopping = true
	fibers := make([]*fiber, 0, len(z.fibers))
	for _, f := range z.fibers {
		fibers = append(fibers, f)
	}
	z.mu.Unlock()
	for _, f := range fibers {
		f.killed.Store(true)
		_ = f.signal(ctx)
	}
	select {
	case <-z.dead:
		return nil
	default:
	}
	z.kill()
	select {
	case <-z.dead:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("grant %q: stop: %w", z.uid, ctx.Err())
	}
}

// Close implements Backend.
func (p *Proc) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		stops := make([]func(context.Context) error, 0, len(p.zygotes))
		for _, z := range p.zygotes {
			stops = append(stops, z.stop)
		}
		stops = append(stops, p.closeCheckpoint) // after the zygotes: it waits for their resumed fibers
		p.mu.Unlock()
		p.closeErr = p.shutdown(stops)
	})
	return p.closeErr
}
