package granttest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// Paths the Issuer serves.
const (
	// DiscoveryPath is the OIDC discovery document's path.
	DiscoveryPath = "/.well-known/openid-configuration"
	// JWKSPath is the path of the JWK set the discovery document names.
	JWKSPath = "/jwks"
)

// Options configure NewIssuer. The zero value is a plain-HTTP issuer with
// one EdDSA key of kid "k1".
type Options struct {
	// TLS serves over HTTPS with httptest's self-signed certificate; use
	// Issuer.Client for a client that trusts it. Default false: plain HTTP,
	// which grant.Cache accepts on loopback.
	TLS bool
	// Alg is the signing key's algorithm, "EdDSA" or "ES256". Default
	// "EdDSA".
	Alg string
	// KeyID is the signing key's kid. Default "k1".
	KeyID string
}

// Issuer is a test grant issuer: an httptest server publishing the public
// half of Key, and the Signer of that key. Close it when done (a test
// usually registers Close with t.Cleanup). Its methods are safe for
// concurrent use.
type Issuer struct {
	// URL is the issuer's base URL (scheme://127.0.0.1:port, no trailing
	// slash): the issuer named in discovery and the URL to give
	// grant.NewCache.
	URL string
	// Signer signs with the key the JWKS publishes.
	Signer *grant.Signer

	srv       *httptest.Server
	jwks      []byte
	failing   atomic.Bool
	discovery atomic.Int64
	jwksHits  atomic.Int64
}

// NewIssuer generates a signing key as opts says and starts an Issuer
// serving it. It panics if opts name an unsupported algorithm or the key
// cannot be made, as httptest.NewServer panics when it cannot listen.
func NewIssuer(opts Options) *Issuer {
	if opts.Alg == "" {
		opts.Alg = "EdDSA"
	}
	if opts.KeyID == "" {
		opts.KeyID = "k1"
	}
	key, err := grant.GenerateKey(opts.Alg, opts.KeyID)
	if err != nil {
		panic(fmt.Sprintf("granttest: %v", err))
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		panic(fmt.Sprintf("granttest: %v", err))
	}
	jwks, err := grant.PublicJWKS(key)
	if err != nil {
		panic(fmt.Sprintf("granttest: %v", err))
	}
	iss := &Issuer{Signer: signer, jwks: jwks}
	iss.srv = httptest.NewUnstartedServer(http.HandlerFunc(iss.serve))
	if opts.TLS {
		iss.srv.StartTLS()
	} else {
		iss.srv.Start()
	}
	iss.URL = iss.srv.URL
	return iss
}

// serve answers discovery and the JWKS, or 503 to everything while failing.
// A request is counted once its answer is written, so a test that sees the
// count rise knows the client has (or is reading) the answer.
func (iss *Issuer) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case DiscoveryPath:
		defer iss.discovery.Add(1)
	case JWKSPath:
		defer iss.jwksHits.Add(1)
	}
	if iss.failing.Load() {
		http.Error(w, "granttest: issuer failing", http.StatusServiceUnavailable)
		return
	}
	switch r.URL.Path {
	case DiscoveryPath:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": iss.URL, "jwks_uri": iss.URL + JWKSPath})
	case JWKSPath:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(iss.jwks)
	default:
		http.NotFound(w, r)
	}
}

// Client returns an HTTP client for the Issuer: for a TLS issuer one that
// trusts its certificate, to give grant.CacheOptions.HTTPClient.
func (iss *Issuer) Client() *http.Client { return iss.srv.Client() }

// JWKS returns the JWK set the Issuer publishes (a copy).
func (iss *Issuer) JWKS() []byte { return append([]byte(nil), iss.jwks...) }

// Mint signs g with the Issuer's key. It panics if g cannot be minted (an
// invalid grant); a test of minting errors calls Signer.Mint instead. The
// grant's Issuer field is used as given: set it to URL for a token a
// verifier of this issuer accepts.
func (iss *Issuer) Mint(g core.Grant) []byte {
	tok, err := iss.Signer.Mint(g)
	if err != nil {
		panic(fmt.Sprintf("granttest: mint: %v", err))
	}
	return tok
}

// SetFailing makes every later request fail with 503 Service Unavailable
// (still counted) while on is true, and answer normally again once false.
func (iss *Issuer) SetFailing(on bool) { iss.failing.Store(on) }

// DiscoveryHits is the number of discovery requests answered so far,
// failed ones included.
func (iss *Issuer) DiscoveryHits() int64 { return iss.discovery.Load() }

// JWKSHits is the number of JWKS requests answered so far, failed ones
// included.
func (iss *Issuer) JWKSHits() int64 { return iss.jwksHits.Load() }

// Close shuts the server down, blocking until its requests have ended. It
// may be called more than once.
func (iss *Issuer) Close() { iss.srv.Close() }
