package issuer

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/grant"
)

const (
	testIssuer   = "https://issuer.example:8443"
	testToken    = "eyJhbGciOiJSUzI1NiJ9.secret-bound-token.signature"
	testTemplate = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	podUID       = "8c1b5e4c-3c43-4d4e-9a55-1f2a1b3c4d5e"
)

var testNow = time.Date(2026, 11, 7, 12, 0, 0, 0, time.UTC)

// review is what the fake API server's TokenReview answers.
type review struct {
	err           error
	authenticated bool
	errText       string
	audiences     []string
	username      string
	extra         map[string]authenticationv1.ExtraValue
}

// boundReview is the review of a token bound to pod "grant-0" with podUID,
// of service account ns/fiberd.
func boundReview() review {
	return review{
		authenticated: true,
		audiences:     []string{testIssuer},
		username:      "system:serviceaccount:ns:fiberd",
		extra: map[string]authenticationv1.ExtraValue{
			ExtraPodName: {"grant-0"},
			ExtraPodUID:  {podUID},
		},
	}
}

func grantPod(mut func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "grant-0", Namespace: "ns", UID: types.UID(podUID),
			Annotations: map[string]string{AnnotationTemplate: testTemplate, AnnotationFibersMax: "4"},
		},
		Spec: corev1.PodSpec{ServiceAccountName: "fiberd", NodeName: "node-1"},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

type fixture struct {
	srv     *Server
	kube    *fake.Clientset
	key     jose.JSONWebKey
	log     *logtest.Recorder
	mu      sync.Mutex
	reviews []authenticationv1.TokenReviewSpec
}

func newFixture(t *testing.T, rv review, podGetErr error, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{kube: fake.NewClientset(objs...), log: &logtest.Recorder{}}
	f.kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		in := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		f.mu.Lock()
		f.reviews = append(f.reviews, in.Spec)
		f.mu.Unlock()
		if rv.err != nil {
			return true, nil, rv.err
		}
		out := in.DeepCopy()
		out.Status = authenticationv1.TokenReviewStatus{
			Authenticated: rv.authenticated,
			Error:         rv.errText,
			Audiences:     rv.audiences,
			User:          authenticationv1.UserInfo{Username: rv.username, Extra: rv.extra},
		}
		return true, out, nil
	})
	if podGetErr != nil {
		f.kube.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, podGetErr
		})
	}
	var err error
	f.key, err = grant.GenerateKey("EdDSA", "k1")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := grant.NewSigner(f.key)
	if err != nil {
		t.Fatal(err)
	}
	f.srv, err = New(Config{
		IssuerURL: testIssuer,
		Signer:    signer,
		Keys:      []jose.JSONWebKey{f.key},
		Kube:      f.kube,
		Lease:     20 * time.Second,
		Clock:     clocktesting.NewFakePassiveClock(testNow.Add(300 * time.Millisecond)),
		Logger:    f.log.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) get(t *testing.T, method, authorization string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, testIssuer+PathGrant, nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req)
	return rec
}

func TestGrantIssued(t *testing.T) {
	f := newFixture(t, boundReview(), nil, grantPod(nil))
	rec := f.get(t, http.MethodGet, "Bearer "+testToken)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/jwt" {
		t.Errorf("Content-Type %q, want application/jwt", ct)
	}
	// The review asked for the issuer's audience, with the presented token.
	if len(f.reviews) != 1 || f.reviews[0].Token != testToken ||
		len(f.reviews[0].Audiences) != 1 || f.reviews[0].Audiences[0] != testIssuer {
		t.Errorf("token reviews %+v, want one of the token for audience %q", f.reviews, testIssuer)
	}
	jwks, err := grant.PublicJWKS(f.key)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := grant.NewStaticKeys(jwks)
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{
		Issuer: testIssuer, Audience: "grant-0", Keys: keys,
		Clock: clocktesting.NewFakePassiveClock(testNow),
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(context.Background(), rec.Body.Bytes())
	if err != nil {
		t.Fatalf("minted grant does not verify: %v", err)
	}
	if g.UID != podUID || g.Audience != "grant-0" || g.Template != testTemplate || g.Fibers.Max != 4 {
		t.Errorf("grant uid %q aud %q template %q max %d; want the Pod's", g.UID, g.Audience, g.Template, g.Fibers.Max)
	}
	if !g.IssuedAt.Equal(testNow) || g.Lease() != 20*time.Second {
		t.Errorf("grant iat %v lease %v, want %v and 20s", g.IssuedAt, g.Lease(), testNow)
	}
	if logs := f.log.String(); strings.Contains(logs, testToken) || strings.Contains(logs, rec.Body.String()) {
		t.Errorf("a token reached the log:\n%s", logs)
	}
}

