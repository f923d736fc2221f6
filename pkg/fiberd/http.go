package fiberd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// apiHandler is the HTTP API (docs/api.md), served on the TCP
// listener and the unix socket alike. Run calls it once: it draws the
// secret of the fibers' release keys.
func (a *Agent) apiHandler() http.Handler {
	s := &apiServer{Agent: a, keys: newReleaseKeys(), budgets: newBudgets(a.cfg.ThrashRate, a.cfg.ThrashBurst, maxBudgets)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/clone", s.handleClone)
	mux.HandleFunc("POST /v1/release", s.handleRelease)
	mux.HandleFunc("POST /v1/park", s.handlePark)
	mux.HandleFunc("GET /v1/status", s.handleStatus)
	mux.HandleFunc("GET /v1/watch", s.handleWatch)
	mux.HandleFunc("GET /healthz", a.handleHealthz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.cfg.Registry, promhttp.HandlerOpts{}))
	return mux
}

// apiServer is the API's handlers: the agent, the release keys its
// Clones hand out and its releases check (guard.go), and each caller's
// thrash budget and watch streams (callers.go).
type apiServer struct {
	*Agent
	keys    *releaseKeys
	budgets *budgets
	watches watchers
}

func (a *apiServer) handleClone(w http.ResponseWriter, r *http.Request) {
	start := a.cfg.Clock.Now()
	kind, outcome := "none", outcomeInvalid
	defer func() {
		a.metrics.clones.WithLabelValues(kind, outcome).Inc()
		a.metrics.latency.WithLabelValues(kind, outcome).Observe(a.cfg.Clock.Since(start).Seconds())
	}()
	var req api.CloneRequest
	if err := a.decode(w, r, &req); err != nil {
		a.writeError(w, err)
		return
	}
	if err := checkClone(req); err != nil {
		a.writeError(w, err)
		return
	}
	resp, k, err := a.clone(r.Context(), req, authenticated(r), callerOf(r))
	if err != nil {
		outcome = a.writeError(w, err)
		if m, ok := core.IsMiss(err); ok {
			a.log.V(1).Info("Clone missed", "code", m.Code, "reason", m.Reason)
		} else if outcome == outcomeInternal {
			a.log.Error(err, "Clone failed")
		}
		return
	}
	kind, outcome = k, outcomeServed
	writeJSON(w, http.StatusOK, resp)
}

func (a *apiServer) handleRelease(w http.ResponseWriter, r *http.Request) {
	req, fence, authed, err := a.fiberRequest(w, r)
	if err != nil {
		a.writeError(w, err)
		return
	}
	f, err := a.lookupFiber(r.Context(), req, fence, authed)
	if errors.Is(err, core.ErrNotFound) {
		// A parked session's fiber id: its release deletes the image.
		if perr := a.releaseParked(r.Context(), req, fence, authed); !errors.Is(perr, core.ErrNotFound) {
			if perr != nil {
				a.writeError(w, perr)
				return
			}
			writeJSON(w, http.StatusOK, api.FiberRequest{FiberID: fence.String()})
			return
		}
	}
	if err != nil {
		a.writeError(w, err)
		return
	}
	fiber, ok := a.ledger.Remove(f.Fence)
	if !ok { // exited or released meanwhile
		a.writeError(w, errNotFound(f.Fence))
		return
	}
	a.releaseFiber(r.Context(), fiber)
	a.notify()
	writeJSON(w, http.StatusOK, api.FiberRequest{FiberID: f.Fence.String()})
}

// fiberOf decodes a FiberRequest, looks its fiber up and checks the caller
// may end it (authorizeFiber): 400 for a malformed id, 401 for an
// unauthenticated caller without the fiber's release key or grant token,
// 404 for a fiber unknown or of an older epoch.
func (a *apiServer) fiberOf(w http.ResponseWriter, r *http.Request) (core.Fiber, error) {
	req, fence, authed, err := a.fiberRequest(w, r)
	if err != nil {
		return core.Fiber{}, err
	}
	return a.lookupFiber(r.Context(), req, fence, authed)
}

// fiberRequest decodes a FiberRequest and parses its fiber id: 400 for a
// malformed id, 401 for an unauthenticated caller that presents no proof
// at all.
func (a *apiServer) fiberRequest(w http.ResponseWriter, r *http.Request) (req api.FiberRequest, fence core.Fence, authed bool, err error) {
	if err = a.decode(w, r, &req); err != nil {
		return req, fence, false, err
	}
	if fence, err = parseFiberID(req.FiberID); err != nil {
		return req, fence, false, err
	}
	authed = authenticated(r)
	if !authed && req.ReleaseKey == "" && req.Grant == "" {
		return req, fence, authed, fmt.Errorf("fiber %s: %v: %w", fence, errNoProof, core.ErrUnauthenticated)
	}
	return req, fence, authed, nil
}

// lookupFiber looks running fiber fence up and checks the caller may end
// it: 404 for a fiber unknown or of an older epoch, 401 without its proof.
func (a *apiServer) lookupFiber(ctx context.Context, req api.FiberRequest, fence core.Fence, authed bool) (core.Fiber, error) {
	f, err := a.ledger.Lookup(fence)
	if err != nil {
		return core.Fiber{}, err
	}
	if err := a.authorizeFiber(ctx, authed, req, fence, keyFence(f)); err != nil {
		return core.Fiber{}, err
	}
	return f, nil
}

func (a *apiServer) handleStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.statusFor(r))
}

// statusFor is the status as the caller of r may see it: whole when
// authenticated, redacted otherwise.
func (a *apiServer) statusFor(r *http.Request) api.Status {
	if authenticated(r) {
		return a.status()
	}
	return redact(a.status())
}

