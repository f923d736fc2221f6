package pool

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Attempt is one Pod's answer to a Clone the Pool sent it.
type Attempt struct {
	// Pod is the Pod asked.
	Pod Endpoint
	// Err is what it answered: a refusal (*client.Error: a miss, a 429 or
	// a 5xx) or why it gave no answer (a dial or TLS error, a reset, no
	// answer within the attempt's bound).
	Err error
	// Took is how long the attempt took.
	Took time.Duration
}

// Error is a Clone no Pod served: every Pod asked missed, failed or did
// not answer, or the caller's deadline ended first. It unwraps to each
// attempt's error and to Err, so core.IsMiss finds a miss among the
// answers (with its Retry-After) and errors.Is(err,
// context.DeadlineExceeded) tells a deadline that ended the call.
type Error struct {
	// Pool is the pool's "namespace/name".
	Pool string
	// Attempts are the Pods asked, in order.
	Attempts []Attempt
	// Untried counts the Pods left unasked when the deadline ended.
	Untried int
	// Err is the context's error when the deadline (or a cancel) ended
	// the call; nil when every Pod was asked.
	Err error
}

// Error reads "pool ns/p: no grant Pod served the Clone: pod p-0
// (10.0.0.7:8484): 429 SHED: at fibers.max; pod p-1 (10.0.0.8:8484): ...".
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s: no grant Pod served the Clone", e.Pool)
	for i, a := range e.Attempts {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "pod %s (%s): %v", a.Pod.PodName, a.Pod.Addr, a.Err)
	}
	if e.Err != nil {
		if e.Untried > 0 {
			fmt.Fprintf(&b, "; %d more not asked", e.Untried)
		}
		fmt.Fprintf(&b, " (%v)", e.Err)
	}
	return b.String()
}

// Unwrap is every attempt's error, then Err.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, len(e.Attempts)+1)
	for _, a := range e.Attempts {
		out = append(out, a.Err)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// AsError returns the *Error err is or wraps.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}
