package grant

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"errors"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
)

// KeySource finds the issuer's public key named kid. Cache (keys found by
// OIDC discovery) and StaticKeys (a local JWKS) implement it.
//
// Key returns an error wrapping core.ErrUnauthenticated when the source is
// usable but has no key kid, and one wrapping core.ErrUnverifiable when it
// cannot answer now (keys never loaded, or too old). The Verifier treats any
// other error as core.ErrUnverifiable. Key must be safe for concurrent use.
type KeySource interface {
	Key(ctx context.Context, kid string) (*jose.JSONWebKey, error)
}

var (
	_ KeySource = (*Cache)(nil)
	_ KeySource = (*StaticKeys)(nil)
)

// DefaultLeeway is the clock skew VerifierConfig.Leeway allows by default.
const DefaultLeeway = time.Minute

// VerifierConfig configures a Verifier. pkg/fiberd fills it from the flags
// -issuer, -node-id, -max-lease and the key cache or -issuer-keys.
type VerifierConfig struct {
	// Issuer is the issuer URL a token's iss must equal exactly. Required.
	Issuer string
	// Audience is this home's node id (in Kubernetes the Pod name). A
	// token's aud must hold exactly one value, equal to it. Required.
	Audience string
	// Keys finds the issuer's public keys. Required: a *Cache or a
	// *StaticKeys.
	Keys KeySource
	// MaxLease, when positive, refuses tokens whose lease (exp - iat) is
	// longer. Zero (the default) accepts any lease.
	MaxLease time.Duration
	// Leeway is the clock skew allowed between the issuer and this home: a
	// token is refused while now + Leeway is before its optional nbf, and
	// when its iat is more than Leeway after now (a token "issued" in the
	// future would outrank every renewal issued before that time). Default
	// DefaultLeeway (one minute). exp is not checked at all (see Verify).
	Leeway time.Duration
	// Clock reads the time for the nbf and iat checks. Default
	// clock.RealClock{}.
	Clock clock.PassiveClock
}

// Validate reports the first field that is missing or wrong, and how to fix
// it. It does not apply defaults.
func (c VerifierConfig) Validate() error {
	switch {
	case c.Issuer == "":
		return fmt.Errorf("grant verifier: Issuer is empty: set it to the issuer URL tokens carry in iss: %w", core.ErrInvalid)
	case c.Audience == "":
		return fmt.Errorf("grant verifier: Audience is empty: set it to this home's node id: %w", core.ErrInvalid)
	case c.Keys == nil:
		return fmt.Errorf("grant verifier: Keys is nil: pass a *grant.Cache or *grant.StaticKeys: %w", core.ErrInvalid)
	case c.MaxLease < 0:
		return fmt.Errorf("grant verifier: MaxLease %v is negative: use 0 for no limit: %w", c.MaxLease, core.ErrInvalid)
	case c.Leeway < 0:
		return fmt.Errorf("grant verifier: Leeway %v is negative: use 0 for the default %v: %w", c.Leeway, DefaultLeeway, core.ErrInvalid)
	}
	return nil
}

// withDefaults returns c with its zero fields defaulted. It does no I/O.
func (c VerifierConfig) withDefaults() VerifierConfig {
	if c.Leeway == 0 {
		c.Leeway = DefaultLeeway
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return c
}

// Verifier checks grant tokens for one issuer and one audience. It is safe
// for concurrent use; the agent calls Verify for every delivered token.
type Verifier struct {
	cfg VerifierConfig
}

// NewVerifier validates cfg, applies its defaults and returns a Verifier.
// It loads no keys; the KeySource does that on demand.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Verifier{cfg: cfg.withDefaults()}, nil
}

