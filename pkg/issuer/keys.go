package issuer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/go-jose/go-jose/v4"

	"fiberd.io/fiberd/pkg/grant"
)

// KeySet is what an issuer signs with and publishes at one moment: the
// signer of new grants and the public keys of its JWKS, which include the
// signer's. It is immutable once built by NewKeySet.
type KeySet struct {
	signer *grant.Signer
	kids   []string
	jwks   []byte
	algs   []string
}

// NewKeySet builds the set that signs with signing (a private key
// grant.NewSigner accepts) and publishes the public halves of signing and
// of every key in published: NewSignerKeySet of signing's Signer.
func NewKeySet(signing jose.JSONWebKey, published ...jose.JSONWebKey) (*KeySet, error) {
	signer, err := grant.NewSigner(signing)
	if err != nil {
		return nil, fmt.Errorf("issuer: signing key: %w", err)
	}
	return NewSignerKeySet(signer, append([]jose.JSONWebKey{signing}, published...)...)
}

// NewSignerKeySet builds the set that signs with signer and publishes the
// public halves of published (private or public keys; only the public halves
// are served), a kid once. One of them must have the signer's kid, so no
// grant is signed with a key the JWKS does not hold. It fails when a key
// cannot be published (grant.PublicJWKS) or two different keys share a kid.
func NewSignerKeySet(signer *grant.Signer, published ...jose.JSONWebKey) (*KeySet, error) {
	if signer == nil {
		return nil, errors.New("issuer: no signer: make one with grant.NewSigner")
	}
	var keys []jose.JSONWebKey
	seen := map[string]jose.JSONWebKey{}
	for _, k := range published {
		if prev, ok := seen[k.KeyID]; ok {
			if !samePublic(prev, k.Public()) {
				return nil, fmt.Errorf("issuer: two different keys have kid %q: give every key its own kid", k.KeyID)
			}
			continue
		}
		seen[k.KeyID] = k.Public()
		keys = append(keys, k)
	}
	if _, ok := seen[signer.KeyID()]; !ok {
		return nil, fmt.Errorf("issuer: no published key has the signer's kid %q: publish the signing key", signer.KeyID())
	}
	jwks, err := grant.PublicJWKS(keys...)
	if err != nil {
		return nil, fmt.Errorf("issuer: published keys: %w", err)
	}
	ks := &KeySet{signer: signer, jwks: jwks}
	for _, k := range keys {
		ks.kids = append(ks.kids, k.KeyID)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err == nil {
		for _, k := range set.Keys {
			if !slices.Contains(ks.algs, k.Algorithm) {
				ks.algs = append(ks.algs, k.Algorithm)
			}
		}
	}
	return ks, nil
}

// samePublic reports whether a and b are the same public key.
func samePublic(a, b jose.JSONWebKey) bool {
	ja, errA := a.MarshalJSON()
	jb, errB := b.MarshalJSON()
	return errA == nil && errB == nil && string(ja) == string(jb)
}

// Signer is the signer of new grants.
func (k *KeySet) Signer() *grant.Signer { return k.signer }

// KeyIDs are the kids published, in the order given.
func (k *KeySet) KeyIDs() []string { return slices.Clone(k.kids) }

// JWKS is the published JWK set document, public keys only.
func (k *KeySet) JWKS() []byte { return slices.Clone(k.jwks) }

// Keys gives a Server the KeySet to use for one request. Implementations are
// safe for concurrent use; they must not block on I/O.
type Keys interface {
	// KeySet is the current set, or an error (served as 503) while there
	// is none, such as before the first load.
	KeySet() (*KeySet, error)
}

// StaticKeys is Keys that always answers one set.
type StaticKeys struct{ Set *KeySet }

// KeySet answers s.Set, or an error when it is nil.
func (s StaticKeys) KeySet() (*KeySet, error) {
	if s.Set == nil {
		return nil, errors.New("no key set")
	}
	return s.Set, nil
}
