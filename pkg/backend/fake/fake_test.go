package fake

import (
	"context"
	"errors"
	"os"
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
