package core

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

func testGrant(uid string, max int) Grant {
	return Grant{UID: uid, Fibers: Fibers{Max: max}, IssuedAt: t0, Expiry: t0.Add(time.Hour)}
}

func TestLedgerBurstNeverExceedsMax(t *testing.T) {
	l := NewLedger(1)
	if _, err := l.Admit(testGrant("g", 5)); err != nil {
		t.Fatal(err)
	}
	var ok, missed atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _, err := l.Reserve("g", "", t0)
			if err != nil {
				if !errors.Is(err, ErrNoCapacity) {
					t.Errorf("Reserve: %v, want ErrNoCapacity", err)
				}
				missed.Add(1)
				return
			}
			time.Sleep(time.Millisecond) // the runtime forks outside the lock
			if err := l.Commit(res, Fiber{}); err != nil {
				t.Error(err)
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || missed.Load() != 45 {
		t.Fatalf("%d committed, %d missed; want 5 and 45", ok.Load(), missed.Load())
	}
	if n := len(l.Snapshot()[0].Running); n != 5 {
		t.Fatalf("%d running, want 5", n)
	}
}

func TestLedgerSessionAttachUnderConcurrency(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 10))
	var created, attached atomic.Int32
	fences := make(chan Fence, 50)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.LockSession(context.Background(), "g", "s1")
			if err != nil {
				t.Error(err)
				return
			}
			defer unlock()
			res, att, err := l.Reserve("g", "s1", t0)
			if err != nil {
				t.Error(err)
				return
			}
			if att != nil {
				attached.Add(1)
				fences <- att.Fence
				return
			}
			if err := l.Commit(res, Fiber{Endpoint: "tcp://127.0.0.1:1"}); err != nil {
				t.Error(err)
			}
			created.Add(1)
			fences <- res.Fence
		}()
	}
	wg.Wait()
	close(fences)
	if created.Load() != 1 || attached.Load() != 49 {
		t.Fatalf("created %d attached %d; want 1 and 49", created.Load(), attached.Load())
	}
	var first Fence
	for f := range fences {
		if first == (Fence{}) {
			first = f
		}
		if f != first {
			t.Fatalf("attach returned fence %s, want the session's %s", f, first)
		}
	}
	if len(l.gates) != 0 {
		t.Fatalf("%d session gates left behind", len(l.gates))
	}
}

// TestLedgerSessionGateHonoursDeadline: a Clone waiting for a session's
// gate, held by the Clone creating the session's fiber, gives up when its
// context ends, and the gate still works afterwards.
func TestLedgerSessionGateHonoursDeadline(t *testing.T) {
	l := NewLedger(1)
	unlock, err := l.LockSession(context.Background(), "g", "s1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.LockSession(ctx, "g", "s1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockSession on a held gate with an ended context: %v, want context.Canceled", err)
	}
	unlock()
	unlock2, err := l.LockSession(ctx, "g", "s1") // free now: taken without waiting
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
	if len(l.gates) != 0 {
		t.Fatalf("%d session gates left behind", len(l.gates))
	}
}

func TestLedgerEpochBumpRefusesCommit(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 3))
	res, _, err := l.Reserve("g", "", t0)
	if err != nil {
		t.Fatal(err)
	}
	old, _, _ := l.Reserve("g", "", t0)
	l.Commit(old, Fiber{})
	stale := l.SetEpoch(2)
	if len(stale) != 1 || stale[0].Fence != old.Fence {
		t.Fatalf("SetEpoch returned %v, want the running fiber %s", stale, old.Fence)
	}
	if err := l.Commit(res, Fiber{}); !errors.Is(err, ErrStaleCommit) {
		t.Fatalf("commit across an epoch bump: %v, want ErrStaleCommit", err)
	}
	if _, err := l.Lookup(old.Fence); !errors.Is(err, ErrNotFound) {
		t.Fatalf("lookup of an older-epoch fence: %v, want ErrNotFound", err)
	}
	// The places are free again: 3 new fibers fit, in the new epoch.
	for i := 0; i < 3; i++ {
		r, _, err := l.Reserve("g", "", t0)
		if err != nil {
			t.Fatalf("reserve %d after bump: %v", i, err)
		}
		if r.Fence.Epoch != 2 {
			t.Fatalf("fence %s minted in the old epoch", r.Fence)
		}
		if err := l.Commit(r, Fiber{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLedgerCancelAfterFailedCommit: the agent cancels every reservation
// whose Clone failed, also one whose Commit failed (which freed its place
// already): that frees nothing twice, so fibers.max still holds.
func TestLedgerCancelAfterFailedCommit(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 1))
	res, _, err := l.Reserve("g", "", t0)
	if err != nil {
		t.Fatal(err)
	}
	l.SetEpoch(2)
	if err := l.Commit(res, Fiber{}); !errors.Is(err, ErrStaleCommit) {
		t.Fatalf("commit across an epoch bump: %v", err)
	}
	l.Cancel(res)
	l.Cancel(res)
	r, _, err := l.Reserve("g", "", t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Commit(r, Fiber{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Reserve("g", "", t0); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("a second fiber of a grant of fibers.max 1 was reserved (%v): a place was freed twice", err)
	}
	if err := l.Commit(r, Fiber{}); !errors.Is(err, ErrStaleCommit) {
		t.Fatalf("a second Commit of one reservation = %v, want ErrStaleCommit", err)
	}
}

func TestLedgerYieldDuringCloneRefusesCommit(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 3))
	res, _, _ := l.Reserve("g", "", t0)
	l.Yield("g")
	l.Admit(testGrant("g", 3)) // a new entry of the same UID
	if err := l.Commit(res, Fiber{}); !errors.Is(err, ErrStaleCommit) {
		t.Fatalf("commit onto a replaced entry: %v, want ErrStaleCommit", err)
	}
	if n := len(l.Snapshot()[0].Running); n != 0 {
		t.Fatalf("%d running on the new entry, want 0", n)
	}
}

func TestLedgerExitFreesItsPlace(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 1))
	res, _, _ := l.Reserve("g", "s", t0)
	l.Commit(res, Fiber{})
	if _, _, err := l.Reserve("g", "", t0); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("second fiber of max 1: %v, want ErrNoCapacity", err)
	}
	if _, ok := l.Remove(res.Fence); !ok {
		t.Fatal("Remove of a running fiber reported absent")
	}
	res2, att, err := l.Reserve("g", "s", t0)
	if err != nil || att != nil {
		t.Fatalf("after exit: %v, attach %v; want a new reservation (the session ended)", err, att)
	}
	if res2.Fence.Seq != 2 {
		t.Fatalf("seq %d, want 2: seq never repeats", res2.Fence.Seq)
	}
}

