package fiberd

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// The reconciler's retry back-off: a reconcile that fails is run again
// after retryBase, then twice as long after each further failure in a row,
// up to retryMax. An event for the key (a lane delivery, a Clone's offer, a
// zygote's death) runs it at once whatever the back-off.
const (
	retryBase = time.Second
	retryMax  = time.Minute
)

// result is what one reconcile asks of the queue.
type result struct {
	// after, when positive, runs the key again after this long: a lease's
	// end, a revocation's expiry.
	after time.Duration
	// err, when set, runs the key again after its back-off and counts a
	// failure; nil forgets the key's failures.
	err error
}

// workQueue runs reconciles of keys (grant UIDs) in the manner of
// controller-runtime's work queue: an event only adds the key; a key runs
// one reconcile at a time, and a key added while its reconcile runs runs
// again right after; different keys run in parallel, each on a goroutine of
// its own that lives while the key has work, so no key ever waits for
// another (a hung zygote start holds up its own grant only). A failed
// reconcile is retried with exponential back-off; a reconcile may also ask
// to run again after a delay. Timers run on the injected clock.
//
// k8s.io/client-go/util/workqueue has these semantics, but pkg/fiberd may
// not depend on client-go (test/layout), and its fixed pool of workers is
// what must not happen here: a worker blocked in a zygote start would hold
// up grants queued behind it.
//
// Add and AddAfter may be called from any goroutine, also from inside a
// reconcile. stop ends it: no reconcile starts after, and stop returns once
// the running ones returned (they watch the context given to newWorkQueue).
type workQueue struct {
	ctx context.Context
	clk clock.WithDelayedExecution
	run func(ctx context.Context, key string) result

	mu       sync.Mutex            // guards every field below; never held while run runs
	active   map[string]bool       // a goroutine runs reconciles of the key
	dirty    map[string]bool       // the key was added while its reconcile ran
	timers   map[string]queueTimer // the earliest pending AddAfter of the key
	failures map[string]int        // failed reconciles in a row
	stopped  bool
	wg       sync.WaitGroup // one per running goroutine
}

// queueTimer is a pending AddAfter: when it fires and its timer.
type queueTimer struct {
	at time.Time
	t  clock.Timer
}

// newWorkQueue returns a queue that calls run for each key added, with
// ctx, until stop.
func newWorkQueue(ctx context.Context, clk clock.WithDelayedExecution, run func(context.Context, string) result) *workQueue {
	return &workQueue{
		ctx: ctx, clk: clk, run: run,
		active: map[string]bool{}, dirty: map[string]bool{},
		timers: map[string]queueTimer{}, failures: map[string]int{},
	}
}

// Add asks for a reconcile of key now: it starts one unless one runs, in
// which case another runs right after it. After stop it does nothing.
func (q *workQueue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key)
}

func (q *workQueue) addLocked(key string) {
	if q.stopped {
		return
	}
	if q.active[key] {
		q.dirty[key] = true
		return
	}
	q.active[key] = true
	q.wg.Add(1)
	go q.loop(key)
}

// AddAfter asks for a reconcile of key after d (at once when d <= 0). A
// key keeps only its earliest pending delay: a reconcile computes its next
// wake-up afresh each time it runs.
func (q *workQueue) AddAfter(key string, d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addAfterLocked(key, d)
}

func (q *workQueue) addAfterLocked(key string, d time.Duration) {
	if q.stopped {
		return
	}
	if d <= 0 {
		q.addLocked(key)
		return
	}
	at := q.clk.Now().Add(d)
	if old, ok := q.timers[key]; ok {
		if !at.Before(old.at) {
			return
		}
		old.t.Stop()
	}
	var qt queueTimer
	qt.at = at
	qt.t = q.clk.AfterFunc(d, func() { q.fire(key, at) })
	q.timers[key] = qt
}

// fire is a timer of AddAfter going off.
func (q *workQueue) fire(key string, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t, ok := q.timers[key]; ok && t.at.Equal(at) {
		delete(q.timers, key)
	}
	q.addLocked(key)
}

// loop runs reconciles of key until it is no longer dirty.
func (q *workQueue) loop(key string) {
	defer q.wg.Done()
	for {
		res := q.run(q.ctx, key)
		q.mu.Lock()
		if res.err != nil {
			q.failures[key]++
			q.addAfterLocked(key, backoff(q.failures[key]))
		} else {
			delete(q.failures, key)
			if res.after > 0 {
				q.addAfterLocked(key, res.after)
			}
		}
		if q.dirty[key] && !q.stopped {
			delete(q.dirty, key)
			q.mu.Unlock()
			continue
		}
		delete(q.dirty, key)
		delete(q.active, key)
		q.mu.Unlock()
		return
	}
}

// backoff is the delay before the retry that follows the n-th failure in
// a row (n >= 1): retryBase doubled n-1 times, at most retryMax.
func backoff(n int) time.Duration {
	d := retryBase
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// stop ends the queue: pending timers are dropped, no reconcile starts
// any more, and stop returns once the running ones have returned. The
// caller ends their context first. It is idempotent.
func (q *workQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	for k, t := range q.timers {
		t.t.Stop()
		delete(q.timers, k)
	}
	q.mu.Unlock()
	q.wg.Wait()
}

// pending reports whether key has a reconcile running or a retry or delay
// pending. Tests read it.
func (q *workQueue) pending(key string) (running, timer bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, timer = q.timers[key]
	return q.active[key], timer
}
