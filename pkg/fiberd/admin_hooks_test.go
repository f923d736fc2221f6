//go:build testhooks

package fiberd

import (
	"net/http"
	"testing"

	"fiberd.io/fiberd/pkg/api"
)

// TestAdminHooks: in a testhooks build the admin routes answer 403 without
// AdminUnsafe, and with it force the lane stale and bump the epoch.
func TestAdminHooks(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		e := newEnv(t)
		admin := adminClient(t, e.agent.AdminSocketPath())
		for _, p := range []string{"/issuer", "/scope-lost"} {
			if r := adminDo(t, admin, http.MethodPost, p, `{"reachable":false}`); r.status != http.StatusForbidden {
				t.Errorf("POST %s without AdminUnsafe: %d, want 403", p, r.status)
			}
		}
	})
	t.Run("unsafe", func(t *testing.T) {
		e := newEnv(t, withConfig(func(c *Config) { c.AdminUnsafe = true }))
		admin := adminClient(t, e.agent.AdminSocketPath())
		if r := adminDo(t, admin, http.MethodPost, "/issuer", `{"reachable":false}`); r.status != 200 {
			t.Fatalf("POST /issuer: %d %s", r.status, r.body)
		}
		if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "nobody"}); r.status != http.StatusTooManyRequests {
			t.Fatalf("miss with the issuer unreachable: %d, want 429", r.status)
		}
		if r := adminDo(t, admin, http.MethodPost, "/issuer", `{"reachable":true}`); r.status != 200 {
			t.Fatalf("POST /issuer: %d %s", r.status, r.body)
		}
		if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "nobody"}); r.status != http.StatusServiceUnavailable {
			t.Fatalf("miss with the issuer reachable: %d, want 503", r.status)
		}
		if r := adminDo(t, admin, http.MethodPost, "/issuer", `{"reachable":"yes"}`); r.status != 400 {
			t.Errorf("POST /issuer with a bad body: %d, want 400", r.status)
		}
		c := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}).clone(t)
		before := e.agent.Epoch()
		if r := adminDo(t, admin, http.MethodPost, "/scope-lost", ""); r.status != 200 {
			t.Fatalf("POST /scope-lost: %d %s", r.status, r.body)
		}
		if e.agent.Epoch() != before+1 || len(e.warm.Running("")) != 0 {
			t.Fatalf("epoch %d running %v after /scope-lost", e.agent.Epoch(), e.warm.Running(""))
		}
		if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 404 {
			t.Errorf("old fiber after /scope-lost: %d, want 404", r.status)
		}
	})
}
