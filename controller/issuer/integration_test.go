//go:build integration

package issuer

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/pool"
	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
	"fiberd.io/fiberd/test/kubeapi"
)

// TestMain starts no control plane itself: the first test that needs one does (kubeapi.Shared),
// and kubeapi.Main stops it after the last. goleak is not run under the integration tag, since
// client-go keeps connection goroutines; the unit tests keep their leak check.
func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }

// liveClient is an uncached client of the control plane with the issuer's scheme.
func liveClient(t *testing.T, env *kubeapi.Env) client.Client {
	t.Helper()
	s := scheme(t)
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.CP.Config(), client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installCRD applies deploy/controller's CRD and waits until it is established.
func installCRD(t *testing.T, c client.Client) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "controller", "fiberd.io_fiberpools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Create(ctx, &crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("crd: %v", err)
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var fp v1alpha1.FiberPoolList
		return c.List(ctx, &fp) == nil, nil
	})
	if err != nil {
		t.Fatalf("crd not served: %v", err)
	}
}

// fixture is one namespace with a FiberPool "web", its grant Pod web-0 (made by pool.GrantPod,
// bound to a node since no scheduler runs), the service account "fiberd", and an issuer.
type fixture struct {
	env  *kubeapi.Env
	c    client.Client
	fp   *v1alpha1.FiberPool
	pod  *corev1.Pod
	clk  *clocktesting.FakeClock
	iss  *Issuer
	ctx  context.Context
	keys string // the keys Secret's namespace
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := kubeapi.NewEnv(t)
	c := liveClient(t, env)
	installCRD(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{env: env, c: c, ctx: ctx, clk: clocktesting.NewFakeClock(time.Now().Truncate(time.Second)), keys: env.Namespace}
	env.CreateServiceAccount(t, "fiberd")
	f.fp = testPool(func(p *v1alpha1.FiberPool) {
		p.Namespace, p.UID = env.Namespace, ""
	})
	if err := c.Create(ctx, f.fp); err != nil {
		t.Fatal(err)
	}
	pod, err := pool.GrantPod(f.fp, 0, pool.Shape{IssuerURL: testIssuer})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = kubeapi.DefaultNode
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	f.pod = pod
	f.iss = f.newIssuer(t)
	return f
}

// newIssuer is an issuer on the fixture's keys Secret and clock, as a replica or a restart is.
func (f *fixture) newIssuer(t *testing.T) *Issuer {
	t.Helper()
	iss, err := New(Config{IssuerURL: testIssuer, Namespace: f.keys, Clock: f.clk}, f.c, f.c)
	if err != nil {
		t.Fatal(err)
	}
	if err := iss.Ring().Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	return iss
}

// token is a real bound token of pod, as the kubelet projects into it, for the issuer's audience.
func (f *fixture) token(t *testing.T, pod *corev1.Pod) string {
	return f.env.Token(t, pod.Spec.ServiceAccountName, kubeapi.TokenOptions{Pod: pod, Audiences: []string{testIssuer}})
}

func (f *fixture) get(iss *Issuer, path, token string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, testIssuer+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	iss.Handler().ServeHTTP(rec, req)
	return rec
}

// verify checks a grant against the JWKS iss publishes, as fiberd in web-0 does.
func (f *fixture) verify(t *testing.T, iss *Issuer, tok []byte) {
	t.Helper()
	keys, err := grant.NewStaticKeys(f.get(iss, shared.PathJWKS, "").Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: testIssuer, Audience: f.pod.Name, Keys: keys, Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(f.ctx, tok)
	if err != nil {
		t.Fatalf("the grant does not verify: %v", err)
	}
	if g.UID != string(f.pod.UID) || g.Template != testTemplate || g.Fibers.Max != 8 || g.Fibers.Warm != 2 || g.WBudget != 64<<20 || g.Lease() != 4*time.Minute {
		t.Fatalf("grant %+v: want the pool's terms for pod UID %s", g, f.pod.UID)
	}
}

// TestGrantForAPoolPod: a real TokenReview of a real bound token of a pool's grant Pod gets the
// pool's grant; a Pod of no pool is refused; a terminating, then deleted, Pod is refused; and a
// Pod whose pool is deleted is refused.
func TestGrantForAPoolPod(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, f.pod)
	rec := f.get(f.iss, shared.PathGrant, tok)
	if rec.Code != http.StatusOK {
		t.Fatalf("grant Pod of pool: %d %s", rec.Code, rec.Body)
	}
	f.verify(t, f.iss, rec.Body.Bytes())

	if rec := f.get(f.iss, shared.PathGrant, f.env.Token(t, "fiberd", kubeapi.TokenOptions{Audiences: []string{"https://elsewhere.example"}, Pod: f.pod})); rec.Code != http.StatusUnauthorized {
		t.Errorf("a token for another audience: %d %s, want 401", rec.Code, rec.Body)
	}

	stray := f.env.CreateGrantPod(t, kubeapi.GrantPod{Name: "stray", ServiceAccount: "fiberd",
		Labels: map[string]string{pool.LabelPool: "web"}})
	if rec := f.get(f.iss, shared.PathGrant, f.token(t, stray)); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "no controller owner reference") {
		t.Errorf("a Pod of no pool: %d %s, want 403", rec.Code, rec.Body)
	}

	held := f.env.CreateGrantPod(t, kubeapi.GrantPod{Name: "held", ServiceAccount: "fiberd", Finalizers: []string{"fiberd.io/test"}})
	held.Labels = pool.Selector("web")
	held.OwnerReferences = f.pod.OwnerReferences
	held.Annotations = f.pod.Annotations
	if err := f.c.Update(f.ctx, held); err != nil {
		t.Fatal(err)
	}
	heldTok := f.token(t, held)
	if rec := f.get(f.iss, shared.PathGrant, heldTok); rec.Code != http.StatusOK {
		t.Fatalf("a second Pod of the pool: %d %s", rec.Code, rec.Body)
	}
	f.env.DeletePod(t, "held")
	if rec := f.get(f.iss, shared.PathGrant, heldTok); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "terminating") {
		t.Errorf("a terminating Pod: %d %s, want 403 terminating", rec.Code, rec.Body)
	}
	f.env.RemoveFinalizers(t, "held")
	err := wait.PollUntilContextCancel(f.ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(f.c.Get(ctx, client.ObjectKeyFromObject(held), &corev1.Pod{})), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec := f.get(f.iss, shared.PathGrant, heldTok); rec.Code != http.StatusForbidden && rec.Code != http.StatusUnauthorized {
		t.Errorf("a deleted Pod: %d %s, want a refusal", rec.Code, rec.Body)
	}

	if err := f.c.Delete(f.ctx, f.fp); err != nil {
		t.Fatal(err)
	}
	// No garbage collector runs here, so web-0 outlives its pool.
	if rec := f.get(f.iss, shared.PathGrant, tok); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "is gone") {
		t.Errorf("a Pod whose pool is deleted: %d %s, want 403", rec.Code, rec.Body)
	}
}

