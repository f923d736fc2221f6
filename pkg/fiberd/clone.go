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

// clone serves one Clone (docs/architecture.md, A Clone): admitClone
// resolves and verifies the grant and applies the checks every Clone meets;
// then, under the session's gate, serveSession makes one ordered choice:
// attach to the session's running fiber, resume its parked one, or create
// one. authed says whether the caller is authenticated, which
// self-admission needs; who is the connection's caller, whose thrash budget
// a Clone without a token that verifies spends (one with such a token
// spends its grant's: callers.go), be the grant it names admitted or not. A
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
	if err := checkCloneRequest(req); err != nil {
		return api.CloneResponse{}, "", err
	}
	ctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, a.cloneDeadline(req))
	defer cancel()
	c, err := a.admitClone(ctx, req, authed, who)
	if err != nil {
		return api.CloneResponse{}, "", err
	}
	return a.serveSession(ctx, req, c)
}

// checkCloneRequest refuses a Clone request that names no grant, carries
// a payload over api.MaxPayload or a negative deadline (core.ErrInvalid).
func checkCloneRequest(req api.CloneRequest) error {
	switch {
	case req.Grant == "" && req.GrantUID == "":
		return fmt.Errorf("clone names no grant: set grant (a token) or grantUID: %w", core.ErrInvalid)
	case len(req.Payload) > api.MaxPayload:
		return fmt.Errorf("payload of %d bytes is over the limit of %d: %w", len(req.Payload), api.MaxPayload, core.ErrInvalid)
	case req.DeadlineMs < 0:
		return fmt.Errorf("deadlineMs %d is negative: %w", req.DeadlineMs, core.ErrInvalid)
	}
	return nil
}

// cloneDeadline is the Clone's deadline: Config.CloneDeadline, or the
// request's deadlineMs when shorter.
func (a *apiServer) cloneDeadline(req api.CloneRequest) time.Duration {
	d := a.cfg.CloneDeadline
	if asked := time.Duration(req.DeadlineMs) * time.Millisecond; req.DeadlineMs > 0 && asked < d {
		d = asked
	}
	return d
}

// admittedClone is what admitClone found: the grant a Clone is served
// from and what the Clone may do with its sessions.
type admittedClone struct {
	// uid is the grant's UID.
	uid string
	// v is the grant's slot as the Clone found it.
	v slotView
	// owner says the caller owns whatever session it names: the listener
	// vouches for it, or it carries a token of the grant.
	owner bool
}

// admitClone applies the checks every Clone meets before its session is
// touched, in order: the grant token verifies (offering a new grant to its
// slot and waiting, within ctx, for its reconcile), the caller's thrash
// budget, the grant's tier gap, its cgroup's memory pressure (relieved by
// a pressure park when configured), and the template's warmth.
func (a *apiServer) admitClone(ctx context.Context, req api.CloneRequest, authed bool, who caller) (admittedClone, error) {
	uid, token, err := a.resolveGrant(ctx, req, authed)
	if err != nil {
		return admittedClone{}, err
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
		return admittedClone{}, a.errSpent(who)
	}
	var v slotView
	s := a.slotOf(uid)
	if s != nil {
		v = s.view()
	}
	if v.gap != nil {
		return admittedClone{}, v.gap
	}
	if m := a.pressureGate(ctx, s, v, req.Session); m != nil {
		return admittedClone{}, m
	}
	if v.admitted && !(v.warm && v.backend.Warmed(uid)) {
		// Refused before Reserve: a cold template costs no fence.
		cause := fmt.Errorf("grant %q: template not warm", uid)
		if v.err != nil {
			cause = fmt.Errorf("grant %q: template not warm: %w", uid, v.err)
		}
		return admittedClone{}, a.miss(cause)
	}
	return admittedClone{uid: uid, v: v, owner: authed || len(token) > 0}, nil
}

