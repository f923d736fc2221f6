package grant

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/core"
)

func TestKeyFileRoundTrip(t *testing.T) {
	for _, alg := range []string{"EdDSA", "ES256"} {
		t.Run(alg, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "key.jwk")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			key := mustKey(t, alg, "")
			if key.KeyID == "" || key.Algorithm != alg || key.Use != "sig" {
				t.Fatalf("GenerateKey: kid %q alg %q use %q", key.KeyID, key.Algorithm, key.Use)
			}
			if err := WriteKeyFile(path, key); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("directory holds %d entries after the write, want 1 (no temp files)", len(ents))
			}
			back, err := ReadKeyFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if back.KeyID != key.KeyID || back.IsPublic() {
				t.Fatalf("ReadKeyFile: kid %q public %v", back.KeyID, back.IsPublic())
			}
			// The read key signs tokens the public JWKS verifies.
			jwks, err := PublicJWKS(back)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(jwks), `"d"`) {
				t.Fatalf("public JWKS holds private material: %s", jwks)
			}
			keys, err := NewStaticKeys(jwks)
			if err != nil {
				t.Fatal(err)
			}
			v := newTestVerifier(t, keys, nil)
			if _, err := v.Verify(context.Background(), mint(t, back, goodGrant())); err != nil {
				t.Errorf("Verify after the key file round trip: %v", err)
			}
		})
	}
}

func TestNewSignerRefuses(t *testing.T) {
	ed := mustKey(t, "EdDSA", "k1")
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	noKid := ed
	noKid.KeyID = ""
	wrongAlg := ed
	wrongAlg.Algorithm = "ES256"
	for name, key := range map[string]jose.JSONWebKey{
		"public key":    ed.Public(),
		"symmetric key": {Key: []byte("0123456789abcdef0123456789abcdef"), KeyID: "s"},
		"P-384":         {Key: p384, KeyID: "p"},
		"no kid":        noKid,
		"alg mismatch":  wrongAlg,
	} {
		if _, err := NewSigner(key); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("NewSigner(%s) = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := GenerateKey("RS256", "k"); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("GenerateKey(RS256) = %v, want ErrInvalid", err)
	}
	if _, err := PublicJWKS(noKid); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("PublicJWKS(no kid) = %v, want ErrInvalid", err)
	}
}

func TestMintRefusesBadGrants(t *testing.T) {
	s, err := NewSigner(mustKey(t, "ES256", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Algorithm() != jose.ES256 || s.KeyID() != "k1" {
		t.Errorf("signer alg %s kid %s", s.Algorithm(), s.KeyID())
	}
	for name, mut := range map[string]func(*core.Grant){
		"bad uid":          func(g *core.Grant) { g.UID = "Bad" },
		"no issuer":        func(g *core.Grant) { g.Issuer = "" },
		"no audience":      func(g *core.Grant) { g.Audience = "" },
		"bad template":     func(g *core.Grant) { g.Template = "x" },
		"max 0":            func(g *core.Grant) { g.Fibers.Max = 0 },
		"warm > max":       func(g *core.Grant) { g.Fibers.Warm = 9 },
		"bad tier":         func(g *core.Grant) { g.MinTier = "GOLD" },
		"negative budget":  func(g *core.Grant) { g.WBudget = -1 },
		"expiry = iat":     func(g *core.Grant) { g.Expiry = g.IssuedAt.Add(500 * time.Millisecond) },
		"class, no count":  func(g *core.Grant) { g.Devices.Count = 0 },
		"oversized claims": func(g *core.Grant) { g.Issuer = "https://" + strings.Repeat("x", MaxTokenSize) },
	} {
		g := goodGrant()
		mut(&g)
		if _, err := s.Mint(g); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("Mint(%s) = %v, want ErrInvalid", name, err)
		}
	}
}
