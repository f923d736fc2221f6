package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/pool"
	poolclient "fiberd.io/fiberd/pkg/client/pool"
	"fiberd.io/fiberd/test/kubeapi"
)

// Options shape one run. The zero value is not valid; defaultOptions gives the recorded run's.
type Options struct {
	// Pods is the number of grant Pods, over Pools FiberPools of Pods/Pools each.
	Pods, Pools int
	// Nodes is the number of simulated Nodes the Pods are bound to.
	Nodes int
	// Lease is the pools' spec.lease; the homes renew at half of it.
	Lease time.Duration
	// Poll is the homes' Pod poll (fiberd's default, half of the 30 s stale TTL: 15 s).
	Poll time.Duration
	// Rest is the length of the window measured at rest.
	Rest time.Duration
	// Clients is the number of pool clients watching EndpointSlices in the Clone-load window,
	// spread over the pools; Load is that window's length.
	Clients int
	Load    time.Duration
	// ReadyTimeout bounds the wait for every Pod to be Ready.
	ReadyTimeout time.Duration
	// Workers is the simulated kubelets' goroutines; HomeStarts bounds homes starting at once.
	Workers, HomeStarts int
	// CRD is the path of deploy/controller/fiberd.io_fiberpools.yaml.
	CRD string
	// Dir holds the logs and the homes' files. Empty means a fresh temporary directory, removed
	// at the end.
	Dir string
	// Log is the benchmark's own log.
	Log logr.Logger
}

// Validate reports the first option that cannot work.
func (o Options) Validate() error {
	switch {
	case o.Pods < 1 || o.Pools < 1 || o.Pods%o.Pools != 0:
		return fmt.Errorf("-pods %d over -pools %d: want at least one of each, the pods a multiple of the pools", o.Pods, o.Pools)
	case o.Nodes < 1:
		return fmt.Errorf("-nodes %d: want at least 1", o.Nodes)
	case o.Lease < 2*time.Second:
		return fmt.Errorf("-lease %v: want at least 2s", o.Lease)
	case o.Poll < 100*time.Millisecond:
		return fmt.Errorf("-poll %v: want at least 100ms (the home's minimum)", o.Poll)
	case o.Rest <= 0 || o.Load <= 0:
		return fmt.Errorf("-rest %v, -load %v: want positive windows", o.Rest, o.Load)
	case o.Clients < 0:
		return fmt.Errorf("-clients %d: want 0 or more", o.Clients)
	case o.Workers < 1 || o.HomeStarts < 1:
		return fmt.Errorf("-workers %d, -home-starts %d: want at least 1", o.Workers, o.HomeStarts)
	case o.CRD == "":
		return errors.New("-crd is empty: give deploy/controller/fiberd.io_fiberpools.yaml")
	}
	return nil
}

// window is what one measured window saw.
type window struct {
	Name    string
	Seconds float64
	Rates   []rate
	Total   float64
	// ByClient is requests per second by who sent them: the homes (counted in their transport),
	// the controller (its client-go rest_client_requests_total) and the rest (simulated
	// kubelets, pool clients, the benchmark's own reads).
	Homes, Controller float64
	// Watches is the API server's open WATCH requests at the window's end.
	Watches float64
	// Reconciles is reconciles per second; ReconcileP50 and P99 their latency in seconds.
	Reconciles, ReconcileP50, ReconcileP99 float64
	// Renewals is grants issued per second by the controller's issuer.
	Renewals float64
	// Scrape is the longer of the two scrapes that bound the window: a window whose scrapes
	// took seconds was measured on a starved host.
	Scrape time.Duration
}

// Result is one run's measurements.
type Result struct {
	Options     Options
	CPUs        int
	ReadyAfter  time.Duration // pools created to every Pod Ready
	StatusAfter time.Duration // pools created to every pool's status counting all its Pods ready
	Windows     []window
	// RampPerPod is the API requests from the pools' creation to every Pod Ready (and the
	// pools' EndpointSlices written), by verb and resource, divided by the Pods.
	RampPerPod []rate
	// Ramp is the reconcile latency over the whole run up to every Pod Ready.
	RampReconciles                     float64
	RampReconcileP50, RampReconcileP99 float64
	// The controller process's memory at the end of the rest window, in bytes.
	ControllerRSS, ControllerHeap float64
	// The benchmark process's memory (homes, kubelets, pool clients) at the same time.
	BenchRSS, BenchHeap                     float64
	HomesStarted, ReadyPublished, ScopeLost int64
	ClientsEndpoints                        int // endpoints the pool clients saw, summed
}

const benchNamespace = "scale"

