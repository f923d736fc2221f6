package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
)

// Defaults of Config.
const (
	// DefaultAttemptTimeout bounds each Pod's attempt at a Clone but the
	// last one's, which gets whatever is left of the call's deadline. A
	// served Clone takes milliseconds; a Pod that has not answered in this
	// long is hung or gone, and the next Pod is asked.
	DefaultAttemptTimeout = 3 * time.Second
	// DefaultSessions is how many sessions' Pods a Pool remembers.
	DefaultSessions = 65536
	// DefaultCooldown is how long a Pod that missed or could not be
	// reached is asked after the others (unless a SHED asked for longer).
	DefaultCooldown = 2 * time.Second
	// DefaultForget is how long a Pod that left the endpoints (drained,
	// deleted, not ready) is remembered, so Release and Park of its fibers
	// still reach it.
	DefaultForget = time.Hour
)

// maxCooldown caps the back-off a SHED's Retry-After puts on one Pod.
const maxCooldown = 30 * time.Second

// maxDeparted caps how many Pods that left the endpoints are remembered.
const maxDeparted = 4096

// Errors a Pool returns besides the agents' own.
var (
	// ErrNoReadyPods is the cause of the miss a Clone gets when the pool
	// has no Pod to send it to: none ready and serving, or the endpoints
	// not read yet.
	ErrNoReadyPods = errors.New("no ready grant Pod")
	// ErrUnknownPod is a Release or Park of a fiber whose grant Pod (the
	// fiber id's UID) this Pool has never listed or has forgotten.
	ErrUnknownPod = errors.New("fiber of a grant Pod this client does not know")
	// ErrClosed is a call on a closed Pool.
	ErrClosed = errors.New("pool client closed")
)

// Config says which pool a Pool routes Clones across and how.
type Config struct {
	// Namespace and Name are the pool's (the FiberPool's, and its
	// Service's). Name is required; both name the pool in errors and
	// logs, and Namespace gives TLS its default server name.
	Namespace string
	Name      string
	// Source lists the pool's ready, serving grant Pods. Required for New;
	// Open builds one from the pool's EndpointSlices.
	Source Source
	// TLS is the client's TLS configuration for the Pods' API (TLS 1.3
	// with a client certificate the Pods' -client-ca signed; see
	// client.TLSConfig). Every Pod is dialled by IP, so the server
	// certificate is checked against TLS.ServerName, which defaults to
	// "fiberd.<Namespace>.svc", the name of the fiberd-api-tls
	// certificate the grant Pods mount (docs/kubernetes.md). Nil means
	// plaintext, which fiberd serves on loopback only and where it admits
	// no Clone of a Pod's own grant: for tests.
	TLS *tls.Config
	// Timeout bounds a call whose context has no deadline. Default
	// client.DefaultTimeout.
	Timeout time.Duration
	// AttemptTimeout bounds each Pod's attempt at a Clone but the last.
	// Default DefaultAttemptTimeout; negative means none (each attempt may
	// take the whole deadline).
	AttemptTimeout time.Duration
	// Sessions is how many sessions' Pods are remembered, least recently
	// used forgotten first. Default DefaultSessions.
	Sessions int
	// Cooldown is how long a Pod that missed or could not be reached is
	// ranked after the others. Default DefaultCooldown.
	Cooldown time.Duration
	// Forget is how long a Pod that left the endpoints is remembered for
	// Release and Park. Default DefaultForget.
	Forget time.Duration
	// Transport replaces the HTTP transport shared by every Pod's client
	// (tests use it); it must carry TLS itself, and its owner closes its
	// idle connections. Default: one built for TLS, whose connections
	// Close closes.
	Transport http.RoundTripper
	// Logger receives the Pool's lines (Pods joining and leaving, failed
	// attempts at V(1)). Default klog.Background().
	Logger logr.Logger
}

