// Package grant reads, checks and writes grant tokens: the signed JWTs by
// which an issuer hands a home a block of capacity.
//
// A grant goes delivered -> verified -> admitted -> warm -> yielded. This
// package owns the first two steps and the token on the issuer's side:
//
//   - Verifier turns a delivered token into a verified core.Grant, or refuses
//     it. A bad token (size, algorithm, kid, signature, issuer, audience,
//     claims) wraps core.ErrUnauthenticated; a token that cannot be checked
//     now, because the issuer's keys were never loaded or are too old, wraps
//     core.ErrUnverifiable. An expired lease is neither: Verify returns the
//     grant and the agent turns the lapsed lease into a capacity miss.
//   - Cache is a KeySource holding an issuer's public keys, found by OIDC
//     discovery and read from its JWKS; StaticKeys is the offline KeySource
//     read from a local JWKS file (fiberd -issuer-keys).
//   - Signer mints tokens; GenerateKey, WriteKeyFile, ReadKeyFile and
//     PublicJWKS manage the issuer's keys (fiberctl grant keygen / mint, the
//     development issuer, tests).
//   - PeekUID reads a token's jti without verifying it, so a lane can name a
//     grant before the agent verifies it.
//
// The token format (docs/architecture.md, The grant token) is a JWS compact serialisation
// of at most MaxTokenSize bytes, alg EdDSA or ES256, a kid, no crit (no JWS
// extension is supported), the registered claims iss, aud (one value), jti
// (a DNS-1123 label), iat (at most the verifier's Leeway ahead of its clock)
// and exp, and the private claim "grant" whose members are checked strictly:
//
//	{"template":"name@sha256:<64 hex>","fibers":{"max":N,"warm":W},
//	 "wBudget":bytes,"minTier":"BASIC|WARM|CHECKPOINT",
//	 "devices":{"class":"gpu","count":1}}
//
// Importers: pkg/fiberd (Verifier, Cache, StaticKeys), the homes (Cache
// refresh, PeekUID), cmd/fiberctl, cmd/grant-issuer, pkg/issuer and the
// controller's issuer (Signer, keys), tests.
// This package imports pkg/core and no other package of the project.
package grant
