package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/template"
)

// Home is one home under test.
type Home struct {
	// Name names the home in test names.
	Name string
	// New builds a fresh home for one agent run. dir belongs to the test
	// environment and outlives a restart (a file lane's directory goes
	// there); devices are the static devices the home hands every
	// template.
	New func(t *testing.T, dir string, devices []string) (home.Home, Control)
}

// Control drives a home's inputs as its real source would.
type Control interface {
	// Deliver makes the home's lane deliver token, of grant uid.
	Deliver(t *testing.T, uid string, token []byte)
	// Remove makes the lane remove grant uid.
	Remove(t *testing.T, uid string)
	// LoseScope makes the home lose its scope by its own signal (a
	// deleted Pod). It reports false when the home has no scope to lose.
	LoseScope(t *testing.T) bool
}

// Backend is one backend under test.
type Backend struct {
	// Name names the backend in test names.
	Name string
	// Tier is the tier it serves: WARM is wired as the agent's Warm
	// backend, BASIC as its Basic one.
	Tier core.Tier
	// New builds a fresh backend for one agent run.
	New func(t *testing.T) backend.Backend
	// Spec is the template the suite runs on it. A real backend runs the
	// C counter (examples/templates/c), which answers "pid=<n>" and
	// GET /dirty/<MiB>.
	Spec func(t *testing.T) template.Spec
	// Running reports whether fiber f still runs.
	Running func(t *testing.T, b backend.Backend, f api.CloneResponse) bool
	// OverBudget makes fiber f go over a W budget of a few MiB: a real
	// fiber dirties 24 MiB; the fake ends as the kernel ends a fiber at
	// its leaf's memory.max.
	OverBudget func(t *testing.T, b backend.Backend, f api.CloneResponse)
	// Devices are the devices fiber f's template got (FIBERD_DEVICES).
	Devices func(t *testing.T, b backend.Backend, f api.CloneResponse) []string
	// KillZygote kills grant uid's zygote as a crash would. Nil for a
	// backend without zygotes.
	KillZygote func(t *testing.T, b backend.Backend, uid string)
	// Warm is the fibers.warm of every grant the suite mints: with spares
	// (a backend that hands them over), Clones take spare fibers, and
	// every promise must hold as when they fork. Default 0.
	Warm int
	// Parking builds the backend with a working CHECKPOINT tier (the
	// proc backend with CRIU, the fake with EnableCheckpoint), which the
	// park promises run on; it skips the test, saying what is missing,
	// where the tier cannot work here. Nil for a backend that cannot park
	// (exec): the park promises skip, saying so.
	Parking func(t *testing.T) backend.Backend
	// Remembers is what running fiber f holds in its memory from its
	// start, compared across a park and a resume: a real fiber's
	// FIBERD_FENCE and FIBERD_PAYLOAD as the counter answers them, the
	// fake's payload. It fails the test when f does not answer.
	Remembers func(t *testing.T, b backend.Backend, f api.CloneResponse) string
}

// Promises are the agent's promises the suite checks, by name, in order.
var Promises = []string{
	"idempotent session attach",
	"fences strictly increasing",
	"epoch bump ends every fiber",
	"revocation by lease end",
	"admission completeness",
	"W budget",
	"tier floor",
	"device budget",
	"zygote loss",
	"scope loss",
	"a Clone of a parked session resumes it",
	"sessions are their creators', parked too",
	"an image lives as long as its session can come back",
}

var promises = map[string]func(e *env){
	"idempotent session attach":                sessionAttach,
	"fences strictly increasing":               fencesIncrease,
	"epoch bump ends every fiber":              epochBump,
	"revocation by lease end":                  leaseEnd,
	"admission completeness":                   admission,
	"W budget":                                 wBudget,
	"tier floor":                               tierFloor,
	"device budget":                            deviceBudget,
	"zygote loss":                              zygoteLoss,
	"scope loss":                               scopeLoss,
	"a Clone of a parked session resumes it":   parkResume,
	"sessions are their creators', parked too": parkedSessionKey,
	"an image lives as long as its session can come back": imageLifetime,
}

