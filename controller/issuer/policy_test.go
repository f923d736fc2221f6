package issuer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/pool"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
)

const (
	testIssuer   = "https://fiberd-issuer.fiberd-system.svc"
	testTemplate = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	oldTemplate  = "counter@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	poolUID      = "5d0c8a3e-aaaa-4bbb-8ccc-0123456789ab"
	podUID       = "9e1f2a3b-dddd-4eee-8fff-0123456789ab"
)

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, authenticationv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func testPool(mut func(*v1alpha1.FiberPool)) *v1alpha1.FiberPool {
	wb := resource.MustParse("64Mi")
	p := &v1alpha1.FiberPool{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "apps", UID: poolUID},
		Spec: v1alpha1.FiberPoolSpec{
			Template:   v1alpha1.TemplateSpec{Name: testTemplate, Image: "fiberd:dev"},
			Replicas:   ptr.To[int32](2),
			FibersMax:  8,
			FibersWarm: 2,
			WBudget:    &wb,
			Lease:      &metav1.Duration{Duration: 4 * time.Minute},
		},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

// testPoolPod is grant Pod web-0 as the pool's GrantPod builds it, scheduled on node-a.
func testPoolPod(t *testing.T, mut func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	p, err := pool.GrantPod(testPool(nil), 0, pool.Shape{IssuerURL: testIssuer})
	if err != nil {
		t.Fatal(err)
	}
	p.UID = podUID
	p.Spec.NodeName = "node-a"
	if mut != nil {
		mut(p)
	}
	return p
}

func TestPoolPolicy(t *testing.T) {
	other := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "x", Controller: ptr.To(true)}
	for _, tc := range []struct {
		name     string
		pod      func(*corev1.Pod)
		pool     *v1alpha1.FiberPool // nil: no pool
		livePool *v1alpha1.FiberPool // what Live holds besides
		want     int                 // 0: terms
		reason   string
		terms    shared.Terms
	}{
		{name: "pool pod", pool: testPool(nil), terms: shared.Terms{Template: testTemplate,
			Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, Lease: 4 * time.Minute}},
		{name: "draining pod renews", pool: testPool(nil), pod: func(p *corev1.Pod) { p.Labels["fiberd.io/serving"] = "false" },
			terms: shared.Terms{Template: testTemplate, Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, Lease: 4 * time.Minute}},
		{name: "pod of an earlier template keeps it", pool: testPool(nil), pod: func(p *corev1.Pod) { p.Annotations[pool.AnnotationTemplate] = oldTemplate },
			terms: shared.Terms{Template: oldTemplate, Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, Lease: 4 * time.Minute}},
		{name: "pool with defaults", pool: testPool(func(p *v1alpha1.FiberPool) { p.Spec.WBudget, p.Spec.Lease, p.Spec.FibersWarm = nil, nil, 0 }),
			terms: shared.Terms{Template: testTemplate, Fibers: core.Fibers{Max: 8}}},
		{name: "pool only live", livePool: testPool(nil), terms: shared.Terms{Template: testTemplate,
			Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, Lease: 4 * time.Minute}},
		{name: "no pool label", pool: testPool(nil), pod: func(p *corev1.Pod) { delete(p.Labels, pool.LabelPool) }, want: 403, reason: "no fiberd.io/pool label"},
		{name: "no owner", pool: testPool(nil), pod: func(p *corev1.Pod) { p.OwnerReferences = nil }, want: 403, reason: "no controller owner reference"},
		{name: "owned by another kind", pool: testPool(nil), pod: func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{other} }, want: 403, reason: "controlled by ReplicaSet web"},
		{name: "label names another pool", pool: testPool(nil), pod: func(p *corev1.Pod) { p.Labels[pool.LabelPool] = "db" }, want: 403, reason: "not by FiberPool db"},
		{name: "pool gone", want: 403, reason: "FiberPool web is gone"},
		{name: "pool replaced", pool: testPool(func(p *v1alpha1.FiberPool) { p.UID = "another" }), want: 403, reason: "earlier FiberPool web"},
		{name: "pool deleting", pool: testPool(func(p *v1alpha1.FiberPool) {
			p.DeletionTimestamp = &metav1.Time{Time: t0}
			p.Finalizers = []string{"test"}
		}), want: 403, reason: "being deleted"},
		{name: "no template yet", pool: testPool(nil), pod: func(p *corev1.Pod) { delete(p.Annotations, pool.AnnotationTemplate) }, want: 404, reason: "no grant assigned"},
		{name: "bad template", pool: testPool(nil), pod: func(p *corev1.Pod) { p.Annotations[pool.AnnotationTemplate] = "x" }, want: 403, reason: "annotation fiberd.io/template"},
		{name: "fractional wBudget", pool: testPool(func(p *v1alpha1.FiberPool) { q := resource.MustParse("0.5"); p.Spec.WBudget = &q }), want: 403, reason: "wBudget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := testScheme(t)
			if tc.pool != nil {
				cache = cache.WithObjects(tc.pool)
			}
			live := testScheme(t)
			if tc.livePool != nil {
				live = live.WithObjects(tc.livePool)
			}
			pol := PoolPolicy{Pools: cache.Build(), Live: live.Build()}
			terms, err := pol.Terms(context.Background(), testPoolPod(t, tc.pod))
			if tc.want == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if terms != tc.terms {
					t.Fatalf("terms %+v, want %+v", terms, tc.terms)
				}
				return
			}
			var rf *shared.Refusal
			if !errors.As(err, &rf) || rf.Status != tc.want || !strings.Contains(rf.Reason, tc.reason) {
				t.Fatalf("Terms = %v, want a %d refusal about %q", err, tc.want, tc.reason)
			}
		})
	}
}

