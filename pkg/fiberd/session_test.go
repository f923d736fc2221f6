package fiberd

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend/fake"
)

// wantSessionRefused checks that r refuses a Clone of a taken session
// (401 UNAUTHENTICATED naming what to send, says in the message) and
// reveals nothing of the session's fiber: none of secrets is in the body.
func wantSessionRefused(t *testing.T, what string, r reply, says string, secrets ...string) {
	t.Helper()
	if r.status != http.StatusUnauthorized {
		t.Errorf("%s: %d %s, want 401", what, r.status, r.body)
		return
	}
	e := r.apiError(t)
	if e.Code != api.CodeUnauthenticated || !strings.Contains(e.Message, says) || !strings.Contains(e.Message, "releaseKey") || !strings.Contains(e.Message, "(grant)") {
		t.Errorf("%s: %s, want UNAUTHENTICATED saying %q and what to send (releaseKey or grant)", what, r.body, says)
	}
	for _, s := range secrets {
		if strings.Contains(string(r.body), s) {
			t.Errorf("%s: the refusal reveals %q: %s", what, s, r.body)
		}
	}
}

// TestSessionAttachNeedsProofOnPlaintext: on the plaintext listener a
// Clone naming another caller's running session without proof, or with a
// key that is not the session's, is refused (401) without the fiber's id,
// endpoint or key, and the fiber runs on unnamed (a pressure park's idle
// clock is not reset); with the session's key, or a token of the grant, it
// attaches as before and answers the same key; on the unix socket no proof
// is needed. A releaseKey without a session is 400.
func TestSessionAttachNeedsProofOnPlaintext(t *testing.T) {
	e := newEnv(t)
	tok := e.mint("g1")
	uid := e.deliver(tok)
	victim := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim"}).clone(t)
	other := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "other"}).clone(t)
	if victim.Kind != api.KindCreate || victim.ReleaseKey == "" || victim.ReleaseKey == other.ReleaseKey {
		t.Fatalf("creates answered %+v and %+v: want a key per session", victim, other)
	}
	secrets := []string{victim.FiberID, victim.Endpoint, victim.ReleaseKey}

	wantSessionRefused(t, "attach without proof", e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim"}), "is taken", secrets...)
	for _, bad := range []struct{ name, key string }{
		{"another session's key", other.ReleaseKey},
		{"a made-up key", base64.RawURLEncoding.EncodeToString(make([]byte, releaseKeyBytes))},
		{"not a key", "!\x1b[2J"},
	} {
		r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim", ReleaseKey: bad.key})
		wantSessionRefused(t, "attach with "+bad.name, r, "does not match", secrets...)
	}
	if r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, ReleaseKey: victim.ReleaseKey}); r.status != http.StatusBadRequest || !strings.Contains(r.apiError(t).Message, "releaseKey without a session") {
		t.Errorf("a releaseKey without a session: %d %s, want 400", r.status, r.body)
	}

	// The refusals left the fiber as it was: running, not named by a Clone.
	f, err := e.agent.ledger.Lookup(victim.Fence)
	if err != nil {
		t.Fatalf("the victim's fiber after the refusals: %v", err)
	}
	if used := f.Handle.(*fiberHandle).used.Load(); used != 0 {
		t.Errorf("a refused Clone named the fiber (used %d): a pressure park would spare it", used)
	}
	if g := e.grantStatus(uid); g.Running != 2 {
		t.Errorf("running %d after the refusals, want 2", g.Running)
	}
	if m := e.metrics(); !strings.Contains(m, `fiberd_clones_total{kind="none",outcome="unauthenticated"} 4`) {
		t.Errorf("metrics lack the 4 refusals:\n%s", grepLines(m, "clones_total"))
	}

	for _, ok := range []struct {
		name string
		c    *http.Client
		req  api.CloneRequest
	}{
		{"plaintext with the session's key", e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim", ReleaseKey: victim.ReleaseKey}},
		{"plaintext with a token of the grant", e.tcp, api.CloneRequest{Grant: tok, Session: "victim"}},
		{"unix socket without proof", e.unix, api.CloneRequest{GrantUID: uid, Session: "victim"}},
		{"unix socket with a wrong key (ignored)", e.unix, api.CloneRequest{GrantUID: uid, Session: "victim", ReleaseKey: other.ReleaseKey}},
	} {
		r := e.cloneReq(ok.c, ok.req)
		if r.status != http.StatusOK {
			t.Errorf("%s: %d %s, want an attach", ok.name, r.status, r.body)
			continue
		}
		if a := r.clone(t); a.Kind != api.KindAttach || a.FiberID != victim.FiberID || a.Endpoint != victim.Endpoint || a.ReleaseKey != victim.ReleaseKey {
			t.Errorf("%s: %+v, want an attach to %s with its key", ok.name, a, victim.FiberID)
		}
	}
	if r := e.post(e.tcp, "/v1/release", api.FiberRequest{FiberID: victim.FiberID, ReleaseKey: victim.ReleaseKey}); r.status != http.StatusOK {
		t.Fatalf("the creator's release: %d %s", r.status, r.body)
	}

	// The name is free again: a Clone creates a new session, with a new
	// key, and the old key does not open it.
	again := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim"}).clone(t)
	if again.Kind != api.KindCreate || again.ReleaseKey == victim.ReleaseKey {
		t.Fatalf("clone of the released session = %+v, want a create with a new key", again)
	}
	wantSessionRefused(t, "attach with the key of the session's previous life",
		e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "victim", ReleaseKey: victim.ReleaseKey}), "does not match", again.FiberID, again.ReleaseKey)
}

