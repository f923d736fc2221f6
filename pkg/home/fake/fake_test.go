package fake

import (
	"context"
	"testing"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/home"
)

func TestFakeHome(t *testing.T) {
	h := New(Config{Devices: []string{"d0"}})
	lane, err := h.Grants(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h.Deliver("g1", []byte("tok"))
	h.Remove("g1")
	if ev := <-lane; ev.Kind != home.GrantAdded || ev.UID != "g1" || string(ev.Token) != "tok" {
		t.Fatalf("first event %+v, want GrantAdded g1", ev)
	}
	if ev := <-lane; ev.Kind != home.GrantRemoved || ev.UID != "g1" {
		t.Fatalf("second event %+v, want GrantRemoved g1", ev)
	}
	ch, release, err := h.Devices(context.Background(), core.Grant{UID: "g1"})
	if err != nil || len(ch.Devices) != 1 || ch.Devices[0] != "d0" || release == nil {
		t.Fatalf("Devices = %+v, %v", ch, err)
	}
	_ = h.PublishReady(context.Background(), "g1", true)
	if !h.Ready() || !h.IsReady("g1") {
		t.Fatal("not ready after PublishReady(g1, true)")
	}
	_ = h.PublishReady(context.Background(), "g1", false)
	if h.Ready() {
		t.Fatal("ready after PublishReady(g1, false)")
	}
	if h.LoseScope(context.Background(), "x") {
		t.Fatal("LoseScope without a handler reported one")
	}
	var got string
	h.OnScopeLost(func(_ context.Context, reason string) { got = reason })
	if !h.LoseScope(context.Background(), "pod deleted") || got != "pod deleted" {
		t.Fatalf("LoseScope delivered %q", got)
	}
	h.SetIssuerReachable(false)
	if h.Health().Healthy() {
		t.Fatal("healthy after SetIssuerReachable(false)")
	}
	h.SetIssuerReachable(true)
	if !h.Health().Healthy() {
		t.Fatal("unhealthy after SetIssuerReachable(true)")
	}
	h.Close()
	h.Close()
	if !h.Closed() {
		t.Fatal("not closed")
	}
}