// Validate reports the first field that is wrong and how to fix it.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("pool: Name is empty: name the FiberPool (its Service has the same name)")
	case c.Source == nil:
		return fmt.Errorf("pool %s: Source is nil: use Open for a pool in Kubernetes, or NewStaticSource", c.qualified())
	case c.Timeout < 0:
		return fmt.Errorf("pool %s: Timeout %v is negative: use 0 for the default %v", c.qualified(), c.Timeout, client.DefaultTimeout)
	case c.Sessions < 0:
		return fmt.Errorf("pool %s: Sessions %d is negative: use 0 for the default %d", c.qualified(), c.Sessions, DefaultSessions)
	case c.Cooldown < 0:
		return fmt.Errorf("pool %s: Cooldown %v is negative: use 0 for the default %v", c.qualified(), c.Cooldown, DefaultCooldown)
	case c.Forget < 0:
		return fmt.Errorf("pool %s: Forget %v is negative: use 0 for the default %v", c.qualified(), c.Forget, DefaultForget)
	}
	return nil
}

// qualified is "namespace/name", or the name alone without a namespace.
func (c Config) qualified() string {
	if c.Namespace == "" {
		return c.Name
	}
	return c.Namespace + "/" + c.Name
}

// Pool sends Clones to the grant Pods of one pool, and Release and Park to
// the Pod that served the fiber. It is safe for concurrent use. Build one
// with New or Open; Close it when done.
type Pool struct {
	cfg       Config
	name      string // namespace/name
	log       logr.Logger
	stopSrc   func() // stops a Source the Pool owns (Open); nil otherwise
	transport *http.Transport

	mu       sync.Mutex
	closed   bool
	seen     bool   // a snapshot was read
	version  uint64 // of the snapshot read
	synced   bool
	listed   []*pod          // the snapshot's Pods, sorted by UID
	pods     map[string]*pod // by UID: listed and departed
	sessions *sessionCache
}

// pod is what a Pool keeps of one grant Pod. ep and c are set when it is
// made and never change; the rest is guarded by Pool.mu.
type pod struct {
	ep       Endpoint
	c        *client.Client
	listed   bool
	left     time.Time // when it left the endpoints, while not listed
	inflight int       // this Pool's Clones under way there
	missed   time.Time // ranked after the others until then (a miss)
	down     time.Time // ranked last until then (unreachable, hung)
}

// New returns a Pool over cfg.Source. It dials nothing: the first Clone
// connects. Close releases its connections; it does not stop cfg.Source.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = client.DefaultTimeout
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.Sessions == 0 {
		cfg.Sessions = DefaultSessions
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.Forget == 0 {
		cfg.Forget = DefaultForget
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		if cfg.TLS.ServerName == "" && cfg.Namespace != "" {
			cfg.TLS.ServerName = "fiberd." + cfg.Namespace + ".svc"
		}
	}
	p := &Pool{
		cfg:      cfg,
		name:     cfg.qualified(),
		pods:     map[string]*pod{},
		sessions: newSessionCache(cfg.Sessions),
	}
	p.log = cfg.Logger.WithValues("pool", p.name)
	if cfg.Transport == nil {
		d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		p.transport = &http.Transport{
			DialContext:         d.DialContext,
			MaxIdleConnsPerHost: 16,
			// Below fiberd's own idle timeout, as pkg/client's transport.
			IdleConnTimeout:     20 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		}
		if cfg.TLS != nil {
			p.transport.TLSClientConfig = cfg.TLS
		}
		p.cfg.Transport = p.transport
	}
	return p, nil
}

// Name is the pool's "namespace/name".
func (p *Pool) Name() string { return p.name }

// Close ends the Pool: it stops the Source Open started and closes idle
// connections. Calls after Close fail with ErrClosed; calls under way run
// to their end. It is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	if p.stopSrc != nil {
		p.stopSrc()
	}
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	return nil
}

// Endpoints is the Pods the Pool sends Clones to now, sorted by PodUID.
func (p *Pool) Endpoints() []Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshLocked(time.Now())
	out := make([]Endpoint, len(p.listed))
	for i, pd := range p.listed {
		out[i] = pd.ep
	}
	return out
}

