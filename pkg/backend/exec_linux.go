package backend

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// execShim is the one line of sh the exec backend starts every fiber with:
// it sets LISTEN_PID to its own pid, which exec keeps, and replaces itself
// with the template ($0 is the template's path, "$@" its arguments).
// Go's os/exec fixes the environment before the fork, when the child's pid
// is not yet known, and the systemd convention wants LISTEN_PID = getpid().
const execShim = `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`

// Exec is the BASIC tier backend: every Clone is a fork+exec of the
// template, born in its leaf cgroup (CLONE_INTO_CGROUP). Create it with
// NewExec; Close it to end every fiber.
type Exec struct {
	common

	mu     sync.Mutex
	grants map[string]*execGrant
	closed bool

	closeOnce sync.Once
	closeErr  error
}

var _ Backend = (*Exec)(nil)

// NewExec validates cfg and returns an Exec with no grant warm.
func NewExec(cfg Config) (*Exec, error) {
	e := &Exec{grants: map[string]*execGrant{}}
	if err := e.init(cfg, "exec", true); err != nil {
		return nil, err
	}
	return e, nil
}

// Tier implements Backend: TierBasic.
func (e *Exec) Tier() core.Tier { return core.TierBasic }

type execGrant struct {
	uid  string
	spec template.Spec
	path string
	env  []string
	dir  string
	out  *logPipe     // fibers.log: every fiber's stdout and stderr
	recs *procrec.Dir // where fibers without a leaf are recorded; may be nil
	// level is the grant's isolation. When isolated, id is its user and
	// group (held in the pool until Stop), and command and home are the
	// template and the home directory, open for every fiber's nsinit.
	level   Isolation
	id      uint32
	command *os.File
	home    *os.File
	cgroup  string // the grant's cgroup, shown to its fibers
	scratch int64  // the size of each of a fiber's scratch tmpfs mounts
	// guarded says the endpoint guard holds the grant's elements (from
	// the end of Warm until Stop): its fibers' listeners are marked.
	guarded atomic.Bool

	inflight sync.WaitGroup // Clones between their check and their registration

	mu       sync.Mutex
	stopping bool
	fibers   map[string]*fiber
	starting map[string]bool
}

// Warmed implements Backend.
func (e *Exec) Warmed(grantUID string) bool {
	e.mu.Lock()
	g := e.grants[grantUID]
	e.mu.Unlock()
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.stopping
}

// GrantIsolation implements Backend.
func (e *Exec) GrantIsolation(grantUID string) Isolation {
	e.mu.Lock()
	g := e.grants[grantUID]
	e.mu.Unlock()
	if g == nil {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return ""
	}
	return g.level
}

// Warm implements Backend: it resolves the command, opens the grant's log
// (RunDir/fibers.log) and records the request. It starts no process. Any
// spec is accepted, zygote or not: a zygote template started with
// LISTEN_FDS serves as one fiber (the SDKs' socket_activated check). An
// isolated grant also gets its user (from Config.IDs) and its home
// directory, and its command is opened for nsinit (see isolate_linux.go).
func (e *Exec) Warm(ctx context.Context, req WarmRequest) error {
	if err := checkWarm(req); err != nil {
		return err
	}
	uid := req.Grant.UID
	level, err := e.iso.grantLevel(req)
	if err != nil {
		return err
	}
	// Each exec fiber has namespaces of its own: "shared" changes nothing.
	if level == IsolationGrant {
		level = IsolationFiber
	}
	g, err := e.warmLocked(req, level)
	if err != nil || g == nil {
		return err
	}
	// The grant's elements go into the guard's table with e.mu released
	// (nft is a process); the agent clones only once Warm returned.
	if guard := e.iso.guard; guard != nil && level != IsolationNone {
		if err := guard.add(ctx, g.id); err != nil {
			_ = e.Stop(ctx, uid)
			return fmt.Errorf("grant %q: warm: %w", uid, err)
		}
		g.guarded.Store(true)
	}
	e.log.Info("Template ready for cold starts", "grant", uid, "command", g.path)
	return nil
}

// warmLocked is Warm's part under e.mu: it returns the grant it made, or
// nil when the grant was warm already.
func (e *Exec) warmLocked(req WarmRequest, level Isolation) (*execGrant, error) {
	uid := req.Grant.UID
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, fmt.Errorf("grant %q: %w", uid, errClosed)
	}
	if g := e.grants[uid]; g != nil {
		g.mu.Lock()
		stopping := g.stopping
		g.mu.Unlock()
		switch {
		case stopping:
			return nil, fmt.Errorf("grant %q: still stopping; warm it again once Stop returns: %w", uid, ErrCold)
		case !reflect.DeepEqual(g.spec, req.Spec):
			return nil, fmt.Errorf("grant %q: already warm with another template spec; Stop it first: %w", uid, core.ErrInvalid)
		}
		return nil, nil
	}
	path, lp, err := e.prepare(req, "fibers.log")
	if err != nil {
		return nil, fmt.Errorf("grant %q: warm: %w", uid, err)
	}
	g := &execGrant{
		uid: uid, spec: req.Spec, path: path,
		env: append(fiberdEnv(e.cfg.Path, req), isolationEnv(level, e.cfg.scratchSize(req.Grant))...), scratch: e.cfg.scratchSize(req.Grant), dir: workdir(req.Spec, req.RunDir), out: lp, recs: req.Records,
		level:  level,
		cgroup: req.Cgroup,
		fibers: map[string]*fiber{}, starting: map[string]bool{},
	}
	if level != IsolationNone {
		if err := e.isolate(g, req); err != nil {
			_ = lp.abort()
			return nil, fmt.Errorf("grant %q: warm: %w", uid, err)
		}
	}
	e.wg.Add(1)
	go func() { defer e.wg.Done(); lp.copy() }()
	e.grants[uid] = g
	return g, nil
}

