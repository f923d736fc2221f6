package fiberd

import (
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

func warmFibers(n int) grantOpt { return func(g *core.Grant) { g.Fibers.Warm = n } }

// TestSparesFromGrant: a grant's fibers.warm and max reach the backend when
// it is warmed, the status shows its spares, and a grant without
// fibers.warm shows none.
func TestSparesFromGrant(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", warmFibers(3), maxFibers(8)))
	if w, m, ok := e.warm.SpareSettings(uid); !ok || w != 3 || m != 8 {
		t.Fatalf("backend spares = %d/%d (%v), want warm 3 of max 8", w, m, ok)
	}
	sp := e.grantStatus(uid).Spares
	if sp == nil || sp.Warm != 3 || !sp.HandOver || sp.Wanted != 3 || sp.Ready != 3 {
		t.Fatalf("status spares = %+v, want warm 3, 3 ready", sp)
	}
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	if sp := e.grantStatus(uid).Spares; sp == nil || sp.Ready != 3 || e.grantStatus(uid).Running != 1 {
		t.Fatalf("after a Clone: spares %+v, running %d; want 3 spares, and the fiber running, not a spare", sp, e.grantStatus(uid).Running)
	}
	body := e.do(e.unix, "GET", "/metrics", nil).body
	if !strings.Contains(string(body), `fiberd_spare_fibers{grant="g1",state="ready"} 3`) {
		t.Fatalf("metrics lack the spares:\n%s", body)
	}

	other := e.deliver(e.mint("g2"))
	if sp := e.grantStatus(other).Spares; sp != nil {
		t.Fatalf("a grant without fibers.warm shows spares %+v", sp)
	}
}

// TestSparesRenewal: a renewal that changes fibers.warm sets the grant's
// spares anew without warming it again; one that does not leaves them.
func TestSparesRenewal(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", warmFibers(2)))
	e.clk.Step(10 * time.Second)
	e.home.Deliver(uid, []byte(e.mint("g1", warmFibers(6), maxFibers(10), lease(2*time.Hour))))
	e.eventually("spares set from the renewal", func() bool {
		w, m, _ := e.warm.SpareSettings(uid)
		return w == 6 && m == 10
	})
	if warms, _ := e.warm.Counts(); warms != 1 {
		t.Fatalf("renewal warmed again (%d warms)", warms)
	}
	if sp := e.grantStatus(uid).Spares; sp == nil || sp.Warm != 6 {
		t.Fatalf("status spares after the renewal = %+v, want warm 6", sp)
	}
	e.clk.Step(10 * time.Second)
	e.home.Deliver(uid, []byte(e.mint("g1", warmFibers(0), maxFibers(10), lease(3*time.Hour))))
	e.eventually("spares ended by the renewal", func() bool {
		w, _, _ := e.warm.SpareSettings(uid)
		return w == 0
	})
}

// TestSparesEpochBump: an epoch bump renews every admitted grant's spares.
func TestSparesEpochBump(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", warmFibers(2)))
	if n := e.warm.Renewed(uid); n != 0 {
		t.Fatalf("spares renewed %d times before any bump", n)
	}
	e.loseScope("pod deleted")
	if n := e.warm.Renewed(uid); n != 1 {
		t.Fatalf("spares renewed %d times after an epoch bump, want 1", n)
	}
}

// TestSparesTemplateChange: a renewal that names another template ends the
// old zygote with its spares (the grant is warmed again, of the new
// template) and the new zygote keeps the renewal's fibers.warm.
func TestSparesTemplateChange(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", warmFibers(2)))
	if w, _, ok := e.warm.SpareSettings(uid); !ok || w != 2 {
		t.Fatalf("spares before the change = %d (%v), want 2", w, ok)
	}
	other := writeTemplate(t, e.cfg.Templates, "other", `{"command":"/bin/false","zygote":true}`)
	e.clk.Step(2 * time.Second)
	e.home.Deliver(uid, []byte(e.mint("g1", templ(other), warmFibers(3), maxFibers(10), issuedAt(e.clk.Now()))))
	e.eventually("the new template warm, with the renewal's spares", func() bool {
		for _, g := range e.status().Grants {
			if g.UID == uid && g.Warm && g.Template == other {
				w, m, ok := e.warm.SpareSettings(uid)
				return ok && w == 3 && m == 10
			}
		}
		return false
	})
	if warms, _ := e.warm.Counts(); warms != 2 {
		t.Fatalf("warms = %d, want 2: the new template is a new zygote", warms)
	}
	if sp := e.grantStatus(uid).Spares; sp == nil || sp.Warm != 3 || sp.Ready != 3 {
		t.Fatalf("status spares after the change = %+v, want warm 3, 3 ready", sp)
	}
}
