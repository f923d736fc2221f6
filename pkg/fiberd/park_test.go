package fiberd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
)

// fakeImageBytes is the size of the fake backend's images in these tests.
const fakeImageBytes = 1 << 20

// withCheckpoint gives the fake WARM backend a CHECKPOINT tier, before
// New asks it.
func withCheckpoint(hooks fake.Hooks) envOption {
	return func(e *env) {
		_ = e.warm.Close()
		e.warm = fake.New(core.TierWarm, hooks)
		e.warm.EnableCheckpoint(fakeImageBytes)
	}
}

// parkReq parks fiber id over the unix socket.
func (e *env) parkReq(id string) reply {
	e.t.Helper()
	return e.post(e.unix, "/v1/park", api.FiberRequest{FiberID: id})
}

func (e *env) parked(id string) api.ParkResponse {
	e.t.Helper()
	r := e.parkReq(id)
	if r.status != http.StatusOK {
		e.t.Fatalf("park %s: %d %s", id, r.status, r.body)
	}
	var p api.ParkResponse
	must(e.t, json.Unmarshal(r.body, &p))
	return p
}

// grantStatus is uid's status.
func (e *env) grantStatus(uid string) api.GrantStatus {
	e.t.Helper()
	for _, g := range e.status().Grants {
		if g.UID == uid {
			return g
		}
	}
	e.t.Fatalf("grant %s not in the status", uid)
	return api.GrantStatus{}
}

// images lists the image directories left under the state directory.
func (e *env) images() []string {
	var out []string
	root := filepath.Join(e.stateDir, "private", "parked")
	grants, _ := os.ReadDir(root)
	for _, g := range grants {
		ims, _ := os.ReadDir(filepath.Join(root, g.Name()))
		for _, im := range ims {
			out = append(out, filepath.Join(g.Name(), im.Name()))
		}
	}
	return out
}

func (e *env) metrics() string {
	e.t.Helper()
	return string(e.do(e.unix, http.MethodGet, "/metrics", nil).body)
}

// TestParkWithoutCheckpointTier: without a working CHECKPOINT tier a park
// is 412 naming what is missing (the fiber runs on), the status says the
// tier is absent and why, and a grant that needs CHECKPOINT is a tier gap.
func TestParkWithoutCheckpointTier(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	r := e.parkReq(c.FiberID)
	if r.status != http.StatusPreconditionFailed || r.apiError(t).Code != api.CodeTierGap || !strings.Contains(r.apiError(t).Message, "fake backend without EnableCheckpoint") {
		t.Fatalf("park without the tier: %d %s, want 412 TIER_GAP naming what is missing", r.status, r.body)
	}
	if got := e.warm.Running(uid); len(got) != 1 {
		t.Fatalf("the fiber a refused park left: %v", got)
	}
	st := e.status()
	if st.Checkpoint.Available || !strings.Contains(st.Checkpoint.Reason, "EnableCheckpoint") {
		t.Errorf("status checkpoint %+v, want absent with the reason", st.Checkpoint)
	}
	if g := e.grantStatus(uid); g.Tier != core.TierWarm {
		t.Errorf("grant tier %s, want WARM", g.Tier)
	}
	r = e.cloneReq(e.tcp, api.CloneRequest{Grant: e.mint("g2", tier(core.TierCheckpoint))})
	if r.status != http.StatusPreconditionFailed || !strings.Contains(r.apiError(t).Message, "CHECKPOINT") || !strings.Contains(r.apiError(t).Message, "EnableCheckpoint") {
		t.Fatalf("clone of a grant needing CHECKPOINT: %d %s, want 412 saying what is missing", r.status, r.body)
	}
	if m := e.metrics(); !strings.Contains(m, "fiberd_checkpoint_available 0") {
		t.Errorf("metrics lack fiberd_checkpoint_available 0")
	}
}

