package fiberd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// drainTimeout bounds each step of the drain at the end of Run: the HTTP
// servers' shutdown, and the release of fibers and zygotes.
const drainTimeout = 10 * time.Second

// Agent is fiberd: it admits the grants its home delivers, keeps their
// templates warm, and serves Clone on its HTTP API. New builds it (nothing
// is served yet); Run serves until its context ends and then drains.
type Agent struct {
	cfg       Config
	log       logr.Logger
	home      home.Home
	verifier  *grant.Verifier
	templates template.Dir
	epoch     *core.EpochStore
	ledger    *core.Ledger
	limits    cgroupLimits        // what the cgroup root lets the agent enforce
	ports     *endpoint.Allocator // nil for the unix family
	tree      *cgroup.Tree        // nil without a cgroup root
	host      string              // the endpoint host fibers listen on
	metrics   *metrics
	// readPressure reads a grant's pressure for pressureShed:
	// cgroupPressure, replaced by tests before Run.
	readPressure pressureReader
	// measure sums the private dirty memory of a fiber's processes for
	// the W budget: privateDirty, replaced by tests before Run.
	measure func(pids []int) (int64, error)
	// scratch is what a fiber's own scratch file systems hold, added to
	// its measure at isolation fiber: scratchUsed, replaced by tests
	// before Run.
	scratch func(pid int) int64
	noPSI   sync.Once // "memory.pressure is absent" is logged once

	// lock is StateDir/private/lock, flocked by New before its sweep and
	// held until Run ends or Close: no second agent sweeps this one's
	// processes or takes its sockets. nil once released.
	lock *os.File

	apiTCP   net.Listener // nil when Listen is empty
	apiUnix  net.Listener // nil when Socket is "-"
	admin    net.Listener
	tcpAuth  bool // callers on apiTCP present verified client certificates
	stopping chan struct{}

	// recs records the processes the backends start outside cgroups and
	// the grants' cgroups, in StateDir/private/procs: what a crash leaves
	// is ended by the next New.
	recs *procrec.Dir
	// queue runs the grants' reconciles; set by Run before anything can
	// add to it.
	queue *workQueue
	// park owns the CHECKPOINT tier's state (parking.go), set up by New.
	park parking

	// Locks, in the order they may be taken (a lock is never taken while
	// one after it is held; docs/architecture.md, Locks, draws it):
	//
	//	session gate (Ledger.LockSession) -> park turn (parking.turn) ->
	//	epochMu -> mu -> slot.mu -> (the ledger's, parking's and the
	//	backends' own locks, each taken and released inside one call)
	//
	// The two gates are held across work on purpose, each bounded by its
	// caller's context: a Clone holds its session's gate across the fork
	// or resume, a park holds its session's gate and its grant's turn
	// across the dump, so that no second Clone or park of that session
	// runs meanwhile. Nothing else waits on them.
	//
	// No lock of the agent is held across I/O, a process start, or a call
	// into the home, a backend or the verifier, with two exceptions that
	// guard nothing anyone else reads: epochMu, held across the epoch
	// file's write so the file and the ledger move in step, and the
	// ledger's storeMu, held across the revocations file's write (so
	// Ledger.Deny and Lift are never called with a lock of the agent held).

	// epochMu keeps epoch bumps and the ledger's epoch in step.
	epochMu sync.Mutex

	mu      sync.Mutex
	slots   map[string]*slot // every grant UID the agent has state of; guarded by mu
	changed chan struct{}    // closed and replaced on every status change; guarded by mu
	closed  bool             // guarded by mu
	ran     bool             // guarded by mu
}

// fiberHandle is the agent's part of a running fiber, kept in the ledger's
// Fiber.Handle: what to free when the fiber ends, and what its W budget
// needs.
type fiberHandle struct {
	backend backend.Backend
	port    int    // TCP port held in the allocator, 0 for unix
	sock    string // unix socket path, "" for TCP
	pid     int    // the fiber's process, as the backend reported it
	leaf    string // its leaf cgroup, "" for none
	// measured is set when the grant has a W budget that the fiber's leaf
	// does not enforce: the budget loop measures it.
	measured bool
	// over is the reason the budget loop ended the fiber, nil until then.
	over atomic.Pointer[string]
	// used is when a Clone last named the fiber, in Unix nanoseconds on
	// the agent's clock; 0 until one attaches (a pressure park reads the
	// fiber's Created then).
	used atomic.Int64
	// iso is the isolation the backend said the fiber got.
	iso backend.Isolation
	// origin is the fence its session was created as, whose release key
	// is the fiber's (guard.go, keyFence): set on a resumed fiber, zero
	// for one created by its Clone (its own fence).
	origin core.Fence
}

