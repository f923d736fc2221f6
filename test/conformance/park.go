package conformance

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/fiberd"
)

// The park promises: what docs/api.md (POST /v1/release and POST /v1/park,
// and callers who do not authenticate) tells a user of parking, each named
// after the sentence it holds. They run on Backend.Parking, through the
// agent's API as a user calls it.

// parkResume: "A Clone of the session resumes it: a new fiber (kind:
// resume, a new fence; the session's release key, the one its creation
// answered), whose memory is the parked fiber's as it was." A park ends
// the fiber, frees its running slot (a grant at its fibers.max serves
// another session) and keeps its session parked, in the status; a grant
// needing CHECKPOINT is served. After the resume the image is deleted, a
// Clone of the session attaches, and the parked fiber id names nothing.
func parkResume(e *env) {
	t := e.t
	n := max(1, e.b.Warm) // fibers.max; fibers.warm may not be above it
	e.deliverWarm("g1", e.mint("g1", func(g *core.Grant) { g.Fibers.Max, g.MinTier = n, core.TierCheckpoint }))
	a := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1", Payload: []byte("parked")})
	for i := 1; i < n; i++ {
		e.clone(api.CloneRequest{GrantUID: "g1"})
	}
	e.refuse(api.CloneRequest{GrantUID: "g1"}) // at fibers.max
	before := e.b.Remembers(t, e.be, a)
	p := e.park(e.c, api.FiberRequest{FiberID: a.FiberID})
	if p.FiberID != a.FiberID || p.Session != "s1" || p.OwnBytes <= 0 || p.ImageBytes < p.OwnBytes {
		t.Fatalf("park of %s answered %+v: want its id, session s1, 0 < ownBytes <= imageBytes", a.FiberID, p)
	}
	g, _ := e.grant("g1")
	if g.Tier != core.TierCheckpoint || g.Running != n-1 || g.Parked != 1 || g.ParkedBytes != p.ImageBytes || len(g.ParkedSessions) != 1 || g.ParkedSessions[0].Session != "s1" {
		t.Fatalf("status after the park: %+v; want tier CHECKPOINT, %d running, s1 parked", g, n-1)
	}
	if e.b.Running(t, e.be, a) {
		t.Fatalf("the parked fiber %s still runs", a.FiberID)
	}
	if n := len(e.images()); n != 1 {
		t.Fatalf("%d images on disk after the park, want 1", n)
	}
	o := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s2", Payload: []byte("other")})
	if e.b.Remembers(t, e.be, o) == before {
		t.Fatalf("a new fiber remembers what the parked one did (%q): the comparison below would prove nothing", before)
	}
	must(t, e.c.Release(e.ctx(), o.FiberID))

	r := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1", Payload: []byte("ignored")})
	if c, ok := r.Fence.Compare(a.Fence); r.Kind != api.KindResume || !ok || c <= 0 || r.Fence.Epoch != a.Fence.Epoch || r.ReleaseKey != a.ReleaseKey {
		t.Fatalf("clone of the parked session = %+v (parked %+v): want kind resume, a newer fence of its epoch, its release key", r, a)
	}
	if got := e.b.Remembers(t, e.be, r); got != before {
		t.Fatalf("the resumed fiber remembers %q, the parked one %q: its memory is not as it was", got, before)
	}
	e.eventually("the spent image deleted", func() bool { return len(e.images()) == 0 })
	if g, _ := e.grant("g1"); g.Running != n || g.Parked != 0 {
		t.Fatalf("status after the resume: running %d parked %d, want %d and 0", g.Running, g.Parked, n)
	}
	if at := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1"}); at.Kind != api.KindAttach || at.Fence != r.Fence || at.ReleaseKey != a.ReleaseKey {
		t.Fatalf("clone after the resume = %+v, want an attach to %s", at, r.FiberID)
	}
	if err := e.c.Release(e.ctx(), a.FiberID); !isCode(err, http.StatusNotFound) {
		t.Fatalf("release of the resumed session's parked id: %v, want 404", err)
	}
}

// parkedSessionKey: "A Clone of a session that has a fiber, running (an
// attach) or parked (a resume), must name the session's key
// ("releaseKey") or carry a token of its grant ("grant"); without either,
// or with a key that is not the session's, it is 401 UNAUTHENTICATED ...
// and the session's fiber is left as it was (... or parked, no fence
// minted)." On the plaintext listener a park needs the fiber's key too
// (rule 3; the fiber runs on); the key or a token of the grant resumes.
func parkedSessionKey(e *env) {
	t := e.t
	tok := e.mint("g1")
	e.deliverWarm("g1", tok)
	a := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s1"})
	other := e.clone(api.CloneRequest{GrantUID: "g1", Session: "s2"})
	for what, req := range map[string]api.FiberRequest{
		"without proof":        {FiberID: a.FiberID},
		"with another's key":   {FiberID: a.FiberID, ReleaseKey: other.ReleaseKey},
		"with a malformed key": {FiberID: a.FiberID, ReleaseKey: "not-a-key"},
	} {
		if _, err := e.tcp.ParkFiber(e.ctx(), req); !isCode(err, http.StatusUnauthorized) {
			t.Errorf("plaintext park %s: %v, want 401", what, err)
		}
	}
	if !e.b.Running(t, e.be, a) {
		t.Fatalf("fiber %s does not run on after the refused parks", a.FiberID)
	}
	e.park(e.tcp, api.FiberRequest{FiberID: a.FiberID, ReleaseKey: a.ReleaseKey})
	for what, req := range map[string]api.CloneRequest{
		"without proof":      {GrantUID: "g1", Session: "s1"},
		"with another's key": {GrantUID: "g1", Session: "s1", ReleaseKey: other.ReleaseKey},
	} {
		r, err := e.tcp.Clone(e.ctx(), req)
		if !isCode(err, http.StatusUnauthorized) {
			t.Fatalf("plaintext clone of the parked session %s = %+v, %v; want 401", what, r, err)
		}
	}
	if g, _ := e.grant("g1"); g.Parked != 1 || g.Running != 1 {
		t.Fatalf("after the refused clones: parked %d running %d, want the session still parked", g.Parked, g.Running)
	}
	r, err := e.tcp.Clone(e.ctx(), api.CloneRequest{GrantUID: "g1", Session: "s1", ReleaseKey: a.ReleaseKey})
	must(t, err)
	if r.Kind != api.KindResume || r.Fence.Seq != other.Fence.Seq+1 || r.ReleaseKey != a.ReleaseKey {
		t.Fatalf("plaintext clone with the key = %+v, want a resume at seq %d (the refusals minted no fence) with the session's key", r, other.Fence.Seq+1)
	}
	e.park(e.tcp, api.FiberRequest{FiberID: r.FiberID, Grant: string(tok)})
	r, err = e.tcp.Clone(e.ctx(), api.CloneRequest{Grant: string(tok), Session: "s1"})
	must(t, err)
	if r.Kind != api.KindResume || r.ReleaseKey != a.ReleaseKey {
		t.Fatalf("plaintext clone with a token of the grant = %+v, want a resume with the session's key", r)
	}
}