// TestParkIsolatedGrant: a grant isolated at "grant" shares its zygote's
// PID namespace, so it is served at WARM even where parking works: a park
// of its fiber is 412 naming why and the way out, and runs nothing (the
// fiber runs on, no image); a grant that needs CHECKPOINT is a tier gap.
// At "fiber" the same holds where the backend cannot park isolated fibers
// (a CRIU without fiberd's patches), and the status says why; where it
// can, the grant is served at CHECKPOINT, and its fiber parks and resumes.
func TestParkIsolatedGrant(t *testing.T) {
	refuse := func(backend.Isolation) error {
		return fmt.Errorf("the CRIU lacks fiberd's patches: %w", core.ErrTierGap)
	}
	for _, tt := range []struct {
		name  string
		level backend.Isolation
		hook  func(backend.Isolation) error
		why   string // in the 412's message; "" when the fiber parks
	}{
		{"grant", backend.IsolationGrant, nil, "PID namespace"},
		{"fiber unpatched", backend.IsolationFiber, refuse, "lacks fiberd's patches"},
		{"fiber", backend.IsolationFiber, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			parks := 0
			hooks := fake.Hooks{Park: func(context.Context, backend.ParkRequest) error { parks++; return nil }, CheckpointIsolated: tt.hook}
			e := newEnv(t, withCheckpoint(hooks), withIsolation(backend.IsolationSupport{Level: tt.level}, backend.IsolationSupport{Level: backend.IsolationNone}))
			uid := e.deliver(e.mint("g1"))
			c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
			st := e.status()
			if !st.Checkpoint.Available {
				t.Fatalf("parking is off: %+v", st.Checkpoint)
			}
			if tt.why == "" {
				if g := e.grantStatus(uid); g.Tier != core.TierCheckpoint || st.Checkpoint.Isolated != "" {
					t.Fatalf("isolated grant: tier %s, status %+v; want CHECKPOINT, nothing missing", g.Tier, st.Checkpoint)
				}
				if p := e.parked(c.FiberID); p.FiberID != c.FiberID || parks != 1 {
					t.Fatalf("park answered %+v after %d parks", p, parks)
				}
				if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); r.Kind != api.KindResume {
					t.Fatalf("a clone of the parked session: kind %s, want resume", r.Kind)
				}
				return
			}
			if g := e.grantStatus(uid); g.Tier != core.TierWarm || g.Isolation != string(tt.level) {
				t.Errorf("isolated grant: tier %s, isolation %q; want WARM, %s", g.Tier, g.Isolation, tt.level)
			}
			if tt.level == backend.IsolationFiber && !strings.Contains(st.Checkpoint.Isolated, tt.why) {
				t.Errorf("status checkpoint %+v: Isolated does not say %q", st.Checkpoint, tt.why)
			}
			r := e.parkReq(c.FiberID)
			if r.status != http.StatusPreconditionFailed || r.apiError(t).Code != api.CodeTierGap || !strings.Contains(r.apiError(t).Message, tt.why) || !strings.Contains(r.apiError(t).Message, "-isolation none") {
				t.Fatalf("park of an isolated fiber: %d %s, want 412 TIER_GAP saying %q and -isolation none", r.status, r.body, tt.why)
			}
			if got := e.warm.Running(uid); len(got) != 1 || parks != 0 || len(e.images()) != 0 {
				t.Fatalf("a refused park left running %v, %d parks, images %v", got, parks, e.images())
			}
			r = e.cloneReq(e.tcp, api.CloneRequest{Grant: e.mint("g2", tier(core.TierCheckpoint))})
			if r.status != http.StatusPreconditionFailed || !strings.Contains(r.apiError(t).Message, "CHECKPOINT") || !strings.Contains(r.apiError(t).Message, tt.why) {
				t.Fatalf("clone of an isolated grant needing CHECKPOINT: %d %s, want 412", r.status, r.body)
			}
		})
	}
}

