package granttest_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/grant/granttest"
)

// A token the Issuer mints verifies against a Cache pointed at it, over
// plain HTTP and over TLS, and each refresh is one discovery and one JWKS
// request.
func TestMintedTokenVerifiesThroughTheCache(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts granttest.Options
	}{
		{"plain EdDSA", granttest.Options{}},
		{"TLS ES256", granttest.Options{TLS: true, Alg: "ES256", KeyID: "e1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			iss := granttest.NewIssuer(tt.opts)
			t.Cleanup(iss.Close)
			if tt.opts.TLS != strings.HasPrefix(iss.URL, "https://") {
				t.Fatalf("URL %q with TLS %v", iss.URL, tt.opts.TLS)
			}
			cache, err := grant.NewCache(iss.URL, grant.CacheOptions{HTTPClient: iss.Client(), Logger: logr.Discard()})
			if err != nil {
				t.Fatal(err)
			}
			v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: iss.URL, Audience: "node-a", Keys: cache})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().Truncate(time.Second)
			g := core.Grant{
				UID: "g-1", Issuer: iss.URL, Audience: "node-a",
				Template: "counter@sha256:" + strings.Repeat("ab", 32),
				Fibers:   core.Fibers{Max: 2}, IssuedAt: now, Expiry: now.Add(time.Hour),
			}
			got, err := v.Verify(context.Background(), iss.Mint(g))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if got.UID != g.UID || got.Issuer != iss.URL {
				t.Errorf("verified %+v, want %+v", got, g)
			}
			if d, j := iss.DiscoveryHits(), iss.JWKSHits(); d != 1 || j != 1 {
				t.Errorf("after one refresh: %d discovery, %d JWKS requests; want 1, 1", d, j)
			}
		})
	}
}

// While failing, every request is refused with 503 and still counted; off
// again, the issuer answers.
func TestSetFailing(t *testing.T) {
	iss := granttest.NewIssuer(granttest.Options{})
	t.Cleanup(iss.Close)
	cache, err := grant.NewCache(iss.URL, grant.CacheOptions{Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	iss.SetFailing(true)
	if err := cache.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh succeeded against a failing issuer")
	}
	resp, err := http.Get(iss.URL + granttest.JWKSPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("JWKS while failing: %d, want 503", resp.StatusCode)
	}
	if d, j := iss.DiscoveryHits(), iss.JWKSHits(); d != 1 || j != 1 {
		t.Errorf("while failing: %d discovery, %d JWKS requests; want 1, 1", d, j)
	}
	iss.SetFailing(false)
	if err := cache.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh after the outage: %v", err)
	}
}

// An invalid grant panics in Mint, naming the package.
func TestMintPanicsOnInvalidGrant(t *testing.T) {
	iss := granttest.NewIssuer(granttest.Options{})
	t.Cleanup(iss.Close)
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.HasPrefix(s, "granttest: mint") {
			t.Fatalf("recovered %v, want a granttest mint panic", r)
		}
	}()
	iss.Mint(core.Grant{UID: "Not A Label"})
	t.Fatal("Mint of an invalid grant returned")
}
