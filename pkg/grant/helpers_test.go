package grant

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/core"
)

const (
	testIssuer   = "https://issuer.example"
	testAudience = "node-a"
	testTemplate = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// testNow is the clock time of the tests, a whole second.
var testNow = time.Unix(1_800_000_000, 0).UTC()

// mustKey generates a private key or fails the test.
func mustKey(t testing.TB, alg, kid string) jose.JSONWebKey {
	t.Helper()
	k, err := GenerateKey(alg, kid)
	if err != nil {
		t.Fatalf("GenerateKey(%s, %s): %v", alg, kid, err)
	}
	return k
}

// mustStatic builds a StaticKeys of the public halves of keys.
func mustStatic(t testing.TB, keys ...jose.JSONWebKey) *StaticKeys {
	t.Helper()
	jwks, err := PublicJWKS(keys...)
	if err != nil {
		t.Fatalf("PublicJWKS: %v", err)
	}
	s, err := NewStaticKeys(jwks)
	if err != nil {
		t.Fatalf("NewStaticKeys: %v", err)
	}
	return s
}

// goodGrant is a grant using every field.
func goodGrant() core.Grant {
	return core.Grant{
		UID:      "g-0001",
		Issuer:   testIssuer,
		Audience: testAudience,
		Template: testTemplate,
		Fibers:   core.Fibers{Max: 4, Warm: 2},
		WBudget:  64 << 20,
		MinTier:  core.TierWarm,
		Devices:  core.DeviceRequest{Class: "gpu", Count: 1},
		IssuedAt: testNow,
		Expiry:   testNow.Add(10 * time.Minute),
	}
}

// mint signs g with key or fails the test.
func mint(t testing.TB, key jose.JSONWebKey, g core.Grant) []byte {
	t.Helper()
	s, err := NewSigner(key)
	if err != nil {
		t.Fatalf("NewSigner: %v", err)
	}
	tok, err := s.Mint(g)
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	return tok
}

// goodClaims is the payload of goodGrant as a mutable map.
func goodClaims() map[string]any {
	return map[string]any{
		"iss": testIssuer,
		"aud": testAudience,
		"jti": "g-0001",
		"iat": testNow.Unix(),
		"exp": testNow.Add(10 * time.Minute).Unix(),
		"grant": map[string]any{
			"template": testTemplate,
			"fibers":   map[string]any{"max": 4, "warm": 2},
			"wBudget":  64 << 20,
			"minTier":  "WARM",
			"devices":  map[string]any{"class": "gpu", "count": 1},
		},
	}
}

// signRaw signs an arbitrary payload with signingKey under alg, setting kid
// in the header when it is not empty.
func signRaw(t testing.TB, alg jose.SignatureAlgorithm, signingKey any, kid string, payload []byte) []byte {
	t.Helper()
	opts := &jose.SignerOptions{}
	if kid != "" {
		opts = opts.WithHeader(jose.HeaderKey("kid"), kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: signingKey}, opts)
	if err != nil {
		t.Fatalf("jose.NewSigner(%s): %v", alg, err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatalf("CompactSerialize: %v", err)
	}
	return []byte(out)
}

// signClaims marshals claims and signs them with key (a private JWK with a
// KeyID).
func signClaims(t testing.TB, key jose.JSONWebKey, claims any) []byte {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return signRaw(t, jose.SignatureAlgorithm(key.Algorithm), key.Key, key.KeyID, payload)
}

// unsigned builds a compact token from a header and a payload with an
// arbitrary signature part.
func unsigned(header, payload any, sig string) []byte {
	h, _ := json.Marshal(header)
	p, _ := json.Marshal(payload)
	return []byte(b64(h) + "." + b64(p) + "." + sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// replacePayload swaps the payload part of token, keeping its header and
// signature.
func replacePayload(token []byte, payload []byte) []byte {
	parts := strings.Split(string(token), ".")
	parts[1] = b64(payload)
	return []byte(strings.Join(parts, "."))
}

// countingKeys is a KeySource that counts its calls.
type countingKeys struct {
	inner KeySource
	calls atomic.Int64
}

func (c *countingKeys) Key(ctx context.Context, kid string) (*jose.JSONWebKey, error) {
	c.calls.Add(1)
	return c.inner.Key(ctx, kid)
}

// errKeys is a KeySource failing with err.
type errKeys struct{ err error }

func (e errKeys) Key(context.Context, string) (*jose.JSONWebKey, error) { return nil, e.err }
