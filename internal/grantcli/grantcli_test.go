package grantcli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

var testNow = time.Unix(1_800_000_000, 0).UTC()

const testTemplate = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The two ways the binaries call Mint today.
var (
	fiberctlMint = MintOptions{KeygenName: "grant keygen", AllClaims: true}
	issuerMint   = MintOptions{Lease: 10 * time.Minute, PodHints: true}
)

// keygen runs Keygen as "test keygen".
func keygen(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Keygen("test keygen", args, Env{Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// mint runs Mint as "test mint" with o, the fake clock at testNow.
func mint(t *testing.T, o MintOptions, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Mint("test mint", o, args, Env{Stdout: &out, Stderr: &errb, Clock: clocktesting.NewFakePassiveClock(testNow)})
	return code, out.String(), errb.String()
}

// newKey writes a fresh EdDSA key and its JWKS to dir and returns their paths.
func newKey(t *testing.T, dir string) (keyFile, jwksFile string) {
	t.Helper()
	keyFile, jwksFile = filepath.Join(dir, "key.jwk"), filepath.Join(dir, "jwks.json")
	if code, _, errs := keygen(t, "-out", keyFile, "-jwks-out", jwksFile); code != ExitOK {
		t.Fatalf("keygen: exit %d: %s", code, errs)
	}
	return keyFile, jwksFile
}

// verify checks tok against the JWKS in jwksFile for issuer and audience
// at testNow and returns its grant.
func verify(t *testing.T, jwksFile, tok, issuer, audience string) core.Grant {
	t.Helper()
	keys, err := grant.ReadStaticKeys(jwksFile)
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: issuer, Audience: audience, Keys: keys,
		Clock: clocktesting.NewFakePassiveClock(testNow)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(context.Background(), []byte(strings.TrimSpace(tok)))
	if err != nil {
		t.Fatalf("Verify minted token: %v", err)
	}
	return g
}

func TestKeygen(t *testing.T) {
	for _, tc := range []struct{ alg, kid string }{
		{"EdDSA", "k1"}, {"ES256", "k2"}, {"", ""}, // "" is the defaults: EdDSA, thumbprint kid
	} {
		t.Run(tc.alg+"/"+tc.kid, func(t *testing.T) {
			dir := t.TempDir()
			keyFile, jwksFile := filepath.Join(dir, "key.jwk"), filepath.Join(dir, "jwks.json")
			args := []string{"-out", keyFile, "-jwks-out", jwksFile}
			if tc.alg != "" {
				args = append(args, "-alg", tc.alg, "-kid", tc.kid)
			}
			code, out, errs := keygen(t, args...)
			if code != ExitOK {
				t.Fatalf("exit %d: %s", code, errs)
			}
			fi, err := os.Stat(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("private key mode %v, want 0600", fi.Mode().Perm())
			}
			jwks, err := os.ReadFile(jwksFile)
			if err != nil {
				t.Fatal(err)
			}
			var set struct{ Keys []map[string]any }
			if err := json.Unmarshal(jwks, &set); err != nil || len(set.Keys) != 1 || set.Keys[0]["d"] != nil {
				t.Fatalf("public JWKS %s (%v): want one key without its private part", jwks, err)
			}
			kid, _ := set.Keys[0]["kid"].(string)
			if kid == "" || (tc.kid != "" && kid != tc.kid) {
				t.Errorf("JWKS kid %q, want %q (or a thumbprint when empty)", kid, tc.kid)
			}
			if out != "kid "+kid+"\n" {
				t.Errorf("stdout %q, want %q", out, "kid "+kid+"\n")
			}
			wantAlg := tc.alg
			if wantAlg == "" {
				wantAlg = "EdDSA"
			}
			if set.Keys[0]["alg"] != wantAlg {
				t.Errorf("JWKS alg %v, want %s", set.Keys[0]["alg"], wantAlg)
			}
		})
	}
}

// A JWKS must never be published without its private key: keygen writes
// the private key first.
func TestKeygenWritesPrivateKeyFirst(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	keyFile, jwksFile := filepath.Join(dir, "key.jwk"), filepath.Join(dir, "jwks.json")

	code, out, errs := keygen(t, "-out", filepath.Join(missing, "key.jwk"), "-jwks-out", jwksFile)
	if code != ExitFailure || out != "" || !strings.HasPrefix(errs, "test keygen: ") {
		t.Errorf("private key unwritable: exit %d, stdout %q, stderr %q; want 1 and a message", code, out, errs)
	}
	if _, err := os.Stat(jwksFile); !os.IsNotExist(err) {
		t.Errorf("private key unwritable, yet the JWKS was written (stat: %v)", err)
	}

	code, _, errs = keygen(t, "-out", keyFile, "-jwks-out", filepath.Join(missing, "jwks.json"))
	if code != ExitFailure || !strings.Contains(errs, "jwks.json") {
		t.Errorf("JWKS unwritable: exit %d, stderr %q; want 1 naming the file", code, errs)
	}
	if _, err := os.Stat(keyFile); err != nil {
		t.Errorf("JWKS unwritable: the private key should have been written first: %v", err)
	}
}

func TestMintAllClaims(t *testing.T) {
	keyFile, jwksFile := newKey(t, t.TempDir())
	code, out, errs := mint(t, fiberctlMint, "-key", keyFile, "-issuer", "https://issuer.example",
		"-audience", "node-a", "-template", testTemplate, "-uid", "g-7", "-max", "3", "-warm", "1",
		"-lease", "15m", "-min-tier", "WARM", "-wbudget", "1048576", "-device-class", "gpu", "-device-count", "2")
	if code != ExitOK {
		t.Fatalf("mint exit %d: %s", code, errs)
	}
	tok := strings.TrimSpace(out)
	if out != tok+"\n" {
		t.Errorf("stdout %q: want the token and one line end", out)
	}
	g := verify(t, jwksFile, tok, "https://issuer.example", "node-a")
	want := core.Grant{
		UID: "g-7", Issuer: "https://issuer.example", Audience: "node-a", Template: testTemplate,
		Fibers: core.Fibers{Max: 3, Warm: 1}, WBudget: 1 << 20, MinTier: core.TierWarm,
		Devices: core.DeviceRequest{Class: "gpu", Count: 2}, IssuedAt: testNow, Expiry: testNow.Add(15 * time.Minute),
	}
	if g.UID != want.UID || g.Issuer != want.Issuer || g.Audience != want.Audience || g.Template != want.Template ||
		g.Fibers != want.Fibers || g.WBudget != want.WBudget || g.MinTier != want.MinTier || g.Devices != want.Devices ||
		!g.IssuedAt.Equal(want.IssuedAt) || !g.Expiry.Equal(want.Expiry) || string(g.Token) != tok {
		t.Errorf("verified grant\n got %+v\nwant %+v", g, want)
	}
}

func TestMintFibersMaxOnly(t *testing.T) {
	keyFile, jwksFile := newKey(t, t.TempDir())
	const uid = "8c1b5e4c-3c43-4d4e-9a55-1f2a1b3c4d5e" // a Pod UID
	code, out, errs := mint(t, issuerMint, "-key", keyFile, "-issuer", "https://issuer.test", "-audience", "grant-0",
		"-template", testTemplate, "-uid", uid, "-max", "3", "-lease", "20s")
	if code != ExitOK {
		t.Fatalf("mint exit %d: %s", code, errs)
	}
	g := verify(t, jwksFile, out, "https://issuer.test", "grant-0")
	if g.UID != uid || g.Fibers != (core.Fibers{Max: 3}) || g.Lease() != 20*time.Second || !g.IssuedAt.Equal(testNow) ||
		g.WBudget != 0 || g.MinTier != core.TierBasic || g.Devices != (core.DeviceRequest{}) {
		t.Errorf("grant %+v: want uid %s, fibers.max 3 only, lease 20s, issued at %v", g, uid, testNow)
	}
	// The other claims are not flags of this mint.
	for _, flag := range []string{"-warm", "-min-tier", "-wbudget", "-device-class", "-device-count"} {
		code, _, errs := mint(t, issuerMint, "-key", keyFile, "-issuer", "i", "-audience", "a", "-template", testTemplate, flag, "1")
		if code != ExitUsage || !strings.Contains(errs, "flag provided but not defined: "+flag) {
			t.Errorf("%s without AllClaims: exit %d, stderr %q; want 2, not defined", flag, code, errs)
		}
	}
}

func TestMintDefaultLease(t *testing.T) {
	keyFile, jwksFile := newKey(t, t.TempDir())
	for _, tc := range []struct {
		lease time.Duration
		want  time.Duration
	}{{0, DefaultLease}, {time.Hour, time.Hour}} {
		code, out, errs := mint(t, MintOptions{Lease: tc.lease}, "-key", keyFile, "-issuer", "i", "-audience", "a", "-template", testTemplate)
		if code != ExitOK {
			t.Fatalf("mint exit %d: %s", code, errs)
		}
		if g := verify(t, jwksFile, out, "i", "a"); g.Lease() != tc.want {
			t.Errorf("MintOptions.Lease %v: minted lease %v, want %v", tc.lease, g.Lease(), tc.want)
		}
	}
}

func TestMintRandomUID(t *testing.T) {
	keyFile, _ := newKey(t, t.TempDir())
	uids := map[string]bool{}
	for range 2 {
		code, out, errs := mint(t, fiberctlMint, "-key", keyFile, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate)
		if code != ExitOK {
			t.Fatalf("mint: %s", errs)
		}
		uid, err := grant.PeekUID([]byte(strings.TrimSpace(out)))
		if err != nil {
			t.Fatalf("PeekUID of minted token: %v", err)
		}
		if err := grant.ValidUID(uid); err != nil || !strings.HasPrefix(uid, "g-") || len(uid) != 22 {
			t.Errorf("random uid %q: want g- and 20 hex digits (%v)", uid, err)
		}
		uids[uid] = true
	}
	if len(uids) != 2 {
		t.Errorf("two mints without -uid gave the same uid: %v", uids)
	}
}

func TestUsageErrors(t *testing.T) {
	keyFile, _ := newKey(t, t.TempDir())
	m := []string{"-key", keyFile, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate}
	with := func(extra ...string) []string { return append(m[:len(m):len(m)], extra...) }
	type tc struct {
		name string
		args []string
		msg  string // the message must contain it, normally the flag
	}
	keygenCases := []tc{
		{"undefined flag", []string{"-bogus"}, "-bogus"},
		{"no out", nil, "-out is required"},
		{"bad alg", []string{"-alg", "RS256", "-out", keyFile}, "-alg"},
		{"extra arg", []string{"-out", keyFile, "extra"}, `unexpected argument "extra"`},
	}
	mintCases := []tc{
		{"no key", []string{"-issuer", "x", "-audience", "n", "-template", testTemplate}, "-key is required"},
		{"no issuer", []string{"-key", keyFile, "-audience", "n", "-template", testTemplate}, "-issuer is required"},
		{"no audience", []string{"-key", keyFile, "-issuer", "x", "-template", testTemplate}, "-audience is required"},
		{"no template", []string{"-key", keyFile, "-issuer", "x", "-audience", "n"}, "-template is required"},
		{"bad template", append(m[:len(m)-1:len(m)-1], "counter"), "-template"},
		{"bad max", with("-max", "0"), "-max"},
		{"max not a number", with("-max", "many"), "-max"},
		{"bad lease", with("-lease", "0s"), "-lease"},
		{"short lease", with("-lease", "100ms"), "-lease"},
		{"lease not a duration", with("-lease", "soon"), "-lease"},
		{"bad uid", with("-uid", "Not_A_Label"), "-uid"},
		{"extra arg", with("extra"), `unexpected argument "extra"`},
	}
	allClaimsCases := []tc{
		{"bad warm", with("-warm", "5"), "-warm"},
		{"negative warm", with("-warm", "-1"), "-warm"},
		{"bad tier", with("-min-tier", "GOLD"), "-min-tier"},
		{"bad wbudget", with("-wbudget", "-1"), "-wbudget"},
		{"device count alone", with("-device-count", "1"), "-device-class"},
		{"device class alone", with("-device-class", "gpu"), "-device-count"},
		{"negative device count", with("-device-class", "gpu", "-device-count", "-1"), "-device-count"},
	}
	for _, g := range []struct {
		name, prefix string
		run          func(t *testing.T, args ...string) (int, string, string)
		cases        []tc
	}{
		{"keygen", "test keygen", keygen, keygenCases},
		{"mint all claims", "test mint", func(t *testing.T, args ...string) (int, string, string) { return mint(t, fiberctlMint, args...) },
			append(mintCases, allClaimsCases...)},
		{"mint fibers.max only", "test mint", func(t *testing.T, args ...string) (int, string, string) { return mint(t, issuerMint, args...) },
			mintCases},
	} {
		for _, c := range g.cases {
			t.Run(g.name+" "+c.name, func(t *testing.T) {
				code, _, errs := g.run(t, c.args...)
				if code != ExitUsage {
					t.Errorf("exit %d, want 2 (stderr %q)", code, errs)
				}
				if !strings.Contains(errs, g.prefix) || !strings.Contains(errs, c.msg) {
					t.Errorf("stderr %q does not name %q after %q", errs, c.msg, g.prefix)
				}
			})
		}
	}
}

func TestMintFailures(t *testing.T) {
	dir := t.TempDir()
	_, jwksFile := newKey(t, dir)
	jwks, err := os.ReadFile(jwksFile)
	if err != nil {
		t.Fatal(err)
	}
	var set struct{ Keys []json.RawMessage }
	if err := json.Unmarshal(jwks, &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", jwks, err)
	}
	publicKey := filepath.Join(dir, "public.jwk")
	if err := os.WriteFile(publicKey, set.Keys[0], 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, msg string
	}{
		// A public key cannot sign: the message names the flag and the file.
		{"public key", publicKey, "-key " + publicKey},
		{"a JWKS, not a JWK", jwksFile, jwksFile},
		{"missing key file", filepath.Join(dir, "missing.jwk"), "missing.jwk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := mint(t, fiberctlMint, "-key", tc.key, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate)
			if code != ExitFailure || out != "" || !strings.HasPrefix(errs, "test mint: ") || !strings.Contains(errs, tc.msg) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1 and %q", code, out, errs, tc.msg)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       MintOptions
		want, omit []string
	}{
		{"fiberctl", fiberctlMint, []string{"written by grant keygen", "-warm", "-device-count", "(default 10m0s)"}, []string{"Pod"}},
		{"issuer", issuerMint, []string{"written by keygen", "the Pod name", "such as a Pod UID"}, []string{"-warm", "-min-tier"}},
		{"zero", MintOptions{}, []string{"written by keygen", "(default 10m0s)"}, []string{"Pod", "-wbudget"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := mint(t, tc.opts, "-h")
			if code != ExitOK || out != "" {
				t.Fatalf("-h: exit %d, stdout %q; want 0 and the help on stderr", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("help lacks %q:\n%s", w, errs)
				}
			}
			for _, o := range tc.omit {
				if strings.Contains(errs, o) {
					t.Errorf("help has %q:\n%s", o, errs)
				}
			}
		})
	}
	if code, _, errs := keygen(t, "-h"); code != ExitOK || !strings.Contains(errs, "-jwks-out") {
		t.Errorf("keygen -h: exit %d, help %q", code, errs)
	}
}

func TestRequiredPanicsOnUnknownFlag(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Required of a flag the set does not define did not panic")
		}
	}()
	Required(NewFlags("test", &bytes.Buffer{}), "nope")
}
