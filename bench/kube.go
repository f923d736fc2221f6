package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	kubehome "fiberd.io/fiberd/pkg/home/kubernetes"
)

// kubeTools is where kube-apiserver, etcd and hack/kube-up.sh are.
type kubeTools struct{ bin, script string }

// findKubeTools finds the binaries as test/kubeapi does: $FIBERD_KUBE_BIN,
// else ${FIBERD_KUBE_CACHE:-$HOME/.cache/fiberd/kube}/bin.
func findKubeTools() (*kubeTools, error) {
	bin := os.Getenv("FIBERD_KUBE_BIN")
	if bin == "" {
		cache := os.Getenv("FIBERD_KUBE_CACHE")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "fiberd", "kube")
		}
		bin = filepath.Join(cache, "bin")
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(bin, name)); err != nil || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("no %s in %s (build them with `make kube-tools`, hack/kube-tools.sh, or point FIBERD_KUBE_BIN at them)", name, bin)
		}
	}
	root, err := devkit.FindCheckout()
	if err != nil {
		return nil, err
	}
	return &kubeTools{bin: bin, script: filepath.Join(root, "hack", "kube-up.sh")}, nil
}

// kubeCluster is a running etcd and kube-apiserver.
type kubeCluster struct {
	tools   *kubeTools
	dir     string
	cfg     *rest.Config
	cs      kubernetes.Interface
	version string
	closed  bool
}

func (t *kubeTools) run(action, dir string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.script, action, dir)
	cmd.Env = append(append(os.Environ(), env...), "FIBERD_KUBE_BIN="+t.bin,
		// The control plane goes away with this process, also when it is killed.
		"FIBERD_KUBE_WATCH_PID="+strconv.Itoa(os.Getpid()), "FIBERD_KUBE_WATCH_ACTION=clean")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s %s: %w\n%s", t.script, action, dir, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// start starts a control plane in a fresh short directory (etcd's socket
// path must stay short).
func (t *kubeTools) start(ctx context.Context) (*kubeCluster, error) { return t.startWith(ctx) }

// startFor starts a control plane that nodes join, the first of them at
// nodeAddress (kube-up.sh's FIBERD_KUBE_NODE_ADDRESS).
func (t *kubeTools) startFor(ctx context.Context, nodeAddress string) (*kubeCluster, error) {
	return t.startWith(ctx, "FIBERD_KUBE_NODE_ADDRESS="+nodeAddress)
}

func (t *kubeTools) startWith(ctx context.Context, env ...string) (*kubeCluster, error) {
	dir, err := os.MkdirTemp("", "kb-")
	if err != nil {
		return nil, err
	}
	kc := &kubeCluster{tools: t, dir: dir}
	if _, err := t.run("start", dir, env...); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	read := func(name string) []byte {
		b, rerr := os.ReadFile(filepath.Join(dir, name))
		if rerr != nil && err == nil {
			err = rerr
		}
		return b
	}
	kc.cfg = &rest.Config{
		Host: strings.TrimSpace(string(read("api.url"))),
		TLSClientConfig: rest.TLSClientConfig{
			CAData: read("pki/ca.crt"), CertData: read("pki/admin.crt"), KeyData: read("pki/admin.key"),
		},
		WarningHandler: rest.NoWarnings{},
		QPS:            1000,
		Burst:          2000,
	}
	if err == nil {
		kc.cs, err = kubernetes.NewForConfig(kc.cfg)
	}
	if err == nil {
		var v interface{ String() string }
		v, err = kc.cs.Discovery().ServerVersion()
		if err == nil {
			kc.version = v.String()
		}
	}
	if err != nil {
		kc.close()
		return nil, fmt.Errorf("control plane in %s: %w", dir, err)
	}
	return kc, nil
}

// close stops and removes the control plane; closing it again does nothing.
func (kc *kubeCluster) close() {
	if kc.closed {
		return
	}
	kc.closed = true
	if _, err := kc.tools.run("clean", kc.dir); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	}
}

func (kc *kubeCluster) namespace(ctx context.Context, name string) error {
	_, err := kc.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func workerPod(ns, name string, gate bool, sa string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:           "node-1",
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "worker", Image: "fiberd.invalid/worker:bench"}},
		},
	}
	if gate {
		p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: kubehome.PodConditionZygoteReady}}
	}
	return p
}