// imageLifetime: "An image lives as long as its session can come back: it
// is deleted when the session resumes, when its parked fiber id is
// released, when the grant ends (revoked, ...) and when the epoch moves (a
// lost scope, a restart)." A parked session survives its template's
// zygote dying ("the template is not warm": the image is kept for the next
// Clone); once its image is deleted, a Clone of the session starts it
// afresh.
func imageLifetime(e *env) {
	t := e.t
	e.deliverWarm("g1", e.mint("g1"))
	if e.b.KillZygote != nil {
		a := e.parkSession("s1")
		e.b.KillZygote(t, e.be, "g1")
		var r api.CloneResponse
		e.eventually("a Clone of s1 served after its zygote died", func() bool {
			var err error
			r, err = e.c.Clone(e.ctx(), api.CloneRequest{GrantUID: "g1", Session: "s1"})
			return err == nil
		})
		if r.Kind != api.KindResume || r.ReleaseKey != a.ReleaseKey {
			t.Fatalf("clone of s1 after its zygote died = %+v, want a resume", r)
		}
		must(t, e.c.Release(e.ctx(), r.FiberID))
	}
	a := e.parkSession("s2")
	must(t, e.c.Release(e.ctx(), a.FiberID))
	e.gone("s2", "the release of its parked fiber id")

	e.parkSession("s3")
	e.ctl.Remove(t, "g1")
	e.eventually("g1 yielded", func() bool { _, ok := e.grant("g1"); return !ok })
	e.eventually("the image deleted after the grant's revocation", func() bool { return len(e.images()) == 0 })
	e.deliverWarm("g1", e.mint("g1", func(g *core.Grant) { g.IssuedAt = g.IssuedAt.Add(time.Second) }))
	e.gone("s3", "the grant's revocation")

	e.parkSession("s4")
	e.restart()
	e.deliverWarm("g1", e.mint("g1", func(g *core.Grant) { g.IssuedAt = g.IssuedAt.Add(2 * time.Second) }))
	e.gone("s4", "a restart")

	if !fiberd.TestHooks {
		t.Log("an image at a run-time epoch bump not checked: it needs the admin socket's POST /scope-lost of a testhooks build (go test -tags testhooks)")
		return
	}
	e.parkSession("s5")
	adminPost(t, e.agent.AdminSocketPath(), "/scope-lost")
	e.gone("s5", "POST /scope-lost")
}

// ----------------------------------------------------------------- helpers

// park parks the fiber req names through c and fails the test unless it
// is parked.
func (e *env) park(c *client.Client, req api.FiberRequest) api.ParkResponse {
	e.t.Helper()
	p, err := c.ParkFiber(e.ctx(), req)
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) {
			e.t.Fatalf("park of %s: %d %s %s", req.FiberID, ce.Status, ce.Body.Code, ce.Body.Message)
		}
		e.t.Fatalf("park of %s: %v", req.FiberID, err)
	}
	return p
}

// parkSession clones session s of grant g1 and parks its fiber.
func (e *env) parkSession(s string) api.CloneResponse {
	e.t.Helper()
	f := e.clone(api.CloneRequest{GrantUID: "g1", Session: s})
	e.park(e.c, api.FiberRequest{FiberID: f.FiberID})
	if g, _ := e.grant("g1"); g.Parked != 1 {
		e.t.Fatalf("session %s parked, the status says %d parked", s, g.Parked)
	}
	return f
}

// gone checks that session s of grant g1, parked, was deleted by what:
// no image is left, the status shows none parked, and a Clone of the
// session creates a fiber.
func (e *env) gone(s, what string) {
	e.t.Helper()
	e.eventually("the image deleted after "+what, func() bool { return len(e.images()) == 0 })
	if g, _ := e.grant("g1"); g.Parked != 0 {
		e.t.Fatalf("after %s the status shows %d parked", what, g.Parked)
	}
	if r := e.clone(api.CloneRequest{GrantUID: "g1", Session: s}); r.Kind != api.KindCreate {
		e.t.Fatalf("clone of session %s after %s = %+v, want a create", s, what, r)
	}
}

// images lists the parked images on disk: the agent keeps them in
// StateDir/private/parked/<grant>/ (pkg/fiberd, park.go).
func (e *env) images() []string {
	dirs, _ := filepath.Glob(filepath.Join(e.state, "private", "parked", "*", "*"))
	var out []string
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	return out
}
