//go:build integration

package kubernetes

// Integration tests of the Kubernetes home against a real kube-apiserver and etcd (test/kubeapi).
// Each asserts what a user of the cluster sees: the Pod read back with a GET, the requests on the
// wire, the reasons OnScopeLost delivers, the health fiberd reads and the log lines an operator
// reads. Run them with `make test-integration`; they need `make kube-tools` once.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/test/kubeapi"
)

const (
	// itStaleTTL and itPoll are short so the liveness and claim tests take seconds.
	itStaleTTL = 2 * time.Second
	itPoll     = 200 * time.Millisecond
	// itWait is how long a test waits for something the home should do within a few polls.
	itWait = 20 * time.Second
)

// ------------------------------------------------------------------------------------ helpers

// itRecorder is a logr sink that keeps every line, with errors as their plain Error() text, so a
// test can look for the words an operator would read.
type itRecorder struct {
	mu    *sync.Mutex
	lines *[]string
	name  string
	kv    []any
}

func newITRecorder() *itRecorder { return &itRecorder{mu: &sync.Mutex{}, lines: &[]string{}} }

func (r *itRecorder) Init(logr.RuntimeInfo)  {}
func (r *itRecorder) Enabled(level int) bool { return level <= 1 }
func (r *itRecorder) Info(level int, msg string, kv ...any) {
	r.add("info", msg, nil, kv)
}
func (r *itRecorder) Error(err error, msg string, kv ...any) { r.add("error", msg, err, kv) }
func (r *itRecorder) WithValues(kv ...any) logr.LogSink {
	c := *r
	c.kv = append(slices.Clone(r.kv), kv...)
	return &c
}
func (r *itRecorder) WithName(name string) logr.LogSink {
	c := *r
	c.name = strings.TrimPrefix(r.name+"/"+name, "/")
	return &c
}

func (r *itRecorder) add(kind, msg string, err error, kv []any) {
	var b strings.Builder
	b.WriteString(kind + " ")
	if r.name != "" {
		b.WriteString(r.name + ": ")
	}
	b.WriteString(msg)
	if err != nil {
		fmt.Fprintf(&b, " err=%s", err.Error())
	}
	all := append(slices.Clone(r.kv), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		fmt.Fprintf(&b, " %v=%v", all[i], all[i+1])
	}
	r.mu.Lock()
	*r.lines = append(*r.lines, b.String())
	r.mu.Unlock()
}

func (r *itRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.lines)
}

// find returns the first line of kind ("info" or "error") holding every one of words.
func (r *itRecorder) find(kind string, words ...string) (string, bool) {
	for _, l := range r.all() {
		if strings.HasPrefix(l, kind+" ") && itContainsAll(l, words...) {
			return l, true
		}
	}
	return "", false
}

// count is how many lines of kind ("info", "error", or "" for both) hold every one of words.
func (r *itRecorder) count(kind string, words ...string) int {
	n := 0
	for _, l := range r.all() {
		if strings.HasPrefix(l, kind) && itContainsAll(l, words...) {
			n++
		}
	}
	return n
}