// New validates cfg and prepares the agent in the order of
// docs/architecture.md, Start and stop: the private state directory (0700), the sweep of what a crashed run
// on it left, the verifier, the backends' cgroup tree, the epoch bump
// (persisted in StateDir/private/epoch before anything is served), the
// ledger, and the API listeners and the admin socket, bound but not
// served: Run serves them. It asks an EndpointHoster home for its endpoint
// host here, once. ctx bounds New's own work.
//
// The state directory, the run directory and the API socket's directory
// must be fiberd's alone, and New refuses to start, before it reads,
// sweeps or binds anything there, when one is not: each must be a
// directory owned by fiberd's effective uid and writable by neither group
// nor others, below directories (up to /) owned by root or that uid and
// writable by neither group nor others unless sticky (as /tmp is); a
// symbolic link on the way must be owned by root or that uid, and is
// judged by what it leads to. A missing directory is judged by the
// nearest one above it, created 0700, and judged again. The error names
// the path and how to fix it. New then takes the state directory's lock
// (StateDir/private/lock, flock, held until Run ends or Close, or the
// process dies) before its sweep: when another agent holds it New fails
// with an error wrapping ErrStateInUse naming that agent's pid, having
// swept and bound nothing.
//
// When Validate refuses cfg, New returns its error and touches nothing:
// cfg.Home and the backends are still the caller's. On a later failure
// everything New acquired is released, and cfg.Home and the backends are
// closed, since the agent owns them from there on (closing them again is
// harmless: their Close is idempotent).
func New(ctx context.Context, cfg Config) (a *Agent, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// a is a named result, so every "return nil, err" below sets it to nil
	// before the deferred cleanup runs; the cleanup needs the agent itself.
	agent := &Agent{
		cfg:          cfg,
		log:          cfg.Logger,
		home:         cfg.Home,
		templates:    template.Dir(cfg.Templates),
		readPressure: cgroupPressure,
		measure:      privateDirty,
		scratch:      scratchUsed,
		stopping:     make(chan struct{}),
		slots:        make(map[string]*slot),
		changed:      make(chan struct{}),
	}
	a = agent
	defer func() {
		if err != nil {
			agent.closeListeners()
			closeOwned(cfg)
			agent.unlock()
			a = nil
		}
	}()

	private, err := makeStateDirs(cfg)
	if err != nil {
		return nil, err
	}
	if a.lock, err = lockState(cfg.StateDir); err != nil {
		return nil, err
	}
	if a.recs, err = procrec.Open(filepath.Join(private, "procs")); err != nil {
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	a.sweep(ctx)

	a.verifier, err = grant.NewVerifier(grant.VerifierConfig{
		Issuer: cfg.Issuer, Audience: cfg.NodeID, Keys: cfg.Keys, MaxLease: cfg.MaxLease, Leeway: cfg.ClockSkew, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}

	if root := cfg.Home.CgroupRoot(); root != "" {
		a.tree, err = cgroup.NewTree(cgroup.Config{Root: root, Logger: a.log})
		if err != nil {
			return nil, fmt.Errorf("fiberd: home %s cgroup root: %w", cfg.Home.Name(), err)
		}
	}
	a.limits = readCgroupLimits(a.tree)
	if err := a.openEndpoints(ctx); err != nil {
		return nil, err
	}

	a.epoch, err = core.OpenEpochStore(filepath.Join(private, "epoch"), cfg.Clock, a.log)
	if err != nil {
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	// The revocations are the ledger's, kept in StateDir/private/denied.json.
	a.ledger, err = core.OpenLedger(a.epoch.Current(), core.NewRevocationFile(filepath.Join(private, "denied.json")), cfg.Clock.Now())
	if err != nil {
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	a.metrics, err = newMetrics(cfg.Registry, a)
	if err != nil {
		return nil, fmt.Errorf("fiberd: metrics: %w", err)
	}
	if err := a.initPark(ctx, private); err != nil {
		return nil, err
	}
	if sl, ok := cfg.Home.(ScopeLoser); ok {
		sl.OnScopeLost(a.scopeLost)
	}

	if err := a.bind(ctx, private); err != nil {
		return nil, err
	}
	a.logIsolation()
	a.logLimits()
	a.log.Info("Agent ready to run", "home", cfg.Home.Name(), "epoch", a.ledger.Epoch(), "listen", cfg.Listen, "socket", cfg.Socket)
	return a, nil
}

// makeStateDirs makes the state, private, run and socket directories of
// cfg and returns the private one. The directories are judged before
// anything is made in them, and again once made: a directory someone made
// meanwhile (under a sticky /tmp, say) is not adopted.
func makeStateDirs(cfg Config) (private string, err error) {
	private = filepath.Join(cfg.StateDir, "private")
	euid := os.Geteuid()
	dirs := places(cfg)
	for _, p := range dirs {
		if err := checkPlace(p, euid, true); err != nil {
			return "", err
		}
	}
	mk := []string{cfg.StateDir, private, cfg.RunDir, filepath.Join(cfg.RunDir, "fibers")}
	if cfg.Socket != "-" {
		mk = append(mk, filepath.Dir(cfg.Socket))
	}
	for _, d := range mk {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", fmt.Errorf("fiberd: state directory %s: %w", d, err)
		}
	}
	if err := os.Chmod(private, 0o700); err != nil {
		return "", fmt.Errorf("fiberd: state directory %s: %w", private, err)
	}
	for _, p := range append(dirs, place{private, "state directory's private directory", "-state"}) {
		if err := checkPlace(p, euid, false); err != nil {
			return "", err
		}
	}
	return private, nil
}

// openEndpoints prepares the fibers' endpoints: for TCP endpoints the port
// allocator and the host, the home's (EndpointHoster) when it has one. The
// home may wait for its address (a Pod's IP the kubelet has not written
// yet); the end of ctx (SIGTERM) cuts that short by closing the home,
// which New closes anyway when it fails.
func (a *Agent) openEndpoints(ctx context.Context) (err error) {
	cfg := a.cfg
	if cfg.EndpointFamily == endpoint.Unix {
		return nil
	}
	if a.ports, err = endpoint.NewAllocator(cfg.PortRange); err != nil {
		return fmt.Errorf("fiberd: port range: %w", err)
	}
	a.host = cfg.EndpointHost
	eh, ok := cfg.Home.(EndpointHoster)
	if !ok {
		return nil
	}
	stop := context.AfterFunc(ctx, cfg.Home.Close)
	h := eh.EndpointHost()
	stop()
	if ctx.Err() != nil {
		return fmt.Errorf("fiberd: stopped while the home %s waited for its endpoint host: %w", cfg.Home.Name(), context.Cause(ctx))
	}
	if h != "" {
		a.host = h
	}
	return nil
}

// sweep ends what a previous run on this state directory left running when
// it crashed: the processes and cgroups its records name (procrec), the
// cgroups only where they lie strictly under the home's cgroup root; each
// recorded cgroup elsewhere is logged and left alone, its record kept. It
// is bounded by drainTimeout; what it cannot end is logged, and its
// records are kept for the next start.
func (a *Agent) sweep(ctx context.Context) {
	ctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, drainTimeout)
	defer cancel()
	root := a.cfg.Home.CgroupRoot()
	sw, err := a.recs.Sweep(ctx, root)
	if err != nil {
		a.log.Error(err, "Ending what the previous run left behind; some of it may still run", "records", a.recs.Path())
	}
	for _, l := range sw.Left {
		a.log.Info("Left alone a cgroup recorded outside this home's cgroup root: end what runs in it yourself, then remove its record",
			"cgroup", l.Cgroup, "cgroupRoot", root, "record", l.Record)
	}
	if sw.Records > 0 {
		a.log.Info("Ended what the previous run left behind", "processes", sw.Processes, "cgroups", sw.Cgroups, "records", sw.Records)
	}
}

// closeOwned closes what the agent owns when New fails.
func closeOwned(cfg Config) {
	if cfg.Home != nil {
		cfg.Home.Close()
	}
	for _, b := range []backend.Backend{cfg.Warm, cfg.Basic} {
		if b != nil {
			_ = b.Close()
		}
	}
}

// bind binds the admin socket and the API listeners.
func (a *Agent) bind(ctx context.Context, private string) error {
	var err error
	a.admin, _, err = endpoint.ListenUnix(filepath.Join(private, "admin.sock"))
	if err != nil {
		return fmt.Errorf("fiberd: admin socket: %w", err)
	}
	a.admin = limitConns(a.admin, a.cfg.Limits.MaxConns)
	if a.cfg.Socket != "-" {
		// New made (and judged) its directory.
		a.apiUnix, _, err = endpoint.ListenUnix(a.cfg.Socket)
		if err != nil {
			return fmt.Errorf("fiberd: -socket %s: %w", a.cfg.Socket, err)
		}
		a.apiUnix = limitConns(a.apiUnix, a.cfg.Limits.MaxConns)
	}
	if a.cfg.Listen != "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", a.cfg.Listen)
		if err != nil {
			return fmt.Errorf("fiberd: -listen %s: %w", a.cfg.Listen, err)
		}
		a.apiTCP = ln
		var tc *tls.Config
		if a.cfg.TLSCert != "" {
			if tc, err = serverTLS(a.cfg); err != nil {
				return err
			}
			a.tcpAuth = true
		}
		a.apiTCP = a.tcpListener(ln, tc) // listeners.go: each kind's shares; net/http sees *tls.Conn
	}
	return nil
}

