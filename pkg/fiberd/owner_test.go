package fiberd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/procrec"
)

// The tests of this file are the measurements of issue 13, each turned
// into a promise: a grant's work never waits for another grant's, a Clone
// answers within its own deadline with a miss rather than a fault, a
// revocation outlives a restart, and a refused Clone mints no fence.

// hung is a Warm hook that never returns for the grants it names, until
// the test ends (or the agent cancels the warm).
type hung struct {
	uids    map[string]bool
	release chan struct{}
	entered chan string // one send per hung Warm call that started
}

func newHung(t *testing.T, uids ...string) *hung {
	h := &hung{uids: map[string]bool{}, release: make(chan struct{}), entered: make(chan string, 64)}
	for _, u := range uids {
		h.uids[u] = true
	}
	t.Cleanup(func() { close(h.release) })
	return h
}

func (h *hung) warm(ctx context.Context, req backend.WarmRequest) error {
	if !h.uids[req.Grant.UID] {
		return nil
	}
	h.entered <- req.Grant.UID
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestHungTemplateDelaysNobody: while one grant's template never becomes
// ready, another grant delivered after it is admitted and warmed, and a
// third grant whose zygote dies is warmed again at once, without waiting
// for the hung one or for a resync round (the fake clock never moves here).
func TestHungTemplateDelaysNobody(t *testing.T) {
	h := newHung(t, "hung")
	e := newEnv(t, withHooks(fake.Hooks{Warm: h.warm}))
	dies := e.deliver(e.mint("dies"))

	e.home.Deliver("hung", []byte(e.mint("hung")))
	<-h.entered
	other := e.deliver(e.mint("other")) // fails today: the lane waits for "hung"
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: other}); r.status != http.StatusOK {
		t.Fatalf("clone of a grant delivered after a hung one: %d %s", r.status, r.body)
	}

	before, _ := e.warm.Counts()
	if !e.warm.DieTemplate(dies) {
		t.Fatal("fake: template of dies was not warm")
	}
	e.eventually("dies warm again while hung still hangs", func() bool {
		warms, _ := e.warm.Counts()
		return warms > before && e.agent.isWarm(dies)
	})
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: dies}); r.status != http.StatusOK {
		t.Fatalf("clone after the zygote came back: %d %s", r.status, r.body)
	}
}

// cloneAsync sends a Clone and returns the channel its reply arrives on.
func (e *env) cloneAsync(req api.CloneRequest) <-chan reply {
	ch := make(chan reply, 1)
	go func() {
		// Not e.cloneReq: t.Fatal must not run off the test's goroutine.
		var r reply
		defer func() { ch <- r }()
		b, _ := json.Marshal(req)
		resp, err := e.unix.Post("http://fiberd/v1/clone", "application/json", bytes.NewReader(b))
		if err != nil {
			r.status = -1
			r.body = []byte(err.Error())
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		r = reply{status: resp.StatusCode, header: resp.Header, body: body}
	}()
	return ch
}

// await returns the reply on ch, stepping the fake clock by step (when
// positive) while it waits, and fails the test when none arrives within
// 10 s of wall time.
func (e *env) await(what string, ch <-chan reply, step time.Duration) reply {
	e.t.Helper()
	for i := 0; i < 1000; i++ {
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Millisecond):
		}
		if step > 0 {
			e.clk.Step(step)
		}
	}
	e.t.Fatalf("%s: no answer within 10 s", what)
	return reply{}
}

// TestCloneAnswersWithinItsDeadline: a Clone of a new grant under a hung
// template answers without waiting for the hung one: served when its own
// template warms, and a miss (503, never a 500) when its own template does
// not warm within the Clone's deadlineMs.
func TestCloneAnswersWithinItsDeadline(t *testing.T) {
	h := newHung(t, "hung", "slow")
	e := newEnv(t, withHooks(fake.Hooks{Warm: h.warm}))
	e.home.Deliver("hung", []byte(e.mint("hung")))
	<-h.entered

	r := e.await("clone of a new grant beside a hung one", e.cloneAsync(api.CloneRequest{Grant: e.mint("fresh"), DeadlineMs: 50}), 0)
	if r.status != http.StatusOK {
		t.Fatalf("clone of a new grant beside a hung one: %d %s, want 200", r.status, r.body)
	}

	r = e.await("clone of a grant whose own template hangs", e.cloneAsync(api.CloneRequest{Grant: e.mint("slow"), DeadlineMs: 50}), 10*time.Millisecond)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("clone whose template does not warm within deadlineMs: %d %s, want 503 DEFERRED_FALLBACK", r.status, r.body)
	}
	if body := r.apiError(t); body.Code != string(core.CodeDeferredFallback) {
		t.Fatalf("miss body %s, want DEFERRED_FALLBACK", r.body)
	}
}

