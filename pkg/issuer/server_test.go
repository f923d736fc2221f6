package issuer

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

const (
	testIssuer   = "https://issuer.example"
	testToken    = "header.bound-token.sig"
	testTemplate = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testUID      = "0b7f1c2e-1111-4222-8333-944455556666"
)

var testNow = time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)

func testPod(mut func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-0", Namespace: "ns", UID: types.UID(testUID)},
		Spec:       corev1.PodSpec{ServiceAccountName: "fiberd", NodeName: "node-a"},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

// swapKeys is Keys whose set a test replaces, as a rotating ring does.
type swapKeys struct{ set atomic.Pointer[KeySet] }

func (s *swapKeys) KeySet() (*KeySet, error) {
	if ks := s.set.Load(); ks != nil {
		return ks, nil
	}
	return nil, errors.New("not loaded")
}

type fixture struct {
	srv  *Server
	keys *swapKeys
	log  *logtest.Recorder
}

// newFixture serves pods with a TokenReview that binds the token to
// testPod (extra may add or change the review's extra) and the given policy.
func newFixture(t *testing.T, policy Policy, extra map[string]authenticationv1.ExtraValue, pods ...runtime.Object) *fixture {
	t.Helper()
	kube := fake.NewClientset(pods...)
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		out := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		ex := map[string]authenticationv1.ExtraValue{ExtraPodName: {"pool-0"}, ExtraPodUID: {testUID}}
		for k, v := range extra {
			ex[k] = v
		}
		out.Status = authenticationv1.TokenReviewStatus{
			Authenticated: out.Spec.Token == testToken,
			Audiences:     []string{testIssuer},
			User:          authenticationv1.UserInfo{Username: "system:serviceaccount:ns:fiberd", Extra: ex},
		}
		return true, out, nil
	})
	f := &fixture{keys: &swapKeys{}, log: &logtest.Recorder{}}
	f.keys.set.Store(mustKeySet(t, "k1"))
	var err error
	f.srv, err = New(Config{
		IssuerURL: testIssuer,
		Keys:      f.keys,
		Policy:    policy,
		Cluster:   clientset{kube},
		MaxLease:  time.Hour,
		Clock:     clocktesting.NewFakePassiveClock(testNow),
		Logger:    f.log.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func mustKeySet(t *testing.T, kid string, more ...jose.JSONWebKey) *KeySet {
	t.Helper()
	k, err := grant.GenerateKey("EdDSA", kid)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := NewKeySet(k, more...)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func (f *fixture) get(path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, testIssuer+path, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req)
	return rec
}

// verify checks tok against the JWKS the server publishes now.
func (f *fixture) verify(t *testing.T, tok []byte) core.Grant {
	t.Helper()
	keys, err := grant.NewStaticKeys(f.get(PathJWKS).Body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{
		Issuer: testIssuer, Audience: "pool-0", Keys: keys,
		Clock: clocktesting.NewFakePassiveClock(testNow),
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(context.Background(), tok)
	if err != nil {
		t.Fatalf("the grant does not verify against the published JWKS: %v", err)
	}
	return g
}

func fixedTerms(t Terms) Policy {
	return PolicyFunc(func(context.Context, *corev1.Pod) (Terms, error) { return t, nil })
}

func TestTermsMintedForThePod(t *testing.T) {
	var seen *corev1.Pod
	policy := PolicyFunc(func(_ context.Context, pod *corev1.Pod) (Terms, error) {
		seen = pod
		return Terms{Template: testTemplate, Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, Lease: 90 * time.Second}, nil
	})
	f := newFixture(t, policy, nil, testPod(nil))
	rec := f.get(PathGrant)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", rec.Code, rec.Body)
	}
	if seen == nil || seen.Spec.NodeName != "node-a" {
		t.Fatalf("the policy was not handed the Pod read from the API server: %+v", seen)
	}
	g := f.verify(t, rec.Body.Bytes())
	want := core.Grant{UID: testUID, Issuer: testIssuer, Audience: "pool-0", Template: testTemplate,
		Fibers: core.Fibers{Max: 8, Warm: 2}, WBudget: 64 << 20, IssuedAt: testNow, Expiry: testNow.Add(90 * time.Second)}
	g.Token = nil
	g.MinTier = ""
	if g.UID != want.UID || g.Audience != want.Audience || g.Template != want.Template || g.Fibers != want.Fibers ||
		g.WBudget != want.WBudget || !g.IssuedAt.Equal(want.IssuedAt) || !g.Expiry.Equal(want.Expiry) {
		t.Fatalf("grant %+v, want %+v", g, want)
	}
	if !strings.Contains(f.log.String(), "node-a") || !strings.Contains(f.log.String(), `"kid"="k1"`) {
		t.Errorf("the grant's log line does not name its node and kid:\n%s", f.log.String())
	}
}

func TestRefusals(t *testing.T) {
	ok := fixedTerms(Terms{Template: testTemplate, Fibers: core.Fibers{Max: 1}})
	for _, tc := range []struct {
		name   string
		policy Policy
		extra  map[string]authenticationv1.ExtraValue
		pod    *corev1.Pod
		want   int
		reason string
	}{
		{name: "policy not yet", policy: PolicyFunc(func(context.Context, *corev1.Pod) (Terms, error) {
			return Terms{}, NotYet("pool not ready")
		}), pod: testPod(nil), want: 404, reason: "pool not ready"},
		{name: "policy refuses", policy: PolicyFunc(func(context.Context, *corev1.Pod) (Terms, error) {
			return Terms{}, Refuse("not in a pool")
		}), pod: testPod(nil), want: 403, reason: "not in a pool"},
		{name: "policy fails", policy: PolicyFunc(func(context.Context, *corev1.Pod) (Terms, error) {
			return Terms{}, errors.New("cache down")
		}), pod: testPod(nil), want: 503, reason: "cache down"},
		{name: "lease over the bound", policy: fixedTerms(Terms{Template: testTemplate, Fibers: core.Fibers{Max: 1}, Lease: 2 * time.Hour}),
			pod: testPod(nil), want: 403, reason: "over the issuer's longest"},
		{name: "other node", policy: ok, extra: map[string]authenticationv1.ExtraValue{ExtraNodeName: {"node-b"}},
			pod: testPod(nil), want: 403, reason: "token was issued on node node-b"},
		{name: "not scheduled", policy: ok, pod: testPod(func(p *corev1.Pod) { p.Spec.NodeName = "" }), want: 404, reason: "not scheduled"},
		{name: "replaced", policy: ok, pod: testPod(func(p *corev1.Pod) { p.UID = "other" }), want: 403, reason: "was replaced"},
		{name: "terminating", policy: ok, pod: testPod(func(p *corev1.Pod) {
			p.DeletionTimestamp = &metav1.Time{Time: testNow}
			p.Finalizers = []string{"x"}
		}), want: 403, reason: "terminating"},
		{name: "gone", policy: ok, want: 403, reason: "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.pod != nil {
				objs = append(objs, tc.pod)
			}
			f := newFixture(t, tc.policy, tc.extra, objs...)
			rec := f.get(PathGrant)
			if rec.Code != tc.want || !strings.Contains(rec.Body.String(), tc.reason) {
				t.Fatalf("status %d %q, want %d with %q", rec.Code, rec.Body, tc.want, tc.reason)
			}
			if !strings.Contains(f.log.String(), tc.reason) {
				t.Errorf("refusal not logged with its reason: %s", f.log.String())
			}
		})
	}
}

func TestKeysReadPerRequest(t *testing.T) {
	f := newFixture(t, fixedTerms(Terms{Template: testTemplate, Fibers: core.Fibers{Max: 1}}), nil, testPod(nil))
	f.keys.set.Store(nil)
	if rec := f.get(PathGrant); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("grant with no keys loaded: %d, want 503", rec.Code)
	}
	if rec := f.get(PathJWKS); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("JWKS with no keys loaded: %d, want 503", rec.Code)
	}

	old, err := grant.GenerateKey("ES256", "old")
	if err != nil {
		t.Fatal(err)
	}
	f.keys.set.Store(mustKeySet(t, "new", old))
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(f.get(PathJWKS).Body.Bytes(), &set); err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range set.Keys {
		if !k.IsPublic() {
			t.Fatalf("kid %s is published with its private half", k.KeyID)
		}
		kids = append(kids, k.KeyID)
	}
	if strings.Join(kids, ",") != "new,old" {
		t.Fatalf("published kids %v, want new,old", kids)
	}
	var disc struct {
		Issuer string   `json:"issuer"`
		Algs   []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := json.Unmarshal(f.get(PathDiscovery).Body.Bytes(), &disc); err != nil {
		t.Fatal(err)
	}
	if disc.Issuer != testIssuer || strings.Join(disc.Algs, ",") != "EdDSA,ES256" {
		t.Fatalf("discovery %+v", disc)
	}
	rec := f.get(PathGrant)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d (%s)", rec.Code, rec.Body)
	}
	f.verify(t, rec.Body.Bytes())
	if !strings.Contains(f.log.String(), `"kid"="new"`) {
		t.Errorf("the grant was not signed with the new key: %s", f.log.String())
	}
}