// parking are the promises that park: they run on Backend.Parking, with
// the agent's plaintext TCP listener on too (Config.InsecurePlaintext, on
// loopback), and skip on a backend that cannot park.
var parking = map[string]bool{
	"a Clone of a parked session resumes it":              true,
	"sessions are their creators', parked too":            true,
	"an image lives as long as its session can come back": true,
}

// Run checks every promise of the agent with home h and backend b, each in
// a subtest on a fresh agent, home and backend.
func Run(t *testing.T, h Home, b Backend) {
	for _, name := range Promises {
		t.Run(name, func(t *testing.T) {
			b := b
			if parking[name] {
				if b.Parking == nil {
					t.Skipf("backend %s cannot park (no Backend.Parking: exec has no checkpoints)", b.Name)
				}
				b.New = b.Parking
			}
			e := newEnv(t, h, b, parking[name])
			promises[name](e)
		})
	}
}

const (
	issuer = "https://issuer.conformance.test"
	node   = "node-conformance"
	// wait bounds what the agent should do within a few polls.
	wait = 60 * time.Second
)

// devices are the static devices every home under test hands templates.
var devices = []string{"dev-a", "dev-b"}

// env is one agent under test.
type env struct {
	t      *testing.T
	h      Home
	b      Backend
	dir    string // the environment's, for the home
	state  string
	tmpl   string // the template's ref
	signer *grant.Signer
	keys   grant.KeySource

	// minIsolation is the agent's Config.MinIsolation at its next start.
	minIsolation backend.Isolation
	// plaintext turns on the agent's plaintext TCP listener on loopback,
	// which tcp is a client of (nil without it).
	plaintext bool
	tcp       *client.Client

	home   home.Home
	ctl    Control
	be     backend.Backend
	agent  *fiberd.Agent
	c      *client.Client
	cancel context.CancelFunc
	done   chan error
}

func newEnv(t *testing.T, h Home, b Backend, plaintext bool) *env {
	e := &env{t: t, h: h, b: b, dir: t.TempDir(), plaintext: plaintext}
	// A short state path: unix socket paths are limited to 108 bytes.
	state, err := os.MkdirTemp("", "fc")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	e.state = state
	key, err := grant.GenerateKey("EdDSA", "k1")
	must(t, err)
	e.signer, err = grant.NewSigner(key)
	must(t, err)
	jwks, err := grant.PublicJWKS(key)
	must(t, err)
	e.keys, err = grant.NewStaticKeys(jwks)
	must(t, err)
	tdir := filepath.Join(state, "templates")
	e.tmpl = writeSpec(t, tdir, "t", b.Spec(t))
	e.start()
	return e
}

// writeSpec writes spec as dir/name.json and returns its template ref.
func writeSpec(t *testing.T, dir, name string, spec template.Spec) string {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	raw, err := json.Marshal(spec)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, name+".json"), raw, 0o644))
	return name + "@sha256:" + template.Digest(raw)
}

// start builds a fresh home and backend and runs an agent on e's state.
func (e *env) start() {
	t := e.t
	t.Helper()
	e.home, e.ctl = e.h.New(t, e.dir, devices)
	e.be = e.b.New(t)
	cfg := fiberd.Config{
		Home: e.home, Issuer: issuer, NodeID: node, Keys: e.keys,
		Templates: filepath.Join(e.state, "templates"), StateDir: e.state,
		BudgetInterval: 100 * time.Millisecond, AdminUnsafe: fiberd.TestHooks, MinIsolation: e.minIsolation,
		Logger: funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{Verbosity: 0}),
	}
	if e.plaintext {
		cfg.Listen, cfg.InsecurePlaintext = "127.0.0.1:0", true
	}
	if e.b.Tier == core.TierWarm {
		cfg.Warm = e.be
	} else {
		cfg.Basic = e.be
	}
	a, err := fiberd.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("fiberd.New: %v", err)
	}
	e.agent = a
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() { e.done <- a.Run(ctx) }()
	e.c, err = client.New(client.Config{Addr: "unix://" + a.SocketPath(), Timeout: wait})
	must(t, err)
	if e.plaintext {
		e.tcp, err = client.New(client.Config{Addr: a.Addr().String(), Timeout: wait})
		must(t, err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(e.stop) })
}