// TestDenyListSurvivesRestart: a grant revoked by its lane is still refused
// by token after fiberd restarts on the same state directory, where the
// lane does not deliver it again.
func TestDenyListSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	tok := e.mint("g1")
	uid := e.deliver(tok)
	e.remove(uid)
	e.eventually("g1 yielded", func() bool { _, ok := e.agent.ledger.Grant(uid); return !ok })
	if r := e.cloneReq(e.unix, api.CloneRequest{Grant: tok}); r.status != http.StatusServiceUnavailable {
		t.Fatalf("clone of a revoked grant: %d %s, want a miss", r.status, r.body)
	}
	e.restart()
	r := e.cloneReq(e.unix, api.CloneRequest{Grant: tok})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.apiError(t).Message, "revoked") {
		t.Fatalf("clone of a revoked grant after a restart: %d %s, want a miss naming the revocation", r.status, r.body)
	}
	if _, ok := e.agent.ledger.Grant(uid); ok {
		t.Fatal("a revoked grant was admitted after a restart")
	}
	// The lane delivering it again lifts the revocation, as before.
	e.deliver(tok)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
		t.Fatalf("clone after redelivery: %d %s", r.status, r.body)
	}
}

// TestRevocationLastsUntilTheLatestLease: a grant removed by its lane whose
// lease outlives Config.DenyFor stays revoked until the lease's end, in the
// ledger and in StateDir/private/denied.json, across a restart after
// DenyFor has passed; once the lease's end passes, its reconcile lifts it.
func TestRevocationLastsUntilTheLatestLease(t *testing.T) {
	e := newEnv(t, withConfig(func(c *Config) { c.DenyFor = time.Minute }))
	tok := e.mint("g1", lease(2*time.Hour))
	uid := e.deliver(tok)
	g, ok := e.agent.ledger.Grant(uid)
	if !ok {
		t.Fatal("g1 not admitted")
	}
	e.remove(uid)
	e.eventually("g1 revoked until its lease's end", func() bool {
		until, ok := e.agent.ledger.DeniedUntil(uid)
		return ok && until.Equal(g.Expiry)
	})
	saved, err := core.NewRevocationFile(filepath.Join(e.stateDir, "private", "denied.json")).Load()
	must(t, err)
	if !saved[uid].Equal(g.Expiry) {
		t.Fatalf("revocations file holds %v for g1, want the lease's end %v", saved[uid], g.Expiry)
	}
	e.clk.Step(time.Hour) // DenyFor passed, the lease has not ended
	e.restart()
	if r := e.cloneReq(e.unix, api.CloneRequest{Grant: tok}); r.status != http.StatusServiceUnavailable {
		t.Fatalf("clone of a revoked grant after DenyFor, before its lease's end: %d %s, want a miss", r.status, r.body)
	}
	e.eventuallyStepping("g1's revocation lifted at its end", time.Minute, func() bool { return !e.agent.ledger.Denied(uid) })
}

// TestRefusedClonesMintNoFence: Clones refused because the grant's template
// is cold consume no sequence number: the first fiber served afterwards is
// seq 1.
func TestRefusedClonesMintNoFence(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	e := newEnv(t, withHooks(fake.Hooks{Warm: func(context.Context, backend.WarmRequest) error {
		if failing.Load() {
			return errTestZygote
		}
		return nil
	}}))
	e.home.Deliver("g1", []byte(e.mint("g1")))
	e.eventually("g1 admitted cold", func() bool { _, ok := e.agent.ledger.Grant("g1"); return ok })
	for i := 0; i < 20; i++ {
		if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"}); r.status != http.StatusServiceUnavailable {
			t.Fatalf("clone of a cold grant: %d %s, want a miss", r.status, r.body)
		}
	}
	failing.Store(false)
	e.eventuallyStepping("g1 warm", time.Second, func() bool { return e.agent.isWarm("g1") })
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"})
	if r.status != http.StatusOK {
		t.Fatalf("clone once warm: %d %s", r.status, r.body)
	}
	if c := r.clone(t); c.Fence.Seq != 1 {
		t.Fatalf("first fiber served after 20 refusals is %s, want seq 1", c.FiberID)
	}
}