func publishedKids(t *testing.T, f *fixture, iss *Issuer) []string {
	t.Helper()
	rec := f.get(iss, shared.PathJWKS, "")
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(rec.Body.Bytes(), &set); err != nil {
		t.Fatalf("JWKS %d %s: %v", rec.Code, rec.Body, err)
	}
	var kids []string
	for _, k := range set.Keys {
		kids = append(kids, k.KeyID)
	}
	slices.Sort(kids)
	return kids
}

// TestKeysSurviveARestartAndRotate: a second issuer on the same Secret (a restart, or another
// replica) serves the same keys; a rotation publishes the next key before it signs and keeps the
// old one published, so a grant signed before the rotation still verifies after it.
func TestKeysSurviveARestartAndRotate(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, f.pod)
	before := f.get(f.iss, shared.PathGrant, tok)
	if before.Code != http.StatusOK {
		t.Fatalf("%d %s", before.Code, before.Body)
	}
	first := publishedKids(t, f, f.iss)
	if len(first) != 1 {
		t.Fatalf("a new ring publishes %v, want one key", first)
	}

	restarted := f.newIssuer(t)
	if got := publishedKids(t, f, restarted); !slices.Equal(got, first) {
		t.Fatalf("after a restart the issuer publishes %v, want %v", got, first)
	}
	f.verify(t, restarted, before.Body.Bytes())

	f.clk.Step(DefaultRotationPeriod - DefaultPrepublish)
	if err := restarted.Ring().Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.iss.Ring().Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	both := publishedKids(t, f, f.iss)
	if len(both) != 2 || !slices.Equal(both, publishedKids(t, f, restarted)) {
		t.Fatalf("after the next key was made: the first issuer publishes %v, the second %v; want the same two", both, publishedKids(t, f, restarted))
	}
	ks, _ := f.iss.Ring().KeySet()
	if ks.Signer().KeyID() != first[0] {
		t.Fatal("the next key signs before its prepublish time")
	}

	f.clk.Step(DefaultPrepublish)
	after := f.get(f.iss, shared.PathGrant, tok)
	if after.Code != http.StatusOK {
		t.Fatalf("%d %s", after.Code, after.Body)
	}
	ks, _ = f.iss.Ring().KeySet()
	if ks.Signer().KeyID() == first[0] {
		t.Fatal("the next key does not sign at its time")
	}
	f.verify(t, f.iss, after.Body.Bytes())
	f.verify(t, f.iss, before.Body.Bytes()) // the old key is still published

	f.clk.Step(DefaultMaxLease + DefaultMargin)
	if err := f.iss.Ring().Sync(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := publishedKids(t, f, f.iss); len(got) != 1 || got[0] == first[0] {
		t.Fatalf("after the retention the issuer publishes %v, want the new key only", got)
	}
	var sec corev1.Secret
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.keys, Name: DefaultSecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sec.Data[SecretDataKey]), first[0]) {
		t.Fatal("the retired key is still in the Secret")
	}
}
