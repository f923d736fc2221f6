package fiberd

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// Isolation in the agent: the backends isolate (pkg/backend); the agent
// says once at start what each gives, shows it per grant and per fiber in
// the status and the metrics, and refuses a grant that would get less
// than Config.MinIsolation with a tier gap.

// logIsolation logs, once (New calls it), in one line, the isolation each
// backend gives on this host and what is missing for more. The backends'
// own lines are at V(1).
func (a *Agent) logIsolation() {
	var (
		kv      []any
		missing []string
		refused []string
		asked   bool // some backend was asked for isolation
		less    bool // some backend gives less than asked
	)
	network, apart := true, true
	for _, b := range a.backends() {
		s := b.Isolation()
		kv = append(kv, strings.ToLower(string(b.Tier())), s.Level.String())
		if s.Level != backend.IsolationNone || s.Missing != "" {
			asked = true
			network = network && s.NetworkNone
			apart = apart && s.EndpointsApart
		}
		if s.Missing != "" {
			less = true
			if !contains(missing, s.Missing) {
				missing = append(missing, s.Missing)
			}
		}
		if !s.Level.AtLeast(a.cfg.MinIsolation) {
			refused = append(refused, string(b.Tier()))
		}
	}
	if a.cfg.MinIsolation.AtLeast(backend.IsolationGrant) {
		kv = append(kv, "minIsolation", a.cfg.MinIsolation.String())
	}
	if len(refused) > 0 {
		kv = append(kv, "refusedTiers", strings.Join(refused, ","))
	}
	switch {
	case less:
		kv = append(kv, "networkNone", network, "endpointsApart", apart, "missing", strings.Join(missing, "; "))
		a.log.Info("Isolation is less than asked", kv...)
	case asked:
		kv = append(kv, "networkNone", network, "endpointsApart", apart)
		a.log.Info("Isolation", kv...)
	default:
		a.log.Info("Isolation is off: fibers run as fiberd's user, in its namespaces", kv...)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// isolationGap refuses backend b for grant g with a tier gap when b gives
// less than Config.MinIsolation on this host. A template that allows less
// ("isolation": "shared") is refused by the backend's Warm, which
// WarmRequest.MinIsolation tells.
func (a *Agent) isolationGap(g core.Grant, b backend.Backend) error {
	s := b.Isolation()
	if s.Level.AtLeast(a.cfg.MinIsolation) {
		return nil
	}
	why := s.Missing
	if why == "" {
		why = "fiberd was asked for less (-isolation)"
	}
	return fmt.Errorf("grant %q: this node serves grants isolated at %s at least (-min-isolation), its %s tier gives %s (%s): %w",
		g.UID, a.cfg.MinIsolation, b.Tier(), s.Level, why, core.ErrTierGap)
}

// isolationStatus is what each backend isolates, for the status.
func (a *Agent) isolationStatus() []api.TierIsolation {
	var out []api.TierIsolation
	for _, b := range a.backends() {
		s := b.Isolation()
		out = append(out, api.TierIsolation{Tier: b.Tier(), Level: s.Level.String(), NetworkNone: s.NetworkNone, EndpointsApart: s.EndpointsApart, Missing: s.Missing})
	}
	return out
}

// minIsolationStatus is Status.MinIsolation: empty for none.
func (a *Agent) minIsolationStatus() string {
	if a.cfg.MinIsolation.AtLeast(backend.IsolationGrant) {
		return a.cfg.MinIsolation.String()
	}
	return ""
}

// fiberIsolation is the isolation a running fiber got, "" when unknown.
func fiberIsolation(f core.Fiber) string {
	if h := handleOf(f); h != nil && h.iso != "" {
		return h.iso.String()
	}
	return ""
}

// isolationCollector serves the isolation gauges, read from the backends
// and the slots when scraped.
type isolationCollector struct {
	a            *Agent
	tier, grants *prometheus.Desc
}

func newIsolationCollector(a *Agent) *isolationCollector {
	return &isolationCollector{
		a: a,
		tier: prometheus.NewDesc("fiberd_backend_isolation",
			"1 for the isolation level (none, grant, fiber) each tier gives grants on this host.", []string{"tier", "level"}, nil),
		grants: prometheus.NewDesc("fiberd_grant_isolation",
			"1 for the isolation level (none, grant, fiber) each admitted, warm grant's fibers get.", []string{"grant", "level"}, nil),
	}
}

func (c *isolationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tier
	ch <- c.grants
}

func (c *isolationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, b := range c.a.backends() {
		ch <- prometheus.MustNewConstMetric(c.tier, prometheus.GaugeValue, 1, string(b.Tier()), b.Isolation().Level.String())
	}
	for _, st := range c.a.ledger.Snapshot() {
		uid := st.Grant.UID
		s := c.a.slotOf(uid)
		if s == nil {
			continue
		}
		v := s.view()
		if !v.admitted || !v.warm || v.backend == nil {
			continue
		}
		if level := v.backend.GrantIsolation(uid); level != "" {
			ch <- prometheus.MustNewConstMetric(c.grants, prometheus.GaugeValue, 1, uid, level.String())
		}
	}
}

// validIsolation reports whether i names a level.
func validIsolation(i backend.Isolation) bool {
	_, err := backend.ParseIsolation(string(i))
	return err == nil
}
