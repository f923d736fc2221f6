package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/grant"
)

const tmpl = "counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var now = time.Date(2026, 11, 7, 12, 0, 0, 0, time.UTC)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, env{stdout: &out, stderr: &errb, clock: clocktesting.NewFakePassiveClock(now), ctx: context.Background()})
	return code, out.String(), errb.String()
}

func TestKeygenMint(t *testing.T) {
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, "key.jwk"), filepath.Join(dir, "jwks.json")
	if code, _, stderr := runCmd(t, "keygen", "-kid", "dev", "-out", key, "-jwks-out", jwks); code != grantcli.ExitOK {
		t.Fatalf("keygen: %d %s", code, stderr)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("private key file: %v %v, want mode 0600", fi, err)
	}
	code, tok, stderr := runCmd(t, "mint", "-key", key, "-issuer", "https://issuer.test", "-audience", "grant-0",
		"-template", tmpl, "-uid", "8c1b5e4c-3c43-4d4e-9a55-1f2a1b3c4d5e", "-max", "3", "-lease", "20s")
	if code != grantcli.ExitOK {
		t.Fatalf("mint: %d %s", code, stderr)
	}
	keys, err := grant.ReadStaticKeys(jwks)
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: "https://issuer.test", Audience: "grant-0", Keys: keys,
		Clock: clocktesting.NewFakePassiveClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(context.Background(), []byte(strings.TrimSpace(tok)))
	if err != nil {
		t.Fatalf("minted token: %v", err)
	}
	if g.Fibers.Max != 3 || g.Lease() != 20*time.Second || g.UID != "8c1b5e4c-3c43-4d4e-9a55-1f2a1b3c4d5e" {
		t.Errorf("grant max %d lease %v uid %s", g.Fibers.Max, g.Lease(), g.UID)
	}
}

func TestUsage(t *testing.T) {
	dir := t.TempDir()
	badKey := filepath.Join(dir, "missing.jwk")
	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no command", nil, grantcli.ExitUsage, "usage"},
		{"unknown command", []string{"frobnicate"}, grantcli.ExitUsage, `unknown command "frobnicate"`},
		{"help names the production issuer", []string{"help"}, grantcli.ExitOK, "production issuer is the FiberPool controller's"},
		// The keygen and mint checks are grantcli's (tested there); these
		// show grant-issuer runs them under its own names, mint with
		// fibers.max only.
		{"keygen without out", []string{"keygen"}, grantcli.ExitUsage, "grant-issuer keygen: -out is required"},
		{"mint without template", []string{"mint", "-key", "k", "-issuer", "i", "-audience", "a"}, grantcli.ExitUsage, "grant-issuer mint: -template is required"},
		{"mint has no -warm", []string{"mint", "-key", "k", "-issuer", "i", "-audience", "a", "-template", tmpl, "-warm", "1"}, grantcli.ExitUsage, "not defined: -warm"},
		{"mint help names the Pod", []string{"mint", "-h"}, grantcli.ExitOK, "the Pod name"},
		{"serve without issuer", []string{"serve"}, grantcli.ExitUsage, "-issuer is required"},
		{"serve without tls", []string{"serve", "-issuer", "https://x", "-key", badKey}, grantcli.ExitUsage, "-tls-cert is required"},
		{"serve short lease", []string{"serve", "-issuer", "https://x", "-key", badKey, "-tls-cert", "c", "-tls-key", "k", "-lease", "100ms"}, grantcli.ExitUsage, "-lease"},
		{"serve unreadable key", []string{"serve", "-issuer", "https://x", "-key", badKey, "-tls-cert", "c", "-tls-key", "k"}, grantcli.ExitFailure, "-key"},
		{"stray argument", []string{"serve", "extra"}, grantcli.ExitUsage, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			if code != tc.code || !strings.Contains(stdout+stderr, tc.msg) {
				t.Errorf("exit %d, output %q; want %d and %q", code, stdout+stderr, tc.code, tc.msg)
			}
		})
	}
}