// eventuallyStepping is eventually with the fake clock stepped by step
// between polls, for conditions that wait on the agent's timers.
func (e *env) eventuallyStepping(what string, step time.Duration, cond func() bool) {
	e.t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		e.clk.Step(step)
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("timed out waiting for %s", what)
}

// restart stops the agent and starts a new one on the same state
// directory, with a new fake home and fake backends (the old ones were
// closed by the drain).
func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.warm = fake.New(core.TierWarm, fake.Hooks{})
	e.basic = fake.New(core.TierBasic, fake.Hooks{})
	e.home = newTestHome(e.clk)
	e.cfg.Home, e.cfg.Warm, e.cfg.Basic = e.home, e.warm, e.basic
	e.cfg.Registry = nil
	e.start()
}

var errTestZygote = &testError{"zygote crashed during init"}

type testError struct{ s string }

func (e *testError) Error() string { return e.s }

// TestNewEndsWhatACrashLeft: New ends the processes a previous run on the
// same state directory recorded (here a session of two sleeps, as a
// fiber and what it started), before it serves.
func TestNewEndsWhatACrashLeft(t *testing.T) {
	state, err := os.MkdirTemp("", "fd")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start /bin/sh: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	st, err := procrec.ReadStat(cmd.Process.Pid)
	must(t, err)
	for i := 0; i < 500 && len(sessionMembers()[cmd.Process.Pid]) < 3; i++ {
		time.Sleep(10 * time.Millisecond) // sh starts its two sleeps
	}
	recs, err := procrec.Open(filepath.Join(state, "private", "procs"))
	must(t, err)
	_, err = recs.AddProcess(cmd.Process.Pid, st.Start)
	must(t, err)

	newEnv(t, func(e *env) {
		os.RemoveAll(e.stateDir)
		e.stateDir, e.cfg.StateDir = state, state
		tdir := filepath.Join(state, "templates")
		must(t, os.MkdirAll(tdir, 0o755))
		e.cfg.Templates = tdir
		e.zygote = writeTemplate(t, tdir, "counter", `{"command":"/bin/true","zygote":true}`)
	})
	if left := sessionMembers()[cmd.Process.Pid]; len(left) != 0 {
		t.Errorf("session %d of the previous run still has %v after New", cmd.Process.Pid, left)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the recorded process exited by itself, not killed")
	}
}

// TestNewSweepsOnlyCgroupsUnderItsRoot: New sweeps a cgroup its records
// name only when it lies strictly under the home's cgroup root; one beside
// it, or in a directory whose name only begins like the root's, is left
// alone with its record kept. The cgroup root is a directory shaped like a
// cgroup v2 one; the recorded "cgroups" are empty directories, which the
// sweep removes as it would empty cgroups.
func TestNewSweepsOnlyCgroupsUnderItsRoot(t *testing.T) {
	base, err := os.MkdirTemp("", "fd")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	root := filepath.Join(base, "cg")
	must(t, os.Mkdir(root, 0o755))
	for _, f := range []string{"cgroup.procs", "cgroup.controllers", "cgroup.subtree_control"} {
		must(t, os.WriteFile(filepath.Join(root, f), nil, 0o644))
	}
	dirs := map[string]string{
		"g-in":       filepath.Join(root, "g-in"),
		"g-beside":   filepath.Join(base, "other", "g-beside"),
		"g-prefixed": filepath.Join(base, "cg-evil", "g-prefixed"),
	}
	state := filepath.Join(base, "state")
	recs, err := procrec.Open(filepath.Join(state, "private", "procs"))
	must(t, err)
	for name, dir := range dirs {
		must(t, os.MkdirAll(dir, 0o755))
		_, err := recs.AddCgroup(name, dir)
		must(t, err)
	}

	newEnv(t, withHome(func(c *homefake.Config) { c.CgroupRoot = root }), func(e *env) {
		e.stateDir, e.cfg.StateDir = state, state
	})
	for name, dir := range dirs {
		_, err := os.Stat(dir)
		_, rerr := os.Stat(filepath.Join(recs.Path(), "c-"+name))
		if name == "g-in" {
			if !os.IsNotExist(err) || !os.IsNotExist(rerr) {
				t.Errorf("cgroup %s under the root, or its record, survived New (stat: %v, record: %v)", dir, err, rerr)
			}
			continue
		}
		if err != nil || rerr != nil {
			t.Errorf("cgroup %s outside the root %s, or its record, was swept (stat: %v, record: %v)", dir, root, err, rerr)
		}
	}
}
