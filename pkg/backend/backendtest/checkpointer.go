package backendtest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// Checkpointing is a backend with a CHECKPOINT tier: what the agent holds
// when its WARM backend is a backend.Checkpointer.
type Checkpointing interface {
	backend.Backend
	backend.Checkpointer
}

// Subject is one Checkpointer implementation under CheckpointerContract.
type Subject struct {
	// New returns a fresh backend whose CHECKPOINT tier works (its
	// CheckpointSupport is nil). The contract closes it when the test
	// ends. Required.
	New func(t *testing.T) Checkpointing
	// Absent returns a fresh backend of the same kind without a working
	// CHECKPOINT tier, which the contract closes. Nil skips that part.
	Absent func(t *testing.T) Checkpointing
	// Spec is the zygote template the contract warms its grants with.
	// Required.
	Spec func(t *testing.T) template.Spec
	// Memory reads what running fiber f of b, serving on the unix socket
	// at addr, holds in its memory. It fails the test when f does not
	// run or does not answer. Required.
	Memory func(t *testing.T, b Checkpointing, f backend.Fiber, addr string) Memory
}

// Memory is what a fiber holds in its memory, as the contract compares it
// across a park and a resume.
type Memory struct {
	// Payload is the payload the fiber was cloned with, hex-encoded as
	// FIBERD_PAYLOAD hands it to the fiber at its start.
	Payload string
	// Count is how many requests the fiber has answered, this read
	// included; -1 for an implementation that runs no process (the
	// fake), where the contract checks Payload only.
	Count int
}

// contractTemplate is the template reference the contract parks under.
var contractTemplate = "contract@sha256:" + strings.Repeat("c", 64)

// wait bounds every call the contract makes and every Exit it waits for.
const wait = 60 * time.Second

// CheckpointerContract checks that the Checkpointer of s keeps the promises
// of backend.Checkpointer's doc comments, each in a subtest on a fresh
// backend:
//
//   - a Checkpointer without a working tier says so (core.ErrTierGap)
//     from CheckpointSupport, Park and Resume (with Subject.Absent);
//   - Park ends a running fiber (an Exit saying Parked, queued before it
//     returns; the fence is then not running) and returns a complete
//     image at the directory asked for, its listener recorded;
//   - Resume brings the image back as a running fiber under a newer fence,
//     with the memory it had (its payload; a real fiber counts on), its
//     unix listener the one handed in, tracked like a cloned fiber (Kill
//     ends it, an Exit saying Killed); the image stays until RemoveImage;
//     a resumed fiber parks and resumes again;
//   - Park refuses a bad request (core.ErrInvalid), a fence not running
//     (core.ErrNotFound), a fiber over MaxBytes (backend.ErrTooLarge), and
//     the fiber runs on, no image written;
//   - Resume refuses an image it can never resume (another grant, epoch or
//     template, none at the path, removed) with backend.ErrImageUnusable,
//     a bad request (a fence not newer, a running fence, no listener for a
//     unix image) with core.ErrInvalid and a grant not warm with
//     backend.ErrCold; none of these spends the image, which resumes once
//     the grant is warm again with the same template;
//   - parks and resumes of different fibers may run at once.
func CheckpointerContract(t *testing.T, s Subject) {
	t.Run("absent tier", func(t *testing.T) { absentTier(t, s) })
	t.Run("park ends the fiber", func(t *testing.T) { parkEnds(t, s) })
	t.Run("resume restores the memory", func(t *testing.T) { resumeRestores(t, s) })
	t.Run("park refusals", func(t *testing.T) { parkRefusals(t, s) })
	t.Run("resume refusals", func(t *testing.T) { resumeRefusals(t, s) })
	t.Run("concurrent fibers", func(t *testing.T) { concurrentFibers(t, s) })
}

// rig is one backend under the contract with one warm grant.
type rig struct {
	t   *testing.T
	s   Subject
	b   Checkpointing
	uid string
	dir string // short: unix socket paths are limited to 108 bytes
}

var grantSeq atomic.Int64

