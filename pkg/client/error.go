package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// Error is a refusal from the agent: the HTTP status and the api.Error body
// it came with. A body that was not an api.Error (a proxy's page, say) is
// kept, shortened, as Body.Message with an empty Body.Code.
//
// It unwraps to the pkg/core outcome class of its code: a *core.Miss for
// SHED and DEFERRED_FALLBACK, core.ErrInvalid, core.ErrUnauthenticated,
// core.ErrNotFound or core.ErrTierGap; other codes unwrap to nothing.
type Error struct {
	// Status is the HTTP status code, such as 429 or 404.
	Status int
	// Body is the error body. RetryAfterSeconds is filled from the
	// Retry-After header when the body lacks it.
	Body api.Error
}

// Error reads "429 SHED: at fibers.max (issuer https://...)".
func (e *Error) Error() string {
	s := strconv.Itoa(e.Status)
	if e.Body.Code != "" {
		s += " " + e.Body.Code
	}
	if e.Body.Message != "" {
		s += ": " + e.Body.Message
	}
	if e.Body.Issuer != "" {
		s += " (issuer " + e.Body.Issuer + ")"
	}
	if e.Body.RetryAfterSeconds > 0 {
		s += fmt.Sprintf(" (retry after %ds)", e.Body.RetryAfterSeconds)
	}
	return s
}

// Unwrap is the pkg/core class of the error's code, nil for none.
func (e *Error) Unwrap() error {
	if m := e.Miss(); m != nil {
		return m
	}
	switch e.Body.Code {
	case api.CodeInvalid:
		return core.ErrInvalid
	case api.CodeUnauthenticated:
		return core.ErrUnauthenticated
	case api.CodeNotFound:
		return core.ErrNotFound
	case api.CodeTierGap:
		return core.ErrTierGap
	}
	return nil
}

// Miss is the capacity miss the error carries, nil when it is not one.
func (e *Error) Miss() *core.Miss {
	switch core.MissCode(e.Body.Code) {
	case core.CodeShed, core.CodeDeferredFallback:
		return &core.Miss{
			Code:       core.MissCode(e.Body.Code),
			RetryAfter: e.RetryAfter(),
			Issuer:     e.Body.Issuer,
			Reason:     e.Body.Message,
		}
	}
	return nil
}

// IsMiss reports whether the error is a capacity miss (SHED or
// DEFERRED_FALLBACK).
func (e *Error) IsMiss() bool { return e.Miss() != nil }

// IsShed reports whether the error is a SHED miss: back off for
// RetryAfter, then retry.
func (e *Error) IsShed() bool { return e.Body.Code == string(core.CodeShed) }

// IsDeferred reports whether the error is a DEFERRED_FALLBACK miss: use
// the platform's normal path for this request.
func (e *Error) IsDeferred() bool { return e.Body.Code == string(core.CodeDeferredFallback) }

// IsNotFound reports whether the fiber is unknown or of an older epoch.
func (e *Error) IsNotFound() bool { return e.Status == http.StatusNotFound }

// RetryAfter is the back-off a SHED asks for, zero when none was given.
func (e *Error) RetryAfter() time.Duration {
	return time.Duration(e.Body.RetryAfterSeconds) * time.Second
}

// AsError returns the *Error err is or wraps.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// readError builds the *Error of a response that is not 200, reading at
// most maxResponseBody bytes of its body.
func readError(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err := json.Unmarshal(raw, &e.Body); err != nil || e.Body.Code == "" {
		e.Body = api.Error{Message: shorten(strings.TrimSpace(string(raw)))}
		if e.Body.Message == "" {
			e.Body.Message = http.StatusText(resp.StatusCode)
		}
	}
	if e.Body.RetryAfterSeconds == 0 {
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
			e.Body.RetryAfterSeconds = n
		}
	}
	return e
}

func shorten(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return s[:maxErrorText] + "..."
}