// stop ends the agent and waits for Run.
func (e *env) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("Run: %v", err)
		}
	case <-time.After(wait):
		e.t.Errorf("Run did not return within %v of its context's end", wait)
	}
	e.cancel = nil
}

// restart stops the agent and runs a new one on the same state directory,
// with a fresh home and backend.
func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

// mint signs grant uid of the suite's template: max 4, a lease of an
// hour from now, adjusted by opts.
func (e *env) mint(uid string, opts ...func(*core.Grant)) []byte {
	e.t.Helper()
	now := time.Now().Truncate(time.Second)
	g := core.Grant{UID: uid, Issuer: issuer, Audience: node, Template: e.tmpl,
		Fibers: core.Fibers{Max: 4, Warm: e.b.Warm}, IssuedAt: now, Expiry: now.Add(time.Hour)}
	for _, o := range opts {
		o(&g)
	}
	tok, err := e.signer.Mint(g)
	must(e.t, err)
	return tok
}

// deliverWarm has the lane deliver token and waits until grant uid is
// warm, and with Backend.Warm until its spares are ready.
func (e *env) deliverWarm(uid string, token []byte) {
	e.t.Helper()
	e.ctl.Deliver(e.t, uid, token)
	e.eventually("grant "+uid+" warm", func() bool { g, ok := e.grant(uid); return ok && g.Warm })
	if e.b.Warm > 0 {
		// The first Clones take spares, not forks.
		e.eventually("grant "+uid+" spares ready", func() bool {
			g, ok := e.grant(uid)
			return ok && g.Spares != nil && g.Spares.HandOver && g.Spares.Wanted > 0 && g.Spares.Ready >= g.Spares.Wanted
		})
	}
}

// grant is uid's entry in the status.
func (e *env) grant(uid string) (api.GrantStatus, bool) {
	for _, g := range e.status().Grants {
		if g.UID == uid {
			return g, true
		}
	}
	return api.GrantStatus{}, false
}

func (e *env) status() api.Status {
	e.t.Helper()
	st, err := e.c.Status(e.ctx())
	must(e.t, err)
	return st
}

func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	e.t.Cleanup(cancel)
	return ctx
}

// clone sends a Clone and fails the test unless it is served.
func (e *env) clone(req api.CloneRequest) api.CloneResponse {
	e.t.Helper()
	r, err := e.c.Clone(e.ctx(), req)
	if err != nil {
		e.t.Fatalf("clone %+v: %v", req, err)
	}
	return r
}

// refuse sends a Clone and returns its refusal, failing the test when it
// is served.
func (e *env) refuse(req api.CloneRequest) *client.Error {
	e.t.Helper()
	r, err := e.c.Clone(e.ctx(), req)
	var ce *client.Error
	if !errors.As(err, &ce) {
		e.t.Fatalf("clone %+v = %+v, %v; want a refusal", req, r, err)
	}
	return ce
}

// eventually polls cond for up to wait.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("waited %v for %s", wait, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------- promises

// sessionAttach: Clones naming a running session attach to its fiber, also
// a burst of them at once, which makes exactly one fiber.
func sessionAttach(e *env) {
	t := e.t
	e.deliverWarm("g1", e.mint("g1"))
	first := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1"})
	again := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1"})
	if first.Kind != api.KindCreate || again.Kind != api.KindAttach || again.Fence != first.Fence || again.Endpoint != first.Endpoint {
		t.Fatalf("clones of one session: %+v then %+v, want a create then an attach to it", first, again)
	}
	var wg sync.WaitGroup
	out := make(chan api.CloneResponse, 8)
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			r, err := e.c.Clone(context.Background(), api.CloneRequest{GrantUID: "g1", Session: "s2"})
			if err != nil {
				t.Errorf("burst clone of session s2: %v", err)
				return
			}
			out <- r
		})
	}
	wg.Wait()
	close(out)
	creates, fences := 0, map[core.Fence]bool{}
	for r := range out {
		if r.Kind == api.KindCreate {
			creates++
		}
		fences[r.Fence] = true
	}
	if creates != 1 || len(fences) != 1 {
		t.Fatalf("a burst of 8 clones of one session made %d fibers (%d creates), want 1", len(fences), creates)
	}
	if g, _ := e.grant("g1"); g.Running != 2 {
		t.Fatalf("grant runs %d fibers, want 2 (one per session)", g.Running)
	}
}

