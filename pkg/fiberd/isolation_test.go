package fiberd

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// withIsolation makes the fake backends report warm and basic.
func withIsolation(warm, basic backend.IsolationSupport) envOption {
	return func(e *env) {
		if e.warm != nil {
			e.warm.SetIsolation(warm)
		}
		if e.basic != nil {
			e.basic.SetIsolation(basic)
		}
	}
}

var (
	fullIsolation = backend.IsolationSupport{Level: backend.IsolationFiber, NetworkNone: true, EndpointsApart: true}
	noNftables    = backend.IsolationSupport{Level: backend.IsolationFiber, NetworkNone: true,
		Missing: "endpoints of different grants are not kept apart: the nft command is not installed: install nftables"}
	noPrivilege = backend.IsolationSupport{Level: backend.IsolationNone, Missing: "fiberd runs without CAP_SYS_ADMIN"}
)

// TestIsolationInStatus: the status says what each tier isolates, and the
// level each warm grant and each fiber got; a shared template's grant
// gets less. The metrics say the same.
func TestIsolationInStatus(t *testing.T) {
	e := newEnv(t, withIsolation(fullIsolation, backend.IsolationSupport{Level: backend.IsolationGrant, Missing: "the probe said so"}))
	shared := writeTemplate(t, filepath.Join(e.stateDir, "templates"), "shared", `{"command":"/bin/true","zygote":true,"isolation":"shared"}`)
	e.deliver(e.mint("g1"))
	e.deliver(e.mint("g2", templ(shared)))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"}); r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	st := e.status()
	want := []api.TierIsolation{
		{Tier: core.TierWarm, Level: "fiber", NetworkNone: true, EndpointsApart: true},
		{Tier: core.TierBasic, Level: "grant", Missing: "the probe said so"},
	}
	if len(st.Isolation) != 2 || st.Isolation[0] != want[0] || st.Isolation[1] != want[1] {
		t.Errorf("status isolation %+v, want %+v", st.Isolation, want)
	}
	if st.MinIsolation != "" {
		t.Errorf("status minIsolation %q without -min-isolation", st.MinIsolation)
	}
	levels := map[string]string{}
	for _, g := range st.Grants {
		levels[g.UID] = g.Isolation
		if g.UID == "g1" && (len(g.Fibers) != 1 || g.Fibers[0].Isolation != "fiber") {
			t.Errorf("g1's fibers %+v, want one of isolation fiber", g.Fibers)
		}
	}
	if levels["g1"] != "fiber" || levels["g2"] != "grant" {
		t.Errorf("grant isolation %v, want g1 fiber and g2 (shared) grant", levels)
	}
	m := string(e.do(e.tcp, http.MethodGet, "/metrics", nil).body)
	for _, s := range []string{
		`fiberd_backend_isolation{level="fiber",tier="WARM"} 1`,
		`fiberd_backend_isolation{level="grant",tier="BASIC"} 1`,
		`fiberd_grant_isolation{grant="g1",level="fiber"} 1`,
		`fiberd_grant_isolation{grant="g2",level="grant"} 1`,
	} {
		if !strings.Contains(m, s) {
			t.Errorf("metrics lack %q:\n%s", s, m)
		}
	}
	// Unauthenticated callers see the node's isolation too.
	var red api.Status
	r := e.do(e.tcp, http.MethodGet, "/v1/status", nil)
	must(t, json.Unmarshal(r.body, &red))
	if !red.Redacted || len(red.Isolation) != 2 || red.Grants[0].Isolation == "" {
		t.Errorf("redacted status %s lacks the isolation", r.body)
	}
}

