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
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
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
	limiter   *rate.Limiter
	ports     *endpoint.Allocator // nil for the unix family
	tree      *cgroup.Tree        // nil without a cgroup root
	host      string              // the endpoint host fibers listen on
	metrics   *metrics
	// readPressure reads a grant's pressure for pressureShed:
	// cgroupPressure, replaced by tests before Run.
	readPressure pressureReader
	noPSI        sync.Once // "memory.pressure is absent" is logged once

	apiTCP   net.Listener // nil when Listen is empty
	apiUnix  net.Listener // nil when Socket is "-"
	admin    net.Listener
	tcpAuth  bool // callers on apiTCP present verified client certificates
	stopping chan struct{}

	// admitMu serialises admissions, warms and yields (lane, Clone,
	// reaper, drain), so one grant is warmed once and never after its
	// yield.
	admitMu sync.Mutex
	// epochMu keeps epoch bumps and the ledger's epoch in step.
	epochMu sync.Mutex

	mu      sync.Mutex
	grants  map[string]*grantRT // runtime state of admitted grants
	gaps    map[string]error    // delivered grants refused for a tier gap
	changed chan struct{}       // closed and replaced on every status change
	closed  bool
	ran     bool
}

// grantRT is the runtime side of an admitted grant.
type grantRT struct {
	grant   core.Grant
	spec    template.Spec
	backend backend.Backend
	cg      *cgroup.Grant // nil without a cgroup root
	release func()        // the device channel's release; nil until acquired
	devices core.DeviceChannel
	warm    bool
	warmErr error
	// pressure is the cached reading of cg's pressure (see pressureShed).
	pressure pressureCache
}

// fiberHandle is the agent's part of a running fiber, kept in the ledger's
// Fiber.Handle: what to free when the fiber ends.
type fiberHandle struct {
	backend backend.Backend
	port    int    // TCP port held in the allocator, 0 for unix
	sock    string // unix socket path, "" for TCP
}

// New validates cfg and prepares the agent in the order of ARCHITECTURE
// 4.7: the private state directory (0700), the verifier, the backends'
// cgroup tree, the epoch bump (persisted in StateDir/private/epoch before
// anything is served), the ledger, and the API listeners and the admin
// socket, bound but not served: Run serves them. It asks an EndpointHoster
// home for its endpoint host here, once. ctx bounds New's own work.
//
// On failure everything New acquired is released, and cfg.Home and the
// backends are closed, since the agent owns them from New on.
func New(ctx context.Context, cfg Config) (a *Agent, err error) {
	if err := cfg.Validate(); err != nil {
		closeOwned(cfg)
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
		limiter:      rate.NewLimiter(rate.Limit(cfg.ThrashRate), cfg.ThrashBurst),
		readPressure: cgroupPressure,
		stopping:     make(chan struct{}),
		grants:       make(map[string]*grantRT),
		gaps:         make(map[string]error),
		changed:      make(chan struct{}),
	}
	a = agent
	defer func() {
		if err != nil {
			agent.closeListeners()
			closeOwned(cfg)
			a = nil
		}
	}()

	private := filepath.Join(cfg.StateDir, "private")
	for _, d := range []string{cfg.StateDir, private, cfg.RunDir, filepath.Join(cfg.RunDir, "fibers")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("fiberd: state directory %s: %w", d, err)
		}
	}
	if err := os.Chmod(private, 0o700); err != nil {
		return nil, fmt.Errorf("fiberd: state directory %s: %w", private, err)
	}

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
	if cfg.EndpointFamily != endpoint.Unix {
		a.ports, err = endpoint.NewAllocator(cfg.PortRange)
		if err != nil {
			return nil, fmt.Errorf("fiberd: port range: %w", err)
		}
		a.host = cfg.EndpointHost
		if eh, ok := cfg.Home.(EndpointHoster); ok {
			if h := eh.EndpointHost(); h != "" {
				a.host = h
			}
		}
	}

	a.epoch, err = core.OpenEpochStore(filepath.Join(private, "epoch"), cfg.Clock, a.log)
	if err != nil {
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	a.ledger = core.NewLedger(a.epoch.Current())
	a.metrics, err = newMetrics(cfg.Registry, a)
	if err != nil {
		return nil, fmt.Errorf("fiberd: metrics: %w", err)
	}
	if sl, ok := cfg.Home.(ScopeLoser); ok {
		sl.OnScopeLost(a.scopeLost)
	}

	if err := a.bind(ctx, private); err != nil {
		return nil, err
	}
	a.log.Info("Agent ready to run", "home", cfg.Home.Name(), "epoch", a.ledger.Epoch(), "listen", cfg.Listen, "socket", cfg.Socket)
	return a, nil
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
		if err := os.MkdirAll(filepath.Dir(a.cfg.Socket), 0o700); err != nil {
			return fmt.Errorf("fiberd: socket directory: %w", err)
		}
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
		ln = limitConns(ln, a.cfg.Limits.MaxConns) // beneath TLS: net/http must see *tls.Conn
		a.apiTCP = ln
		if a.cfg.TLSCert != "" {
			tc, err := serverTLS(a.cfg)
			if err != nil {
				return err
			}
			a.apiTCP = tls.NewListener(ln, tc)
			a.tcpAuth = true
		}
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
// the backends and the home. After Run it does nothing. It is idempotent.
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
}