// fencesIncrease: every fiber's fence is strictly newer than the one
// before, in the agent's epoch, also across refusals and a revocation and
// redelivery of the grant.
func fencesIncrease(e *env) {
	t := e.t
	tok := e.mint("g1", func(g *core.Grant) { g.Fibers.Max = 2 })
	e.deliverWarm("g1", tok)
	var last core.Fence
	next := func() api.CloneResponse {
		t.Helper()
		r := e.clone(api.CloneRequest{GrantUID: "g1"})
		if r.Fence.Epoch != e.agent.Epoch() {
			t.Fatalf("fence %s, want epoch %d", r.FiberID, e.agent.Epoch())
		}
		if c, ok := r.Fence.Compare(last); last != (core.Fence{}) && (!ok || c <= 0) {
			t.Fatalf("fence %s after %s: not newer", r.FiberID, last)
		}
		last = r.Fence
		return r
	}
	a, _ := next(), next()
	e.refuse(api.CloneRequest{GrantUID: "g1"}) // at max
	must(t, e.c.Release(e.ctx(), a.FiberID))
	c := next()
	if c.Fence.Seq != a.Fence.Seq+2 {
		t.Errorf("fence after a refusal at max is %s, want seq %d: a refusal mints no fence", c.FiberID, a.Fence.Seq+2)
	}
	e.ctl.Remove(t, "g1")
	e.eventually("g1 yielded", func() bool { _, ok := e.grant("g1"); return !ok })
	e.deliverWarm("g1", e.mint("g1", func(g *core.Grant) { g.Fibers.Max = 2; g.IssuedAt = g.IssuedAt.Add(time.Second) }))
	next()
}

// epochBump: a new epoch ends every fiber of the old one, whose ids answer
// 404 after: at a restart of the agent, and at run time (the admin
// socket's POST /scope-lost, in a testhooks build). Grants stay warm.
func epochBump(e *env) {
	t := e.t
	e.deliverWarm("g1", e.mint("g1"))
	f := e.clone(api.CloneRequest{GrantUID: "g1"})
	first := e.agent.Epoch()
	oldBackend := e.be
	e.restart()
	if e.agent.Epoch() != first+1 {
		t.Fatalf("epoch after a restart %d, want %d", e.agent.Epoch(), first+1)
	}
	if e.b.Running(t, oldBackend, f) {
		t.Errorf("fiber %s of the old epoch still runs after the restart", f.FiberID)
	}
	if err := e.c.Release(e.ctx(), f.FiberID); !isCode(err, http.StatusNotFound) {
		t.Errorf("release of %s of the old epoch: %v, want 404", f.FiberID, err)
	}

	if !fiberd.TestHooks {
		t.Log("run-time epoch bump not checked: it needs the admin socket's POST /scope-lost of a testhooks build (go test -tags testhooks)")
		return
	}
	e.deliverWarm("g1", e.mint("g1"))
	f = e.clone(api.CloneRequest{GrantUID: "g1"})
	before := e.agent.Epoch()
	adminPost(t, e.agent.AdminSocketPath(), "/scope-lost")
	if e.agent.Epoch() != before+1 {
		t.Fatalf("epoch after POST /scope-lost %d, want %d", e.agent.Epoch(), before+1)
	}
	e.eventually("the old epoch's fiber ended", func() bool { return !e.b.Running(t, e.be, f) })
	if err := e.c.Release(e.ctx(), f.FiberID); !isCode(err, http.StatusNotFound) {
		t.Errorf("release of %s of the old epoch: %v, want 404", f.FiberID, err)
	}
	if g := e.clone(api.CloneRequest{GrantUID: "g1"}); g.Fence.Epoch != before+1 {
		t.Errorf("clone after the bump: %s, want epoch %d", g.FiberID, before+1)
	}
}