// Verify checks token and returns the grant it carries, with every field of
// core.Grant filled (Token holds a copy of token).
//
// The checks run in this order: size (at most MaxTokenSize, before any
// decoding), compact form, alg on the allow-list, kid present, no crit
// header (no JWS extension is supported; the refusal names them), key kid
// from the KeySource, signature, then the claims: jti a DNS-1123 label, iss
// equal to Issuer, aud a single value equal to Audience, iat and exp present
// with exp after iat, the lease within MaxLease, nbf (if present) reached,
// iat no more than Leeway ahead of the clock, and the "grant" claim strictly
// decoded.
//
// A bad token returns an error wrapping core.ErrUnauthenticated that says
// why ("algorithm HS256 not allowed", "unknown kid", "audience ...").
// A token that cannot be checked because the keys were never loaded or are
// stale returns an error wrapping core.ErrUnverifiable.
//
// An expired token is not an error: Verify returns the grant, and the caller
// compares Expiry with its clock (core.Grant.Expired), since a lapsed lease
// is a capacity miss, not a failed authentication.
func (v *Verifier) Verify(ctx context.Context, token []byte) (core.Grant, error) {
	hdrSeg, _, _, err := compactParts(token)
	if err != nil {
		return core.Grant{}, unauthenticated("", err)
	}
	hdr, err := parseHeader(hdrSeg)
	if err != nil {
		return core.Grant{}, unauthenticated("", err)
	}
	jws, err := jose.ParseSignedCompact(string(token), algorithms)
	if err != nil {
		return core.Grant{}, unauthenticated("", fmt.Errorf("malformed JWS: %v", err))
	}
	if len(jws.Signatures) != 1 {
		return core.Grant{}, unauthenticated("", fmt.Errorf("token has %d signatures, want exactly 1", len(jws.Signatures)))
	}
	if got := jws.Signatures[0].Protected; got.Algorithm != hdr.Alg || got.KeyID != hdr.Kid {
		return core.Grant{}, unauthenticated("", errors.New("header alg or kid outside the protected header"))
	}
	key, err := v.cfg.Keys.Key(ctx, hdr.Kid)
	if err != nil {
		if errors.Is(err, core.ErrUnauthenticated) || errors.Is(err, core.ErrUnverifiable) {
			return core.Grant{}, fmt.Errorf("grant token: %w", err)
		}
		return core.Grant{}, fmt.Errorf("grant token: kid %s: %v: %w", printable(hdr.Kid), err, core.ErrUnverifiable)
	}
	if err := keyFits(key, jose.SignatureAlgorithm(hdr.Alg)); err != nil {
		return core.Grant{}, unauthenticated("", fmt.Errorf("kid %s: %v", printable(hdr.Kid), err))
	}
	pub := key.Public()
	payload, err := jws.Verify(pub.Key)
	if err != nil {
		return core.Grant{}, unauthenticated("", fmt.Errorf("kid %s: signature invalid", printable(hdr.Kid)))
	}
	c, err := parseClaims(payload)
	if err != nil {
		return core.Grant{}, unauthenticated(c.g.UID, err)
	}
	g := c.g
	if g.Issuer != v.cfg.Issuer {
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("issuer %q is not the configured %q", g.Issuer, v.cfg.Issuer))
	}
	switch {
	case len(c.aud) == 0:
		return core.Grant{}, unauthenticated(g.UID, errors.New("audience is missing"))
	case len(c.aud) > 1:
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("audience has %d values, want exactly 1 (%q)", len(c.aud), v.cfg.Audience))
	case c.aud[0] != v.cfg.Audience:
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("audience %q is not this home (%q)", c.aud[0], v.cfg.Audience))
	}
	g.Audience = c.aud[0]
	if v.cfg.MaxLease > 0 && g.Lease() > v.cfg.MaxLease {
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("lease %v is longer than the maximum %v", g.Lease(), v.cfg.MaxLease))
	}
	now := v.cfg.Clock.Now()
	if c.hasNbf && now.Add(v.cfg.Leeway).Before(c.nbf) {
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("not valid before %v", c.nbf))
	}
	if ahead := g.IssuedAt.Sub(now); ahead > v.cfg.Leeway {
		return core.Grant{}, unauthenticated(g.UID, fmt.Errorf("issued at %s, %v in the future, more than the allowed clock skew of %v: check the issuer's and this home's clocks",
			g.IssuedAt.Format(time.RFC3339), ahead.Round(time.Second), v.cfg.Leeway))
	}
	g.Token = append([]byte(nil), token...)
	return g, nil
}

// unauthenticated wraps reason in core.ErrUnauthenticated, naming the grant
// when its uid is known.
func unauthenticated(uid string, reason error) error {
	if uid != "" {
		return fmt.Errorf("grant %q: %v: %w", uid, reason, core.ErrUnauthenticated)
	}
	return fmt.Errorf("grant token: %v: %w", reason, core.ErrUnauthenticated)
}

// keyFits reports whether key can check a signature made with alg: an
// Ed25519 key for EdDSA, a P-256 key for ES256.
func keyFits(key *jose.JSONWebKey, alg jose.SignatureAlgorithm) error {
	if key == nil || key.Key == nil {
		return errors.New("key source returned no key")
	}
	if key.Algorithm != "" && key.Algorithm != string(alg) {
		return fmt.Errorf("key is for %s, token is signed with %s", printable(key.Algorithm), alg)
	}
	switch k := key.Key.(type) {
	case ed25519.PublicKey, ed25519.PrivateKey:
		if alg == jose.EdDSA {
			return nil
		}
	case *ecdsa.PublicKey:
		if alg == jose.ES256 && k.Curve == elliptic.P256() {
			return nil
		}
	case *ecdsa.PrivateKey:
		if alg == jose.ES256 && k.Curve == elliptic.P256() {
			return nil
		}
	}
	return fmt.Errorf("key type %T does not fit algorithm %s", key.Key, alg)
}
