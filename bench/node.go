package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"fiberd.io/fiberd/test/kubenode"
)

// Modes of the node comparison. modePodNode is also a row of the latency
// table.
const (
	modeNodeFiberd   = "fiberd grant Pod (real node)"
	modeNodeWarmPool = "agent-sandbox warm pool claim (real node)"
)

// counterPodImage is hack/images.sh's image of the C example template as a plain container:
// tools/cmd/activate listens on :8080 and execs the template with the listener as descriptor 3,
// as fiberd's exec backend starts a cold fiber.
const counterPodImage = "fiberd.local/counter-pod:dev"

// counterSpec is deploy/kubernetes/templates/counter.json, the spec the fiberd image bakes in:
// the Pod rows run the same binary with the same arguments (the same init time).
type counterSpec struct {
	Command string   `json:"command"`
	Args    []string `json:"args"`
}

func readCounterSpec(root string) (counterSpec, error) {
	var s counterSpec
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "templates", "counter.json"))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("deploy/kubernetes/templates/counter.json: %w", err)
	}
	return s, nil
}

// nodeEnv is the real node the comparison runs on, shared by its rows.
type nodeEnv struct {
	kc     *kubeCluster
	node   *kubenode.Node
	root   string // the checkout
	work   string // this run's files
	images string // hack/images.sh's output
	spec   counterSpec
	o      options
	p      *progress
}

// nodeComparison runs the three rows of the node comparison on one node of test/kubenode
// (kubelet, containerd, runc, CNI bridge, kube-scheduler, kube-controller-manager), on a
// control plane of its own so the other rows' API server sees none of it: the fiberd grant
// Pod, the Pod per worker and the agent-sandbox warm pool. The Pod-per-worker row's single
// starts are also the latency table's real-node row. A row that fails says why and the others
// still run; the whole comparison is not measured, with the reason, when this machine cannot
// run a node or the node does not start.
func nodeComparison(ctx context.Context, work string, kube *kubeTools, o options, p *progress) (NodeResult, LatencyRow) {
	res := NodeResult{BurstSize: o.nodeBurst}
	lat := LatencyRow{Mode: modePodNode, What: "create Pod (scheduled, image present), wait until its Pod IP answers the first HTTP byte"}
	if err := kubenode.Missing(); err != nil {
		res.Note, lat.Note = "no real node here: "+err.Error(), "no real node here: "+err.Error()
		return res, lat
	}
	e, closeEnv, err := startNodeEnv(ctx, work, kube, o, p)
	if err != nil {
		res.Note, lat.Note = "the real node failed: "+err.Error(), "the real node failed: "+err.Error()
		return res, lat
	}
	defer closeEnv()
	res.Measured = true
	res.Versions = e.versions(ctx)
	res.Rows = []NodeRow{e.fiberdRow(ctx), e.podRow(ctx), e.warmPoolRow(ctx, &res)}
	for _, r := range res.Rows {
		if r.Mode == modePodNode {
			if r.Measured {
				lat.Measured, lat.SamplesMs, lat.Summary = true, r.SamplesMs, r.Single
			}
			lat.Note = r.Note
		}
	}
	return res, lat
}

// startNodeEnv builds the images, starts a control plane for nodes and the node, and imports
// the images the rows run.
func startNodeEnv(ctx context.Context, work string, kube *kubeTools, o options, p *progress) (*nodeEnv, func(), error) {
	root, err := kubenode.Root()
	if err != nil {
		return nil, nil, err
	}
	e := &nodeEnv{root: root, work: work, images: filepath.Join(work, "images"), o: o, p: p}
	if e.spec, err = readCounterSpec(root); err != nil {
		return nil, nil, err
	}
	p.Phasef("real node: building the images (hack/images.sh)")
	if _, err := kubenode.BuildImages(ctx, e.images); err != nil {
		return nil, nil, err
	}
	p.Phasef("real node: a control plane for nodes and a node (hack/kube-up.sh, hack/node-up.sh)")
	if e.kc, err = kube.startFor(ctx, kubenode.DefaultAddress); err != nil {
		return nil, nil, err
	}
	if e.node, err = kubenode.Start(ctx, e.kc.dir, kubenode.Options{Images: e.images}); err != nil {
		e.kc.close()
		return nil, nil, err
	}
	closeEnv := func() {
		if err := e.node.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: stopping the node: %v\n", err)
		}
		e.kc.close()
	}
	if err := e.node.Import(ctx, filepath.Join(e.images, "counter-pod.tar"), filepath.Join(e.images, "fiberd.tar")); err != nil {
		closeEnv()
		return nil, nil, err
	}
	return e, closeEnv, nil
}

