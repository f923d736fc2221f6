package grant

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
)

// fuzzSeeds adds good tokens of both algorithms and a set of malformed ones
// to f, and returns the keys that signed the good ones.
func fuzzSeeds(f *testing.F) (edKey, ecKey jose.JSONWebKey) {
	edKey = mustKey(f, "EdDSA", "k-ed")
	ecKey = mustKey(f, "ES256", "k-ec")
	ed := mint(f, edKey, goodGrant())
	g := goodGrant()
	g.Devices = core.DeviceRequest{}
	g.MinTier = ""
	g.UID = strings.Repeat("a", 63)
	ec := mint(f, ecKey, g)
	future := goodGrant()
	future.IssuedAt, future.Expiry = testNow.Add(time.Hour), testNow.Add(2*time.Hour)
	payload := []byte(`{"jti":"g-1"}`)
	for _, s := range []string{
		string(ed), string(ec), "", ".", "..", "a.b.c", "e30.e30.", "e30.e30.e30.e30",
		string(mint(f, edKey, future)),
		string(signCrit(f, edKey, payload, "b64")),
		string(signCrit(f, edKey, payload, "a", "b", "c", "d", "e", "f")),
		string(unsigned(map[string]any{"alg": "EdDSA", "kid": "k-ed", "crit": []any{1, "\x1b[2J"}}, goodClaims(), "AA")),
		b64([]byte(`{"`+strings.Repeat("n", 600)+`":1,"`+strings.Repeat("n", 600)+`":2}`)) + ".e30.AA",
		string(unsigned(map[string]any{"alg": "none", "kid": "k-ed"}, goodClaims(), "")),
		string(unsigned(map[string]any{"alg": "EdDSA", "kid": "k-ed"}, map[string]any{"jti": "x", "grant": map[string]any{"fibers": map[string]any{"max": 1e300}}}, "AA")),
		"eyJhbGciOiJFZERTQSIsImtpZCI6ImstZWQifQ." + b64([]byte(`{"jti":"a","iat":1e999,"exp":-1}`)) + ".AA",
		strings.Repeat("A", MaxTokenSize+1),
	} {
		f.Add([]byte(s))
	}
	return edKey, ecKey
}

// FuzzParse feeds arbitrary bytes to the unverified parsing steps: the size
// and form check, the header, the claims. None may panic, an accepted header
// has an allowed alg, a kid and no crit, a header refusal is short and
// escaped, and accepted claims must be well formed.
func FuzzParse(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, token []byte) {
		h, p, _, err := compactParts(token)
		if err != nil {
			return
		}
		if hdr, err := parseHeader(h); err == nil {
			raw, _ := decodeSegment("header", h)
			m, _ := members(raw)
			if _, crit := m["crit"]; crit || !algorithmAllowed(hdr.Alg) || hdr.Kid == "" {
				t.Fatalf("parseHeader accepted %+v from %q", hdr, raw)
			}
		} else if strings.ContainsAny(err.Error(), "\x00\x1b\n") || len(err.Error()) > 512 {
			t.Fatalf("parseHeader error is not short and escaped: %q", err)
		}
		payload, err := decodeSegment("payload", p)
		if err != nil {
			return
		}
		c, err := parseClaims(payload)
		if err != nil {
			return
		}
		if ValidUID(c.g.UID) != nil || ValidTemplate(c.g.Template) != nil || c.g.Fibers.Max < 1 ||
			c.g.MinTier.Rank() == 0 || !c.g.Expiry.After(c.g.IssuedAt) || c.g.Issuer == "" {
			t.Fatalf("parseClaims accepted a malformed grant: %+v", c.g)
		}
	})
}

// FuzzVerify feeds arbitrary tokens to a Verifier. It must not panic; every
// error is classed; an accepted token is for the configured issuer and
// audience and was not issued beyond the clock skew.
func FuzzVerify(f *testing.F) {
	edKey, ecKey := fuzzSeeds(f)
	v, err := NewVerifier(VerifierConfig{
		Issuer: testIssuer, Audience: testAudience, Keys: mustStatic(f, edKey, ecKey), MaxLease: time.Hour,
		Clock: clocktesting.NewFakePassiveClock(testNow),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, token []byte) {
		g, err := v.Verify(context.Background(), token)
		if err != nil {
			if !errors.Is(err, core.ErrUnauthenticated) {
				t.Fatalf("unclassed error: %v", err)
			}
			return
		}
		// Only tokens signed by the seed keys pass (the seeds and
		// mutations that leave the signed parts alone), never one issued
		// beyond the clock skew.
		if g.Issuer != testIssuer || g.Audience != testAudience || ValidUID(g.UID) != nil || g.IssuedAt.After(testNow.Add(DefaultLeeway)) {
			t.Fatalf("accepted a wrong grant: %+v", g)
		}
	})
}

// FuzzPeekUID feeds arbitrary bytes to PeekUID: no panic, and any uid it
// returns is a DNS-1123 label.
func FuzzPeekUID(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, token []byte) {
		uid, err := PeekUID(token)
		if err != nil {
			if uid != "" || !errors.Is(err, core.ErrInvalid) {
				t.Fatalf("PeekUID = %q, %v", uid, err)
			}
			return
		}
		if ValidUID(uid) != nil || len(token) > MaxTokenSize {
			t.Fatalf("PeekUID accepted %q from a %d-byte token", uid, len(token))
		}
	})
}