// newRig builds s's backend (closed when the test ends), checks its tier
// works and warms a grant of s.Spec.
func newRig(t *testing.T, s Subject) *rig {
	t.Helper()
	b := s.New(t)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	dir, err := os.MkdirTemp("", "bt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &rig{t: t, s: s, b: b, uid: fmt.Sprintf("contract-%d-%d", os.Getpid()%100000, grantSeq.Add(1)), dir: dir}
	if err := b.CheckpointSupport(r.ctx()); err != nil {
		t.Fatalf("CheckpointSupport of Subject.New's backend: %v", err)
	}
	r.warm()
	return r
}

// warm warms r's grant with s.Spec.
func (r *rig) warm() {
	r.t.Helper()
	req := backend.WarmRequest{
		Grant:  core.Grant{UID: r.uid, Template: contractTemplate, Fibers: core.Fibers{Max: 8}},
		Spec:   r.s.Spec(r.t),
		RunDir: filepath.Join(r.dir, "run"),
	}
	if err := r.b.Warm(r.ctx(), req); err != nil {
		r.t.Fatalf("Warm: %v", err)
	}
}

func (r *rig) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	r.t.Cleanup(cancel)
	return ctx
}

func (r *rig) fence(seq uint64) core.Fence { return core.Fence{GrantUID: r.uid, Epoch: 1, Seq: seq} }

// path is a fresh path under r's directory.
func (r *rig) path(name string) string { return filepath.Join(r.dir, name) }

// listen binds a fresh unix listener named name and returns its file (the
// caller's copy, closed when the test ends) and its path.
func (r *rig) listen(name string) (*os.File, string) {
	r.t.Helper()
	addr := r.path(name + ".sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		r.t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close() // the file keeps the socket bound and listening
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { f.Close() })
	return f, addr
}

// fiber is a running fiber of the rig and where it serves.
type fiber struct {
	backend.Fiber
	addr    string
	payload []byte
}

// clone clones fiber seq with a payload naming it, and reads its memory
// once.
func (r *rig) clone(seq uint64) (fiber, Memory) {
	r.t.Helper()
	ln, addr := r.listen(fmt.Sprintf("f%d", seq))
	payload := []byte(fmt.Sprintf("contract fiber %d", seq))
	fb, err := r.b.Clone(r.ctx(), backend.CloneRequest{Fence: r.fence(seq), Listener: ln, Payload: payload})
	if err != nil {
		r.t.Fatalf("Clone %s: %v", r.fence(seq), err)
	}
	f := fiber{Fiber: fb, addr: addr, payload: payload}
	m := r.memory(f)
	if m.Payload != hex.EncodeToString(payload) {
		r.t.Fatalf("fiber %s holds payload %q, cloned with %x", fb.Fence, m.Payload, payload)
	}
	return f, m
}

// memory reads f's memory through the Subject.
func (r *rig) memory(f fiber) Memory {
	r.t.Helper()
	return r.s.Memory(r.t, r.b, f.Fiber, f.addr)
}

// park parks f into a fresh image directory named name and checks what
// Park promises of a served park.
func (r *rig) park(f fiber, name string) backend.Image {
	r.t.Helper()
	dir := r.path(name)
	img, err := r.b.Park(r.ctx(), backend.ParkRequest{Fence: f.Fence, Dir: dir, Template: contractTemplate})
	if err != nil {
		r.t.Fatalf("Park %s: %v", f.Fence, err)
	}
	if x := r.exit(); x.Fence != f.Fence || !x.Reason.Parked || x.GrantUID != r.uid {
		r.t.Fatalf("Exit after Park of %s = %+v, want it parked", f.Fence, x)
	}
	if img.Dir != dir || img.Bytes <= 0 || img.OwnBytes <= 0 || img.OwnBytes > img.Bytes {
		r.t.Fatalf("Park of %s = %+v: want Dir %s and 0 < OwnBytes <= Bytes", f.Fence, img, dir)
	}
	if img.Network != "unix" || img.Addr == "" {
		r.t.Fatalf("Park of %s recorded listener %q %q, want its unix socket", f.Fence, img.Network, img.Addr)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		r.t.Fatalf("Park of %s returned %s, which is no directory: %v", f.Fence, dir, err)
	}
	if _, err := os.Stat(dir + ".partial"); !errors.Is(err, os.ErrNotExist) {
		r.t.Fatalf("Park of %s left its partial image: %v", f.Fence, err)
	}
	return img
}

