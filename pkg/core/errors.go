package core

import (
	"errors"
	"time"
)

// The outcome classes, a closed set in the manner of containerd's errdefs.
// Each package's errors wrap one of them, or are a *Miss; the API edge
// (pkg/fiberd's table, wireClasses) maps each class to one wire answer and
// anything in no class to 500 INTERNAL. A class is named after its wire
// code where it has one of its own:
//
//   - ErrInvalid: a malformed request or value; 400 INVALID.
//   - ErrRequestTooLarge: a request body over the API's cap; 413 INVALID.
//   - ErrRequestTimeout: a request body not received in time; 408 INVALID.
//   - ErrUnauthenticated: a caller without proof: a token that failed
//     verification, or no key or token for the fiber; 401 UNAUTHENTICATED.
//   - ErrNotFound: an unknown fiber, or one of an older epoch; 404
//     NOT_FOUND.
//   - ErrBusy: an operation that cannot proceed now but can once the object
//     is idle; 409 BUSY.
//   - ErrTierGap: a tier the runtime cannot serve; 412 TIER_GAP.
//   - ErrInsufficientStorage: no room for what would be stored, by a bound
//     or the disk; 507 INSUFFICIENT_STORAGE.
//
// Classes returns them. Beside them, ErrUnverifiable and the ledger's
// refusals below are causes of a capacity miss: the caller makes them a
// *Miss (keeping them as its Cause), answered 429 SHED or 503
// DEFERRED_FALLBACK by the miss's code. Packages wrap a class with the
// object's name (fmt.Errorf("grant %q: %w", uid, ErrNotFound)), or name a
// sentinel of their own in one with NewError.
var (
	// ErrInvalid is a malformed request or value: 400 INVALID.
	ErrInvalid = errors.New("invalid")
	// ErrRequestTooLarge is a request whose body is over the API's cap:
	// 413 INVALID. It is the request's size, never a fiber's or an
	// image's (those are ErrInsufficientStorage).
	ErrRequestTooLarge = errors.New("request too large")
	// ErrRequestTimeout is a request whose body did not arrive whole
	// within its deadline: 408 INVALID.
	ErrRequestTimeout = errors.New("request not received in time")
	// ErrUnauthenticated is a caller without proof, 401 UNAUTHENTICATED:
	// a grant token that failed verification (bad signature, algorithm,
	// issuer, audience or claims), or no release key or token of the
	// fiber's grant where one is needed.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrUnverifiable is a grant token that cannot be checked right now
	// because the issuer's keys were never loaded or are older than the
	// allowed staleness. It is a capacity problem (SHED), not a bad token:
	// not a class of its own, the caller makes it a SHED *Miss.
	ErrUnverifiable = errors.New("unverifiable: issuer keys unavailable or stale")
	// ErrNotFound is an unknown fiber, or one of an older epoch: 404
	// NOT_FOUND.
	ErrNotFound = errors.New("not found")
	// ErrBusy is an operation that cannot proceed now but could once the
	// object is idle, such as a park while a connection to the fiber is
	// open or another park of its session is under way: 409 BUSY.
	ErrBusy = errors.New("busy")
	// ErrTierGap is a request for a tier the runtime cannot serve, such as
	// parking a fiber on a tier without checkpoints: 412 TIER_GAP.
	ErrTierGap = errors.New("tier gap")
	// ErrInsufficientStorage is no room for what would be stored: a bound
	// on parked images reached, a fiber larger than the room left, or a
	// full disk: 507 INSUFFICIENT_STORAGE.
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// Classes returns the outcome classes, each once, in a new slice: the
// closed set the API edge maps to the wire. Its order is not a precedence;
// the edge's table has its own.
func Classes() []error {
	return []error{ErrInvalid, ErrRequestTooLarge, ErrRequestTimeout, ErrUnauthenticated,
		ErrNotFound, ErrBusy, ErrTierGap, ErrInsufficientStorage}
}

// NewError returns a new sentinel error that reads msg and is in class:
// errors.Is(err, class) holds, and errors.Is tells it from every other
// error NewError made. It is how a package names an error of its own
// (backend.ErrBusy) without a second wire mapping. class should be one of
// Classes.
func NewError(class error, msg string) error {
	return &classed{msg: msg, class: class}
}

// classed is an error reading msg, in class.
type classed struct {
	msg   string
	class error
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

// The ledger's refusals. Each is a capacity miss at the API edge.
var (
	// ErrNoCapacity is a Clone the ledger cannot serve: unknown, denied or
	// lapsed grant, or one at fibers.max; also a grant whose device
	// request the home's devices cannot meet (DeviceChannel.Fit).
	ErrNoCapacity = errors.New("no capacity")
	// ErrDenied is a grant its lane revoked, refused until the lane
	// delivers it again.
	ErrDenied = errors.New("grant revoked by its lane")
	// ErrStaleCommit is what Commit returns when the grant entry a
	// reservation was made on has been yielded or replaced, or the epoch
	// moved, while the runtime was forking. The caller releases the fiber
	// it made.
	ErrStaleCommit = errors.New("grant entry or epoch changed during the clone")
)

// MissCode says what a caller should do after a capacity miss.
type MissCode string

const (
	// CodeShed asks the caller to back off and retry after RetryAfter.
	CodeShed MissCode = "SHED"
	// CodeDeferredFallback asks the caller to use the platform's normal
	// path for this request.
	CodeDeferredFallback MissCode = "DEFERRED_FALLBACK"
)

// Miss is a refusal for capacity: an unknown or denied grant, one at its
// fibers.max, a lapsed lease, a cold template, the thrash budget, pressure,
// or an unverifiable token. Match it with errors.As.
type Miss struct {
	// Code is SHED or DEFERRED_FALLBACK.
	Code MissCode
	// RetryAfter is the back-off a SHED asks for. Zero lets the API edge
	// pick its default.
	RetryAfter time.Duration
	// Issuer is the control plane that can grant more capacity.
	Issuer string
	// Reason says what was missing, for people.
	Reason string
	// Cause, when set, is the error the miss was made of: Unwrap returns
	// it, so errors.Is(m, ErrDenied) holds for the miss of a revoked grant
	// and the cause's own chain stays whole. Nil for a miss made of a
	// reason alone.
	Cause error
}

// Unwrap returns the miss's Cause.
func (m *Miss) Unwrap() error { return m.Cause }

// Error reads "SHED: at fibers.max (issuer https://...)".
func (m *Miss) Error() string {
	s := string(m.Code) + ": " + m.Reason
	if m.Issuer != "" {
		s += " (issuer " + m.Issuer + ")"
	}
	return s
}

// Shed returns a SHED miss.
func Shed(reason, issuer string, retryAfter time.Duration) *Miss {
	return &Miss{Code: CodeShed, Reason: reason, Issuer: issuer, RetryAfter: retryAfter}
}

// Deferred returns a DEFERRED_FALLBACK miss.
func Deferred(reason, issuer string) *Miss {
	return &Miss{Code: CodeDeferredFallback, Reason: reason, Issuer: issuer}
}

// CapacityMiss picks the code of a capacity miss by the lane's health:
// DEFERRED_FALLBACK while the control plane is healthy, so callers use the
// normal path, and SHED while it is stale, so callers back off rather than
// pile onto a platform that cannot answer either.
func CapacityMiss(healthy bool, reason, issuer string, retryAfter time.Duration) *Miss {
	if healthy {
		return Deferred(reason, issuer)
	}
	return Shed(reason, issuer, retryAfter)
}

// IsMiss reports whether err is or wraps a *Miss, and returns it.
func IsMiss(err error) (*Miss, bool) {
	var m *Miss
	if errors.As(err, &m) {
		return m, true
	}
	return nil, false
}