// isolate gives g its user, opens its command and makes its home
// directory. On failure nothing is held.
func (e *Exec) isolate(g *execGrant, req WarmRequest) (err error) {
	if g.id, err = e.cfg.IDs.acquire(g.uid); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			g.release(e.cfg.IDs)
		}
	}()
	if g.command, err = openCommand(g.path); err != nil {
		return err
	}
	if req.Spec.Workdir == "" {
		g.home, err = homeDir(req.RunDir, g.id)
	}
	return err
}

// release gives back what isolate took.
func (g *execGrant) release(ids *IDPool) {
	if g.command != nil {
		_ = g.command.Close()
	}
	if g.home != nil {
		_ = g.home.Close()
	}
	ids.release(g.uid)
}

// Clone implements Backend: fork+exec of the shim and the template, with
// the listener as descriptor 3 and the child born in req.Leaf. An isolated
// fiber is started through nsinit, which sets LISTEN_PID itself (it is PID
// 1 of its namespace), and Clone returns once the template runs. Its
// steps: reserve the fence in the grant (reserve), start the fiber's
// process (startFiber), and track it until it exits (track).
func (e *Exec) Clone(ctx context.Context, req CloneRequest) (Fiber, error) {
	if err := checkClone(req); err != nil {
		return Fiber{}, err
	}
	fs := req.Fence.String()
	e.mu.Lock()
	g := e.grants[req.Fence.GrantUID]
	e.mu.Unlock()
	if g == nil {
		return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
	}
	release, err := g.reserve(fs)
	if err != nil {
		return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
	}
	defer release()
	if err := ctx.Err(); err != nil {
		return Fiber{}, fmt.Errorf("fiber %s: clone: %w", fs, err)
	}
	if g.guarded.Load() {
		if err := markListener(req.Listener, g.id); err != nil {
			return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
		}
	}
	cmd, err := e.startFiber(ctx, g, req)
	if err != nil {
		return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
	}
	f := e.track(g, req, cmd)
	return Fiber{Fence: req.Fence, PID: f.pid, Isolation: f.level}, nil
}

// reserve marks fence fs as starting in g, and g as having a Clone in
// flight, until release is called. It fails with ErrCold when g is being
// stopped and with core.ErrInvalid when fs runs or starts already. It
// takes g.mu.
func (g *execGrant) reserve(fs string) (release func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stopping:
		return nil, fmt.Errorf("grant not warm: %w", ErrCold)
	case g.fibers[fs] != nil || g.starting[fs]:
		return nil, fmt.Errorf("already running: %w", core.ErrInvalid)
	}
	g.starting[fs] = true
	g.inflight.Add(1)
	return func() {
		g.mu.Lock()
		delete(g.starting, fs)
		g.mu.Unlock()
		g.inflight.Done()
	}, nil
}

// startFiber starts the process of req's fiber: the template's command
// through the exec shim with the listener as descriptor 3, the fence and
// payload in its environment, in req's leaf when given; isolated through
// startIsolated when the grant is. Its errors are the leaf's, or a start
// error.
func (e *Exec) startFiber(ctx context.Context, g *execGrant, req CloneRequest) (*exec.Cmd, error) {
	fs := req.Fence.String()
	env := append(g.env[:len(g.env):len(g.env)], "LISTEN_FDS=1", "FIBERD_FENCE="+fs)
	if len(req.Payload) > 0 {
		env = append(env, "FIBERD_PAYLOAD="+hex.EncodeToString(req.Payload))
	}
	cgroupFD := -1
	if req.Leaf != "" {
		lf, err := cgroup.At(req.Leaf).Open()
		if err != nil {
			return nil, err
		}
		defer lf.Close()
		cgroupFD = int(lf.Fd())
	}
	if g.level != IsolationNone {
		cmd, err := e.startIsolated(ctx, g, req, env, cgroupFD)
		if err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
		return cmd, nil
	}
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if cgroupFD >= 0 {
		attr.UseCgroupFD = true
		attr.CgroupFD = cgroupFD
	}
	cmd := &exec.Cmd{
		Path:        e.cfg.Shell,
		Args:        append([]string{"sh", "-c", execShim, g.path}, g.spec.Args...),
		Env:         env,
		Dir:         g.dir,
		Stdout:      g.out.w,
		Stderr:      g.out.w,
		ExtraFiles:  []*os.File{req.Listener},
		SysProcAttr: attr,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	return cmd, nil
}

// track makes the started process cmd req's fiber in g: recorded when it
// has no leaf (a crash of fiberd then leaves nothing it started; finish
// removes the record), published in g.fibers, and waited for by a
// goroutine that finishes it and takes it out of g.fibers.
func (e *Exec) track(g *execGrant, req CloneRequest, cmd *exec.Cmd) *fiber {
	fs := req.Fence.String()
	f := newFiber(req.Fence, cmd.Process.Pid, req.Leaf)
	if req.Leaf == "" && g.recs != nil {
		if st, err := procrec.ReadStat(f.pid); err == nil {
			if f.rec, err = g.recs.AddProcess(f.pid, st.Start); err != nil {
				e.log.Error(err, "Fiber not recorded: a crash of fiberd would leave what it started", "fence", fs)
			}
		}
	}
	f.level = g.level
	g.mu.Lock()
	g.fibers[fs] = f
	g.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_ = cmd.Wait()
		e.finish(f, statusReason(cmd.ProcessState))
		g.mu.Lock()
		if g.fibers[fs] == f {
			delete(g.fibers, fs)
		}
		g.mu.Unlock()
	}()
	return f
}