// resolveGrant names the grant a Clone is for and verifies its token:
// the token's grant (which must match grantUID when both are set), offered
// to its slot and reconciled within ctx when new; or grantUID alone. An
// authenticated caller naming the home's own UID gets the home's own
// grant, whatever token it presented (self-admission). token is the token
// verified, nil when none was.
func (a *apiServer) resolveGrant(ctx context.Context, req api.CloneRequest, authed bool) (uid string, token []byte, err error) {
	token = []byte(req.Grant)
	named := req.GrantUID
	if named == "" {
		// A token PeekUID cannot read names nobody; Verify then refuses
		// it as unauthenticated, in its own words.
		named, _ = grant.PeekUID(token)
	}
	if self := a.home.SelfAdmitUID(); self != "" && named == self && authed {
		if own, ok := a.home.OwnGrant(); ok {
			token = own
		}
	}
	if len(token) == 0 {
		return req.GrantUID, nil, nil
	}
	g, err := a.verifier.Verify(ctx, token)
	switch {
	case errors.Is(err, core.ErrUnverifiable):
		// Keys that are missing or stale are the issuer's outage, not a
		// bad token and not a lack of capacity: always back off
		// (docs/architecture.md, The grant token).
		m := core.Shed(err.Error(), a.cfg.Issuer, a.cfg.RetryAfter)
		m.Cause = err
		return "", nil, m
	case err != nil:
		return "", nil, err
	}
	if req.GrantUID != "" && g.UID != req.GrantUID {
		return "", nil, fmt.Errorf("grantUID %q does not match the token's grant %q: %w", req.GrantUID, g.UID, core.ErrInvalid)
	}
	if err := a.offer(ctx, g); err != nil {
		return "", nil, err
	}
	return g.UID, token, nil
}

// serveSession serves an admitted Clone under its session's gate, taken
// within ctx: the session's parked fiber is claimed (with the caller's
// proof, before Reserve mints a fence), a place is reserved, and the Clone
// attaches to the session's running fiber, resumes the parked one, or
// creates one, in that order. A claimed session the Clone does not resume
// is put back.
func (a *apiServer) serveSession(ctx context.Context, req api.CloneRequest, c admittedClone) (api.CloneResponse, string, error) {
	unlock, err := a.ledger.LockSession(ctx, c.uid, req.Session)
	if err != nil {
		return api.CloneResponse{}, "", a.miss(fmt.Errorf("grant %q session %q: another Clone is creating its fiber: %w", c.uid, req.Session, err))
	}
	defer unlock()
	proof := func(key core.Fence) error { return a.sessionProof(req, key) }
	if c.owner {
		proof = nil
	}
	// Under the session's gate no parked session of it appears but by a
	// Clone or park holding the gate: the one claimed here is the one to
	// resume.
	p, err := a.park.claim(c.uid, req.Session, proof)
	if err != nil {
		return api.CloneResponse{}, "", err
	}
	res, attach, err := a.ledger.Reserve(c.uid, req.Session, a.cfg.Clock.Now())
	if p != nil && (err != nil || attach != nil) {
		a.park.put(p)
	}
	switch {
	case err != nil:
		if !c.v.admitted && c.v.err != nil {
			err = fmt.Errorf("%w (%w)", err, c.v.err)
		}
		return api.CloneResponse{}, "", a.miss(err)
	case attach != nil:
		return a.attach(attach, proof)
	case p != nil:
		return a.newFiber(ctx, res, c.v, nil, p)
	}
	return a.newFiber(ctx, res, c.v, req.Payload, nil)
}

// attach answers a Clone with the session's running fiber f, once proof
// (nil for the session's owner) accepts the session's key.
func (a *apiServer) attach(f *core.Fiber, proof func(core.Fence) error) (api.CloneResponse, string, error) {
	key := keyFence(*f)
	if proof != nil {
		if err := proof(key); err != nil {
			return api.CloneResponse{}, "", err
		}
	}
	a.touch(f)
	return api.CloneResponse{FiberID: f.Fence.String(), Endpoint: f.Endpoint, Fence: f.Fence, Kind: api.KindAttach, ReleaseKey: a.keys.key(key)}, api.KindAttach, nil
}

// newFiber makes the fiber of reservation res, resumed from parked or
// created with payload, and answers with its release key: the parked
// session's own, or a new session's first fiber's fence. On failure the
// reservation is cancelled.
func (a *apiServer) newFiber(ctx context.Context, res *core.Reservation, v slotView, payload []byte, parked *parkedSession) (api.CloneResponse, string, error) {
	kind := api.KindCreate
	if parked != nil {
		kind = api.KindResume
	}
	resp, err := a.makeFiber(ctx, res, v, payload, parked)
	if err != nil {
		a.ledger.Cancel(res)
		return api.CloneResponse{}, kind, err
	}
	resp.ReleaseKey = a.keys.key(resp.Fence)
	if parked != nil {
		resp.ReleaseKey = a.keys.key(parked.origin)
	}
	return resp, kind, nil
}

// miss is a capacity miss made of cause, by lane health: DEFERRED_FALLBACK
// while the control plane is healthy, SHED while stale. The miss unwraps
// to cause.
func (a *Agent) miss(cause error) *core.Miss {
	m := core.CapacityMiss(a.home.Health().Healthy(), cause.Error(), a.cfg.Issuer, a.cfg.RetryAfter)
	m.Cause = cause
	return m
}
