package kubernetes

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// onClock returns a copy of ctx that ends, with cause, once clk has passed
// d: context.WithTimeout on the injected clock, so a test's fake clock
// decides when. The cancel function stops the timer and the goroutine that
// waits on it; call it once the work is done.
func onClock(ctx context.Context, clk clock.Clock, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.NewTimer(d)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-t.C():
			cancel(cause)
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
		<-done
	}
}