// resume resumes image dir as fiber seq on a fresh unix listener and
// checks what Resume promises of a served resume.
func (r *rig) resume(dir string, seq uint64, from fiber) fiber {
	r.t.Helper()
	ln, addr := r.listen(fmt.Sprintf("r%d", seq))
	res, err := r.b.Resume(r.ctx(), backend.ResumeRequest{Fence: r.fence(seq), Image: dir, Template: contractTemplate, Listener: ln})
	if err != nil {
		r.t.Fatalf("Resume of %s as %s: %v", dir, r.fence(seq), err)
	}
	if res.Fiber.Fence != r.fence(seq) || res.Fiber.PID <= 0 || res.Listener != ln {
		r.t.Fatalf("Resume as %s = %+v: want that fence, a pid, and the unix listener handed in", r.fence(seq), res)
	}
	if _, err := os.Stat(dir); err != nil {
		r.t.Fatalf("Resume removed its image %s: %v", dir, err)
	}
	return fiber{Fiber: res.Fiber, addr: addr, payload: from.payload}
}

// exit is the next Exit, within wait.
func (r *rig) exit() backend.Exit {
	r.t.Helper()
	select {
	case x, ok := <-r.b.Exits():
		if !ok {
			r.t.Fatal("Exits closed")
		}
		return x
	case <-time.After(wait):
		r.t.Fatalf("no Exit within %v", wait)
	}
	return backend.Exit{}
}

// noExit fails when an Exit is queued.
func (r *rig) noExit(what string) {
	r.t.Helper()
	select {
	case x := <-r.b.Exits():
		r.t.Fatalf("%s: unexpected Exit %+v", what, x)
	case <-time.After(50 * time.Millisecond):
	}
}

// carried checks that now, a read of f after a park and resume, holds
// what before held, one request later.
func carried(t *testing.T, what string, before, now Memory) {
	t.Helper()
	if now.Payload != before.Payload {
		t.Fatalf("%s: payload %q, the parked fiber held %q: its memory was not kept", what, now.Payload, before.Payload)
	}
	if before.Count >= 0 && now.Count != before.Count+1 {
		t.Fatalf("%s: count %d, the parked fiber had answered %d: it does not count on", what, now.Count, before.Count)
	}
}

// ------------------------------------------------------------- the parts

// absentTier: a backend without a working CHECKPOINT tier says so, as
// core.ErrTierGap, from each of its Checkpointer's methods.
func absentTier(t *testing.T, s Subject) {
	if s.Absent == nil {
		t.Skip("Subject.Absent is nil: this implementation has no backend without the tier to check")
	}
	b := s.Absent(t)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "img")
	f := core.Fence{GrantUID: "g", Epoch: 1, Seq: 1}
	if err := b.CheckpointSupport(ctx); !errors.Is(err, core.ErrTierGap) {
		t.Errorf("CheckpointSupport = %v, want core.ErrTierGap", err)
	}
	if _, err := b.Park(ctx, backend.ParkRequest{Fence: f, Dir: dir, Template: contractTemplate}); !errors.Is(err, core.ErrTierGap) {
		t.Errorf("Park = %v, want core.ErrTierGap", err)
	}
	f.Seq++
	if _, err := b.Resume(ctx, backend.ResumeRequest{Fence: f, Image: dir, Template: contractTemplate}); !errors.Is(err, core.ErrTierGap) {
		t.Errorf("Resume = %v, want core.ErrTierGap", err)
	}
}

// parkEnds: Park ends the fiber (its Exit says Parked) and writes a
// complete image; the parked fence is not running after: Kill and a second
// Park of it are core.ErrNotFound.
func parkEnds(t *testing.T, s Subject) {
	r := newRig(t, s)
	f, _ := r.clone(1)
	r.park(f, "img")
	if err := r.b.Kill(r.ctx(), f.Fence); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("Kill of the parked fiber = %v, want core.ErrNotFound", err)
	}
	if _, err := r.b.Park(r.ctx(), backend.ParkRequest{Fence: f.Fence, Dir: r.path("again"), Template: contractTemplate}); !errors.Is(err, core.ErrNotFound) {
		t.Errorf("second Park of the parked fiber = %v, want core.ErrNotFound", err)
	}
	r.noExit("after the refused Kill and Park")
}

