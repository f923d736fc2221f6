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
	p.ck.shelfSpawn.setup = func() error {
		sh, err := buildShelf()
		if err != nil {
			return fmt.Errorf("the shelf criu restores isolated fibers from: %w", err)
		}
		p.ck.shelf = sh
		return nil
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
	// guarded says the endpoint guard holds the grant's elements (from
	// start until wait has torn down): its fibers' listeners are marked.
	guarded bool
	// ext are the files criu takes as external when it parks a fiber of
	// an isolated zygote: its home, its command (externalOf).
	ext []externalFile

	// complaints counts what complain was asked to log since its last
	// line; complaintsLog limits its lines.
	complaints    atomic.Int64
	complaintsLog rate.Sometimes

	ready      chan struct{} // closed on READY
	readerDone chan struct{} // closed when the reader has stopped
	dead       chan struct{} // closed when the zygote and its fibers are gone

	// mu guards proc, warm, cold, stopping, pending and fibers, and the
	// spare pool sp (but for sp.wake and sp.settling, which need no
	// lock): see spares for why the pool shares it. The fields above mu
	// are set before the zygote's goroutines start and only read after,
	// or are channels and atomics. Lock order: Proc.mu, then mu, then
	// procCkpt.mu.
	mu sync.Mutex
	// proc is set once started, under mu and before the reader starts;
	// the reader and what runs after it read it without mu.
	proc     *os.Process
	warm     bool // READY came
	cold     bool // the zygote process has ended
	stopping bool // Stop or Close ended it
	pending  map[string]*pendingClone
	fibers   map[string]*fiber

	// sp is the zygote's spare pool (spare_linux.go).
	sp spares
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

// zygoteOf returns grant grantUID's zygote, or nil when it has none. It
// holds p.mu for the lookup only.
func (p *Proc) zygoteOf(grantUID string) *zygote {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.zygotes[grantUID]
}

// warmLocked reports whether the zygote is ready for Clones: it said READY
// and is neither ending nor stopped. z.mu must be held.
func (z *zygote) warmLocked() bool {
	return z.warm && !z.cold && !z.stopping
}

// reserveLocked reserves fence for a fiber about to be made, by a Clone or
// a Resume: it records a pendingClone for it in z.pending, so that no other
// Clone or Resume of the fence proceeds, and returns it. It fails with
// ErrCold when the grant is not warm (warmLocked) and with core.ErrInvalid
// when the fence has a fiber or a reservation already. z.mu must be held.
func (z *zygote) reserveLocked(fence core.Fence, leaf string) (*pendingClone, error) {
	name := fence.String()
	switch {
	case !z.warmLocked():
		return nil, fmt.Errorf("grant not warm: %w", ErrCold)
	case z.pending[name] != nil || z.fibers[name] != nil:
		return nil, fmt.Errorf("already running: %w", core.ErrInvalid)
	}
	pc := &pendingClone{fence: fence, leaf: leaf, ch: make(chan cloneResult, 1)}
	z.pending[name] = pc
	return pc, nil
}

// unreserve drops pc's reservation of its fence, if pc still holds it. It
// takes z.mu.
func (z *zygote) unreserve(pc *pendingClone) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.unreserveLocked(pc)
}

// unreserveLocked is unreserve with z.mu held.
func (z *zygote) unreserveLocked(pc *pendingClone) {
	if name := pc.fence.String(); z.pending[name] == pc {
		delete(z.pending, name)
	}
}

// Warmed implements Backend.
func (p *Proc) Warmed(grantUID string) bool {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return false
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.warmLocked()
}

