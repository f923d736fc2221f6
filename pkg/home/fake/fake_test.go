package fake

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

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
	if h.Closed() || h.Closes() != 0 {
		t.Fatalf("closed (%d) before Close", h.Closes())
	}
	h.Close()
	h.Close()
	if !h.Closed() || h.Closes() != 2 {
		t.Fatalf("Closed() = %v, Closes() = %d after two Closes, want true, 2", h.Closed(), h.Closes())
	}
}

// TestNoLane: a home without a lane hands the agent a nil channel and no
// error, and refuses to queue events nothing would read.
func TestNoLane(t *testing.T) {
	h := New(Config{NoLane: true})
	lane, err := h.Grants(context.Background())
	if lane != nil || err != nil {
		t.Fatalf("Grants = %v, %v, want nil, nil", lane, err)
	}
	for name, send := range map[string]func(){
		"Deliver": func() { h.Deliver("g1", []byte("tok")) },
		"Remove":  func() { h.Remove("g1") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s on a home without a lane did not panic", name)
				}
			}()
			send()
		}()
	}
}

// TestOwnGrant: the own grant and self-admission UID are Config's until
// SetOwnGrant replaces the token; neither the Config's slice nor the one
// given to SetOwnGrant is kept, so the caller may reuse them.
func TestOwnGrant(t *testing.T) {
	if own, ok := New(Config{}).OwnGrant(); ok || own != nil {
		t.Fatalf("OwnGrant of a default home = %q, %v, want none", own, ok)
	}
	if uid := New(Config{}).SelfAdmitUID(); uid != "" {
		t.Fatalf("SelfAdmitUID of a default home = %q, want none", uid)
	}
	first := []byte("tok-1")
	h := New(Config{SelfAdmitUID: "pod-1", OwnGrant: first})
	first[0] = 'X'
	if own, ok := h.OwnGrant(); !ok || string(own) != "tok-1" {
		t.Fatalf("OwnGrant = %q, %v, want tok-1", own, ok)
	}
	if uid := h.SelfAdmitUID(); uid != "pod-1" {
		t.Fatalf("SelfAdmitUID = %q, want pod-1", uid)
	}
	second := []byte("tok-2")
	h.SetOwnGrant(second)
	second[0] = 'X'
	if own, ok := h.OwnGrant(); !ok || string(own) != "tok-2" {
		t.Fatalf("OwnGrant after SetOwnGrant = %q, %v, want tok-2", own, ok)
	}
	h.SetOwnGrant(nil)
	if own, ok := h.OwnGrant(); ok || own != nil {
		t.Fatalf("OwnGrant after SetOwnGrant(nil) = %q, %v, want none", own, ok)
	}
}

// TestConcurrentUse: the test's setters and the agent's calls may run on
// different goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	h := New(Config{})
	var wg sync.WaitGroup
	for i := range 4 {
		uid := "g" + strconv.Itoa(i)
		wg.Go(func() {
			for range 100 {
				h.SetOwnGrant([]byte(uid))
				_ = h.PublishReady(context.Background(), uid, true)
				h.OnScopeLost(func(context.Context, string) {})
				h.Close()
			}
		})
		wg.Go(func() {
			for range 100 {
				h.OwnGrant()
				h.IsReady(uid)
				h.Ready()
				h.LoseScope(context.Background(), "x")
				h.Closes()
			}
		})
	}
	wg.Wait()
	if got := h.Closes(); got != 400 {
		t.Fatalf("Closes() = %d after 400 concurrent Closes", got)
	}
}

// TestLaneClosesWithItsContext: as home.Home says, the lane is closed when
// the context of Grants ends; what was delivered and not read by then is
// read, in order, from the next call's lane.
func TestLaneClosesWithItsContext(t *testing.T) {
	h := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	lane, err := h.Grants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.Deliver("g1", []byte("tok"))
	if ev := <-lane; ev.UID != "g1" {
		t.Fatalf("event %+v, want g1's", ev)
	}
	cancel()
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case ev, ok := <-lane:
			if ok {
				t.Fatalf("event %+v after the context ended", ev)
			}
			open = false
		case <-timeout:
			t.Fatal("the lane is still open 10s after its context ended")
		}
	}
	h.Deliver("g2", nil)
	h.Remove("g2")
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	lane2, err := h.Grants(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-lane2; ev.Kind != home.GrantAdded || ev.UID != "g2" {
		t.Fatalf("first event of the next lane %+v, want GrantAdded g2", ev)
	}
	if ev := <-lane2; ev.Kind != home.GrantRemoved || ev.UID != "g2" {
		t.Fatalf("second event of the next lane %+v, want GrantRemoved g2", ev)
	}
}