// Run starts a control plane, the controller, the simulated kubelets and the homes, brings
// o.Pods grant Pods Ready, and measures the rest and Clone-load windows.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Log
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "fiberd-scale-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	res := &Result{Options: o, CPUs: runtime.NumCPU()}

	log.Info("starting the control plane")
	cp, err := kubeapi.New(kubeapi.Options{})
	if err != nil {
		return nil, err
	}
	defer cp.Close()
	cs := cp.Client()
	scheme := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{corev1.AddToScheme, v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	c, err := client.New(cp.Config(), client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := installCRD(ctx, c, o.CRD); err != nil {
		return nil, err
	}
	nodes, err := setupCluster(ctx, cs, o.Nodes)
	if err != nil {
		return nil, err
	}

	// The issuer's serving certificate, for 127.0.0.1.
	certFile, keyFile, err := writeCert(o.Dir)
	if err != nil {
		return nil, err
	}
	issuerAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	issuerURL := "https://" + issuerAddr
	ctrlLog, err := os.Create(filepath.Join(o.Dir, "controller.log"))
	if err != nil {
		return nil, err
	}
	defer ctrlLog.Close()
	log.Info("starting the controller process", "issuer", issuerURL, "metrics", metricsAddr, "log", ctrlLog.Name())
	proc, err := startController(ctx, controllerSpec{
		Kubeconfig: cp.Kubeconfig(), IssuerURL: issuerURL, IssuerListen: issuerAddr,
		CertFile: certFile, KeyFile: keyFile, KeysNamespace: "fiberd-system",
		MetricsListen: metricsAddr, MaxLease: max(o.Lease, time.Hour),
	}, ctrlLog)
	if err != nil {
		return nil, err
	}
	defer proc.stop()

	homesLog, err := os.Create(filepath.Join(o.Dir, "homes.log"))
	if err != nil {
		return nil, err
	}
	defer homesLog.Close()
	hlog := newFileLogger(homesLog)
	runCtx, stopRun := context.WithCancel(ctx)
	hs := newHomes(cp.Config(), cs, issuerURL, certFile, filepath.Join(o.Dir, "homes"), o.Poll, o.HomeStarts, hlog)
	kl := newKubelet(cs, benchNamespace, nodes,
		func(p *corev1.Pod) { hs.start(runCtx, p) }, hs.stop, hlog.WithName("kubelet"))
	klDone := make(chan struct{})
	go func() {
		defer close(klDone)
		kl.Run(runCtx, o.Workers)
	}()
	defer func() {
		stopRun()
		<-klDone
		hs.close()
	}()

	before, err := scrapeAll(ctx, cs, proc)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	per := int32(o.Pods / o.Pools)
	log.Info("creating pools", "pools", o.Pools, "podsEach", per)
	for i := range o.Pools {
		if err := c.Create(ctx, benchPool(fmt.Sprintf("p%03d", i), per, o.Lease)); err != nil {
			return nil, fmt.Errorf("pool %d: %w", i, err)
		}
	}
	// Every Pod Ready, as the simulated kubelets saw them; polled in memory, no API request.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, o.ReadyTimeout, true, func(context.Context) (bool, error) {
		if err := hs.err(); err != nil {
			return false, err
		}
		return kl.readyCount() >= o.Pods, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%d of %d Pods Ready after %v (homes started %d, failed %d): %w; see %s",
			kl.readyCount(), o.Pods, time.Since(start).Round(time.Second), hs.started.Load(), hs.failed.Load(), err, homesLog.Name())
	}
	res.ReadyAfter = time.Since(start)
	log.Info("every Pod Ready", "after", res.ReadyAfter.Round(time.Millisecond))
	err = wait.PollUntilContextTimeout(ctx, time.Second, o.ReadyTimeout, true, func(ctx context.Context) (bool, error) {
		var fps v1alpha1.FiberPoolList
		if err := c.List(ctx, &fps, client.InNamespace(benchNamespace)); err != nil {
			return false, nil
		}
		for _, fp := range fps.Items {
			if fp.Status.ReadyReplicas != per {
				return false, nil
			}
		}
		return len(fps.Items) == o.Pools, nil
	})
	if err != nil {
		return nil, fmt.Errorf("pool statuses never counted every Pod ready: %w", err)
	}
	res.StatusAfter = time.Since(start)
	// The EndpointSlice controller's part: one write of each pool's slices, now that every
	// Pod is ready (at rest they do not change).
	if err := writeSlices(ctx, cs, o.Pools); err != nil {
		return nil, err
	}
	// Let the ramp's last writes settle before the rest window starts.
	if err := sleep(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	ramp, err := scrapeAll(ctx, cs, proc)
	if err != nil {
		return nil, err
	}
	res.RampPerPod = rates(requestCounts(before.api), requestCounts(ramp.api), float64(o.Pods))
	h := reconcileHist(ramp.ctrl).minus(reconcileHist(before.ctrl))
	res.RampReconciles, res.RampReconcileP50, res.RampReconcileP99 = h.count, h.quantile(0.5), h.quantile(0.99)

	log.Info("measuring at rest", "window", o.Rest)
	rest, restEnd, err := measure(ctx, "rest", cs, proc, hs, ramp, o.Rest)
	if err != nil {
		return nil, err
	}
	res.Windows = append(res.Windows, rest)
	if res.ControllerRSS, err = proc.rssBytes(); err != nil {
		return nil, err
	}
	res.ControllerHeap = gauge(restEnd.ctrl, "go_memstats_heap_alloc_bytes", nil)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.BenchHeap = float64(ms.HeapAlloc)
	if res.BenchRSS, err = procRSS(os.Getpid()); err != nil {
		return nil, err
	}

	log.Info("starting pool clients", "clients", o.Clients)
	sources, err := startClients(ctx, cp, o.Clients, o.Pools)
	defer func() {
		for _, s := range sources {
			s.Stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	for _, s := range sources {
		res.ClientsEndpoints += len(s.Snapshot().Endpoints)
	}
	loadStart, err := scrapeAll(ctx, cs, proc)
	if err != nil {
		return nil, err
	}
	log.Info("measuring under Clone load", "window", o.Load)
	load, _, err := measure(ctx, "clone load", cs, proc, hs, loadStart, o.Load)
	if err != nil {
		return nil, err
	}
	res.Windows = append(res.Windows, load)
	res.HomesStarted, res.ReadyPublished, res.ScopeLost = hs.started.Load(), hs.published.Load(), hs.scopeLost.Load()
	if err := hs.err(); err != nil {
		return res, fmt.Errorf("a home failed: %w", err)
	}
	return res, nil
}

// snapshot is what one scrape read: the API server's metrics, the controller's, and the homes'
// request count.
type snapshot struct {
	at        time.Time
	took      time.Duration // how long the two scrapes took: long on a starved host
	api, ctrl []sample
	homes     int64
}

func scrapeAll(ctx context.Context, cs kubernetes.Interface, proc *controllerProc) (snapshot, error) {
	var s snapshot
	began := time.Now()
	var err error
	// The controller first (a local read), the API server last: the window ends when the API
	// server answered, since its counts are the ones reported by verb and resource.
	if s.ctrl, err = proc.scrape(ctx); err != nil {
		return s, fmt.Errorf("controller /metrics: %w", err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return s, fmt.Errorf("API server /metrics: %w", err)
	}
	s.at = time.Now()
	s.took = s.at.Sub(began)
	if s.api, err = parseText(string(raw), "apiserver_request_total", "apiserver_longrunning_requests"); err != nil {
		return s, err
	}
	return s, nil
}

// measure waits d and reports the window from start to its end.
func measure(ctx context.Context, name string, cs kubernetes.Interface, proc *controllerProc, hs *homes, start snapshot, d time.Duration) (window, snapshot, error) {
	start.homes = hs.requests.Load()
	if err := sleep(ctx, d); err != nil {
		return window{}, snapshot{}, err
	}
	homesEnd := hs.requests.Load()
	end, err := scrapeAll(ctx, cs, proc)
	if err != nil {
		return window{}, snapshot{}, err
	}
	end.homes = homesEnd
	secs := end.at.Sub(start.at).Seconds()
	w := window{Name: name, Seconds: secs, Scrape: max(start.took, end.took)}
	w.Rates = rates(requestCounts(start.api), requestCounts(end.api), secs)
	w.Total = totalRate(w.Rates)
	w.Homes = float64(end.homes-start.homes) / secs
	w.Controller = (gauge(end.ctrl, "rest_client_requests_total", nil) - gauge(start.ctrl, "rest_client_requests_total", nil)) / secs
	w.Watches = gauge(end.api, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH"})
	h := reconcileHist(end.ctrl).minus(reconcileHist(start.ctrl))
	w.Reconciles, w.ReconcileP50, w.ReconcileP99 = h.count/secs, h.quantile(0.5), h.quantile(0.99)
	issued := map[string]string{"code": "200"}
	w.Renewals = (gauge(end.ctrl, "fiberd_issuer_grant_requests_total", issued) - gauge(start.ctrl, "fiberd_issuer_grant_requests_total", issued)) / secs
	return w, end, nil
}

func reconcileHist(s []sample) histogram {
	return histogramOf(s, "controller_runtime_reconcile_time_seconds", map[string]string{"controller": "fiberpool"})
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// installCRD applies the FiberPool CRD and waits until FiberPools are served.
func installCRD(ctx context.Context, c client.Client, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-crd: %w", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		return fmt.Errorf("-crd %s: %w", path, err)
	}
	if err := c.Create(ctx, &crd); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("CRD: %w", err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var l v1alpha1.FiberPoolList
		return c.List(ctx, &l) == nil, nil
	})
}

// setupCluster makes the namespaces, the grant Pods' service account and n Ready Nodes, and
// returns the Nodes' names.
func setupCluster(ctx context.Context, cs kubernetes.Interface, n int) ([]string, error) {
	for _, ns := range []string{benchNamespace, "fiberd-system"} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	_, err := cs.CoreV1().ServiceAccounts(benchNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "fiberd"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("service account: %w", err)
	}
	var names []string
	for i := range n {
		name := fmt.Sprintf("sim-node-%03d", i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
		got, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		got.Status = corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourcePods: resource.MustParse("250"), corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("250"), corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Simulated"}},
		}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("node %s status: %w", name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// benchTemplate is a template reference of the shape the CRD requires; nothing runs it.
const benchTemplate = "bench@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func benchPool(name string, replicas int32, lease time.Duration) *v1alpha1.FiberPool {
	wb := resource.MustParse("64Mi")
	return &v1alpha1.FiberPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: v1alpha1.FiberPoolSpec{
			Template:  v1alpha1.TemplateSpec{Name: benchTemplate, Image: "fiberd.invalid/template:bench"},
			Replicas:  ptr.To(replicas),
			FibersMax: 8,
			WBudget:   &wb,
			Lease:     &metav1.Duration{Duration: lease},
		},
	}
}

// writeSlices writes each pool's EndpointSlices from its ready Pods, as the EndpointSlice
// controller would (at most 100 endpoints a slice, its default), since no
// kube-controller-manager runs here.
func writeSlices(ctx context.Context, cs kubernetes.Interface, pools int) error {
	pods, err := cs.CoreV1().Pods(benchNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byPool := map[string][]discoveryv1.Endpoint{}
	for _, p := range pods.Items {
		if !podReady(&p) || p.Status.PodIP == "" {
			continue
		}
		pl := p.Labels[pool.LabelPool]
		byPool[pl] = append(byPool[pl], discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(p.Spec.NodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	if len(byPool) != pools {
		return fmt.Errorf("EndpointSlices: ready Pods of %d pools, want %d", len(byPool), pools)
	}
	for pl, eps := range byPool {
		for i := 0; i < len(eps); i += 100 {
			sl := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Name: fmt.Sprintf("%s-%d", pl, i/100), Namespace: benchNamespace,
					Labels: map[string]string{discoveryv1.LabelServiceName: pl, discoveryv1.LabelManagedBy: "scale-bench.fiberd.io"},
				},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   eps[i:min(i+100, len(eps))],
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(poolclient.APIPort), Port: ptr.To[int32](8484), Protocol: ptr.To(corev1.ProtocolTCP)}},
			}
			if _, err := cs.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("EndpointSlice %s: %w", sl.Name, err)
			}
		}
	}
	return nil
}

// startClients starts n pool clients' EndpointSlice watches (the pool client's SliceSource,
// which pool.Open runs), client i on pool i mod pools, each with its own client as a separate
// process would have, and waits until each has synced.
func startClients(ctx context.Context, cp *kubeapi.ControlPlane, n, pools int) ([]*poolclient.SliceSource, error) {
	var out []*poolclient.SliceSource
	for i := range n {
		sc, err := poolclient.NewSliceClient(cp.Config(), benchNamespace)
		if err != nil {
			return out, err
		}
		s := poolclient.NewSliceSource(sc, benchNamespace, fmt.Sprintf("p%03d", i%pools), poolclient.SliceOptions{Logger: logr.Discard()})
		s.Start(ctx)
		out = append(out, s)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, s := range out {
		if err := s.WaitSynced(sctx); err != nil {
			return out, fmt.Errorf("pool client: %w", err)
		}
	}
	return out, nil
}

// writeCert writes a self-signed ECDSA certificate for 127.0.0.1 (its own CA, which the homes
// trust) and its key into dir.
func writeCert(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "fiberd scale bench issuer"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "issuer.crt"), filepath.Join(dir, "issuer.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
