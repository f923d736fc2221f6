package fiberd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/template"
)

// publishTimeout bounds a PublishReady made outside a request or the lane.
const publishTimeout = 10 * time.Second

// laneLoop applies the home's grant events until ctx ends or the lane
// closes.
func (a *Agent) laneLoop(ctx context.Context, lane <-chan home.GrantEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-lane:
			if !ok {
				return
			}
			a.applyEvent(ctx, ev)
		}
	}
}

// applyEvent handles one lane event. GrantAdded: verify, lift the deny,
// admit, warm, publish ready. GrantRemoved: deny, yield, publish not ready.
func (a *Agent) applyEvent(ctx context.Context, ev home.GrantEvent) {
	log := a.log.WithValues("grant", ev.UID, "path", ev.Path)
	switch ev.Kind {
	case home.GrantAdded:
		g, err := a.verifier.Verify(ctx, ev.Token)
		if err != nil {
			log.Error(err, "Refused a delivered grant")
			return
		}
		if g.UID != ev.UID {
			log.Info("Delivered grant's verified UID differs from the lane's peek", "verified", g.UID)
		}
		a.ledger.Lift(g.UID)
		if err := a.admit(ctx, g); err != nil {
			log.Error(err, "Could not admit a delivered grant")
		}
	case home.GrantRemoved:
		a.ledger.Deny(ev.UID)
		a.yield(ctx, ev.UID, "removed by the lane")
		log.Info("Grant removed by the lane; denied until delivered again")
	default:
		log.Info("Ignored a lane event of unknown kind", "kind", ev.Kind.String())
	}
}

// admit admits verified grant g and warms its template. A renewal (an
// admitted UID with the same template) only updates the lease. It fails
// with an error wrapping core.ErrNoCapacity for a lapsed lease,
// core.ErrDenied for a revoked UID, core.ErrTierGap when no backend
// reaches the grant's MinTier, and core.ErrInvalid for a template the node
// does not hold. A grant admitted but not warmed is no error: it stays
// admitted and cold, Clones of it miss, and the reaper warms it again.
func (a *Agent) admit(ctx context.Context, g core.Grant) error {
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	if g.Expired(a.cfg.Clock.Now()) {
		return fmt.Errorf("grant %q lease ended at %s: %w", g.UID, g.Expiry.UTC().Format(time.RFC3339), core.ErrNoCapacity)
	}
	a.mu.Lock()
	rt := a.grants[g.UID]
	a.mu.Unlock()
	if rt != nil && rt.grant.Template == g.Template && rt.grant.MinTier == g.MinTier {
		if _, err := a.ledger.Admit(g); err != nil {
			return err
		}
		a.mu.Lock()
		rt.grant = g
		a.mu.Unlock()
		if !a.isWarm(g.UID) {
			a.warm(ctx, rt)
		}
		a.notify()
		return nil
	}
	if rt != nil {
		a.yieldLocked(ctx, g.UID, "template or tier changed")
	}
	if a.ledger.Denied(g.UID) {
		return fmt.Errorf("grant %q: %w", g.UID, core.ErrDenied)
	}
	spec, err := a.templates.Resolve(g.Template)
	if err != nil {
		return fmt.Errorf("grant %q: %w", g.UID, err)
	}
	b, err := a.pick(g, spec)
	if err != nil {
		a.mu.Lock()
		a.gaps[g.UID] = err
		a.mu.Unlock()
		return err
	}
	if _, err := a.ledger.Admit(g); err != nil {
		return err
	}
	rt = &grantRT{grant: g, spec: spec, backend: b}
	a.mu.Lock()
	a.grants[g.UID] = rt
	delete(a.gaps, g.UID)
	a.mu.Unlock()
	a.log.Info("Grant admitted", "grant", g.UID, "template", g.Template, "max", g.Fibers.Max, "tier", b.Tier(), "expiry", g.Expiry)
	a.warm(ctx, rt)
	if err := a.gapOf(g.UID); err != nil {
		return err
	}
	a.notify()
	return nil
}