// handleWatch streams the status as newline-delimited JSON: one line now
// and one per change, until the client goes away or the agent stops. With
// nothing new for Limits.WatchKeepAlive it writes an empty line. Each line
// must be written within Limits.WriteTimeout; the stream itself has no
// deadline. A caller (callers.go) holds at most Limits.MaxWatches streams
// open: one more is SHED.
func (a *apiServer) handleWatch(w http.ResponseWriter, r *http.Request) {
	lim := a.cfg.Limits
	who := callerOf(r)
	done, ok := a.watches.add(who, lim.MaxWatches)
	if !ok {
		a.log.V(1).Info("Watch refused", "caller", who.String(), "max", lim.MaxWatches)
		a.writeError(w, a.errTooManyWatches(who, lim.MaxWatches))
		return
	}
	defer done()
	rc := http.NewResponseController(w)
	// No body to wait for; the stream stays open as long as both sides do.
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	keepAlive := a.cfg.Clock.NewTicker(lim.WatchKeepAlive)
	defer keepAlive.Stop()
	var last []byte
	for {
		changed := a.changes()
		b, err := json.Marshal(a.statusFor(r))
		if err != nil {
			return
		}
		var line []byte
		if !bytes.Equal(b, last) {
			line, last = append(b, '\n'), b
		}
		if line != nil && !writeLine(rc, w, line, lim.WriteTimeout) {
			return
		}
		select {
		case <-changed:
		case <-keepAlive.C():
			if !writeLine(rc, w, []byte("\n"), lim.WriteTimeout) {
				return
			}
		case <-r.Context().Done():
			return
		case <-a.stopping:
			return
		}
	}
}

// writeLine writes and flushes one line of a stream within timeout; false
// when the client did not take it.
func writeLine(rc *http.ResponseController, w http.ResponseWriter, line []byte, timeout time.Duration) bool {
	_ = rc.SetWriteDeadline(wallDeadline(timeout))
	if _, err := w.Write(line); err != nil {
		return false
	}
	return rc.Flush() == nil
}

func (a *Agent) handleHealthz(w http.ResponseWriter, r *http.Request) {
	select {
	case <-a.stopping:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ok": false, "reason": "stopping"})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "epoch": a.ledger.Epoch()})
	}
}

// status is the agent's view for GET /v1/status and /v1/watch.
func (a *Agent) status() api.Status {
	h := a.home.Health()
	st := api.Status{
		Home:   a.home.Name(),
		Epoch:  a.ledger.Epoch(),
		Lane:   api.Lane{Healthy: h.Healthy(), LastSync: h.LastSync()},
		Ready:  a.home.Ready(),
		Scope:  a.home.Scope(),
		Grants: []api.GrantStatus{},

		Checkpoint: a.checkpointStatus(),
		// Isolation in the status: isolation.go.
		Isolation:    a.isolationStatus(),
		MinIsolation: a.minIsolationStatus(),
		Limits:       a.limitsStatus(),
	}
	for _, gs := range a.ledger.Snapshot() {
		g := gs.Grant
		out := api.GrantStatus{
			UID: g.UID, Template: g.Template, Running: len(gs.Running),
			Max: g.Fibers.Max, LeaseExpiry: g.Expiry,
		}
		if s := a.slotOf(g.UID); s != nil {
			s.status(&out)
			if v := s.view(); v.admitted && v.backend != nil {
				// CHECKPOINT where the WARM backend can park its fibers.
				out.Tier = a.tierOf(v.backend, g.UID)
			}
		}
		a.parkStatus(g.UID, &out)
		if gs.LastSeq > 0 {
			out.LatestFence = &core.Fence{GrantUID: g.UID, Epoch: st.Epoch, Seq: gs.LastSeq}
		}
		for _, f := range gs.Running {
			out.Fibers = append(out.Fibers, api.FiberStatus{FiberID: f.Fence.String(), Session: f.Session, Endpoint: f.Endpoint, Isolation: fiberIsolation(f)})
		}
		st.Grants = append(st.Grants, out)
	}
	return st
}

// decode reads a capped body and decodes it strictly into v.
func (a *Agent) decode(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := readBody(w, r)
	if err != nil {
		return err
	}
	return decodeStrict(b, v)
}

// writeError answers err, the one place errors become HTTP, and returns
// its clone outcome. A *core.Miss is answered first, by its code: 429 for
// SHED, with Retry-After (the miss's, else Config.RetryAfter, at least one
// second), or 503 for DEFERRED_FALLBACK, both naming the issuer (the
// miss's, else Config.Issuer). Any other error is answered by its row of
// wireClasses, the first its class matches, with its message; one in no
// class is 500 INTERNAL.
func (a *Agent) writeError(w http.ResponseWriter, err error) string {
	if m, ok := core.IsMiss(err); ok {
		return a.writeMiss(w, m)
	}
	c := wireClassOf(err)
	writeJSON(w, c.status, api.Error{Code: c.code, Message: err.Error()})
	return c.outcome
}

// writeMiss answers capacity miss m (see writeError) and returns its
// clone outcome.
func (a *Agent) writeMiss(w http.ResponseWriter, m *core.Miss) string {
	body := api.Error{Code: string(m.Code), Message: m.Reason, Issuer: m.Issuer}
	if body.Issuer == "" {
		body.Issuer = a.cfg.Issuer
	}
	if m.Code != core.CodeShed {
		writeJSON(w, http.StatusServiceUnavailable, body)
		return outcomeDeferred
	}
	ra := m.RetryAfter
	if ra <= 0 {
		ra = a.cfg.RetryAfter
	}
	secs := int(math.Ceil(ra.Seconds()))
	if secs < 1 {
		secs = 1
	}
	body.RetryAfterSeconds = secs
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeJSON(w, http.StatusTooManyRequests, body)
	return outcomeShed
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