// setRunning writes the status a kubelet writes once the Pod's sandbox has
// its network and its container runs.
func (kc *kubeCluster) setRunning(ctx context.Context, ns, name, ip string) error {
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{
		"phase": "Running", "podIP": ip, "podIPs": []map[string]string{{"ip": ip}},
	}})
	_, err := kc.cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func (kc *kubeCluster) deletePod(ctx context.Context, ns, name string) error {
	zero := int64(0)
	err := kc.cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// podPerWorker times n Pod starts as the API server sees them: create,
// the kubelet's status write, and GET until Running with an IP. Each Pod is
// deleted outside the timer.
func (kc *kubeCluster) podPerWorker(ctx context.Context, n int, tick func()) ([]float64, error) {
	const ns = "bench-pods"
	if err := kc.namespace(ctx, ns); err != nil {
		return nil, err
	}
	pods := kc.cs.CoreV1().Pods(ns)
	out := make([]float64, 0, n)
	for i := range n {
		name := fmt.Sprintf("worker-%d", i)
		ip := fmt.Sprintf("10.244.%d.%d", i/250, i%250+2)
		t0 := time.Now()
		if _, err := pods.Create(ctx, workerPod(ns, name, false, ""), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if err := kc.setRunning(ctx, ns, name, ip); err != nil {
			return nil, err
		}
		for {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				break
			}
		}
		out = append(out, Ms(time.Since(t0)))
		if err := kc.deletePod(ctx, ns, name); err != nil {
			return nil, err
		}
		tick()
	}
	return out, nil
}

// requestCounts reads apiserver_request_total of the resources the home
// reads or writes.
func (kc *kubeCluster) requestCounts(ctx context.Context) (map[string]float64, error) {
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
	return RequestCounts(s, "pods", "namespaces", "resourceclaims"), nil
}

// ---------------------------------------------------------------- the home

// timedHome is the Kubernetes home with its readiness publication and its
// scope loss timed. Every other method is the home's own.
type timedHome struct {
	*kubehome.Home
	mu        sync.Mutex
	ready     []float64 // PublishReady(true) durations, ms
	readyAt   chan struct{}
	readyOnce sync.Once
	lost      chan time.Time
}

func (h *timedHome) PublishReady(ctx context.Context, uid string, ready bool) error {
	t0 := time.Now()
	err := h.Home.PublishReady(ctx, uid, ready)
	if ready && err == nil {
		h.mu.Lock()
		h.ready = append(h.ready, Ms(time.Since(t0)))
		h.mu.Unlock()
		h.readyOnce.Do(func() { close(h.readyAt) })
	}
	return err
}

func (h *timedHome) OnScopeLost(fn func(ctx context.Context, reason string)) {
	h.Home.OnScopeLost(func(ctx context.Context, reason string) {
		select {
		case h.lost <- time.Now():
		default:
		}
		fn(ctx, reason)
	})
}

// CgroupRoot is "": the bench's fibers run in no cgroup of their own, as
// with the standalone agent.
func (h *timedHome) CgroupRoot() string { return "" }

var (
	_ fiberd.ScopeLoser     = (*timedHome)(nil)
	_ fiberd.EndpointHoster = (*timedHome)(nil)
)

// issuer is the test issuer: GET /v1/grant with a Pod-bound
// service-account token, checked by a TokenReview, answers a grant of the
// C template for that Pod.
type issuer struct {
	srv    *httptest.Server
	caFile string
	mu     sync.Mutex
	serve  []float64
}

const issuerAudience = "fiberd-bench-issuer"

func (kc *kubeCluster) startIssuer(dir string, k *kit) (*issuer, error) {
	is := &issuer{}
	is.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		if r.URL.Path != "/v1/grant" {
			http.NotFound(w, r)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			http.Error(w, "no bearer token", http.StatusUnauthorized)
			return
		}
		tr, err := kc.cs.AuthenticationV1().TokenReviews().Create(r.Context(), &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: []string{issuerAudience}},
		}, metav1.CreateOptions{})
		if err != nil || !tr.Status.Authenticated {
			http.Error(w, "token not authenticated", http.StatusUnauthorized)
			return
		}
		podName := first(tr.Status.User.Extra["authentication.kubernetes.io/pod-name"])
		podUID := first(tr.Status.User.Extra["authentication.kubernetes.io/pod-uid"])
		if podName == "" || podUID == "" {
			http.Error(w, "token is not bound to a Pod", http.StatusForbidden)
			return
		}
		g, err := k.mint(podUID, is.srv.URL, podName, tplWarmC, time.Hour)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/jwt")
		_, _ = w.Write(g)
		is.mu.Lock()
		is.serve = append(is.serve, Ms(time.Since(t0)))
		is.mu.Unlock()
	}))
	is.srv.StartTLS()
	is.caFile = filepath.Join(dir, "issuer-ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.srv.Certificate().Raw})
	if err := os.WriteFile(is.caFile, ca, 0o644); err != nil {
		is.srv.Close()
		return nil, err
	}
	return is, nil
}

