package main

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for _, tc := range []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"p50 of 1..100", hundred, 50, 50},
		{"p90 of 1..100", hundred, 90, 90},
		{"p99 of 1..100", hundred, 99, 99},
		{"p100 is the max", hundred, 100, 100},
		{"p0 is the min", hundred, 0, 1},
		{"one sample", []float64{7}, 99, 7},
		{"p50 of two is the lower", []float64{1, 2}, 50, 1},
		{"p99 of ten is the max", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 10},
	} {
		if got := Percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: Percentile(p%v) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("Percentile of no samples is not NaN")
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 4, 2, 3})
	if s.N != 5 || s.P50 != 3 || s.Min != 1 || s.Max != 5 || s.Mean != 3 || s.P99 != 5 {
		t.Errorf("Summarize = %+v", s)
	}
	if e := Summarize(nil); e.N != 0 || !math.IsNaN(e.P50) || !math.IsNaN(e.Mean) {
		t.Errorf("Summarize(nil) = %+v, want N 0 and NaNs", e)
	}
}

func TestParsePss(t *testing.T) {
	const rollup = `55d0c0a3b000-7ffd5e5f5000 ---p 00000000 00:00 0                          [rollup]
Rss:                3456 kB
Pss:                1234 kB
Pss_Dirty:           800 kB
Pss_Anon:            700 kB
Shared_Clean:       2000 kB
`
	for _, tc := range []struct {
		name    string
		doc     string
		want    int64
		wantErr bool
	}{
		{"rollup", rollup, 1234, false},
		{"Pss_Anon is not Pss", "Pss_Anon: 5 kB\n", 0, true},
		{"no Pss", "Rss: 5 kB\n", 0, true},
		{"empty", "", 0, true},
		{"bad number", "Pss: x kB\n", 0, true},
		{"bad unit", "Pss: 5 MB\n", 0, true},
		{"negative", "Pss: -5 kB\n", 0, true},
	} {
		got, err := ParsePss([]byte(tc.doc))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%s: ParsePss = %d, %v; want %d, error %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParsePPid(t *testing.T) {
	for _, tc := range []struct {
		stat    string
		want    int
		wantErr bool
	}{
		{"4242 (counter) S 4200 4242 4200 0 -1", 4200, false},
		{"4242 (a (weird) name) R 17 1 1 0", 17, false},
		{"4242 counter S 1", 0, true},
		{"4242 (x)", 0, true},
	} {
		got, err := ParsePPid([]byte(tc.stat))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParsePPid(%q) = %d, %v; want %d, error %v", tc.stat, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestRequestCounts(t *testing.T) {
	doc := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 7
apiserver_request_total{code="404",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 40
apiserver_request_total_other{resource="pods",verb="GET"} 99
apiserver_request_duration_seconds_bucket{resource="pods",verb="GET",le="0.1"} 5
`
	s, err := ParseCounter([]byte(doc), "apiserver_request_total")
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 4 {
		t.Fatalf("ParseCounter found %d samples, want 4 (other metrics with the same prefix skipped)", len(s))
	}
	got := RequestCounts(s, "pods", "namespaces")
	if len(got) != 2 || got["GET pods"] != 8 || got["PATCH pods/status"] != 2 {
		t.Errorf("RequestCounts = %v", got)
	}
	before := map[string]float64{"GET pods": 8, "PATCH pods/status": 2}
	after := map[string]float64{"GET pods": 11, "PATCH pods/status": 2, "GET namespaces": 3}
	d := Delta(before, after)
	if len(d) != 2 || d["GET pods"] != 3 || d["GET namespaces"] != 3 {
		t.Errorf("Delta = %v", d)
	}
	if total, writes := sums(map[string]float64{"GET pods": 3, "PATCH pods/status": 1, "WATCH pods": 1}); total != 5 || writes != 1 {
		t.Errorf("sums = %v, %v", total, writes)
	}
	if _, err := ParseCounter([]byte(`apiserver_request_total{verb="GET" 1`), "apiserver_request_total"); err == nil {
		t.Error("a malformed sample was accepted")
	}
	if _, err := ParseCounter([]byte(`apiserver_request_total{verb="GET"} x`), "apiserver_request_total"); err == nil {
		t.Error("a malformed value was accepted")
	}
	esc, err := ParseCounter([]byte(`apiserver_request_total{a="x\"y,z",verb="GET"} 1`), "apiserver_request_total")
	if err != nil || esc[0].Labels["a"] != `x"y,z` || esc[0].Labels["verb"] != "GET" {
		t.Errorf("escaped label: %v, %v", esc, err)
	}
}

func sampleResult() Result {
	warm := Summarize([]float64{1, 2, 3, 4})
	return Result{
		Command: "go run ./bench -quick",
		Latency: latencyRows(map[string]LatencyRow{
			modeWarmC:   {Measured: true, What: "Clone, dial, GET, first byte", Summary: warm},
			modeWarmPy:  {Measured: true, Summary: Summarize([]float64{4, 8, 12, 16})},
			modeExecC:   {Measured: false, Note: "no cc"},
			modePod:     {Measured: false, Note: "kube-apiserver not run"},
			modePodNode: {Measured: true, What: "create Pod, first byte", Summary: Summarize([]float64{800, 900, 1000, 1100})},
		}),
		Burst:   []BurstRow{{Mode: modeWarmC, Measured: true, Size: 50, Rounds: 2, AllServed: warm, PerFiber: warm}},
		Loop:    []LoopRow{{Mode: modeWarmC, Measured: true, Concurrency: 4, PerSecond: 321.5, Cycle: warm}},
		Density: []DensityRow{{Template: "counter C", Measured: true, N: 10, WarmMiB: 20, ColdMiB: 100, WarmProcs: 11, ColdProcs: 10, Ratio: 5}},
		Park: []ParkRow{
			{Case: "C, 16 MiB of its own", Measured: true, Clone: Summarize([]float64{1, 2}), Park: Summarize([]float64{20, 40}),
				Resume: Summarize([]float64{30, 31}), ImageMiB: 17.5, OwnMiB: 16.1, ParkTarget: 30, ResumeTarget: 25},
			{Case: "Python http counter", Note: "CHECKPOINT tier absent: no CRIU"},
		},
		APIServer: APIServerResult{Note: "kube-apiserver not run"},
		KubeHome:  KubeHomeResult{Note: "kube-apiserver not run"},
		Machine:   Machine{NProc: 2, MemTotalMiB: 1024, Kernel: "6.1"},
		Spares:    []SpareRow{{Template: "counter Python", Warm: 50, Ready: 50, MiB: 40, PerSpareMiB: 0.8}},
	}
}

func TestMarkdown(t *testing.T) {
	r := sampleResult()
	py := r.Latency[slices.IndexFunc(r.Latency, func(l LatencyRow) bool { return l.Mode == modeWarmPy })]
	if py.RatioP50 != 4 {
		t.Fatalf("warm Python p50 ratio = %v, want 4", py.RatioP50)
	}
	md := Markdown(r, "bench")
	for _, want := range []string{
		"| fiberd warm C | Clone", // rows exist in order
		"| fiberd warm Python |",
		"| fiberd warm C, W=8 spares |  | not measured |",
		"| counter Python | 50 | 50 | 40.0 | 0.80 |  |",
		"| 4 | 2.00 | 4.00 | 4.00 | 1.00x / 1.00x / 1.00x |",
		"| fiberd exec C (cold) |  | not measured |",
		"| Pod per worker (API server only) |  | not measured |",
		"| Pod per worker (real node) | create Pod, first byte | 4 | 900.0 | 1100 | 1100 | 450.0x / 275.0x / 275.0x |",
		"a Pod per worker on a real node (scheduled, sandbox, container, first HTTP byte) has p50 900.0 ms and p99 1100 ms, 4.55x below the SLO; its p50 is 450.0x fiberd warm C's",
		"![latency CDF](bench/latency-cdf.png)",
		"| fiberd warm C | 4 | 321.5 |",
		"| counter C | 10 | 20.0 (2.00 / fiber, 11 procs) | 100.0 (10.0 / process) | 5.00x |",
		"| requests per fiber | not measured |",
		"| C, 16 MiB of its own | 2 | 1.00 / 2.00 | 20.0 (target 30.0: meets) / 40.0 | 30.0 (target 25.0: over) / 31.0 | 17.5 | 16.1 |",
		"| Python http counter | not measured |  |  |  |  |  | CHECKPOINT tier absent: no CRIU |",
		"about 4.00 ms: fiberd warm C p50 is 2.00 ms",
		"2.00x below the figure",
		"46.0x below it",
		"Pod start-up SLO (5 s p99): a Pod per worker on the API server alone not measured",
		"| `nproc` | 2 |",
		"Command: `go run ./bench -quick`",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the table lacks %q:\n%s", want, md)
		}
	}
	if i, j := strings.Index(md, "fiberd warm C | Clone"), strings.Index(md, "Pod per worker ("); i < 0 || j < i {
		t.Error("warm C is not the first latency row")
	}
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| ") && strings.Contains(line, "NaN") {
			t.Errorf("a table row prints NaN: %s", line)
		}
	}
}

func TestReplaceSection(t *testing.T) {
	doc := "# Title\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n\n## Kept\n"
	got, err := ReplaceSection([]byte(doc), "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Title\n\n<!-- bench:begin -->\nnew table\n<!-- bench:end -->\n\n## Kept\n"; string(got) != want {
		t.Errorf("ReplaceSection =\n%s\nwant\n%s", got, want)
	}
	for _, bad := range []string{"no markers", "<!-- bench:end --> <!-- bench:begin -->", "<!-- bench:begin --><!-- bench:begin --><!-- bench:end -->"} {
		if _, err := ReplaceSection([]byte(bad), "x"); err == nil {
			t.Errorf("ReplaceSection(%q) did not fail", bad)
		}
	}
}

func TestParseFlagsQuick(t *testing.T) {
	o, err := parseFlags([]string{"-quick"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if o.n >= 300 || o.coldN > o.n || o.burst >= 50 {
		t.Errorf("-quick left the full sizes: %+v", o)
	}
	if _, err := parseFlags([]string{"-endpoint", "sctp"}, &strings.Builder{}); err == nil {
		t.Error("-endpoint sctp was accepted")
	}
}

func FuzzParsePss(f *testing.F) {
	f.Add([]byte("Rss: 5 kB\nPss: 4 kB\n"))
	f.Add([]byte("Pss:\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParsePss(b)
		if err == nil && v < 0 {
			t.Fatalf("negative Pss %d", v)
		}
	})
}

func FuzzParseCounter(f *testing.F) {
	f.Add([]byte(`apiserver_request_total{verb="GET",resource="pods"} 3`))
	f.Add([]byte(`apiserver_request_total{a="\"} 3`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseCounter(b, "apiserver_request_total")
	})
}