// TestParkAndResume: a park ends the fiber, frees its running slot and
// keeps its session parked (status, metrics, the image on disk); a Clone of
// the session resumes it as a new fiber (kind resume, a new fence, its
// unix endpoint a new socket), and the image is deleted; a further Clone
// attaches. A grant needing CHECKPOINT is served, at tier CHECKPOINT.
func TestParkAndResume(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}))
	uid := e.deliver(e.mint("g1", maxFibers(1), tier(core.TierCheckpoint)))
	if g := e.grantStatus(uid); g.Tier != core.TierCheckpoint {
		t.Fatalf("grant tier %s, want CHECKPOINT", g.Tier)
	}
	if st := e.status(); !st.Checkpoint.Available || st.Checkpoint.Reason != "" {
		t.Fatalf("status checkpoint %+v, want available", st.Checkpoint)
	}
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "alice"}).clone(t)
	p := e.parked(c.FiberID)
	if p.FiberID != c.FiberID || p.Session != "alice" || p.ImageBytes != fakeImageBytes || p.OwnBytes <= 0 {
		t.Fatalf("park answered %+v", p)
	}
	g := e.grantStatus(uid)
	if g.Running != 0 || g.Parked != 1 || g.ParkedBytes != fakeImageBytes || len(g.ParkedSessions) != 1 {
		t.Fatalf("status after the park: %+v", g)
	}
	if ps := g.ParkedSessions[0]; ps.Session != "alice" || ps.FiberID != c.FiberID || ps.By != "api" || ps.ParkedAt.IsZero() {
		t.Fatalf("parked session %+v", ps)
	}
	if imgs := e.images(); len(imgs) != 1 {
		t.Fatalf("images on disk: %v, want 1", imgs)
	}
	m := e.metrics()
	for _, want := range []string{`fiberd_parked_sessions{grant="g1"} 1`, `fiberd_parks_total{by="api",outcome="parked"} 1`, "fiberd_checkpoint_available 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The running slot is free: fibers.max 1 serves another session.
	other := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "bob"})
	if other.status != http.StatusOK {
		t.Fatalf("clone beside a parked session at fibers.max 1: %d %s", other.status, other.body)
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: other.clone(t).FiberID}); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}

	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "alice"})
	if r.status != http.StatusOK {
		t.Fatalf("clone of the parked session: %d %s", r.status, r.body)
	}
	res := r.clone(t)
	if res.Kind != api.KindResume || res.Fence.Seq <= c.Fence.Seq || res.Fence.Epoch != c.Fence.Epoch || res.Endpoint == c.Endpoint || !strings.HasPrefix(res.Endpoint, "unix://") {
		t.Fatalf("resume = %+v (parked %+v): want kind resume, a newer fence, a new unix endpoint", res, c)
	}
	if got := e.warm.Running(uid); len(got) != 1 || got[0] != res.Fence {
		t.Fatalf("backend runs %v, want the resumed %s", got, res.Fence)
	}
	if _, path, _ := endpoint.Parse(res.Endpoint); !isSocket(path) {
		t.Errorf("the resumed fiber's endpoint %s is no socket", res.Endpoint)
	}
	e.eventually("the spent image deleted and counted", func() bool {
		return len(e.images()) == 0 && strings.Contains(e.metrics(), `fiberd_parked_images_deleted_total{reason="resumed"} 1`)
	})
	if g := e.grantStatus(uid); g.Running != 1 || g.Parked != 0 {
		t.Fatalf("status after the resume: running %d parked %d", g.Running, g.Parked)
	}
	if a := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "alice"}).clone(t); a.Kind != api.KindAttach || a.Fence != res.Fence {
		t.Fatalf("clone after the resume = %+v, want an attach to %s", a, res.Fence)
	}
	if m := e.metrics(); !strings.Contains(m, `fiberd_clones_total{kind="resume",outcome="served"} 1`) {
		t.Errorf("metrics lack the resume:\n%s", grepLines(m, "resume"))
	}
	// The parked fiber id names nothing now.
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != http.StatusNotFound {
		t.Errorf("release of the resumed session's parked id: %d, want 404", r.status)
	}
}