// TestPoolPolicyAPIDown: a pool that cannot be read is a 503, so fiberd retries.
func TestPoolPolicyAPIDown(t *testing.T) {
	down := interceptor.NewClient(testScheme(t).Build().(client.WithWatch), interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errors.New("connection refused")
		},
	})
	_, err := PoolPolicy{Pools: down}.Terms(context.Background(), testPoolPod(t, nil))
	var rf *shared.Refusal
	if !errors.As(err, &rf) || rf.Status != http.StatusServiceUnavailable {
		t.Fatalf("Terms = %v, want 503", err)
	}
}

// TestIssuerMintsFromPool runs the whole exchange on a fake API server: the grant fiberd fetches
// verifies against the JWKS the issuer publishes and carries the pool's terms for exactly the
// Pod; a Pod of no pool is refused.
func TestIssuerMintsFromPool(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(t0)
	orphan := testPoolPod(t, func(p *corev1.Pod) {
		p.Name, p.UID, p.OwnerReferences = "orphan", "1a2b3c4d-0000-4000-8000-000000000000", nil
	})
	bound := map[string]*corev1.Pod{"token-web-0": testPoolPod(t, nil), "token-orphan": orphan}
	base := testScheme(t).WithObjects(testPool(nil), bound["token-web-0"], orphan).Build()
	live := interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			tr, ok := obj.(*authenticationv1.TokenReview)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			pod, ok := bound[tr.Spec.Token]
			if !ok || !slicesEqual(tr.Spec.Audiences, []string{testIssuer}) {
				tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid token"}
				return nil
			}
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
				User: authenticationv1.UserInfo{Username: "system:serviceaccount:apps:fiberd", Extra: map[string]authenticationv1.ExtraValue{
					shared.ExtraPodName: {pod.Name}, shared.ExtraPodUID: {string(pod.UID)}, shared.ExtraNodeName: {"node-a"},
				}}}
			return nil
		},
	})
	iss, err := New(Config{IssuerURL: testIssuer, Namespace: "fiberd-system", Clock: clk}, live, base)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, testIssuer+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		iss.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := get(shared.PathGrant, "token-web-0"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("before the keys are loaded: %d, want 503", rec.Code)
	}
	if iss.Ready(nil) == nil {
		t.Fatal("ready before the keys are loaded")
	}
	if err := iss.Ring().Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := iss.Ready(nil); err != nil {
		t.Fatal(err)
	}
	rec := get(shared.PathGrant, "token-web-0")
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", rec.Code, rec.Body)
	}
	keys, err := grant.NewStaticKeys(get(shared.PathJWKS, "").Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: testIssuer, Audience: "web-0", Keys: keys, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(ctx, rec.Body.Bytes())
	if err != nil {
		t.Fatalf("the grant does not verify against the issuer's JWKS: %v", err)
	}
	if g.UID != podUID || g.Template != testTemplate || g.Fibers != (core.Fibers{Max: 8, Warm: 2}) ||
		g.WBudget != 64<<20 || g.Lease() != 4*time.Minute || !g.IssuedAt.Equal(t0) {
		t.Fatalf("grant %+v: want the pool's terms for pod %s", g, podUID)
	}
	if rec := get(shared.PathGrant, "token-orphan"); rec.Code != http.StatusForbidden {
		t.Fatalf("a Pod of no pool: %d (%s), want 403", rec.Code, rec.Body)
	}
	if rec := get(shared.PathGrant, "forged"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("a token the review refuses: %d, want 401", rec.Code)
	}
	if got := counterValue(t, "403"); got < 1 {
		t.Errorf("fiberd_issuer_grant_requests_total{code=\"403\"} = %v after a refusal", got)
	}
	if got := counterValue(t, "200"); got < 1 {
		t.Errorf("fiberd_issuer_grant_requests_total{code=\"200\"} = %v after a grant", got)
	}

	var cur v1alpha1.FiberPool
	if err := base.Get(ctx, client.ObjectKey{Namespace: "apps", Name: "web"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Lease = &metav1.Duration{Duration: 2 * time.Hour}
	if err := base.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	if rec := get(shared.PathGrant, "token-web-0"); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "longest") {
		t.Fatalf("a pool lease over MaxLease: %d (%s), want 403 naming the bound", rec.Code, rec.Body)
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// counterValue is fiberd_issuer_grant_requests_total{code}.
func counterValue(t *testing.T, code string) float64 {
	t.Helper()
	var m dto.Metric
	if err := grantRequests.WithLabelValues(code).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
