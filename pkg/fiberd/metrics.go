package fiberd

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Clone outcomes, the "outcome" label of fiberd_clones_total.
const (
	outcomeServed          = "served"
	outcomeShed            = "shed"
	outcomeDeferred        = "deferred_fallback"
	outcomeTierGap         = "tier_gap"
	outcomeInvalid         = "invalid"
	outcomeUnauthenticated = "unauthenticated"
	outcomeInternal        = "internal"
)

// exitOverBudget is the "reason" label of fiberd_fiber_exits_total for a
// fiber ended over its W budget.
const exitOverBudget = "over_wbudget"

// metrics are the agent's Prometheus metrics, registered on Config.Registry.
// Counters and the histogram are updated on the request path; the gauges are
// read from the ledger and the home when scraped, so they never drift.
type metrics struct {
	clones  *prometheus.CounterVec
	latency *prometheus.HistogramVec
	exits   *prometheus.CounterVec
	// unreported counts fibers whose end their zygote never reported:
	// the backend saw the process gone itself after killing it.
	unreported prometheus.Counter
	state      *stateCollector
	iso        *isolationCollector
}

func newMetrics(reg prometheus.Registerer, a *Agent) (*metrics, error) {
	m := &metrics{
		clones: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fiberd_clones_total",
			Help: "Clone requests by kind (create, attach, resume, none for refusals) and outcome (served, shed, deferred_fallback, tier_gap, invalid, unauthenticated, internal).",
		}, []string{"kind", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fiberd_clone_duration_seconds",
			Help:    "Time from a Clone request's arrival to its answer, by kind and outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"kind", "outcome"}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fiberd_fiber_exits_total",
			Help: "Fibers that ended on their own or for their W budget (not those released), by reason: exit, signal, template_died, over_wbudget.",
		}, []string{"reason"}),
		unreported: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fiberd_fiber_ends_unreported_total",
			Help: "Fibers fiberd killed whose zygote never reported the end (EXITED), so fiberd ended them itself: a broken or hostile template.",
		}),
		state: &stateCollector{
			a:       a,
			running: prometheus.NewDesc("fiberd_running_fibers", "Running fibers per admitted grant.", []string{"grant"}, nil),
			warm:    prometheus.NewDesc("fiberd_warm_templates", "Admitted grants whose template is warm.", nil, nil),
			epoch:   prometheus.NewDesc("fiberd_epoch", "The agent's epoch.", nil, nil),
			lane:    prometheus.NewDesc("fiberd_lane_healthy", "1 while the home's control plane counts as reachable, else 0.", nil, nil),
			spares: prometheus.NewDesc("fiberd_spare_fibers", "Spare fibers per grant that asks for some (fibers.warm), by state: ready (forked and waiting) or wanted (min(warm, max - running)).",
				[]string{"grant", "state"}, nil),
			spareBytes: prometheus.NewDesc("fiberd_spare_fiber_bytes", "Memory the waiting spare fibers of a grant hold of their own (the sum of their Private_Dirty).", []string{"grant"}, nil),
			spareTaken: prometheus.NewDesc("fiberd_spare_fibers_taken_total", "Clones served by handing over a spare fiber, per grant, since its zygote started.", []string{"grant"}, nil),
		},
	}
	m.iso = newIsolationCollector(a)
	for _, c := range []prometheus.Collector{m.clones, m.latency, m.exits, m.unreported, m.state, m.iso} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// stateCollector reads the gauges from the agent when scraped.
type stateCollector struct {
	a                              *Agent
	running, warm, epoch, lane     *prometheus.Desc
	spares, spareBytes, spareTaken *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.running
	ch <- c.warm
	ch <- c.epoch
	ch <- c.lane
	ch <- c.spares
	ch <- c.spareBytes
	ch <- c.spareTaken
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	warm := 0
	for _, st := range c.a.ledger.Snapshot() {
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(len(st.Running)), st.Grant.UID)
		if c.a.isWarm(st.Grant.UID) {
			warm++
		}
		if s := c.a.slotOf(st.Grant.UID); s != nil {
			v := s.view()
			if sp := spareStatus(v.backend, st.Grant.UID, v.grant.Fibers.Warm, v.admitted && v.warm); sp != nil {
				uid := st.Grant.UID
				ch <- prometheus.MustNewConstMetric(c.spares, prometheus.GaugeValue, float64(sp.Ready), uid, "ready")
				ch <- prometheus.MustNewConstMetric(c.spares, prometheus.GaugeValue, float64(sp.Wanted), uid, "wanted")
				ch <- prometheus.MustNewConstMetric(c.spareBytes, prometheus.GaugeValue, float64(sp.Bytes), uid)
				ch <- prometheus.MustNewConstMetric(c.spareTaken, prometheus.CounterValue, float64(sp.Taken), uid)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(c.warm, prometheus.GaugeValue, float64(warm))
	ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(c.a.ledger.Epoch()))
	lane := 0.0
	if c.a.cfg.Home.Health().Healthy() {
		lane = 1
	}
	ch <- prometheus.MustNewConstMetric(c.lane, prometheus.GaugeValue, lane)
}
