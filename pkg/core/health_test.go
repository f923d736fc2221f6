package core

import (
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestSourceHealthStartsInSync(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	h := NewSourceHealth(30*time.Second, clk)
	if !h.Healthy() {
		t.Fatal("a new SourceHealth is unhealthy; it must start in sync")
	}
	if got := h.LastSync(); !got.Equal(clk.Now()) {
		t.Fatalf("LastSync = %v, want the creation time %v", got, clk.Now())
	}
}

func TestSourceHealthStaleAtExactlyTTL(t *testing.T) {
	const ttl = 30 * time.Second
	start := time.Unix(1000, 0)
	clk := clocktesting.NewFakePassiveClock(start)
	h := NewSourceHealth(ttl, clk)

	clk.SetTime(start.Add(ttl - time.Nanosecond))
	if !h.Healthy() {
		t.Fatal("unhealthy before the last sync is StaleTTL old")
	}
	clk.SetTime(start.Add(ttl))
	if h.Healthy() {
		t.Fatal("healthy when the last sync is exactly StaleTTL old; want unhealthy")
	}
}

func TestSourceHealthRecoversOnlyBelowHalfTTL(t *testing.T) {
	const ttl = 30 * time.Second
	start := time.Unix(1000, 0)
	clk := clocktesting.NewFakePassiveClock(start)
	h := NewSourceHealth(ttl, clk)

	clk.SetTime(start.Add(ttl))
	if h.Healthy() {
		t.Fatal("want unhealthy at StaleTTL")
	}
	// A sync happens, but nobody looks until it is exactly TTL/2 old: the
	// hysteresis keeps the source unhealthy.
	syncAt := start.Add(2 * ttl)
	clk.SetTime(syncAt)
	h.MarkSync()
	clk.SetTime(syncAt.Add(ttl / 2))
	if h.Healthy() {
		t.Fatal("healthy with a last sync exactly StaleTTL/2 old after being stale; want still unhealthy")
	}
	// A younger sync restores health.
	clk.SetTime(syncAt.Add(ttl))
	h.MarkSync()
	clk.SetTime(syncAt.Add(ttl + ttl/2 - time.Nanosecond))
	if !h.Healthy() {
		t.Fatal("unhealthy with a last sync younger than StaleTTL/2; want healthy again")
	}
	// Once healthy, it stays so until TTL, not TTL/2.
	clk.SetTime(syncAt.Add(ttl + ttl/2 + time.Second))
	if !h.Healthy() {
		t.Fatal("a healthy source turned unhealthy before StaleTTL")
	}
}

func TestSourceHealthUnreachableIgnoresMarksUntilResume(t *testing.T) {
	start := time.Unix(1000, 0)
	clk := clocktesting.NewFakePassiveClock(start)
	h := NewSourceHealth(30*time.Second, clk)

	h.MarkUnreachable()
	if h.Healthy() {
		t.Fatal("healthy right after MarkUnreachable")
	}
	clk.SetTime(start.Add(time.Second))
	h.MarkSync()
	if h.Healthy() {
		t.Fatal("a MarkSync while unreachable made the source healthy")
	}
	if got := h.LastSync(); !got.Equal(start) {
		t.Fatalf("LastSync moved to %v while unreachable; want %v", got, start)
	}
	clk.SetTime(start.Add(2 * time.Second))
	h.Resume()
	if !h.Healthy() {
		t.Fatal("unhealthy right after Resume; Resume marks a sync now")
	}
	if got := h.LastSync(); !got.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("LastSync after Resume = %v, want the resume time", got)
	}
	clk.SetTime(start.Add(3 * time.Second))
	h.MarkSync()
	if got := h.LastSync(); !got.Equal(start.Add(3 * time.Second)) {
		t.Fatal("MarkSync after Resume was ignored")
	}
}

func TestSourceHealthConcurrentUse(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := NewSourceHealth(time.Second, clk)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				switch (i + j) % 5 {
				case 0:
					h.MarkSync()
				case 1:
					h.Healthy()
				case 2:
					h.LastSync()
				case 3:
					clk.Step(time.Millisecond)
				case 4:
					if j%50 == 0 {
						h.MarkUnreachable()
						h.Resume()
					}
				}
			}
		}(i)
	}
	wg.Wait()
	h.MarkSync()
	if !h.Healthy() {
		t.Fatal("unhealthy right after a sync")
	}
}