// kubectl runs the node's kubectl with the control plane's admin kubeconfig, stdin from in,
// and returns its stdout.
func (e *nodeEnv) kubectl(ctx context.Context, in string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.node.Bin(), "kubectl"), append([]string{"--kubeconfig", filepath.Join(e.kc.dir, "kubeconfig"), "--cache-dir", filepath.Join(e.kc.dir, "kubectl-cache")}, args...)...)
	cmd.Stdin = strings.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// namespace creates ns and waits for its default ServiceAccount (the controller manager makes
// it; the ServiceAccount admission plugin admits a Pod only once it exists).
func (e *nodeEnv) namespace(ctx context.Context, ns string) error {
	if err := e.kc.namespace(ctx, ns); err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		_, err := e.kc.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("the default ServiceAccount of %s: %w", ns, err)
	}
	return nil
}

// versions names every part the rows run on.
func (e *nodeEnv) versions(ctx context.Context) []Version {
	out := func(name string, args ...string) string {
		b, err := exec.CommandContext(ctx, name, args...).Output()
		if err != nil {
			return "unknown (" + err.Error() + ")"
		}
		line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		return line
	}
	kubelet := strings.TrimPrefix(out(filepath.Join(e.node.Bin(), "kubelet"), "--version"), "Kubernetes ")
	fiberd := out("git", "-C", e.root, "describe", "--always", "--dirty")
	return []Version{
		{"kube-apiserver, etcd", e.kc.version + ", " + strings.TrimPrefix(out(filepath.Join(e.kc.tools.bin, "etcd"), "--version"), "etcd Version: "), "hack/kube-tools.sh (Go module proxy)"},
		{"kubelet, kube-scheduler, kube-controller-manager, kube-proxy", kubelet, "hack/kube-tools.sh -node (Go module proxy)"},
		{"containerd", out("containerd", "--version"), "Debian package"},
		{"runc", out("runc", "--version"), "Debian package"},
		{"CNI plugins (bridge, host-local, loopback)", out("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins"), "Debian package containernetworking-plugins"},
		{"fiberd (image fiberd.local/fiberd:dev)", fiberd, "this checkout, hack/images.sh"},
		{"agent-sandbox controller and CRDs", sandboxVersion(ctx, e.root), "Go module proxy, built in the tools module"},
		{"Go", runtime.Version(), "the toolchain that built everything"},
	}
}

// ---------------------------------------------------------------- one row

// nodeWorker is one started worker: its time to first byte, the Pod it runs in, and how to
// release it.
type nodeWorker struct {
	ms      float64
	podUID  string
	release func(context.Context) error
}

// rowDriver is what a row plugs into runRow: how to start a worker, and how to read the
// memory of a burst's workers (before: the state without them; after: with them all alive).
type rowDriver struct {
	start        func(ctx context.Context, name string) (nodeWorker, error)
	memoryBefore func(ctx context.Context) (any, error)
	memoryAfter  func(ctx context.Context, before any, ws []nodeWorker) (NodeMemory, error)
}

