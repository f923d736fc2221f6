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
	lane   chan home.GrantEvent

	// mu guards the fields below it; cfg, health and lane are set by New
	// and never written again.
	mu        sync.Mutex
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
		lane:   make(chan home.GrantEvent, 64),
		ready:  map[string]bool{},
		own:    own,
	}
}

// Name is "fake".
func (h *Home) Name() string { return "fake" }

// Grants returns the lane Deliver and Remove feed, or a nil channel (and
// no error) when Config.NoLane is set.
func (h *Home) Grants(context.Context) (<-chan home.GrantEvent, error) {
	if h.cfg.NoLane {
		return nil, nil
	}
	return h.lane, nil
}

// Deliver puts a GrantAdded of token (grant uid) on the lane. The lane
// holds 64 events; Deliver blocks while it is full. It panics when
// Config.NoLane is set, as nothing would read the event.
func (h *Home) Deliver(uid string, token []byte) {
	h.send(home.GrantEvent{Kind: home.GrantAdded, UID: uid, Token: token, Path: uid + ".jwt"})
}

// Remove puts a GrantRemoved of uid on the lane. It blocks and panics as
// Deliver does.
func (h *Home) Remove(uid string) {
	h.send(home.GrantEvent{Kind: home.GrantRemoved, UID: uid, Path: uid + ".jwt"})
}

// send puts ev on the lane; see Deliver.
func (h *Home) send(ev home.GrantEvent) {
	if h.cfg.NoLane {
		panic("fake home: " + ev.Kind.String() + " of " + ev.UID + " on a home without a lane (Config.NoLane)")
	}
	h.lane <- ev
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
