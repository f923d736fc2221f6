package fake

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/home"
)

// Config configures a Home. Every field is optional.
type Config struct {
	// Devices are handed to every grant as a static device channel; empty
	// means none.
	Devices []string
	// CgroupRoot is what CgroupRoot returns. Default "" (no cgroups).
	CgroupRoot string
	// StaleTTL is the health's staleness rule. Default 30 s.
	StaleTTL time.Duration
	// Clock stamps the health. Default the real clock.
	Clock clock.PassiveClock
	// NoLane makes Grants return a nil channel: grants then arrive only
	// inside Clone requests, as in a home without a lane of its own.
	// Deliver and Remove panic on such a home.
	NoLane bool
	// SelfAdmitUID is what SelfAdmitUID returns. Default "" (none).
	SelfAdmitUID string
	// OwnGrant is the home's own grant token at the start; SetOwnGrant
	// replaces it. Default nil (none).
	OwnGrant []byte
}

// Home is the fake home. New returns one; it is safe for concurrent use.
type Home struct {
	cfg    Config
	health *core.SourceHealth
	wake   chan struct{} // holds a value when lane may have grown

	// mu guards the fields below it; cfg, health and wake are set by New
	// and never written again.
	mu        sync.Mutex
	lane      []home.GrantEvent // delivered, not yet passed on; in order
	ready     map[string]bool
	scopeLost func(context.Context, string)
	own       []byte // the own grant token; nil for none
	closes    int    // how many times Close was called
}

var _ home.Home = (*Home)(nil)

// New returns a home with cfg, healthy, with an empty lane.
func New(cfg Config) *Home {
	if cfg.StaleTTL == 0 {
		cfg.StaleTTL = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Devices = slices.Clone(cfg.Devices)
	own := slices.Clone(cfg.OwnGrant)
	cfg.OwnGrant = nil // the live token is h.own, under h.mu
	return &Home{
		cfg:    cfg,
		health: core.NewSourceHealth(cfg.StaleTTL, cfg.Clock),
		wake:   make(chan struct{}, 1),
		ready:  map[string]bool{},
		own:    own,
	}
}

// Name is "fake".
func (h *Home) Name() string { return "fake" }

// Grants returns the lane Deliver and Remove feed, or a nil channel (and
// no error) when Config.NoLane is set. As home.Home says, the channel is
// closed when ctx ends; an event not passed on by then stays queued, first
// in line, for the next call.
func (h *Home) Grants(ctx context.Context) (<-chan home.GrantEvent, error) {
	if h.cfg.NoLane {
		return nil, nil
	}
	out := make(chan home.GrantEvent)
	go func() {
		defer close(out)
		for {
			ev, ok := h.next()
			if !ok {
				select {
				case <-h.wake:
					continue
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				h.mu.Lock()
				h.lane = append([]home.GrantEvent{ev}, h.lane...)
				h.mu.Unlock()
				return
			}
		}
	}()
	return out, nil
}

// next takes the lane's first event out.
func (h *Home) next() (home.GrantEvent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.lane) == 0 {
		return home.GrantEvent{}, false
	}
	ev := h.lane[0]
	h.lane = h.lane[1:]
	return ev, true
}

// Deliver queues a GrantAdded of token (grant uid) on the lane; it never
// blocks. It panics when Config.NoLane is set, as nothing would read the
// event.
func (h *Home) Deliver(uid string, token []byte) {
	h.send(home.GrantEvent{Kind: home.GrantAdded, UID: uid, Token: token, Path: uid + ".jwt"})
}

// Remove queues a GrantRemoved of uid on the lane, as Deliver does.
func (h *Home) Remove(uid string) {
	h.send(home.GrantEvent{Kind: home.GrantRemoved, UID: uid, Path: uid + ".jwt"})
}

// send queues ev on the lane; see Deliver.
func (h *Home) send(ev home.GrantEvent) {
	if h.cfg.NoLane {
		panic("fake home: " + ev.Kind.String() + " of " + ev.UID + " on a home without a lane (Config.NoLane)")
	}
	h.mu.Lock()
	h.lane = append(h.lane, ev)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Health is the control plane's health, in sync unless the issuer was
// marked unreachable.
func (h *Home) Health() *core.SourceHealth { return h.health }

// CgroupRoot is Config.CgroupRoot.
func (h *Home) CgroupRoot() string { return h.cfg.CgroupRoot }

// Devices is the static channel of Config.Devices, or none.
func (h *Home) Devices(context.Context, core.Grant) (core.DeviceChannel, func(), error) {
	if len(h.cfg.Devices) == 0 {
		return core.DeviceChannel{}, func() {}, nil
	}
	return core.DeviceChannel{Kind: core.DeviceKindStatic, Devices: slices.Clone(h.cfg.Devices)}, func() {}, nil
}

// PublishReady records whether grantUID is ready.
func (h *Home) PublishReady(_ context.Context, grantUID string, ready bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ready {
		h.ready[grantUID] = true
	} else {
		delete(h.ready, grantUID)
	}
	return nil
}

// Ready reports whether any grant was published ready.
func (h *Home) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ready) > 0
}

// IsReady reports whether grantUID was published ready.
func (h *Home) IsReady(grantUID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready[grantUID]
}

// Scope is one claim: the home is fake.
func (h *Home) Scope() []core.ScopeClaim { return []core.ScopeClaim{{Name: "home", Value: "fake"}} }

// OwnGrant is the home's own grant token (Config.OwnGrant, or what
// SetOwnGrant last set), and whether it has one. The caller must not
// modify the token.
func (h *Home) OwnGrant() ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.own, h.own != nil
}

// SetOwnGrant replaces the home's own grant token, as a home renewing the
// token it fetched does; nil means none. The agent sees it at its next
// self-admission.
func (h *Home) SetOwnGrant(token []byte) {
	token = slices.Clone(token)
	h.mu.Lock()
	h.own = token
	h.mu.Unlock()
}

// SelfAdmitUID is Config.SelfAdmitUID.
func (h *Home) SelfAdmitUID() string { return h.cfg.SelfAdmitUID }

// Run waits for ctx.
func (h *Home) Run(ctx context.Context) { <-ctx.Done() }

// Close marks the home closed and counts the call. It is idempotent:
// nothing but the count changes after the first call.
func (h *Home) Close() {
	h.mu.Lock()
	h.closes++
	h.mu.Unlock()
}

// Closed reports whether Close was called.
func (h *Home) Closed() bool { return h.Closes() > 0 }

// Closes is how many times Close was called, for tests that assert the
// agent closes its home exactly once (or not at all).
func (h *Home) Closes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closes
}

// OnScopeLost registers fn, which LoseScope calls.
func (h *Home) OnScopeLost(fn func(context.Context, string)) {
	h.mu.Lock()
	h.scopeLost = fn
	h.mu.Unlock()
}

// LoseScope tells the agent the scope is lost, with reason, and returns
// once its handler did. It reports whether a handler was registered.
func (h *Home) LoseScope(ctx context.Context, reason string) bool {
	h.mu.Lock()
	fn := h.scopeLost
	h.mu.Unlock()
	if fn == nil {
		return false
	}
	fn(ctx, reason)
	return true
}

// SetIssuerReachable forces the health unhealthy (false) or resumes it.
func (h *Home) SetIssuerReachable(reachable bool) {
	if reachable {
		h.health.Resume()
	} else {
		h.health.MarkUnreachable()
	}
}
