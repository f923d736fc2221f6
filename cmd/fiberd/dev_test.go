package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/template"
)

// TestDevGrantsFromSpecs: -dev with -templates grants every spec of the
// directory, served WARM (with devFibersWarm spares) when the spec is a
// zygote, under a UID stable for the key; the grant names the spec file's
// digest, and grant files of templates no longer there are removed.
func TestDevGrantsFromSpecs(t *testing.T) {
	specDir, grantsDir, devDir := t.TempDir(), t.TempDir(), t.TempDir()
	for _, zygote := range []bool{true, false} {
		if _, err := devkit.WriteSpec(specDir, devkit.ColdName("counter", zygote), devkit.CounterCSpec("/opt/counter", zygote)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(grantsDir, "gone.jwt"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	specs, err := readSpecs(specDir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := devKey(devDir)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	grants, err := mintDevGrants(grantsDir, "node-a", key, specs, clk)
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) != 2 || grants[0].Template != "counter" || !grants[0].Warm || grants[1].Template != "counter-cold" || grants[1].Warm {
		t.Fatalf("grants %+v: want counter (WARM) and counter-cold (BASIC)", grants)
	}
	if _, err := os.Stat(filepath.Join(grantsDir, "gone.jwt")); !os.IsNotExist(err) {
		t.Errorf("the grant file of a template no longer there was kept (stat: %v)", err)
	}

	keys, err := grant.ReadStaticKeys(filepath.Join(devDir, "jwks.json"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := grant.NewVerifier(grant.VerifierConfig{Issuer: devIssuer, Audience: "node-a", Keys: keys, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for _, dg := range grants {
		if !strings.HasPrefix(dg.UID, "dev-"+dg.Template+"-") {
			t.Errorf("grant UID %q does not name its template %q", dg.UID, dg.Template)
		}
		tok, err := os.ReadFile(filepath.Join(grantsDir, dg.Template+".jwt"))
		if err != nil {
			t.Fatal(err)
		}
		g, err := v.Verify(context.Background(), tok)
		if err != nil {
			t.Fatalf("grant file of %s: %v", dg.Template, err)
		}
		spec, err := os.ReadFile(filepath.Join(specDir, dg.Template+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if g.UID != dg.UID || g.Template != dg.Template+"@sha256:"+template.Digest(spec) || g.Fibers.Max != devFibersMax {
			t.Errorf("grant %+v: want uid %s, the spec file's digest and fibers.max %d", g, dg.UID, devFibersMax)
		}
		// A zygote's grant keeps spares; an exec template has none to keep.
		if want := map[bool]int{true: devFibersWarm, false: 0}[dg.Warm]; g.Fibers.Warm != want {
			t.Errorf("grant of %s: fibers.warm %d, want %d", dg.Template, g.Fibers.Warm, want)
		}
	}

	// The same key gives the same UIDs: a restart with the same -state
	// admits the same grants.
	again, err := devKey(devDir)
	if err != nil {
		t.Fatal(err)
	}
	grants2, err := mintDevGrants(grantsDir, "node-a", again, specs, clk)
	if err != nil {
		t.Fatal(err)
	}
	for i := range grants {
		if grants2[i].UID != grants[i].UID {
			t.Errorf("UID of %s changed with the same key: %s, then %s", grants[i].Template, grants[i].UID, grants2[i].UID)
		}
	}
}

// TestDevSaysWhatItWaitsFor: -dev names the templates it still waits for,
// and says once why one is not warm (again when the reason changes).
func TestDevSaysWhatItWaitsFor(t *testing.T) {
	d := &devSetup{grants: []devGrant{
		{UID: "dev-counter-c-1", Template: "counter-c", Warm: true},
		{UID: "dev-counter-py-1", Template: "counter-py", Warm: true},
		{UID: "dev-counter-c-cold-1", Template: "counter-c-cold"},
	}}
	line := d.waitingLine(map[string]bool{"dev-counter-c-1": true}, 12*time.Second)
	if !strings.Contains(line, "counter-py") || strings.Contains(line, "counter-c,") || strings.Contains(line, "cold") || !strings.Contains(line, "12s") {
		t.Errorf("waiting line %q: want counter-py only, and the time", line)
	}
	told := map[string]string{}
	st := api.Status{Grants: []api.GrantStatus{
		{UID: "dev-counter-c-1", Warm: true},
		{UID: "dev-counter-py-1", Error: `grant "dev-counter-py-1": template not warm: zygote exited before READY`},
	}}
	got := d.failures(st, told)
	if len(got) != 1 || !strings.Contains(got[0], "counter-py") || !strings.Contains(got[0], "zygote exited before READY") {
		t.Fatalf("failures = %q, want the Python counter's reason", got)
	}
	if again := d.failures(st, told); len(again) != 0 {
		t.Errorf("the same reason told twice: %q", again)
	}
	st.Grants[1].Error = "another reason"
	if again := d.failures(st, told); len(again) != 1 {
		t.Errorf("a new reason not told: %q", again)
	}
}

// TestDevIsolationLine: -dev says what the agent isolates in one line, and
// what is missing when it is less than asked.
func TestDevIsolationLine(t *testing.T) {
	for _, tc := range []struct {
		iso  []api.TierIsolation
		want []string
		not  []string
	}{
		{[]api.TierIsolation{{Tier: "WARM", Level: "fiber"}, {Tier: "BASIC", Level: "fiber"}}, []string{"fiber (each grant a user"}, []string{"WARM", "less than asked"}},
		{[]api.TierIsolation{{Tier: "WARM", Level: "none", Missing: "no CAP_SYS_ADMIN"}, {Tier: "BASIC", Level: "none", Missing: "no CAP_SYS_ADMIN"}},
			[]string{"none (fibers run as fiberd's user", "less than asked: no CAP_SYS_ADMIN"}, []string{"CAP_SYS_ADMIN; no"}},
		{[]api.TierIsolation{{Tier: "WARM", Level: "grant", Missing: "a"}, {Tier: "BASIC", Level: "fiber"}}, []string{"WARM grant, BASIC fiber", "less than asked: a"}, nil},
	} {
		got := isolationLine(api.Status{Isolation: tc.iso})
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("isolationLine(%+v) = %q, want %q in it", tc.iso, got, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("isolationLine(%+v) = %q, want no %q in it", tc.iso, got, n)
			}
		}
	}
}
