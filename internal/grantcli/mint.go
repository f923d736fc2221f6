package grantcli

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"time"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// DefaultLease is the default of mint's -lease when MintOptions.Lease is
// zero: 10 minutes.
const DefaultLease = 10 * time.Minute

// MintOptions are what differ between the binaries that offer mint. The
// zero value is a mint with the flags every binary has and the default
// lease.
type MintOptions struct {
	// KeygenName is the binary's keygen command as the help of -key names
	// it, such as "grant keygen". Default (empty): "keygen".
	KeygenName string
	// Lease is the default of -lease. Default (zero): DefaultLease.
	Lease time.Duration
	// AllClaims adds the flags -warm, -min-tier, -wbudget, -device-class
	// and -device-count, which set the grant's other claims. Without it
	// those flags are unknown (a usage error) and a minted grant has no
	// warm fibers, no write budget, no minimum tier (BASIC) and no devices.
	AllClaims bool
	// PodHints adds to the help of -audience and -uid what they are for a
	// grant Pod in Kubernetes: the Pod's name and UID. It changes the help
	// text only.
	PodHints bool
}

// withDefaults returns o with its zero fields set to their defaults.
func (o MintOptions) withDefaults() MintOptions {
	if o.KeygenName == "" {
		o.KeygenName = "keygen"
	}
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	return o
}

// claims are mint's flags beyond the required ones.
type claims struct {
	uid       string
	maxFibers int
	warm      int
	lease     time.Duration
	minTier   string
	wbudget   int64
	devClass  string
	devCount  int
}

// Mint is the mint command:
//
//	NAME -key key.jwk -issuer URL -audience NODE -template name@sha256:HEX
//	     [-uid U] [-max N] [-lease D]
//	     [-warm W] [-min-tier T] [-wbudget B] [-device-class C -device-count N]  (with AllClaims)
//
// It reads the private JWK of -key (as Keygen writes it), signs a grant
// issued now (e.Clock, truncated to the second) that expires after -lease,
// and prints the token and a line end to e.Stdout. An empty -uid picks a
// random DNS-1123 label "g-" + 20 hex digits.
//
// name is the command as the user typed it ("fiberctl grant mint",
// "grant-issuer mint"), the prefix of every message. It returns ExitUsage,
// naming the flag, when a required flag is empty, -template or -uid is
// malformed, -max is below 1, -warm is outside 0..-max, -lease is under a
// second, -min-tier is not a tier, -wbudget is negative, or -device-class
// and -device-count are not given together with a count of at least 1;
// ExitFailure when the key file cannot be read or cannot sign (the message
// names the file) or signing fails; ExitOK otherwise.
func Mint(name string, o MintOptions, args []string, e Env) int {
	o = o.withDefaults()
	fs := NewFlags(name, e.Stderr)
	audienceHelp, uidHelp := "node id of the home, the aud claim", "grant UID, the jti claim, a DNS-1123 label"
	if o.PodHints {
		audienceHelp += "; in Kubernetes the Pod name"
		uidHelp += " such as a Pod UID"
	}
	keyFile := fs.String("key", "", "private JWK file written by "+o.KeygenName+" (required)")
	issuer := fs.String("issuer", "", "issuer URL, the iss claim (required)")
	audience := fs.String("audience", "", audienceHelp+" (required)")
	template := fs.String("template", "", "template the grant runs, name@sha256:<64 hex> (required)")
	var c claims
	fs.StringVar(&c.uid, "uid", "", uidHelp+"; empty picks a random one")
	fs.IntVar(&c.maxFibers, "max", 1, "fibers.max: fibers that may run at once, at least 1")
	fs.DurationVar(&c.lease, "lease", o.Lease, "lease: exp - iat, at least 1s")
	if o.AllClaims {
		fs.IntVar(&c.warm, "warm", 0, "fibers.warm: fibers to keep ready, 0..max")
		fs.StringVar(&c.minTier, "min-tier", "", "minTier: BASIC, WARM or CHECKPOINT; empty means BASIC")
		fs.Int64Var(&c.wbudget, "wbudget", 0, "wBudget: bytes a fiber may dirty; 0 is no budget")
		fs.StringVar(&c.devClass, "device-class", "", "devices.class: the device class requested, such as gpu")
		fs.IntVar(&c.devCount, "device-count", 0, "devices.count: devices of -device-class requested")
	}
	if st, ok := ParseFlags(fs, args); !ok {
		return st
	}
	if st, ok := Required(fs, "key", "issuer", "audience", "template"); !ok {
		return st
	}
	if err := grant.ValidTemplate(*template); err != nil {
		return UsageError(fs, "-template: %v", err)
	}
	tier, st, ok := c.check(fs)
	if !ok {
		return st
	}
	key, err := grant.ReadKeyFile(*keyFile)
	if err != nil {
		return Failure(fs, err)
	}
	signer, err := grant.NewSigner(key)
	if err != nil {
		return Failure(fs, fmt.Errorf("-key %s: %w", *keyFile, err))
	}
	now := e.clock().Now().Truncate(time.Second)
	tok, err := signer.Mint(core.Grant{
		UID:      c.uid,
		Issuer:   *issuer,
		Audience: *audience,
		Template: *template,
		Fibers:   core.Fibers{Max: c.maxFibers, Warm: c.warm},
		WBudget:  c.wbudget,
		MinTier:  tier,
		Devices:  core.DeviceRequest{Class: c.devClass, Count: c.devCount},
		IssuedAt: now,
		Expiry:   now.Add(c.lease),
	})
	if err != nil {
		return Failure(fs, err)
	}
	fmt.Fprintf(e.Stdout, "%s\n", tok)
	return ExitOK
}

// check validates c in flag order, picks a random uid when it is empty,
// and returns the grant's minimum tier ("" when -min-tier is empty). ok
// false means the offending flag was reported on fs and status
// (ExitUsage) should be returned.
func (c *claims) check(fs *flag.FlagSet) (tier core.Tier, status int, ok bool) {
	if c.uid == "" {
		c.uid = randomUID()
	} else if err := grant.ValidUID(c.uid); err != nil {
		return "", UsageError(fs, "-uid: %v", err), false
	}
	if c.maxFibers < 1 {
		return "", UsageError(fs, "-max %d: must be at least 1", c.maxFibers), false
	}
	if c.warm < 0 || c.warm > c.maxFibers {
		return "", UsageError(fs, "-warm %d: must be between 0 and -max (%d)", c.warm, c.maxFibers), false
	}
	if c.lease < time.Second {
		return "", UsageError(fs, "-lease %v: must be at least 1s", c.lease), false
	}
	if c.minTier != "" {
		var err error
		if tier, err = core.ParseTier(c.minTier); err != nil {
			return "", UsageError(fs, "-min-tier: %v", err), false
		}
	}
	if c.wbudget < 0 {
		return "", UsageError(fs, "-wbudget %d: must not be negative", c.wbudget), false
	}
	if c.devCount < 0 || (c.devCount > 0) != (c.devClass != "") {
		return "", UsageError(fs, "-device-class and -device-count go together, with a count of at least 1"), false
	}
	return tier, ExitOK, true
}

// randomUID returns a random DNS-1123 label "g-" + 20 hex digits.
func randomUID() string {
	b := make([]byte, 10)
	rand.Read(b) // never fails (crypto/rand)
	return "g-" + hex.EncodeToString(b)
}
