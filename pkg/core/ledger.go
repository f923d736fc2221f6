package core

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"
)

// Fiber is one running fiber in the ledger.
type Fiber struct {
	// Fence is the fiber's incarnation, also its id.
	Fence Fence
	// Session is the caller-chosen name the fiber runs under, "" for none.
	Session string
	// Endpoint is where the fiber serves, as an endpoint URL.
	Endpoint string
	// Tier is the tier it was served with.
	Tier Tier
	// Created is when the ledger committed it.
	Created time.Time
	// Handle is the runtime's own data for the fiber, such as its leaf
	// cgroup; the ledger never looks at it.
	Handle any
}

// Reservation is a place under fibers.max held for a fiber between Reserve and Commit or
// Cancel. Its Fence is already minted.
type Reservation struct {
	Fence   Fence
	Session string
	entry   *ledgerEntry
	settled bool // Commit or Cancel freed the place; guarded by the ledger's mu
}

// GrantState is a grant's entry as Snapshot shows it.
type GrantState struct {
	Grant    Grant
	Running  []Fiber
	Reserved int
	LastSeq  uint64
}

type ledgerEntry struct {
	grant    Grant
	seq      uint64
	reserved int
	running  map[Fence]*Fiber
	sessions map[string]Fence
}

// Ledger is the agent's account of admitted grants and their running
// fibers. It enforces a grant's fibers.max with reservations made before the
// runtime works, so a burst can never exceed it; it refuses to commit a fiber
// whose grant entry or epoch changed during the fork; and it is the one
// account of revocations: grants their lane revoked, each until an end time,
// refused until Lift.
//
// The ledger never blocks on the runtime, and its lock is never held across
// I/O: callers reserve, fork outside the lock, then commit or cancel. The
// only I/O it does is the revocations' persistence through its
// RevocationStore, which Deny and Lift call after the change is made in
// memory and the lock released; a separate writer lock serialises those
// writes, so a reader of the ledger never waits for the disk. Session gates
// (LockSession) serialise Clones of one session so only one creates it and
// the rest attach; a Clone waits for a gate only until its context ends. A
// Ledger is safe for concurrent use.
//
// Lock order inside the ledger: storeMu -> mu; gateMu is taken alone.
type Ledger struct {
	mu     sync.Mutex
	epoch  uint64
	grants map[string]*ledgerEntry
	// revoked maps each revoked grant UID to the end of its revocation,
	// and revVersion counts its changes; both guarded by mu.
	revoked    map[string]time.Time
	revVersion uint64
	// yielded is the last seq of each grant yielded in this epoch, so a
	// grant admitted again continues its sequence: a fence is never minted
	// twice in one epoch, and an old fiber id can never name a new fiber.
	yielded map[string]uint64

	// store persists revoked; nil keeps revocations in memory only. It is
	// set once by OpenLedger.
	store RevocationStore
	// storeMu serialises the store's Saves. It is held across a Save and
	// guards saved; only saveRevocations takes it, so no reader of the
	// ledger ever waits for the disk.
	storeMu sync.Mutex
	saved   uint64 // the revVersion the store holds

	gateMu sync.Mutex
	gates  map[string]*gate
}

// gate is a session's gate: a token (a buffered channel of one) rather than
// a mutex, so a Clone waiting for it gives up when its deadline passes.
type gate struct {
	token chan struct{} // holds a value while the gate is taken
	refs  int           // callers holding or waiting for it; guarded by gateMu
}

// NewLedger returns an empty ledger at epoch whose revocations are kept in
// memory only.
func NewLedger(epoch uint64) *Ledger {
	return &Ledger{
		epoch:   epoch,
		grants:  make(map[string]*ledgerEntry),
		revoked: make(map[string]time.Time),
		yielded: make(map[string]uint64),
		gates:   make(map[string]*gate),
	}
}

// OpenLedger returns an empty ledger at epoch that persists its revocations
// in store, starting from those store holds that end after now (ended ones
// are dropped; the store keeps them until the next write). A nil store is
// NewLedger. It fails with the store's error when the revocations cannot be
// loaded: a revocation must not be forgotten silently.
func OpenLedger(epoch uint64, store RevocationStore, now time.Time) (*Ledger, error) {
	l := NewLedger(epoch)
	if store == nil {
		return l, nil
	}
	revs, err := store.Load()
	if err != nil {
		return nil, err
	}
	for uid, until := range revs {
		if now.Before(until) {
			l.revoked[uid] = until
		}
	}
	l.store = store
	return l, nil
}

// Epoch is the epoch new fences are minted in.
func (l *Ledger) Epoch() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// SetEpoch moves the ledger to a new epoch, as after a scope loss, and
// returns every running fiber, all of which are stale now: the caller
// releases them. Grants stay admitted; reservations in flight will fail to
// commit.
func (l *Ledger) SetEpoch(epoch uint64) []Fiber {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epoch = epoch
	// Fences of the new epoch differ from every older one by their epoch.
	l.yielded = make(map[string]uint64)
	var out []Fiber
	for _, e := range l.grants {
		for _, f := range e.running {
			out = append(out, *f)
		}
		e.running = make(map[Fence]*Fiber)
		e.sessions = make(map[string]Fence)
	}
	sortFibers(out)
	return out
}