func isSocket(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeSocket != 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestParkTCPKeepsItsAddress: a fiber on TCP is resumed at the address it
// had, its port held while it is parked and freed with its image.
func TestParkTCPKeepsItsAddress(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}), withConfig(func(c *Config) {
		c.EndpointFamily = endpoint.Inet4
		c.PortRange = endpoint.PortRange{First: 23100, Last: 23199}
	}))
	uid := e.deliver(e.mint("g1"))
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	e.parked(c.FiberID)
	if held := e.agent.ports.Held(); held != 1 {
		t.Fatalf("ports held while parked: %d, want 1", held)
	}
	// Another fiber gets another port.
	o := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}).clone(t)
	if o.Endpoint == c.Endpoint {
		t.Fatalf("a new fiber got the parked fiber's address %s", c.Endpoint)
	}
	res := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	if res.Kind != api.KindResume || res.Endpoint != c.Endpoint {
		t.Fatalf("resume = %+v, want kind resume at %s", res, c.Endpoint)
	}
	e.parked(res.FiberID)
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: res.FiberID}); r.status != http.StatusOK {
		t.Fatalf("release of the parked session: %d %s", r.status, r.body)
	}
	if held := e.agent.ports.Held(); held != 1 {
		t.Fatalf("ports held after the parked session's release: %d, want 1 (the other fiber's)", held)
	}
}

// TestParkRefusals: a fiber without a session, an unauthenticated caller
// without proof, a grant at its bounds in count or bytes, a busy fiber, a
// full disk and a failed dump are refused with the matching code, and the
// fiber runs on.
func TestParkRefusals(t *testing.T) {
	var parkErr atomic.Pointer[error]
	hooks := fake.Hooks{Park: func(ctx context.Context, req backend.ParkRequest) error {
		if p := parkErr.Load(); p != nil {
			return *p
		}
		return nil
	}}
	e := newEnv(t, withCheckpoint(hooks), withConfig(func(c *Config) { c.Park.MaxImages = 1 }))
	uid := e.deliver(e.mint("g1"))
	running := func(fence core.Fence) bool {
		for _, f := range e.warm.Running(uid) {
			if f == fence {
				return true
			}
		}
		return false
	}
	check := func(what string, r reply, status int, code, says string, fence core.Fence) {
		t.Helper()
		if r.status != status || r.apiError(t).Code != code || !strings.Contains(r.apiError(t).Message, says) {
			t.Errorf("%s: %d %s, want %d %s saying %q", what, r.status, r.body, status, code, says)
		}
		if !running(fence) {
			t.Errorf("%s: the fiber does not run on", what)
		}
	}
	noSession := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}).clone(t)
	check("no session", e.parkReq(noSession.FiberID), 400, api.CodeInvalid, "has no session", noSession.Fence)

	f := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s1"}).clone(t)
	check("plaintext without proof", e.post(e.tcp, "/v1/park", api.FiberRequest{FiberID: f.FiberID}), 401, api.CodeUnauthenticated, "releaseKey", f.Fence)
	check("plaintext with another's key", e.post(e.tcp, "/v1/park", api.FiberRequest{FiberID: f.FiberID, ReleaseKey: noSession.ReleaseKey}), 401, api.CodeUnauthenticated, "does not match", f.Fence)

	for _, c := range []struct {
		name   string
		err    error
		status int
		code   string
		says   string
	}{
		{"disk full", fmt.Errorf("criu dump failed: the image's filesystem is full: %w", backend.ErrNoSpace), 507, api.CodeInsufficientStorage, "filesystem is full"},
		{"unix connection", fmt.Errorf("a connection to its unix listener is open: %w", backend.ErrBusy), 409, api.CodeBusy, "connection"},
		{"dump failed", errors.New("criu dump failed (exit status 1): Can't dump"), 500, api.CodeInternal, "Can't dump"},
	} {
		parkErr.Store(&c.err)
		check(c.name, e.parkReq(f.FiberID), c.status, c.code, c.says, f.Fence)
	}
	parkErr.Store(nil)
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("failed parks left images: %v", imgs)
	}

	// With the release key over plaintext TCP it is parked.
	if r := e.post(e.tcp, "/v1/park", api.FiberRequest{FiberID: f.FiberID, ReleaseKey: f.ReleaseKey}); r.status != 200 {
		t.Fatalf("park with the release key: %d %s", r.status, r.body)
	}
	g := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s2"}).clone(t)
	check("over max images", e.parkReq(g.FiberID), 507, api.CodeInsufficientStorage, "-park-max-images 1", g.Fence)
	if m := e.metrics(); !strings.Contains(m, `fiberd_parks_total{by="api",outcome="refused"}`) || !strings.Contains(m, `fiberd_parks_total{by="api",outcome="failed"} 2`) {
		t.Errorf("metrics lack the refused and failed parks:\n%s", grepLines(m, "parks_total"))
	}
	if r := e.parkReq(core.Fence{GrantUID: uid, Epoch: f.Fence.Epoch, Seq: 99}.String()); r.status != 404 {
		t.Errorf("park of an unknown fiber: %d, want 404", r.status)
	}
}

