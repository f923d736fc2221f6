package grant

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
)

func newTestVerifier(t *testing.T, keys KeySource, mutate func(*VerifierConfig)) *Verifier {
	t.Helper()
	cfg := VerifierConfig{
		Issuer:   testIssuer,
		Audience: testAudience,
		Keys:     keys,
		Clock:    clocktesting.NewFakePassiveClock(testNow),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	return v
}

func TestVerifyGood(t *testing.T) {
	for _, alg := range []string{"EdDSA", "ES256"} {
		t.Run(alg, func(t *testing.T) {
			key := mustKey(t, alg, "k-"+strings.ToLower(alg))
			v := newTestVerifier(t, mustStatic(t, key), nil)
			want := goodGrant()
			tok := mint(t, key, want)
			got, err := v.Verify(context.Background(), tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want.Token = tok
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Verify grant:\n got %+v\nwant %+v", got, want)
			}
			if &got.Token[0] == &tok[0] {
				t.Error("Grant.Token aliases the caller's slice; want a copy")
			}
		})
	}
}

func TestVerifyDefaults(t *testing.T) {
	// A grant naming no minTier, warm, wBudget or devices reads as BASIC
	// with zero values, and aud as a one-element array is one value.
	key := mustKey(t, "EdDSA", "k1")
	v := newTestVerifier(t, mustStatic(t, key), nil)
	c := goodClaims()
	c["aud"] = []string{testAudience}
	c["grant"] = map[string]any{"template": testTemplate, "fibers": map[string]any{"max": 1}}
	g, err := v.Verify(context.Background(), signClaims(t, key, c))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if g.MinTier != core.TierBasic || g.Fibers != (core.Fibers{Max: 1}) || g.WBudget != 0 || g.Devices != (core.DeviceRequest{}) || g.Audience != testAudience {
		t.Errorf("defaults: got %+v", g)
	}
}

func TestVerifyExpiredReturnsGrant(t *testing.T) {
	key := mustKey(t, "EdDSA", "k1")
	later := testNow.Add(24 * time.Hour)
	v := newTestVerifier(t, mustStatic(t, key), func(c *VerifierConfig) {
		c.Clock = clocktesting.NewFakePassiveClock(later)
	})
	g, err := v.Verify(context.Background(), mint(t, key, goodGrant()))
	if err != nil {
		t.Fatalf("Verify of an expired grant: %v; want the grant and no error", err)
	}
	if g.UID != "g-0001" || !g.Expired(later) {
		t.Errorf("got %+v, want grant g-0001 expired at %v", g, later)
	}
}

func TestVerifySizeCheckedFirst(t *testing.T) {
	key := mustKey(t, "EdDSA", "k1")
	keys := &countingKeys{inner: mustStatic(t, key)}
	v := newTestVerifier(t, keys, nil)
	// A real token padded in its signature part to exactly 8 KiB + 1.
	tok := mint(t, key, goodGrant())
	big := append(append([]byte{}, tok...), strings.Repeat("A", MaxTokenSize+1-len(tok))...)
	if len(big) != MaxTokenSize+1 {
		t.Fatalf("test token is %d bytes", len(big))
	}
	_, err := v.Verify(context.Background(), big)
	if !errors.Is(err, core.ErrUnauthenticated) || !strings.Contains(err.Error(), "size") {
		t.Errorf("Verify(8 KiB + 1) = %v, want an ErrUnauthenticated naming the size", err)
	}
	if n := keys.calls.Load(); n != 0 {
		t.Errorf("key source consulted %d times for an oversized token, want 0", n)
	}
	// Exactly 8 KiB passes the size check (and fails later, on the signature).
	_, err = v.Verify(context.Background(), big[:MaxTokenSize])
	if err == nil || strings.Contains(err.Error(), "size") {
		t.Errorf("Verify(8 KiB) = %v, want a failure other than size", err)
	}
}

func TestVerifyRefusals(t *testing.T) {
	good := mustKey(t, "EdDSA", "k1")
	other := mustKey(t, "EdDSA", "k-other")
	ecKey := mustKey(t, "ES256", "k-ec")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(goodClaims())
	withClaim := func(mut func(map[string]any)) []byte {
		c := goodClaims()
		mut(c)
		return signClaims(t, good, c)
	}
	withGrant := func(mut func(map[string]any)) []byte {
		return withClaim(func(c map[string]any) { mut(c["grant"].(map[string]any)) })
	}
	lease := func(d time.Duration) []byte {
		g := goodGrant()
		g.Expiry = g.IssuedAt.Add(d)
		return mint(t, good, g)
	}

	tests := []struct {
		name      string
		token     []byte
		reason    string // a substring of the error
		keyLookup bool   // whether the key source may be consulted
	}{
		{"alg none", unsigned(map[string]any{"alg": "none", "kid": "k1"}, goodClaims(), ""), "algorithm none not allowed", false},
		{"HS256", signRaw(t, jose.HS256, []byte(strings.Repeat("s", 32)), "k1", payload), "algorithm HS256 not allowed", false},
		{"RS256", signRaw(t, jose.RS256, rsaKey, "k1", payload), "algorithm RS256 not allowed", false},
		{"ES384", signRaw(t, jose.ES384, p384, "k1", payload), "algorithm ES384 not allowed", false},
		{"missing alg", unsigned(map[string]any{"kid": "k1"}, goodClaims(), "c2ln"), "no alg", false},
		{"missing kid", signRaw(t, jose.EdDSA, good.Key, "", payload), "no kid", false},
		{"JSON serialisation", []byte(`{"payload":"e30","protected":"eyJhbGciOiJFZERTQSIsImtpZCI6ImsxIn0","signature":"c2ln"}`), "parts", false},
		{"two parts", []byte("eyJhbGciOiJFZERTQSJ9.e30"), "parts", false},
		{"empty", nil, "empty", false},
		{"wrong kid", signClaims(t, other, goodClaims()), "unknown kid", true},
		{"right kid wrong key", signRaw(t, jose.EdDSA, other.Key, "k1", payload), "signature invalid", true},
		{"key type does not fit alg", signRaw(t, jose.ES256, ecKey.Key, "k1", payload), "signed with ES256", true},
		{"tampered payload", replacePayload(mint(t, good, goodGrant()), []byte(strings.Replace(string(payload), `"max":4`, `"max":400`, 1))), "signature invalid", true},
		{"wrong issuer", withClaim(func(c map[string]any) { c["iss"] = "https://evil.example" }), "issuer", true},
		{"issuer with trailing slash", withClaim(func(c map[string]any) { c["iss"] = testIssuer + "/" }), "issuer", true},
		{"missing issuer", withClaim(func(c map[string]any) { delete(c, "iss") }), "iss is missing", true},
		{"wrong audience", withClaim(func(c map[string]any) { c["aud"] = "node-b" }), "audience", true},
		{"two audiences", withClaim(func(c map[string]any) { c["aud"] = []string{testAudience, "node-b"} }), "audience has 2 values", true},
		{"missing audience", withClaim(func(c map[string]any) { delete(c, "aud") }), "audience is missing", true},
		{"audience not a string", withClaim(func(c map[string]any) { c["aud"] = 7 }), "aud", true},
		{"bad jti", withClaim(func(c map[string]any) { c["jti"] = "Bad_UID" }), "DNS-1123", true},
		{"long jti", withClaim(func(c map[string]any) { c["jti"] = strings.Repeat("a", 64) }), "63", true},
		{"missing jti", withClaim(func(c map[string]any) { delete(c, "jti") }), "uid is empty", true},
		{"missing iat", withClaim(func(c map[string]any) { delete(c, "iat") }), "iat is missing", true},
		{"missing exp", withClaim(func(c map[string]any) { delete(c, "exp") }), "exp is missing", true},
		{"exp before iat", withClaim(func(c map[string]any) { c["exp"] = testNow.Add(-time.Second).Unix() }), "not after iat", true},
		{"iat a string", withClaim(func(c map[string]any) { c["iat"] = "now" }), "iat is not a number", true},
		{"lease over max", lease(2 * time.Hour), "lease", true},
		{"nbf in the future", withClaim(func(c map[string]any) { c["nbf"] = testNow.Add(time.Hour).Unix() }), "not valid before", true},
		{"iat an hour in the future", withClaim(func(c map[string]any) {
			c["iat"], c["exp"] = testNow.Add(time.Hour).Unix(), testNow.Add(90*time.Minute).Unix()
		}), "issued at 2027-01-15T09:00:00Z, 1h0m0s in the future", true},
		{"iat past the skew", withClaim(func(c map[string]any) {
			c["iat"], c["exp"] = testNow.Add(DefaultLeeway+time.Second).Unix(), testNow.Add(time.Hour).Unix()
		}), "1m1s in the future, more than the allowed clock skew of 1m0s", true},
		{"crit header", signCrit(t, good, payload, "urn:example:policy"), `critical header extension "urn:example:policy" is not supported`, false},
		{"crit header of two", signCrit(t, good, payload, "b64", "exp"), "critical header extensions b64, exp are not supported", false},
		{"crit not a list", unsigned(map[string]any{"alg": "EdDSA", "kid": "k1", "crit": "exp"}, goodClaims(), "c2ln"), "crit is not a list of names", false},
		{"crit empty", unsigned(map[string]any{"alg": "EdDSA", "kid": "k1", "crit": []string{}}, goodClaims(), "c2ln"), "crit is empty", false},
		{"missing grant claim", withClaim(func(c map[string]any) { delete(c, "grant") }), `"grant" is missing`, true},
		{"unknown member in grant", withGrant(func(g map[string]any) { g["priority"] = 1 }), `unknown member "priority"`, true},
		{"miscased member in grant", withGrant(func(g map[string]any) { delete(g, "template"); g["Template"] = testTemplate }), `unknown member "Template"`, true},
		{"unknown member in fibers", withGrant(func(g map[string]any) { g["fibers"] = map[string]any{"max": 1, "min": 1} }), `unknown member "min"`, true},
		{"unknown member in devices", withGrant(func(g map[string]any) { g["devices"] = map[string]any{"class": "gpu", "count": 1, "vendor": "x"} }), `unknown member "vendor"`, true},
		{"bad template", withGrant(func(g map[string]any) { g["template"] = "counter@sha256:ABC" }), "template", true},
		{"uppercase digest", withGrant(func(g map[string]any) { g["template"] = strings.ToUpper(testTemplate) }), "template", true},
		{"fibers.max 0", withGrant(func(g map[string]any) { g["fibers"] = map[string]any{"max": 0} }), "fibers.max 0", true},
		{"fibers.max missing", withGrant(func(g map[string]any) { g["fibers"] = map[string]any{"warm": 1} }), "fibers.max is missing", true},
		{"fibers missing", withGrant(func(g map[string]any) { delete(g, "fibers") }), "fibers is missing", true},
		{"fibers.max fractional", withGrant(func(g map[string]any) { g["fibers"] = map[string]any{"max": 1.5} }), "grant", true},
		{"warm over max", withGrant(func(g map[string]any) { g["fibers"] = map[string]any{"max": 1, "warm": 2} }), "fibers.warm", true},
		{"bad minTier", withGrant(func(g map[string]any) { g["minTier"] = "GOLD" }), "minTier", true},
		{"negative wBudget", withGrant(func(g map[string]any) { g["wBudget"] = -1 }), "wBudget", true},
		{"device count without class", withGrant(func(g map[string]any) { g["devices"] = map[string]any{"class": "", "count": 1} }), "devices.class", true},
		{"grant not an object", withClaim(func(c map[string]any) { c["grant"] = "x" }), "not a JSON object", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys := &countingKeys{inner: mustStatic(t, good, ecKey)}
			v := newTestVerifier(t, keys, func(c *VerifierConfig) { c.MaxLease = time.Hour })
			g, err := v.Verify(context.Background(), tc.token)
			if err == nil {
				t.Fatalf("Verify accepted the token: %+v", g)
			}
			if !errors.Is(err, core.ErrUnauthenticated) {
				t.Errorf("Verify error %q does not wrap core.ErrUnauthenticated", err)
			}
			if errors.Is(err, core.ErrUnverifiable) {
				t.Errorf("Verify error %q wraps core.ErrUnverifiable", err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Verify error %q does not say %q", err, tc.reason)
			}
			if n := keys.calls.Load(); !tc.keyLookup && n != 0 {
				t.Errorf("key source consulted %d times; want none before the header passes", n)
			}
			if !reflect.DeepEqual(g, core.Grant{}) {
				t.Errorf("Verify returned a grant with its error: %+v", g)
			}
		})
	}
}

// TestVerifyIssuedAtWithinSkew: a token issued up to the clock skew ahead of
// this home's clock is admitted, and the skew is the configured Leeway.
func TestVerifyIssuedAtWithinSkew(t *testing.T) {
	key := mustKey(t, "EdDSA", "k1")
	ahead := func(d time.Duration) []byte {
		g := goodGrant()
		g.IssuedAt, g.Expiry = testNow.Add(d), testNow.Add(d+time.Hour)
		return mint(t, key, g)
	}
	v := newTestVerifier(t, mustStatic(t, key), nil)
	if _, err := v.Verify(context.Background(), ahead(DefaultLeeway)); err != nil {
		t.Errorf("iat one default skew ahead refused: %v", err)
	}
	wide := newTestVerifier(t, mustStatic(t, key), func(c *VerifierConfig) { c.Leeway = 2 * time.Hour })
	if _, err := wide.Verify(context.Background(), ahead(time.Hour)); err != nil {
		t.Errorf("iat an hour ahead with a skew of 2h refused: %v", err)
	}
	narrow := newTestVerifier(t, mustStatic(t, key), func(c *VerifierConfig) { c.Leeway = time.Second })
	if _, err := narrow.Verify(context.Background(), ahead(2*time.Second)); !errors.Is(err, core.ErrUnauthenticated) {
		t.Errorf("iat 2s ahead with a skew of 1s = %v, want refused", err)
	}
}

// signCrit signs payload with key, its protected header naming crit as
// critical extensions (each also set in the header, as RFC 7515 asks).
func signCrit(t testing.TB, key jose.JSONWebKey, payload []byte, crit ...string) []byte {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithHeader(jose.HeaderKey("kid"), key.KeyID).WithHeader("crit", crit)
	for _, c := range crit {
		opts = opts.WithHeader(jose.HeaderKey(c), true)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.SignatureAlgorithm(key.Algorithm), Key: key.Key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(out)
}

func TestVerifyLeaseAtMaxAccepted(t *testing.T) {
	key := mustKey(t, "ES256", "k1")
	v := newTestVerifier(t, mustStatic(t, key), func(c *VerifierConfig) { c.MaxLease = 10 * time.Minute })
	if _, err := v.Verify(context.Background(), mint(t, key, goodGrant())); err != nil {
		t.Errorf("lease equal to MaxLease refused: %v", err)
	}
}

func TestVerifyUnverifiable(t *testing.T) {
	key := mustKey(t, "EdDSA", "k1")
	tok := mint(t, key, goodGrant())
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"class from source", core.ErrUnverifiable},
		{"unclassified error", errors.New("disk on fire")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newTestVerifier(t, errKeys{tc.err}, nil)
			_, err := v.Verify(context.Background(), tok)
			if !errors.Is(err, core.ErrUnverifiable) || errors.Is(err, core.ErrUnauthenticated) {
				t.Errorf("Verify = %v, want only core.ErrUnverifiable", err)
			}
		})
	}
}