// resumeRestores: a parked fiber resumes with its memory, twice; the
// resumed fiber is tracked like a cloned one; RemoveImage deletes the
// image.
func resumeRestores(t *testing.T, s Subject) {
	r := newRig(t, s)
	f, m := r.clone(1)
	for round := 1; round <= 2; round++ {
		img := r.park(f, fmt.Sprintf("img%d", round))
		f = r.resume(img.Dir, uint64(round+1), f)
		now := r.memory(f)
		carried(t, fmt.Sprintf("round %d", round), m, now)
		m = now
		if err := backend.RemoveImage(img.Dir); err != nil {
			t.Fatalf("RemoveImage: %v", err)
		}
		if _, err := os.Stat(img.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("RemoveImage left %s: %v", img.Dir, err)
		}
	}
	if err := r.b.Kill(r.ctx(), f.Fence); err != nil {
		t.Fatalf("Kill of the resumed fiber: %v", err)
	}
	if x := r.exit(); x.Fence != f.Fence || !x.Reason.Killed {
		t.Fatalf("Exit after Kill of the resumed fiber = %+v, want it killed", x)
	}
	g, _ := r.clone(4)
	g = r.resume(r.park(g, "img3").Dir, 5, g)
	if err := r.b.Stop(r.ctx(), r.uid); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if x := r.exit(); x.Fence != g.Fence || !x.Reason.Killed {
		t.Fatalf("Exit after Stop of the resumed fiber's grant = %+v, want it killed", x)
	}
}

// parkRefusals: Park refuses a bad request, a fence not running and a
// fiber over MaxBytes; the fiber runs on, nothing is written.
func parkRefusals(t *testing.T, s Subject) {
	r := newRig(t, s)
	f, m := r.clone(1)
	dir := r.path("img")
	exists := r.path("exists")
	if err := os.Mkdir(exists, 0o700); err != nil {
		t.Fatal(err)
	}
	other := core.Fence{GrantUID: "contract-nope", Epoch: 1, Seq: 1}
	for _, c := range []struct {
		name string
		req  backend.ParkRequest
		want error
	}{
		{"no grant", backend.ParkRequest{Fence: core.Fence{Epoch: 1, Seq: 1}, Dir: dir, Template: contractTemplate}, core.ErrInvalid},
		{"relative dir", backend.ParkRequest{Fence: f.Fence, Dir: "img", Template: contractTemplate}, core.ErrInvalid},
		{"unclean dir", backend.ParkRequest{Fence: f.Fence, Dir: dir + "/", Template: contractTemplate}, core.ErrInvalid},
		{"no template", backend.ParkRequest{Fence: f.Fence, Dir: dir}, core.ErrInvalid},
		{"negative bound", backend.ParkRequest{Fence: f.Fence, Dir: dir, Template: contractTemplate, MaxBytes: -1}, core.ErrInvalid},
		{"dir exists", backend.ParkRequest{Fence: f.Fence, Dir: exists, Template: contractTemplate}, core.ErrInvalid},
		{"unknown fiber", backend.ParkRequest{Fence: r.fence(99), Dir: dir, Template: contractTemplate}, core.ErrNotFound},
		{"unknown grant", backend.ParkRequest{Fence: other, Dir: dir, Template: contractTemplate}, core.ErrNotFound},
		{"over MaxBytes", backend.ParkRequest{Fence: f.Fence, Dir: dir, Template: contractTemplate, MaxBytes: 1}, backend.ErrTooLarge},
	} {
		if _, err := r.b.Park(r.ctx(), c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: Park = %v, want %v", c.name, err, c.want)
		}
	}
	r.noExit("after the refused parks")
	carried(t, "after the refused parks", m, r.memory(f))
	for _, p := range []string{dir, dir + ".partial", "img"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused park left %s: %v", p, err)
		}
	}
}

// resumeRefusals: Resume refuses what it can never resume with
// ErrImageUnusable and a bad request with core.ErrInvalid; a cold grant
// is ErrCold; none spends the image, which resumes once the grant is warm
// again. A removed image is ErrImageUnusable.
func resumeRefusals(t *testing.T, s Subject) {
	r := newRig(t, s)
	f, m := r.clone(1)
	dir := r.park(f, "img").Dir
	ln, _ := r.listen("refused")
	next, tpl := r.fence(2), contractTemplate
	for _, c := range []struct {
		name string
		req  backend.ResumeRequest
		want error
	}{
		{"other grant", backend.ResumeRequest{Fence: core.Fence{GrantUID: "contract-other", Epoch: 1, Seq: 2}, Image: dir, Template: tpl, Listener: ln}, backend.ErrImageUnusable},
		{"newer epoch", backend.ResumeRequest{Fence: core.Fence{GrantUID: r.uid, Epoch: 2, Seq: 1}, Image: dir, Template: tpl, Listener: ln}, backend.ErrImageUnusable},
		{"other template", backend.ResumeRequest{Fence: next, Image: dir, Template: "other@sha256:" + strings.Repeat("d", 64), Listener: ln}, backend.ErrImageUnusable},
		{"no image there", backend.ResumeRequest{Fence: next, Image: r.path("none"), Template: tpl, Listener: ln}, backend.ErrImageUnusable},
		{"no grant", backend.ResumeRequest{Fence: core.Fence{Epoch: 1, Seq: 2}, Image: dir, Template: tpl, Listener: ln}, core.ErrInvalid},
		{"relative image", backend.ResumeRequest{Fence: next, Image: "img", Template: tpl, Listener: ln}, core.ErrInvalid},
		{"relative leaf", backend.ResumeRequest{Fence: next, Image: dir, Template: tpl, Listener: ln, Leaf: "leaf"}, core.ErrInvalid},
		{"no template", backend.ResumeRequest{Fence: next, Image: dir, Listener: ln}, core.ErrInvalid},
		{"fence not newer", backend.ResumeRequest{Fence: f.Fence, Image: dir, Template: tpl, Listener: ln}, core.ErrInvalid},
		{"no listener for a unix image", backend.ResumeRequest{Fence: next, Image: dir, Template: tpl}, core.ErrInvalid},
	} {
		if _, err := r.b.Resume(r.ctx(), c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: Resume = %v, want %v", c.name, err, c.want)
		}
	}
	r.noExit("after the refused resumes")
	coldThenWarm(r, dir, m, f)
}

