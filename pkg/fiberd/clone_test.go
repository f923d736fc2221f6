package fiberd

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	homefake "fiberd.io/fiberd/pkg/home/fake"
)

// TestCloneServes is the served row: a Clone by token admits, warms and
// creates; a Clone by UID creates the next fiber; the fence is the id.
func TestCloneServes(t *testing.T) {
	e := newEnv(t)
	tok := e.mint("g1")
	r := e.cloneReq(e.tcp, api.CloneRequest{Grant: tok, Payload: []byte("hi")})
	if r.status != http.StatusOK {
		t.Fatalf("clone by token: %d %s", r.status, r.body)
	}
	c := r.clone(t)
	want := core.Fence{GrantUID: "g1", Epoch: e.agent.Epoch(), Seq: 1}
	if c.Kind != api.KindCreate || c.Fence != want || c.FiberID != want.String() || !strings.HasPrefix(c.Endpoint, "unix:///") {
		t.Fatalf("clone = %+v, want a create of %v on a unix endpoint", c, want)
	}
	req, ok := e.warm.Request(want)
	if !ok || string(req.Payload) != "hi" {
		t.Fatalf("backend fiber %v: running %v payload %q", want, ok, req.Payload)
	}
	wr, _ := e.warm.WarmRequest("g1")
	if len(wr.Devices.Devices) != 1 {
		t.Errorf("template warmed without the home's devices: %+v", wr.Devices)
	}
	if !e.home.IsReady("g1") {
		t.Errorf("PublishReady(g1, true) not called")
	}
	r = e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"})
	if r.status != http.StatusOK || r.clone(t).Fence.Seq != 2 {
		t.Fatalf("clone by uid: %d %s", r.status, r.body)
	}
	if warms, _ := e.warm.Counts(); warms != 1 {
		t.Errorf("template warmed %d times, want 1", warms)
	}
}

// TestCloneMisses checks each capacity miss under a healthy lane
// (DEFERRED_FALLBACK, 503) and a stale one (SHED, 429 with Retry-After),
// and that every miss body names its code and the issuer.
func TestCloneMisses(t *testing.T) {
	type setup func(e *env) api.CloneRequest
	misses := []struct {
		name  string
		setup setup
	}{
		{"unknown grant", func(e *env) api.CloneRequest { return api.CloneRequest{GrantUID: "nobody"} }},
		{"at max", func(e *env) api.CloneRequest {
			uid := e.deliver(e.mint("g1", maxFibers(1)))
			if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
				e.t.Fatalf("first clone: %d %s", r.status, r.body)
			}
			return api.CloneRequest{GrantUID: uid}
		}},
		{"lease expired", func(e *env) api.CloneRequest {
			uid := e.deliver(e.mint("g1", lease(time.Minute)))
			e.clk.Step(2 * time.Minute) // the ledger or, once it ran, the lease's timer refuses
			e.home.Health().MarkSync()
			return api.CloneRequest{GrantUID: uid}
		}},
		{"expired token", func(e *env) api.CloneRequest {
			return api.CloneRequest{Grant: e.mint("g1", issuedAt(testStart.Add(-2*time.Hour)))}
		}},
		{"template not warm", func(e *env) api.CloneRequest {
			return api.CloneRequest{Grant: e.mint("g1")} // the Warm hook fails
		}},
		{"denied", func(e *env) api.CloneRequest {
			tok := e.mint("g1")
			uid := e.deliver(tok)
			e.remove(uid)
			e.eventually("g1 yielded", func() bool { _, ok := e.agent.ledger.Grant(uid); return !ok })
			return api.CloneRequest{Grant: tok}
		}},
		{"template not on node", func(e *env) api.CloneRequest {
			return api.CloneRequest{Grant: e.mint("g1", templ("gone@sha256:"+strings.Repeat("a", 64)))}
		}},
	}
	for _, m := range misses {
		for _, healthy := range []bool{true, false} {
			name := m.name + "/healthy"
			if !healthy {
				name = m.name + "/stale"
			}
			t.Run(name, func(t *testing.T) {
				var opts []envOption
				if m.name == "template not warm" {
					opts = append(opts, withHooks(fake.Hooks{Warm: func(context.Context, backend.WarmRequest) error { return errors.New("zygote crashed during init") }}))
				}
				e := newEnv(t, opts...)
				req := m.setup(e)
				if !healthy {
					e.home.SetIssuerReachable(false)
				}
				r := e.cloneReq(e.unix, req)
				body := r.apiError(t)
				if healthy {
					if r.status != http.StatusServiceUnavailable || body.Code != string(core.CodeDeferredFallback) {
						t.Fatalf("got %d %s, want 503 DEFERRED_FALLBACK", r.status, r.body)
					}
				} else {
					if r.status != http.StatusTooManyRequests || body.Code != string(core.CodeShed) || r.header.Get("Retry-After") != "1" || body.RetryAfterSeconds != 1 {
						t.Fatalf("got %d %v %s, want 429 SHED with Retry-After 1", r.status, r.header, r.body)
					}
				}
				if body.Issuer != testIssuer || body.Message == "" {
					t.Errorf("miss body %s does not name the issuer and a reason", r.body)
				}
			})
		}
	}
}

