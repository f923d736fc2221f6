package core

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestCapacityMissFollowsLaneHealth(t *testing.T) {
	if m := CapacityMiss(true, "at fibers.max", "https://iss", time.Second); m.Code != CodeDeferredFallback {
		t.Fatalf("healthy lane: code %s, want DEFERRED_FALLBACK", m.Code)
	}
	if m := CapacityMiss(false, "at fibers.max", "https://iss", time.Second); m.Code != CodeShed || m.RetryAfter != time.Second {
		t.Fatalf("stale lane: %+v, want SHED with RetryAfter 1s", m)
	}
}

func TestMissIsFoundThroughWrapping(t *testing.T) {
	err := fmt.Errorf("grant %q: %w", "g", Shed("thrash budget", "https://iss", 2*time.Second))
	m, ok := IsMiss(err)
	if !ok || m.Code != CodeShed || m.Issuer != "https://iss" {
		t.Fatalf("IsMiss(%v) = %+v, %v", err, m, ok)
	}
	if got := err.Error(); got != `grant "g": SHED: thrash budget (issuer https://iss)` {
		t.Fatalf("Error() = %q", got)
	}
	if _, ok := IsMiss(fmt.Errorf("x: %w", ErrNotFound)); ok {
		t.Fatal("a not-found error reported as a miss")
	}
}

func TestOutcomeClassesAreDistinct(t *testing.T) {
	classes := []error{ErrInvalid, ErrUnauthenticated, ErrUnverifiable, ErrNotFound, ErrTierGap}
	for i, a := range classes {
		wrapped := fmt.Errorf("fiber %q: %w", "x", a)
		for j, b := range classes {
			if errors.Is(wrapped, b) != (i == j) {
				t.Fatalf("errors.Is(%v, %v) = %v", wrapped, b, i != j)
			}
		}
	}
}

// TestMissKeepsItsCause: a miss made of an error unwraps to it, so its
// class and its own chain stay reachable.
func TestMissKeepsItsCause(t *testing.T) {
	cause := fmt.Errorf("grant %q: %w", "g", ErrDenied)
	m := CapacityMiss(true, cause.Error(), "https://iss", 0)
	m.Cause = cause
	err := fmt.Errorf("clone: %w", m)
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("errors.Is(%v, ErrDenied) = false", err)
	}
	if got, ok := IsMiss(err); !ok || got.Cause != cause {
		t.Fatalf("IsMiss(%v) = %+v, %v", err, got, ok)
	}
	if errors.Is(Deferred("at fibers.max", "https://iss"), ErrDenied) {
		t.Fatal("a miss without a cause matched a class")
	}
}