// runRow measures a row: a warm-up start, the single starts inside a window of apiserver_request_total (after
// an idle window on the same cluster), then a burst whose workers' memory is read while they
// are all alive; every worker is released.
func (e *nodeEnv) runRow(ctx context.Context, row *NodeRow, d rowDriver) error {
	n := e.o.nodeN
	idle := e.o.nodeIdle
	// One start outside every count: first-of-their-kind costs (a controller's caches, the
	// garbage collector learning a new resource) are not a worker's.
	e.p.Phasef("%s: a warm-up start", row.Mode)
	w, err := d.start(ctx, "warm-up")
	if err != nil {
		return fmt.Errorf("warm-up start: %w", err)
	}
	if err := w.release(ctx); err != nil {
		return fmt.Errorf("warm-up start: release: %w", err)
	}
	e.p.Phasef("%s: %s idle window for the cluster's own writes", row.Mode, idle)
	idleRate, err := e.idleWrites(ctx, idle)
	if err != nil {
		return err
	}
	e.p.Phasef("%s: %d single starts", row.Mode, n)
	before, err := e.kc.allRequestCounts(ctx)
	if err != nil {
		return err
	}
	t0 := time.Now()
	tick := e.p.Counter(n)
	for i := range n {
		w, err := d.start(ctx, fmt.Sprintf("single-%d", i))
		if err != nil {
			return fmt.Errorf("single start %d: %w", i, err)
		}
		row.SamplesMs = append(row.SamplesMs, w.ms)
		if err := w.release(ctx); err != nil {
			return fmt.Errorf("single start %d: release: %w", i, err)
		}
		tick()
	}
	after, err := e.kc.allRequestCounts(ctx)
	if err != nil {
		return err
	}
	row.Single = Summarize(row.SamplesMs)
	row.Writes = writesPerWorker(Delta(before, after), time.Since(t0).Seconds(), idleRate, n)

	size := e.o.nodeBurst
	e.p.Phasef("%s: a burst of %d", row.Mode, size)
	memBefore, err := d.memoryBefore(ctx)
	if err != nil {
		return fmt.Errorf("memory before the burst: %w", err)
	}
	ws := make([]nodeWorker, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	b0 := time.Now()
	for i := range size {
		wg.Go(func() { ws[i], errs[i] = d.start(ctx, fmt.Sprintf("burst-%d", i)) })
	}
	wg.Wait()
	row.Burst = NodeBurst{Size: size, AllServedMs: Ms(time.Since(b0))}
	var per []float64
	var started []nodeWorker
	for i, w := range ws {
		if errs[i] != nil {
			row.Burst.Errors++
			continue
		}
		per = append(per, w.ms)
		started = append(started, w)
	}
	row.Burst.PerWorker = Summarize(per)
	var memErr error
	if row.Burst.Errors == 0 {
		row.Memory, memErr = d.memoryAfter(ctx, memBefore, started)
	}
	for _, w := range started {
		wg.Go(func() {
			if err := w.release(ctx); err != nil {
				fmt.Fprintf(e.p.w, "bench: %s: releasing a burst worker: %v\n", row.Mode, err)
			}
		})
	}
	wg.Wait()
	if row.Burst.Errors > 0 {
		return fmt.Errorf("%d of the burst's %d workers did not start: %w", row.Burst.Errors, size, errors.Join(errs...))
	}
	if memErr != nil {
		return fmt.Errorf("memory of the burst: %w", memErr)
	}
	row.Measured = true
	return nil
}

// writesPerWorker is the window's writes less the idle rate's, per worker.
func writesPerWorker(delta map[string]float64, seconds, idleRate float64, workers int) NodeWrites {
	_, writes := sums(delta)
	w := NodeWrites{Workers: workers, Seconds: seconds, Delta: delta, Writes: writes, IdlePerSecond: idleRate}
	w.PerWorker = max(0, writes-idleRate*seconds) / float64(workers)
	return w
}

// allRequestCounts reads apiserver_request_total of every resource by "VERB resource".
func (kc *kubeCluster) allRequestCounts(ctx context.Context) (map[string]float64, error) {
	b, err := kc.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	s, err := ParseCounter(b, "apiserver_request_total")
	if err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, errors.New("the API server's /metrics has no apiserver_request_total")
	}
	return RequestCounts(s), nil
}