// TestMinIsolation: with Config.MinIsolation, a grant whose tier isolates
// less on this host, or whose template allows less, is a tier gap (412),
// never warmed less isolated; one that gets enough is served.
func TestMinIsolation(t *testing.T) {
	t.Run("the backend gives less", func(t *testing.T) {
		e := newEnv(t, withIsolation(noPrivilege, noPrivilege), withConfig(func(c *Config) { c.MinIsolation = backend.IsolationGrant }))
		r := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")})
		body := r.apiError(t)
		if r.status != http.StatusPreconditionFailed || body.Code != api.CodeTierGap ||
			!strings.Contains(body.Message, "CAP_SYS_ADMIN") || !strings.Contains(body.Message, "-min-isolation") {
			t.Fatalf("clone: %d %s, want 412 TIER_GAP naming -min-isolation and what is missing", r.status, r.body)
		}
		if warms, _ := e.warm.Counts(); warms != 0 {
			t.Errorf("the refused grant was warmed %d times", warms)
		}
		if st := e.status(); len(st.Grants) != 0 || st.MinIsolation != "grant" {
			t.Errorf("status %+v: want no grant admitted and minIsolation grant", st)
		}
		if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"}); r.status != http.StatusPreconditionFailed {
			t.Errorf("clone by UID of the refused grant: %d %s, want 412", r.status, r.body)
		}
	})
	t.Run("the template allows less", func(t *testing.T) {
		e := newEnv(t, withIsolation(fullIsolation, fullIsolation), withConfig(func(c *Config) { c.MinIsolation = backend.IsolationFiber }))
		shared := writeTemplate(t, filepath.Join(e.stateDir, "templates"), "shared", `{"command":"/bin/true","zygote":true,"isolation":"shared"}`)
		r := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1", templ(shared))})
		if r.status != http.StatusPreconditionFailed || r.apiError(t).Code != api.CodeTierGap {
			t.Fatalf("clone of a shared template needing fiber: %d %s, want 412 TIER_GAP", r.status, r.body)
		}
		if req, ok := e.warm.WarmRequest("g1"); ok {
			t.Errorf("the refused grant is warm: %+v", req)
		}
		if r := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g2")}); r.status != 200 {
			t.Fatalf("clone of a grant that gets fiber: %d %s", r.status, r.body)
		}
		if req, _ := e.warm.WarmRequest("g2"); req.MinIsolation != backend.IsolationFiber {
			t.Errorf("WarmRequest.MinIsolation = %q, want fiber", req.MinIsolation)
		}
	})
	t.Run("enough", func(t *testing.T) {
		grantOnly := backend.IsolationSupport{Level: backend.IsolationGrant, NetworkNone: true}
		e := newEnv(t, withIsolation(grantOnly, grantOnly), withConfig(func(c *Config) { c.MinIsolation = backend.IsolationGrant }))
		if r := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}); r.status != 200 {
			t.Fatalf("clone: %d %s", r.status, r.body)
		}
	})
	t.Run("not a level", func(t *testing.T) {
		cfg := Config{Issuer: testIssuer, NodeID: testNode, Templates: "/t", StateDir: "/s", MinIsolation: "strong"}
		if err := cfg.ValidateSettings(); err == nil || !strings.Contains(err.Error(), "-min-isolation") {
			t.Errorf("ValidateSettings with MinIsolation strong: %v, want an error naming -min-isolation", err)
		}
	})
}

// TestIsolationLogLine: New says once, in one line, what each tier
// isolates and what is missing.
func TestIsolationLogLine(t *testing.T) {
	for _, tc := range []struct {
		name        string
		warm, basic backend.IsolationSupport
		min         backend.Isolation
		want        []string // in the one line
	}{
		{"off", backend.IsolationSupport{Level: backend.IsolationNone}, backend.IsolationSupport{Level: backend.IsolationNone}, "",
			[]string{`"Isolation is off`, `"warm"="none"`, `"basic"="none"`}},
		{"full", fullIsolation, fullIsolation, backend.IsolationFiber,
			[]string{`"Isolation"`, `"warm"="fiber"`, `"basic"="fiber"`, `"networkNone"=true`, `"endpointsApart"=true`, `"minIsolation"="fiber"`}},
		{"no nftables", noNftables, noNftables, backend.IsolationFiber,
			[]string{`"Isolation is less than asked"`, `"endpointsApart"=false`, `install nftables`}},
		{"degraded", noPrivilege, noPrivilege, backend.IsolationGrant,
			[]string{`"Isolation is less than asked"`, `"warm"="none"`, `"missing"="fiberd runs without CAP_SYS_ADMIN"`, `"refusedTiers"="WARM,BASIC"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var lines []string
			logger := funcr.New(func(prefix, args string) {
				mu.Lock()
				lines = append(lines, args)
				mu.Unlock()
			}, funcr.Options{})
			newEnv(t, withIsolation(tc.warm, tc.basic), withConfig(func(c *Config) { c.Logger, c.MinIsolation = logger, tc.min }))
			mu.Lock()
			defer mu.Unlock()
			var said []string
			for _, l := range lines {
				if strings.Contains(l, `"msg"="Isolation`) {
					said = append(said, l)
				}
			}
			if len(said) != 1 {
				t.Fatalf("%d isolation lines, want 1: %q", len(said), said)
			}
			for _, w := range tc.want {
				if !strings.Contains(said[0], w) {
					t.Errorf("the line %s lacks %s", said[0], w)
				}
			}
		})
	}
}
