package grant

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/core"
)

// Signer mints grant tokens with one private key. The development issuer,
// fiberctl grant mint and tests use it. It is safe for concurrent use.
type Signer struct {
	alg    jose.SignatureAlgorithm
	kid    string
	signer jose.Signer
}

// NewSigner returns a Signer for key, a private Ed25519 key (alg EdDSA) or a
// private P-256 key (alg ES256) with a KeyID, which every token names in its
// kid header. A public key, another key type, a missing KeyID, or an
// Algorithm that does not fit the key is an error wrapping core.ErrInvalid.
func NewSigner(key jose.JSONWebKey) (*Signer, error) {
	alg, err := privateAlg(key)
	if err != nil {
		return nil, fmt.Errorf("grant signer: %v: %w", err, core.ErrInvalid)
	}
	if key.KeyID == "" {
		return nil, fmt.Errorf("grant signer: key has no KeyID: %w", core.ErrInvalid)
	}
	opts := (&jose.SignerOptions{}).WithType("JWT")
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		return nil, fmt.Errorf("grant signer: %v: %w", err, core.ErrInvalid)
	}
	return &Signer{alg: alg, kid: key.KeyID, signer: s}, nil
}

// privateAlg returns the algorithm a private key signs with.
func privateAlg(key jose.JSONWebKey) (jose.SignatureAlgorithm, error) {
	var alg jose.SignatureAlgorithm
	switch k := key.Key.(type) {
	case ed25519.PrivateKey:
		if len(k) != ed25519.PrivateKeySize {
			return "", errors.New("Ed25519 private key has the wrong size")
		}
		alg = jose.EdDSA
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return "", errors.New("ECDSA key is not on curve P-256")
		}
		alg = jose.ES256
	default:
		return "", fmt.Errorf("key type %T is not a private Ed25519 or P-256 key", key.Key)
	}
	if key.Algorithm != "" && key.Algorithm != string(alg) {
		return "", fmt.Errorf("key says alg %s but is a %s key", printable(key.Algorithm), alg)
	}
	return alg, nil
}

// Algorithm is the alg of the tokens the signer mints: EdDSA or ES256.
func (s *Signer) Algorithm() jose.SignatureAlgorithm { return s.alg }

// KeyID is the kid of the tokens the signer mints.
func (s *Signer) KeyID() string { return s.kid }

// mintClaims is the payload of a minted token.
type mintClaims struct {
	Issuer   string     `json:"iss"`
	Audience string     `json:"aud"`
	UID      string     `json:"jti"`
	IssuedAt int64      `json:"iat"`
	Expiry   int64      `json:"exp"`
	Grant    grantClaim `json:"grant"`
}

