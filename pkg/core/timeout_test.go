package core

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// WithTimeout ends its context when clk reaches d, not before.
func TestWithTimeoutFollowsTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	ctx, cancel := WithTimeout(context.Background(), clk, time.Second)
	defer cancel()
	clk.Step(999 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatal("context ended before the clock reached the timeout")
	}
	clk.Step(time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("context did not end when the clock reached the timeout")
	}
}

// "cancel stops clk's timer": nothing is left waiting on the clock.
func TestWithTimeoutCancelStopsTheTimer(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	ctx, cancel := WithTimeout(context.Background(), clk, time.Second)
	cancel()
	if ctx.Err() == nil {
		t.Fatal("context alive after cancel")
	}
	if clk.HasWaiters() {
		t.Fatal("the clock's timer outlived cancel")
	}
}

// The parent's end ends it.
func TestWithTimeoutEndsWithItsParent(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel := WithTimeout(parent, clocktesting.NewFakeClock(time.Unix(1e9, 0)), time.Hour)
	defer cancel()
	stop()
	if ctx.Err() == nil {
		t.Fatal("context alive after its parent ended")
	}
}
