package issuer

import (
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	shared "fiberd.io/fiberd/pkg/issuer"
)

// The issuer's metrics, served with the controller's on its metrics address.
var (
	// grantRequests counts GET /v1/grant answers by HTTP status: 200 a grant, 404 not yet, 403
	// refused, 401 unauthenticated, 503 unavailable.
	grantRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fiberd_issuer_grant_requests_total",
		Help: "Grant requests answered by the controller's issuer, by HTTP status code.",
	}, []string{"code"})
	// publishedKeys is how many keys the JWKS holds: 1, or 2 around a rotation.
	publishedKeys = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fiberd_issuer_published_keys",
		Help: "Signing keys the controller's issuer publishes in its JWKS, as last read from its Secret.",
	})
	registerOnce sync.Once
)

// registerMetrics adds the issuer's metrics to controller-runtime's registry, once.
func registerMetrics() {
	registerOnce.Do(func() { metrics.Registry.MustRegister(grantRequests, publishedKeys) })
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// counted wraps h so the answers to the grant path are counted in grantRequests.
func counted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, shared.PathGrant) {
			h.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		grantRequests.WithLabelValues(strconv.Itoa(rec.status)).Inc()
	})
}