// refreshLocked reads the Source and, when its version moved, rebuilds the
// listed Pods: new ones get a client, those gone are kept as departed until
// Forget has passed. p.mu is held.
func (p *Pool) refreshLocked(now time.Time) {
	snap := p.cfg.Source.Snapshot()
	p.synced = snap.Synced
	if p.seen && snap.Version == p.version {
		return
	}
	p.seen, p.version = true, snap.Version
	listed := make([]*pod, 0, len(snap.Endpoints))
	still := make(map[*pod]bool, len(snap.Endpoints))
	for _, ep := range snap.Endpoints {
		pd := p.pods[ep.PodUID]
		if pd == nil || pd.ep != ep {
			// A pod's ep and c never change once made: calls read them
			// without the lock. A changed endpoint is a new pod, whose
			// counts start afresh.
			var c *client.Client
			if pd != nil && pd.ep.Addr == ep.Addr {
				c = pd.c
			} else {
				var err error
				c, err = client.New(client.Config{Addr: ep.Addr, TLS: p.cfg.TLS, Timeout: p.cfg.Timeout, Transport: p.cfg.Transport})
				if err != nil {
					p.log.Error(err, "grant Pod left out: its address is not host:port", "pod", ep.PodName, "addr", ep.Addr)
					continue
				}
			}
			if pd == nil || !pd.listed {
				p.log.V(1).Info("grant Pod serving", "pod", ep.PodName, "addr", ep.Addr, "node", ep.Node)
			}
			pd = &pod{ep: ep, c: c}
			p.pods[ep.PodUID] = pd
		} else if !pd.listed {
			p.log.V(1).Info("grant Pod serving", "pod", ep.PodName, "addr", ep.Addr, "node", ep.Node)
		}
		pd.listed, pd.left = true, time.Time{}
		listed = append(listed, pd)
		still[pd] = true
	}
	for _, pd := range p.listed {
		if p.pods[pd.ep.PodUID] == pd && pd.left.IsZero() && !still[pd] {
			pd.listed, pd.left = false, now
			p.log.V(1).Info("grant Pod left the endpoints; its fibers stay reachable for Release and Park", "pod", pd.ep.PodName, "addr", pd.ep.Addr)
		}
	}
	p.listed = listed
	p.forgetLocked(now)
}

// forgetLocked drops departed Pods older than Forget, and the oldest ones
// past maxDeparted.
func (p *Pool) forgetLocked(now time.Time) {
	var departed []*pod
	for uid, pd := range p.pods {
		switch {
		case pd.listed:
		case now.Sub(pd.left) > p.cfg.Forget:
			delete(p.pods, uid)
		default:
			departed = append(departed, pd)
		}
	}
	if len(departed) <= maxDeparted {
		return
	}
	sortByLeft(departed)
	for _, pd := range departed[:len(departed)-maxDeparted] {
		delete(p.pods, pd.ep.PodUID)
	}
}

