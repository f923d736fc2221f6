package main

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

// runCmd runs fiberctl in-process with the fake clock at now.
func runCmd(t *testing.T, now time.Time, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, env{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errb,
		clock:  clocktesting.NewFakePassiveClock(now),
	})
	return code, out.String(), errb.String()
}

func TestGrantKeygenMintVerify(t *testing.T) {
	for _, alg := range []string{"EdDSA", "ES256"} {
		t.Run(alg, func(t *testing.T) {
			dir := t.TempDir()
			keyFile := filepath.Join(dir, "key.jwk")
			jwksFile := filepath.Join(dir, "jwks.json")
			code, out, errs := runCmd(t, testNow, "", "grant", "keygen", "-alg", alg, "-kid", "k1", "-out", keyFile, "-jwks-out", jwksFile)
			if code != 0 {
				t.Fatalf("keygen exit %d: %s", code, errs)
			}
			if !strings.Contains(out, "k1") {
				t.Errorf("keygen output %q does not name the kid", out)
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
			if err := json.Unmarshal(jwks, &set); err != nil || len(set.Keys) != 1 || set.Keys[0]["d"] != nil || set.Keys[0]["kid"] != "k1" {
				t.Fatalf("public JWKS %s (%v)", jwks, err)
			}

			code, out, errs = runCmd(t, testNow, "", "grant", "mint", "-key", keyFile, "-issuer", "https://issuer.example",
				"-audience", "node-a", "-template", testTemplate, "-uid", "g-7", "-max", "3", "-warm", "1",
				"-lease", "15m", "-min-tier", "WARM", "-wbudget", "1048576", "-device-class", "gpu", "-device-count", "2")
			if code != 0 {
				t.Fatalf("mint exit %d: %s", code, errs)
			}
			tok := strings.TrimSpace(out)

			// The library verifies what the command minted, every field.
			keys, err := grant.ReadStaticKeys(jwksFile)
			if err != nil {
				t.Fatal(err)
			}
			v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: "https://issuer.example", Audience: "node-a", Keys: keys})
			if err != nil {
				t.Fatal(err)
			}
			g, err := v.Verify(context.Background(), []byte(tok))
			if err != nil {
				t.Fatalf("Verify minted token: %v", err)
			}
			want := core.Grant{
				UID: "g-7", Issuer: "https://issuer.example", Audience: "node-a", Template: testTemplate,
				Fibers: core.Fibers{Max: 3, Warm: 1}, WBudget: 1 << 20, MinTier: core.TierWarm,
				Devices: core.DeviceRequest{Class: "gpu", Count: 2}, IssuedAt: testNow, Expiry: testNow.Add(15 * time.Minute),
				Token: []byte(tok),
			}
			if g.UID != want.UID || g.Issuer != want.Issuer || g.Audience != want.Audience || g.Template != want.Template ||
				g.Fibers != want.Fibers || g.WBudget != want.WBudget || g.MinTier != want.MinTier || g.Devices != want.Devices ||
				!g.IssuedAt.Equal(want.IssuedAt) || !g.Expiry.Equal(want.Expiry) || string(g.Token) != tok {
				t.Errorf("verified grant\n got %+v\nwant %+v", g, want)
			}

			// And so does the command, from standard input.
			code, out, errs = runCmd(t, testNow, tok+"\n", "grant", "verify", "-jwks", jwksFile, "-issuer", "https://issuer.example", "-audience", "node-a")
			if code != 0 || !strings.Contains(out, `"uid": "g-7"`) || !strings.Contains(out, `"expired": false`) {
				t.Errorf("verify exit %d, out %s, err %s", code, out, errs)
			}
			// Wrong audience: refused, exit 1.
			code, _, errs = runCmd(t, testNow, tok, "grant", "verify", "-jwks", jwksFile, "-issuer", "https://issuer.example", "-audience", "node-b")
			if code != 1 || !strings.Contains(errs, "audience") {
				t.Errorf("verify for another node: exit %d, err %s", code, errs)
			}
		})
	}
}