// serverTLS is the TCP listener's TLS: 1.3 only, client certificates
// required and verified against ClientCA.
func serverTLS(cfg Config) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("fiberd: -tls-cert %s / -tls-key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
	}
	pem, err := os.ReadFile(cfg.ClientCA)
	if err != nil {
		return nil, fmt.Errorf("fiberd: -client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("fiberd: -client-ca %s holds no PEM certificate: %w", cfg.ClientCA, core.ErrInvalid)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

// unlock releases the state directory's lock, once.
func (a *Agent) unlock() {
	if a.lock != nil {
		_ = a.lock.Close()
		a.lock = nil
	}
}

func (a *Agent) closeListeners() {
	for _, ln := range []net.Listener{a.apiTCP, a.apiUnix, a.admin} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// Addr is the bound address of the TCP listener (useful with Listen
// "127.0.0.1:0"), nil when there is none.
func (a *Agent) Addr() net.Addr {
	if a.apiTCP == nil {
		return nil
	}
	return a.apiTCP.Addr()
}

// SocketPath is the API's unix socket, "" when there is none.
func (a *Agent) SocketPath() string {
	if a.apiUnix == nil {
		return ""
	}
	return a.cfg.Socket
}

// AdminSocketPath is the admin socket, StateDir/private/admin.sock.
func (a *Agent) AdminSocketPath() string {
	return filepath.Join(a.cfg.StateDir, "private", "admin.sock")
}

// Epoch is the epoch fences are minted in now.
func (a *Agent) Epoch() uint64 { return a.ledger.Epoch() }

// Close releases what New acquired when Run is never called: the listeners,
// the backends, the home and the state directory's lock. After Run it does
// nothing. It is idempotent.
func (a *Agent) Close() {
	a.mu.Lock()
	if a.closed || a.ran {
		a.closed = true
		a.mu.Unlock()
		return
	}
	a.closed = true
	a.mu.Unlock()
	a.closeListeners()
	closeOwned(a.cfg)
	a.unlock()
}

// Run serves until ctx ends, then drains: it stops accepting, releases every
// fiber, stops every zygote, closes the backends and the home, releases the
// state directory's lock, and returns nil once every goroutine it started
// has ended. When one of its servers
// fails (its listener broke), it drains the same way and returns that
// error. It starts, in order, the
// home, the lane, the work queue, the resync and the exit loops, then serves the admin
// socket and the API. It returns an error without serving when the home's
// lane cannot be opened, or when called twice or after Close.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.ran || a.closed {
		a.mu.Unlock()
		return errRunTwice
	}
	a.ran = true
	a.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lane, err := a.home.Grants(ctx)
	if err != nil {
		cancel()
		a.closeListeners()
		closeOwned(a.cfg)
		a.unlock()
		return fmt.Errorf("fiberd: home %s lane: %w", a.home.Name(), err)
	}

	a.queue = newWorkQueue(ctx, a.cfg.Clock, a.reconcile)
	for uid := range a.ledger.Revocations() {
		// Each revocation's reconcile schedules its expiry.
		a.event(uid, func(*slot) {})
	}
	var loops, exits sync.WaitGroup
	loops.Go(func() { a.home.Run(ctx) })
	if lane != nil {
		loops.Go(func() { a.laneLoop(ctx, lane) })
	}
	loops.Go(func() { a.resync(ctx) })
	loops.Go(func() { a.budgetLoop(ctx) })
	loops.Go(func() { a.pressureLoop(ctx) })
	for _, b := range a.backends() {
		exits.Go(func() { a.exitLoop(b) })
	}

	srv := a.startServers(cancel)
	a.log.Info("Agent serving", "epoch", a.ledger.Epoch())

	<-ctx.Done()
	a.log.Info("Agent draining")
	close(a.stopping)
	srv.shutdown(a.cfg.Clock)
	loops.Wait()
	a.drain()
	exits.Wait()
	a.home.Close()
	// Nothing of this run is left: another agent may take the state
	// directory.
	a.unlock()
	if srv.err != nil {
		a.log.Info("Agent stopped after a failure", "err", srv.err.Error())
		return srv.err
	}
	a.log.Info("Agent stopped")
	return nil
}

// runServers are Run's HTTP servers: the admin socket's and the API's.
type runServers struct {
	srvs []*http.Server
	wg   sync.WaitGroup
	once sync.Once
	err  error // the first server's failure; written once, read after wg.Wait
}

// startServers serves the admin socket and the API listeners. A server
// that fails (its listener broke) records its error and calls cancel,
// which ends Run: it drains and returns that error.
func (a *Agent) startServers(cancel context.CancelFunc) *runServers {
	rs := &runServers{}
	serve := func(ln net.Listener, h http.Handler, authenticated bool) {
		srv := a.server(ln, h, authenticated) // limits.go: timeouts, browser guard
		rs.srvs = append(rs.srvs, srv)
		rs.wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error(err, "API server failed; fiberd stops", "addr", ln.Addr().String())
				rs.once.Do(func() {
					rs.err = fmt.Errorf("fiberd: serving %s: %w", ln.Addr(), err)
					cancel()
				})
			}
		})
	}
	serve(a.admin, a.adminHandler(), true)
	api := a.apiHandler()
	if a.apiUnix != nil {
		serve(a.apiUnix, api, true)
	}
	if a.apiTCP != nil {
		serve(a.apiTCP, api, a.tcpAuth)
	}
	return rs
}