// Clone asks the pool for a fiber. req names no grant (Grant and GrantUID
// empty): each Pod is asked for a fiber of its own grant, whose UID is the
// Pod's. The Pods are asked one at a time, each at most once, in the order
// of picker (the session's Pod first; otherwise the least loaded), until one
// serves the Clone, within ctx's deadline (Config.Timeout when it has none)
// and, but for the last Pod, Config.AttemptTimeout each; req.DeadlineMs is
// lowered to the attempt's bound so the Pod gives up when the client does.
//
// A capacity miss (SHED, DEFERRED_FALLBACK), an answer of 429 or 5xx, or a
// Pod that cannot be reached or does not answer in time moves on to the
// next Pod. Any other refusal (400 INVALID, 401 UNAUTHENTICATED, ...) is
// returned at once, wrapped with the Pod's name: client.AsError and the
// pkg/core classes still match it. When no Pod serves the Clone the error
// is an *Error listing each Pod's answer; with no Pod to ask at all it is a
// SHED miss caused by ErrNoReadyPods.
//
// The response is the Pod's own: its FiberID starts with the Pod's UID,
// which is how Release and Park find the Pod again.
func (p *Pool) Clone(ctx context.Context, req api.CloneRequest) (api.CloneResponse, error) {
	if req.Grant != "" || req.GrantUID != "" {
		return api.CloneResponse{}, fmt.Errorf("pool %s: the Clone names a grant: leave Grant and GrantUID empty, each grant Pod serves its own grant: %w", p.name, core.ErrInvalid)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.Timeout)
		defer cancel()
	}
	pk, synced, err := p.pick(req.Session)
	if err != nil {
		return api.CloneResponse{}, err
	}
	if pk.left == 0 {
		return api.CloneResponse{}, p.noPods(synced)
	}
	var attempts []Attempt
	for {
		if ctx.Err() != nil {
			return api.CloneResponse{}, &Error{Pool: p.name, Attempts: attempts, Untried: pk.left, Err: ctx.Err()}
		}
		pd := p.next(pk)
		if pd == nil {
			break
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if pk.left > 0 && p.cfg.AttemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, p.cfg.AttemptTimeout)
		}
		r := req
		r.GrantUID = pd.ep.PodUID
		if dl, ok := actx.Deadline(); ok {
			if ms := time.Until(dl).Milliseconds(); ms > 0 && (r.DeadlineMs == 0 || r.DeadlineMs > ms) {
				r.DeadlineMs = ms
			}
		}
		start := time.Now()
		resp, err := pd.c.Clone(actx, r)
		took := time.Since(start)
		hung := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			p.served(pd, req.Session)
			return resp, nil
		}
		if !failOver(err) {
			p.end(pd, time.Time{}, time.Time{})
			return api.CloneResponse{}, fmt.Errorf("pool %s: pod %s (%s): %w", p.name, pd.ep.PodName, pd.ep.Addr, err)
		}
		now := time.Now()
		var missed, down time.Time
		if ce, ok := client.AsError(err); ok {
			cool := p.cfg.Cooldown
			if ra := ce.RetryAfter(); ra > cool {
				cool = min(ra, maxCooldown)
			}
			missed = now.Add(cool)
		} else if ctx.Err() == nil || hung {
			// Not answered: refused, reset, or hung past its attempt's
			// bound. The caller's own deadline ending is no fault of the
			// Pod's.
			down = now.Add(p.cfg.Cooldown)
		}
		p.end(pd, missed, down)
		if hung {
			err = fmt.Errorf("no answer within %v: %w", p.cfg.AttemptTimeout, err)
		}
		attempts = append(attempts, Attempt{Pod: pd.ep, Err: err, Took: took})
		p.log.V(1).Info("Clone not served, trying the next Pod", "pod", pd.ep.PodName, "addr", pd.ep.Addr, "err", err.Error(), "left", pk.left)
	}
	e := &Error{Pool: p.name, Attempts: attempts}
	if ctx.Err() != nil {
		e.Err = ctx.Err()
	}
	return api.CloneResponse{}, e
}

// failOver reports whether a Clone that failed with err should be tried on
// another Pod: a capacity miss, a 429 or 5xx answer (the Pod's trouble, not
// the request's), or no answer at all. Other refusals would be the same on
// every Pod.
func failOver(err error) bool {
	ce, ok := client.AsError(err)
	if !ok {
		return true
	}
	return ce.IsMiss() || ce.Status == http.StatusTooManyRequests || ce.Status >= 500
}

// noPods is the error of a Clone with no Pod to ask.
func (p *Pool) noPods(synced bool) error {
	reason := fmt.Sprintf("pool %s has no ready grant Pod: check the FiberPool's status and its Pods' readiness (fiberd.io/zygote-ready)", p.name)
	if !synced {
		reason = fmt.Sprintf("pool %s: its endpoints are not read yet", p.name)
	}
	m := core.Shed(reason, "", 0)
	m.Cause = ErrNoReadyPods
	return m
}

// pick returns the picker of a Clone of session, and whether the Source
// has synced.
func (p *Pool) pick(session string) (*picker, bool, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, fmt.Errorf("pool %s: %w", p.name, ErrClosed)
	}
	p.refreshLocked(time.Now())
	var home *pod
	if session != "" {
		if uid, ok := p.sessions.get(session); ok {
			if pd := p.pods[uid]; pd != nil && pd.listed {
				home = pd
			}
		}
	}
	listed, synced := p.listed, p.synced
	p.mu.Unlock()
	return newPicker(listed, session, home), synced, nil
}

