package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

const apiText = `# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 7
apiserver_request_total{code="404",component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",group="authentication.k8s.io",resource="tokenreviews",scope="cluster",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="",scope="",subresource="",verb="GET",version=""} 4
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 5
other_metric{a="b \"q\" \\ c"} 1e3
`

func TestRequestCounts(t *testing.T) {
	s, err := parseText(apiText, "apiserver_request_total")
	if err != nil {
		t.Fatal(err)
	}
	got := requestCounts(s)
	want := map[requestKey]float64{
		{"GET", "pods"}:           8, // both codes
		{"PATCH", "pods/status"}:  2,
		{"POST", "tokenreviews"}:  3,
		{"GET", "(non-resource)"}: 4,
	}
	if len(got) != len(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v", k, got[k], v)
		}
	}
}

func TestParseTextEscapesAndErrors(t *testing.T) {
	s, err := parseText(apiText, "other_metric")
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 1 || s[0].labels["a"] != `b "q" \ c` || s[0].value != 1000 {
		t.Fatalf("samples %+v", s)
	}
	for _, bad := range []string{`m{a="x" 1`, `m{a=x} 1`, `m{a="x"}`, `m{a="x"} one`} {
		if _, err := parseText(bad); err == nil || !strings.Contains(err.Error(), "metrics line") {
			t.Errorf("%q: error %v, want one naming the line", bad, err)
		}
	}
}

func TestRatesInWindow(t *testing.T) {
	before := map[requestKey]float64{{"GET", "pods"}: 10, {"PATCH", "pods/status"}: 5}
	after := map[requestKey]float64{{"GET", "pods"}: 40, {"PATCH", "pods/status"}: 5, {"POST", "tokenreviews"}: 6}
	rs := rates(before, after, 3)
	if len(rs) != 2 {
		t.Fatalf("rates %v: want the two keys that moved", rs)
	}
	if rs[0].Key != (requestKey{"GET", "pods"}) || rs[0].PerSec != 10 || rs[1].PerSec != 2 {
		t.Fatalf("rates %v: want GET pods 10/s then POST tokenreviews 2/s", rs)
	}
	if totalRate(rs) != 12 {
		t.Fatalf("total %v", totalRate(rs))
	}
}

const histText = `controller_runtime_reconcile_time_seconds_bucket{controller="fiberpool",le="0.005"} 10
controller_runtime_reconcile_time_seconds_bucket{controller="fiberpool",le="0.01"} 50
controller_runtime_reconcile_time_seconds_bucket{controller="fiberpool",le="0.1"} 90
controller_runtime_reconcile_time_seconds_bucket{controller="fiberpool",le="+Inf"} 100
controller_runtime_reconcile_time_seconds_sum{controller="fiberpool"} 2
controller_runtime_reconcile_time_seconds_count{controller="fiberpool"} 100
controller_runtime_reconcile_time_seconds_bucket{controller="other",le="+Inf"} 7
controller_runtime_reconcile_time_seconds_count{controller="other"} 7
`

func TestHistogramQuantile(t *testing.T) {
	s, err := parseText(histText)
	if err != nil {
		t.Fatal(err)
	}
	h := reconcileHist(s)
	if h.count != 100 || h.mean() != 0.02 {
		t.Fatalf("count %v mean %v: want 100 and 0.02 (the other controller left out)", h.count, h.mean())
	}
	// Rank 50 is the top of the 10 ms bucket; rank 70 is halfway through (10 ms, 100 ms].
	for q, want := range map[float64]float64{0.5: 0.01, 0.7: 0.055, 0.05: 0.0025, 0.99: 0.1} {
		if got := h.quantile(q); math.Abs(got-want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", q, got, want)
		}
	}
	// The same histogram scraped earlier with 40 observations, all under 5 ms.
	before := histogram{bounds: []float64{0.005, 0.01, 0.1, math.Inf(1)}, counts: []float64{10, 10, 10, 10}, count: 10, sum: 0.01}
	d := h.minus(before)
	if d.count != 90 || d.counts[0] != 0 || d.quantile(0.5) <= 0.005 {
		t.Fatalf("difference %+v: want 90 observations, none under 5 ms", d)
	}
	if !math.IsNaN((histogram{}).quantile(0.5)) {
		t.Fatal("an empty histogram's quantile is not NaN")
	}
}

func TestOptionsValidate(t *testing.T) {
	o := defaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, mut := range map[string]func(*Options){
		"pods not a multiple of pools": func(o *Options) { o.Pods = 15 },
		"short lease":                  func(o *Options) { o.Lease = time.Second },
		"busy poll":                    func(o *Options) { o.Poll = time.Millisecond },
		"no CRD":                       func(o *Options) { o.CRD = "" },
	} {
		o := defaultOptions()
		mut(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := parseFlags([]string{"-pods", "4", "-pools", "2", "extra"}, &strings.Builder{}); err == nil {
		t.Error("an argument was taken")
	}
	o, err := parseFlags([]string{"-pods", "4", "-pools", "2", "-nodes", "2"}, &strings.Builder{})
	if err != nil || o.Pods != 4 || o.Pools != 2 || o.Nodes != 2 {
		t.Fatalf("flags: %+v, %v", o, err)
	}
}