// TestParkedSessionResumesByItsCreatorsProof: a session parked keeps its
// release key, so its creator on the plaintext listener resumes it with
// the key it got at creation (the answer carries the same key, and it
// parks, attaches and releases the resumed fiber); anyone else is refused
// (401) and the session stays parked, its image kept and no fence minted.
// A token of the grant resumes it too, and so does the unix socket
// without proof.
func TestParkedSessionResumesByItsCreatorsProof(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}))
	tok := e.mint("g1")
	uid := e.deliver(tok)
	c := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	key := c.ReleaseKey
	if r := e.post(e.tcp, "/v1/park", api.FiberRequest{FiberID: c.FiberID, ReleaseKey: key}); r.status != http.StatusOK {
		t.Fatalf("the creator's park: %d %s", r.status, r.body)
	}

	wantSessionRefused(t, "resume without proof", e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s"}), "is taken", c.FiberID, key)
	wrong := base64.RawURLEncoding.EncodeToString(make([]byte, releaseKeyBytes))
	wantSessionRefused(t, "resume with a wrong key", e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s", ReleaseKey: wrong}), "does not match", c.FiberID, key)
	if g := e.grantStatus(uid); g.Parked != 1 || g.Running != 0 || len(e.images()) != 1 || g.LatestFence == nil || *g.LatestFence != c.Fence {
		t.Fatalf("after the refused resumes: parked %d running %d images %v latest %v; want the session parked as it was, no fence minted", g.Parked, g.Running, e.images(), g.LatestFence)
	}

	r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s", ReleaseKey: key})
	if r.status != http.StatusOK {
		t.Fatalf("the creator's resume: %d %s", r.status, r.body)
	}
	res := r.clone(t)
	if res.Kind != api.KindResume || res.Fence.Seq != c.Fence.Seq+1 || res.ReleaseKey != key {
		t.Fatalf("the creator's resume = %+v, want kind resume, fence seq %d, the session's key", res, c.Fence.Seq+1)
	}
	wantSessionRefused(t, "attach to the resumed fiber without proof", e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s"}), "is taken", res.FiberID, res.Endpoint, key)
	if a := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s", ReleaseKey: key}).clone(t); a.Kind != api.KindAttach || a.FiberID != res.FiberID || a.ReleaseKey != key {
		t.Fatalf("attach with the key = %+v, want the resumed %s", a, res.FiberID)
	}

	// The same key parks the resumed fiber, and a token of the grant
	// resumes it.
	if r := e.post(e.tcp, "/v1/park", api.FiberRequest{FiberID: res.FiberID, ReleaseKey: key}); r.status != http.StatusOK {
		t.Fatalf("park of the resumed fiber with the session's key: %d %s", r.status, r.body)
	}
	byToken := e.cloneReq(e.tcp, api.CloneRequest{Grant: tok, Session: "s"}).clone(t)
	if byToken.Kind != api.KindResume || byToken.ReleaseKey != key {
		t.Fatalf("resume with a token of the grant = %+v, want kind resume and the session's key", byToken)
	}

	// On the unix socket no proof is needed; the answer is the session's key.
	e.parked(byToken.FiberID)
	byUnix := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	if byUnix.Kind != api.KindResume || byUnix.ReleaseKey != key {
		t.Fatalf("resume on the unix socket = %+v, want kind resume and the session's key", byUnix)
	}

	// A parked session's fiber id is released with the session's key.
	e.parked(byUnix.FiberID)
	if r := e.post(e.tcp, "/v1/release", api.FiberRequest{FiberID: byUnix.FiberID, ReleaseKey: key}); r.status != http.StatusOK {
		t.Fatalf("release of the parked session with its key: %d %s", r.status, r.body)
	}
	e.eventually("the released session's image deleted", func() bool { return len(e.images()) == 0 })
	if n := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); n.Kind != api.KindCreate || n.ReleaseKey == key {
		t.Fatalf("clone of the released session = %+v, want a create with a new key", n)
	}
	if got := e.warm.Running(uid); len(got) != 1 {
		t.Fatalf("running %v, want the one new fiber", got)
	}
}