// leaseEnd: a grant whose lease ends is yielded: its fibers end, it leaves
// the status, its Clones miss, and the home is told it is not ready.
func leaseEnd(e *env) {
	t := e.t
	tok := e.mint("g1", func(g *core.Grant) { g.Expiry = g.IssuedAt.Add(4 * time.Second) })
	e.deliverWarm("g1", tok)
	f := e.clone(api.CloneRequest{GrantUID: "g1"})
	e.eventually("the lease's end yielding g1", func() bool { _, ok := e.grant("g1"); return !ok })
	e.eventually("g1's fiber ended", func() bool { return !e.b.Running(t, e.be, f) })
	if r := e.refuse(api.CloneRequest{GrantUID: "g1"}); r.Status != http.StatusServiceUnavailable {
		t.Errorf("clone after the lease's end: %d %s, want 503", r.Status, r.Body.Message)
	}
	if r := e.refuse(api.CloneRequest{Grant: string(tok)}); r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Body.Message, "lease ended") {
		t.Errorf("clone by the lapsed token: %d %q, want 503 naming the lease", r.Status, r.Body.Message)
	}
	e.eventually("the home told g1 is not ready", func() bool { return !e.home.Ready() })
}

// admission: every grant the lane delivers is admitted and warmed; a
// Clone's token the lane never delivered is admitted by the Clone; a token
// of another issuer's key is 401; a grant of a template the node does not
// hold is a miss naming it; a grant the lane removed is refused by token.
func admission(e *env) {
	t := e.t
	toks := map[string][]byte{}
	for _, uid := range []string{"g1", "g2", "g3"} {
		toks[uid] = e.mint(uid, func(g *core.Grant) { g.Fibers.Max = 3 })
		e.ctl.Deliver(t, uid, toks[uid])
	}
	e.eventually("every delivered grant warm", func() bool {
		warm := 0
		for _, g := range e.status().Grants {
			if g.Warm && g.Max == 3 && g.Template == e.tmpl {
				warm++
			}
		}
		return warm == 3
	})
	if r := e.clone(api.CloneRequest{Grant: string(e.mint("byclone"))}); r.Fence.GrantUID != "byclone" {
		t.Errorf("clone by a token never delivered: %+v", r)
	}
	key, err := grant.GenerateKey("EdDSA", "k1")
	must(t, err)
	other, err := grant.NewSigner(key)
	must(t, err)
	forged, err := other.Mint(core.Grant{UID: "forged", Issuer: issuer, Audience: node, Template: e.tmpl,
		Fibers: core.Fibers{Max: 1}, IssuedAt: time.Now().Truncate(time.Second), Expiry: time.Now().Add(time.Hour)})
	must(t, err)
	if r := e.refuse(api.CloneRequest{Grant: string(forged)}); r.Status != http.StatusUnauthorized {
		t.Errorf("clone by a token of another key: %d, want 401", r.Status)
	}
	missing := "gone@sha256:" + strings.Repeat("a", 64)
	if r := e.refuse(api.CloneRequest{Grant: string(e.mint("elsewhere", func(g *core.Grant) { g.Template = missing }))}); r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Body.Message, "gone") {
		t.Errorf("clone of a template the node does not hold: %d %q, want 503 naming it", r.Status, r.Body.Message)
	}
	e.ctl.Remove(t, "g2")
	e.eventually("g2 yielded", func() bool { _, ok := e.grant("g2"); return !ok })
	if r := e.refuse(api.CloneRequest{Grant: string(toks["g2"])}); r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Body.Message, "revoked") {
		t.Errorf("clone by the token of a removed grant: %d %q, want 503 naming the revocation", r.Status, r.Body.Message)
	}
}

