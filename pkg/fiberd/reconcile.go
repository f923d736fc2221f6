package fiberd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// reconcile brings grant uid's slot to what is wanted, and is the only code
// that changes what is: it verifies a token the lane delivered (lifting the
// grant's revocation), lifts a revocation that has ended, yields a grant
// that should not run (revoked, lease ended, nothing wants it), admits a
// wanted grant in the ledger (or renews its lease), and warms its template
// with the home's devices in its cgroup, publishing readiness. The work
// queue runs it, one at a time per UID; it returns when to run again: at
// the lease's or the revocation's end, or after a back-off when the
// template did not warm.
//
// No lock is held while it verifies, resolves, warms or yields. An event
// that makes its work moot (a revocation) cancels its ctx; a yield runs to
// its end on a context of its own (drainTimeout).
func (a *Agent) reconcile(ctx context.Context, uid string) result {
	s := a.slotOf(uid)
	if s == nil {
		return result{}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.cancel = cancel
	gen := s.gen
	token := s.delivered
	s.delivered = nil
	s.mu.Unlock()

	res, err := a.reconcileSlot(ctx, s, token)

	s.mu.Lock()
	s.cancel = nil
	interrupted := ctx.Err() != nil && s.gen != gen
	if !interrupted {
		s.err = err
	}
	if gen > s.applied {
		s.applied = gen
	}
	s.wakeLocked()
	s.mu.Unlock()
	a.notify()
	if interrupted {
		// An event cancelled this run; the run it queued does the rest.
		return result{}
	}
	a.dropIfIdle(s)
	return res
}

// reconcileSlot is reconcile's work. It returns what the queue should do
// and the error to record on the slot (nil once what is wanted is reached).
func (a *Agent) reconcileSlot(ctx context.Context, s *slot, token []byte) (result, error) {
	uid := s.uid
	if err := a.takeDelivered(ctx, s, token); err != nil {
		return result{err: err}, err
	}

	now := a.cfg.Clock.Now()
	var wake time.Duration // when to run again, 0 for no need
	soonest := func(d time.Duration) {
		if d > 0 && (wake == 0 || d < wake) {
			wake = d
		}
	}
	if until, ok := a.ledger.DeniedUntil(uid); ok {
		if now.Before(until) {
			soonest(until.Sub(now))
		} else {
			a.lift(uid, "revocation expired")
		}
	}

	s.mu.Lock()
	want := s.want
	var why error
	if want != nil && want.Expired(now) {
		why = fmt.Errorf("grant %q lease ended at %s: %w", uid, want.Expiry.UTC().Format(time.RFC3339), core.ErrNoCapacity)
		s.want, want = nil, nil
	}
	if s.gap != nil && !now.Before(s.gapUntil) {
		s.gap = nil
	}
	if s.gap != nil {
		soonest(s.gapUntil.Sub(now))
	}
	admitted, cur := s.admitted, s.grant
	s.mu.Unlock()

	if a.ledger.Denied(uid) {
		why = fmt.Errorf("grant %q: %w", uid, core.ErrDenied)
		want = nil
	}
	if want == nil {
		if admitted {
			reason := "not wanted"
			if why != nil {
				reason = why.Error()
			}
			a.yield(ctx, s, reason)
		}
		return result{after: wake}, why
	}

	if admitted && (cur.Template != want.Template || cur.MinTier != want.MinTier) {
		a.yield(ctx, s, "template or tier changed")
		admitted = false
	}
	if !admitted {
		if err := a.admit(s, *want); err != nil {
			return result{after: wake}, err
		}
	} else if !bytes.Equal(cur.Token, want.Token) {
		if err := a.renew(s, cur, *want); err != nil {
			return result{after: wake}, err
		}
	}
	soonest(want.Expiry.Sub(now))

	err := a.ensureWarm(ctx, s)
	if err == nil {
		err = a.parkFloor(s)
	}
	if err != nil {
		if errors.Is(err, core.ErrTierGap) {
			a.yield(ctx, s, "tier gap")
			s.mu.Lock()
			s.gap, s.gapUntil, s.want = err, want.Expiry, nil
			s.mu.Unlock()
			return result{after: wake}, err
		}
		if ctx.Err() != nil {
			return result{}, err
		}
		return result{err: err}, err
	}
	return result{after: wake}, nil
}

// takeDelivered verifies token, when the lane delivered one for s
// (acceptDelivered). A token refused is logged and forgotten; one that
// cannot be verified yet (the issuer's keys are missing or stale) is kept
// to verify again later, unless a newer token came meanwhile, and its
// error returned so the queue retries.
func (a *Agent) takeDelivered(ctx context.Context, s *slot, token []byte) error {
	if token == nil {
		return nil
	}
	err := a.acceptDelivered(ctx, s, token)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, core.ErrUnverifiable):
		s.mu.Lock()
		if s.delivered == nil {
			s.delivered = token
		}
		s.mu.Unlock()
		a.log.Info("Cannot verify a delivered grant yet; retrying", "grant", s.uid, "reason", err.Error())
		return err
	}
	a.log.Error(err, "Refused a delivered grant", "grant", s.uid)
	return nil
}