// coldThenWarm: on a grant not warm Resume is ErrCold and keeps the image;
// warm again with the same template, the image resumes; the image, kept,
// is refused under the fence that now runs (core.ErrInvalid), and once
// removed it is ErrImageUnusable.
func coldThenWarm(r *rig, dir string, m Memory, parked fiber) {
	t := r.t
	if err := r.b.Stop(r.ctx(), r.uid); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	ln, _ := r.listen("cold")
	if _, err := r.b.Resume(r.ctx(), backend.ResumeRequest{Fence: r.fence(2), Image: dir, Template: contractTemplate, Listener: ln}); !errors.Is(err, backend.ErrCold) {
		t.Fatalf("Resume on a cold grant = %v, want backend.ErrCold", err)
	}
	r.warm()
	f := r.resume(dir, 3, parked)
	carried(t, "after the refusals", m, r.memory(f))
	ln2, _ := r.listen("running")
	if _, err := r.b.Resume(r.ctx(), backend.ResumeRequest{Fence: f.Fence, Image: dir, Template: contractTemplate, Listener: ln2}); !errors.Is(err, core.ErrInvalid) {
		t.Errorf("Resume as a fence that runs = %v, want core.ErrInvalid", err)
	}
	if err := backend.RemoveImage(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := r.b.Resume(r.ctx(), backend.ResumeRequest{Fence: r.fence(4), Image: dir, Template: contractTemplate, Listener: ln2}); !errors.Is(err, backend.ErrImageUnusable) {
		t.Errorf("Resume of a removed image = %v, want backend.ErrImageUnusable", err)
	}
}

// concurrentFibers: two fibers of a grant park at once and resume at once,
// each with its own memory.
func concurrentFibers(t *testing.T, s Subject) {
	r := newRig(t, s)
	a, ma := r.clone(1)
	b, mb := r.clone(2)
	dirs := [2]string{r.path("a"), r.path("b")}
	ctx := r.ctx()
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for i, f := range []fiber{a, b} {
		wg.Go(func() {
			_, err := r.b.Park(ctx, backend.ParkRequest{Fence: f.Fence, Dir: dirs[i], Template: contractTemplate})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Park at once: %v", err)
		}
	}
	got := map[core.Fence]bool{}
	for range 2 {
		if x := r.exit(); x.Reason.Parked {
			got[x.Fence] = true
		}
	}
	if !got[a.Fence] || !got[b.Fence] {
		t.Fatalf("Exits after two parks at once name %v, want %s and %s parked", got, a.Fence, b.Fence)
	}
	lns := [2]*os.File{}
	addrs := [2]string{}
	lns[0], addrs[0] = r.listen("ra")
	lns[1], addrs[1] = r.listen("rb")
	res := make([]backend.Resumed, 2)
	rerrs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			res[i], rerrs[i] = r.b.Resume(ctx, backend.ResumeRequest{Fence: r.fence(uint64(3 + i)), Image: dirs[i], Template: contractTemplate, Listener: lns[i]})
		})
	}
	wg.Wait()
	for i, m := range []Memory{ma, mb} {
		if rerrs[i] != nil {
			t.Fatalf("Resume at once of %s: %v", dirs[i], rerrs[i])
		}
		carried(t, "resumed at once", m, r.memory(fiber{Fiber: res[i].Fiber, addr: addrs[i]}))
	}
}