// TestCloneRefusals checks every refusal row that is not a capacity miss:
// each answers its status and code, a SHED with Retry-After.
func TestCloneRefusals(t *testing.T) {
	others := []struct {
		name   string
		opts   []envOption
		req    func(e *env) any
		status int
		code   string
	}{
		{"malformed: no grant", nil, func(e *env) any { return api.CloneRequest{} }, 400, api.CodeInvalid},
		{"malformed: payload too big", nil, func(e *env) any {
			return api.CloneRequest{Grant: e.mint("g1"), Payload: make([]byte, api.MaxPayload+1)}
		}, 400, api.CodeInvalid},
		{"malformed: negative deadline", nil, func(e *env) any { return api.CloneRequest{GrantUID: "g1", DeadlineMs: -1} }, 400, api.CodeInvalid},
		{"malformed: uid mismatch", nil, func(e *env) any { return api.CloneRequest{Grant: e.mint("g1"), GrantUID: "g2"} }, 400, api.CodeInvalid},
		{"unverified: bad signature", nil, func(e *env) any { return api.CloneRequest{Grant: e.mintWith(e.other, "g1")} }, 401, api.CodeUnauthenticated},
		{"unverified: garbage", nil, func(e *env) any { return api.CloneRequest{Grant: "not.a.token"} }, 401, api.CodeUnauthenticated},
		{"unverified: wrong audience", nil, func(e *env) any {
			tok, err := e.signer.Mint(core.Grant{UID: "g1", Issuer: testIssuer, Audience: "node-2", Template: e.zygote,
				Fibers: core.Fibers{Max: 1}, IssuedAt: testStart, Expiry: testStart.Add(time.Hour)})
			must(e.t, err)
			return api.CloneRequest{Grant: string(tok)}
		}, 401, api.CodeUnauthenticated},
		{"tier gap", nil, func(e *env) any { return api.CloneRequest{Grant: e.mint("g1", templ(e.plain), tier(core.TierWarm))} }, 412, api.CodeTierGap},
		{"tier gap: checkpoint", nil, func(e *env) any {
			return api.CloneRequest{Grant: e.mint("g1", tier(core.TierCheckpoint))}
		}, 412, api.CodeTierGap},
		{"tier gap: no WARM backend", []envOption{noWarm()}, func(e *env) any {
			return api.CloneRequest{Grant: e.mint("g1", tier(core.TierWarm))}
		}, 412, api.CodeTierGap},
		{"runtime fault", []envOption{withHooks(fake.Hooks{Clone: func(context.Context, backend.CloneRequest) error {
			return errors.New("fork: resource temporarily unavailable")
		}})},
			func(e *env) any { return api.CloneRequest{Grant: e.mint("g1")} }, 500, api.CodeInternal},
		{"thrash budget", []envOption{withConfig(func(c *Config) { c.ThrashRate, c.ThrashBurst = 0.001, 1 })}, func(e *env) any {
			tok := e.mint("g1")
			if r := e.cloneReq(e.unix, api.CloneRequest{Grant: tok}); r.status != 200 {
				e.t.Fatalf("first clone: %d %s", r.status, r.body)
			}
			return api.CloneRequest{Grant: tok} // the grant's budget, spent
		}, 429, string(core.CodeShed)},
	}
	for _, o := range others {
		t.Run(o.name, func(t *testing.T) {
			e := newEnv(t, o.opts...)
			r := e.post(e.unix, "/v1/clone", o.req(e))
			if body := r.apiError(t); r.status != o.status || body.Code != o.code {
				t.Fatalf("got %d %s, want %d %s", r.status, r.body, o.status, o.code)
			}
			if o.status == 429 && r.header.Get("Retry-After") == "" {
				t.Errorf("SHED without Retry-After")
			}
		})
	}
}

