package fake

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Sparer  = (*Backend)(nil)
)

// Hooks inject errors into, or block, a Backend's methods. Each runs first,
// with the method's arguments; a non-nil error is returned as the method's
// and the fake changes nothing. A nil hook does nothing.
type Hooks struct {
	Warm  func(ctx context.Context, req backend.WarmRequest) error
	Clone func(ctx context.Context, req backend.CloneRequest) error
	Kill  func(ctx context.Context, fence core.Fence) error
	Stop  func(ctx context.Context, grantUID string) error
	// Park and Resume run first in the checkpoint methods (checkpoint.go),
	// once EnableCheckpoint has made them available.
	Park   func(ctx context.Context, req backend.ParkRequest) error
	Resume func(ctx context.Context, req backend.ResumeRequest) error
	// CheckpointIsolated, when set, answers CheckpointIsolated for
	// IsolationFiber once EnableCheckpoint ran (a CRIU without fiberd's
	// patches, say).
	CheckpointIsolated func(level backend.Isolation) error
}

// Backend is the fake. New returns one; it is safe for concurrent use.
type Backend struct {
	tier  core.Tier
	hooks Hooks

	// iso is what Isolation reports; SetIsolation changes it.
	iso backend.IsolationSupport

	mu      sync.Mutex
	warm    map[string]backend.WarmRequest
	levels  map[string]backend.Isolation // of each warm grant
	cold    map[string]bool              // warmed once, template died since
	fibers  map[core.Fence]backend.CloneRequest
	pid     int
	warms   int
	clones  int
	queue   []backend.Exit
	wake    chan struct{}
	closed  bool
	exits   chan backend.Exit
	done    chan struct{}
	stopped chan struct{}

	// ck is the checkpoint state (checkpoint.go); guarded by mu.
	ck checkpoints

	// spares are each warm grant's spare settings (warm, max) and how
	// often RenewSpares was called; guarded by mu.
	spares  map[string][2]int
	renewed map[string]int
}

