package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// runGrant dispatches "fiberctl grant <subcommand>".
func runGrant(args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, "fiberctl grant: missing subcommand: keygen, mint or verify")
		return grantcli.ExitUsage
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
	return grantcli.ExitUsage
}

// newFlags returns the flag set of "fiberctl NAME", reporting on e.stderr.
// Every fiberctl command parses and reports through package grantcli, so
// all of them name flags and exit as the grant commands do.
func newFlags(name string, e env) *flag.FlagSet {
	return grantcli.NewFlags("fiberctl "+name, e.stderr)
}

// grantEnv is the part of e the shared grant commands use.
func (e env) grantEnv() grantcli.Env {
	return grantcli.Env{Stdout: e.stdout, Stderr: e.stderr, Clock: e.clock}
}

// grantKeygen: fiberctl grant keygen [-alg EdDSA|ES256] [-kid K] -out key.jwk [-jwks-out jwks.json]
func grantKeygen(args []string, e env) int {
	return grantcli.Keygen("fiberctl grant keygen", args, e.grantEnv())
}

// grantMint: fiberctl grant mint -key key.jwk -issuer URL -audience NODE
// -template name@sha256:HEX [-uid U] [-max N] [-warm W] [-lease 10m]
// [-min-tier T] [-wbudget B] [-device-class C -device-count N]
func grantMint(args []string, e env) int {
	return grantcli.Mint("fiberctl grant mint", grantcli.MintOptions{KeygenName: "grant keygen", AllClaims: true}, args, e.grantEnv())
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
	if st, ok := grantcli.ParseFlags(fs, args); !ok {
		return st
	}
	if st, ok := grantcli.Required(fs, "jwks", "issuer", "audience"); !ok {
		return st
	}
	if *maxLease < 0 {
		return grantcli.UsageError(fs, "-max-lease %v: must not be negative", *maxLease)
	}
	keys, err := grant.ReadStaticKeys(*jwksFile)
	if err != nil {
		return grantcli.Failure(fs, err)
	}
	var in io.Reader = e.stdin
	if *tokenFile != "-" {
		f, err := os.Open(*tokenFile)
		if err != nil {
			return grantcli.Failure(fs, err)
		}
		defer f.Close()
		in = f
	}
	// Read one byte past the cap (plus a line end) so Verify sees an
	// oversized token as oversized.
	tok, err := io.ReadAll(io.LimitReader(in, grant.MaxTokenSize+2))
	if err != nil {
		return grantcli.Failure(fs, err)
	}
	tok = bytes.TrimSpace(tok)
	v, err := grant.NewVerifier(grant.VerifierConfig{
		Issuer: *issuer, Audience: *audience, Keys: keys, MaxLease: *maxLease, Clock: e.clock,
	})
	if err != nil {
		return grantcli.Failure(fs, err)
	}
	g, err := v.Verify(context.Background(), tok)
	if err != nil {
		return grantcli.Failure(fs, err)
	}
	out, _ := json.MarshalIndent(grantView{
		UID: g.UID, Issuer: g.Issuer, Audience: g.Audience, Template: g.Template, Fibers: g.Fibers,
		WBudget: g.WBudget, MinTier: g.MinTier, Devices: g.Devices, IssuedAt: g.IssuedAt,
		Expiry: g.Expiry, Expired: g.Expired(e.clock.Now()),
	}, "", "  ")
	fmt.Fprintf(e.stdout, "%s\n", out)
	return grantcli.ExitOK
}
