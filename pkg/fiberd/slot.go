package fiberd

import (
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"

	"context"
	"sync"
)

// slot is one grant UID's state in the agent: the single owner of
// everything the agent keeps per grant besides the ledger's account of its
// fibers. Events only record what they learned here and add the UID to the
// work queue (Agent.queue); the grant's reconcile (reconcile.go), one at a
// time per UID, is the only code that admits, warms or yields the grant
// and changes its actual state. A slot is made on the first event of its
// UID and dropped once it has nothing left to do.
//
// A grant's running fibers are the ledger's, its spares the backend's, and
// its parked sessions parking's (parking.go).
type slot struct {
	uid string

	// mu guards every field below. It is held only to read or write them:
	// never across I/O, a process start, or a call into the home, a
	// backend, the verifier or the ledger. Lock order: Agent.mu, then
	// slot.mu (see Agent).
	mu sync.Mutex

	// gone is set, under Agent.mu and mu, when the slot is dropped from
	// Agent.slots; an event that finds it set looks the UID up again.
	gone bool

	// What is wanted, written by events.

	// delivered is the token the lane delivered last, not yet verified;
	// the reconcile verifies it and clears it. Nil when none waits.
	delivered []byte
	// want is the newest verified grant that should run: the lane's, or a
	// Clone's offer. Nil when the grant should not run (never wanted,
	// revoked, its lease ended).
	want *core.Grant
	// latestExpiry is the latest lease end of any token of this UID seen
	// verified: a revocation lasts at least until then.
	latestExpiry time.Time
	// gen counts changes of what is wanted; applied is the gen of the last
	// reconcile that finished. A Clone that offered a grant at gen G waits
	// until applied >= G.
	gen, applied uint64
	// cancel ends the reconcile in flight, for an event that makes its work
	// moot (a revocation); nil when none runs.
	cancel context.CancelFunc

	// What is, written by the reconcile (warm also by a zygote's death).

	// admitted is set while the ledger holds grant.
	admitted bool
	grant    core.Grant
	spec     template.Spec
	backend  backend.Backend // the backend serving it; nil before the first admission
	cg       *cgroup.Grant   // its cgroup; nil without a cgroup root or before warm carved it
	cgRec    procrec.Record  // cg's record in Agent.recs
	// memCgroup is set when cg's fiber leaves have the memory controller:
	// the W budget is then each leaf's memory.max.
	memCgroup bool
	// pidsCgroup is set when cg's fiber leaves have the pids controller:
	// each gets pids.max (Config.FiberPidsMax).
	pidsCgroup bool
	devices    core.DeviceChannel // the home's devices for it
	release    func()             // releases devices; nil until acquired
	warm       bool               // warm succeeded and the zygote has not died since
	// err is why the last reconcile did not reach what is wanted (a
	// template that did not warm, a template the node does not hold, a
	// tier gap), nil when it did.
	err error
	// gap is the tier gap that refuses the grant (412), kept until a new
	// grant is offered or delivered, or gapUntil (the refused grant's
	// lease end).
	gap      error
	gapUntil time.Time
	// ready is what the home was last told: the grant is ready.
	ready bool
	// changed is closed and replaced when applied or warm changes, waking
	// the Clones waiting for the slot.
	changed chan struct{}

	// What is observed while the grant runs.

	// pressure is the cached reading of cg's pressure (pressureShed).
	pressure pressureCache
	// exits are the last fibers that ended on their own or for their
	// budget, oldest first (recordExit); overBudget counts the latter.
	exits      []api.FiberExit
	overBudget int
}

func newSlot(uid string) *slot {
	return &slot{uid: uid, changed: make(chan struct{})}
}

// wakeLocked wakes the Clones waiting on the slot. The caller holds mu.
func (s *slot) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// slotOf returns the slot of uid, nil when there is none.
func (a *Agent) slotOf(uid string) *slot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.slots[uid]
}

// event applies fn to uid's slot under its mu, making the slot when there
// is none, and queues a reconcile of uid.
func (a *Agent) event(uid string, fn func(s *slot)) {
	for {
		a.mu.Lock()
		s := a.slots[uid]
		if s == nil {
			s = newSlot(uid)
			a.slots[uid] = s
		}
		a.mu.Unlock()
		s.mu.Lock()
		if s.gone {
			s.mu.Unlock()
			continue
		}
		fn(s)
		s.mu.Unlock()
		a.queue.Add(uid)
		return
	}
}

// dropIfIdle drops uid's slot when nothing is left of it: not admitted,
// nothing wanted or delivered, not revoked, and no Clone about to be
// answered from it. The reconcile calls it last.
func (a *Agent) dropIfIdle(s *slot) {
	if a.ledger.Denied(s.uid) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admitted || s.want != nil || s.delivered != nil || s.gap != nil || s.applied != s.gen || a.slots[s.uid] != s {
		return
	}
	delete(a.slots, s.uid)
	s.gone = true
}

// slotView is what Clone and status read of a slot, copied under its mu.
type slotView struct {
	admitted   bool
	grant      core.Grant
	backend    backend.Backend
	cg         *cgroup.Grant
	memCgroup  bool
	pidsCgroup bool
	warm       bool
	err, gap   error
}

func (s *slot) view() slotView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slotView{admitted: s.admitted, grant: s.grant, backend: s.backend, cg: s.cg, memCgroup: s.memCgroup, pidsCgroup: s.pidsCgroup, warm: s.warm, err: s.err, gap: s.gap}
}

// isWarm reports whether admitted grant uid's template is warm.
func (a *Agent) isWarm(uid string) bool {
	s := a.slotOf(uid)
	if s == nil {
		return false
	}
	v := s.view()
	return v.admitted && v.warm && v.backend.Warmed(uid)
}

// status fills the slot's part of its grant's status.
func (s *slot) status(out *api.GrantStatus) {
	s.mu.Lock()
	admitted, warm, b, err := s.admitted, s.warm, s.backend, s.err
	s.mu.Unlock()
	if !admitted {
		return
	}
	out.Warm = warm && b.Warmed(s.uid) // outside mu: a call into the backend
	if out.Warm {
		out.Isolation = string(b.GrantIsolation(s.uid))
	}
	if !out.Warm && err != nil {
		out.Error = err.Error()
	}
	s.mu.Lock()
	if out.WBudget = s.grant.WBudget; out.WBudget > 0 {
		out.WBudgetBy = "measured"
		if s.memCgroup {
			out.WBudgetBy = "cgroup"
		}
	}
	out.OverBudget = s.overBudget
	out.Exits = append([]api.FiberExit(nil), s.exits...)
	w := s.grant.Fibers.Warm
	s.mu.Unlock()
	out.Spares = spareStatus(b, s.uid, w, out.Warm) // outside mu: the backend, /proc
}

// spareStatus is the status of grant uid's spares on backend b, the grant
// asking for w: nil when it asks for none and has none, or is not warm.
// It reads the spares' memory from /proc.
func spareStatus(b backend.Backend, uid string, w int, warm bool) *api.SpareStatus {
	sp, ok := b.(backend.Sparer)
	if !ok || !warm {
		return nil
	}
	st := sp.Spares(uid)
	if w <= 0 && st.Ready == 0 {
		return nil
	}
	out := &api.SpareStatus{Warm: w, HandOver: st.Supported, Wanted: st.Want, Ready: st.Ready, Taken: st.Taken, Failed: st.Failed}
	if pids := sp.SparePIDs(uid); len(pids) > 0 {
		out.Bytes, _ = privateDirty(pids) // a spare gone meanwhile counts nothing
	}
	return out
}
