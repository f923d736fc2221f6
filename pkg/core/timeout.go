package core

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// WithTimeout is context.WithTimeout on clk: the returned context ends when
// ctx does, when cancel is called, or d after the call on clk's time,
// whichever is first (its Err is then context.Canceled). A fake clock thus
// drives the deadline in tests. cancel stops clk's timer and must be called,
// as with the standard library. The agent (a Clone's deadline) and the
// backends (warm, kill and drain timeouts) call it.
func WithTimeout(ctx context.Context, clk clock.WithDelayedExecution, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	t := clk.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}