func TestVerifierConfigValidate(t *testing.T) {
	keys := mustStatic(t, mustKey(t, "EdDSA", "k1"))
	for _, tc := range []struct {
		field string
		cfg   VerifierConfig
	}{
		{"Issuer", VerifierConfig{Audience: "a", Keys: keys}},
		{"Audience", VerifierConfig{Issuer: "i", Keys: keys}},
		{"Keys", VerifierConfig{Issuer: "i", Audience: "a"}},
		{"MaxLease", VerifierConfig{Issuer: "i", Audience: "a", Keys: keys, MaxLease: -1}},
		{"Leeway", VerifierConfig{Issuer: "i", Audience: "a", Keys: keys, Leeway: -1}},
	} {
		_, err := NewVerifier(tc.cfg)
		if !errors.Is(err, core.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewVerifier with bad %s = %v, want ErrInvalid naming it", tc.field, err)
		}
	}
}

func TestPeekUID(t *testing.T) {
	key := mustKey(t, "EdDSA", "k1")
	tok := mint(t, key, goodGrant())
	if uid, err := PeekUID(tok); err != nil || uid != "g-0001" {
		t.Errorf("PeekUID(good) = %q, %v; want g-0001", uid, err)
	}
	// PeekUID does not verify: a token with a bad signature still names its grant.
	if uid, err := PeekUID(unsigned(map[string]any{"alg": "none"}, map[string]any{"jti": "pod-uid-1"}, "")); err != nil || uid != "pod-uid-1" {
		t.Errorf("PeekUID(unsigned) = %q, %v; want pod-uid-1", uid, err)
	}
	big := append(append([]byte{}, tok...), strings.Repeat("A", MaxTokenSize+1-len(tok))...)
	for _, tc := range []struct {
		name  string
		token []byte
	}{
		{"empty", nil},
		{"one part", []byte("abc")},
		{"four parts", []byte("a.b.c.d")},
		{"oversized", big},
		{"payload not base64", []byte("e30.!!!.sig")},
		{"payload not an object", []byte("e30." + b64([]byte(`[1]`)) + ".sig")},
		{"no jti", unsigned(map[string]any{}, map[string]any{"iss": "x"}, "s")},
		{"jti not a label", unsigned(map[string]any{}, map[string]any{"jti": "Not A Label"}, "s")},
		{"jti a number", unsigned(map[string]any{}, map[string]any{"jti": 5}, "s")},
		{"duplicate jti", []byte("e30." + b64([]byte(`{"jti":"a","jti":"b"}`)) + ".s")},
		{"trailing data", []byte("e30." + b64([]byte(`{"jti":"a"} x`)) + ".s")},
	} {
		uid, err := PeekUID(tc.token)
		if err == nil || !errors.Is(err, core.ErrInvalid) {
			t.Errorf("PeekUID(%s) = %q, %v; want an ErrInvalid", tc.name, uid, err)
		}
	}
}