// renew admits want, a new token of admitted grant cur with the same
// template and tier, in place: its fibers and sequence stay. A change of
// fibers.warm or fibers.max reaches the backend's spares.
func (a *Agent) renew(s *slot, cur, want core.Grant) error {
	if _, err := a.ledger.Admit(want); err != nil {
		return err
	}
	s.mu.Lock()
	s.grant = want
	b := s.backend
	s.mu.Unlock()
	a.log.V(1).Info("Grant renewed", "grant", s.uid, "expiry", want.Expiry)
	if sp, ok := b.(backend.Sparer); ok && cur.Fibers != want.Fibers {
		// A zygote warmed later starts from the renewed grant.
		sp.SetSpares(s.uid, want.Fibers.Warm, want.Fibers.Max)
		a.log.V(1).Info("Grant's spares changed", "grant", s.uid, "warm", want.Fibers.Warm, "max", want.Fibers.Max)
	}
	return nil
}

// acceptDelivered verifies a token the lane delivered for s. A good one
// lifts the grant's revocation (the lane delivering it again is the
// authority) and becomes what is wanted, unless a newer delivery came
// meanwhile. It fails with the verifier's error, or core.ErrInvalid when
// the token is of another grant than the lane's file said.
func (a *Agent) acceptDelivered(ctx context.Context, s *slot, token []byte) error {
	g, err := a.verifier.Verify(ctx, token)
	if err != nil {
		return fmt.Errorf("grant %q: %w", s.uid, err)
	}
	if g.UID != s.uid {
		return fmt.Errorf("grant %q: the delivered token is of grant %q: %w", s.uid, g.UID, core.ErrInvalid)
	}
	a.lift(s.uid, "delivered by the lane")
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Expiry.After(s.latestExpiry) {
		s.latestExpiry = g.Expiry
	}
	if s.delivered == nil {
		s.want = &g
		s.gap = nil
	}
	return nil
}

// lift ends uid's revocation in the ledger, which persists it in the state
// directory.
func (a *Agent) lift(uid, reason string) {
	was, err := a.ledger.Lift(uid)
	if err != nil {
		a.log.Error(err, "Persisting the end of a revocation", "grant", uid)
	}
	if was {
		a.log.Info("Revocation lifted", "grant", uid, "reason", reason)
	}
}

