package main

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// The Pod a process runs in is read from its cgroup path, whatever the hierarchy and driver;
// host processes run in none.
func TestPodUIDOfCgroup(t *testing.T) {
	const uid = "aad91d6c-301a-4b96-8177-6bf942457d55"
	for _, tc := range []struct{ name, doc, want string }{
		{"cgroup v1, cgroupfs driver", "12:pids:/fiberd-node/kubepods/besteffort/pod" + uid + "/baca5037\n4:memory:/fiberd-node/kubepods/besteffort/pod" + uid + "/baca5037\n", uid},
		{"guaranteed QoS, the Pod's own cgroup", "0::/kubepods/pod" + uid + "\n", uid},
		{"systemd driver", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-1.scope\n", uid},
		{"a host process", "0::/user.slice/user-0.slice/session-1.scope\n", ""},
		{"kubelet's own cgroup", "4:memory:/fiberd-node\n", ""},
		{"a name with pod but no UID", "0::/podman/pod-not-a-uid\n", ""},
		{"empty", "", ""},
	} {
		if got := PodUIDOfCgroup(tc.doc); got != tc.want {
			t.Errorf("%s: PodUIDOfCgroup = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Writes per worker count only writes, less what the cluster writes while idle over the same
// time, and never go below zero.
func TestWritesPerWorker(t *testing.T) {
	delta := map[string]float64{"POST pods": 10, "DELETE pods": 10, "PATCH pods/status": 30, "GET pods": 500, "WATCH pods": 10, "PUT leases": 6}
	w := writesPerWorker(delta, 3, 2, 10) // 56 writes, 6 of them the idle rate's
	if w.Writes != 56 || w.PerWorker != 5 || w.Workers != 10 || w.IdlePerSecond != 2 {
		t.Errorf("writesPerWorker = %+v, want 56 writes, 5 per worker", w)
	}
	if w := writesPerWorker(map[string]float64{"PUT leases": 2}, 10, 1, 5); w.PerWorker != 0 {
		t.Errorf("a window quieter than idle gives %v writes per worker, want 0", w.PerWorker)
	}
}

func nodeSample() NodeResult {
	return NodeResult{
		Measured:  true,
		BurstSize: 20,
		Versions:  []Version{{"agent-sandbox controller and CRDs", "v1.0.1", "Go module proxy, built in the tools module"}},
		Rows: []NodeRow{
			{Mode: modeNodeFiberd, What: "Clone", Measured: true, Single: Summarize([]float64{2, 4, 4, 5}), SamplesMs: []float64{2, 4, 4, 5},
				Burst:  NodeBurst{Size: 20, AllServedMs: 30, PerWorker: Summarize([]float64{10, 20})},
				Writes: NodeWrites{PerWorker: 0},
				Memory: NodeMemory{Workers: 20, WorkerKiB: 512, PodKiB: 1024, Note: "shared"}},
			{Mode: modePodNode, What: "create Pod", Measured: true, Single: Summarize([]float64{800, 1000, 1000, 1250}),
				Burst: NodeBurst{Size: 20, AllServedMs: 9000, PerWorker: Summarize([]float64{3000, 8000})},
				Writes: NodeWrites{PerWorker: 12.5, Workers: 4, Seconds: 2, IdlePerSecond: 1, Writes: 52,
					Delta: map[string]float64{"POST pods": 4, "POST events": 16, "PATCH pods/status": 12, "DELETE pods": 4, "GET pods": 100, "PUT leases": 16}},
				Memory: NodeMemory{Workers: 20, WorkerKiB: 1024, PodKiB: 2048, NodeKiB: 1024}},
			{Mode: modeNodeWarmPool, What: "claim", Note: "the agent-sandbox controller did not build here: no Go"},
		},
	}
}

// The comparison's tables hold every row, say why a row was not measured, give fiberd's ratios
// to the other rows at p50 and p99, the cost per worker and the versions.
func TestNodeMarkdown(t *testing.T) {
	var b strings.Builder
	nodeMarkdown(&b, nodeSample(), "bench")
	md := b.String()
	for _, want := range []string{
		"| fiberd grant Pod (real node) | Clone | 4 | 4.00 | 5.00 | 5.00 | 30.0 | 10.0 / 20.0 |",
		"| Pod per worker (real node) | create Pod | 4 | 1000 | 1250 | 1250 | 9000 | 3000 / 8000 |",
		"| agent-sandbox warm pool claim (real node) | claim | not measured |",
		"the agent-sandbox controller did not build here: no Go",
		"![real node CDF](bench/node-cdf.png)",
		"| fiberd grant Pod (real node) | 0.00 | 0.50 | 1.00 | 0.00 | **1.50** | shared |",
		"| Pod per worker (real node) | 12.5 | 1.00 | 2.00 | 1.00 | **4.00** |",
		"- fiberd / Pod per worker (real node): p50 0.0040, p99 0.0040 (the other is 250.0x and 250.0x slower).",
		"- fiberd / agent-sandbox warm pool claim (real node): not measured.",
		"| agent-sandbox controller and CRDs | v1.0.1 | Go module proxy, built in the tools module |",
		"Writes of Pod per worker (real node) per worker: `POST events` 4.00, `PUT leases` 4.00, `PATCH pods/status` 3.00, `DELETE pods` 1.00, `POST pods` 1.00 (the idle rate's share, subtracted: 0.50).",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the node section lacks %q:\n%s", want, md)
		}
	}
	b.Reset()
	nodeMarkdown(&b, NodeResult{Note: "run with -skip-node"}, "bench")
	if !strings.Contains(b.String(), "| note | run with -skip-node |") {
		t.Errorf("an unmeasured comparison does not say why:\n%s", b.String())
	}
	r := nodeSample()
	r.Rows[2] = NodeRow{Mode: modeNodeWarmPool, What: "claim", Measured: true, Single: Summarize([]float64{40, 50, 60, 100})}
	all := Markdown(Result{Node: r}, "")
	for _, want := range []string{"#### Side by side on a real node",
		"Kubernetes warm-pool claim, 92.0 ms p50: the agent-sandbox warm pool claim measured on the real node here has p50 50.0 ms (1.84x below the figure) and p99 100.0 ms."} {
		if !strings.Contains(all, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, all)
		}
	}
}

func TestNodeRatios(t *testing.T) {
	r := nodeSample()
	p50, p99, ok := NodeRatios(r, modePodNode)
	if !ok || math.Abs(p50-0.004) > 1e-12 || math.Abs(p99-0.004) > 1e-12 {
		t.Errorf("NodeRatios(Pod) = %v, %v, %v; want 0.004, 0.004, true", p50, p99, ok)
	}
	if _, _, ok := NodeRatios(r, modeNodeWarmPool); ok {
		t.Error("NodeRatios of an unmeasured row is ok")
	}
	r.Rows[0].Measured = false
	if _, _, ok := NodeRatios(r, modePodNode); ok {
		t.Error("NodeRatios without fiberd's row is ok")
	}
}

// The Pod-based rows run the same binary with the same arguments as the grant Pod's template.
func TestReadCounterSpec(t *testing.T) {
	s, err := readCounterSpec("..")
	if err != nil {
		t.Fatal(err)
	}
	if s.Command != "/opt/fiberd/templates/counter" || !slices.Contains(s.Args, "--init-ms") {
		t.Errorf("counter.json = %+v, want the C counter with its --init-ms", s)
	}
	e := &nodeEnv{spec: s}
	if got := e.workerPodSpec().Containers[0].Args; !slices.Equal(got, s.Args) {
		t.Errorf("the worker Pod's args %q differ from the template's %q", got, s.Args)
	}
}

func TestParseFlagsNode(t *testing.T) {
	o, err := parseFlags(nil, &strings.Builder{})
	if err != nil || o.nodeBurst != 20 {
		t.Fatalf("default -node-burst = %d (%v), want 20", o.nodeBurst, err)
	}
	for _, bad := range [][]string{{"-only-node", "-doc", "x.md"}, {"-only-node", "-skip-node"}, {"-node-burst", "0"}, {"-node-idle", "0s"}} {
		if _, err := parseFlags(bad, &strings.Builder{}); err == nil {
			t.Errorf("parseFlags(%q) was accepted", bad)
		}
	}
}