// idleWrites is the rate of writes per second the cluster makes on its own (leases, status
// heartbeats, controllers' resyncs) over d.
func (e *nodeEnv) idleWrites(ctx context.Context, d time.Duration) (float64, error) {
	before, err := e.kc.allRequestCounts(ctx)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	after, err := e.kc.allRequestCounts(ctx)
	if err != nil {
		return 0, err
	}
	_, w := sums(Delta(before, after))
	return w / time.Since(t0).Seconds(), nil
}

// podMemory reads the memory of Pod-based workers: each Pod's processes and its pause and shim,
// and the node daemons' growth per Pod added since before (a podCensus).
func (e *nodeEnv) podMemory(ctx context.Context, before any, ws []nodeWorker) (NodeMemory, error) {
	b := before.(podCensus)
	now, err := e.census(ctx)
	if err != nil {
		return NodeMemory{}, err
	}
	uids := make([]string, len(ws))
	for i, w := range ws {
		uids[i] = w.podUID
	}
	pss, err := podPss(uids)
	if err != nil {
		return NodeMemory{}, err
	}
	var m NodeMemory
	m.Workers = len(ws)
	for _, v := range pss {
		m.WorkerKiB += float64(v.Worker)
		m.PodKiB += float64(v.Pause + v.Shim)
	}
	m.WorkerKiB /= float64(len(ws))
	m.PodKiB /= float64(len(ws))
	if added := now.pods - b.pods; added > 0 {
		m.NodeKiB = max(0, float64(now.daemonsKiB-b.daemonsKiB)) / float64(added)
		m.Note = fmt.Sprintf("kubelet and containerd grew by %s MiB for %d Pods added", num(float64(now.daemonsKiB-b.daemonsKiB)/1024), added)
	}
	return m, nil
}

// podCensus is the node's running Pods and its kubelet's and containerd's Pss at one moment.
type podCensus struct {
	pods       int
	daemonsKiB int64
}

func (e *nodeEnv) census(ctx context.Context) (podCensus, error) {
	pods, err := e.kc.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"})
	if err != nil {
		return podCensus{}, err
	}
	kib, err := nodeDaemonsPss(e.node.Dir())
	if err != nil {
		return podCensus{}, err
	}
	return podCensus{pods: len(pods.Items), daemonsKiB: kib}, nil
}

func (e *nodeEnv) censusAny(ctx context.Context) (any, error) { return e.census(ctx) }

// ---------------------------------------------------------------- Pod per worker

// podRow is the Pod per worker: each worker a Pod of the C template (the scheduler places it,
// the image is present), timed from the create call to the first byte of its HTTP answer on
// the Pod IP; released by deleting the Pod and waiting until it is gone.
func (e *nodeEnv) podRow(ctx context.Context) NodeRow {
	row := NodeRow{Mode: modePodNode, What: "create a Pod (scheduled, image present), until its Pod IP answers the first HTTP byte; release: delete, until gone"}
	const ns = "bench-node"
	if err := e.namespace(ctx, ns); err != nil {
		row.Note = err.Error()
		return row
	}
	err := e.runRow(ctx, &row, rowDriver{
		start:        func(ctx context.Context, name string) (nodeWorker, error) { return e.startPod(ctx, ns, name) },
		memoryBefore: e.censusAny,
		memoryAfter:  e.podMemory,
	})
	if err != nil {
		row.Measured, row.Note = false, err.Error()
		return row
	}
	row.Note = fmt.Sprintf("the C template, `%s` paid by every Pod", strings.Join(e.spec.Args, " "))
	return row
}

