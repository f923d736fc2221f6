package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// Modes of the latency table.
const (
	modeWarmC  = "fiberd warm C"
	modeWarmPy = "fiberd warm Python"
	// The same, with every fiber isolated (-isolation fiber).
	modeWarmCIso  = "fiberd warm C, isolated"
	modeWarmPyIso = "fiberd warm Python, isolated"
	modeExecC     = "fiberd exec C (cold)"
	modePod       = "Pod per worker (API server only)"
	modePodNode   = "Pod per worker (real node)"
)

// options are the flags.
type options struct {
	n, coldN      int
	initMs        int
	burst, rounds int
	loop          time.Duration
	densityN      int
	holdMiB       int
	dirtyMiB      int
	kubePoll      time.Duration
	kubeRounds    int
	metricClones  int
	endpoint      string
	out           string
	doc           string
	plotDir       string
	skipKube      bool
	skipNode      bool
	nodeN         int
	nodeBurst     int
	nodeIdle      time.Duration
	onlyNode      bool
	quick         bool
	verbose       bool
	noPlot        bool
	parkN         int
	criu          string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 300, "samples per mode of clone-to-first-byte (warm and Pod per worker)")
	fs.IntVar(&o.coldN, "n-cold", 0, "samples of the cold exec mode (each pays -init-ms); 0 means min(n, 60)")
	fs.IntVar(&o.initMs, "init-ms", 200, "the templates' --init-ms: what warm pays once and cold per fiber")
	fs.IntVar(&o.burst, "burst", 50, "clones in one burst")
	fs.IntVar(&o.rounds, "burst-rounds", 5, "bursts per mode")
	fs.DurationVar(&o.loop, "loop", 5*time.Second, "how long each closed-loop point runs")
	fs.IntVar(&o.densityN, "density-n", 50, "fibers (and processes) in the density comparison")
	fs.IntVar(&o.holdMiB, "hold-mib", 16, "MiB the C template allocates and touches at init in the density comparison")
	fs.IntVar(&o.dirtyMiB, "dirty-mib", 1, "MiB each C fiber writes of its own in the density comparison")
	fs.DurationVar(&o.kubePoll, "kube-poll", time.Second, "the Kubernetes home's poll period (production default 15s)")
	fs.IntVar(&o.kubeRounds, "kube-rounds", 5, "grant Pods started for the Kubernetes home timings")
	fs.IntVar(&o.metricClones, "metric-clones", 200, "clones counted against apiserver_request_total")
	fs.StringVar(&o.endpoint, "endpoint", "unix", "the fibers' endpoint family: unix or inet4")
	fs.StringVar(&o.out, "out", "bench-out", "directory for results.json, results.md and the plots")
	fs.StringVar(&o.doc, "doc", "", "a Markdown file whose section between <!-- bench:begin --> and <!-- bench:end --> is replaced with the table")
	fs.StringVar(&o.plotDir, "plot-link", "", "the path the plots are linked under in the table (default: -out relative to -doc's directory, else -out)")
	fs.BoolVar(&o.skipKube, "skip-kube", false, "measure without kube-apiserver and etcd; their rows say \"not measured\"")
	fs.BoolVar(&o.skipNode, "skip-node", false, "measure without a real node; the real-node Pod-per-worker row says \"not measured\"")
	fs.IntVar(&o.nodeN, "n-node", 30, "single starts of each real-node row (fiberd grant Pod, Pod per worker, agent-sandbox warm pool)")
	fs.IntVar(&o.nodeBurst, "node-burst", 20, "workers of each real-node row's burst; the warm pool holds this many and 4 more")
	fs.DurationVar(&o.nodeIdle, "node-idle", 10*time.Second, "the idle window before each real-node row whose writes are the cluster's own")
	fs.BoolVar(&o.onlyNode, "only-node", false, "measure only the real-node comparison (the other sections say \"not measured\"); not with -doc")
	fs.BoolVar(&o.quick, "quick", false, "a fast smoke run: few samples, short loops, small bursts")
	fs.BoolVar(&o.verbose, "v", false, "log fiberd's and the home's lines to stderr (default: a file in $TMPDIR, named at the start)")
	fs.BoolVar(&o.noPlot, "no-plot", false, "write no PNG plots")
	fs.IntVar(&o.parkN, "park-n", 30, "park and resume cycles per template in the park rows")
	fs.StringVar(&o.criu, "criu", backend.DefaultCRIUPath(), "the criu the park rows run (hack/criu.sh builds it there); none to skip them")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.quick {
		o.n, o.coldN, o.burst, o.rounds, o.loop = 30, 5, 10, 1, time.Second
		o.densityN, o.kubeRounds, o.metricClones, o.nodeN = 8, 1, 20, 5
		o.nodeIdle = 3 * time.Second
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "park-n" })
		if !set {
			o.parkN = 5
		}
	}
	if o.criu == "none" {
		o.criu = ""
	}
	if o.coldN <= 0 {
		o.coldN = min(o.n, 60)
	}
	if o.parkN < 1 {
		return o, errors.New("-park-n must be positive")
	}
	if o.onlyNode && (o.doc != "" || o.skipNode || o.skipKube) {
		return o, errors.New("-only-node measures the real-node rows alone: not with -doc, -skip-node or -skip-kube")
	}
	if o.nodeBurst < 1 || o.nodeIdle <= 0 {
		return o, errors.New("-node-burst and -node-idle must be positive")
	}
	if o.n < 1 || o.nodeN < 1 || o.burst < 1 || o.rounds < 1 || o.densityN < 1 || o.kubeRounds < 1 || o.metricClones < 1 || o.loop <= 0 || o.kubePoll <= 0 {
		return o, errors.New("-n, -n-node, -burst, -burst-rounds, -density-n, -kube-rounds, -metric-clones, -loop and -kube-poll must be positive")
	}
	if o.endpoint != "unix" && o.endpoint != "inet4" {
		return o, fmt.Errorf("-endpoint %q: want unix or inet4", o.endpoint)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fmt.Fprintf(stderr, "bench: -out: %v\n", err)
		return 1
	}
	p := newProgress(stderr)
	log, closeLog, err := openLog(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	defer closeLog()

	started := time.Now()
	res := Result{Command: "go run ./bench " + strings.Join(args, " "), Started: started, Quick: o.quick}
	res.Settings = Settings{N: o.n, ColdN: o.coldN, InitMs: o.initMs, BurstSize: o.burst, BurstRounds: o.rounds,
		LoopSeconds: o.loop.Seconds(), Concurrency: []int{1, 2, 4, 16}, DensityN: o.densityN, HoldMiB: o.holdMiB,
		DirtyMiB: o.dirtyMiB, KubePoll: o.kubePoll.String(), KubeRounds: o.kubeRounds, MetricClones: o.metricClones,
		Endpoint: o.endpoint, ParkN: o.parkN}
	benchCRIU = o.criu
	res.Machine = readMachine()
	if res.Machine.LoadPerCPU > 0.5 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("the machine was busy at the start (load average %s on %d CPUs): expect noisy tails", res.Machine.LoadStart, res.Machine.NProc))
	}
	if !o.verbose {
		p.Phasef("fiberd's log lines go to %s", logPath(o))
	}
	p.Phasef("machine: %d CPUs, %d MiB, kernel %s, load %s", res.Machine.NProc, res.Machine.MemTotalMiB, res.Machine.Kernel, res.Machine.LoadStart)

	kube, kerr := findKubeTools()
	if kerr != nil {
		if !o.skipKube {
			fmt.Fprintf(stderr, "bench: %v\nbench: pass -skip-kube to measure without the API server (those rows will read %q)\n", kerr, notMeasured)
			return 1
		}
		banner(stderr, fmt.Sprintf("-skip-kube: %v. The Pod-per-worker, API server and Kubernetes home rows are NOT MEASURED.", kerr))
		res.Warnings = append(res.Warnings, "kube-apiserver and etcd were not found: the Pod-per-worker, API server and Kubernetes home rows were not measured ("+kerr.Error()+")")
	} else if o.skipKube {
		banner(stderr, "-skip-kube: the Pod-per-worker, API server and Kubernetes home rows are NOT MEASURED.")
		res.Warnings = append(res.Warnings, "run with -skip-kube: the Pod-per-worker, API server and Kubernetes home rows were not measured")
		kube = nil
	}

	err = measure(ctx, o, p, log, kube, &res)
	res.Machine.LoadEnd = loadAvg()
	res.Seconds = time.Since(started).Seconds()
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		if ctx.Err() != nil {
			return 1
		}
		res.Warnings = append(res.Warnings, "the run failed part-way: "+err.Error())
	}
	if werr := writeOutputs(o, p, &res); werr != nil {
		fmt.Fprintf(stderr, "bench: %v\n", werr)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

// measureHostFloor runs bench/testdata/hostfloor.c into res.Floor: 2 s
// fork loops and 15 samples 200 ms apart (0.5 s and 3 with -quick).
func measureHostFloor(ctx context.Context, work string, o options, p *progress, res *Result) error {
	secs, samples := 2.0, 15
	if o.quick {
		secs, samples = 0.5, 3
	}
	root, err := devkit.FindCheckout()
	if err != nil {
		return err
	}
	p.Phasef("host floor: forks per second, a copy-on-write fault, waking a process, caches after idling (bench/testdata/hostfloor.c)")
	res.Floor, err = measureFloor(ctx, root, filepath.Join(work, "bin"), secs, samples, 200*time.Millisecond)
	if err != nil {
		return fmt.Errorf("host floor: %w", err)
	}
	if !res.Floor.Measured {
		res.Warnings = append(res.Warnings, "the host floor was not measured: "+res.Floor.Note)
	}
	return nil
}

// measure runs every phase into res.
func measure(ctx context.Context, o options, p *progress, log logr.Logger, kube *kubeTools, res *Result) error {
	work, err := os.MkdirTemp("", "fiberd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	if o.onlyNode {
		var podNode LatencyRow
		res.Node, podNode = nodeComparison(ctx, work, kube, o, p)
		res.Latency = latencyRows(map[string]LatencyRow{modePodNode: podNode})
		if !res.Node.Measured {
			return errors.New("the real-node comparison was not measured: " + res.Node.Note)
		}
		return nil
	}
	if err := measureHostFloor(ctx, work, o, p, res); err != nil {
		return err
	}
	p.Phasef("preparing the example templates (internal/devkit, as fiberd -dev)")
	tpl, err := prepareTemplates(work, o)
	if err != nil {
		return err
	}
	res.Machine.CC, res.Machine.Python = tpl.ccVersion, tpl.pyVersion

	p.Phasef("starting fiberd in-process (standalone home, %s endpoints) and warming %d zygotes", o.endpoint, tpl.warmCount())
	ag, err := startAgent(ctx, filepath.Join(work, "standalone"), tpl, o, backend.IsolationNone, nil, log)
	if err != nil {
		return err
	}
	defer ag.stop()

	latency := map[string]LatencyRow{}
	for _, m := range []struct {
		mode, tmpl string
		n          int
	}{{modeWarmC, tplWarmC, o.n}, {modeWarmPy, tplWarmPy, o.n}, {modeExecC, tplColdC, o.coldN}} {
		row := LatencyRow{Mode: m.mode, What: "Clone over the agent's socket, dial, GET, first byte"}
		uid, ok := ag.uids[m.tmpl]
		if !ok {
			row.Note = tpl.missing[m.tmpl]
			latency[m.mode] = row
			continue
		}
		p.Phasef("clone to first byte: %s (%d samples)", m.mode, m.n)
		samples, err := ag.latency(ctx, uid, m.n, p.Counter(m.n))
		if err != nil {
			return fmt.Errorf("%s: %w", m.mode, err)
		}
		row.Measured, row.SamplesMs, row.Summary = true, samples, Summarize(samples)
		latency[m.mode] = row
	}
	if err := measureIsolated(ctx, work, ag, tpl, o, p, log, latency); err != nil {
		return err
	}
	spares, err := measureSpares(ctx, work, tpl, o, p, log, latency, res)
	if err != nil {
		return fmt.Errorf("spares: %w", err)
	}

	podRow := LatencyRow{Mode: modePod, What: "create Pod, write status (Running, podIP), GET until seen", Note: "kube-apiserver not run"}
	latency[modePodNode] = LatencyRow{Mode: modePodNode, What: "create Pod, wait until its Pod IP answers the first HTTP byte", Note: "kube-apiserver not run"}
	var kc *kubeCluster
	if kube != nil {
		p.Phasef("starting kube-apiserver and etcd (hack/kube-up.sh)")
		kc, err = kube.start(ctx)
		if err != nil {
			return err
		}
		defer kc.close()
		res.Machine.KubeAPI = kc.version
		p.Phasef("Pod per worker on the API server (%d samples)", o.n)
		samples, err := kc.podPerWorker(ctx, o.n, p.Counter(o.n))
		if err != nil {
			return fmt.Errorf("pod per worker: %w", err)
		}
		podRow.Measured, podRow.SamplesMs, podRow.Summary, podRow.Note = true, samples, Summarize(samples), "API server only: no scheduler, kubelet, image or sandbox"
	}
	latency[modePod] = podRow
	res.Latency = latencyRows(latency)

	for _, m := range []struct{ mode, tmpl string }{{modeWarmC, tplWarmC}, {modeWarmPy, tplWarmPy}, {modeExecC, tplColdC}} {
		row := BurstRow{Mode: m.mode, Size: o.burst, Rounds: o.rounds}
		uid, ok := ag.uids[m.tmpl]
		if !ok {
			row.Note = tpl.missing[m.tmpl]
			res.Burst = append(res.Burst, row)
			continue
		}
		p.Phasef("burst of %d: %s (%d rounds)", o.burst, m.mode, o.rounds)
		row, err = ag.burst(ctx, uid, m.mode, o.burst, o.rounds, p.Counter(o.rounds))
		if err != nil {
			return fmt.Errorf("burst %s: %w", m.mode, err)
		}
		res.Burst = append(res.Burst, row)
	}
	res.Burst = append(res.Burst, spares.burst...)

	for _, m := range []struct{ mode, tmpl string }{{modeWarmC, tplWarmC}, {modeWarmPy, tplWarmPy}, {modeExecC, tplColdC}} {
		for _, c := range res.Settings.Concurrency {
			uid, ok := ag.uids[m.tmpl]
			if !ok {
				res.Loop = append(res.Loop, LoopRow{Mode: m.mode, Concurrency: c, Note: tpl.missing[m.tmpl]})
				continue
			}
			p.Phasef("closed loop: %s, %d callers, %s", m.mode, c, o.loop)
			row, err := ag.loop(ctx, uid, m.mode, c, o.loop, p.Ticker())
			if err != nil {
				return fmt.Errorf("closed loop %s: %w", m.mode, err)
			}
			res.Loop = append(res.Loop, row)
		}
	}
	res.Loop = append(res.Loop, spares.loop...)

	for _, d := range []struct{ name, warm, cold string }{
		{fmt.Sprintf("counter C (--hold-mib %d --dirty-mib %d)", o.holdMiB, o.dirtyMiB), tplDenseC, tplDenseColdC},
		{"counter Python", tplWarmPy, tplColdPy},
	} {
		row := DensityRow{Template: d.name, N: o.densityN}
		wu, ok1 := ag.uids[d.warm]
		cu, ok2 := ag.uids[d.cold]
		if !ok1 || !ok2 {
			row.Note = tpl.missing[d.warm] + tpl.missing[d.cold]
			res.Density = append(res.Density, row)
			continue
		}
		p.Phasef("density: %d fibers vs %d processes of %s", o.densityN, o.densityN, d.name)
		row, err = ag.density(ctx, d.name, wu, cu, o.densityN, p.Counter(2*o.densityN))
		if err != nil {
			return fmt.Errorf("density %s: %w", d.name, err)
		}
		res.Density = append(res.Density, row)
	}

	res.Park, err = ag.parkRows(ctx, tpl, parkCases, o.parkN, min(o.n, 100), p)
	if err != nil {
		return fmt.Errorf("park: %w", err)
	}
	ag.stop()
	isoPark, err := measureIsolatedPark(ctx, work, tpl, o, p, log)
	if err != nil {
		return fmt.Errorf("isolated park: %w", err)
	}
	res.Park = append(res.Park, isoPark...)

	res.APIServer = APIServerResult{Note: "kube-apiserver not run", Poll: o.kubePoll.String()}
	res.KubeHome = KubeHomeResult{Note: "kube-apiserver not run", Poll: o.kubePoll.String()}
	if kc != nil {
		if _, ok := tpl.specs[tplWarmC]; !ok {
			return errors.New("the Kubernetes home phases need the C template: " + tpl.missing[tplWarmC])
		}
		if err := kc.kubeHome(ctx, work, tpl, o, p, log, res); err != nil {
			return fmt.Errorf("kubernetes home: %w", err)
		}
		kc.close()
	}

	// The real-node rows run last, on a control plane of their own (see nodeComparison).
	res.Node = NodeResult{BurstSize: o.nodeBurst, Note: "kube-apiserver not run"}
	if kube != nil {
		if o.skipNode {
			latency[modePodNode] = LatencyRow{Mode: modePodNode, What: latency[modePodNode].What, Note: "run with -skip-node"}
			res.Node.Note = "run with -skip-node"
		} else {
			res.Node, latency[modePodNode] = nodeComparison(ctx, work, kube, o, p)
		}
		if !res.Node.Measured {
			banner(p.w, "The real-node comparison is NOT MEASURED: "+res.Node.Note)
			res.Warnings = append(res.Warnings, "the real-node comparison was not measured: "+res.Node.Note)
		}
		for _, r := range res.Node.Rows {
			if !r.Measured {
				banner(p.w, "The real-node row "+r.Mode+" is NOT MEASURED: "+r.Note)
				res.Warnings = append(res.Warnings, "the real-node row "+r.Mode+" was not measured: "+r.Note)
			}
		}
		res.Latency = latencyRows(latency)
	}
	return nil
}

// measureIsolatedPark measures the park rows' isolated twins on an agent
// of their own that isolates every fiber; where the host does not isolate
// (not root) the rows say why.
func measureIsolatedPark(ctx context.Context, work string, k *kit, o options, p *progress, log logr.Logger) ([]ParkRow, error) {
	cases := isolatedParkCases()
	var names []string
	for _, c := range cases {
		if _, ok := k.specs[c.tmpl]; ok {
			names = append(names, c.tmpl)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	p.Phasef("starting a fiberd in-process with -isolation fiber for the isolated park rows")
	ag, err := startAgent(ctx, filepath.Join(work, "isolated-park"), k, o, backend.IsolationFiber, names, log)
	if err != nil {
		return nil, err
	}
	defer ag.stop()
	if missing := ag.isolationMissing(ctx); missing != "" {
		rows := make([]ParkRow, len(cases))
		for i, c := range cases {
			rows[i] = ParkRow{Case: c.name, Template: c.tmpl, Note: "not isolated on this host: " + missing}
		}
		return rows, nil
	}
	return ag.parkRows(ctx, k, cases, o.parkN, min(o.n, 100), p)
}

// measureIsolated measures clone to first byte of the warm C and Python
// templates on a second agent whose backends isolate every fiber
// (-isolation fiber, fiberd's default on a standalone host), into the
// isolated rows of latency. Each isolated sample is taken next to one of
// the same template on plain, the agent without isolation, in alternating
// order, so drift on a shared machine (which moves a p50 by more than what
// isolation costs) falls on both alike; the row's IsolationCost is the
// summary of those paired differences. Where the host does not isolate
// (not root) the rows say why.
func measureIsolated(ctx context.Context, work string, plain *agentRig, k *kit, o options, p *progress, log logr.Logger, latency map[string]LatencyRow) error {
	modes := []struct{ mode, tmpl string }{{modeWarmCIso, tplWarmC}, {modeWarmPyIso, tplWarmPy}}
	what := "as without isolation; each grant a user and namespaces of its own, each fiber its own PID namespace and /tmp"
	var names []string
	for _, m := range modes {
		if _, ok := k.specs[m.tmpl]; ok {
			names = append(names, m.tmpl)
		} else {
			latency[m.mode] = LatencyRow{Mode: m.mode, What: what, Note: k.missing[m.tmpl]}
		}
	}
	if len(names) == 0 {
		return nil
	}
	p.Phasef("starting a second fiberd in-process with -isolation fiber for %s", strings.Join(names, ", "))
	ag, err := startAgent(ctx, filepath.Join(work, "isolated"), k, o, backend.IsolationFiber, names, log)
	if err != nil {
		return fmt.Errorf("isolated agent: %w", err)
	}
	defer ag.stop()
	missing := ag.isolationMissing(ctx)
	for _, m := range modes {
		uid, ok := ag.uids[m.tmpl]
		if !ok {
			continue
		}
		plainUID, ok := plain.uids[m.tmpl]
		if !ok {
			return fmt.Errorf("%s: the agent without isolation has no grant of %s", m.mode, m.tmpl)
		}
		row, err := pairedIsolatedRow(ctx, plain, plainUID, ag, uid, m.mode, what, "the same template", missing, o, p, nil)
		if err != nil {
			return err
		}
		latency[m.mode] = row
	}
	return nil
}

// pairedIsolatedRow is the row of mode: o.n samples of grant uid on the
// isolated agent iso, each paired with one of plainUID on plain
// (pairedLatency; before, when not nil, ahead of each pair), its note the
// p50 of the paired differences with against (what plainUID is) without
// isolation. When iso does not isolate on this host (missing says why)
// the row is not measured and says so.
func pairedIsolatedRow(ctx context.Context, plain *agentRig, plainUID string, iso *agentRig, uid, mode, what, against, missing string, o options, p *progress, before func(context.Context) error) (LatencyRow, error) {
	row := LatencyRow{Mode: mode, What: what}
	if missing != "" {
		row.Note = "not isolated on this host: " + missing
		return row, nil
	}
	p.Phasef("clone to first byte: %s, in alternation with %s without isolation (%d pairs)", mode, against, o.n)
	samples, deltas, err := pairedLatency(ctx, plain, plainUID, iso, uid, o.n, p.Counter(o.n), before)
	if err != nil {
		return row, fmt.Errorf("%s: %w", mode, err)
	}
	cost := Summarize(deltas)
	row.Measured, row.SamplesMs, row.Summary, row.IsolationCost = true, samples, Summarize(samples), &cost
	row.Note = fmt.Sprintf("isolation adds p50 %s ms (paired differences with %s without isolation, cloned in alternation)", signed(cost.P50), against)
	return row, nil
}

// pairedLatency takes n pairs of clone-to-first-byte samples, one of uidA
// on a and one of uidB on b, alternating which goes first, and returns b's
// samples and the differences b - a of each pair. before, when not nil,
// runs ahead of each pair, outside the timers.
func pairedLatency(ctx context.Context, a *agentRig, uidA string, b *agentRig, uidB string, n int, tick func(), before func(context.Context) error) (bSamples, deltas []float64, err error) {
	for i := range n {
		if before != nil {
			if err := before(ctx); err != nil {
				return nil, nil, err
			}
		}
		var pair [2]float64 // a's, b's
		for k := range 2 {
			j := k ^ i%2 // which goes first alternates
			r, uid := a, uidA
			if j == 1 {
				r, uid = b, uidB
			}
			if pair[j], err = r.sample(ctx, uid); err != nil {
				return nil, nil, err
			}
		}
		bSamples, deltas = append(bSamples, pair[1]), append(deltas, pair[1]-pair[0])
		tick()
	}
	return bSamples, deltas, nil
}

// signed formats a difference with its sign.
func signed(ms float64) string {
	if ms >= 0 {
		return "+" + num(ms)
	}
	return num(ms)
}

// latencyRows orders the rows and fills the ratios to warm C.
func latencyRows(m map[string]LatencyRow) []LatencyRow {
	base := m[modeWarmC]
	var out []LatencyRow
	for _, mode := range []string{modeWarmC, modeSpareC, modeWarmPy, modeSparePy, modeWarmCIso, modeWarmPyIso, modeSpareCIso, modeSparePyIso, modeExecC, modePod, modePodNode} {
		r := m[mode]
		r.Mode = mode
		if r.Measured && base.Measured {
			r.RatioP50 = r.Summary.P50 / base.Summary.P50
			r.RatioP90 = r.Summary.P90 / base.Summary.P90
			r.RatioP99 = r.Summary.P99 / base.Summary.P99
		}
		out = append(out, r)
	}
	return out
}

// writeOutputs writes results.json, the plots, results.md and the -doc
// section.
func writeOutputs(o options, p *progress, res *Result) error {
	link := o.plotDir
	if link == "" {
		link = o.out
		if o.doc != "" {
			if rel, err := filepath.Rel(filepath.Dir(o.doc), o.out); err == nil {
				link = rel
			}
		}
	}
	if !o.noPlot {
		p.Phasef("plotting into %s", o.out)
		plots, err := writePlots(o.out, *res)
		if err != nil {
			return fmt.Errorf("plots: %w", err)
		}
		res.Plots = plots
	} else {
		link = ""
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := core.WriteFileAtomic(filepath.Join(o.out, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	md := Markdown(*res, link)
	if err := core.WriteFileAtomic(filepath.Join(o.out, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if o.doc != "" {
		doc, err := os.ReadFile(o.doc)
		if err != nil {
			return fmt.Errorf("-doc: %w", err)
		}
		nd, err := ReplaceSection(doc, md)
		if err != nil {
			return fmt.Errorf("-doc %s: %w", o.doc, err)
		}
		if err := core.WriteFileAtomic(o.doc, nd, 0o644); err != nil {
			return err
		}
	}
	p.Phasef("wrote %s and %s%s", filepath.Join(o.out, "results.json"), filepath.Join(o.out, "results.md"), map[bool]string{true: " and " + o.doc}[o.doc != ""])
	fmt.Fprint(p.w, "\n"+md)
	return nil
}

// Markers of the generated section of a -doc file.
const (
	sectionBegin = "<!-- bench:begin -->"
	sectionEnd   = "<!-- bench:end -->"
)

// ReplaceSection puts body between the markers of doc, which must hold
// each once, in order.
func ReplaceSection(doc []byte, body string) ([]byte, error) {
	s := string(doc)
	i, j := strings.Index(s, sectionBegin), strings.Index(s, sectionEnd)
	if i < 0 || j < i || strings.Count(s, sectionBegin) != 1 || strings.Count(s, sectionEnd) != 1 {
		return nil, fmt.Errorf("want one %s and one %s after it", sectionBegin, sectionEnd)
	}
	return []byte(s[:i+len(sectionBegin)] + "\n" + strings.TrimRight(body, "\n") + "\n" + s[j:]), nil
}

func openLog(o options, stderr io.Writer) (logr.Logger, func(), error) {
	var w io.Writer = stderr
	closeFn := func() {}
	if !o.verbose {
		f, err := os.Create(logPath(o))
		if err != nil {
			return logr.Logger{}, nil, err
		}
		w, closeFn = f, func() { f.Close() }
	}
	var mu sync.Mutex
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(w, time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: 1}), closeFn, nil
}

func banner(w io.Writer, msg string) {
	line := strings.Repeat("!", 78)
	fmt.Fprintf(w, "%s\n!! %s\n%s\n", line, msg, line)
}

// logPath is where fiberd's and the home's log lines go without -v: a
// file per process, so concurrent runs do not mix.
func logPath(o options) string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("fiberd-bench-%d.log", os.Getpid()))
}