// admit admits grant g in the ledger for slot s: it resolves g's template
// and picks its backend. It fails with an error wrapping core.ErrInvalid
// for a template the node does not hold, core.ErrTierGap when no backend
// reaches g.MinTier (recorded on the slot as its gap), and core.ErrDenied
// when the grant was revoked meanwhile.
func (a *Agent) admit(s *slot, g core.Grant) error {
	spec, err := a.templates.Resolve(g.Template)
	if err != nil {
		return fmt.Errorf("grant %q: %w", g.UID, err)
	}
	b, err := a.pick(g, spec)
	if err != nil {
		s.mu.Lock()
		s.gap, s.gapUntil, s.want = err, g.Expiry, nil
		s.mu.Unlock()
		return err
	}
	if _, err := a.ledger.Admit(g); err != nil {
		return err
	}
	a.park.open(g.UID, g.Template)
	s.mu.Lock()
	s.admitted, s.grant, s.spec, s.backend, s.gap = true, g, spec, b, nil
	s.mu.Unlock()
	a.log.Info("Grant admitted", "grant", g.UID, "template", g.Template, "max", g.Fibers.Max, "tier", b.Tier(), "expiry", g.Expiry)
	return nil
}

// pick chooses the backend of grant g: Warm when its template is a zygote
// and Warm is configured, else Basic. The chosen tier must reach g.MinTier,
// and isolate as far as Config.MinIsolation asks (isolationGap).
func (a *Agent) pick(g core.Grant, spec template.Spec) (backend.Backend, error) {
	var b backend.Backend
	switch {
	case spec.Zygote && a.cfg.Warm != nil:
		b = a.cfg.Warm
	case a.cfg.Basic != nil:
		b = a.cfg.Basic
	default:
		return nil, fmt.Errorf("grant %q: template %s is no zygote and this agent has no BASIC tier: %w", g.UID, g.Template, core.ErrTierGap)
	}
	min := g.MinTier
	if min == "" {
		min = core.TierBasic
	}
	if t := a.tierOf(b, g.UID); t.Rank() < min.Rank() {
		if min == core.TierCheckpoint && b == a.cfg.Warm && a.park.why != nil {
			return nil, fmt.Errorf("grant %q: needs tier CHECKPOINT, the best this agent serves its template at is %s (%v): %w", g.UID, t, a.park.why, core.ErrTierGap)
		}
		return nil, fmt.Errorf("grant %q: needs tier %s, the best this agent serves its template at is %s: %w", g.UID, min, t, core.ErrTierGap)
	}
	if err := a.isolationGap(g, b); err != nil {
		return nil, err
	}
	return b, nil
}

