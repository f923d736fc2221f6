package fiberd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// clone serves one Clone (docs/architecture.md, A Clone): resolve and verify the grant
// (offering it to its slot and waiting, within the deadline, for its
// reconcile when it is new), the thrash budget, the grant cgroup's memory
// pressure (pressureShed), the template's warmth, then under the session's
// gate attach to a running session or reserve a place, bind the fiber's
// listener, carve its leaf, fork it under the deadline and commit. authed
// says whether the caller is authenticated, which self-admission needs;
// who is the connection's caller, whose thrash budget a Clone without a
// token that verifies spends (one with such a token spends its grant's:
// callers.go), be the grant it names admitted or not. A
// Clone refused before the fork mints no fence. The answer carries the
// fiber's release key (keyFence: its session's, for a fiber with one).
//
// A session is its creator's: a caller that is not authenticated and
// carries no token of the grant attaches to a session's running fiber, or
// resumes its parked one, only with the session's release key
// (sessionProof). Without it the Clone is refused (401) before anything of
// the session is touched: the running fiber is not named (touch), the
// parked one stays parked, and no fence is minted for it.
//
// Errors: core.ErrInvalid (400), core.ErrUnauthenticated (401),
// core.ErrTierGap (412), a *core.Miss (429 SHED / 503 DEFERRED_FALLBACK),
// anything else a runtime fault (500). The deadline passing is a miss,
// whatever the Clone was waiting for.
func (a *apiServer) clone(ctx context.Context, req api.CloneRequest, authed bool, who caller) (api.CloneResponse, string, error) {
	if req.Grant == "" && req.GrantUID == "" {
		return api.CloneResponse{}, "", fmt.Errorf("clone names no grant: set grant (a token) or grantUID: %w", core.ErrInvalid)
	}
	if len(req.Payload) > api.MaxPayload {
		return api.CloneResponse{}, "", fmt.Errorf("payload of %d bytes is over the limit of %d: %w", len(req.Payload), api.MaxPayload, core.ErrInvalid)
	}
	if req.DeadlineMs < 0 {
		return api.CloneResponse{}, "", fmt.Errorf("deadlineMs %d is negative: %w", req.DeadlineMs, core.ErrInvalid)
	}
	deadline := a.cfg.CloneDeadline
	if req.DeadlineMs > 0 && time.Duration(req.DeadlineMs)*time.Millisecond < deadline {
		deadline = time.Duration(req.DeadlineMs) * time.Millisecond
	}
	ctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, deadline)
	defer cancel()

	token := []byte(req.Grant)
	named := req.GrantUID
	if named == "" {
		// A token PeekUID cannot read names nobody; Verify then refuses
		// it as unauthenticated, in its own words.
		named, _ = grant.PeekUID(token)
	}
	// Self-admission: an authenticated caller naming the home's own UID
	// gets the home's own grant, whatever token it presented.
	if self := a.home.SelfAdmitUID(); self != "" && named == self && authed {
		if own, ok := a.home.OwnGrant(); ok {
			token = own
		}
	}

	uid := req.GrantUID
	if len(token) > 0 {
		g, err := a.verifier.Verify(ctx, token)
		switch {
		case errors.Is(err, core.ErrUnverifiable):
			// Keys that are missing or stale are the issuer's outage, not a
			// bad token and not a lack of capacity: always back off
			// (docs/architecture.md, The grant token).
			m := core.Shed(err.Error(), a.cfg.Issuer, a.cfg.RetryAfter)
			m.Cause = err
			return api.CloneResponse{}, "", m
		case err != nil:
			return api.CloneResponse{}, "", err
		}
		if req.GrantUID != "" && g.UID != req.GrantUID {
			return api.CloneResponse{}, "", fmt.Errorf("grantUID %q does not match the token's grant %q: %w", req.GrantUID, g.UID, core.ErrInvalid)
		}
		uid = g.UID
		if err := a.offer(ctx, g); err != nil {
			return api.CloneResponse{}, "", err
		}
	}

	// The thrash budget and pressure are always SHED (docs/architecture.md, Outcomes),
	// whatever the lane's health. The budget is the caller's own: the
	// grant's when a token of it verified, else the connection's, charged
	// before the grant is looked up so that naming one that does not
	// exist costs the caller who named it, and no one else.
	if len(token) > 0 {
		who = caller{kind: callerGrant, id: uid}
	}
	if !a.budgets.allow(who, a.cfg.Clock.Now()) {
		return api.CloneResponse{}, "", a.errSpent(who)
	}
	var v slotView
	s := a.slotOf(uid)
	if s != nil {
		v = s.view()
	}
	if v.gap != nil {
		return api.CloneResponse{}, "", v.gap
	}
	if m := a.pressureShed(ctx, s, v); m != nil && !a.parkForPressure(ctx, s, req.Session) {
		return api.CloneResponse{}, "", m
	}
	if v.admitted && !(v.warm && v.backend.Warmed(uid)) {
		// Refused before Reserve: a cold template costs no fence.
		cause := fmt.Errorf("grant %q: template not warm", uid)
		if v.err != nil {
			cause = fmt.Errorf("grant %q: template not warm: %w", uid, v.err)
		}
		return api.CloneResponse{}, "", a.miss(cause)
	}

	unlock, err := a.ledger.LockSession(ctx, uid, req.Session)
	if err != nil {
		return api.CloneResponse{}, "", a.miss(fmt.Errorf("grant %q session %q: another Clone is creating its fiber: %w", uid, req.Session, err))
	}
	defer unlock()
	// The caller owns whatever session it names when the listener vouches
	// for it or it carries a token of the grant (verified above: uid is
	// the token's, and sessions are the grant's).
	owner := authed || len(token) > 0
	if !owner {
		// Under the session's gate no parked session of it appears but by
		// a Clone or park holding the gate: checked here, before Reserve
		// mints a fence, it is the one park.take takes below, if any.
		if p := a.park.peek(uid, req.Session); p != nil {
			if err := a.sessionProof(req, p.origin); err != nil {
				return api.CloneResponse{}, "", err
			}
		}
	}
	res, attach, err := a.ledger.Reserve(uid, req.Session, a.cfg.Clock.Now())
	if err != nil {
		if !v.admitted && v.err != nil {
			err = fmt.Errorf("%w (%w)", err, v.err)
		}
		return api.CloneResponse{}, "", a.miss(err)
	}
	if attach != nil {
		key := keyFence(*attach)
		if !owner {
			if err := a.sessionProof(req, key); err != nil {
				return api.CloneResponse{}, "", err
			}
		}
		a.touch(attach)
		return api.CloneResponse{FiberID: attach.Fence.String(), Endpoint: attach.Endpoint, Fence: attach.Fence, Kind: api.KindAttach, ReleaseKey: a.keys.key(key)}, api.KindAttach, nil
	}
	if p := a.park.take(uid, req.Session); p != nil {
		if !owner {
			if err := a.sessionProof(req, p.origin); err != nil {
				// Not the one checked before Reserve (see above): never
				// expected, and refused all the same.
				a.park.put(p)
				a.ledger.Cancel(res)
				return api.CloneResponse{}, "", err
			}
		}
		resp, err := a.makeFiber(ctx, res, v, nil, p)
		if err != nil {
			a.ledger.Cancel(res)
			return api.CloneResponse{}, api.KindResume, err
		}
		resp.ReleaseKey = a.keys.key(p.origin)
		return resp, api.KindResume, nil
	}
	resp, err := a.makeFiber(ctx, res, v, req.Payload, nil)
	if err != nil {
		a.ledger.Cancel(res)
		return api.CloneResponse{}, api.KindCreate, err
	}
	resp.ReleaseKey = a.keys.key(resp.Fence) // the session's first fiber: its own fence
	return resp, api.KindCreate, nil
}

// miss is a capacity miss made of cause, by lane health: DEFERRED_FALLBACK
// while the control plane is healthy, SHED while stale. The miss unwraps
// to cause.
func (a *Agent) miss(cause error) *core.Miss {
	m := core.CapacityMiss(a.home.Health().Healthy(), cause.Error(), a.cfg.Issuer, a.cfg.RetryAfter)
	m.Cause = cause
	return m
}
