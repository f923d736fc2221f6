package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"fiberd.io/fiberd/pkg/endpoint"
	homekube "fiberd.io/fiberd/pkg/home/kubernetes"
)

// homes runs one real fiberd Kubernetes home (pkg/home/kubernetes) per running grant Pod, as
// fiberd runs it in the Pod: a bound service-account token for the issuer's audience minted
// through the TokenRequest API (the kubelet's projected token), the first grant fetched from
// the controller's issuer, renewal at half lease, the Pod polled every Poll, and the readiness
// condition fiberd.io/zygote-ready published once (fiberd publishes it when a template is warm;
// here at once, since no template runs). Every home talks to the API server through its own
// clientset, as separate processes would, and its requests are counted.
type homes struct {
	cfg       *rest.Config // the homes' API configuration (counted)
	tokens    kubernetes.Interface
	issuerURL string
	caFile    string
	dir       string
	poll      time.Duration
	log       logr.Logger
	sem       chan struct{}

	mu      sync.Mutex
	running map[types.UID]*runningHome
	wg      sync.WaitGroup
	closed  bool

	started, failed, published, scopeLost atomic.Int64
	requests                              atomic.Int64
	firstErr                              atomic.Pointer[error]
}

type runningHome struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// newHomes returns the homes' runner. base is the admin configuration (fiberd in a Pod uses its
// service account; the request counts are the same), tokens mints the Pods' tokens (the
// kubelet's part), start bounds how many homes start at once.
func newHomes(base *rest.Config, tokens kubernetes.Interface, issuerURL, caFile, dir string, poll time.Duration, start int, log logr.Logger) *homes {
	h := &homes{tokens: tokens, issuerURL: issuerURL, caFile: caFile, dir: dir, poll: poll, log: log,
		sem: make(chan struct{}, start), running: map[types.UID]*runningHome{}}
	cfg := rest.CopyConfig(base)
	// fiberd's in-cluster client keeps client-go's default rate limits.
	cfg.QPS, cfg.Burst = 0, 0
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			h.requests.Add(1)
			return rt.RoundTrip(r)
		})
	})
	h.cfg = cfg
	return h
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// start starts pod's home in the background; the kubelet calls it once the Pod runs.
func (h *homes) start(ctx context.Context, pod *corev1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.running[pod.UID] != nil {
		return
	}
	hctx, cancel := context.WithCancel(ctx)
	rh := &runningHome{cancel: cancel, done: make(chan struct{})}
	h.running[pod.UID] = rh
	h.wg.Go(func() {
		defer close(rh.done)
		defer cancel()
		if err := h.run(hctx, pod.DeepCopy()); err != nil && hctx.Err() == nil {
			h.failed.Add(1)
			h.firstErr.CompareAndSwap(nil, &err)
			h.log.Error(err, "home failed", "pod", pod.Name)
		}
	})
}

// stop ends pod's home and waits for it.
func (h *homes) stop(pod *corev1.Pod) {
	h.mu.Lock()
	rh := h.running[pod.UID]
	delete(h.running, pod.UID)
	h.mu.Unlock()
	if rh != nil {
		rh.cancel()
		<-rh.done
	}
}

// close ends every home and waits for all of them.
func (h *homes) close() {
	h.mu.Lock()
	h.closed = true
	for _, rh := range h.running {
		rh.cancel()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// err is the first error a home failed with, nil when none did.
func (h *homes) err() error {
	if p := h.firstErr.Load(); p != nil {
		return *p
	}
	return nil
}

// run is one home's life: its token, New (which fetches the grant), the readiness condition
// published, then Run until ctx ends.
func (h *homes) run(ctx context.Context, pod *corev1.Pod) error {
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	released := false
	release := func() {
		if !released {
			released = true
			<-h.sem
		}
	}
	defer release()
	dir := filepath.Join(h.dir, pod.Name+"-"+string(pod.UID))
	grants := filepath.Join(dir, "grants")
	if err := os.MkdirAll(grants, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	exp := int64(time.Hour / time.Second)
	tr, err := h.tokens.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{h.issuerURL},
			ExpirationSeconds: &exp,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("pod %s: token: %w", pod.Name, err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		return err
	}
	kube, err := homekube.NewKube(ctx, h.cfg)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	home, err := homekube.New(ctx, homekube.Config{
		Kube:           kube,
		PodName:        pod.Name,
		PodNamespace:   pod.Namespace,
		PodUID:         string(pod.UID),
		Poll:           h.poll,
		StaleTTL:       2 * h.poll,
		GrantsDir:      grants,
		GrantTokenFile: tokenFile,
		GrantIssuerURL: h.issuerURL,
		GrantCAFile:    h.caFile,
		Family:         endpoint.Inet4,
		// No fibers run, so no cgroup is carved: a path stands in for the delegated one.
		CgroupRoot: dir,
		Logger:     h.log.WithValues("pod", pod.Name),
	})
	if err != nil {
		return err
	}
	defer home.Close()
	home.OnScopeLost(func(context.Context, string) { h.scopeLost.Add(1) })
	h.started.Add(1)
	release()
	var wg sync.WaitGroup
	wg.Go(func() { home.Run(ctx) })
	if err := home.PublishReady(ctx, string(pod.UID), true); err != nil && ctx.Err() == nil {
		h.log.Error(err, "readiness not published; the next poll round repairs it", "pod", pod.Name)
	} else if err == nil {
		h.published.Add(1)
	}
	wg.Wait()
	return nil
}