func TestNewSignerKeySet(t *testing.T) {
	k1, _ := grant.GenerateKey("EdDSA", "k1")
	k2, _ := grant.GenerateKey("EdDSA", "k1")
	s1, err := grant.NewSigner(k1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewSignerKeySet(s1); err == nil || !strings.Contains(err.Error(), "publish the signing key") {
		t.Errorf("a signer whose key is not published: %v", err)
	}
	if _, err := NewSignerKeySet(s1, k1, k2); err == nil || !strings.Contains(err.Error(), "own kid") {
		t.Errorf("two keys with one kid: %v", err)
	}
	ks, err := NewSignerKeySet(s1, k1, k1.Public())
	if err != nil {
		t.Fatalf("one key given private and public: %v", err)
	}
	if got := ks.KeyIDs(); len(got) != 1 {
		t.Errorf("kids %v, want k1 once", got)
	}
	if strings.Contains(string(ks.JWKS()), `"d"`) {
		t.Error("the JWKS holds private key material")
	}
}

// clientset is the Cluster of a fake clientset.
type clientset struct{ kube *fake.Clientset }

func (c clientset) ReviewToken(ctx context.Context, tr *authenticationv1.TokenReview) (*authenticationv1.TokenReview, error) {
	return c.kube.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
}

func (c clientset) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}