// New returns a fake backend serving tier (core.TierWarm like the proc
// backend, core.TierBasic like exec), with hooks.
func New(tier core.Tier, hooks Hooks) *Backend {
	b := &Backend{
		tier: tier, hooks: hooks,
		iso:     backend.IsolationSupport{Level: backend.IsolationNone},
		warm:    make(map[string]backend.WarmRequest),
		levels:  make(map[string]backend.Isolation),
		cold:    make(map[string]bool),
		fibers:  make(map[core.Fence]backend.CloneRequest),
		spares:  make(map[string][2]int),
		renewed: make(map[string]int),
		pid:     10000,
		wake:    make(chan struct{}, 1),
		exits:   make(chan backend.Exit),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	go b.pump()
	return b
}

// Tier is the tier New was given.
func (b *Backend) Tier() core.Tier { return b.tier }

// Warm records the grant as warm. It fails as a hook says; with
// core.ErrTierGap for a non-zygote spec on a WARM fake; with core.ErrInvalid
// for a request without a grant UID or run directory, an invalid spec, or a
// grant already warm with another spec.
func (b *Backend) Warm(ctx context.Context, req backend.WarmRequest) error {
	if b.hooks.Warm != nil {
		if err := b.hooks.Warm(ctx, req); err != nil {
			return err
		}
	}
	uid := req.Grant.UID
	switch {
	case uid == "":
		return fmt.Errorf("warm: Grant.UID is empty: %w", core.ErrInvalid)
	case req.RunDir == "":
		return fmt.Errorf("grant %q: warm: RunDir is empty: %w", uid, core.ErrInvalid)
	}
	if err := req.Spec.Validate(); err != nil {
		return fmt.Errorf("grant %q: %w", uid, err)
	}
	if b.tier == core.TierWarm && !req.Spec.Zygote {
		return fmt.Errorf("grant %q: template is no zygote: %w", uid, core.ErrTierGap)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if got := grantLevel(b.iso, req); !got.AtLeast(req.MinIsolation) {
		return fmt.Errorf("grant %q: needs isolation %s, gets %s: %w", uid, req.MinIsolation, got, core.ErrTierGap)
	}
	if req.Spec.Network == template.NetworkNone && !b.iso.NetworkNone {
		return fmt.Errorf("grant %q: template asks for network none, which this backend cannot give: %w", uid, core.ErrTierGap)
	}
	if b.closed {
		return errors.New("fake backend: closed")
	}
	have, ok := b.warm[uid]
	if ok && !b.cold[uid] && !sameSpec(have, req) {
		return fmt.Errorf("grant %q: warm with another spec; stop it first: %w", uid, core.ErrInvalid)
	}
	if !ok || b.cold[uid] {
		b.spares[uid] = [2]int{req.Grant.Fibers.Warm, req.Grant.Fibers.Max}
	}
	b.warm[uid] = req
	b.levels[uid] = grantLevel(b.iso, req)
	delete(b.cold, uid)
	b.warms++
	return nil
}

// grantLevel is what a grant warmed with req gets under iso, as the real
// backends compute it.
func grantLevel(iso backend.IsolationSupport, req backend.WarmRequest) backend.Isolation {
	if req.Spec.Isolation == template.IsolationShared && iso.Level == backend.IsolationFiber {
		return backend.IsolationGrant
	}
	return iso.Level
}

// SetIsolation sets what Isolation reports and what Warm gives and checks
// MinIsolation and "network": "none" against, for grants warmed from now
// on. A new fake reports IsolationNone with nothing missing.
func (b *Backend) SetIsolation(s backend.IsolationSupport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.iso = s
}

// Isolation reports what SetIsolation set.
func (b *Backend) Isolation() backend.IsolationSupport {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.iso
}

// GrantIsolation reports the level a warm grant got, "" when it is not
// warm.
func (b *Backend) GrantIsolation(uid string) backend.Isolation {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.warm[uid]; !ok || b.cold[uid] {
		return ""
	}
	return b.levels[uid]
}

func sameSpec(a, b backend.WarmRequest) bool {
	return fmt.Sprint(a.Spec) == fmt.Sprint(b.Spec)
}

// Warmed reports whether uid is warm and its template has not died.
func (b *Backend) Warmed(uid string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.warm[uid]
	return ok && !b.cold[uid]
}

// Clone records a running fiber. It fails as a hook says (a hook may block
// until ctx ends); with backend.ErrCold for a grant not warm; with
// core.ErrInvalid for a missing listener, an oversized payload or a fence
// already running; with ctx's error when ctx ended before the fiber was
// recorded.
func (b *Backend) Clone(ctx context.Context, req backend.CloneRequest) (backend.Fiber, error) {
	if b.hooks.Clone != nil {
		if err := b.hooks.Clone(ctx, req); err != nil {
			return backend.Fiber{}, err
		}
	}
	f := req.Fence
	switch {
	case req.Listener == nil:
		return backend.Fiber{}, fmt.Errorf("fiber %s: clone: Listener is nil: %w", f, core.ErrInvalid)
	case len(req.Payload) > backend.MaxPayload:
		return backend.Fiber{}, fmt.Errorf("fiber %s: clone: payload over %d bytes: %w", f, backend.MaxPayload, core.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return backend.Fiber{}, fmt.Errorf("fiber %s: %w", f, err)
	}
	network, addr := listenerAddr(req.Listener)
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.warm[f.GrantUID]; !ok || b.cold[f.GrantUID] || b.closed {
		return backend.Fiber{}, fmt.Errorf("grant %q: %w", f.GrantUID, backend.ErrCold)
	}
	if _, ok := b.fibers[f]; ok {
		return backend.Fiber{}, fmt.Errorf("fiber %s: already running: %w", f, core.ErrInvalid)
	}
	req.Listener = nil // not kept: the caller closes its copy
	b.fibers[f] = req
	b.ck.noteListener(f, network, addr)
	b.pid++
	b.clones++
	return backend.Fiber{Fence: f, PID: b.pid, Isolation: b.levels[f.GrantUID]}, nil
}

// Kill ends a running fiber and queues its Exit (Killed). It fails as a
// hook says, or with core.ErrNotFound for a fence not running.
func (b *Backend) Kill(ctx context.Context, fence core.Fence) error {
	if b.hooks.Kill != nil {
		if err := b.hooks.Kill(ctx, fence); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.fibers[fence]; !ok {
		return fmt.Errorf("fiber %s: %w", fence, core.ErrNotFound)
	}
	delete(b.fibers, fence)
	b.pushLocked(backend.Exit{GrantUID: fence.GrantUID, Fence: fence, Reason: backend.ExitReason{Killed: true}})
	return nil
}

// Stop kills every fiber of uid (an Exit each) and forgets the grant. A
// grant not warm is no error. It fails as a hook says.
func (b *Backend) Stop(ctx context.Context, uid string) error {
	if b.hooks.Stop != nil {
		if err := b.hooks.Stop(ctx, uid); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopLocked(uid)
	return nil
}

func (b *Backend) stopLocked(uid string) {
	for _, f := range b.sortedLocked(uid) {
		delete(b.fibers, f)
		b.pushLocked(backend.Exit{GrantUID: uid, Fence: f, Reason: backend.ExitReason{Killed: true}})
	}
	delete(b.warm, uid)
	delete(b.levels, uid)
	delete(b.cold, uid)
	delete(b.spares, uid)
}

// SetSpares records warm and max for a warm grant (Warm starts them at the
// grant's Fibers); the fake forks nothing.
func (b *Backend) SetSpares(uid string, warm, max int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.warm[uid]; ok && !b.cold[uid] {
		b.spares[uid] = [2]int{warm, max}
	}
}

// RenewSpares counts the call for a warm grant (see Renewed).
func (b *Backend) RenewSpares(uid string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.warm[uid]; ok && !b.cold[uid] {
		b.renewed[uid]++
	}
}

// Spares reports a warm grant's spares as if every wanted one were ready:
// min(warm, max - running), HandOver set.
func (b *Backend) Spares(uid string) backend.SpareStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	sp, ok := b.spares[uid]
	if !ok || b.cold[uid] {
		return backend.SpareStatus{}
	}
	n := max(min(sp[0], sp[1]-len(b.sortedLocked(uid))), 0)
	return backend.SpareStatus{Supported: true, Want: n, Ready: n}
}

// SparePIDs is always empty: the fake has no processes.
func (b *Backend) SparePIDs(uid string) []int { return nil }

// SpareSettings are the warm and max grant uid's spares were last set to,
// and whether it is warm.
func (b *Backend) SpareSettings(uid string) (warm, max int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sp, ok := b.spares[uid]
	return sp[0], sp[1], ok
}

// Renewed counts RenewSpares calls for uid.
func (b *Backend) Renewed(uid string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.renewed[uid]
}

// Exits is the queue of ended fibers and died templates; Close closes it.
func (b *Backend) Exits() <-chan backend.Exit { return b.exits }

// Close stops every grant, drops undelivered exits and closes Exits. It is
// idempotent and returns nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.done
		return nil
	}
	b.closed = true
	for uid := range b.warm {
		b.stopLocked(uid)
	}
	b.mu.Unlock()
	close(b.stopped)
	<-b.done
	return nil
}

// Exit makes running fiber fence end on its own with exit code, as a
// process that returns would. It reports whether the fiber was running.
func (b *Backend) Exit(fence core.Fence, code int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.fibers[fence]; !ok {
		return false
	}
	delete(b.fibers, fence)
	b.pushLocked(backend.Exit{GrantUID: fence.GrantUID, Fence: fence, Reason: backend.ExitReason{Code: code}})
	return true
}

// End makes running fiber fence end with reason, as when the kernel ends
// it at its leaf's memory.max (reason.MemoryMax). It reports whether the
// fiber was running.
func (b *Backend) End(fence core.Fence, reason backend.ExitReason) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.fibers[fence]; !ok {
		return false
	}
	delete(b.fibers, fence)
	b.pushLocked(backend.Exit{GrantUID: fence.GrantUID, Fence: fence, Reason: reason})
	return true
}

// DieTemplate makes warm grant uid's zygote die: its fibers end
// (TemplateDied), then the template's own Exit is queued, and the grant is
// cold until warmed again. It reports whether the grant was warm.
func (b *Backend) DieTemplate(uid string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.warm[uid]; !ok || b.cold[uid] {
		return false
	}
	for _, f := range b.sortedLocked(uid) {
		delete(b.fibers, f)
		b.pushLocked(backend.Exit{GrantUID: uid, Fence: f, Reason: backend.ExitReason{TemplateDied: true}})
	}
	b.cold[uid] = true
	delete(b.spares, uid)
	b.pushLocked(backend.Exit{GrantUID: uid, Template: true, Reason: backend.ExitReason{Signal: "SIGKILL"}})
	return true
}

// Running lists the running fibers of uid ("" for every grant), ordered.
func (b *Backend) Running(uid string) []core.Fence {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sortedLocked(uid)
}

// Request is the CloneRequest a running fiber was made with (without its
// listener), and whether it runs.
func (b *Backend) Request(fence core.Fence) (backend.CloneRequest, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.fibers[fence]
	return r, ok
}

// WarmRequest is the request grant uid was warmed with, and whether it is
// warm.
func (b *Backend) WarmRequest(uid string) (backend.WarmRequest, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.warm[uid]
	return r, ok && !b.cold[uid]
}

// Counts are how many Warm and Clone calls succeeded so far.
func (b *Backend) Counts() (warms, clones int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.warms, b.clones
}

func (b *Backend) sortedLocked(uid string) []core.Fence {
	var out []core.Fence
	for f := range b.fibers {
		if uid == "" || f.GrantUID == uid {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GrantUID != out[j].GrantUID {
			return out[i].GrantUID < out[j].GrantUID
		}
		c, _ := out[i].Compare(out[j])
		return c < 0
	})
	return out
}

func (b *Backend) pushLocked(x backend.Exit) {
	b.queue = append(b.queue, x)
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// pump hands queued exits to the Exits channel in order until Close.
func (b *Backend) pump() {
	defer close(b.done)
	defer close(b.exits)
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.mu.Unlock()
			select {
			case <-b.wake:
				continue
			case <-b.stopped:
				return
			}
		}
		x := b.queue[0]
		b.mu.Unlock()
		select {
		case b.exits <- x:
			b.mu.Lock()
			b.queue = b.queue[1:]
			b.mu.Unlock()
		case <-b.stopped:
			return
		}
	}
}
