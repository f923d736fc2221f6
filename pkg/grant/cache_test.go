package grant

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
)

// testIssuerServer is an OIDC issuer over TLS serving a settable JWKS.
type testIssuerServer struct {
	srv       *httptest.Server
	jwksHits  atomic.Int64
	discHits  atomic.Int64
	mu        sync.Mutex
	docIssuer string // issuer named in discovery; default srv.URL
	jwks      []byte
	status    int  // JWKS status; 0 is 200
	chunked   bool // stream the JWKS without Content-Length
}

func newTestIssuerServer(t *testing.T) *testIssuerServer {
	t.Helper()
	s := &testIssuerServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		s.discHits.Add(1)
		s.mu.Lock()
		iss := s.docIssuer
		s.mu.Unlock()
		if iss == "" {
			iss = s.srv.URL
		}
		json.NewEncoder(w).Encode(map[string]string{"issuer": iss, "jwks_uri": s.srv.URL + "/keys"})
	})
	mux.HandleFunc("/keys", func(w http.ResponseWriter, r *http.Request) {
		s.jwksHits.Add(1)
		s.mu.Lock()
		body, status, chunked := s.jwks, s.status, s.chunked
		s.mu.Unlock()
		if status != 0 {
			http.Error(w, "down", status)
			return
		}
		if chunked {
			for len(body) > 0 {
				n := min(len(body), 64<<10)
				w.Write(body[:n])
				w.(http.Flusher).Flush()
				body = body[n:]
			}
			return
		}
		w.Write(body)
	})
	s.srv = httptest.NewTLSServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *testIssuerServer) setKeys(t *testing.T, keys ...jose.JSONWebKey) {
	t.Helper()
	jwks, err := PublicJWKS(keys...)
	if err != nil {
		t.Fatal(err)
	}
	s.setJWKS(jwks)
}

func (s *testIssuerServer) setJWKS(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jwks = b
}

func (s *testIssuerServer) setStatus(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = code
}

func newTestCache(t *testing.T, s *testIssuerServer, clk *clocktesting.FakePassiveClock) *Cache {
	t.Helper()
	c, err := NewCache(s.srv.URL, CacheOptions{
		HTTPClient: s.srv.Client(),
		Clock:      clk,
		Logger:     testr.New(t),
	})
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	return c
}

func TestCacheDiscoveryIssuerMismatch(t *testing.T) {
	s := newTestIssuerServer(t)
	s.setKeys(t, mustKey(t, "EdDSA", "k1"))
	s.mu.Lock()
	s.docIssuer = "https://someone-else.example"
	s.mu.Unlock()
	c := newTestCache(t, s, clocktesting.NewFakePassiveClock(testNow))
	err := c.Refresh(context.Background())
	if err == nil || !strings.Contains(err.Error(), "someone-else") {
		t.Fatalf("Refresh = %v, want an issuer mismatch", err)
	}
	if s.jwksHits.Load() != 0 {
		t.Errorf("JWKS fetched despite the issuer mismatch")
	}
	if _, err := c.Key(context.Background(), "k1"); !errors.Is(err, core.ErrUnverifiable) {
		t.Errorf("Key after a failed discovery = %v, want ErrUnverifiable", err)
	}
	if !c.LastRefresh().IsZero() {
		t.Errorf("LastRefresh = %v after failures, want zero", c.LastRefresh())
	}
}

