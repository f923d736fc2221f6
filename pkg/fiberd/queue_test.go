package fiberd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// recorder is a reconcile function for queue tests: it counts runs per key,
// notes when two runs of one key overlap, and can block a key.
type recorder struct {
	mu      sync.Mutex
	runs    map[string]int
	running map[string]bool
	overlap bool
	block   map[string]chan struct{} // a run of the key waits for it
	entered chan string
	results map[string][]result // results to return, in order, then zero
}

func newRecorder() *recorder {
	return &recorder{runs: map[string]int{}, running: map[string]bool{}, block: map[string]chan struct{}{},
		entered: make(chan string, 100), results: map[string][]result{}}
}

func (r *recorder) run(ctx context.Context, key string) result {
	r.mu.Lock()
	if r.running[key] {
		r.overlap = true
	}
	r.running[key] = true
	r.runs[key]++
	b := r.block[key]
	var res result
	if rs := r.results[key]; len(rs) > 0 {
		res, r.results[key] = rs[0], rs[1:]
	}
	r.mu.Unlock()
	r.entered <- key
	if b != nil {
		select {
		case <-b:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	r.running[key] = false
	r.mu.Unlock()
	return res
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[key]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// idle reports whether key has nothing running or pending.
func idle(q *workQueue, key string) bool {
	running, timer := q.pending(key)
	return !running && !timer
}

// TestQueueOneRunPerKeyKeysInParallel: Adds of a key whose reconcile runs
// coalesce into one more run after it, never a second run beside it; a
// blocked key does not hold up another.
func TestQueueOneRunPerKeyKeysInParallel(t *testing.T) {
	clk := clocktesting.NewFakeClock(testStart)
	r := newRecorder()
	release := make(chan struct{})
	r.block["a"] = release
	ctx, cancel := context.WithCancel(context.Background())
	q := newWorkQueue(ctx, clk, r.run)
	defer func() { cancel(); q.stop() }()

	q.Add("a")
	<-r.entered
	for i := 0; i < 10; i++ {
		q.Add("a")
	}
	q.Add("b")
	if k := <-r.entered; k != "b" {
		t.Fatalf("ran %q while a was blocked, want b", k)
	}
	waitFor(t, "b done", func() bool { return idle(q, "b") })
	if n := r.count("a"); n != 1 {
		t.Fatalf("a ran %d times while its first run was blocked, want 1", n)
	}
	r.mu.Lock()
	r.block["a"] = nil
	r.mu.Unlock()
	close(release)
	waitFor(t, "a done", func() bool { return idle(q, "a") })
	if n := r.count("a"); n != 2 {
		t.Fatalf("a ran %d times after 11 Adds during one run, want 2 (the run and one more)", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.overlap {
		t.Fatal("two reconciles of one key ran at once")
	}
}

// TestQueueBackoffAndDelay: failures are retried after 1 s, 2 s, 4 s on the
// clock; a success forgets them; a result's delay runs the key again.
func TestQueueBackoffAndDelay(t *testing.T) {
	clk := clocktesting.NewFakeClock(testStart)
	r := newRecorder()
	boom := errors.New("zygote did not start")
	r.results["k"] = []result{{err: boom}, {err: boom}, {err: boom}, {after: 10 * time.Second}}
	ctx, cancel := context.WithCancel(context.Background())
	q := newWorkQueue(ctx, clk, r.run)
	defer func() { cancel(); q.stop() }()

	q.Add("k")
	<-r.entered
	for i, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 10 * time.Second} {
		waitFor(t, "timer armed", func() bool { running, timer := q.pending("k"); return !running && timer })
		clk.Step(d - time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		if n := r.count("k"); n != i+1 {
			t.Fatalf("run %d came before its delay %v (runs %d)", i+2, d, n)
		}
		clk.Step(time.Millisecond)
		<-r.entered
	}
	waitFor(t, "k idle", func() bool { return idle(q, "k") })
	if n := r.count("k"); n != 5 {
		t.Fatalf("k ran %d times, want 5", n)
	}
}

// TestQueueAddAfterKeepsEarliest: of two delays the earlier wins, and an
// Add runs at once whatever is pending.
func TestQueueAddAfterKeepsEarliest(t *testing.T) {
	clk := clocktesting.NewFakeClock(testStart)
	r := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	q := newWorkQueue(ctx, clk, r.run)
	defer func() { cancel(); q.stop() }()

	q.AddAfter("k", time.Minute)
	q.AddAfter("k", 5*time.Second)
	q.AddAfter("k", 2*time.Minute)
	clk.Step(5 * time.Second)
	<-r.entered
	waitFor(t, "k idle", func() bool { return idle(q, "k") })
	clk.Step(5 * time.Minute)
	time.Sleep(20 * time.Millisecond)
	if n := r.count("k"); n != 1 {
		t.Fatalf("k ran %d times, want 1: the later delays were dropped", n)
	}
	q.AddAfter("j", time.Hour)
	q.Add("j")
	<-r.entered
}

// TestQueueStop: stop waits for the running reconcile (whose context ends)
// and nothing runs after it.
func TestQueueStop(t *testing.T) {
	clk := clocktesting.NewFakeClock(testStart)
	r := newRecorder()
	r.block["k"] = make(chan struct{}) // never closed: only ctx ends the run
	ctx, cancel := context.WithCancel(context.Background())
	q := newWorkQueue(ctx, clk, r.run)
	q.Add("k")
	<-r.entered
	q.AddAfter("j", time.Second)
	var stopped atomic.Bool
	go func() { cancel(); q.stop(); stopped.Store(true) }()
	waitFor(t, "stop returned", stopped.Load)
	q.Add("k")
	q.AddAfter("j", 0)
	clk.Step(time.Hour)
	time.Sleep(20 * time.Millisecond)
	if r.count("k") != 1 || r.count("j") != 0 {
		t.Fatalf("runs after stop: k %d, j %d", r.count("k"), r.count("j"))
	}
	q.stop() // idempotent
}

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: time.Minute, 100: time.Minute} {
		if got := backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}