func TestGrantMintRandomUID(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.jwk")
	if code, _, errs := runCmd(t, testNow, "", "grant", "keygen", "-out", keyFile); code != 0 {
		t.Fatalf("keygen: %s", errs)
	}
	uids := map[string]bool{}
	for range 2 {
		code, out, errs := runCmd(t, testNow, "", "grant", "mint", "-key", keyFile, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate)
		if code != 0 {
			t.Fatalf("mint: %s", errs)
		}
		uid, err := grant.PeekUID([]byte(strings.TrimSpace(out)))
		if err != nil {
			t.Fatalf("PeekUID of minted token: %v", err)
		}
		uids[uid] = true
	}
	if len(uids) != 2 {
		t.Errorf("two mints without -uid gave the same uid: %v", uids)
	}
}

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.jwk")
	if code, _, errs := runCmd(t, testNow, "", "grant", "keygen", "-out", keyFile); code != 0 {
		t.Fatalf("keygen: %s", errs)
	}
	mint := []string{"grant", "mint", "-key", keyFile, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate}
	for _, tc := range []struct {
		name string
		args []string
		flag string // the message must name it
	}{
		{"no command", nil, "usage"},
		{"unknown command", []string{"frobnicate"}, "frobnicate"},
		{"no subcommand", []string{"grant"}, "subcommand"},
		{"unknown subcommand", []string{"grant", "sign"}, "sign"},
		{"keygen undefined flag", []string{"grant", "keygen", "-bogus"}, "-bogus"},
		{"keygen no out", []string{"grant", "keygen"}, "-out"},
		{"keygen bad alg", []string{"grant", "keygen", "-alg", "RS256", "-out", keyFile}, "-alg"},
		{"keygen extra arg", []string{"grant", "keygen", "-out", keyFile, "extra"}, "extra"},
		{"mint no key", []string{"grant", "mint", "-issuer", "x", "-audience", "n", "-template", testTemplate}, "-key"},
		{"mint no issuer", []string{"grant", "mint", "-key", keyFile, "-audience", "n", "-template", testTemplate}, "-issuer"},
		{"mint no audience", []string{"grant", "mint", "-key", keyFile, "-issuer", "x", "-template", testTemplate}, "-audience"},
		{"mint no template", []string{"grant", "mint", "-key", keyFile, "-issuer", "x", "-audience", "n"}, "-template"},
		{"mint bad template", append(mint[:len(mint)-1:len(mint)-1], "counter"), "-template"},
		{"mint bad max", append(mint, "-max", "0"), "-max"},
		{"mint max not a number", append(mint, "-max", "many"), "-max"},
		{"mint bad warm", append(mint, "-warm", "5"), "-warm"},
		{"mint bad lease", append(mint, "-lease", "0s"), "-lease"},
		{"mint lease not a duration", append(mint, "-lease", "soon"), "-lease"},
		{"mint bad tier", append(mint, "-min-tier", "GOLD"), "-min-tier"},
		{"mint bad uid", append(mint, "-uid", "Not_A_Label"), "-uid"},
		{"mint bad wbudget", append(mint, "-wbudget", "-1"), "-wbudget"},
		{"mint device count alone", append(mint, "-device-count", "1"), "-device-class"},
		{"verify no jwks", []string{"grant", "verify", "-issuer", "x", "-audience", "n"}, "-jwks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runCmd(t, testNow, "", tc.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", code, errs)
			}
			if !strings.Contains(errs, tc.flag) {
				t.Errorf("stderr %q does not name %q", errs, tc.flag)
			}
		})
	}
}

func TestMintWithUnusableKeyFails(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.jwk")
	jwksFile := filepath.Join(dir, "jwks.json")
	if code, _, errs := runCmd(t, testNow, "", "grant", "keygen", "-out", keyFile, "-jwks-out", jwksFile); code != 0 {
		t.Fatalf("keygen: %s", errs)
	}
	// A public key cannot sign: exit 1, naming the key file.
	code, _, errs := runCmd(t, testNow, "", "grant", "mint", "-key", jwksFile, "-issuer", "https://i.example", "-audience", "n", "-template", testTemplate)
	if code != 1 || !strings.Contains(errs, "jwks.json") {
		t.Errorf("mint with a JWKS as key: exit %d, err %q", code, errs)
	}
}