// TestParkBytesBound: a fiber larger than the room its grant has left for
// images is refused before it is dumped (507); the room counts the images
// already parked.
func TestParkBytesBound(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}), withConfig(func(c *Config) { c.Park.MaxBytes = fakeImageBytes + fakeImageBytes/2 }))
	uid := e.deliver(e.mint("g1"))
	a := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "a"}).clone(t)
	b := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "b"}).clone(t)
	e.parked(a.FiberID)
	r := e.parkReq(b.FiberID)
	if r.status != http.StatusInsufficientStorage || !strings.Contains(r.apiError(t).Message, "room left") {
		t.Fatalf("park past the bytes bound: %d %s, want 507 saying so", r.status, r.body)
	}
	if got := e.warm.Running(uid); len(got) != 1 || got[0] != b.Fence {
		t.Fatalf("running after the refusal: %v, want %s", got, b.Fence)
	}
}

// TestParkedSessionLifecycle: parked images are deleted when the parked
// fiber id is released (a Clone of the session then starts afresh), when
// the grant ends (revoked, lease over), and when the epoch moves.
func TestParkedSessionLifecycle(t *testing.T) {
	setup := func(t *testing.T, opts ...grantOpt) (*env, string, api.CloneResponse) {
		e := newEnv(t, withCheckpoint(fake.Hooks{}))
		uid := e.deliver(e.mint("g1", opts...))
		c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
		e.parked(c.FiberID)
		if len(e.images()) != 1 {
			t.Fatal("no image after the park")
		}
		return e, uid, c
	}
	gone := func(e *env, what string) {
		e.t.Helper()
		e.eventually("the image deleted after "+what, func() bool { return len(e.images()) == 0 })
	}
	t.Run("release", func(t *testing.T) {
		e, uid, c := setup(t)
		// Over plaintext TCP the parked fiber's release key is the proof.
		if r := e.post(e.tcp, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 401 {
			t.Fatalf("release of a parked session without proof: %d, want 401", r.status)
		}
		if r := e.post(e.tcp, "/v1/release", api.FiberRequest{FiberID: c.FiberID, ReleaseKey: c.ReleaseKey}); r.status != 200 {
			t.Fatalf("release of the parked session: %d %s", r.status, r.body)
		}
		gone(e, "its release")
		if g := e.grantStatus(uid); g.Parked != 0 {
			t.Fatalf("parked %d after the release", g.Parked)
		}
		if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 404 {
			t.Fatalf("second release: %d, want 404", r.status)
		}
		if n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); n.Kind != api.KindCreate {
			t.Fatalf("clone of the released session = %+v, want a create", n)
		}
	})
	t.Run("revoked", func(t *testing.T) {
		e, uid, _ := setup(t)
		e.remove(uid)
		gone(e, "the grant's revocation")
	})
	t.Run("lease end", func(t *testing.T) {
		e, _, _ := setup(t, lease(time.Minute))
		e.clk.Step(2 * time.Minute)
		gone(e, "the lease's end")
	})
	t.Run("epoch", func(t *testing.T) {
		e, uid, c := setup(t)
		e.loseScope("test")
		gone(e, "the epoch bump")
		if g := e.grantStatus(uid); g.Parked != 0 {
			t.Fatalf("parked %d after the epoch bump", g.Parked)
		}
		if n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); n.Kind != api.KindCreate || n.Fence.Epoch == c.Fence.Epoch {
			t.Fatalf("clone of the session after the epoch bump = %+v, want a create in the new epoch", n)
		}
	})
	t.Run("restart", func(t *testing.T) {
		e, _, _ := setup(t)
		e.stop()
		if imgs := e.images(); len(imgs) != 0 {
			t.Fatalf("images after the agent stopped: %v", imgs)
		}
	})
}

