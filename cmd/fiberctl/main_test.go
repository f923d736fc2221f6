package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/core"
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
			// The key files are grantcli's (tested there); fiberctl prints the
			// kid, and verify below reads the JWKS.
			if out != "kid k1\n" {
				t.Errorf("keygen output %q, want the kid", out)
			}

			code, out, errs = runCmd(t, testNow, "", "grant", "mint", "-key", keyFile, "-issuer", "https://issuer.example",
				"-audience", "node-a", "-template", testTemplate, "-uid", "g-7", "-max", "3", "-warm", "1",
				"-lease", "15m", "-min-tier", "WARM", "-wbudget", "1048576", "-device-class", "gpu", "-device-count", "2")
			if code != 0 {
				t.Fatalf("mint exit %d: %s", code, errs)
			}
			tok := strings.TrimSpace(out)

			// The verify command reads it from standard input and prints
			// every field mint was given.
			code, out, errs = runCmd(t, testNow, tok+"\n", "grant", "verify", "-jwks", jwksFile, "-issuer", "https://issuer.example", "-audience", "node-a")
			if code != 0 {
				t.Fatalf("verify exit %d: %s", code, errs)
			}
			var got grantView
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("verify output %s: %v", out, err)
			}
			want := grantView{
				UID: "g-7", Issuer: "https://issuer.example", Audience: "node-a", Template: testTemplate,
				Fibers: core.Fibers{Max: 3, Warm: 1}, WBudget: 1 << 20, MinTier: core.TierWarm,
				Devices: core.DeviceRequest{Class: "gpu", Count: 2}, IssuedAt: testNow, Expiry: testNow.Add(15 * time.Minute),
			}
			if !strings.Contains(out, `"expired": false`) || !got.IssuedAt.Equal(want.IssuedAt) || !got.Expiry.Equal(want.Expiry) {
				t.Errorf("verify output %s: want issued %v, expiry %v, not expired", out, want.IssuedAt, want.Expiry)
			}
			got.IssuedAt, got.Expiry = want.IssuedAt, want.Expiry
			if got != want {
				t.Errorf("verified grant\n got %+v\nwant %+v", got, want)
			}
			// Wrong audience: refused, exit 1.
			code, _, errs = runCmd(t, testNow, tok, "grant", "verify", "-jwks", jwksFile, "-issuer", "https://issuer.example", "-audience", "node-b")
			if code != 1 || !strings.Contains(errs, "audience") {
				t.Errorf("verify for another node: exit %d, err %s", code, errs)
			}
		})
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
		// The keygen and mint checks are grantcli's (tested there); these
		// show fiberctl runs them under its own names, mint with every claim.
		{"keygen no out", []string{"grant", "keygen"}, "fiberctl grant keygen: -out is required"},
		{"keygen extra arg", []string{"grant", "keygen", "-out", keyFile, "extra"}, "fiberctl grant keygen: unexpected argument"},
		{"mint no template", []string{"grant", "mint", "-key", keyFile, "-issuer", "x", "-audience", "n"}, "fiberctl grant mint: -template is required"},
		{"mint bad warm", append(mint, "-warm", "5"), "fiberctl grant mint: -warm"},
		{"mint device count alone", append(mint, "-device-count", "1"), "-device-class"},
		{"verify no jwks", []string{"grant", "verify", "-issuer", "x", "-audience", "n"}, "-jwks"},
		{"verify no audience", []string{"grant", "verify", "-jwks", "j", "-issuer", "x"}, "fiberctl grant verify: -audience is required"},
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