func first(v authenticationv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// kubeHome starts o.kubeRounds grant Pods, each with an in-process fiberd
// whose home is the Kubernetes home, and times the grant fetch, the
// readiness patch and the scope loss; on the first it counts the API
// server's requests while cloning and while idle.
func (kc *kubeCluster) kubeHome(ctx context.Context, work string, k *kit, o options, p *progress, log logr.Logger, res *Result) error {
	const ns, sa = "bench-home", "fiberd"
	if err := kc.namespace(ctx, ns); err != nil {
		return err
	}
	if _, err := kc.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	is, err := kc.startIssuer(work, k)
	if err != nil {
		return err
	}
	defer is.srv.Close()
	kube, err := kubehome.NewKube(ctx, kc.cfg)
	if err != nil {
		return err
	}
	var fetch, startReady, lost []float64
	var ready []float64
	for round := range o.kubeRounds {
		p.Phasef("Kubernetes home: grant Pod %d of %d (grant fetch, readiness, scope loss)", round+1, o.kubeRounds)
		dir := filepath.Join(work, fmt.Sprintf("kube-%d", round))
		name := fmt.Sprintf("grant-%d", round)
		r, err := kc.homeRound(ctx, dir, ns, name, sa, kube, is, k, o, log)
		if err != nil {
			return fmt.Errorf("grant Pod %s: %w", name, err)
		}
		fetch = append(fetch, r.fetch)
		startReady = append(startReady, r.startToReady)
		ready = append(ready, r.home.ready...)
		if round == 0 {
			p.Phasef("API server requests: idle for %d poll periods, then %d clones through the agent", 3, o.metricClones)
			if res.APIServer, err = kc.countRequests(ctx, r, o, p); err != nil {
				r.stop()
				return err
			}
		}
		t0 := time.Now()
		if err := kc.deletePod(ctx, ns, name); err != nil {
			r.stop()
			return err
		}
		select {
		case at := <-r.home.lost:
			lost = append(lost, Ms(at.Sub(t0)))
		case <-time.After(10*o.kubePoll + 30*time.Second):
			r.stop()
			return errors.New("the scope loss never fired after the Pod was deleted")
		}
		r.stop()
	}
	is.mu.Lock()
	serve := Summarize(is.serve)
	is.mu.Unlock()
	res.KubeHome = KubeHomeResult{Measured: true, Rounds: o.kubeRounds, Poll: o.kubePoll.String(),
		GrantFetch: Summarize(fetch), IssuerServe: serve, ReadinessPatch: Summarize(ready),
		StartToReady: Summarize(startReady), ScopeLoss: Summarize(lost),
		Note: fmt.Sprintf("Poll is %s here (production default 15 s): scope loss is found by the next poll round, so it is bounded by the poll period.", o.kubePoll)}
	return nil
}

// homeRun is one grant Pod with its agent running.
type homeRun struct {
	home         *timedHome
	agent        *fiberd.Agent
	client       *client.Client
	uid          string
	fetch        float64
	startToReady float64
	cancel       context.CancelFunc
	done         chan error
	once         sync.Once
}

func (r *homeRun) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

func (kc *kubeCluster) homeRound(ctx context.Context, dir, ns, name, sa string, kube kubehome.Kube, is *issuer, k *kit, o options, log logr.Logger) (*homeRun, error) {
	pods := kc.cs.CoreV1().Pods(ns)
	pod, err := pods.Create(ctx, workerPod(ns, name, true, sa), metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := kc.setRunning(ctx, ns, name, "10.245.0.2"); err != nil {
		return nil, err
	}
	exp := int64(3600)
	tr, err := kc.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{issuerAudience}, ExpirationSeconds: &exp,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"grants", "cgroup"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		return nil, err
	}

	t0 := time.Now()
	h, err := kubehome.New(ctx, kubehome.Config{
		Kube: kube, PodName: name, PodNamespace: ns, PodUID: string(pod.UID),
		Poll: o.kubePoll, StaleTTL: max(30*time.Second, 3*o.kubePoll),
		GrantsDir: filepath.Join(dir, "grants"), GrantTokenFile: tokenFile,
		GrantIssuerURL: is.srv.URL, GrantCAFile: is.caFile,
		Family: endpoint.Unix, CgroupRoot: filepath.Join(dir, "cgroup"), Logger: log.WithName("kubernetes"),
	})
	if err != nil {
		return nil, err
	}
	r := &homeRun{fetch: Ms(time.Since(t0)), uid: string(pod.UID), done: make(chan error, 1),
		home: &timedHome{Home: h, readyAt: make(chan struct{}), lost: make(chan time.Time, 1)}}
	a, err := newAgent(ctx, dir, fiberd.Config{
		Home: r.home, Issuer: is.srv.URL, NodeID: name, Keys: k.keys, Templates: k.dir,
	}, backend.IsolationNone, log)
	if err != nil {
		return nil, fmt.Errorf("fiberd: %w", err)
	}
	r.agent = a
	rctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	t1 := time.Now()
	go func() { r.done <- a.Run(rctx) }()
	fail := func(err error) (*homeRun, error) { r.stop(); return nil, err }
	select {
	case <-r.home.readyAt:
	case <-time.After(2 * time.Minute):
		return fail(errors.New("the template never became warm (see the log file named at the start)"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	for {
		got, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fail(err)
		}
		if podReady(got) {
			break
		}
		if time.Since(t1) > 2*time.Minute {
			return fail(errors.New("the Pod condition never became True"))
		}
	}
	r.startToReady = Ms(time.Since(t1))
	r.client, err = client.New(client.Config{Addr: "unix://" + a.SocketPath()})
	if err != nil {
		return fail(err)
	}
	return r, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == kubehome.PodConditionZygoteReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// countRequests reads apiserver_request_total over an idle window of three
// poll periods and over o.metricClones clones.
func (kc *kubeCluster) countRequests(ctx context.Context, r *homeRun, o options, p *progress) (APIServerResult, error) {
	out := APIServerResult{Measured: true, Poll: o.kubePoll.String(), Clones: o.metricClones}
	before, err := kc.requestCounts(ctx)
	if err != nil {
		return out, err
	}
	t0 := time.Now()
	time.Sleep(3 * o.kubePoll)
	after, err := kc.requestCounts(ctx)
	if err != nil {
		return out, err
	}
	out.IdleSeconds = time.Since(t0).Seconds()
	out.IdleDelta = Delta(before, after)
	total, writes := sums(out.IdleDelta)
	periods := out.IdleSeconds / o.kubePoll.Seconds()
	out.PerPollPeriod, out.WritesPerPeriod = total/periods, writes/periods

	before, err = kc.requestCounts(ctx)
	if err != nil {
		return out, err
	}
	t0 = time.Now()
	tick := p.Counter(o.metricClones)
	for range o.metricClones {
		_, id, _, err := firstByte(ctx, r.client, r.uid, false)
		if rerr := release(r.client, id); err == nil {
			err = rerr
		}
		if err != nil {
			return out, fmt.Errorf("clone through the Kubernetes home's agent: %w", err)
		}
		tick()
	}
	out.CloneSeconds = time.Since(t0).Seconds()
	if after, err = kc.requestCounts(ctx); err != nil {
		return out, err
	}
	out.CloneDelta = Delta(before, after)
	out.CloneRequests, out.CloneWrites = sums(out.CloneDelta)
	// Each poll round reads the Pod once; what the rounds read in all is
	// that many times the idle window's requests per round.
	out.PollRounds = out.CloneDelta["GET pods"]
	perRound := 0.0
	if idleRounds := out.IdleDelta["GET pods"]; idleRounds > 0 {
		perRound = total / idleRounds
	}
	out.PerFiber = (out.CloneRequests - out.PollRounds*perRound) / float64(o.metricClones)
	out.WritesPerFiber = out.CloneWrites / float64(o.metricClones)
	out.Note = fmt.Sprintf("Counted on the resources the home touches (pods, namespaces, resourceclaims). Each poll round of the home reads the Pod once, so `GET pods` counts the rounds; requests per fiber are what the clone window counted beyond those rounds (%s requests per round in the idle window), divided by the clones.", num(perRound))
	return out, nil
}

func sums(m map[string]float64) (total, writes float64) {
	for k, v := range m {
		total += v
		if verb, _, _ := strings.Cut(k, " "); IsWrite(verb) {
			writes += v
		}
	}
	return total, writes
}