// startIsolated starts one fiber of an isolated grant through nsinit and
// waits until the template runs (or ctx ends). On failure the process is
// gone.
func (e *Exec) startIsolated(ctx context.Context, g *execGrant, req CloneRequest, env []string, cgroupFD int) (*exec.Cmd, error) {
	network := g.spec.Network == template.NetworkNone
	st, err := e.iso.prepare(isoStart{
		id: g.id, network: network,
		cfg: nsinitConfig{Hostname: hostname(g.uid), Loopback: network, Workdir: g.spec.Workdir, ListenPID: true, ScratchSize: g.scratch},
		fd3: req.Listener, command: g.command, home: g.home,
		argv: append([]string{g.spec.Command}, g.spec.Args...), env: env, out: g.out.w, cgroupFD: cgroupFD,
	})
	if err != nil {
		return nil, err
	}
	defer st.closeParent()
	err = e.iso.start(st.cmd, g.cgroup)
	st.closeChild()
	if err != nil {
		return nil, err
	}
	wctx, cancel := core.WithTimeout(ctx, e.cfg.Clock, e.cfg.WarmTimeout)
	defer cancel()
	if err := waitStatus(wctx, st); err != nil {
		_ = st.cmd.Wait()
		return nil, err
	}
	return st.cmd, nil
}

// Kill implements Backend.
func (e *Exec) Kill(ctx context.Context, fence core.Fence) error {
	fs := fence.String()
	e.mu.Lock()
	g := e.grants[fence.GrantUID]
	e.mu.Unlock()
	var f *fiber
	if g != nil {
		g.mu.Lock()
		f = g.fibers[fs]
		g.mu.Unlock()
	}
	if f == nil {
		return fmt.Errorf("fiber %s: %w", fs, core.ErrNotFound)
	}
	return killAndWait(ctx, f)
}

// Stop implements Backend.
func (e *Exec) Stop(ctx context.Context, grantUID string) error {
	e.mu.Lock()
	g := e.grants[grantUID]
	e.mu.Unlock()
	if g == nil {
		return nil
	}
	if err := e.stop(ctx, g); err != nil {
		return err
	}
	e.mu.Lock()
	if e.grants[grantUID] == g {
		delete(e.grants, grantUID)
	}
	e.mu.Unlock()
	return nil
}

func (e *Exec) stop(ctx context.Context, g *execGrant) error {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
	g.inflight.Wait() // Clones already past their check register first
	g.mu.Lock()
	fibers := make([]*fiber, 0, len(g.fibers))
	for _, f := range g.fibers {
		fibers = append(fibers, f)
	}
	g.mu.Unlock()
	var errs []error
	for _, f := range fibers {
		f.killed.Store(true)
		if err := f.signal(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range fibers {
		select {
		case <-f.done:
		case <-ctx.Done():
			return fmt.Errorf("grant %q: stop: %w", g.uid, ctx.Err())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("grant %q: stop: %w", g.uid, errors.Join(errs...))
	}
	// Every fiber is gone: close the log pipe and let the copier drain.
	g.out.drain(ctx, e.cfg.Clock)
	if g.guarded.Swap(false) {
		e.iso.guard.remove(g.id)
	}
	if g.level != IsolationNone {
		g.release(e.cfg.IDs)
	}
	e.log.Info("Grant stopped", "grant", g.uid, "fibers", len(fibers))
	return nil
}

// Close implements Backend.
func (e *Exec) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		stops := make([]func(context.Context) error, 0, len(e.grants))
		for _, g := range e.grants {
			stops = append(stops, func(ctx context.Context) error { return e.stop(ctx, g) })
		}
		e.mu.Unlock()
		e.closeErr = e.shutdown(stops)
	})
	return e.closeErr
}
