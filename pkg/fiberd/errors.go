package fiberd

import (
	"errors"
	"net/http"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// ErrStateInUse is what New's error wraps (and CheckStateDir's) when
// another process, another agent, holds the state directory's lock: the
// error names the directory and the pid that process wrote in the lock
// file. cmd/fiberd exits 2 for it, as for a bad flag: a second agent needs
// a -state of its own.
var ErrStateInUse = errors.New("state directory in use by another agent")

// The agent's own errors. Everything else it returns wraps a class of
// pkg/core (core.Classes) or is a *core.Miss, keeping its cause: writeError
// maps them to the wire through wireClasses, the one place that does.
var (
	// errBodyTooLarge is a request body over api.MaxRequestBody: 413.
	errBodyTooLarge = core.NewError(core.ErrRequestTooLarge, "request body too large")
	// errBodyTimeout is a request body not read whole within
	// Limits.BodyTimeout: 408.
	errBodyTimeout = core.NewError(core.ErrRequestTimeout, "request body not received in time")
	// errRunTwice is Run called a second time, or after Close.
	errRunTwice = errors.New("fiberd: Run called twice or after Close")
)

// wireClass is how the errors of one class are answered: the HTTP status
// and api.Error code, the outcome label of fiberd_clones_total, and that
// of fiberd_parks_total for a park that ended so.
type wireClass struct {
	// class selects the row: errors.Is(err, class).
	class   error
	status  int
	code    string
	outcome string
	park    string
}

// wireClasses maps the classes of pkg/core to the wire, one row each, and
// is read top to bottom: an error in two classes takes the first row that
// matches, so the order is the precedence (TestWireClassPrecedence holds
// it). A *core.Miss is not here: writeError answers it first, by its code.
// An error in no row is wireInternal. backend.ErrNoSpace, in the class
// core.ErrInsufficientStorage, has a row of its own ahead of the class's: a
// full disk is answered as no room but counts as a failed park, not a
// refused one.
var wireClasses = []wireClass{
	{core.ErrBusy, http.StatusConflict, api.CodeBusy, outcomeInvalid, parkRefused},
	{backend.ErrNoSpace, http.StatusInsufficientStorage, api.CodeInsufficientStorage, outcomeInvalid, parkFailed},
	{core.ErrInsufficientStorage, http.StatusInsufficientStorage, api.CodeInsufficientStorage, outcomeInvalid, parkRefused},
	{core.ErrRequestTooLarge, http.StatusRequestEntityTooLarge, api.CodeInvalid, outcomeInvalid, parkRefused},
	{core.ErrRequestTimeout, http.StatusRequestTimeout, api.CodeInvalid, outcomeInvalid, parkRefused},
	{core.ErrInvalid, http.StatusBadRequest, api.CodeInvalid, outcomeInvalid, parkRefused},
	{core.ErrUnauthenticated, http.StatusUnauthorized, api.CodeUnauthenticated, outcomeUnauthenticated, parkRefused},
	{core.ErrNotFound, http.StatusNotFound, api.CodeNotFound, outcomeInvalid, parkRefused},
	{core.ErrTierGap, http.StatusPreconditionFailed, api.CodeTierGap, outcomeTierGap, parkRefused},
}

// wireInternal answers an error in no class: a fault, 500 INTERNAL.
var wireInternal = wireClass{status: http.StatusInternalServerError, code: api.CodeInternal, outcome: outcomeInternal, park: parkFailed}

// wireClassOf returns the first row of wireClasses whose class err is in,
// or wireInternal. It does not look for a *core.Miss.
func wireClassOf(err error) wireClass {
	for _, c := range wireClasses {
		if errors.Is(err, c.class) {
			return c
		}
	}
	return wireInternal
}

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