func itContainsAll(s string, words ...string) bool {
	for _, w := range words {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// itWire counts the requests a client sends, by method and path.
type itWire struct {
	mu   sync.Mutex
	reqs []string
}

func (w *itWire) wrap(rt http.RoundTripper) http.RoundTripper {
	return itRoundTripper(func(r *http.Request) (*http.Response, error) {
		w.mu.Lock()
		w.reqs = append(w.reqs, r.Method+" "+r.URL.Path)
		w.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

type itRoundTripper func(*http.Request) (*http.Response, error)

func (f itRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// count is how many requests had the method and a path ending in suffix.
func (w *itWire) count(method, suffix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.reqs {
		if strings.HasPrefix(r, method+" ") && strings.HasSuffix(r, suffix) {
			n++
		}
	}
	return n
}

func (w *itWire) paths(method string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, r := range w.reqs {
		if p, ok := strings.CutPrefix(r, method+" "); ok {
			out = append(out, p)
		}
	}
	return out
}

// itHome is a home started on a real API server, with what it reported.
type itHome struct {
	*Home
	logs    *itRecorder
	started time.Time

	mu   sync.Mutex
	lost []string
	news chan struct{}
}

// reasons is what OnScopeLost delivered so far.
func (r *itHome) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lost)
}

// waitLost waits until reason has been delivered.
func (r *itHome) waitLost(t *testing.T, reason string) {
	t.Helper()
	deadline := time.After(itWait)
	for {
		if slices.Contains(r.reasons(), reason) {
			return
		}
		select {
		case <-r.news:
		case <-deadline:
			t.Fatalf("scope loss %q not delivered within %v; delivered %q", reason, itWait, r.reasons())
		}
	}
}

// itHomeOpts shapes newITHome.
type itHomeOpts struct {
	cfg      *rest.Config // default: the control plane's admin config
	family   endpoint.Family
	noRun    bool
	wire     *itWire
	staleTTL time.Duration // default itStaleTTL
}

// newITHome builds a home for pod on env's control plane, through NewKube, and runs it until the
// test ends (unless o.noRun).
func newITHome(t *testing.T, env *kubeapi.Env, pod *corev1.Pod, o itHomeOpts) *itHome {
	t.Helper()
	cfg := o.cfg
	if cfg == nil {
		cfg = env.CP.Config()
	}
	if o.wire != nil {
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(o.wire.wrap)
	}
	ctx, cancel := context.WithTimeout(context.Background(), itWait)
	defer cancel()
	kube, err := NewKube(ctx, cfg)
	if err != nil {
		t.Fatalf("NewKube: %v", err)
	}
	r := &itHome{logs: newITRecorder(), news: make(chan struct{}, 1)}
	staleTTL := o.staleTTL
	if staleTTL == 0 {
		staleTTL = itStaleTTL
	}
	h, err := New(ctx, Config{
		Kube:         kube,
		PodName:      pod.Name,
		PodNamespace: pod.Namespace,
		PodUID:       string(pod.UID),
		StaleTTL:     staleTTL,
		Poll:         itPoll,
		CgroupRoot:   t.TempDir(),
		Family:       o.family,
		Logger:       logr.New(r.logs),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r.Home, r.started = h, time.Now()
	h.OnScopeLost(func(_ context.Context, reason string) {
		r.mu.Lock()
		r.lost = append(r.lost, reason)
		r.mu.Unlock()
		select {
		case r.news <- struct{}{}:
		default:
		}
	})
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	if o.noRun {
		close(done)
	} else {
		go func() { defer close(done); h.Run(runCtx) }()
	}
	t.Cleanup(func() {
		stop()
		<-done
		h.Close()
		if t.Failed() {
			for _, l := range r.logs.all() {
				t.Log(l)
			}
		}
	})
	return r
}

// itWaitStored waits until a poll round has stored the Pod: Scope then names its node.
func itWaitStored(t *testing.T, h *itHome) {
	t.Helper()
	itWaitFor(t, "the home to read its Pod", func() bool {
		return slices.Contains(h.Scope(), core.ScopeClaim{Name: "node", Value: kubeapi.DefaultNode})
	})
}

// itWaitKept is itWaitFor, failing at once when h loses its scope meanwhile.
func itWaitKept(t *testing.T, h *itHome, what string, cond func() bool) {
	t.Helper()
	itWaitFor(t, what, func() bool {
		if got := h.reasons(); len(got) != 0 {
			t.Fatalf("scope lost %q while waiting for %s", got, what)
		}
		return cond()
	})
}

func itWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(itWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", itWait, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func itCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// itCondition is the Pod's readiness condition as a GET shows it, nil when absent.
func itCondition(t *testing.T, env *kubeapi.Env, name string) *corev1.PodCondition {
	t.Helper()
	for _, c := range env.GetPod(t, name).Status.Conditions {
		if c.Type == PodConditionZygoteReady {
			return &c
		}
	}
	return nil
}

// ----------------------------------------------------------------------------------- discovery

// NewKube reads claims at the version the cluster serves: v1 by default, v1beta2 when only that
// is on, and none when the group is off, where GetResourceClaim says ErrNoResourceClaims and a
// Pod with claims loses its scope once the claims went unread for the stale TTL.
func TestIntegrationResourceClaimDiscovery(t *testing.T) {
	readClaim := func(t *testing.T, env *kubeapi.Env, name string) (*metav1.PartialObjectMetadata, []string, error) {
		t.Helper()
		var w itWire
		cfg := env.CP.Config()
		cfg.Wrap(w.wrap)
		kube, err := NewKube(itCtx(t), cfg)
		if err != nil {
			t.Fatalf("NewKube: %v", err)
		}
		before := len(w.paths(http.MethodGet))
		got, err := kube.GetResourceClaim(itCtx(t), env.Namespace, name)
		return got, w.paths(http.MethodGet)[before:], err
	}

	t.Run("v1 by default", func(t *testing.T) {
		env := kubeapi.NewEnv(t)
		want := env.CreateResourceClaim(t, "gpu")
		got, paths, err := readClaim(t, env, "gpu")
		if err != nil || got.UID != want.UID {
			t.Fatalf("GetResourceClaim = %v, %v; want the claim with UID %s", got, err, want.UID)
		}
		if len(paths) != 1 || !strings.HasPrefix(paths[0], "/apis/resource.k8s.io/v1/") {
			t.Fatalf("GetResourceClaim sent GET %q, want one GET under /apis/resource.k8s.io/v1/", paths)
		}
	})

	cp := kubeapi.Start(t, kubeapi.Options{RuntimeConfig: "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true"})
	t.Run("v1beta2 when v1 is off", func(t *testing.T) {
		env := cp.NewEnv(t)
		want := env.CreateResourceClaim(t, "gpu")
		got, paths, err := readClaim(t, env, "gpu")
		if err != nil || got.UID != want.UID {
			t.Fatalf("GetResourceClaim = %v, %v; want the claim with UID %s", got, err, want.UID)
		}
		if len(paths) != 1 || !strings.HasPrefix(paths[0], "/apis/resource.k8s.io/v1beta2/") {
			t.Fatalf("GetResourceClaim sent GET %q, want one GET under /apis/resource.k8s.io/v1beta2/", paths)
		}
	})

	t.Run("group off", func(t *testing.T) {
		if err := cp.Restart(kubeapi.Options{RuntimeConfig: "resource.k8s.io/v1=false"}); err != nil {
			t.Fatal(err)
		}
		env := cp.NewEnv(t)
		if v := cp.ResourceClaimVersion(t); v != "" {
			t.Fatalf("the control plane still serves resource.k8s.io/%s", v)
		}
		_, paths, err := readClaim(t, env, "gpu")
		if !errors.Is(err, ErrNoResourceClaims) {
			t.Fatalf("GetResourceClaim with the group off = %v, want ErrNoResourceClaims", err)
		}
		// It asks discovery again (the group may have been switched on
		// since), and reads no claim.
		if !slices.Equal(paths, []string{"/apis/resource.k8s.io"}) {
			t.Errorf("GetResourceClaim with the group off sent GET %q, want only the group's discovery", paths)
		}

		pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant", Claims: map[string]string{"gpu": "gpu"}})
		h := newITHome(t, env, pod, itHomeOpts{})
		itWaitStored(t, h)
		if !slices.Contains(h.Scope(), core.ScopeClaim{Name: "resource_claim", Value: "gpu"}) {
			t.Fatalf("Scope() = %v, want the claim gpu in it", h.Scope())
		}
		h.waitLost(t, reasonClaimsUnreadable)
		if waited := time.Since(h.started); waited < itStaleTTL {
			t.Errorf("scope lost %v after the home started, before the stale TTL %v", waited, itStaleTTL)
		}
		if got := h.reasons(); len(got) != 1 {
			t.Errorf("delivered %q, want only %q", got, reasonClaimsUnreadable)
		}
	})
}

// ----------------------------------------------------------------------------------- readiness

// PublishReady writes the condition only when "any template is warm" flips, and a GET of the Pod
// shows it.
func TestIntegrationPublishReady(t *testing.T) {
	env := kubeapi.NewEnv(t)
	pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant"})
	var w itWire
	// Not run: the poll round's repair of the condition would be writes of its own.
	h := newITHome(t, env, pod, itHomeOpts{wire: &w, noRun: true})
	ctx := itCtx(t)

	steps := []struct {
		grant      string
		ready      bool
		wantWrites int
		wantStatus corev1.ConditionStatus // "" = no condition on the Pod
		wantReason string
	}{
		{"g1", true, 1, corev1.ConditionTrue, ReasonTemplateWarm},
		{"g2", true, 1, corev1.ConditionTrue, ReasonTemplateWarm},     // already warm: no write
		{"g1", false, 1, corev1.ConditionTrue, ReasonTemplateWarm},    // g2 is still warm: no write
		{"g2", false, 2, corev1.ConditionFalse, ReasonNoWarmTemplate}, // the last one went cold
		{"g2", false, 2, corev1.ConditionFalse, ReasonNoWarmTemplate}, // again: no write
		{"g3", true, 3, corev1.ConditionTrue, ReasonTemplateWarm},
	}
	for i, s := range steps {
		if err := h.PublishReady(ctx, s.grant, s.ready); err != nil {
			t.Fatalf("step %d: PublishReady(%s, %v): %v", i, s.grant, s.ready, err)
		}
		if got := w.count(http.MethodPatch, "/pods/grant/status"); got != s.wantWrites {
			t.Errorf("step %d: PublishReady(%s, %v): %d status patches in all, want %d", i, s.grant, s.ready, got, s.wantWrites)
		}
		if got := w.count(http.MethodPatch, ""); got != s.wantWrites {
			t.Errorf("step %d: %d PATCH requests in all, want %d (only the status patches)", i, got, s.wantWrites)
		}
		c := itCondition(t, env, "grant")
		if c == nil || c.Status != s.wantStatus || c.Reason != s.wantReason {
			t.Fatalf("step %d: after PublishReady(%s, %v) the Pod shows %+v, want status %s reason %s", i, s.grant, s.ready, c, s.wantStatus, s.wantReason)
		}
		if h.Ready() != (s.wantStatus == corev1.ConditionTrue) {
			t.Errorf("step %d: Ready() = %v while the Pod shows %s", i, h.Ready(), c.Status)
		}
	}
	// The patch merged into the status: the kubelet's fields and the readiness gate are intact.
	got := env.GetPod(t, "grant")
	if len(got.Spec.ReadinessGates) != 1 || got.Spec.ReadinessGates[0].ConditionType != PodConditionZygoteReady {
		t.Errorf("readiness gates after the patches: %+v", got.Spec.ReadinessGates)
	}
}

// ----------------------------------------------------------------------------------- scope

// Every reason the spec names for losing the scope, caused for real on the API server.
func TestIntegrationScopeLoss(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pod   kubeapi.GrantPod
		cause func(t *testing.T, env *kubeapi.Env)
		want  string
		also  []string // reasons that may come too, first
	}{{
		name:  "pod deleted",
		pod:   kubeapi.GrantPod{Name: "grant"},
		cause: func(t *testing.T, env *kubeapi.Env) { env.DeletePod(t, "grant") },
		want:  reasonPodDeleted,
	}, {
		name: "pod replaced",
		pod:  kubeapi.GrantPod{Name: "grant"},
		cause: func(t *testing.T, env *kubeapi.Env) {
			env.DeletePod(t, "grant")
			env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant"})
		},
		want: reasonPodReplaced,
		// A poll between the deletion and the new Pod sees it gone.
		also: []string{reasonPodDeleted},
	}, {
		name:  "pod terminating",
		pod:   kubeapi.GrantPod{Name: "grant", Finalizers: []string{"fiberd.io/test-keep"}},
		cause: func(t *testing.T, env *kubeapi.Env) { env.DeletePod(t, "grant") },
		want:  reasonPodTerminating,
	}, {
		name:  "namespace terminating",
		pod:   kubeapi.GrantPod{Name: "grant"},
		cause: func(t *testing.T, env *kubeapi.Env) { env.DeleteNamespace(t) },
		want:  reasonNamespaceTerminating,
	}, {
		name:  "resource claim deleted",
		pod:   kubeapi.GrantPod{Name: "grant", Claims: map[string]string{"gpu": "gpu-claim"}},
		cause: func(t *testing.T, env *kubeapi.Env) { env.DeleteResourceClaim(t, "gpu-claim") },
		want:  reasonClaimDeleted("gpu-claim"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			env := kubeapi.NewEnv(t)
			env.CreateServiceAccount(t, "fiberd")
			for _, claim := range tc.pod.Claims {
				env.CreateResourceClaim(t, claim)
			}
			tc.pod.ServiceAccount = "fiberd"
			pod := env.CreateGrantPod(t, tc.pod)
			h := newITHome(t, env, pod, itHomeOpts{})
			itWaitStored(t, h)

			// The scope is the Pod's, and a few quiet rounds lose nothing.
			scope := h.Scope()
			for _, want := range []core.ScopeClaim{
				{Name: "namespace", Value: env.Namespace}, {Name: "pod", Value: "grant"},
				{Name: "pod_uid", Value: string(pod.UID)}, {Name: "service_account", Value: "fiberd"},
				{Name: "node", Value: kubeapi.DefaultNode},
			} {
				if !slices.Contains(scope, want) {
					t.Errorf("Scope() = %v, missing %v", scope, want)
				}
			}
			for _, claim := range tc.pod.Claims {
				if !slices.Contains(scope, core.ScopeClaim{Name: "resource_claim", Value: claim}) {
					t.Errorf("Scope() = %v, missing resource_claim %s", scope, claim)
				}
			}
			time.Sleep(3 * itPoll)
			if got := h.reasons(); len(got) != 0 {
				t.Fatalf("scope lost before anything happened: %q", got)
			}
			if !h.Health().Healthy() {
				t.Fatal("unhealthy while the API server answers")
			}

			tc.cause(t, env)
			h.waitLost(t, tc.want)
			time.Sleep(3 * itPoll) // each reason is delivered once: later rounds add nothing new
			for _, got := range h.reasons() {
				if got != tc.want && !slices.Contains(tc.also, got) {
					t.Errorf("delivered %q besides %q", got, tc.want)
				}
			}
			counts := map[string]int{}
			for _, got := range h.reasons() {
				if counts[got]++; counts[got] > 1 {
					t.Errorf("reason %q delivered more than once: %q", got, h.reasons())
				}
			}
			if tc.pod.Finalizers != nil {
				env.RemoveFinalizers(t, "grant")
			}
		})
	}
}

// ----------------------------------------------------------------------------------- liveness

// The API server going away makes the health stale after the stale TTL, without a scope loss;
// coming back makes it healthy again. So for a Pod with a ResourceClaim as for one without (design
// decision 45): an outage is liveness, and claims that cannot be read because nothing can are not
// counted as unserved, however long it lasts. After it the claim is checked again, and its deletion
// then loses the scope.
func TestIntegrationLiveness(t *testing.T) {
	cp := kubeapi.Start(t, kubeapi.Options{})
	env := cp.NewEnv(t)
	env.CreateResourceClaim(t, "gpu")
	homes := []struct {
		name string
		h    *itHome
	}{
		{"without claims", newITHome(t, env, env.CreateGrantPod(t, kubeapi.GrantPod{Name: "plain"}), itHomeOpts{})},
		{"with a claim", newITHome(t, env, env.CreateGrantPod(t, kubeapi.GrantPod{Name: "claims", Claims: map[string]string{"gpu": "gpu"}}), itHomeOpts{})},
	}
	for _, p := range homes {
		itWaitStored(t, p.h)
		if !p.h.Health().Healthy() {
			t.Fatalf("%s: unhealthy while the API server answers", p.name)
		}
	}
	if !slices.Contains(homes[1].h.Scope(), core.ScopeClaim{Name: "resource_claim", Value: "gpu"}) {
		t.Fatalf("Scope() = %v, want the claim gpu in it", homes[1].h.Scope())
	}

	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for _, p := range homes {
		h := p.h
		lastBefore := h.Health().LastSync()
		itWaitFor(t, p.name+": the health to go stale with the API server stopped", func() bool { return !h.Health().Healthy() })
		last := h.Health().LastSync()
		if last.After(stopped) {
			t.Errorf("%s: a sync was marked at %v, after the API server stopped at %v", p.name, last, stopped)
		}
		if age := time.Since(last); age < itStaleTTL {
			t.Errorf("%s: stale %v after the last sync, before the stale TTL %v", p.name, age, itStaleTTL)
		}
		if last.Before(lastBefore) {
			t.Errorf("%s: LastSync went back from %v to %v", p.name, lastBefore, last)
		}
		// The first failure is logged at V(0); on a slow machine it may be a
		// round's timeout, and the refused connection a V(1) line after it.
		if h.logs.count("", "connection refused") == 0 {
			t.Errorf("%s: no log line tells the API server is unreachable; lines: %q", p.name, h.logs.all())
		} else if got, ok := h.logs.find("error", "what=pod"); ok {
			t.Logf("%s: operator sees: %s", p.name, got)
		}
	}
	// Down for twice the stale TTL more: had the claims been counted as unserved through the
	// outage, the Pod with a claim would have lost its scope by now.
	time.Sleep(2 * itStaleTTL)
	for _, p := range homes {
		if got := p.h.reasons(); len(got) != 0 {
			t.Errorf("%s: an API server outage of %v lost the scope: %q", p.name, time.Since(stopped).Round(time.Second), got)
		}
	}

	if err := cp.Restart(cp.Options()); err != nil {
		t.Fatal(err)
	}
	for _, p := range homes {
		itWaitFor(t, p.name+": the health to recover after the API server restarted", p.h.Health().Healthy)
		if got := p.h.reasons(); len(got) != 0 {
			t.Errorf("%s: an API server outage lost the scope: %q", p.name, got)
		}
	}
	env.DeleteResourceClaim(t, "gpu")
	homes[1].h.waitLost(t, reasonClaimDeleted("gpu"))
}

// ----------------------------------------------------------------------------------- claim 404s

// The resource.k8s.io version the home discovered at start stops being served under it: an
// upgrade that drops it, the group switched off. A claim read then gets a 404 that is not the
// claim's; the home asks discovery again and decides: it reads the claim at the version served
// now, or counts the claims as not served, and never takes the 404 for a deleted claim. When the
// version comes back, the claims are read again, and a real deletion still loses the scope.
func TestIntegrationClaimVersionChangesUnderTheHome(t *testing.T) {
	cp := kubeapi.Start(t, kubeapi.Options{})
	env := cp.NewEnv(t)
	env.CreateResourceClaim(t, "gpu")
	pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant", Claims: map[string]string{"gpu": "gpu"}})
	var w itWire
	// A stale TTL longer than the control plane's restarts: no claims count runs out here.
	h := newITHome(t, env, pod, itHomeOpts{wire: &w, staleTTL: 2 * time.Minute})
	itWaitStored(t, h)
	claimReads := func(version string) int {
		return w.count(http.MethodGet, "/apis/resource.k8s.io/"+version+"/namespaces/"+env.Namespace+"/resourceclaims/gpu")
	}
	itWaitFor(t, "a claim read at v1", func() bool { return claimReads("v1") > 0 })

	restart := func(rc string) {
		t.Helper()
		if err := cp.Restart(kubeapi.Options{RuntimeConfig: rc}); err != nil {
			t.Fatal(err)
		}
	}
	noLoss := func(when string) {
		t.Helper()
		if got := h.reasons(); len(got) != 0 {
			t.Fatalf("%s: scope lost %q", when, got)
		}
	}

	discoveries := func() int { return w.count(http.MethodGet, "/apis/resource.k8s.io") }

	// An upgrade drops v1 and serves v1beta2: the same claim, read at v1beta2.
	asked := discoveries()
	restart("resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true")
	itWaitKept(t, h, "a claim read at v1beta2", func() bool { return claimReads("v1beta2") >= 3 })
	noLoss("v1 no longer served, v1beta2 served")
	if discoveries() == asked {
		t.Error("no discovery request after the version went away")
	}

	// The group switched off: the claims are not served, which is no deletion.
	asked = discoveries()
	restart("resource.k8s.io/v1=false")
	itWaitKept(t, h, "the home to find the group gone", func() bool {
		return h.logs.count("", ErrNoResourceClaims.Error()) > 0 && discoveries() > asked+2
	})
	noLoss("resource.k8s.io switched off")
	for _, l := range h.logs.all() {
		if strings.Contains(l, ErrNoResourceClaims.Error()) {
			t.Logf("operator sees: %s", l)
			break
		}
	}

	// Switched on again: read at v1 once more, and the claims' recovery logged.
	before, recovered := claimReads("v1"), h.logs.count("info", "works again", "what=resource claims")
	restart("resource.k8s.io/v1=true")
	itWaitKept(t, h, "a claim read at v1 again", func() bool { return claimReads("v1") >= before+3 })
	itWaitKept(t, h, "the claims readable again in the log", func() bool {
		return h.logs.count("info", "works again", "what=resource claims") > recovered
	})
	noLoss("resource.k8s.io back")

	env.DeleteResourceClaim(t, "gpu")
	h.waitLost(t, reasonClaimDeleted("gpu"))
}

// A 404 from something in front of the API server, a proxy that does not know the claims' path,
// is neither a deleted claim nor the group gone: the home says what answered, keeps the scope, and
// sees the claim again once the proxy passes it on. A real deletion passes through the proxy as
// the API server's own 404, naming the claim, and loses the scope.
func TestIntegrationProxy404IsNoDeletedClaim(t *testing.T) {
	env := kubeapi.NewEnv(t)
	env.CreateResourceClaim(t, "gpu")
	pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant", Claims: map[string]string{"gpu": "gpu"}})

	// The proxy holds the credentials, as `kubectl proxy` does, and answers a plain 404 for the
	// claims' path while blocking is on.
	upstream, err := url.Parse(env.CP.URL())
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(env.CP.Config())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.Transport = tr
	var blocking atomic.Bool
	var blocked atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if blocking.Load() && strings.Contains(r.URL.Path, "/resourceclaims/") {
			blocked.Add(1)
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	h := newITHome(t, env, pod, itHomeOpts{cfg: &rest.Config{Host: proxy.URL}, staleTTL: 2 * time.Minute})
	itWaitStored(t, h)
	blocking.Store(true)
	itWaitKept(t, h, "claim reads answered 404 by the proxy", func() bool { return blocked.Load() >= 3 })
	itWaitKept(t, h, "a log line saying what answered", func() bool { return h.logs.count("", "in front of the API server") > 0 })
	if l, ok := h.logs.find("error", "what=resource claims"); ok {
		t.Logf("operator sees: %s", l)
	}
	if got := h.reasons(); len(got) != 0 {
		t.Fatalf("a proxy's 404 lost the scope: %q", got)
	}

	recovered := h.logs.count("info", "works again", "what=resource claims")
	blocking.Store(false)
	itWaitKept(t, h, "the claims readable again in the log", func() bool {
		return h.logs.count("info", "works again", "what=resource claims") > recovered
	})
	env.DeleteResourceClaim(t, "gpu")
	h.waitLost(t, reasonClaimDeleted("gpu"))
	if got := h.reasons(); len(got) != 1 {
		t.Errorf("delivered %q, want only the claim's deletion", got)
	}
}

// ----------------------------------------------------------------------------------- endpoint

// EndpointHost waits for the address a kubelet writes after the home started, and picks the
// configured family.
func TestIntegrationEndpointHost(t *testing.T) {
	for _, tc := range []struct {
		family endpoint.Family
		want   string
	}{
		{endpoint.Inet4, "10.9.8.7"},
		{endpoint.Inet6, "fd00::7"},
	} {
		t.Run(tc.family.String(), func(t *testing.T) {
			env := kubeapi.NewEnv(t)
			pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant"})
			// fiberd asks before Run; the home must not need Run for it.
			h := newITHome(t, env, pod, itHomeOpts{family: tc.family, noRun: true})
			got := make(chan string, 1)
			go func() { got <- h.EndpointHost() }()
			select {
			case ip := <-got:
				t.Fatalf("EndpointHost returned %q before the Pod had an address", ip)
			case <-time.After(time.Second):
			}
			env.SetPodIPs(t, "grant", "10.9.8.7", "fd00::7")
			select {
			case ip := <-got:
				if ip != tc.want {
					t.Fatalf("EndpointHost() = %q, want %q", ip, tc.want)
				}
			case <-time.After(itWait):
				t.Fatalf("EndpointHost did not return within %v of the address being written", itWait)
			}
		})
	}
}

// ----------------------------------------------------------------------------------- RBAC

// itRBACObjects reads deploy/kubernetes/rbac.yaml.
func itRBACObjects(t *testing.T) (sa *corev1.ServiceAccount, roles []*rbacv1.Role, clusterRoles []*rbacv1.ClusterRole, bindings []*rbacv1.RoleBinding) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "kubernetes", "rbac.yaml")
	if _, err := os.Stat(path); err != nil {
		path = filepath.Join("..", "..", "..", "deploy", "kubernetes", "rbac.yaml")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		raw, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.Role:
			roles = append(roles, o)
		case *rbacv1.ClusterRole:
			clusterRoles = append(clusterRoles, o)
		case *rbacv1.RoleBinding:
			bindings = append(bindings, o)
		default:
			t.Fatalf("%s: unexpected %T; a grant Pod's RBAC needs no cluster-wide binding", path, obj)
		}
	}
	if sa == nil || len(roles) == 0 || len(bindings) == 0 {
		t.Fatalf("%s: want a ServiceAccount, a Role and RoleBindings", path)
	}
	return sa, roles, clusterRoles, bindings
}

// itApplyRBAC creates rbac.yaml's objects in env's namespace, without the rules drop says
// (resource/verb), and returns the ServiceAccount's name. ClusterRoles get a name unique to the
// namespace, so tests do not share them.
func itApplyRBAC(t *testing.T, env *kubeapi.Env, drop string) string {
	t.Helper()
	ctx := itCtx(t)
	sa, roles, clusterRoles, bindings := itRBACObjects(t)
	keep := func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
		var out []rbacv1.PolicyRule
		for _, r := range rules {
			var resources []string
			for _, res := range r.Resources {
				verbs := slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return res+"/"+v == drop })
				if len(verbs) == len(r.Verbs) {
					resources = append(resources, res)
				}
			}
			if len(resources) > 0 {
				r.Resources = resources
				out = append(out, r)
			}
		}
		return out
	}
	admin := env.Admin
	if _, err := admin.CoreV1().ServiceAccounts(env.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, r := range roles {
		r.Rules = keep(r.Rules)
		if _, err := admin.RbacV1().Roles(env.Namespace).Create(ctx, r, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	renamed := map[string]string{}
	for _, cr := range clusterRoles {
		cr.Rules = keep(cr.Rules)
		renamed[cr.Name] = cr.Name + "-" + env.Namespace
		cr.Name = renamed[cr.Name]
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range bindings {
		if b.RoleRef.Kind == "ClusterRole" {
			b.RoleRef.Name = renamed[b.RoleRef.Name]
		}
		if _, err := admin.RbacV1().RoleBindings(env.Namespace).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return sa.Name
}

// The home runs with its Pod's own bound token and the project's minimal RBAC; a missing
// permission shows as a log line naming the verb and the resource.
func TestIntegrationRBAC(t *testing.T) {
	for _, tc := range []struct {
		drop string   // "resource/verb" left out of rbac.yaml; "" keeps it whole
		want []string // words of the log line an operator then reads
	}{
		{drop: ""},
		{drop: "pods/get", want: []string{`cannot get resource "pods"`}},
		{drop: "pods/status/patch", want: []string{`cannot patch resource "pods/status"`}},
		{drop: "namespaces/get", want: []string{`cannot get resource "namespaces"`}},
		{drop: "resourceclaims/get", want: []string{`cannot get resource "resourceclaims"`, `"resource.k8s.io"`}},
	} {
		name := "rbac.yaml"
		if tc.drop != "" {
			name = "without " + tc.drop
		}
		t.Run(name, func(t *testing.T) {
			env := kubeapi.NewEnv(t)
			sa := itApplyRBAC(t, env, tc.drop)
			env.CreateResourceClaim(t, "gpu-claim")
			pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "grant", ServiceAccount: sa, Claims: map[string]string{"gpu": "gpu-claim"}})
			cfg := env.ServiceAccountConfig(t, sa, kubeapi.TokenOptions{Pod: pod})
			h := newITHome(t, env, pod, itHomeOpts{cfg: cfg})
			ctx := itCtx(t)
			publishErr := h.PublishReady(ctx, "g1", true)

			if tc.drop == "" {
				if publishErr != nil {
					t.Fatalf("PublishReady with rbac.yaml: %v", publishErr)
				}
				if c := itCondition(t, env, "grant"); c == nil || c.Status != corev1.ConditionTrue {
					t.Fatalf("the Pod shows %+v after PublishReady(true)", c)
				}
				itWaitStored(t, h)
				time.Sleep(3 * itPoll)
				if l, ok := h.logs.find("error"); ok {
					t.Errorf("with rbac.yaml the home logs an error: %s", l)
				}
				// Every check the rules are for still works under them.
				env.DeleteResourceClaim(t, "gpu-claim")
				h.waitLost(t, reasonClaimDeleted("gpu-claim"))
				env.DeleteNamespace(t)
				h.waitLost(t, reasonNamespaceTerminating)
				return
			}

			var line string
			itWaitFor(t, fmt.Sprintf("a log line with %q", tc.want), func() bool {
				l, ok := h.logs.find("error", tc.want...)
				line = l
				return ok
			})
			t.Logf("operator sees: %s", line)
			if tc.drop == "pods/status/patch" && (publishErr == nil || !itContainsAll(publishErr.Error(), tc.want...)) {
				t.Errorf("PublishReady without the patch permission = %v, want an error with %q", publishErr, tc.want)
			}
			// Claims the cluster refuses to serve for the stale TTL lose the scope, by the spec;
			// no other missing permission may.
			for _, got := range h.reasons() {
				if tc.drop != "resourceclaims/get" || got != reasonClaimsUnreadable {
					t.Errorf("without %s the scope was lost: %q", tc.drop, got)
				}
			}
		})
	}
}