// TestThrashShedsWhileHealthy: the thrash budget is SHED whatever the lane.
func TestThrashShedsWhileHealthy(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.ThrashRate, c.ThrashBurst = 0.001, 2 }))
	uid := e.deliver(e.mint("g1"))
	for i := 0; i < 2; i++ {
		if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
			t.Fatalf("clone %d: %d %s", i, r.status, r.body)
		}
	}
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
	if r.status != 429 || r.apiError(t).Code != string(core.CodeShed) {
		t.Fatalf("third clone: %d %s, want 429 SHED", r.status, r.body)
	}
}

// TestUnverifiableShedsWhileHealthy: issuer keys that were never loaded or
// are stale make a token unverifiable, which is SHED (back off) whatever the
// lane says, never DEFERRED and never 401.
func TestUnverifiableShedsWhileHealthy(t *testing.T) {
	for _, healthy := range []bool{true, false} {
		e := newEnv(t)
		e.keys.setDown(true)
		if !healthy {
			e.home.SetIssuerReachable(false)
		}
		r := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")})
		body := r.apiError(t)
		if r.status != http.StatusTooManyRequests || body.Code != string(core.CodeShed) || r.header.Get("Retry-After") == "" {
			t.Fatalf("lane healthy=%v: got %d %s, want 429 SHED with Retry-After", healthy, r.status, r.body)
		}
		if body.Issuer != testIssuer {
			t.Errorf("miss body %s does not name the issuer", r.body)
		}
	}
}

// TestSessionAttach: 50 concurrent Clones of one session make one fiber;
// the others attach to it.
func TestSessionAttach(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	var wg sync.WaitGroup
	var creates, attaches atomic.Int32
	ids := make(chan string, 50)
	for i := 0; i < 50; i++ {
		wg.Go(func() {
			r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s1"})
			if r.status != 200 {
				t.Errorf("clone: %d %s", r.status, r.body)
				return
			}
			c := r.clone(t)
			ids <- c.FiberID
			switch c.Kind {
			case api.KindCreate:
				creates.Add(1)
			case api.KindAttach:
				attaches.Add(1)
			}
		})
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Fatalf("session resolved to two fibers: %s and %s", first, id)
		}
	}
	if creates.Load() != 1 || attaches.Load() != 49 {
		t.Fatalf("creates %d attaches %d, want 1 and 49", creates.Load(), attaches.Load())
	}
	if n := len(e.warm.Running(uid)); n != 1 {
		t.Fatalf("backend runs %d fibers, want 1", n)
	}
}

// TestBurstNeverExceedsMax: a burst of 40 Clones on a grant of max 5 makes
// exactly 5 fibers, and the backend never runs more than 5 at once.
func TestBurstNeverExceedsMax(t *testing.T) {
	var e *env
	var over atomic.Bool
	hooks := fake.Hooks{Clone: func(ctx context.Context, req backend.CloneRequest) error {
		if len(e.warm.Running(req.Fence.GrantUID)) >= 5 {
			over.Store(true)
		}
		time.Sleep(time.Millisecond)
		return nil
	}}
	e = newEnv(t, withHooks(hooks))
	uid := e.deliver(e.mint("g1", maxFibers(5)))
	var wg sync.WaitGroup
	var served, missed atomic.Int32
	for i := 0; i < 40; i++ {
		wg.Go(func() {
			r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
			switch r.status {
			case 200:
				served.Add(1)
			case 503:
				missed.Add(1)
			default:
				t.Errorf("clone: %d %s", r.status, r.body)
			}
		})
	}
	wg.Wait()
	if served.Load() != 5 || missed.Load() != 35 || over.Load() {
		t.Fatalf("served %d missed %d over %v, want 5, 35, false", served.Load(), missed.Load(), over.Load())
	}
	if n := len(e.warm.Running(uid)); n != 5 {
		t.Fatalf("backend runs %d fibers, want 5", n)
	}
}

