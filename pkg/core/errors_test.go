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

// TestClassesAreAClosedDistinctSet: each class is listed once, an error
// wrapping one is in no other, and the causes of a miss are in none.
func TestClassesAreAClosedDistinctSet(t *testing.T) {
	classes := Classes()
	if len(classes) != 8 {
		t.Fatalf("Classes() has %d classes, want 8: a new class needs its row in pkg/fiberd's wireClasses and this count", len(classes))
	}
	for i, a := range classes {
		wrapped := fmt.Errorf("fiber %q: %w", "x", a)
		for j, b := range classes {
			if errors.Is(wrapped, b) != (i == j) {
				t.Fatalf("errors.Is(%v, %v) = %v", wrapped, b, i != j)
			}
		}
	}
	for _, cause := range []error{ErrUnverifiable, ErrNoCapacity, ErrDenied, ErrStaleCommit} {
		for _, c := range classes {
			if errors.Is(cause, c) {
				t.Errorf("miss cause %v is in class %v", cause, c)
			}
		}
	}
	classes[0] = nil
	if Classes()[0] == nil {
		t.Fatal("Classes returned its own slice: a caller changed the set")
	}
}

// TestNewErrorIsInItsClassAndItself: a sentinel NewError makes reads its
// message, is in its class and no other, and is told from another
// sentinel of the same class and message.
func TestNewErrorIsInItsClassAndItself(t *testing.T) {
	a := NewError(ErrBusy, "fiber busy")
	b := NewError(ErrBusy, "fiber busy")
	err := fmt.Errorf("park: %w", a)
	if a.Error() != "fiber busy" || err.Error() != "park: fiber busy" {
		t.Fatalf("messages %q, %q", a.Error(), err.Error())
	}
	if !errors.Is(err, a) || !errors.Is(err, ErrBusy) {
		t.Fatalf("errors.Is(%v, itself or ErrBusy) = false", err)
	}
	if errors.Is(err, b) || errors.Is(b, a) {
		t.Fatal("two sentinels of one class and message matched each other")
	}
	for _, c := range Classes() {
		if c != ErrBusy && errors.Is(err, c) {
			t.Fatalf("%v is in class %v too", err, c)
		}
	}
}