// GrantIsolation implements Backend.
func (p *Proc) GrantIsolation(grantUID string) Isolation {
	z := p.zygoteOf(grantUID)
	if z == nil {
		return ""
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.warmLocked() {
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
			z.sp.w, z.sp.max = max0(req.Grant.Fibers.Warm), max0(req.Grant.Fibers.Max)
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
		sp:            newSpares(),
		complaintsLog: rate.Sometimes{First: complaintsFirst, Interval: complaintsEvery},
	}
}

// start starts the zygote and waits for its READY: it acquires the grant's
// user when isolated, launches the process (launch), sets it running
// (run) and waits (awaitReady). Whatever fails undoes what start made: the
// log, the control socket, nsinit's status pipe and, when the process was
// not launched, the user, and closes readerDone and dead (with a launched
// process, its wait does that).
func (z *zygote) start(ctx context.Context, req WarmRequest) (err error) {
	p := z.p
	launched := false
	defer func() {
		if err != nil && !launched {
			if z.guarded {
				p.iso.guard.remove(z.id)
			}
			if z.level != IsolationNone {
				p.cfg.IDs.release(z.uid)
			}
			close(z.readerDone)
			close(z.dead)
		}
	}()
	var undo []func() error // run, in order, if start fails
	defer func() {
		if err != nil {
			for _, c := range undo {
				_ = c()
			}
		}
	}()
	if z.level != IsolationNone {
		if z.id, err = p.cfg.IDs.acquire(z.uid); err != nil {
			return fmt.Errorf("grant %q: warm: %w", z.uid, err)
		}
		if g := p.iso.guard; g != nil {
			if err := g.add(ctx, z.id); err != nil {
				return fmt.Errorf("grant %q: warm: %w", z.uid, err)
			}
			z.guarded = true
		}
	}
	status, err := z.launch(req, &undo)
	if err != nil {
		return fmt.Errorf("grant %q: warm: %w", z.uid, err)
	}
	launched = true
	setup := z.run(status)
	if err := z.awaitReady(ctx, setup); err != nil {
		return fmt.Errorf("grant %q: warm: %w", z.uid, err)
	}
	return nil
}

// launch opens the zygote's log (z.out) and control socket (z.conn), makes
// its cgroup leaf when the grant has a cgroup (zygoteLeaf), and starts its
// process (spawnZygote), isolated through nsinit when the grant is; it
// returns nsinit's status (nil when not isolated). The child's copies of
// the descriptors are closed once it has them, or on failure; what start
// must undo should it fail later is appended to undo.
func (z *zygote) launch(req WarmRequest, undo *[]func() error) (*started, error) {
	path, lp, err := z.p.prepare(req, "zygote.log")
	if err != nil {
		return nil, err
	}
	z.out = lp
	*undo = append(*undo, lp.abort)
	afterStart := []func() error{lp.w.Close} // the child's copies, closed once it has them
	defer func() {
		for _, c := range afterStart {
			_ = c()
		}
	}()
	child, err := z.openControl()
	if err != nil {
		return nil, err
	}
	afterStart = append(afterStart, child.Close)
	*undo = append(*undo, z.conn.Close)
	cgroupFD := -1
	if req.Cgroup != "" {
		lf, err := z.zygoteLeaf(req.Cgroup)
		if err != nil {
			return nil, err
		}
		afterStart = append(afterStart, lf.Close)
		cgroupFD = int(lf.Fd())
	}
	status, err := z.zygoteCmd(req, path, child, cgroupFD, &afterStart)
	if err != nil {
		return nil, err
	}
	if status == nil {
		err = z.cmd.Start()
	} else {
		*undo = append(*undo, func() error { status.closeParent(); return nil })
		err = z.p.iso.start(z.cmd, req.Cgroup)
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
		return nil, err
	}
	return status, nil
}

// openControl makes the control socket pair: fiberd's end becomes z.conn,
// the other, returned, is the zygote's descriptor 3 (the caller closes it
// once the zygote has it).
func (z *zygote) openControl() (*os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socketpair", err)
	}
	parent := os.NewFile(uintptr(pair[0]), "fiberd-control")
	child := os.NewFile(uintptr(pair[1]), "zygote-control")
	c, err := net.FileConn(parent)
	_ = parent.Close() // FileConn dups it
	if err != nil {
		_ = child.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	z.conn = c.(*net.UnixConn)
	return child, nil
}

// zygoteLeaf makes the zygote's leaf, <grantCgroup>/zygote (z.leaf), and
// opens it for the zygote to be started in. For an isolated grant it gives
// the grant's user the grant cgroup's cgroup.procs: that user moves its
// fibers from the zygote's leaf into theirs, so it may write the
// cgroup.procs of their common ancestor (see sendClone).
func (z *zygote) zygoteLeaf(grantCgroup string) (*os.File, error) {
	z.leaf = filepath.Join(grantCgroup, "zygote")
	if err := os.Mkdir(z.leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("zygote cgroup: %w", err)
	}
	if z.level != IsolationNone {
		if err := cgroup.At(grantCgroup).ChownProcs(int(z.id)); err != nil {
			return nil, err
		}
	}
	lf, err := cgroup.At(z.leaf).Open()
	if err != nil {
		return nil, fmt.Errorf("zygote cgroup: %w", err)
	}
	return lf, nil
}

// zygoteCmd sets z.cmd, the zygote's command with child as its
// descriptor 3, to be started in the leaf cgroupFD names (-1: none):
// directly when the grant is not isolated, else through nsinit
// (isolated), whose status it returns (nil when not isolated).
// Descriptors the child gets are appended to afterStart.
func (z *zygote) zygoteCmd(req WarmRequest, path string, child *os.File, cgroupFD int, afterStart *[]func() error) (*started, error) {
	p := z.p
	env := append(zygoteEnv(p.cfg.Path, req), isolationEnv(z.level, p.cfg.scratchSize(req.Grant))...)
	argv := append([]string{req.Spec.Command}, req.Spec.Args...)
	if z.level != IsolationNone {
		status, err := z.isolated(req, path, argv, env, child, cgroupFD, afterStart)
		if err != nil {
			return nil, err
		}
		z.cmd = status.cmd
		return status, nil
	}
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
		Stdout:      z.out.w,
		Stderr:      z.out.w,
		ExtraFiles:  []*os.File{child},
		SysProcAttr: attr,
	}
	return nil, nil
}