func TestLedgerDenyUntilLifted(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 1))
	l.Yield("g")
	if err := l.Deny("g", t0.Add(time.Hour)); err != nil {
		t.Fatalf("Deny without a store: %v", err)
	}
	if _, err := l.Admit(testGrant("g", 1)); !errors.Is(err, ErrDenied) {
		t.Fatalf("admit of a denied grant: %v, want ErrDenied", err)
	}
	if _, _, err := l.Reserve("g", "", t0); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("clone of a denied grant: %v, want ErrNoCapacity", err)
	}
	if was, err := l.Lift("g"); !was || err != nil {
		t.Fatalf("Lift of a denied grant: %v, %v; want true, nil", was, err)
	}
	if added, err := l.Admit(testGrant("g", 1)); err != nil || !added {
		t.Fatalf("admit after Lift: %v, %v", added, err)
	}
}

func TestLedgerLeaseLapse(t *testing.T) {
	l := NewLedger(1)
	g := testGrant("g", 1)
	l.Admit(g)
	res, _, err := l.Reserve("g", "", g.Expiry.Add(-time.Nanosecond))
	if err != nil {
		t.Fatalf("clone a nanosecond before the lease ends: %v", err)
	}
	l.Cancel(res)
	if _, _, err := l.Reserve("g", "", g.Expiry); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("clone of a lapsed grant: %v, want ErrNoCapacity", err)
	}
}

func TestLedgerRenewalKeepsFibers(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 2))
	res, _, _ := l.Reserve("g", "", t0)
	l.Commit(res, Fiber{})
	renewed := testGrant("g", 2)
	renewed.Expiry = renewed.Expiry.Add(time.Hour)
	if added, err := l.Admit(renewed); added || err != nil {
		t.Fatalf("re-admit: added %v err %v; want an update", added, err)
	}
	if _, err := l.Lookup(res.Fence); err != nil {
		t.Fatalf("fiber lost on renewal: %v", err)
	}
	if g, _ := l.Grant("g"); !g.Expiry.Equal(renewed.Expiry) {
		t.Fatal("renewal did not update the lease")
	}
}

// TestLedgerSeqContinuesAfterYield: a grant yielded and admitted again in
// the same epoch continues its sequence, so the fiber id of a released fiber
// never names a new one.
func TestLedgerSeqContinuesAfterYield(t *testing.T) {
	l := NewLedger(1)
	l.Admit(testGrant("g", 2))
	first, _, _ := l.Reserve("g", "", t0)
	l.Commit(first, Fiber{})
	l.Yield("g")
	l.Admit(testGrant("g", 2))
	again, _, err := l.Reserve("g", "", t0)
	if err != nil {
		t.Fatal(err)
	}
	if again.Fence == first.Fence || again.Fence.Seq != 2 {
		t.Fatalf("re-admitted grant minted %s after %s; want seq 2", again.Fence, first.Fence)
	}
	l.Commit(again, Fiber{})
	if _, err := l.Lookup(first.Fence); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the yielded fiber's id %s still resolves: %v", first.Fence, err)
	}
	// A new epoch may start the sequence over: its fences differ by epoch.
	l.Yield("g")
	l.SetEpoch(2)
	l.Admit(testGrant("g", 2))
	next, _, _ := l.Reserve("g", "", t0)
	if next.Fence != (Fence{GrantUID: "g", Epoch: 2, Seq: 1}) {
		t.Fatalf("first fence of epoch 2 = %s, want g/2/1", next.Fence)
	}
}