// Run serves until ctx ends, then drains: it stops accepting, releases every
// fiber, stops every zygote, closes the backends and the home, and returns
// nil once every goroutine it started has ended. It starts, in order, the
// home, the lane, the reaper and the exit loops, then serves the admin
// socket and the API. It returns an error without serving when the home's
// lane cannot be opened, or when called twice or after Close.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.ran || a.closed {
		a.mu.Unlock()
		return errors.New("fiberd: Run called twice or after Close")
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
		return fmt.Errorf("fiberd: home %s lane: %w", a.home.Name(), err)
	}

	var loops, exits, servers sync.WaitGroup
	loops.Go(func() { a.home.Run(ctx) })
	if lane != nil {
		loops.Go(func() { a.laneLoop(ctx, lane) })
	}
	loops.Go(func() { a.reaper(ctx) })
	for _, b := range a.backends() {
		exits.Go(func() { a.exitLoop(b) })
	}

	var srvs []*http.Server
	serve := func(ln net.Listener, h http.Handler, authenticated bool) {
		srv := a.server(ln, h, authenticated) // limits.go: timeouts, browser guard
		srvs = append(srvs, srv)
		servers.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error(err, "API server stopped", "addr", ln.Addr().String())
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
	a.log.Info("Agent serving", "epoch", a.ledger.Epoch())

	<-ctx.Done()
	a.log.Info("Agent draining")
	close(a.stopping)
	sctx, scancel := core.WithTimeout(context.Background(), a.cfg.Clock, drainTimeout)
	for _, srv := range srvs {
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}
	scancel()
	servers.Wait()
	loops.Wait()

	dctx, dcancel := core.WithTimeout(context.Background(), a.cfg.Clock, drainTimeout)
	a.mu.Lock()
	uids := make([]string, 0, len(a.grants))
	for uid := range a.grants {
		uids = append(uids, uid)
	}
	a.mu.Unlock()
	for _, uid := range uids {
		a.yield(dctx, uid, "agent stopping")
	}
	dcancel()
	for _, b := range a.backends() {
		if err := b.Close(); err != nil {
			a.log.Error(err, "Closing a backend", "tier", b.Tier())
		}
	}
	exits.Wait()
	a.home.Close()
	a.log.Info("Agent stopped")
	return nil
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

// lookup reads admitted grant uid's runtime state under mu: rt (nil when
// uid is not admitted), its cgroup (nil without a cgroup root or before
// warm carved it) and whether warm succeeded since the zygote last died.
// rt.backend never changes, so callers use it without mu.
func (a *Agent) lookup(uid string) (rt *grantRT, cg *cgroup.Grant, warm bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rt = a.grants[uid]
	if rt == nil {
		return nil, nil, false
	}
	return rt, rt.cg, rt.warm
}

// isWarm reports whether admitted grant uid's template is warm.
func (a *Agent) isWarm(uid string) bool {
	rt, _, warm := a.lookup(uid)
	return warm && rt.backend.Warmed(uid)
}

// logWriter routes the HTTP servers' own error lines (failed TLS
// handshakes and the like) to the agent's logger at V(1).
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info("HTTP server", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}