func TestValidUIDAndTemplate(t *testing.T) {
	for s, ok := range map[string]bool{
		"a": true, "g-1": true, "0b5c3e8e-7b1f-4f2e-9d55-1c2a3b4c5d6e": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, "A": false, "a_b": false, "a.b": false, strings.Repeat("a", 64): false,
	} {
		if err := ValidUID(s); (err == nil) != ok {
			t.Errorf("ValidUID(%q) = %v, want ok=%v", s, err, ok)
		}
	}
	// A refused UID is named shortened and escaped, never whole: it comes
	// from whoever sent the request.
	for _, s := range []string{"../../etc", "a\x00b", strings.Repeat("x", 5000), "a\x1b[2Jb\nforged line", strings.Repeat("é", 40)} {
		err := ValidUID(s)
		if err == nil {
			t.Fatalf("ValidUID(%q) accepted", s)
		}
		msg := err.Error()
		if len(msg) > 160 || strings.ContainsAny(msg, "\x00\x1b\n") || (len(s) > 40 && strings.Contains(msg, s)) {
			t.Errorf("ValidUID(%.40q...) = %q: not short and escaped", s, msg)
		}
	}
	hex64 := strings.Repeat("ab", 32)
	for s, ok := range map[string]bool{
		"a@sha256:" + hex64: true, "py.counter_v2-x@sha256:" + hex64: true,
		"@sha256:" + hex64: false, "a@sha256:" + hex64[:63]: false, "a@sha256:" + hex64 + "0": false,
		"A@sha256:" + hex64: false, "a@sha512:" + hex64: false, "a/b@sha256:" + hex64: false, "a": false,
		"a@sha256:" + strings.ToUpper(hex64): false, strings.Repeat("a", 129) + "@sha256:" + hex64: false,
	} {
		if err := ValidTemplate(s); (err == nil) != ok {
			t.Errorf("ValidTemplate(%q) = %v, want ok=%v", s, err, ok)
		}
	}
}
