package core

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// SourceHealth is the one staleness rule for a control plane, used by every
// home: is the source of grants reachable, by the home's own signal. A home
// calls MarkSync each time the control plane answers; the agent reads
// Healthy to pick between DEFERRED_FALLBACK (healthy) and SHED (stale) for a
// capacity miss.
//
// It starts in sync. It turns unhealthy once the last sync is at least
// staleTTL old, and turns healthy again only once the last sync is younger
// than staleTTL/2, so a source that answers about once per TTL does not
// flap. MarkUnreachable forces it unhealthy and ignores marks until Resume.
//
// A SourceHealth is safe for concurrent use.
type SourceHealth struct {
	clock    clock.PassiveClock
	staleTTL time.Duration

	mu          sync.Mutex
	last        time.Time
	healthy     bool
	unreachable bool
}

// NewSourceHealth returns a health that is in sync now, by clk, and goes
// stale after staleTTL without a sync. A nil clk is the real clock.
func NewSourceHealth(staleTTL time.Duration, clk clock.PassiveClock) *SourceHealth {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &SourceHealth{clock: clk, staleTTL: staleTTL, last: clk.Now(), healthy: true}
}

// StaleTTL is the age of the last sync at which the source turns unhealthy.
func (h *SourceHealth) StaleTTL() time.Duration { return h.staleTTL }

// MarkSync records that the source answered now. It is ignored while the
// source is marked unreachable.
func (h *SourceHealth) MarkSync() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unreachable {
		return
	}
	h.last = h.clock.Now()
}

// LastSync is when the source last answered, or when the health was made
// (or resumed) if it has not answered since.
func (h *SourceHealth) LastSync() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Healthy reports whether the source counts as reachable now. It is false
// from the moment the last sync is staleTTL old, and while marked
// unreachable; it is true again once a sync younger than staleTTL/2 is seen.
func (h *SourceHealth) Healthy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unreachable {
		h.healthy = false
		return false
	}
	age := h.clock.Since(h.last)
	switch {
	case h.healthy && age >= h.staleTTL:
		h.healthy = false
	case !h.healthy && age < h.staleTTL/2:
		h.healthy = true
	}
	return h.healthy
}

// MarkUnreachable makes the source unhealthy now and keeps it so: later
// MarkSync calls are ignored until Resume. It is the test override behind
// the admin socket.
func (h *SourceHealth) MarkUnreachable() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreachable = true
	h.healthy = false
}

// Resume ends MarkUnreachable: it marks a sync now and accepts marks again.
func (h *SourceHealth) Resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreachable = false
	h.last = h.clock.Now()
}