// ensureWarm warms admitted slot s's template unless it is warm: it
// acquires the home's devices (fitted to the grant's device request,
// core.DeviceChannel.Fit: fewer than it asks for is a capacity miss, tried
// again with back-off) and carves the grant's cgroup when it has none yet, warms the template on its backend within the lease, and
// publishes the grant ready. A grant found cold that was published ready
// (its zygote died) is published not ready first.
func (a *Agent) ensureWarm(ctx context.Context, s *slot) error {
	uid := s.uid
	s.mu.Lock()
	g, spec, b := s.grant, s.spec, s.backend
	warm, ready := s.warm, s.ready
	haveDevices, dev, cg := s.release != nil, s.devices, s.cg
	s.mu.Unlock()
	if warm && b.Warmed(uid) {
		return nil
	}
	if ready {
		a.publish(ctx, s, false)
	}

	if !haveDevices {
		d, release, err := a.home.Devices(ctx, g)
		if err != nil {
			return fmt.Errorf("grant %q: devices: %w", uid, err)
		}
		if release == nil {
			release = func() {}
		}
		// The device budget: the template gets what the grant asks for.
		if d, err = d.Fit(g.Devices); err != nil {
			release()
			return fmt.Errorf("grant %q: devices: %w", uid, err)
		}
		dev = d
		s.mu.Lock()
		s.release, s.devices = release, d
		s.mu.Unlock()
	}
	if cg == nil && a.tree != nil {
		c, err := a.tree.Grant(uid)
		if err != nil {
			return fmt.Errorf("grant %q: cgroup: %w", uid, err)
		}
		cg = &c
		rec, err := a.recs.AddCgroup(uid, c.Dir.Path())
		if err != nil {
			a.log.Error(err, "Grant's cgroup not recorded: a crash of fiberd would leave what runs in it", "grant", uid)
		}
		mem, err := c.Dir.Enabled("memory")
		if err != nil {
			a.log.V(1).Info("Cannot tell whether the grant's cgroup has the memory controller; measuring its W budget", "grant", uid, "err", err.Error())
		}
		pids, _ := c.Dir.Enabled("pids")
		if a.limits.CPU {
			if err := c.Dir.SetCPUWeight(a.cfg.GrantCPUWeight); err != nil {
				a.log.Error(err, "Cannot set the grant's cpu.weight; it shares the CPU with the kernel's default weight", "grant", uid)
			}
		}
		s.mu.Lock()
		s.cg, s.cgRec, s.memCgroup, s.pidsCgroup = cg, rec, mem, pids
		s.mu.Unlock()
	}
	req := backend.WarmRequest{Grant: g, Spec: spec, Devices: dev, RunDir: filepath.Join(a.cfg.RunDir, "grants", uid), Records: a.recs,
		MinIsolation: a.cfg.MinIsolation}
	if cg != nil {
		req.Cgroup = cg.Dir.Path()
	}
	// A warm never outlasts the lease it is for.
	wctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, g.Expiry.Sub(a.cfg.Clock.Now()))
	defer cancel()
	if err := b.Warm(wctx, req); err != nil {
		a.log.Error(err, "Template not warm", "grant", uid)
		return fmt.Errorf("grant %q: template not warm: %w", uid, err)
	}
	s.mu.Lock()
	s.warm = true
	s.wakeLocked()
	s.mu.Unlock()
	a.log.Info("Template warm", "grant", uid, "template", g.Template, "tier", b.Tier())
	a.publish(ctx, s, true)
	return nil
}

// publish tells the home whether grant s is ready and records it.
func (a *Agent) publish(ctx context.Context, s *slot, ready bool) {
	if err := a.home.PublishReady(ctx, s.uid, ready); err != nil {
		a.log.Error(err, "Publishing readiness", "grant", s.uid, "ready", ready)
		return
	}
	s.mu.Lock()
	s.ready = ready
	s.mu.Unlock()
}

// yield ends admitted slot s's grant: its fibers and zygote are stopped,
// its cgroup removed, its devices released, and the home told it is not
// ready. It runs to its end on a context of its own, bounded by
// drainTimeout, even when ctx was cancelled: what it ends must not be left
// half-done.
func (a *Agent) yield(ctx context.Context, s *slot, reason string) {
	ctx, cancel := core.WithTimeout(context.WithoutCancel(ctx), a.cfg.Clock, drainTimeout)
	defer cancel()
	uid := s.uid
	fibers := a.ledger.Yield(uid)
	s.mu.Lock()
	b, cg, cgRec, release := s.backend, s.cg, s.cgRec, s.release
	s.admitted, s.warm = false, false
	s.cg, s.cgRec, s.memCgroup, s.pidsCgroup, s.release, s.devices = nil, procrec.Record{}, false, false, nil, core.DeviceChannel{}
	s.wakeLocked()
	s.mu.Unlock()
	a.park.close(uid)
	for _, f := range fibers {
		a.freeFiber(f) // the backend's Stop ends them
	}
	if b != nil {
		if err := b.Stop(ctx, uid); err != nil {
			a.log.Error(err, "Stopping a grant", "grant", uid)
		}
	}
	if cg != nil {
		if err := cg.Remove(ctx); err != nil {
			a.log.Error(err, "Removing a grant's cgroup; the next start of fiberd ends what is left", "grant", uid)
		} else if err := cgRec.Remove(); err != nil {
			a.log.Error(err, "Removing a grant's cgroup record", "grant", uid)
		}
	}
	if release != nil {
		release()
	}
	a.publish(ctx, s, false)
	a.log.Info("Grant yielded", "grant", uid, "reason", reason, "fibers", len(fibers))
	a.notify()
}
