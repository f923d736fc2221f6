// Package granttest provides a grant issuer for tests of packages that
// verify grants, in the manner of net/http/httptest: NewIssuer starts an
// httptest server on loopback answering OIDC discovery
// (/.well-known/openid-configuration) and a JWKS (/jwks) for one freshly
// generated signing key, and mints tokens that key signs.
//
// The Issuer counts the discovery and JWKS requests it served and can be
// switched to fail every request, so a test can watch a grant.Cache refresh
// and fail. Tests that need other server behaviour (a mismatching issuer in
// the discovery document, oversized or streamed bodies, rotating keys) keep
// their own handlers.
//
// Who imports it: tests of pkg/home/kubernetes and pkg/home/standalone (and
// any test that points a grant.Cache at an issuer). It imports pkg/grant and
// pkg/core, and no testing package: failures to set up panic, as httptest's
// do.
package granttest
