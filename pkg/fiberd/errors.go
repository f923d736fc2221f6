package fiberd

import (
	"errors"

	"fiberd.io/fiberd/pkg/core"
)

// ErrStateInUse is what New's error wraps (and CheckStateDir's) when
// another process, another agent, holds the state directory's lock: the
// error names the directory and the pid that process wrote in the lock
// file. cmd/fiberd exits 2 for it, as for a bad flag: a second agent needs
// a -state of its own.
var ErrStateInUse = errors.New("state directory in use by another agent")

// The agent's own errors. Everything else it returns wraps a class of
// pkg/core (core.ErrInvalid, ErrUnauthenticated, ErrNotFound, ErrTierGap)
// or is a *core.Miss, keeping its cause: writeError maps them to the wire,
// the one place that does.
var (
	// errTooLarge is a request body over api.MaxRequestBody: 413.
	errTooLarge = errors.New("request body too large")
	// errRunTwice is Run called a second time, or after Close.
	errRunTwice = errors.New("fiberd: Run called twice or after Close")
)

// tierGap is a park on a tier without checkpoints; why, when set, says
// what is missing.
type tierGap struct {
	fence core.Fence
	tier  core.Tier
	why   error
}

func (e *tierGap) Error() string {
	msg := "fiber " + e.fence.String() + " runs at tier " + string(e.tier) + ", which cannot park: no CHECKPOINT tier on this home"
	if e.why != nil {
		msg = "fiber " + e.fence.String() + " runs at tier " + string(e.tier) + ", which cannot park: " + e.why.Error()
	}
	return msg
}

func (e *tierGap) Unwrap() error { return core.ErrTierGap }

// errNotFound is fiber f, not running (any more): 404.
func errNotFound(f core.Fence) error {
	return &wrapped{msg: "fiber " + f.String() + ": not running", err: core.ErrNotFound}
}

// wrapped is an error of msg in class err.
type wrapped struct {
	msg string
	err error
}

func (e *wrapped) Error() string { return e.msg + ": " + e.err.Error() }
func (e *wrapped) Unwrap() error { return e.err }