// Mint signs g and returns the compact token. iss, aud, jti, iat and exp
// come from g.Issuer, g.Audience, g.UID, g.IssuedAt and g.Expiry (whole
// seconds; fractions are dropped); the "grant" claim from the other fields
// (zero WBudget, Warm and Devices are left out; an empty MinTier is left out,
// which reads as BASIC). g.Token is ignored.
//
// g must be a grant Verify would accept: a DNS-1123 UID, a non-empty Issuer
// and Audience, a valid Template, Fibers.Max >= 1, 0 <= Warm <= Max, a known
// MinTier, and Expiry after IssuedAt in whole seconds. Otherwise, or when the
// token would exceed MaxTokenSize, Mint returns an error wrapping
// core.ErrInvalid.
func (s *Signer) Mint(g core.Grant) ([]byte, error) {
	c, err := mintPayload(g)
	if err != nil {
		return nil, fmt.Errorf("grant %q: %v: %w", g.UID, err, core.ErrInvalid)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("grant %q: %w", g.UID, err)
	}
	jws, err := s.signer.Sign(payload)
	if err != nil {
		return nil, fmt.Errorf("grant %q: sign: %w", g.UID, err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		return nil, fmt.Errorf("grant %q: serialise: %w", g.UID, err)
	}
	if len(tok) > MaxTokenSize {
		return nil, fmt.Errorf("grant %q: token of %d bytes is over the limit of %d: %w", g.UID, len(tok), MaxTokenSize, core.ErrInvalid)
	}
	return []byte(tok), nil
}

// mintPayload checks g and builds its claims.
func mintPayload(g core.Grant) (mintClaims, error) {
	if err := ValidUID(g.UID); err != nil {
		return mintClaims{}, err
	}
	switch {
	case g.Issuer == "":
		return mintClaims{}, errors.New("issuer is empty")
	case g.Audience == "":
		return mintClaims{}, errors.New("audience is empty")
	case g.Fibers.Max < 1:
		return mintClaims{}, fmt.Errorf("fibers.max %d is below 1", g.Fibers.Max)
	case g.Fibers.Warm < 0 || g.Fibers.Warm > g.Fibers.Max:
		return mintClaims{}, fmt.Errorf("fibers.warm %d is outside 0..fibers.max (%d)", g.Fibers.Warm, g.Fibers.Max)
	case g.WBudget < 0:
		return mintClaims{}, fmt.Errorf("wBudget %d is negative", g.WBudget)
	case g.IssuedAt.Unix() < 0 || g.Expiry.Unix() > maxNumericDate:
		return mintClaims{}, errors.New("iat or exp is out of range")
	case g.Expiry.Unix() <= g.IssuedAt.Unix():
		return mintClaims{}, fmt.Errorf("expiry %v is not after issuedAt %v (in whole seconds)", g.Expiry, g.IssuedAt)
	}
	if err := ValidTemplate(g.Template); err != nil {
		return mintClaims{}, err
	}
	if g.MinTier != "" {
		if _, err := core.ParseTier(string(g.MinTier)); err != nil {
			return mintClaims{}, fmt.Errorf("minTier: %v", err)
		}
	}
	if err := validDevices(g.Devices); err != nil {
		return mintClaims{}, err
	}
	c := mintClaims{
		Issuer:   g.Issuer,
		Audience: g.Audience,
		UID:      g.UID,
		IssuedAt: g.IssuedAt.Unix(),
		Expiry:   g.Expiry.Unix(),
		Grant: grantClaim{
			Template: g.Template,
			Fibers:   &fibersClaim{Max: g.Fibers.Max, Warm: g.Fibers.Warm},
			WBudget:  g.WBudget,
			MinTier:  string(g.MinTier),
		},
	}
	if g.Devices.Count > 0 {
		c.Grant.Devices = &deviceClaim{Class: g.Devices.Class, Count: g.Devices.Count}
	}
	return c, nil
}

// GenerateKey makes a new private signing key: alg "EdDSA" gives an Ed25519
// key, "ES256" a P-256 key. An empty kid is replaced by the key's RFC 7638
// SHA-256 thumbprint in base64url. The key's Algorithm and Use ("sig") are
// set. Any other alg is an error wrapping core.ErrInvalid.
func GenerateKey(alg, kid string) (jose.JSONWebKey, error) {
	var priv any
	switch jose.SignatureAlgorithm(alg) {
	case jose.EdDSA:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return jose.JSONWebKey{}, err
		}
		priv = k
	case jose.ES256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return jose.JSONWebKey{}, err
		}
		priv = k
	default:
		return jose.JSONWebKey{}, fmt.Errorf("grant key: algorithm %s not supported (want EdDSA or ES256): %w", printable(alg), core.ErrInvalid)
	}
	key := jose.JSONWebKey{Key: priv, KeyID: kid, Algorithm: alg, Use: "sig"}
	if kid == "" {
		tp, err := key.Thumbprint(crypto.SHA256)
		if err != nil {
			return jose.JSONWebKey{}, err
		}
		key.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	}
	return key, nil
}

// PublicJWKS returns the JWK set {"keys":[...]} of the public halves of keys
// (private or public), each with its kid, "use":"sig" and its alg, as the
// issuer publishes at its jwks_uri or as a -issuer-keys file. A key that is
// not Ed25519 or P-256, or has no KeyID, is an error wrapping
// core.ErrInvalid.
func PublicJWKS(keys ...jose.JSONWebKey) ([]byte, error) {
	set := jose.JSONWebKeySet{Keys: make([]jose.JSONWebKey, 0, len(keys))}
	for i, k := range keys {
		pub := k.Public()
		var alg jose.SignatureAlgorithm
		switch key := pub.Key.(type) {
		case ed25519.PublicKey:
			alg = jose.EdDSA
		case *ecdsa.PublicKey:
			if key.Curve != elliptic.P256() {
				return nil, fmt.Errorf("grant jwks: key %d is not on curve P-256: %w", i, core.ErrInvalid)
			}
			alg = jose.ES256
		default:
			return nil, fmt.Errorf("grant jwks: key %d of type %T is not Ed25519 or P-256: %w", i, k.Key, core.ErrInvalid)
		}
		if pub.KeyID == "" {
			return nil, fmt.Errorf("grant jwks: key %d has no KeyID: %w", i, core.ErrInvalid)
		}
		pub.Algorithm = string(alg)
		pub.Use = "sig"
		set.Keys = append(set.Keys, pub)
	}
	return json.MarshalIndent(set, "", "  ")
}

// WriteKeyFile writes key (normally private) as a JWK to path with mode
// 0600: to a temporary file in the same directory, synced, then renamed over
// path, so a failed write leaves any previous file intact.
func WriteKeyFile(path string, key jose.JSONWebKey) error {
	data, err := json.MarshalIndent(key, "", "  ")
	if err != nil {
		return fmt.Errorf("key file %s: %w", path, err)
	}
	return core.WriteFileAtomic(path, append(data, '\n'), 0o600)
}

// ReadKeyFile reads a JWK written by WriteKeyFile (at most 64 KiB). The file
// is trusted: it may, and for a Signer must, hold a private key.
func ReadKeyFile(path string) (jose.JSONWebKey, error) {
	data, err := core.ReadFileBounded(path, 64<<10)
	if err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("key file %s: %w", path, err)
	}
	var k jose.JSONWebKey
	if err := k.UnmarshalJSON(data); err != nil {
		return jose.JSONWebKey{}, fmt.Errorf("key file %s: %v: %w", path, err, core.ErrInvalid)
	}
	return k, nil
}