// TestEpochBumpMidClone: a scope loss while the backend forks makes the
// commit fail; the new fiber is released and the Clone misses.
func TestEpochBumpMidClone(t *testing.T) {
	entered := make(chan struct{})
	proceed := make(chan struct{})
	var once sync.Once
	hooks := fake.Hooks{Clone: func(ctx context.Context, req backend.CloneRequest) error {
		if req.Fence.Seq == 2 {
			once.Do(func() { close(entered) })
			<-proceed
		}
		return nil
	}}
	e := newEnv(t, withHooks(hooks))
	uid := e.deliver(e.mint("g1"))
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
	if r.status != 200 {
		t.Fatalf("first clone: %d %s", r.status, r.body)
	}
	old := r.clone(t)
	done := make(chan reply, 1)
	go func() { done <- e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}) }()
	<-entered
	before := e.agent.Epoch()
	e.loseScope("pod deleted")
	if e.agent.Epoch() != before+1 {
		t.Fatalf("epoch %d after scope loss, want %d", e.agent.Epoch(), before+1)
	}
	close(proceed)
	r = <-done
	if r.status != 503 {
		t.Fatalf("clone across an epoch bump: %d %s, want a miss", r.status, r.body)
	}
	if n := e.warm.Running(""); len(n) != 0 {
		t.Fatalf("backend still runs %v after the bump", n)
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: old.FiberID}); r.status != 404 {
		t.Fatalf("release of an older-epoch fiber: %d %s, want 404", r.status, r.body)
	}
	// Grants stay admitted and warm: the next Clone serves in the new epoch.
	r = e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
	if r.status != 200 || r.clone(t).Fence.Epoch != before+1 {
		t.Fatalf("clone after the bump: %d %s", r.status, r.body)
	}
}

// TestLeaseExpiryYields: the lease's timer yields a grant whose lease lapsed:
// fibers released, zygote stopped, readiness withdrawn.
func TestLeaseExpiryYields(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", lease(time.Minute)))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	e.eventually("lease timer set", e.clk.HasWaiters)
	e.clk.Step(time.Minute)
	e.eventually("g1 yielded", func() bool {
		_, admitted := e.agent.ledger.Grant(uid)
		return !admitted && len(e.warm.Running(uid)) == 0 && !e.warm.Warmed(uid) && !e.home.IsReady(uid)
	})
	if st := e.status(); len(st.Grants) != 0 {
		t.Fatalf("status still lists %+v", st.Grants)
	}
}

// TestGrantRemovedDenies: GrantRemoved yields the grant and denies it until
// the lane delivers it again; a renewal keeps the template warm.
func TestGrantRemovedDenies(t *testing.T) {
	e := newEnv(t)
	tok := e.mint("g1")
	uid := e.deliver(tok)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	// Renewal: a new token for the same UID updates the lease, no re-warm.
	e.clk.Step(10 * time.Second)
	renewed := e.mint("g1", lease(2*time.Hour))
	e.home.Deliver(uid, []byte(renewed))
	e.eventually("lease renewed", func() bool {
		g, _ := e.agent.ledger.Grant(uid)
		return g.Expiry.Equal(e.clk.Now().Truncate(time.Second).Add(2 * time.Hour))
	})
	if warms, _ := e.warm.Counts(); warms != 1 || len(e.warm.Running(uid)) != 1 {
		t.Fatalf("renewal re-warmed (%d warms) or dropped fibers (%v)", warms, e.warm.Running(uid))
	}

	e.remove(uid)
	e.eventually("g1 yielded", func() bool { return len(e.warm.Running(uid)) == 0 && !e.home.IsReady(uid) })
	if r := e.cloneReq(e.unix, api.CloneRequest{Grant: renewed}); r.status != 503 || !strings.Contains(r.apiError(t).Message, "revoked") {
		t.Fatalf("clone of a removed grant: %d %s, want a miss naming the revocation", r.status, r.body)
	}
	e.deliver(renewed)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone after redelivery: %d %s", r.status, r.body)
	}
}

// TestSupersededTokenKeepsRenewal: after the lane delivers a renewal, a
// Clone still presenting the older token is served under the renewed grant;
// it neither rolls the lease back nor re-admits the old terms, so the grant
// outlives the old token's expiry.
func TestSupersededTokenKeepsRenewal(t *testing.T) {
	e := newEnv(t)
	old := e.mint("g1", lease(time.Hour))
	uid := e.deliver(old)
	e.clk.Step(10 * time.Second)
	renewed := e.mint("g1", lease(2*time.Hour))
	e.home.Deliver(uid, []byte(renewed))
	want := e.clk.Now().Truncate(time.Second).Add(2 * time.Hour)
	e.eventually("lease renewed", func() bool {
		g, _ := e.agent.ledger.Grant(uid)
		return g.Expiry.Equal(want)
	})
	if r := e.cloneReq(e.unix, api.CloneRequest{Grant: old}); r.status != 200 {
		t.Fatalf("clone with the superseded token: %d %s", r.status, r.body)
	}
	if g, _ := e.agent.ledger.Grant(uid); !g.Expiry.Equal(want) || string(g.Token) != renewed {
		t.Fatalf("after a clone with the superseded token the lease ends %v, want %v (the renewal's)", g.Expiry, want)
	}
	if warms, _ := e.warm.Counts(); warms != 1 {
		t.Fatalf("superseded token re-warmed the template (%d warms)", warms)
	}
	// Past the old token's expiry the grant is still admitted and served.
	e.eventually("lease timer set", e.clk.HasWaiters)
	e.clk.Step(time.Hour)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone after the old token's expiry: %d %s", r.status, r.body)
	}
}