// Admit adds grant g, or updates an admitted grant of the same UID (a
// renewal keeps its fibers and sequence). It reports whether the grant is
// new. A denied UID is not admitted: it returns an error wrapping ErrDenied.
func (l *Ledger) Admit(g Grant) (added bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.revoked[g.UID]; ok {
		return false, fmt.Errorf("grant %q: %w", g.UID, ErrDenied)
	}
	if e, ok := l.grants[g.UID]; ok {
		e.grant = g
		return false, nil
	}
	l.grants[g.UID] = &ledgerEntry{grant: g, seq: l.yielded[g.UID], running: make(map[Fence]*Fiber), sessions: make(map[string]Fence)}
	return true, nil
}

// Grant returns the admitted grant uid.
func (l *Ledger) Grant(uid string) (Grant, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.grants[uid]
	if !ok {
		return Grant{}, false
	}
	return e.grant, true
}

// Yield removes grant uid and returns its running fibers for the caller to
// release. Reservations on it will fail to commit.
func (l *Ledger) Yield(uid string) []Fiber {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.grants[uid]
	if !ok {
		return nil
	}
	delete(l.grants, uid)
	l.yielded[uid] = e.seq
	out := make([]Fiber, 0, len(e.running))
	for _, f := range e.running {
		out = append(out, *f)
	}
	sortFibers(out)
	return out
}

// Deny revokes uid until the given end: Admit refuses it and Reserve misses
// it from now on, until Lift. An end already recorded that is not earlier
// is kept. The revocation is in force in memory before Deny writes the
// store, and stays in force when the write fails; the error is then the
// store's (the previous saved state is left as it was), and a later Deny or
// Lift writes again. It returns once its change is written, by it or by a
// concurrent call (a change is not written twice), or the write failed; it
// waits for the disk, so a caller holds none of its own locks across it.
func (l *Ledger) Deny(uid string, until time.Time) error {
	l.mu.Lock()
	if old, ok := l.revoked[uid]; !ok || old.Before(until) {
		l.revoked[uid] = until
		l.revVersion++
	}
	l.mu.Unlock()
	return l.saveRevocations()
}

// Lift ends uid's revocation, as when the lane delivers it again or the
// revocation's end passed, and writes the store as Deny does, returning its
// error. It reports whether uid was revoked.
func (l *Ledger) Lift(uid string) (bool, error) {
	l.mu.Lock()
	_, was := l.revoked[uid]
	if was {
		delete(l.revoked, uid)
		l.revVersion++
	}
	l.mu.Unlock()
	return was, l.saveRevocations()
}

// Denied reports whether uid is revoked, whatever its end: a revocation ends
// only by Lift (the caller lifts it once its end passes) or, across a
// restart, by OpenLedger dropping it.
func (l *Ledger) Denied(uid string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.revoked[uid]
	return ok
}

// DeniedUntil is the end of uid's revocation, and whether uid is revoked.
func (l *Ledger) DeniedUntil(uid string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.revoked[uid]
	return until, ok
}

// Revocations is every revocation, a grant UID to its end; the caller owns
// the map.
func (l *Ledger) Revocations() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.revoked)
}

// saveRevocations writes the revocations to the store when the store holds
// an older version of them. Concurrent calls write in turn under storeMu; a
// call that finds its change already written by another returns at once. mu
// is held only to copy the map, never across the Save. Without a store it
// does nothing.
func (l *Ledger) saveRevocations() error {
	if l.store == nil {
		return nil
	}
	l.storeMu.Lock()
	defer l.storeMu.Unlock()
	l.mu.Lock()
	v := l.revVersion
	if v <= l.saved {
		l.mu.Unlock()
		return nil
	}
	revs := maps.Clone(l.revoked)
	l.mu.Unlock()
	if err := l.store.Save(revs); err != nil {
		return err
	}
	l.saved = v
	return nil
}

// LockSession takes the gate of (uid, session) and returns its unlock. Hold
// it from Reserve to Commit or Cancel, so concurrent Clones of one session
// resolve to one fiber: the first creates it, the rest attach. It waits for
// the gate until ctx ends, and then fails with ctx's error (and holds
// nothing). An empty session has no gate and the unlock is a no-op.
func (l *Ledger) LockSession(ctx context.Context, uid, session string) (unlock func(), err error) {
	if session == "" {
		return func() {}, nil
	}
	key := uid + "\x00" + session
	l.gateMu.Lock()
	g := l.gates[key]
	if g == nil {
		g = &gate{token: make(chan struct{}, 1)}
		l.gates[key] = g
	}
	g.refs++
	l.gateMu.Unlock()
	drop := func() {
		l.gateMu.Lock()
		g.refs--
		if g.refs == 0 {
			delete(l.gates, key)
		}
		l.gateMu.Unlock()
	}
	select {
	case g.token <- struct{}{}: // free: taken whatever ctx says
	default:
		select {
		case g.token <- struct{}{}:
		case <-ctx.Done():
			drop()
			return nil, ctx.Err()
		}
	}
	return func() {
		<-g.token
		drop()
	}, nil
}