// workerPodSpec is the Pod spec of a worker of the Pod-based rows.
func (e *nodeEnv) workerPodSpec() corev1.PodSpec {
	no := false
	return corev1.PodSpec{
		AutomountServiceAccountToken:  &no,
		TerminationGracePeriodSeconds: new(int64),
		Containers: []corev1.Container{{
			Name: "worker", Image: counterPodImage, ImagePullPolicy: corev1.PullNever,
			Args:  e.spec.Args,
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}},
	}
}

// startPod creates the worker Pod and returns once its Pod IP answered the first byte.
func (e *nodeEnv) startPod(ctx context.Context, ns, name string) (nodeWorker, error) {
	pods := e.kc.cs.CoreV1().Pods(ns)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nodeWorker{}, err
	}
	defer w.Stop()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: e.workerPodSpec()}
	t0 := time.Now()
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nodeWorker{}, err
	}
	var ip, uid string
	if err := watchUntil(ctx, w, 2*time.Minute, func(obj any) (bool, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("Pod %s failed: %s", name, p.Status.Message)
		}
		ip, uid = p.Status.PodIP, string(p.UID)
		return ip != "", nil
	}); err != nil {
		return nodeWorker{}, fmt.Errorf("Pod %s got no IP: %w", name, err)
	}
	d, err := firstByteWithin(ctx, net.JoinHostPort(ip, "8080"), t0)
	if err != nil {
		return nodeWorker{}, fmt.Errorf("Pod %s: %w", name, err)
	}
	return nodeWorker{ms: Ms(d), podUID: uid, release: func(ctx context.Context) error { return e.deletePodGone(ctx, ns, name) }}, nil
}

// deletePodGone deletes a Pod at once and waits until it is gone.
func (e *nodeEnv) deletePodGone(ctx context.Context, ns, name string) error {
	pods := e.kc.cs.CoreV1().Pods(ns)
	zero := int64(0)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return e.podGone(ctx, ns, name)
}

func (e *nodeEnv) podGone(ctx context.Context, ns, name string) error {
	if err := waitForEvery(ctx, 2*time.Minute, 50*time.Millisecond, func() (bool, error) {
		_, err := e.kc.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return fmt.Errorf("Pod %s not gone after its deletion: %w", name, err)
	}
	return nil
}

// watchUntil reads w's events until cond holds for an object, fails, the watch ends, or within
// passes.
func watchUntil(ctx context.Context, w watch.Interface, within time.Duration, cond func(obj any) (bool, error)) error {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return fmt.Errorf("not within %v", within)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("the watch ended")
			}
			if ev.Type == watch.Error {
				return fmt.Errorf("watch error: %v", ev.Object)
			}
			done, err := cond(ev.Object)
			if err != nil || done {
				return err
			}
		}
	}
}

// firstByteWithin dials addr every 5 ms until it answers GET / with a first byte (within a
// minute) and returns the time since t0.
func firstByteWithin(ctx context.Context, addr string, t0 time.Time) (time.Duration, error) {
	var d time.Duration
	if err := waitForEvery(ctx, time.Minute, 5*time.Millisecond, func() (bool, error) {
		ok, err := firstByteAt(ctx, addr)
		if ok {
			d = time.Since(t0)
		}
		return ok, err
	}); err != nil {
		return 0, fmt.Errorf("%s never answered: %w", addr, err)
	}
	return d, nil
}

// firstByteAt dials addr, sends GET / and reads one byte. A refused or reset connection (the
// container not listening yet) is not an error, just not yet.
func firstByteAt(ctx context.Context, addr string) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(dctx, "tcp", addr)
	if err != nil {
		return false, nil
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n"); err != nil {
		return false, nil
	}
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		return false, nil
	}
	return true, nil
}

// waitFor polls cond every 20 ms until it holds, fails, or within passes.
func waitFor(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
	return waitForEvery(ctx, within, 20*time.Millisecond, cond)
}

// waitForEvery polls cond every period until it holds, fails, or within passes.
func waitForEvery(ctx context.Context, within, period time.Duration, cond func() (bool, error)) error {
	end := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("not within %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(period):
		}
	}
}