// TestResumeFailures: a resume that fails is a miss. An image that can
// never be resumed is deleted (the next Clone of the session starts
// afresh); any other failure keeps it, and the next Clone resumes it.
func TestResumeFailures(t *testing.T) {
	var resumeErr atomic.Pointer[error]
	hooks := fake.Hooks{Resume: func(ctx context.Context, req backend.ResumeRequest) error {
		if p := resumeErr.Load(); p != nil {
			return *p
		}
		return nil
	}}
	e := newEnv(t, withCheckpoint(hooks))
	uid := e.deliver(e.mint("g1"))
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	e.parked(c.FiberID)

	transient := errors.New("criu restore failed: pid 4242 is taken")
	resumeErr.Store(&transient)
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"})
	if r.status != http.StatusServiceUnavailable || r.apiError(t).Code != string(core.CodeDeferredFallback) || !strings.Contains(r.apiError(t).Message, "pid 4242") {
		t.Fatalf("clone whose resume failed: %d %s, want 503 DEFERRED_FALLBACK saying why", r.status, r.body)
	}
	if g := e.grantStatus(uid); g.Parked != 1 || g.Running != 0 || len(e.images()) != 1 {
		t.Fatalf("after a failed resume: parked %d running %d images %v, want the image kept", g.Parked, g.Running, e.images())
	}
	resumeErr.Store(nil)
	if n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); n.Kind != api.KindResume {
		t.Fatalf("clone after the transient failure = %+v, want a resume", n)
	}

	d := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "t"}).clone(t)
	e.parked(d.FiberID)
	unusable := fmt.Errorf("image of template x: %w", backend.ErrImageUnusable)
	resumeErr.Store(&unusable)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "t"}); r.status != http.StatusServiceUnavailable || !strings.Contains(r.apiError(t).Message, "deleted") {
		t.Fatalf("clone whose image is unusable: %d %s, want a miss saying the image is deleted", r.status, r.body)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("an unusable image was kept: %v", imgs)
	}
	resumeErr.Store(nil)
	if n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "t"}).clone(t); n.Kind != api.KindCreate {
		t.Fatalf("clone after the unusable image = %+v, want a create", n)
	}
	if g := e.grantStatus(uid); g.Running != 2 {
		t.Fatalf("running %d, want 2 (no slot leaked by the failed resumes)", g.Running)
	}
}

// TestResumeAfterTemplateChange: a grant whose template changed is
// yielded and admitted again, and its images, of the old template, are
// deleted then.
func TestResumeAfterTemplateChange(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}))
	uid := e.deliver(e.mint("g1"))
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t)
	e.parked(c.FiberID)
	other := writeTemplate(t, e.cfg.Templates, "other", `{"command":"/bin/false","zygote":true}`)
	tok := e.mint("g1", templ(other), issuedAt(e.clk.Now().Add(time.Second)))
	e.clk.Step(2 * time.Second)
	e.home.Deliver(uid, []byte(tok))
	e.eventually("the image of the old template deleted", func() bool { return len(e.images()) == 0 })
	e.eventually("the new template warm", func() bool {
		for _, g := range e.status().Grants {
			if g.UID == uid && g.Warm && g.Template == other {
				return true
			}
		}
		return false
	})
	if n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}).clone(t); n.Kind != api.KindCreate {
		t.Fatalf("clone after the template changed = %+v, want a create", n)
	}
}

// TestParkedStatusRedacted: an unauthenticated caller sees the count of
// parked sessions, not their names or fiber ids.
func TestParkedStatusRedacted(t *testing.T) {
	e := newEnv(t, withCheckpoint(fake.Hooks{}))
	uid := e.deliver(e.mint("g1"))
	c := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "secret-session"}).clone(t)
	e.parked(c.FiberID)
	r := e.do(e.tcp, http.MethodGet, "/v1/status", nil)
	if strings.Contains(string(r.body), "secret-session") || strings.Contains(string(r.body), c.FiberID) {
		t.Fatalf("the plaintext status shows a parked session: %s", r.body)
	}
	var st api.Status
	must(t, json.Unmarshal(r.body, &st))
	if len(st.Grants) != 1 || st.Grants[0].Parked != 1 {
		t.Fatalf("the plaintext status lacks the parked count: %s", r.body)
	}
}