// Reserve resolves a Clone of grant uid at now. A running session returns
// its fiber to attach to and no reservation. Otherwise it holds a place and
// mints the next fence. It fails with a reason for a capacity miss: the
// grant is unknown or denied, its lease lapsed, or it is at fibers.max. The
// error wraps ErrNoCapacity; the caller turns it into a Miss by lane health.
func (l *Ledger) Reserve(uid, session string, now time.Time) (res *Reservation, attach *Fiber, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.revoked[uid]; ok {
		return nil, nil, fmt.Errorf("grant %q revoked: %w", uid, ErrNoCapacity)
	}
	e, ok := l.grants[uid]
	if !ok {
		return nil, nil, fmt.Errorf("grant %q not admitted: %w", uid, ErrNoCapacity)
	}
	if e.grant.Expired(now) {
		return nil, nil, fmt.Errorf("grant %q lease ended at %s: %w", uid, e.grant.Expiry.UTC().Format(time.RFC3339), ErrNoCapacity)
	}
	if session != "" {
		if fe, ok := e.sessions[session]; ok {
			f := *e.running[fe]
			return nil, &f, nil
		}
	}
	if len(e.running)+e.reserved >= e.grant.Fibers.Max {
		return nil, nil, fmt.Errorf("grant %q at fibers.max %d: %w", uid, e.grant.Fibers.Max, ErrNoCapacity)
	}
	e.reserved++
	e.seq++
	return &Reservation{Fence: Fence{GrantUID: uid, Epoch: l.epoch, Seq: e.seq}, Session: session, entry: e}, nil, nil
}

// Commit records the fiber made for res. It fails with ErrStaleCommit when
// the grant entry was yielded or replaced or the epoch moved since Reserve;
// the place is freed either way.
func (l *Ledger) Commit(res *Reservation, f Fiber) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if res.settled {
		return fmt.Errorf("fiber %s: reservation already committed or cancelled: %w", res.Fence, ErrStaleCommit)
	}
	res.settled = true
	res.entry.reserved--
	if l.grants[res.Fence.GrantUID] != res.entry || l.epoch != res.Fence.Epoch {
		return fmt.Errorf("fiber %s: %w", res.Fence, ErrStaleCommit)
	}
	f.Fence = res.Fence
	f.Session = res.Session
	res.entry.running[f.Fence] = &f
	if f.Session != "" {
		res.entry.sessions[f.Session] = f.Fence
	}
	return nil
}

// Cancel frees the place of a reservation whose fork failed. Cancelling a
// reservation already committed (a Commit that failed freed its place too)
// or cancelled does nothing.
func (l *Ledger) Cancel(res *Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if res.settled {
		return
	}
	res.settled = true
	res.entry.reserved--
}

// Lookup returns the running fiber fence. A fence of an older epoch, an
// unknown grant or a fiber no longer running is an error wrapping
// ErrNotFound.
func (l *Ledger) Lookup(fence Fence) (Fiber, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fence.Epoch != l.epoch {
		return Fiber{}, fmt.Errorf("fiber %s: epoch %d is not the current %d: %w", fence, fence.Epoch, l.epoch, ErrNotFound)
	}
	e, ok := l.grants[fence.GrantUID]
	if !ok {
		return Fiber{}, fmt.Errorf("fiber %s: %w", fence, ErrNotFound)
	}
	f, ok := e.running[fence]
	if !ok {
		return Fiber{}, fmt.Errorf("fiber %s: %w", fence, ErrNotFound)
	}
	return *f, nil
}

// Remove takes a fiber out of the ledger, freeing its place: a release by the
// caller or an exit on its own. It reports the fiber and whether it was
// there.
func (l *Ledger) Remove(fence Fence) (Fiber, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.grants[fence.GrantUID]
	if !ok {
		return Fiber{}, false
	}
	f, ok := e.running[fence]
	if !ok {
		return Fiber{}, false
	}
	delete(e.running, fence)
	if f.Session != "" && e.sessions[f.Session] == fence {
		delete(e.sessions, f.Session)
	}
	return *f, true
}

// Snapshot is every admitted grant's state, ordered by UID.
func (l *Ledger) Snapshot() []GrantState {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]GrantState, 0, len(l.grants))
	for _, e := range l.grants {
		st := GrantState{Grant: e.grant, Reserved: e.reserved, LastSeq: e.seq}
		for _, f := range e.running {
			st.Running = append(st.Running, *f)
		}
		sortFibers(st.Running)
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Grant.UID < out[j].Grant.UID })
	return out
}

func sortFibers(fs []Fiber) {
	sort.Slice(fs, func(i, j int) bool {
		a, b := fs[i].Fence, fs[j].Fence
		if a.GrantUID != b.GrantUID {
			return a.GrantUID < b.GrantUID
		}
		c, _ := a.Compare(b)
		return c < 0
	})
}
