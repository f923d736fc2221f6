package fiberd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// wireWant is what an error must be answered with.
type wireWant struct {
	status  int
	code    string
	outcome string
	park    string
}

// classWire is the wire answer of each class of core.Classes, written out
// rather than read from wireClasses, so that a changed row fails here.
var classWire = map[error]wireWant{
	core.ErrInvalid:             {400, api.CodeInvalid, outcomeInvalid, parkRefused},
	core.ErrRequestTooLarge:     {413, api.CodeInvalid, outcomeInvalid, parkRefused},
	core.ErrRequestTimeout:      {408, api.CodeInvalid, outcomeInvalid, parkRefused},
	core.ErrUnauthenticated:     {401, api.CodeUnauthenticated, outcomeUnauthenticated, parkRefused},
	core.ErrNotFound:            {404, api.CodeNotFound, outcomeInvalid, parkRefused},
	core.ErrBusy:                {409, api.CodeBusy, outcomeInvalid, parkRefused},
	core.ErrTierGap:             {412, api.CodeTierGap, outcomeTierGap, parkRefused},
	core.ErrInsufficientStorage: {507, api.CodeInsufficientStorage, outcomeInvalid, parkRefused},
}

// wireAnswer runs writeError on err and returns the recorded response, its
// decoded body and the clone outcome.
func wireAnswer(t *testing.T, err error) (*httptest.ResponseRecorder, api.Error, string) {
	t.Helper()
	a := &Agent{cfg: Config{Issuer: "https://iss", RetryAfter: 2 * time.Second}}
	rec := httptest.NewRecorder()
	outcome := a.writeError(rec, err)
	var body api.Error
	if derr := json.Unmarshal(rec.Body.Bytes(), &body); derr != nil {
		t.Fatalf("writeError(%v) wrote %q: %v", err, rec.Body.String(), derr)
	}
	return rec, body, outcome
}

// checkAnswer fails t unless writeError answers err as want, with err's
// message, and its park outcome is want.park.
func checkAnswer(t *testing.T, err error, want wireWant) {
	t.Helper()
	rec, body, outcome := wireAnswer(t, err)
	if rec.Code != want.status || body.Code != want.code || outcome != want.outcome {
		t.Errorf("writeError(%v) = %d %s outcome %s, want %d %s outcome %s", err, rec.Code, body.Code, outcome, want.status, want.code, want.outcome)
	}
	if body.Message != err.Error() {
		t.Errorf("writeError(%v) message %q, want the error's", err, body.Message)
	}
	if got := wireClassOf(err).park; got != want.park {
		t.Errorf("park outcome of %v = %s, want %s", err, got, want.park)
	}
}

// TestWriteErrorAnswersEveryClass: every class of pkg/core, wrapped as a
// package wraps it, is answered its status, code and outcomes; a full
// disk is 507 but a failed park; an error in no class is 500.
func TestWriteErrorAnswersEveryClass(t *testing.T) {
	for _, class := range core.Classes() {
		want, ok := classWire[class]
		if !ok {
			t.Errorf("class %v has no wire answer in this test: add it here and to wireClasses", class)
			continue
		}
		checkAnswer(t, fmt.Errorf("fiber %q: %w", "g/1/2", class), want)
	}
	if len(classWire) != len(core.Classes()) {
		t.Errorf("this test answers %d classes, core has %d", len(classWire), len(core.Classes()))
	}
	checkAnswer(t, fmt.Errorf("criu dump: %w", backend.ErrNoSpace), wireWant{507, api.CodeInsufficientStorage, outcomeInvalid, parkFailed})
	checkAnswer(t, errors.New("criu dump failed (exit status 1)"), wireWant{500, api.CodeInternal, outcomeInternal, parkFailed})
	checkAnswer(t, fmt.Errorf("clone: %w", core.ErrNoCapacity), wireWant{500, api.CodeInternal, outcomeInternal, parkFailed})
}

// TestWriteErrorAnswersAMissFirst: a miss is answered by its code even
// when its cause is in a class, naming the agent's issuer and back-off
// where it names none.
func TestWriteErrorAnswersAMissFirst(t *testing.T) {
	shed := core.Shed("thrash budget", "", 0)
	shed.Cause = fmt.Errorf("grant %q: %w", "g", core.ErrBusy)
	rec, body, outcome := wireAnswer(t, fmt.Errorf("clone: %w", shed))
	if rec.Code != http.StatusTooManyRequests || body.Code != string(core.CodeShed) || outcome != outcomeShed ||
		rec.Header().Get("Retry-After") != "2" || body.RetryAfterSeconds != 2 || body.Issuer != "https://iss" {
		t.Errorf("SHED miss: %d %+v outcome %s Retry-After %q", rec.Code, body, outcome, rec.Header().Get("Retry-After"))
	}
	deferred := core.Deferred("at fibers.max", "https://other")
	deferred.Cause = fmt.Errorf("grant %q: %w", "g", core.ErrNotFound)
	rec, body, outcome = wireAnswer(t, deferred)
	if rec.Code != http.StatusServiceUnavailable || body.Code != string(core.CodeDeferredFallback) || outcome != outcomeDeferred || body.Issuer != "https://other" {
		t.Errorf("DEFERRED_FALLBACK miss: %d %+v outcome %s", rec.Code, body, outcome)
	}
}