// next is the picker's next Pod, counted under way there; nil when none
// is left.
func (p *Pool) next(pk *picker) *pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	pd := pk.next(time.Now())
	if pd != nil {
		pd.inflight++
	}
	return pd
}

// end counts an attempt on pd done, ranking it lower until missed or down
// when they are set.
func (p *Pool) end(pd *pod, missed, down time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pd.inflight--
	if !missed.IsZero() {
		pd.missed = missed
	}
	if !down.IsZero() {
		pd.down = down
	}
}

// served counts an attempt on pd done and served: the Pod is ranked as
// usual again, and a session's Clones go to it from now on.
func (p *Pool) served(pd *pod, session string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pd.inflight--
	pd.missed, pd.down = time.Time{}, time.Time{}
	if session != "" {
		p.sessions.put(session, pd.ep.PodUID)
	}
}

// Release ends the fiber fiberID on the Pod that served it (see
// ReleaseFiber).
func (p *Pool) Release(ctx context.Context, fiberID string) error {
	return p.ReleaseFiber(ctx, api.FiberRequest{FiberID: fiberID})
}

// ReleaseFiber ends the fiber req names on the Pod that served it: the Pod
// whose UID is the fiber id's first part (a Pod's grant UID is its UID),
// found among the Pods the Pool lists or has listed within Config.Forget,
// so a fiber of a draining Pod, which has left the endpoints, is still
// released. A fiber of a Pod it does not know is an error wrapping
// ErrUnknownPod; a malformed id one wrapping core.ErrInvalid. The Pod's
// refusal is returned wrapped with its name.
func (p *Pool) ReleaseFiber(ctx context.Context, req api.FiberRequest) error {
	pd, err := p.podOf(req.FiberID)
	if err != nil {
		return err
	}
	if err := pd.c.ReleaseFiber(ctx, req); err != nil {
		return fmt.Errorf("pool %s: pod %s (%s): %w", p.name, pd.ep.PodName, pd.ep.Addr, err)
	}
	return nil
}

// Park parks the fiber fiberID on the Pod that served it (see ParkFiber).
func (p *Pool) Park(ctx context.Context, fiberID string) (api.ParkResponse, error) {
	return p.ParkFiber(ctx, api.FiberRequest{FiberID: fiberID})
}

// ParkFiber parks the fiber req names on the Pod that served it, found as
// ReleaseFiber finds it. The parked session's Clones go to that Pod from
// then on (its image is there), while it is listed.
func (p *Pool) ParkFiber(ctx context.Context, req api.FiberRequest) (api.ParkResponse, error) {
	pd, err := p.podOf(req.FiberID)
	if err != nil {
		return api.ParkResponse{}, err
	}
	resp, err := pd.c.ParkFiber(ctx, req)
	if err != nil {
		return resp, fmt.Errorf("pool %s: pod %s (%s): %w", p.name, pd.ep.PodName, pd.ep.Addr, err)
	}
	if resp.Session != "" {
		p.mu.Lock()
		p.sessions.put(resp.Session, pd.ep.PodUID)
		p.mu.Unlock()
	}
	return resp, nil
}

// PodOf is the Pod that served the fiber fiberID, as ReleaseFiber finds it.
func (p *Pool) PodOf(fiberID string) (Endpoint, error) {
	pd, err := p.podOf(fiberID)
	if err != nil {
		return Endpoint{}, err
	}
	return pd.ep, nil
}

func (p *Pool) podOf(fiberID string) (*pod, error) {
	f, err := core.ParseFence(fiberID)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", p.name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("pool %s: %w", p.name, ErrClosed)
	}
	p.refreshLocked(time.Now())
	pd := p.pods[f.GrantUID]
	if pd == nil {
		return nil, fmt.Errorf("pool %s: fiber %s: no grant Pod of UID %s is or was listed in the last %v: call its Pod directly (fiberctl -addr POD_IP:8484): %w",
			p.name, fiberID, f.GrantUID, p.cfg.Forget, ErrUnknownPod)
	}
	return pd, nil
}