func TestGrantRefused(t *testing.T) {
	apiDown := errors.New("connect: connection refused")
	for _, tc := range []struct {
		name      string
		auth      string
		noAuth    bool
		method    string
		review    func(*review)
		pod       func(*corev1.Pod) // nil pod mutation keeps the good Pod
		noPod     bool
		podGetErr error
		want      int
		reason    string
	}{
		{name: "no header", noAuth: true, want: 401, reason: "no Authorization header"},
		{name: "basic auth", auth: "Basic dXNlcjpwdw==", want: 401, reason: "not a bearer token"},
		{name: "empty bearer", auth: "Bearer  ", want: 401, reason: "empty"},
		{name: "bearer too long", auth: "Bearer " + strings.Repeat("a", maxBearer+1), want: 401, reason: "longer than"},
		{name: "post", method: http.MethodPost, auth: "Bearer " + testToken, want: 405, reason: "not allowed"},
		{name: "review fails", review: func(r *review) { r.err = apiDown }, want: 503, reason: "token review failed"},
		{name: "not authenticated", review: func(r *review) {
			r.authenticated, r.errText = false, "token has been invalidated"
		}, want: 401, reason: "token has been invalidated"},
		{name: "audience not confirmed", review: func(r *review) { r.audiences = []string{"https://kubernetes.default.svc"} }, want: 401, reason: "did not confirm audience"},
		{name: "not a service account", review: func(r *review) { r.username = "alice" }, want: 403, reason: "not a service account"},
		{name: "not bound to a pod", review: func(r *review) { r.extra = nil }, want: 403, reason: "not bound to a Pod"},
		{name: "no pod uid", review: func(r *review) { delete(r.extra, ExtraPodUID) }, want: 403, reason: "not bound to a Pod"},
		{name: "two pod names", review: func(r *review) { r.extra[ExtraPodName] = []string{"a", "b"} }, want: 403, reason: "not bound to a Pod"},
		{name: "pod gone", noPod: true, want: 403, reason: "does not exist"},
		{name: "pod read fails", podGetErr: apiDown, want: 503, reason: "reading pod ns/grant-0 failed"},
		{name: "pod replaced", pod: func(p *corev1.Pod) { p.UID = "11111111-2222-3333-4444-555555555555" }, want: 403, reason: "was replaced"},
		{name: "pod terminating", pod: func(p *corev1.Pod) {
			now := metav1.NewTime(testNow)
			p.DeletionTimestamp = &now
			p.Finalizers = []string{"example.com/hold"}
		}, want: 403, reason: "terminating"},
		{name: "other service account", pod: func(p *corev1.Pod) { p.Spec.ServiceAccountName = "other" }, want: 403, reason: "runs as service account"},
		{name: "no template annotation yet", pod: func(p *corev1.Pod) { delete(p.Annotations, AnnotationTemplate) }, want: 404, reason: "no fiberd.io/template annotation yet"},
		{name: "no annotations at all", pod: func(p *corev1.Pod) { p.Annotations = nil }, want: 404, reason: "no grant assigned"},
		{name: "empty template", pod: func(p *corev1.Pod) { p.Annotations[AnnotationTemplate] = "" }, want: 403, reason: "annotation fiberd.io/template"},
		{name: "bad template", pod: func(p *corev1.Pod) { p.Annotations[AnnotationTemplate] = "counter:latest" }, want: 403, reason: "annotation fiberd.io/template"},
		{name: "no fibers-max", pod: func(p *corev1.Pod) { delete(p.Annotations, AnnotationFibersMax) }, want: 403, reason: "no fiberd.io/fibers-max annotation"},
		{name: "fibers-max zero", pod: func(p *corev1.Pod) { p.Annotations[AnnotationFibersMax] = "0" }, want: 403, reason: "at least 1"},
		{name: "fibers-max not a number", pod: func(p *corev1.Pod) { p.Annotations[AnnotationFibersMax] = "four" }, want: 403, reason: "at least 1"},
		{name: "fibers-max padded", pod: func(p *corev1.Pod) { p.Annotations[AnnotationFibersMax] = " 4" }, want: 403, reason: "at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rv := boundReview()
			if tc.review != nil {
				tc.review(&rv)
			}
			var objs []runtime.Object
			if !tc.noPod {
				objs = append(objs, grantPod(tc.pod))
			}
			f := newFixture(t, rv, tc.podGetErr, objs...)
			auth := tc.auth
			if auth == "" && !tc.noAuth {
				auth = "Bearer " + testToken
			}
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			rec := f.get(t, method, auth)
			if rec.Code != tc.want {
				t.Fatalf("status %d (%s), want %d", rec.Code, strings.TrimSpace(rec.Body.String()), tc.want)
			}
			if !strings.Contains(rec.Body.String(), tc.reason) {
				t.Errorf("body %q does not give the reason %q", rec.Body, tc.reason)
			}
			logs := f.log.String()
			if !strings.Contains(logs, "grant refused") || !strings.Contains(logs, tc.reason) {
				t.Errorf("the refusal was not logged with its reason %q:\n%s", tc.reason, logs)
			}
			if strings.Contains(logs, testToken) {
				t.Errorf("the token reached the log:\n%s", logs)
			}
			if strings.Contains(logs, "grant issued") {
				t.Errorf("a refused request logged a grant:\n%s", logs)
			}
		})
	}
}