// wBudget: a fiber that dirties more than its grant's wBudget is ended, the
// reason in the grant's status, its exit and the metrics; a fiber within it
// runs on.
func wBudget(e *env) {
	t := e.t
	const budget = 8 << 20
	e.deliverWarm("g1", e.mint("g1", func(g *core.Grant) { g.WBudget = budget }))
	over := e.clone(api.CloneRequest{GrantUID: "g1"})
	within := e.clone(api.CloneRequest{GrantUID: "g1"})
	e.b.OverBudget(t, e.be, over)
	var g api.GrantStatus
	e.eventually("the fiber over its budget ended", func() bool { g, _ = e.grant("g1"); return g.OverBudget == 1 })
	if g.WBudget != budget || g.WBudgetBy == "" {
		t.Errorf("status wBudget %d by %q, want %d enforced", g.WBudget, g.WBudgetBy, budget)
	}
	if len(g.Exits) != 1 || g.Exits[0].FiberID != over.FiberID || !strings.HasPrefix(g.Exits[0].Reason, "over wBudget") {
		t.Errorf("status exits %+v, want %s ended over its wBudget", g.Exits, over.FiberID)
	}
	if e.b.Running(t, e.be, over) || !e.b.Running(t, e.be, within) {
		t.Errorf("after the budget's end: over runs %v, within runs %v; want false, true", e.b.Running(t, e.be, over), e.b.Running(t, e.be, within))
	}
	if m := metrics(t, e.agent.SocketPath()); !strings.Contains(m, `fiberd_fiber_exits_total{reason="over_wbudget"} 1`) {
		t.Errorf("metrics lack the over_wbudget exit:\n%s", m)
	}
}

// tierFloor: a grant whose minTier is above the tier its template is
// served at is refused with a tier gap (412), never served lower; one at
// the tier is served at it. On a node that serves grants isolated at least
// at a level (-min-isolation) its backend does not give on this host, a
// grant is refused with a tier gap too, never served less isolated.
func tierFloor(e *env) {
	t := e.t
	above := core.TierCheckpoint
	if e.b.Tier == core.TierBasic {
		above = core.TierWarm
	}
	if r := e.refuse(api.CloneRequest{Grant: string(e.mint("high", func(g *core.Grant) { g.MinTier = above }))}); r.Status != http.StatusPreconditionFailed || r.Body.Code != api.CodeTierGap {
		t.Errorf("clone of a grant needing %s on a %s backend: %d %s, want 412 TIER_GAP", above, e.b.Tier, r.Status, r.Body.Code)
	}
	if r := e.refuse(api.CloneRequest{GrantUID: "high"}); r.Status != http.StatusPreconditionFailed {
		t.Errorf("clone by UID of the refused grant: %d, want 412", r.Status)
	}
	e.clone(api.CloneRequest{Grant: string(e.mint("at", func(g *core.Grant) { g.MinTier = e.b.Tier }))})
	if g, _ := e.grant("at"); g.Tier != e.b.Tier {
		t.Errorf("grant at tier %s served at %s", e.b.Tier, g.Tier)
	}

	level := e.be.Isolation().Level
	if g, _ := e.grant("at"); g.Isolation != string(level) {
		t.Errorf("grant served with isolation %q, its backend gives %s", g.Isolation, level)
	}
	more := backend.IsolationGrant
	switch level {
	case backend.IsolationFiber:
		return // nothing is more
	case backend.IsolationGrant:
		more = backend.IsolationFiber
	}
	e.minIsolation = more
	e.restart()
	r := e.refuse(api.CloneRequest{Grant: string(e.mint("isolated"))})
	if r.Status != http.StatusPreconditionFailed || r.Body.Code != api.CodeTierGap || !strings.Contains(r.Body.Message, "isolat") {
		t.Errorf("clone of a grant on a node serving isolation %s at least, its backend giving %s: %d %s %q, want 412 TIER_GAP naming isolation",
			more, level, r.Status, r.Body.Code, r.Body.Message)
	}
	st := e.status()
	if _, admitted := e.grant("isolated"); admitted || st.MinIsolation != string(more) {
		t.Errorf("status %+v: want the grant not admitted and minIsolation %s", st, more)
	}
}