// TestPackageErrorsLandInTheirClass: the agent's and the backend's own
// errors are each in exactly their class, and answered as it is.
func TestPackageErrorsLandInTheirClass(t *testing.T) {
	fence := core.Fence{GrantUID: "g", Epoch: 1, Seq: 2}
	for _, c := range []struct {
		name  string
		err   error
		class error
	}{
		{"backend.ErrBusy", backend.ErrBusy, core.ErrBusy},
		{"backend.ErrTooLarge", backend.ErrTooLarge, core.ErrInsufficientStorage},
		{"errBusy", errBusy, core.ErrBusy},
		{"errNoRoom", errNoRoom, core.ErrInsufficientStorage},
		{"errBodyTooLarge", errBodyTooLarge, core.ErrRequestTooLarge},
		{"errBodyTimeout", errBodyTimeout, core.ErrRequestTimeout},
		{"errClosed", errClosed, core.ErrNotFound},
		{"errNotFound", errNotFound(fence), core.ErrNotFound},
		{"tierGap", &tierGap{fence: fence, tier: core.TierWarm}, core.ErrTierGap},
	} {
		err := fmt.Errorf("fiber %s: %w", fence, c.err)
		for _, other := range core.Classes() {
			if errors.Is(err, other) != (other == c.class) {
				t.Errorf("%s: errors.Is(%v, %v) = %v", c.name, err, other, other != c.class)
			}
		}
		checkAnswer(t, err, classWire[c.class])
	}
	// A full disk is in the storage class, and its own row (ahead of the
	// class's) answers it so while counting the park failed.
	if !errors.Is(backend.ErrNoSpace, core.ErrInsufficientStorage) {
		t.Errorf("backend.ErrNoSpace is not in core.ErrInsufficientStorage")
	}
	for _, err := range []error{backend.ErrCold, backend.ErrImageUnusable, errRunTwice, ErrStateInUse} {
		for _, class := range core.Classes() {
			if errors.Is(err, class) {
				t.Errorf("%v is in class %v, want none", err, class)
			}
		}
	}
}

// precedence is the order writeError has always answered an error in two
// classes by, written out so that a reordered wireClasses fails here.
var precedence = []error{core.ErrBusy, backend.ErrNoSpace, core.ErrInsufficientStorage, core.ErrRequestTooLarge,
	core.ErrRequestTimeout, core.ErrInvalid, core.ErrUnauthenticated, core.ErrNotFound, core.ErrTierGap}

// TestWireClassPrecedence: an error in two rows' classes is answered by
// the earlier of them in precedence, whichever it wraps first; and every
// class has exactly one row, backend.ErrNoSpace (a member of a class with a
// park outcome of its own) the one row that is not a class.
func TestWireClassPrecedence(t *testing.T) {
	for i, first := range precedence {
		for _, later := range precedence[i+1:] {
			for _, err := range []error{errors.Join(later, first), errors.Join(first, later)} {
				if got := wireClassOf(err); got.class != first {
					t.Errorf("wireClassOf(%q) = row of %v, want the row of %v", err, got.class, first)
				}
			}
		}
	}
	if len(precedence) != len(wireClasses) {
		t.Errorf("wireClasses has %d rows, precedence %d", len(wireClasses), len(precedence))
	}
	rows := map[error]int{}
	for _, c := range wireClasses {
		rows[c.class]++
	}
	for _, class := range core.Classes() {
		if rows[class] != 1 {
			t.Errorf("class %v has %d rows in wireClasses, want 1", class, rows[class])
		}
		delete(rows, class)
	}
	if len(rows) != 1 || rows[backend.ErrNoSpace] != 1 {
		t.Errorf("rows of no class: %v, want only backend.ErrNoSpace", rows)
	}
	// The precedences the API depends on, in wire terms.
	busyAndGone := fmt.Errorf("%w: %w", errBusy, core.ErrNotFound)
	checkAnswer(t, busyAndGone, classWire[core.ErrBusy])
	fullAndTooLarge := fmt.Errorf("%w: %w", backend.ErrTooLarge, backend.ErrNoSpace)
	checkAnswer(t, fullAndTooLarge, wireWant{507, api.CodeInsufficientStorage, outcomeInvalid, parkFailed})
	bodyAndInvalid := fmt.Errorf("%w: %w", core.ErrInvalid, errBodyTooLarge)
	checkAnswer(t, bodyAndInvalid, classWire[core.ErrRequestTooLarge])
}

// TestParkedCountsByClass: fiberd_parks_total counts a park by its
// error's row: refused while the fiber runs on, failed for a fault or a
// full disk, parked without an error.
func TestParkedCountsByClass(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := &parkMetrics{
		parks:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fiberd_parks_total"}, []string{"by", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fiberd_park_duration_seconds"}, []string{"by"}),
	}
	reg.MustRegister(m.parks, m.duration)
	for _, err := range []error{nil, errBusy, backend.ErrBusy, errNoRoom, backend.ErrTooLarge, &tierGap{tier: core.TierWarm}, errClosed,
		fmt.Errorf("no session: %w", core.ErrInvalid), backend.ErrNoSpace, errors.New("criu dump failed")} {
		m.parked(parkByAPI, err, time.Millisecond)
	}
	want := map[string]float64{parkParked: 1, parkRefused: 7, parkFailed: 2}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fiberd_parks_total" {
			continue
		}
		for _, c := range mf.GetMetric() {
			for _, l := range c.GetLabel() {
				if l.GetName() == "outcome" {
					got[l.GetValue()] += c.GetCounter().GetValue()
				}
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("fiberd_parks_total{outcome=%q} = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