// TestDiscoveryThroughCache serves the issuer over TLS and lets fiberd's key
// cache discover it, then verifies a minted grant with the keys it found.
func TestDiscoveryThroughCache(t *testing.T) {
	ts := httptest.NewUnstartedServer(nil)
	url := "https://" + ts.Listener.Addr().String() + "/dev"
	key, err := grant.GenerateKey("ES256", "")
	if err != nil {
		t.Fatal(err)
	}
	next, err := grant.GenerateKey("EdDSA", "next")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	rv := boundReview()
	rv.audiences = []string{url}
	kube := fake.NewClientset(grantPod(nil))
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		out := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: rv.audiences,
			User: authenticationv1.UserInfo{Username: rv.username, Extra: rv.extra}}
		return true, out, nil
	})
	srv, err := New(Config{IssuerURL: url, Signer: signer, Keys: []jose.JSONWebKey{key, next}, Kube: kube, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = srv
	ts.StartTLS()
	t.Cleanup(ts.Close)

	resp, err := ts.Client().Get(url + PathDiscovery)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || doc.Issuer != url || doc.JWKSURI != url+PathJWKS {
		t.Fatalf("discovery %+v (%v), want issuer %q and jwks_uri %q", doc, err, url, url+PathJWKS)
	}

	cache, err := grant.NewCache(url, grant.CacheOptions{HTTPClient: ts.Client(), Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(context.Background()); err != nil {
		t.Fatalf("fiberd's cache cannot read the issuer: %v", err)
	}
	if _, err := cache.Key(context.Background(), "next"); err != nil {
		t.Errorf("the published next key is missing: %v", err)
	}

	req, _ := http.NewRequest(http.MethodGet, url+PathGrant, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("grant: %d %s", resp.StatusCode, tok)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: url, Audience: "grant-0", Keys: cache})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := v.Verify(context.Background(), tok); err != nil || g.Lease() != DefaultLease {
		t.Errorf("verify through discovered keys: lease %v, err %v; want %v, nil", g.Lease(), err, DefaultLease)
	}

	for _, p := range []string{PathGrant, PathDiscovery} { // routes live under the URL's path only
		resp, err := ts.Client().Get("https://" + ts.Listener.Addr().String() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s outside the issuer path: %d, want 404", p, resp.StatusCode)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	key, err := grant.GenerateKey("EdDSA", "k1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := grant.GenerateKey("EdDSA", "k2")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	good := func() Config {
		return Config{IssuerURL: testIssuer, Signer: signer, Keys: []jose.JSONWebKey{key}, Kube: fake.NewClientset()}
	}
	for _, tc := range []struct {
		name string
		mut  func(*Config)
		want string // "" = valid
	}{
		{name: "good", mut: func(*Config) {}},
		{name: "no url", mut: func(c *Config) { c.IssuerURL = "" }, want: "IssuerURL is empty"},
		{name: "http", mut: func(c *Config) { c.IssuerURL = "http://127.0.0.1:1" }, want: "https"},
		{name: "query", mut: func(c *Config) { c.IssuerURL = testIssuer + "?a=b" }, want: "no user, query"},
		{name: "trailing slash", mut: func(c *Config) { c.IssuerURL = testIssuer + "/" }, want: "trailing slash"},
		{name: "no signer", mut: func(c *Config) { c.Signer = nil }, want: "Signer is nil"},
		{name: "signing key not published", mut: func(c *Config) { c.Keys = []jose.JSONWebKey{other} }, want: "signer's kid"},
		{name: "no kube", mut: func(c *Config) { c.Kube = nil }, want: "Kube is nil"},
		{name: "short lease", mut: func(c *Config) { c.Lease = 500 * time.Millisecond }, want: "Lease"},
		{name: "negative timeout", mut: func(c *Config) { c.ReviewTimeout = -1 }, want: "ReviewTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.mut(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if _, err := New(c); err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tc.want)
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestDocumentsMethods(t *testing.T) {
	f := newFixture(t, boundReview(), nil)
	for _, p := range []string{PathDiscovery, PathJWKS, PathHealthz} {
		for method, want := range map[string]int{http.MethodGet: 200, http.MethodHead: 200, http.MethodPost: 405} {
			req := httptest.NewRequest(method, testIssuer+p, nil)
			rec := httptest.NewRecorder()
			f.srv.ServeHTTP(rec, req)
			if rec.Code != want {
				t.Errorf("%s %s: %d, want %d", method, p, rec.Code, want)
			}
		}
	}
	// The JWKS holds the public half only.
	req := httptest.NewRequest(http.MethodGet, testIssuer+PathJWKS, nil)
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req)
	if _, err := grant.NewStaticKeys(rec.Body.Bytes()); err != nil {
		t.Errorf("JWKS %s: %v", rec.Body, err)
	}
	if strings.Contains(rec.Body.String(), `"d"`) {
		t.Errorf("JWKS leaks a private key: %s", rec.Body)
	}
}