// run records the launched zygote (z.rec), publishes its process (z.proc;
// killing it at once if Stop came while it started) and starts the
// goroutines that serve it: the log copier, the reader, wait and
// spareLoop, and, when isolated, one reading nsinit's status. The channel
// returned gets what nsinit reported ("" once the template runs) when the
// zygote is isolated, and nothing otherwise.
func (z *zygote) run(status *started) <-chan string {
	p := z.p
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
	setup := make(chan string, 1)
	if status != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			msg, _ := readStatus(status.status) // ends at the exec, or when the process dies
			status.closeParent()
			setup <- msg
		}()
	}
	lp := z.out
	p.wg.Add(4)
	go func() { defer p.wg.Done(); lp.copy() }()
	go func() { defer p.wg.Done(); z.read() }()
	go func() { defer p.wg.Done(); z.wait() }()
	go func() { defer p.wg.Done(); z.spareLoop() }()
	p.log.Info("Zygote started", "grant", z.uid, "pid", z.cmd.Process.Pid, "cgroup", z.leaf, "log", lp.path,
		"isolation", z.level.String(), "uid", z.id)
	return setup
}

// awaitReady waits for the zygote's READY, at most WarmTimeout and while
// ctx lasts. It fails with ErrCold when the zygote died first (naming its
// log's tail and, when isolated, what nsinit reported on setup), and with
// ctx's error or the timeout once it has killed the zygote and seen it
// dead.
func (z *zygote) awaitReady(ctx context.Context, setup <-chan string) error {
	p, lp := z.p, z.out
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
		return fmt.Errorf("zygote exited before READY (log %s: %q%s): %w", lp.path, logTail(lp.path), why, ErrCold)
	case <-wctx.Done():
		why := ctx.Err()
		if why == nil {
			why = fmt.Errorf("no READY within %v", p.cfg.WarmTimeout)
		}
		z.kill()
		<-z.dead
		return fmt.Errorf("zygote not ready: %w (log %s)", why, lp.path)
	}
}

