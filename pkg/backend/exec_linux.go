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
	if err := e.init(cfg, "exec"); err != nil {
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

// Warm implements Backend: it resolves the command, opens the grant's log
// (RunDir/fibers.log) and records the request. It starts no process. Any
// spec is accepted, zygote or not: a zygote template started with
// LISTEN_FDS serves as one fiber (the SDKs' socket_activated check).
func (e *Exec) Warm(ctx context.Context, req WarmRequest) error {
	if err := checkWarm(req); err != nil {
		return err
	}
	uid := req.Grant.UID
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("grant %q: %w", uid, errClosed)
	}
	if g := e.grants[uid]; g != nil {
		g.mu.Lock()
		stopping := g.stopping
		g.mu.Unlock()
		switch {
		case stopping:
			return fmt.Errorf("grant %q: still stopping; warm it again once Stop returns: %w", uid, ErrCold)
		case !reflect.DeepEqual(g.spec, req.Spec):
			return fmt.Errorf("grant %q: already warm with another template spec; Stop it first: %w", uid, core.ErrInvalid)
		}
		return nil
	}
	path, lp, err := e.prepare(req, "fibers.log")
	if err != nil {
		return fmt.Errorf("grant %q: warm: %w", uid, err)
	}
	g := &execGrant{
		uid: uid, spec: req.Spec, path: path,
		env: fiberdEnv(e.cfg.Path, req), dir: workdir(req.Spec, req.RunDir), out: lp, recs: req.Records,
		fibers: map[string]*fiber{}, starting: map[string]bool{},
	}
	e.wg.Add(1)
	go func() { defer e.wg.Done(); lp.copy() }()
	e.grants[uid] = g
	e.log.Info("Template ready for cold starts", "grant", uid, "command", path)
	return nil
}

// Clone implements Backend: fork+exec of the shim and the template, with
// the listener as descriptor 3 and the child born in req.Leaf.
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
	g.mu.Lock()
	switch {
	case g.stopping:
		g.mu.Unlock()
		return Fiber{}, fmt.Errorf("fiber %s: grant not warm: %w", fs, ErrCold)
	case g.fibers[fs] != nil || g.starting[fs]:
		g.mu.Unlock()
		return Fiber{}, fmt.Errorf("fiber %s: already running: %w", fs, core.ErrInvalid)
	}
	g.starting[fs] = true
	g.inflight.Add(1)
	g.mu.Unlock()
	defer g.inflight.Done()
	defer func() {
		g.mu.Lock()
		delete(g.starting, fs)
		g.mu.Unlock()
	}()
	if err := ctx.Err(); err != nil {
		return Fiber{}, fmt.Errorf("fiber %s: clone: %w", fs, err)
	}

	env := append(g.env[:len(g.env):len(g.env)], "LISTEN_FDS=1", "FIBERD_FENCE="+fs)
	if len(req.Payload) > 0 {
		env = append(env, "FIBERD_PAYLOAD="+hex.EncodeToString(req.Payload))
	}
	attr := &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if req.Leaf != "" {
		lf, err := cgroup.At(req.Leaf).Open()
		if err != nil {
			return Fiber{}, fmt.Errorf("fiber %s: %w", fs, err)
		}
		defer lf.Close()
		attr.UseCgroupFD = true
		attr.CgroupFD = int(lf.Fd())
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
		return Fiber{}, fmt.Errorf("fiber %s: start: %w", fs, err)
	}
	f := newFiber(req.Fence, cmd.Process.Pid, req.Leaf)
	if req.Leaf == "" && g.recs != nil {
		// Without a leaf nothing else finds what the fiber starts after a
		// crash of fiberd: record its session (finish removes it).
		if st, err := procrec.ReadStat(f.pid); err == nil {
			if f.rec, err = g.recs.AddProcess(f.pid, st.Start); err != nil {
				e.log.Error(err, "Fiber not recorded: a crash of fiberd would leave what it started", "fence", fs)
			}
		}
	}
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
	return Fiber{Fence: req.Fence, PID: f.pid}, nil
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