func TestCacheTrailingSlashIssuer(t *testing.T) {
	s := newTestIssuerServer(t)
	s.setKeys(t, mustKey(t, "EdDSA", "k1"))
	c, err := NewCache(s.srv.URL+"/", CacheOptions{HTTPClient: s.srv.Client(), Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh with a trailing-slash issuer: %v", err)
	}
}

func TestCacheUnknownKidRefreshRateLimited(t *testing.T) {
	s := newTestIssuerServer(t)
	k1, k2 := mustKey(t, "EdDSA", "k1"), mustKey(t, "ES256", "k2")
	s.setKeys(t, k1)
	clk := clocktesting.NewFakePassiveClock(testNow)
	c := newTestCache(t, s, clk)
	ctx := context.Background()
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.LastRefresh(); !got.Equal(testNow) {
		t.Errorf("LastRefresh = %v, want %v", got, testNow)
	}
	hits := func() int64 { return s.jwksHits.Load() }
	// Right after a load, an unknown kid does not refetch.
	if _, err := c.Key(ctx, "nope"); !errors.Is(err, core.ErrUnauthenticated) || !strings.Contains(err.Error(), "unknown kid") {
		t.Errorf("Key(unknown) = %v, want ErrUnauthenticated unknown kid", err)
	}
	if hits() != 1 {
		t.Fatalf("JWKS hits = %d right after the load, want 1", hits())
	}
	// A minute later, one refresh, then none however many calls.
	clk.SetTime(testNow.Add(time.Minute))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Key(ctx, "nope")
		}()
	}
	wg.Wait()
	if hits() != 2 {
		t.Fatalf("JWKS hits = %d after 8 concurrent unknown kids, want 2", hits())
	}
	clk.SetTime(testNow.Add(time.Minute + 59*time.Second))
	c.Key(ctx, "nope")
	if hits() != 2 {
		t.Fatalf("JWKS hits = %d 59s after a refresh, want 2", hits())
	}
	// The issuer publishes k2; the next allowed refresh finds it.
	s.setKeys(t, k1, k2)
	clk.SetTime(testNow.Add(2 * time.Minute))
	if k, err := c.Key(ctx, "k2"); err != nil || k.KeyID != "k2" {
		t.Fatalf("Key(k2) after rotation = %v, %v", k, err)
	}
	if hits() != 3 {
		t.Fatalf("JWKS hits = %d, want 3", hits())
	}
	// Known kids never refetch.
	for range 5 {
		if _, err := c.Key(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
	}
	if hits() != 3 {
		t.Errorf("JWKS hits = %d after known kids, want 3", hits())
	}
}

func TestCacheRotation(t *testing.T) {
	s := newTestIssuerServer(t)
	k1, k2, k3 := mustKey(t, "EdDSA", "k1"), mustKey(t, "ES256", "k2"), mustKey(t, "EdDSA", "k3")
	s.setKeys(t, k1, k2)
	clk := clocktesting.NewFakePassiveClock(testNow)
	c := newTestCache(t, s, clk)
	v := newTestVerifier(t, c, func(cfg *VerifierConfig) { cfg.Issuer = testIssuer })
	ctx := context.Background()
	// Never refreshed: the first Key loads.
	for _, k := range []jose.JSONWebKey{k1, k2} {
		if _, err := v.Verify(ctx, mint(t, k, goodGrant())); err != nil {
			t.Errorf("Verify with %s: %v", k.KeyID, err)
		}
	}
	// Rotate: k1 retired, k3 added.
	s.setKeys(t, k2, k3)
	clk.SetTime(testNow.Add(time.Minute))
	if _, err := v.Verify(ctx, mint(t, k3, goodGrant())); err != nil {
		t.Errorf("Verify with new k3: %v", err)
	}
	if _, err := v.Verify(ctx, mint(t, k1, goodGrant())); !errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("Verify with retired k1 = %v, want ErrUnauthenticated", err)
	}
	if _, err := v.Verify(ctx, mint(t, k2, goodGrant())); err != nil {
		t.Errorf("Verify with k2 after rotation: %v", err)
	}
}

func TestCacheNeverLoaded(t *testing.T) {
	s := newTestIssuerServer(t)
	s.setStatus(http.StatusInternalServerError)
	clk := clocktesting.NewFakePassiveClock(testNow)
	c := newTestCache(t, s, clk)
	_, err := c.Key(context.Background(), "k1")
	if !errors.Is(err, core.ErrUnverifiable) || !strings.Contains(err.Error(), "never loaded") {
		t.Errorf("Key on a never-loaded cache = %v, want ErrUnverifiable never loaded", err)
	}
	if s.jwksHits.Load() != 1 {
		t.Errorf("JWKS hits = %d, want 1 attempt", s.jwksHits.Load())
	}
	// A Verifier turns it into an unverifiable token, not a bad one.
	key := mustKey(t, "EdDSA", "k1")
	v := newTestVerifier(t, c, nil)
	_, err = v.Verify(context.Background(), mint(t, key, goodGrant()))
	if !errors.Is(err, core.ErrUnverifiable) || errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("Verify on a never-loaded cache = %v, want only ErrUnverifiable", err)
	}
	// The issuer recovers; after the interval the cache loads.
	s.setKeys(t, key)
	s.setStatus(0)
	clk.SetTime(testNow.Add(time.Minute))
	if _, err := v.Verify(context.Background(), mint(t, key, goodGrant())); err != nil {
		t.Errorf("Verify after recovery: %v", err)
	}
}

