package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// runGrant dispatches "fiberctl grant <subcommand>".
func runGrant(args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "fiberctl grant: missing subcommand: keygen, mint or verify")
		return exitUsage
	}
	switch args[0] {
	case "keygen":
		return grantKeygen(args[1:], e)
	case "mint":
		return grantMint(args[1:], e)
	case "verify":
		return grantVerify(args[1:], e)
	}
	fmt.Fprintf(e.stderr, "fiberctl grant: unknown subcommand %q: want keygen, mint or verify\n", args[0])
	return exitUsage
}

// newFlags returns a flag set that reports errors on e.stderr and lets the
// caller pick the exit status.
func newFlags(name string, e env) *flag.FlagSet {
	fs := flag.NewFlagSet("fiberctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

// parseFlags parses args and refuses positional arguments. It returns the
// exit status to use when ok is false.
func parseFlags(fs *flag.FlagSet, args []string) (status int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false // the flag package printed the message
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return exitOK, true
}

// usageError prints a message naming the offending flag and returns
// exitUsage.
func usageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	return exitUsage
}

// failure prints err and returns exitFailure.
func failure(fs *flag.FlagSet, err error) int {
	fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
	return exitFailure
}

// grantKeygen: fiberctl grant keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
func grantKeygen(args []string, e env) int {
	fs := newFlags("grant keygen", e)
	alg := fs.String("alg", "EdDSA", "signature algorithm of the key: EdDSA or ES256")
	kid := fs.String("kid", "", "key id; empty uses the key's RFC 7638 thumbprint")
	out := fs.String("out", "", "file to write the private JWK to, mode 0600 (required)")
	jwksOut := fs.String("jwks-out", "", "file to write the public JWKS to (optional)")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if *alg != "EdDSA" && *alg != "ES256" {
		return usageError(fs, "-alg %q: want EdDSA or ES256", *alg)
	}
	if *out == "" {
		return usageError(fs, "-out is required: the file to write the private key to")
	}
	key, err := grant.GenerateKey(*alg, *kid)
	if err != nil {
		return failure(fs, err)
	}
	// The private key first: a public JWKS without its private key would
	// publish a key nobody can sign with.
	if err := grant.WriteKeyFile(*out, key); err != nil {
		return failure(fs, err)
	}
	if *jwksOut != "" {
		jwks, err := grant.PublicJWKS(key)
		if err != nil {
			return failure(fs, err)
		}
		if err := core.WriteFileAtomic(*jwksOut, append(jwks, '\n'), 0o644); err != nil {
			return failure(fs, err)
		}
	}
	fmt.Fprintf(e.stdout, "kid %s\n", key.KeyID)
	return exitOK
}

// grantMint: fiberctl grant mint -key key.jwk -issuer URL -audience NODE
// -template name@sha256:HEX [-uid U] [-max N] [-warm W] [-lease 10m]
// [-min-tier T] [-wbudget B] [-device-class C -device-count N]
func grantMint(args []string, e env) int {
	fs := newFlags("grant mint", e)
	keyFile := fs.String("key", "", "private JWK file written by grant keygen (required)")
	issuer := fs.String("issuer", "", "issuer URL, the iss claim (required)")
	audience := fs.String("audience", "", "node id of the home, the aud claim (required)")
	template := fs.String("template", "", "template the grant runs, name@sha256:<64 hex> (required)")
	uid := fs.String("uid", "", "grant UID, the jti claim, a DNS-1123 label; empty picks a random one")
	maxFibers := fs.Int("max", 1, "fibers.max: fibers that may run at once, at least 1")
	warm := fs.Int("warm", 0, "fibers.warm: fibers to keep ready, 0..max")
	lease := fs.Duration("lease", 10*time.Minute, "lease: exp - iat, positive")
	minTier := fs.String("min-tier", "", "minTier: BASIC, WARM or CHECKPOINT; empty means BASIC")
	wbudget := fs.Int64("wbudget", 0, "wBudget: bytes a fiber may dirty; 0 is no budget")
	devClass := fs.String("device-class", "", "devices.class: the device class requested, such as gpu")
	devCount := fs.Int("device-count", 0, "devices.count: devices of -device-class requested")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	for _, req := range []struct{ name, val string }{
		{"key", *keyFile}, {"issuer", *issuer}, {"audience", *audience}, {"template", *template},
	} {
		if req.val == "" {
			return usageError(fs, "-%s is required", req.name)
		}
	}
	if err := grant.ValidTemplate(*template); err != nil {
		return usageError(fs, "-template: %v", err)
	}
	if *uid == "" {
		*uid = randomUID()
	} else if err := grant.ValidUID(*uid); err != nil {
		return usageError(fs, "-uid: %v", err)
	}
	if *maxFibers < 1 {
		return usageError(fs, "-max %d: must be at least 1", *maxFibers)
	}
	if *warm < 0 || *warm > *maxFibers {
		return usageError(fs, "-warm %d: must be between 0 and -max (%d)", *warm, *maxFibers)
	}
	if *lease < time.Second {
		return usageError(fs, "-lease %v: must be at least 1s", *lease)
	}
	tier, err := core.ParseTier(*minTier)
	if err != nil {
		return usageError(fs, "-min-tier: %v", err)
	}
	if *minTier == "" {
		tier = ""
	}
	if *wbudget < 0 {
		return usageError(fs, "-wbudget %d: must not be negative", *wbudget)
	}
	if *devCount < 0 || (*devCount > 0) != (*devClass != "") {
		return usageError(fs, "-device-class and -device-count go together, with a count of at least 1")
	}
	key, err := grant.ReadKeyFile(*keyFile)
	if err != nil {
		return failure(fs, err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		return failure(fs, fmt.Errorf("-key %s: %w", *keyFile, err))
	}
	now := e.clock.Now().Truncate(time.Second)
	tok, err := signer.Mint(core.Grant{
		UID:      *uid,
		Issuer:   *issuer,
		Audience: *audience,
		Template: *template,
		Fibers:   core.Fibers{Max: *maxFibers, Warm: *warm},
		WBudget:  *wbudget,
		MinTier:  tier,
		Devices:  core.DeviceRequest{Class: *devClass, Count: *devCount},
		IssuedAt: now,
		Expiry:   now.Add(*lease),
	})
	if err != nil {
		return failure(fs, err)
	}
	fmt.Fprintf(e.stdout, "%s\n", tok)
	return exitOK
}

// randomUID returns a random DNS-1123 label "g-" + 20 hex digits.
func randomUID() string {
	b := make([]byte, 10)
	rand.Read(b) // never fails (crypto/rand)
	return "g-" + hex.EncodeToString(b)
}

// grantView is what grant verify prints.
type grantView struct {
	UID      string             `json:"uid"`
	Issuer   string             `json:"issuer"`
	Audience string             `json:"audience"`
	Template string             `json:"template"`
	Fibers   core.Fibers        `json:"fibers"`
	WBudget  int64              `json:"wBudget"`
	MinTier  core.Tier          `json:"minTier"`
	Devices  core.DeviceRequest `json:"devices"`
	IssuedAt time.Time          `json:"issuedAt"`
	Expiry   time.Time          `json:"expiry"`
	Expired  bool               `json:"expired"`
}

// grantVerify: fiberctl grant verify -jwks FILE -issuer URL -audience NODE [-token FILE]
func grantVerify(args []string, e env) int {
	fs := newFlags("grant verify", e)
	jwksFile := fs.String("jwks", "", "public JWKS file of the issuer (required)")
	issuer := fs.String("issuer", "", "issuer URL the token's iss must equal (required)")
	audience := fs.String("audience", "", "node id the token's aud must equal (required)")
	tokenFile := fs.String("token", "-", "file holding the token; - reads standard input")
	maxLease := fs.Duration("max-lease", 0, "refuse leases longer than this; 0 is no limit")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	for _, req := range []struct{ name, val string }{
		{"jwks", *jwksFile}, {"issuer", *issuer}, {"audience", *audience},
	} {
		if req.val == "" {
			return usageError(fs, "-%s is required", req.name)
		}
	}
	if *maxLease < 0 {
		return usageError(fs, "-max-lease %v: must not be negative", *maxLease)
	}
	keys, err := grant.ReadStaticKeys(*jwksFile)
	if err != nil {
		return failure(fs, err)
	}
	var in io.Reader = e.stdin
	if *tokenFile != "-" {
		f, err := os.Open(*tokenFile)
		if err != nil {
			return failure(fs, err)
		}
		defer f.Close()
		in = f
	}
	// Read one byte past the cap (plus a line end) so Verify sees an
	// oversized token as oversized.
	tok, err := io.ReadAll(io.LimitReader(in, grant.MaxTokenSize+2))
	if err != nil {
		return failure(fs, err)
	}
	tok = bytes.TrimSpace(tok)
	v, err := grant.NewVerifier(grant.VerifierConfig{
		Issuer: *issuer, Audience: *audience, Keys: keys, MaxLease: *maxLease, Clock: e.clock,
	})
	if err != nil {
		return failure(fs, err)
	}
	g, err := v.Verify(context.Background(), tok)
	if err != nil {
		return failure(fs, err)
	}
	out, _ := json.MarshalIndent(grantView{
		UID: g.UID, Issuer: g.Issuer, Audience: g.Audience, Template: g.Template, Fibers: g.Fibers,
		WBudget: g.WBudget, MinTier: g.MinTier, Devices: g.Devices, IssuedAt: g.IssuedAt,
		Expiry: g.Expiry, Expired: g.Expired(e.clock.Now()),
	}, "", "  ")
	fmt.Fprintf(e.stdout, "%s\n", out)
	return exitOK
}