// deviceBudget: a grant's template gets the devices its grant asks for, no
// more, and a grant asking for more than the home offers is a miss naming
// the devices.
func deviceBudget(e *env) {
	t := e.t
	f := e.clone(api.CloneRequest{Grant: string(e.mint("one", func(g *core.Grant) { g.Devices = core.DeviceRequest{Class: "gpu", Count: 1} }))})
	if got := e.b.Devices(t, e.be, f); len(got) != 1 || got[0] != devices[0] {
		t.Errorf("template of a grant asking for 1 device got %v, want [%s]", got, devices[0])
	}
	r := e.refuse(api.CloneRequest{Grant: string(e.mint("three", func(g *core.Grant) { g.Devices = core.DeviceRequest{Class: "gpu", Count: 3} }))})
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Body.Message, "device") {
		t.Errorf("clone of a grant asking for 3 devices of 2: %d %q, want 503 naming the devices", r.Status, r.Body.Message)
	}
}

// zygoteLoss: when a grant's zygote dies its fibers end ("template died"),
// the grant is warmed again, and Clones are served again.
func zygoteLoss(e *env) {
	t := e.t
	if e.b.KillZygote == nil {
		t.Skipf("backend %s has no zygote", e.b.Name)
	}
	e.deliverWarm("g1", e.mint("g1"))
	a := e.clone(api.CloneRequest{GrantUID: "g1"})
	b := e.clone(api.CloneRequest{GrantUID: "g1"})
	e.b.KillZygote(t, e.be, "g1")
	e.eventually("both fibers' ends recorded", func() bool { g, _ := e.grant("g1"); return len(g.Exits) == 2 })
	g, _ := e.grant("g1")
	for _, x := range g.Exits {
		if x.Reason != "template died" {
			t.Errorf("exit %+v, want template died", x)
		}
	}
	for _, f := range []api.CloneResponse{a, b} {
		if e.b.Running(t, e.be, f) {
			t.Errorf("fiber %s runs on after its zygote died", f.FiberID)
		}
	}
	e.eventually("g1 warm again", func() bool { g, _ := e.grant("g1"); return g.Warm })
	if r := e.clone(api.CloneRequest{GrantUID: "g1"}); !e.b.Running(t, e.be, r) {
		t.Errorf("fiber %s of the new zygote does not run", r.FiberID)
	}
}

// scopeLoss: a home that loses its scope makes the agent bump its epoch:
// every fiber ends, grants stay warm, new fibers are of the new epoch.
func scopeLoss(e *env) {
	t := e.t
	e.deliverWarm("g1", e.mint("g1"))
	f := e.clone(api.CloneRequest{GrantUID: "g1"})
	before := e.agent.Epoch()
	if !e.ctl.LoseScope(t) {
		t.Skipf("home %s has no scope to lose", e.h.Name)
	}
	e.eventually("the epoch bump", func() bool { return e.agent.Epoch() == before+1 })
	e.eventually("the fiber ended", func() bool { return !e.b.Running(t, e.be, f) })
	if r := e.clone(api.CloneRequest{GrantUID: "g1"}); r.Fence.Epoch != before+1 {
		t.Errorf("clone after the scope loss: %s, want epoch %d", r.FiberID, before+1)
	}
}

// ----------------------------------------------------------------- helpers

func isCode(err error, status int) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == status
}

// metrics reads GET /metrics on the agent's API socket.
func metrics(t *testing.T, sock string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dial(ctx, "unix", sock)
	}}, Timeout: wait}
	resp, err := hc.Get("http://fiberd/metrics")
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return string(b)
}

// adminPost posts to the admin socket and fails unless it answers 200.
func adminPost(t *testing.T, sock, path string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dial(ctx, "unix", sock)
	}}, Timeout: wait}
	resp, err := hc.Post("http://admin"+path, "application/json", bytes.NewReader(nil))
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s on the admin socket: %d %s", path, resp.StatusCode, b)
	}
}

// fiberGet asks fiber f for path.
func fiberGet(t *testing.T, f api.CloneResponse, path string) (string, error) {
	network, addr, err := endpoint.Parse(f.Endpoint)
	if err != nil {
		return "", err
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dial(ctx, network, addr)
	}}, Timeout: 30 * time.Second}
	resp, err := hc.Get("http://fiber" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), err
}

func dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
