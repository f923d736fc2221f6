package fake

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLifecycle: the fake keeps the backend contract: cold clones fail,
// fences run once, Kill/Exit/Stop/DieTemplate queue exits in order, hooks
// inject errors, Close closes Exits.
func TestLifecycle(t *testing.T) {
	injected := errors.New("injected")
	b := New(core.TierWarm, Hooks{Kill: func(_ context.Context, f core.Fence) error {
		if f.Seq == 99 {
			return injected
		}
		return nil
	}})
	ctx := context.Background()
	g := core.Grant{UID: "g1"}
	lf, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	f := func(seq uint64) core.Fence { return core.Fence{GrantUID: "g1", Epoch: 1, Seq: seq} }

	if _, err := b.Clone(ctx, backend.CloneRequest{Fence: f(1), Listener: lf}); !errors.Is(err, backend.ErrCold) {
		t.Fatalf("clone of a cold grant: %v", err)
	}
	if err := b.Warm(ctx, backend.WarmRequest{Grant: g, Spec: template.Spec{Command: "/bin/true"}, RunDir: "/r"}); !errors.Is(err, core.ErrTierGap) {
		t.Fatalf("warm of a non-zygote on WARM: %v", err)
	}
	if err := b.Warm(ctx, backend.WarmRequest{Grant: g, Spec: template.Spec{Command: "/bin/true", Zygote: true}, RunDir: "/r"}); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if _, err := b.Clone(ctx, backend.CloneRequest{Fence: f(seq), Listener: lf}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Clone(ctx, backend.CloneRequest{Fence: f(1), Listener: lf}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("second clone of one fence: %v", err)
	}
	if err := b.Kill(ctx, f(99)); !errors.Is(err, injected) {
		t.Fatalf("hook error not returned: %v", err)
	}
	if err := b.Kill(ctx, f(1)); err != nil {
		t.Fatal(err)
	}
	if err := b.Kill(ctx, f(1)); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
	b.Exit(f(2), 3)
	b.DieTemplate("g1")
	want := []string{"killed", "exit:3", "template died", "signal:SIGKILL"}
	for i, w := range want {
		x := <-b.Exits()
		if x.Reason.String() != w || (i == 3) != x.Template {
			t.Fatalf("exit %d = %+v, want %s", i, x, w)
		}
	}
	if b.Warmed("g1") || len(b.Running("")) != 0 {
		t.Fatal("grant warm or fibers running after its template died")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-b.Exits(); ok {
		t.Fatal("Exits open after Close")
	}
	_ = b.Close()
}

// TestIsolation: the fake reports what SetIsolation set, gives each grant
// its level as the real backends do ("shared" caps it at grant), and
// refuses MinIsolation above it and "network": "none" without it with
// ErrTierGap.
func TestIsolation(t *testing.T) {
	b := New(core.TierWarm, Hooks{})
	defer b.Close()
	ctx := context.Background()
	lf, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	spec := template.Spec{Command: "/x", Zygote: true}
	if s := b.Isolation(); s.Level != backend.IsolationNone {
		t.Fatalf("a new fake reports %+v", s)
	}
	req := func(uid string, spec template.Spec, min backend.Isolation) backend.WarmRequest {
		return backend.WarmRequest{Grant: core.Grant{UID: uid}, Spec: spec, RunDir: "/r", MinIsolation: min}
	}
	if err := b.Warm(ctx, req("g0", spec, backend.IsolationGrant)); !errors.Is(err, core.ErrTierGap) {
		t.Fatalf("MinIsolation grant without isolation: %v, want ErrTierGap", err)
	}
	b.SetIsolation(backend.IsolationSupport{Level: backend.IsolationFiber})
	if err := b.Warm(ctx, req("g1", spec, backend.IsolationFiber)); err != nil {
		t.Fatal(err)
	}
	shared := spec
	shared.Isolation = template.IsolationShared
	if err := b.Warm(ctx, req("g2", shared, "")); err != nil {
		t.Fatal(err)
	}
	if b.GrantIsolation("g1") != backend.IsolationFiber || b.GrantIsolation("g2") != backend.IsolationGrant || b.GrantIsolation("g0") != "" {
		t.Fatalf("levels g1 %q g2 %q g0 %q", b.GrantIsolation("g1"), b.GrantIsolation("g2"), b.GrantIsolation("g0"))
	}
	if err := b.Warm(ctx, req("g3", shared, backend.IsolationFiber)); !errors.Is(err, core.ErrTierGap) {
		t.Fatalf("a shared template needing fiber isolation: %v, want ErrTierGap", err)
	}
	none := spec
	none.Network = template.NetworkNone
	if err := b.Warm(ctx, req("g4", none, "")); !errors.Is(err, core.ErrTierGap) {
		t.Fatalf("network none where it cannot be given: %v, want ErrTierGap", err)
	}
	fb, err := b.Clone(ctx, backend.CloneRequest{Fence: core.Fence{GrantUID: "g2", Epoch: 1, Seq: 1}, Listener: lf})
	if err != nil || fb.Isolation != backend.IsolationGrant {
		t.Fatalf("Clone = %+v, %v; want isolation grant", fb, err)
	}
	if err := b.Stop(ctx, "g1"); err != nil || b.GrantIsolation("g1") != "" {
		t.Fatalf("after Stop: %v, level %q", err, b.GrantIsolation("g1"))
	}
}

func TestCheckpoint(t *testing.T) {
	ctx := context.Background()
	b := New(core.TierWarm, Hooks{})
	defer b.Close()
	if err := b.CheckpointSupport(ctx); !errors.Is(err, core.ErrTierGap) {
		t.Fatalf("CheckpointSupport before EnableCheckpoint = %v, want a tier gap", err)
	}
	b.EnableCheckpoint(1 << 20)
	if err := b.Warm(ctx, backend.WarmRequest{Grant: core.Grant{UID: "g1"}, Spec: template.Spec{Command: "/bin/true", Zygote: true}, RunDir: "/r"}); err != nil {
		t.Fatal(err)
	}
	f1 := core.Fence{GrantUID: "g1", Epoch: 1, Seq: 1}
	if _, err := b.Clone(ctx, backend.CloneRequest{Fence: f1, Listener: os.Stdin}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "img")
	if _, err := b.Park(ctx, backend.ParkRequest{Fence: f1, Dir: dir, Template: "t", MaxBytes: 1000}); !errors.Is(err, backend.ErrTooLarge) {
		t.Fatalf("Park over MaxBytes = %v, want ErrTooLarge", err)
	}
	img, err := b.Park(ctx, backend.ParkRequest{Fence: f1, Dir: dir, Template: "t"})
	if err != nil || img.Bytes != 1<<20 {
		t.Fatalf("Park = %+v, %v", img, err)
	}
	if ex := <-b.Exits(); ex.Fence != f1 || !ex.Reason.Parked {
		t.Fatalf("Exit %+v, want %s parked", ex, f1)
	}
	if got := b.Images(); len(got) != 1 || got[0] != dir {
		t.Fatalf("Images = %v", got)
	}
	f2 := core.Fence{GrantUID: "g1", Epoch: 1, Seq: 2}
	if _, err := b.Resume(ctx, backend.ResumeRequest{Fence: f2, Image: dir, Template: "other"}); !errors.Is(err, backend.ErrImageUnusable) {
		t.Fatalf("Resume under another template = %v, want ErrImageUnusable", err)
	}
	if _, err := b.Resume(ctx, backend.ResumeRequest{Fence: core.Fence{GrantUID: "g1", Epoch: 2, Seq: 1}, Image: dir, Template: "t"}); !errors.Is(err, backend.ErrImageUnusable) {
		t.Fatalf("Resume in another epoch = %v, want ErrImageUnusable", err)
	}
	if r, err := b.Resume(ctx, backend.ResumeRequest{Fence: f2, Image: dir, Template: "t"}); err != nil || r.Fiber.Fence != f2 {
		t.Fatalf("Resume = %+v, %v", r, err)
	}
	if got := b.Running("g1"); len(got) != 1 || got[0] != f2 {
		t.Fatalf("Running = %v, want the resumed fiber", got)
	}
	if err := backend.RemoveImage(dir); err != nil {
		t.Fatal(err)
	}
	if got := b.Images(); len(got) != 0 {
		t.Fatalf("Images after RemoveImage = %v", got)
	}
}
