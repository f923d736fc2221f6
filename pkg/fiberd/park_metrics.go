package fiberd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Park outcomes, the "outcome" label of fiberd_parks_total.
const (
	parkParked  = "parked"
	parkRefused = "refused" // the fiber runs on: an error in a class (wireClasses): no tier, no session, busy, no room, not found
	parkFailed  = "failed"  // CRIU or the disk failed
)

// parkMetrics are the CHECKPOINT tier's metrics. A resume is a Clone: it
// counts in fiberd_clones_total and fiberd_clone_duration_seconds with
// kind "resume".
type parkMetrics struct {
	parks    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	deleted  *prometheus.CounterVec
}

func newParkMetrics(reg prometheus.Registerer, a *Agent) (*parkMetrics, error) {
	m := &parkMetrics{
		parks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fiberd_parks_total",
			Help: "Parks by what asked (api, pressure) and outcome (parked; refused: the fiber runs on; failed: CRIU or the disk failed).",
		}, []string{"by", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fiberd_park_duration_seconds",
			Help:    "Time from a park's start to its image on disk and the fiber ended, by what asked, for parks that succeeded.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"by"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fiberd_parked_images_deleted_total",
			Help: "Parked images deleted, by reason: resumed, released, unusable, stale (grant or epoch gone), ended, yielded, epoch.",
		}, []string{"reason"}),
	}
	state := &parkCollector{
		a:         a,
		available: prometheus.NewDesc("fiberd_checkpoint_available", "1 when fibers can be parked (the CHECKPOINT tier), else 0.", nil, nil),
		sessions:  prometheus.NewDesc("fiberd_parked_sessions", "Parked sessions per admitted grant.", []string{"grant"}, nil),
		bytes:     prometheus.NewDesc("fiberd_parked_bytes", "Bytes of parked images per admitted grant.", []string{"grant"}, nil),
	}
	for _, c := range []prometheus.Collector{m.parks, m.duration, m.deleted, state} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// parked counts one park that ended with err after took: parked when err
// is nil (and its duration observed), else the park outcome of err's row
// of wireClasses (refused, or failed for a fault or a full disk).
func (m *parkMetrics) parked(by string, err error, took time.Duration) {
	outcome := parkParked
	if err != nil {
		outcome = wireClassOf(err).park
	} else {
		m.duration.WithLabelValues(by).Observe(took.Seconds())
	}
	m.parks.WithLabelValues(by, outcome).Inc()
}

// parkCollector reads the parked gauges from the slots when scraped.
type parkCollector struct {
	a                          *Agent
	available, sessions, bytes *prometheus.Desc
}

func (c *parkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.available
	ch <- c.sessions
	ch <- c.bytes
}

func (c *parkCollector) Collect(ch chan<- prometheus.Metric) {
	avail := 0.0
	if c.a.park.ck != nil {
		avail = 1
	}
	ch <- prometheus.MustNewConstMetric(c.available, prometheus.GaugeValue, avail)
	for _, st := range c.a.ledger.Snapshot() {
		n, b := c.a.park.count(st.Grant.UID)
		ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(n), st.Grant.UID)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(b), st.Grant.UID)
	}
}