// noteExternal adds f, opened at path, to z.ext; a file criu cannot name
// is left out (a park of a fiber that has it then fails in criu).
func (z *zygote) noteExternal(f *os.File, path string) {
	if ext, err := externalOf(f, path); err == nil {
		z.ext = append(z.ext, ext)
	} else {
		z.p.log.V(1).Info("A file of the zygote's is not named for CRIU: its fibers may not park", "grant", z.uid, "path", path, "err", err.Error())
	}
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
	z.noteExternal(command, path)
	var home *os.File
	if req.Spec.Workdir == "" {
		if home, err = homeDir(req.RunDir, z.id); err != nil {
			return nil, err
		}
		*afterStart = append(*afterStart, home.Close)
		z.noteExternal(home, home.Name())
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
	switch m.kind {
	case msgReady:
		z.mu.Lock()
		if !z.warm {
			z.warm = true
			z.sp.handover = m.spares
			close(z.ready)
		}
		z.mu.Unlock()
		z.kick()
	case msgCloned:
		z.cloned(m, pidfd)
	case msgError, msgExited:
		z.ended(m)
	}
}

// cloned handles CLONED: the fiber the zygote forked for a pending Clone
// becomes one of z's fibers and is handed to that Clone; pidfd (owned) lets
// wait reap it should the zygote die first (see reapOrphans). A fiber
// nobody asked for is ignored, one fiberd cannot find among the zygote's
// children is refused (refuseCloned), and one whose Clone gave up is
// killed without an Exit.
func (z *zygote) cloned(m message, pidfd int) {
	p := z.p
	// z.proc was set before this reader started.
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
		abandoned := pc.abandoned
		z.mu.Unlock()
		z.refuseCloned(m, pc, abandoned, perr)
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
}

// refuseCloned refuses the fiber a CLONED named when it is not the
// zygote's child (or, for an isolated zygote, cannot be found among its
// children; perr says why): it kills what is in the Clone's leaf and, unless
// the Clone gave up (abandoned), fails it.
func (z *zygote) refuseCloned(m message, pc *pendingClone, abandoned bool, perr error) {
	z.complain("Zygote reported a fiber fiberd cannot find among its children; refused", "fence", m.fence, "zygotePid", m.pid, "err", perr.Error())
	if pc.leaf != "" {
		ctx, cancel := core.WithTimeout(context.Background(), z.p.cfg.Clock, z.p.cfg.KillTimeout)
		_ = cgroup.At(pc.leaf).Kill(ctx)
		cancel()
	}
	if !abandoned {
		pc.ch <- cloneResult{err: fmt.Errorf("zygote reported fiber %d, which is not a child of it that fiberd can find: %v", m.pid, perr)}
	}
}

// ended handles ERROR and EXITED: of a spare (spareEnded, whose fiber, if
// it had become one, is finished), of a fiber (exited), or a refused CLONE
// (its Clone fails with the zygote's reason).
func (z *zygote) ended(m message) {
	p := z.p
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
	z.sp.takenBy = map[string]string{}
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
	if z.guarded {
		p.iso.guard.remove(z.id)
	}
	if z.level != IsolationNone {
		p.cfg.IDs.release(z.uid)
	}
	close(z.dead)
}

// Clone implements Backend. It reserves the fence (reserveLocked), serves
// the Clone from a spare when one is waiting or being forked
// (cloneFromSpare), and otherwise sends CLONE with the listener and the
// leaf (sendClone) and waits for CLONED or ERROR (awaitCloned).
func (p *Proc) Clone(ctx context.Context, req CloneRequest) (Fiber, error) {
	if err := checkClone(req); err != nil {
		return Fiber{}, err
	}
	fs := req.Fence.String()
	wrap := func(err error) error { return fmt.Errorf("fiber %s: %w", fs, err) }
	z := p.zygoteOf(req.Fence.GrantUID)
	if z == nil {
		return Fiber{}, wrap(fmt.Errorf("grant not warm: %w", ErrCold))
	}
	z.mu.Lock()
	pc, err := z.reserveLocked(req.Fence, req.Leaf)
	if err != nil {
		z.mu.Unlock()
		return Fiber{}, wrap(err)
	}
	if z.guarded {
		// One setsockopt, before any process has the listener.
		if err := markListener(req.Listener, z.id); err != nil {
			z.unreserveLocked(pc)
			z.mu.Unlock()
			return Fiber{}, wrap(err)
		}
	}
	sp := z.popSpareLocked()
	var arriving chan struct{}
	if sp == nil && len(z.sp.forking) > 0 {
		// A spare is being forked, and a CLONE would wait behind it in
		// the zygote's queue: wait for it instead, then take it (or, if
		// another Clone did, fork).
		arriving = z.sp.arrived
	}
	z.mu.Unlock()
	f, err := z.cloneFromSpare(ctx, req, pc, sp, arriving)
	if err == nil && f == nil {
		if err = z.sendClone(req, pc); err == nil {
			f, err = z.awaitCloned(ctx, pc)
		}
	}
	if err != nil {
		return Fiber{}, wrap(err)
	}
	return Fiber{Fence: req.Fence, PID: f.pid, Isolation: f.level}, nil
}

// cloneFromSpare serves a Clone whose fence pc reserves from a spare: sp,
// or, when sp is nil and arriving is not, the spare being forked once it
// has arrived (arriving is closed then), if no other Clone took it first.
// It returns the fiber the spare became; or nil and no error when there is
// no spare to take, or the one taken died first (errSpareGone), with pc
// reserving the fence again: the caller forks then. It fails with ErrCold
// when the zygote ended, with ctx's error when ctx ended while waiting for
// the spare (the reservation dropped), and with handOver's errors.
func (z *zygote) cloneFromSpare(ctx context.Context, req CloneRequest, pc *pendingClone, sp *spare, arriving chan struct{}) (*fiber, error) {
	fs := req.Fence.String()
	if arriving != nil {
		select {
		case <-arriving:
		case <-ctx.Done():
		}
		z.mu.Lock()
		switch {
		case z.pending[fs] != pc: // the zygote ended
			z.mu.Unlock()
			return nil, fmt.Errorf("grant not warm: %w", ErrCold)
		case ctx.Err() != nil:
			delete(z.pending, fs)
			z.mu.Unlock()
			return nil, fmt.Errorf("clone: waiting for a spare: %w", ctx.Err())
		}
		sp = z.popSpareLocked()
		z.mu.Unlock()
	}
	if sp == nil {
		return nil, nil
	}
	f, err := z.handOver(ctx, sp, req, pc)
	z.kick() // a replacement, off this Clone's path
	switch {
	case err == nil:
		return f, nil
	case !errors.Is(err, errSpareGone):
		return nil, err
	}
	// The spare died: fork as without one.
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.warmLocked() || z.pending[fs] != nil || z.fibers[fs] != nil {
		return nil, fmt.Errorf("grant not warm: %w", ErrCold)
	}
	z.pending[fs] = pc
	return nil, nil
}

// sendClone sends the zygote CLONE for req, with the listener and, when
// req has a leaf, a descriptor the child enters it by. On failure it drops
// pc's reservation and returns the leaf's error, or a control socket error
// wrapping ErrCold.
func (z *zygote) sendClone(req CloneRequest, pc *pendingClone) error {
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
			z.unreserve(pc)
			return err
		}
		defer leafF.Close()
		fds = append(fds, int(leafF.Fd()))
	}
	_, _, err := z.conn.WriteMsgUnix([]byte(formatClone(req.Fence, req.Payload)), unix.UnixRights(fds...), nil)
	runtime.KeepAlive(req.Listener)
	if err != nil {
		z.unreserve(pc)
		return fmt.Errorf("control socket: %v: %w", err, ErrCold)
	}
	return nil
}