// TestFiberExitFreesItsPlace: a fiber that ends on its own frees its place
// under fibers.max.
func TestFiberExitFreesItsPlace(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1", maxFibers(1)))
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
	if r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 503 {
		t.Fatalf("clone at max: %d %s", r.status, r.body)
	}
	if !e.warm.Exit(r.clone(t).Fence, 0) {
		t.Fatal("fake: fiber not running")
	}
	e.eventually("slot freed", func() bool { return e.status().Grants[0].Running == 0 })
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("clone after exit: %d %s", r.status, r.body)
	}
}

// TestReleaseAndPark: release kills and forgets; a second release and an
// unknown id are 404; park is a tier gap.
func TestReleaseAndPark(t *testing.T) {
	e := newEnv(t)
	c := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}).clone(t)
	if r := e.post(e.unix, "/v1/park", api.FiberRequest{FiberID: c.FiberID}); r.status != 412 || r.apiError(t).Code != api.CodeTierGap {
		t.Fatalf("park: %d %s, want 412", r.status, r.body)
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 200 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	if len(e.warm.Running("g1")) != 0 {
		t.Fatal("released fiber still runs")
	}
	for _, id := range []string{c.FiberID, "g1/1/99", "nobody/1/1"} {
		if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: id}); r.status != 404 {
			t.Errorf("release %s: %d %s, want 404", id, r.status, r.body)
		}
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: "g1"}); r.status != 400 {
		t.Errorf("release of a malformed id: %d, want 400", r.status)
	}
	if r := e.post(e.unix, "/v1/park", api.FiberRequest{FiberID: "g1/1/99"}); r.status != 404 {
		t.Errorf("park of an unknown fiber: %d, want 404", r.status)
	}
}

// TestSelfAdmission: naming the home's SelfAdmitUID admits its OwnGrant for
// authenticated callers (the unix socket) only, not over plaintext TCP.
func TestSelfAdmission(t *testing.T) {
	var own string
	e := newEnv(t, withHome(func(c *homefake.Config) { c.SelfAdmitUID = "pod-uid-1"; c.NoLane = true }))
	own = e.mint("pod-uid-1")
	e.home.SetOwnGrant([]byte(own))
	// A token of another grant is replaced by the home's own, too.
	for _, req := range []api.CloneRequest{{GrantUID: "pod-uid-1"}, {Grant: e.mintWith(e.other, "pod-uid-1")}} {
		r := e.cloneReq(e.tcp, req)
		if r.status == 200 {
			t.Fatalf("plaintext TCP caller self-admitted: %s", r.body)
		}
	}
	if _, ok := e.agent.ledger.Grant("pod-uid-1"); ok {
		t.Fatal("own grant admitted for an unauthenticated caller")
	}
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "pod-uid-1"})
	if r.status != 200 || r.clone(t).Fence.GrantUID != "pod-uid-1" {
		t.Fatalf("self-admission over the unix socket: %d %s", r.status, r.body)
	}
	r = e.cloneReq(e.unix, api.CloneRequest{Grant: e.mintWith(e.other, "pod-uid-1")})
	if r.status != 200 {
		t.Fatalf("self-admission replacing a presented token: %d %s", r.status, r.body)
	}
}

// TestRestartBumpsEpoch: a new agent on the same state runs epoch + 1 and
// answers 404 for the old fiber ids.
func TestRestartBumpsEpoch(t *testing.T) {
	e := newEnv(t)
	c := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}).clone(t)
	first := e.agent.Epoch()
	e.stop()
	if len(e.warm.Running("")) != 0 {
		t.Fatal("fibers survive the drain")
	}
	if n := e.home.Closes(); n != 1 {
		t.Fatalf("home closed %d times, want 1", n)
	}
	e.warm = fake.New(core.TierWarm, fake.Hooks{})
	e.basic = fake.New(core.TierBasic, fake.Hooks{})
	e.home = newTestHome(e.clk)
	e.cfg.Home, e.cfg.Warm, e.cfg.Basic = e.home, e.warm, e.basic
	e.cfg.Registry = nil
	e.start()
	if e.agent.Epoch() != first+1 {
		t.Fatalf("epoch after restart %d, want %d", e.agent.Epoch(), first+1)
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 404 {
		t.Fatalf("old fiber id: %d, want 404", r.status)
	}
}