// TestPressurePark: with Park.Pressure a Clone its grant's memory pressure
// would shed parks the grant's largest idle fiber with a session instead,
// once per pressure reading, and is served; a fiber a Clone named lately,
// one without a session and the Clone's own session are left alone.
// Without the flag the Clone is shed.
func TestPressurePark(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("pressure-park=%v", on), func(t *testing.T) {
			var high atomic.Bool
			reader := func(uid string, cg *cgroup.Grant) (cgroup.Pressure, bool, error) {
				p := cgroup.Pressure{HasMemory: true, Memory: 10}
				if high.Load() {
					p.Memory = 90
				}
				return p, true, nil
			}
			// The fake backend's pids count from 10001 in clone order.
			sizes := map[int]int64{10001: 10 << 20, 10002: 30 << 20, 10003: 20 << 20, 10004: 100 << 20, 10005: 50 << 20}
			e := newEnv(t, withCheckpoint(fake.Hooks{}), withConfig(func(c *Config) {
				c.PressureThreshold = 50
				c.Park.Pressure = on
				c.Park.IdleAfter = time.Minute
			}), func(e *env) {
				e.pressure = reader
				e.parkSize = func(h *fiberHandle) (int64, error) { return sizes[h.pid], nil }
			})
			uid := e.deliver(e.mint("g1", maxFibers(8)))
			ids := map[string]api.CloneResponse{}
			for _, s := range []string{"a", "b", "c", "", "recent"} {
				ids[s] = e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: s}).clone(t)
			}
			e.clk.Step(2 * time.Minute)
			if a := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "recent"}).clone(t); a.Kind != api.KindAttach {
				t.Fatalf("attach to recent: %+v", a)
			}
			high.Store(true)
			e.clk.Step(2 * time.Second) // past the low reading, kept for a second
			r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "new"})
			if !on {
				if r.status != http.StatusTooManyRequests {
					t.Fatalf("clone under pressure without pressure parks: %d %s, want 429 SHED", r.status, r.body)
				}
				if g := e.grantStatus(uid); g.Parked != 0 {
					t.Fatalf("a fiber was parked without -pressure-park: %+v", g.ParkedSessions)
				}
				return
			}
			if r.status != http.StatusOK {
				t.Fatalf("clone under pressure: %d %s, want it served after a pressure park", r.status, r.body)
			}
			g := e.grantStatus(uid)
			if g.Parked != 1 || g.ParkedSessions[0].Session != "b" || g.ParkedSessions[0].By != "pressure" {
				t.Fatalf("parked %+v, want session b (the largest idle fiber with a session) parked by pressure", g.ParkedSessions)
			}
			// The same reading parks nothing more: the next Clone is shed.
			if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusTooManyRequests {
				t.Fatalf("second clone within the reading: %d %s, want 429", r.status, r.body)
			}
			e.clk.Step(2 * time.Second) // a new reading
			if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
				t.Fatalf("clone at the next reading: %d %s", r.status, r.body)
			}
			g = e.grantStatus(uid)
			if g.Parked != 2 || g.ParkedSessions[0].Session != "b" || g.ParkedSessions[1].Session != "c" {
				t.Fatalf("parked %+v, want b and then c", g.ParkedSessions)
			}
			if m := e.metrics(); !strings.Contains(m, `fiberd_parks_total{by="pressure",outcome="parked"} 2`) {
				t.Errorf("metrics lack the pressure parks:\n%s", grepLines(m, "parks_total"))
			}
			// a is left: the next reading's Clone parks it, and then none is
			// left (recent was named lately, "" has no session).
			e.clk.Step(2 * time.Second)
			if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
				t.Fatalf("third clone: %d %s", r.status, r.body)
			}
			e.clk.Step(2 * time.Second)
			if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusTooManyRequests {
				t.Fatalf("clone with no idle fiber left to park: %d %s, want 429", r.status, r.body)
			}
			if g := e.grantStatus(uid); g.Parked != 3 {
				t.Fatalf("parked %+v, want a, b and c", g.ParkedSessions)
			}
		})
	}
}