// shutdown stops the servers, gracefully within drainTimeout on clk, then
// at once, and waits for their goroutines.
func (rs *runServers) shutdown(clk clock.WithDelayedExecution) {
	ctx, cancel := core.WithTimeout(context.Background(), clk, drainTimeout)
	defer cancel()
	for _, srv := range rs.srvs {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	rs.wg.Wait()
}

// drain ends this run's work once nothing serves and no loop runs: the
// work queue stops (no reconcile runs past this point: the drain owns
// every slot), every admitted grant is yielded (its fibers released, its
// zygote stopped) concurrently, the image deletions in flight end, and
// the backends close.
func (a *Agent) drain() {
	a.queue.stop()
	a.mu.Lock()
	slots := make([]*slot, 0, len(a.slots))
	for _, s := range a.slots {
		slots = append(slots, s)
	}
	a.mu.Unlock()
	var yields sync.WaitGroup
	for _, s := range slots {
		if s.view().admitted {
			yields.Go(func() { a.yield(context.Background(), s, "agent stopping") })
		}
	}
	yields.Wait()
	a.park.bg.Wait() // the deletions of spent images
	for _, b := range a.backends() {
		if err := b.Close(); err != nil {
			a.log.Error(err, "Closing a backend", "tier", b.Tier())
		}
	}
}

// authKey marks a request's connection as authenticated: the unix socket,
// the admin socket, or TLS with a verified client certificate.
type authKey struct{}

func authenticated(r *http.Request) bool {
	ok, _ := r.Context().Value(authKey{}).(bool)
	if !ok {
		return false
	}
	if r.TLS != nil {
		return len(r.TLS.VerifiedChains) > 0
	}
	return true
}

func (a *Agent) backends() []backend.Backend {
	var out []backend.Backend
	for _, b := range []backend.Backend{a.cfg.Warm, a.cfg.Basic} {
		if b != nil {
			out = append(out, b)
		}
	}
	return out
}

// notify wakes the watchers: the status may have changed.
func (a *Agent) notify() {
	a.mu.Lock()
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
}

// changes is the channel closed at the next notify.
func (a *Agent) changes() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// logWriter routes the HTTP servers' own error lines (failed TLS
// handshakes and the like) to the agent's logger at V(1).
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info("HTTP server", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}