// pick chooses the backend of grant g: Warm when its template is a zygote
// and Warm is configured, else Basic. The chosen tier must reach g.MinTier.
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
	if b.Tier().Rank() < min.Rank() {
		return nil, fmt.Errorf("grant %q: needs tier %s, the best this agent serves its template at is %s: %w", g.UID, min, b.Tier(), core.ErrTierGap)
	}
	return b, nil
}

// gapOf is the tier gap recorded for uid, nil when none.
func (a *Agent) gapOf(uid string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gaps[uid]
}

// warm acquires the grant's devices and cgroup when it has none yet, warms
// its template on its backend and publishes it ready. Failures are logged
// and leave the grant cold; a tier gap the backend reports yields the grant
// and records the gap. The caller holds admitMu.
func (a *Agent) warm(ctx context.Context, rt *grantRT) {
	a.mu.Lock()
	g, spec, b := rt.grant, rt.spec, rt.backend
	haveDevices, cg := rt.release != nil, rt.cg
	a.mu.Unlock()
	log := a.log.WithValues("grant", g.UID)
	fail := func(err error) {
		a.mu.Lock()
		rt.warmErr = err
		a.mu.Unlock()
		log.Error(err, "Template not warm")
	}

	var dev core.DeviceChannel
	if !haveDevices {
		d, release, err := a.home.Devices(ctx, g)
		if err != nil {
			fail(fmt.Errorf("grant %q: devices: %w", g.UID, err))
			return
		}
		if release == nil {
			release = func() {}
		}
		dev = d
		a.mu.Lock()
		rt.release = release
		rt.devices = d
		a.mu.Unlock()
	} else {
		a.mu.Lock()
		dev = rt.devices
		a.mu.Unlock()
	}
	if cg == nil && a.tree != nil {
		c, err := a.tree.Grant(g.UID)
		if err != nil {
			fail(fmt.Errorf("grant %q: cgroup: %w", g.UID, err))
			return
		}
		cg = &c
		a.mu.Lock()
		rt.cg = cg
		a.mu.Unlock()
	}
	req := backend.WarmRequest{Grant: g, Spec: spec, Devices: dev, RunDir: filepath.Join(a.cfg.RunDir, "grants", g.UID)}
	if cg != nil {
		req.Cgroup = cg.Dir.Path()
	}
	if err := b.Warm(ctx, req); err != nil {
		if errors.Is(err, core.ErrTierGap) {
			a.yieldLocked(ctx, g.UID, "tier gap")
			a.mu.Lock()
			a.gaps[g.UID] = err
			a.mu.Unlock()
		}
		fail(err)
		return
	}
	a.mu.Lock()
	rt.warm, rt.warmErr = true, nil
	a.mu.Unlock()
	log.Info("Template warm", "template", g.Template, "tier", b.Tier())
	if err := a.home.PublishReady(ctx, g.UID, true); err != nil {
		log.Error(err, "Publishing readiness")
	}
	a.notify()
}

// yield ends admitted grant uid: its fibers and zygote are stopped, its
// cgroup removed, its devices released, and the home told it is not ready.
func (a *Agent) yield(ctx context.Context, uid, reason string) {
	a.admitMu.Lock()
	defer a.admitMu.Unlock()
	a.yieldLocked(ctx, uid, reason)
}

// yieldLocked is yield for a caller that holds admitMu.
func (a *Agent) yieldLocked(ctx context.Context, uid, reason string) {
	fibers := a.ledger.Yield(uid)
	a.mu.Lock()
	rt := a.grants[uid]
	delete(a.grants, uid)
	delete(a.gaps, uid)
	a.mu.Unlock()
	for _, f := range fibers {
		if rt == nil {
			a.releaseFiber(ctx, f)
		} else {
			a.freeFiber(f)
		}
	}
	if rt != nil {
		if err := rt.backend.Stop(ctx, uid); err != nil {
			a.log.Error(err, "Stopping a grant", "grant", uid)
		}
		if rt.cg != nil {
			if err := rt.cg.Remove(ctx); err != nil {
				a.log.Error(err, "Removing a grant's cgroup", "grant", uid)
			}
		}
		if rt.release != nil {
			rt.release()
		}
		a.log.Info("Grant yielded", "grant", uid, "reason", reason, "fibers", len(fibers))
	}
	if err := a.home.PublishReady(ctx, uid, false); err != nil {
		a.log.Error(err, "Publishing readiness", "grant", uid)
	}
	a.notify()
}

