package fiberd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/home"
)

// The events of a grant. Each records what it learned in the grant's slot
// and queues a reconcile of the UID (reconcile.go); none admits, warms or
// yields a grant itself, and none waits for another grant.

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
			a.applyEvent(ev)
		}
	}
}

// applyEvent handles one lane event. GrantAdded: the token waits in the
// slot for its reconcile to verify it. GrantRemoved: revoke.
func (a *Agent) applyEvent(ev home.GrantEvent) {
	switch ev.Kind {
	case home.GrantAdded:
		a.event(ev.UID, func(s *slot) {
			s.delivered = ev.Token
			s.gen++
		})
	case home.GrantRemoved:
		a.revoke(ev.UID)
		a.log.Info("Grant removed by the lane; revoked until delivered again", "grant", ev.UID, "path", ev.Path)
	default:
		a.log.Info("Ignored a lane event of unknown kind", "grant", ev.UID, "kind", ev.Kind.String())
	}
}

// revoke denies uid in the ledger at once, for Config.DenyFor from now, and
// then until the end of the latest lease of it the agent has seen when that
// is later; the ledger persists both in the state directory. Its reconcile
// (a running one is cancelled) then yields it.
func (a *Agent) revoke(uid string) {
	until := a.cfg.Clock.Now().Add(a.cfg.DenyFor)
	floor := until
	err := a.ledger.Deny(uid, until)
	a.event(uid, func(s *slot) {
		s.want, s.delivered = nil, nil
		s.gen++
		if s.cancel != nil {
			s.cancel()
		}
		if s.latestExpiry.After(until) {
			until = s.latestExpiry
		}
	})
	if until.After(floor) {
		err = a.ledger.Deny(uid, until)
	}
	if err != nil {
		a.log.Error(err, "Persisting a revocation; it holds until fiberd restarts", "grant", uid)
	}
}

// offer hands grant g, verified from a Clone's token, to its slot, and
// waits until the slot has reconciled it or ctx ends. A token the slot
// already wants, or one issued before it (design decision 15), changes
// nothing; the Clone is then served under what the slot wants, but still
// waits for a reconcile of it in flight. It fails at once with a miss for
// a revoked grant or an ended lease, and with a miss when ctx ends first.
// What the reconcile reached (admitted, warm, a tier gap, its error) is for
// the caller to read from the slot.
func (a *Agent) offer(ctx context.Context, g core.Grant) error {
	if a.ledger.Denied(g.UID) {
		return a.miss(fmt.Errorf("grant %q: %w", g.UID, core.ErrDenied))
	}
	if g.Expired(a.cfg.Clock.Now()) {
		return a.miss(fmt.Errorf("grant %q lease ended at %s: %w", g.UID, g.Expiry.UTC().Format(time.RFC3339), core.ErrNoCapacity))
	}
	var (
		s   *slot
		gen uint64
	)
	for s == nil {
		a.mu.Lock()
		s = a.slots[g.UID]
		if s == nil {
			s = newSlot(g.UID)
			a.slots[g.UID] = s
		}
		a.mu.Unlock()
		s.mu.Lock()
		if s.gone {
			s.mu.Unlock()
			s = nil
			continue
		}
		if g.Expiry.After(s.latestExpiry) {
			s.latestExpiry = g.Expiry
		}
		// Offer it when nothing or an older token is wanted, or when the
		// last reconcile could not admit what is wanted (a template the
		// node did not hold then): this Clone asks again.
		settledOut := !s.admitted && s.applied >= s.gen
		changed := s.want == nil || settledOut || !(bytes.Equal(s.want.Token, g.Token) || g.IssuedAt.Before(s.want.IssuedAt))
		if changed {
			if s.want == nil || !g.IssuedAt.Before(s.want.IssuedAt) {
				s.want = &g
			}
			s.gap = nil
			s.gen++
		}
		gen = s.gen
		s.mu.Unlock()
		if changed {
			a.queue.Add(g.UID)
		}
	}
	for {
		s.mu.Lock()
		done, wait := s.applied >= gen, s.changed
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return a.miss(fmt.Errorf("grant %q: not ready within the Clone's deadline (its template is warming): %w", g.UID, ctx.Err()))
		}
	}
}

// releaseFiber kills fiber f and frees what the agent held for it. The
// fiber is already out of the ledger.
func (a *Agent) releaseFiber(ctx context.Context, f core.Fiber) {
	if h := handleOf(f); h != nil && h.backend != nil {
		if err := h.backend.Kill(ctx, f.Fence); err != nil && !errors.Is(err, core.ErrNotFound) {
			a.log.Error(err, "Killing a fiber", "fiber", f.Fence.String())
		}
	}
	a.freeFiber(f)
}