func TestCacheStale(t *testing.T) {
	s := newTestIssuerServer(t)
	key := mustKey(t, "EdDSA", "k1")
	s.setKeys(t, key)
	clk := clocktesting.NewFakePassiveClock(testNow)
	c := newTestCache(t, s, clk)
	ctx := context.Background()
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s.setStatus(http.StatusServiceUnavailable)
	// Failed refreshes keep the old set within MaxStale.
	clk.SetTime(testNow.Add(DefaultMaxStale))
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("Refresh against a failing issuer succeeded")
	}
	if _, err := c.Key(ctx, "k1"); err != nil {
		t.Errorf("Key at exactly MaxStale = %v, want the key", err)
	}
	clk.SetTime(testNow.Add(DefaultMaxStale + time.Second))
	_, err := c.Key(ctx, "k1")
	if !errors.Is(err, core.ErrUnverifiable) || !strings.Contains(err.Error(), "staleness") {
		t.Errorf("Key beyond MaxStale = %v, want ErrUnverifiable", err)
	}
	if !c.LastRefresh().Equal(testNow) {
		t.Errorf("LastRefresh = %v, want the last success %v", c.LastRefresh(), testNow)
	}
	// Recovery: the next allowed refresh brings the set back.
	s.setStatus(0)
	clk.SetTime(testNow.Add(DefaultMaxStale + time.Minute))
	if _, err := c.Key(ctx, "k1"); err != nil {
		t.Errorf("Key after the issuer recovered = %v", err)
	}
}

func TestCacheOversizedJWKS(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		name := "content-length"
		if chunked {
			name = "chunked"
		}
		t.Run(name, func(t *testing.T) {
			s := newTestIssuerServer(t)
			jwks, _ := PublicJWKS(mustKey(t, "EdDSA", "k1"))
			// Valid JSON, padded with whitespace to 1 MiB + 1.
			body := append(jwks, strings.Repeat(" ", MaxDocumentSize+1-len(jwks))...)
			s.setJWKS(body)
			s.mu.Lock()
			s.chunked = chunked
			s.mu.Unlock()
			c := newTestCache(t, s, clocktesting.NewFakePassiveClock(testNow))
			err := c.Refresh(context.Background())
			if err == nil || !strings.Contains(err.Error(), "limit") {
				t.Fatalf("Refresh of a 1 MiB + 1 JWKS = %v, want a size refusal", err)
			}
			// Exactly 1 MiB is fine.
			s.setJWKS(body[:MaxDocumentSize])
			if err := c.Refresh(context.Background()); err != nil {
				t.Errorf("Refresh of a 1 MiB JWKS: %v", err)
			}
		})
	}
}

func TestParseJWKS(t *testing.T) {
	ed := mustKey(t, "EdDSA", "ed")
	ec := mustKey(t, "ES256", "ec")
	privJSON, _ := json.Marshal(ed)
	pub, _ := PublicJWKS(ed, ec)
	for _, tc := range []struct {
		name    string
		jwks    string
		wantErr string
		kids    []string
	}{
		{"public", string(pub), "", []string{"ec", "ed"}},
		{"private key", `{"keys":[` + string(privJSON) + `]}`, "private", nil},
		{"symmetric key", `{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}]}`, "symmetric", nil},
		{"no kid", `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`, "no kid", nil},
		{"repeated kid", strings.Replace(string(pub), `"kid": "ec"`, `"kid": "ed"`, 1), "repeats", nil},
		{"not json", `keys`, "JSON", nil},
		{"no keys member", `{}`, "keys", nil},
		{"encryption key skipped", strings.Replace(string(pub), `"use": "sig"`, `"use": "enc"`, 1), "", []string{"ec"}},
		{"RSA skipped", `{"keys":[{"kty":"RSA","kid":"r","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}`, "", []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := parseJWKS([]byte(tc.jwks))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseJWKS = %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseJWKS: %v", err)
			}
			if len(keys) != len(tc.kids) {
				t.Fatalf("parseJWKS kept %d keys, want %v", len(keys), tc.kids)
			}
			for _, kid := range tc.kids {
				k, ok := keys[kid]
				if !ok || !k.IsPublic() {
					t.Errorf("kid %s missing or not public", kid)
				}
			}
		})
	}
}

