package grantcli

import (
	"fmt"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// Keygen is the keygen command:
//
//	NAME [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
//
// It makes a new signing key (default EdDSA; the kid defaults to the key's
// RFC 7638 thumbprint), writes the private JWK to -out with mode 0600 and,
// with -jwks-out, the public JWKS (mode 0644), then prints "kid KID" to
// e.Stdout. The private key is written first: a JWKS without its private
// key would publish a key nobody can sign with. Each file is written
// atomically, so a failed write leaves any previous file intact.
//
// name is the command as the user typed it ("fiberctl grant keygen",
// "grant-issuer keygen"), the prefix of every message. It returns ExitUsage
// for a missing -out or an -alg other than EdDSA or ES256, ExitFailure when
// a file cannot be written (after the private key, the JWKS may be missing
// while the key exists), and ExitOK otherwise.
func Keygen(name string, args []string, e Env) int {
	fs := NewFlags(name, e.Stderr)
	alg := fs.String("alg", "EdDSA", "signature algorithm of the key: EdDSA or ES256")
	kid := fs.String("kid", "", "key id; empty uses the key's RFC 7638 thumbprint")
	out := fs.String("out", "", "file to write the private JWK to, mode 0600 (required)")
	jwksOut := fs.String("jwks-out", "", "file to write the public JWKS to (optional)")
	if st, ok := ParseFlags(fs, args); !ok {
		return st
	}
	if *alg != "EdDSA" && *alg != "ES256" {
		return UsageError(fs, "-alg %q: want EdDSA or ES256", *alg)
	}
	if *out == "" {
		return UsageError(fs, "-out is required: the file to write the private key to")
	}
	key, err := grant.GenerateKey(*alg, *kid)
	if err != nil {
		return Failure(fs, err)
	}
	if err := grant.WriteKeyFile(*out, key); err != nil {
		return Failure(fs, err)
	}
	if *jwksOut != "" {
		jwks, err := grant.PublicJWKS(key)
		if err != nil {
			return Failure(fs, err)
		}
		if err := core.WriteFileAtomic(*jwksOut, append(jwks, '\n'), 0o644); err != nil {
			return Failure(fs, err)
		}
	}
	fmt.Fprintf(e.Stdout, "kid %s\n", key.KeyID)
	return ExitOK
}