// awaitCloned waits for the zygote's answer to the CLONE pc reserves: the
// fiber (CLONED), or the zygote's refusal or end as an error. When ctx
// ends first the Clone is abandoned: a fiber arriving later is killed
// without an Exit (handle), as is one that arrived just as ctx ended; the
// error is then ctx's.
func (z *zygote) awaitCloned(ctx context.Context, pc *pendingClone) (*fiber, error) {
	select {
	case r := <-pc.ch:
		if r.err != nil {
			return nil, r.err
		}
		z.kick()
		return r.f, nil
	case <-ctx.Done():
	}
	fs := pc.fence.String()
	z.mu.Lock()
	if z.pending[fs] == pc {
		pc.abandoned = true
		z.mu.Unlock()
		return nil, fmt.Errorf("clone: %w", ctx.Err())
	}
	z.mu.Unlock()
	if r := <-pc.ch; r.err == nil {
		// It arrived just as ctx ended: the caller will not know it, so end it.
		r.f.silent.Store(true)
		r.f.killed.Store(true)
		kctx, cancel := core.WithTimeout(context.Background(), z.p.cfg.Clock, z.p.cfg.KillTimeout)
		_ = r.f.signal(kctx)
		cancel()
	}
	return nil, fmt.Errorf("clone: %w", ctx.Err())
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
	z, f := p.findFiber(fence)
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
	z := p.zygoteOf(grantUID)
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