// releaseFiber kills fiber f and frees what the agent held for it. The
// fiber is already out of the ledger.
func (a *Agent) releaseFiber(ctx context.Context, f core.Fiber) {
	if h, ok := f.Handle.(*fiberHandle); ok && h.backend != nil {
		if err := h.backend.Kill(ctx, f.Fence); err != nil && !errors.Is(err, core.ErrNotFound) {
			a.log.Error(err, "Killing a fiber", "fiber", f.Fence.String())
		}
	}
	a.freeFiber(f)
}

// freeFiber frees the endpoint the agent held for fiber f: its port or its
// socket file.
func (a *Agent) freeFiber(f core.Fiber) {
	h, ok := f.Handle.(*fiberHandle)
	if !ok {
		return
	}
	if h.port != 0 && a.ports != nil {
		a.ports.Release(h.port)
	}
	if h.sock != "" {
		_ = os.Remove(h.sock)
	}
}

// reaper yields grants whose lease lapsed and warms cold ones again, every
// ReapInterval, until ctx ends. Each round also wakes the watchers, so a
// change of lane health reaches them.
func (a *Agent) reaper(ctx context.Context) {
	t := a.cfg.Clock.NewTicker(a.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			a.reap(ctx)
		}
	}
}

func (a *Agent) reap(ctx context.Context) {
	for _, uid := range a.ledger.Lapsed(a.cfg.Clock.Now()) {
		a.yield(ctx, uid, "lease lapsed")
	}
	a.mu.Lock()
	var cold []*grantRT
	for uid, rt := range a.grants {
		if !rt.warm || !rt.backend.Warmed(uid) {
			cold = append(cold, rt)
		}
	}
	a.mu.Unlock()
	for _, rt := range cold {
		a.admitMu.Lock()
		a.mu.Lock()
		current := a.grants[rt.grant.UID] == rt
		a.mu.Unlock()
		if current {
			a.warm(ctx, rt)
		}
		a.admitMu.Unlock()
	}
	a.notify()
}

// exitLoop frees the slots of fibers that end on their own and marks
// grants whose zygote died cold, until b's Exits closes.
func (a *Agent) exitLoop(b backend.Backend) {
	for ex := range b.Exits() {
		if ex.Template {
			a.mu.Lock()
			rt := a.grants[ex.GrantUID]
			if rt != nil && rt.backend == b {
				rt.warm = false
			}
			a.mu.Unlock()
			if rt != nil {
				a.log.Info("Template died; grant is cold until warmed again", "grant", ex.GrantUID, "reason", ex.Reason.String())
				ctx, cancel := core.WithTimeout(context.Background(), a.cfg.Clock, publishTimeout)
				if err := a.home.PublishReady(ctx, ex.GrantUID, false); err != nil {
					a.log.Error(err, "Publishing readiness", "grant", ex.GrantUID)
				}
				cancel()
			}
			a.notify()
			continue
		}
		if f, ok := a.ledger.Remove(ex.Fence); ok {
			a.freeFiber(f)
			a.log.V(1).Info("Fiber exited", "fiber", ex.Fence.String(), "reason", ex.Reason.String())
			a.notify()
		}
	}
}

// scopeLost is registered with a ScopeLoser home: the epoch moves on and
// every running fiber is released. Grants stay admitted and warm.
func (a *Agent) scopeLost(ctx context.Context, reason string) {
	a.bumpEpoch(ctx, "scope lost: "+reason)
}

// bumpEpoch persists epoch + 1, moves the ledger to it and releases every
// fiber of the old epoch.
func (a *Agent) bumpEpoch(ctx context.Context, reason string) uint64 {
	a.epochMu.Lock()
	n, err := a.epoch.Bump()
	if err != nil {
		a.log.Error(err, "Persisting the epoch; moving on in memory")
	}
	fibers := a.ledger.SetEpoch(n)
	a.epochMu.Unlock()
	for _, f := range fibers {
		a.releaseFiber(ctx, f)
	}
	a.log.Info("Epoch bumped; every running fiber released", "epoch", n, "reason", reason, "fibers", len(fibers))
	a.notify()
	return n
}