// freeFiber frees the endpoint the agent held for fiber f: its port or its
// socket file.
func (a *Agent) freeFiber(f core.Fiber) {
	h := handleOf(f)
	if h == nil {
		return
	}
	if h.port != 0 && a.ports != nil {
		a.ports.Release(h.port)
	}
	if h.sock != "" {
		_ = os.Remove(h.sock)
	}
}

// resync queues a reconcile of every grant that has none running or
// pending, every ResyncInterval, until ctx ends: a safety net for a change no
// event reported. Each round also wakes the watchers, so a change of lane
// health reaches them.
func (a *Agent) resync(ctx context.Context) {
	a.every(ctx, a.cfg.ResyncInterval, func() {
		a.mu.Lock()
		uids := make([]string, 0, len(a.slots))
		for uid := range a.slots {
			uids = append(uids, uid)
		}
		a.mu.Unlock()
		for _, uid := range uids {
			if running, timer := a.queue.pending(uid); !running && !timer {
				a.queue.Add(uid)
			}
		}
		a.notify()
	})
}

// exitLoop frees the places of fibers that end on their own and marks
// grants whose zygote died cold (their reconcile warms them again), until
// b's Exits closes. It does no I/O of its own.
func (a *Agent) exitLoop(b backend.Backend) {
	for ex := range b.Exits() {
		if ex.Template {
			if s := a.slotOf(ex.GrantUID); s != nil {
				s.mu.Lock()
				ours := s.backend == b && s.admitted
				if ours {
					s.warm = false
					s.wakeLocked()
				}
				s.mu.Unlock()
				if ours {
					a.log.Info("Template died; grant is cold until warmed again", "grant", ex.GrantUID, "reason", ex.Reason.String())
					a.queue.Add(ex.GrantUID)
				}
			}
			a.notify()
			continue
		}
		if ex.Reason.Unreported {
			a.metrics.unreported.Inc()
			a.log.Info("A fiber's zygote did not report its end; fiberd ended it itself", "fiber", ex.Fence.String())
		}
		if ex.Reason.Parked {
			// The park that ended it takes it out of the ledger and keeps
			// its port for the resume (park.go).
			continue
		}
		if f, ok := a.ledger.Remove(ex.Fence); ok {
			a.freeFiber(f)
			reason, label, over := exitReason(f, ex.Reason)
			a.metrics.exits.WithLabelValues(label).Inc()
			if s := a.slotOf(ex.GrantUID); s != nil {
				s.recordExit(api.FiberExit{FiberID: ex.Fence.String(), Reason: reason, At: a.cfg.Clock.Now()}, over)
			}
			if over {
				a.log.Info("Fiber ended over its W budget", "fiber", ex.Fence.String(), "reason", reason)
			} else {
				a.log.V(1).Info("Fiber exited", "fiber", ex.Fence.String(), "reason", reason)
			}
			a.notify()
		}
	}
}

// exitReason is how fiber f ended, for its grant's status (reason), for
// fiberd_fiber_exits_total (label) and whether it went over its W budget:
// ended by the budget loop, or by the kernel at its leaf's memory.max.
func exitReason(f core.Fiber, r backend.ExitReason) (reason, label string, over bool) {
	if h := handleOf(f); h != nil {
		if why := h.over.Load(); why != nil {
			return *why, exitOverBudget, true
		}
	}
	switch {
	case r.MemoryMax:
		return "over wBudget: ended by the kernel at its leaf's memory.max", exitOverBudget, true
	case r.Killed:
		return r.String(), "killed", false
	case r.TemplateDied:
		return r.String(), "template_died", false
	case r.Signal != "":
		return r.String(), "signal", false
	}
	return r.String(), "exit", false
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
	a.renewSpares()
	a.park.newEpoch(n)
	a.log.Info("Epoch bumped; every running fiber released", "epoch", n, "reason", reason, "fibers", len(fibers))
	a.notify()
	return n
}

// renewSpares ends every admitted grant's spare fibers and has new ones
// forked: an epoch bump ends what ran before it, and a spare is a fiber
// in waiting.
func (a *Agent) renewSpares() {
	a.mu.Lock()
	slots := make([]*slot, 0, len(a.slots))
	for _, s := range a.slots {
		slots = append(slots, s)
	}
	a.mu.Unlock()
	for _, s := range slots {
		s.mu.Lock()
		b, admitted := s.backend, s.admitted
		s.mu.Unlock()
		if sp, ok := b.(backend.Sparer); ok && admitted {
			sp.RenewSpares(s.uid)
		}
	}
}
