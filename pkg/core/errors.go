package core

import (
	"errors"
	"time"
)

// The outcome classes. Packages wrap them with the object's name
// (fmt.Errorf("grant %q: %w", uid, core.ErrNotFound)); only the API layer maps
// them to HTTP status codes: ErrInvalid 400, ErrUnauthenticated 401,
// ErrNotFound 404, ErrTierGap 412, a *Miss 429 (SHED) or 503
// (DEFERRED_FALLBACK), anything else 500.
var (
	// ErrInvalid is a malformed request or value.
	ErrInvalid = errors.New("invalid")
	// ErrUnauthenticated is a grant token that failed verification: bad
	// signature, algorithm, issuer, audience or claims.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrUnverifiable is a grant token that cannot be checked right now
	// because the issuer's keys were never loaded or are older than the
	// allowed staleness. It is a capacity problem (SHED), not a bad token.
	ErrUnverifiable = errors.New("unverifiable: issuer keys unavailable or stale")
	// ErrNotFound is an unknown fiber, or one of an older epoch.
	ErrNotFound = errors.New("not found")
	// ErrTierGap is a request for a tier the runtime cannot serve, such as
	// parking a fiber on a tier without checkpoints.
	ErrTierGap = errors.New("tier gap")
)

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