func TestNewCacheURLs(t *testing.T) {
	for u, ok := range map[string]bool{
		"https://issuer.example": true, "https://issuer.example/tenant/": true,
		"http://127.0.0.1:8080": true, "http://localhost:1": true, "http://[::1]:1": true,
		"http://issuer.example": false, "issuer.example": false, "": false,
		"https://issuer.example?x=1": false, "https://u:p@issuer.example": false, "ftp://issuer.example": false,
	} {
		_, err := NewCache(u, CacheOptions{})
		if (err == nil) != ok {
			t.Errorf("NewCache(%q) = %v, want ok=%v", u, err, ok)
		}
		if err != nil && !errors.Is(err, core.ErrInvalid) {
			t.Errorf("NewCache(%q) error %v does not wrap ErrInvalid", u, err)
		}
	}
	if _, err := NewCache("https://i.example", CacheOptions{MaxStale: -1}); err == nil || !strings.Contains(err.Error(), "MaxStale") {
		t.Errorf("NewCache with negative MaxStale = %v", err)
	}
}

func TestStaticKeys(t *testing.T) {
	ed := mustKey(t, "EdDSA", "ed")
	s := mustStatic(t, ed)
	if k, err := s.Key(context.Background(), "ed"); err != nil || !k.IsPublic() {
		t.Errorf("Key(ed) = %v, %v; want the public key", k, err)
	}
	if _, err := s.Key(context.Background(), "x"); !errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("Key(unknown) = %v, want ErrUnauthenticated", err)
	}
	if _, err := NewStaticKeys([]byte(`{"keys":[]}`)); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("NewStaticKeys(empty set) = %v, want ErrInvalid", err)
	}
}

// RefreshIn: due at once before any attempt, half of MaxStale after a
// load, MinRefreshInterval after a failed attempt, and never sooner than
// MinRefreshInterval after the last attempt; by the cache's clock.
func TestCacheRefreshIn(t *testing.T) {
	s := newTestIssuerServer(t)
	s.setKeys(t, mustKey(t, "EdDSA", "k1"))
	clk := clocktesting.NewFakePassiveClock(testNow)
	c, err := NewCache(s.srv.URL, CacheOptions{
		HTTPClient: s.srv.Client(), Clock: clk, Logger: testr.New(t),
		MaxStale: time.Hour, MinRefreshInterval: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if in := c.RefreshIn(); in != 0 {
		t.Fatalf("RefreshIn before any attempt = %v, want 0 (at once)", in)
	}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if in := c.RefreshIn(); in != 30*time.Minute {
		t.Fatalf("RefreshIn after a load = %v, want half of MaxStale, 30m", in)
	}
	clk.SetTime(testNow.Add(10 * time.Minute))
	if in := c.RefreshIn(); in != 20*time.Minute {
		t.Fatalf("RefreshIn 10m after a load = %v, want 20m", in)
	}
	clk.SetTime(testNow.Add(30 * time.Minute))
	s.setStatus(http.StatusServiceUnavailable)
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("Refresh against a failing issuer succeeded")
	}
	if in := c.RefreshIn(); in != time.Minute {
		t.Fatalf("RefreshIn after a failure = %v, want MinRefreshInterval, 1m", in)
	}
	clk.SetTime(testNow.Add(45 * time.Minute))
	if in := c.RefreshIn(); in != 0 {
		t.Fatalf("RefreshIn long past due = %v, want 0", in)
	}
	s.setStatus(0)
	if _, err := c.Key(ctx, "unknown-kid"); !errors.Is(err, core.ErrUnauthenticated) {
		t.Fatalf("Key of an unknown kid = %v", err)
	}
	if in := c.RefreshIn(); in != 30*time.Minute {
		t.Fatalf("RefreshIn after a load Key started = %v, want 30m", in)
	}

	short, err := NewCache(s.srv.URL, CacheOptions{
		HTTPClient: s.srv.Client(), Clock: clk, Logger: testr.New(t),
		MaxStale: time.Minute, MinRefreshInterval: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := short.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if in := short.RefreshIn(); in != time.Minute {
		t.Fatalf("RefreshIn with MaxStale/2 under the refresh limit = %v, want the limit, 1m", in)
	}
}

// Logger: "failures at V(1)": the owner logs an outage once; the cache
// does not log each failed refresh at V(0).
func TestCacheLogsFailuresAtV1(t *testing.T) {
	s := newTestIssuerServer(t)
	s.setKeys(t, mustKey(t, "EdDSA", "k1"))
	s.setStatus(http.StatusServiceUnavailable)
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 0})
	c, err := NewCache(s.srv.URL, CacheOptions{HTTPClient: s.srv.Client(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := c.Refresh(context.Background()); err == nil {
			t.Fatal("Refresh against a failing issuer succeeded")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 0 {
		t.Fatalf("failed refreshes logged at V(0): %q", lines)
	}
}
