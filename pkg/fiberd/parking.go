package fiberd

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
)

// parking owns the CHECKPOINT tier's state: every grant's parked sessions,
// each grant's park turn, and the queue of pressure parks. The agent
// reaches it through a few named calls: open and close a grant (its
// reconcile), newEpoch (an epoch bump), claim, takeExact and put a parked
// session (a Clone, a park, a release), turn (one park of a grant at a
// time), status and count (the status and the metrics), and pressure (a
// Clone asking for room). A grant is open from its admission to its
// yield. Its mu guards grants and epoch and is held only
// to read or write them: never across I/O, a dump, or a call out of this
// type. It is the last lock in the agent's order (docs/architecture.md,
// Locks).
//
// A parked session has one owner at a time: this type's map, or the one
// call (resume, release, close, newEpoch) that took it out of the map. A
// session is kept only while its grant is open with the template it was
// parked with, in the epoch it was parked in; put deletes any other.
type parking struct {
	// Set once by initPark, read without mu.

	// ck is the WARM backend's Checkpointer when its CHECKPOINT tier
	// works; nil otherwise, and why says what is missing.
	ck  backend.Checkpointer
	why error
	// dir is StateDir/private/parked: one directory of images per grant.
	dir   string
	m     *parkMetrics
	log   logr.Logger
	ports *endpoint.Allocator // nil for the unix family
	// size is a fiber's size for a pressure park: fiberSize, replaced by
	// tests before Run.
	size func(h *fiberHandle) (int64, error)
	// bg runs the deletions of spent images, off the resume's path; Run
	// waits for it before it returns.
	bg sync.WaitGroup
	// asks carries pressure parks to pressureLoop, which Run starts.
	asks chan pressureAsk

	mu     sync.Mutex
	epoch  uint64                  // the epoch sessions are kept in; guarded by mu
	grants map[string]*parkedGrant // by grant UID; guarded by mu
}

// parkedGrant is one open grant's part of parking: the grant is admitted
// with template, and a park of it may be kept.
type parkedGrant struct {
	template string
	sessions map[string]*parkedSession // by session name
	// turn holds a token while one of the grant's parks runs.
	turn chan struct{}
	// pressureAt is the pressure reading (its time) a pressure park was
	// last asked for.
	pressureAt time.Time
}

// parkedSession is one parked session.
type parkedSession struct {
	session  string
	fence    core.Fence // the fiber it was parked as
	origin   core.Fence // the fence the session was created as: its release key's (keyFence)
	image    backend.Image
	template string // the grant's template reference at park
	port     int    // the TCP port held for it, 0 for none
	endpoint string // where it served, and serves again for TCP
	at       time.Time
	by       string
}

// open says grant uid is admitted with template: parks of it are kept
// from now on.
func (pk *parking) open(uid, template string) {
	pk.mu.Lock()
	if pk.grants == nil {
		pk.grants = map[string]*parkedGrant{}
	}
	g := pk.grants[uid]
	if g == nil {
		g = &parkedGrant{turn: make(chan struct{}, 1)}
		pk.grants[uid] = g
	}
	g.template = template
	pk.mu.Unlock()
}

// close says grant uid is yielded: its parked sessions and its images
// directory are deleted, and no park of it is kept until it is opened
// again. A park in flight keeps its turn and finds the grant closed.
func (pk *parking) close(uid string) {
	pk.mu.Lock()
	var drop map[string]*parkedSession
	if g := pk.grants[uid]; g != nil {
		drop = g.sessions
		delete(pk.grants, uid)
	}
	pk.mu.Unlock()
	pk.deleteAll(uid, drop, "yielded")
	if pk.dir != "" {
		if err := os.RemoveAll(filepath.Join(pk.dir, uid)); err != nil {
			pk.log.Error(err, "Grant's parked images directory not removed", "grant", uid)
		}
	}
}

// newEpoch says the epoch moved to epoch: every parked session is deleted
// (no image of an older epoch is ever resumed), and only parks of epoch
// are kept from now on.
func (pk *parking) newEpoch(epoch uint64) {
	pk.mu.Lock()
	pk.epoch = epoch
	drop := map[string]map[string]*parkedSession{}
	for uid, g := range pk.grants {
		if len(g.sessions) > 0 {
			drop[uid] = g.sessions
		}
		g.sessions = nil
	}
	pk.mu.Unlock()
	for uid, m := range drop {
		pk.deleteAll(uid, m, "epoch")
	}
}

// deleteAll deletes uid's parked sessions m.
func (pk *parking) deleteAll(uid string, m map[string]*parkedSession, reason string) {
	for _, p := range m {
		pk.delete(p, reason)
	}
	if len(m) > 0 {
		pk.log.Info("Parked sessions deleted", "grant", uid, "count", len(m), "reason", reason)
	}
}

// delete deletes p's image and frees its port. reason labels
// fiberd_parked_images_deleted_total.
func (pk *parking) delete(p *parkedSession, reason string) {
	if p.port != 0 && pk.ports != nil {
		pk.ports.Release(p.port)
	}
	pk.removeImage(p.image.Dir, reason)
	pk.log.V(1).Info("Parked session deleted", "fiber", p.fence.String(), "session", p.session, "reason", reason)
}

// removeImage deletes an image directory, logging a failure.
func (pk *parking) removeImage(dir, reason string) {
	if err := backend.RemoveImage(dir); err != nil {
		pk.log.Error(err, "Parked image not deleted", "image", dir)
	}
	pk.m.deleted.WithLabelValues(reason).Inc()
}

// put keeps p, unless its grant is not open with p's template or p is of
// another epoch: then p is deleted (its image, its port), and put reports
// false. A session parked under p's name before is deleted.
func (pk *parking) put(p *parkedSession) bool {
	uid := p.fence.GrantUID
	pk.mu.Lock()
	g := pk.grants[uid]
	ok := g != nil && g.template == p.template && pk.epoch == p.fence.Epoch
	var old *parkedSession
	if ok {
		if g.sessions == nil {
			g.sessions = map[string]*parkedSession{}
		}
		old = g.sessions[p.session]
		g.sessions[p.session] = p
	}
	pk.mu.Unlock()
	if old != nil && old != p {
		pk.delete(old, "replaced")
	}
	if !ok {
		pk.delete(p, "stale")
	}
	return ok
}

// peek returns grant uid's parked session of session, nil when none; it
// stays parked.
func (pk *parking) peek(uid, session string) *parkedSession {
	if session == "" {
		return nil
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if g := pk.grants[uid]; g != nil {
		return g.sessions[session]
	}
	return nil
}

// claim takes grant uid's parked session of session out for a Clone that
// holds the session's gate, once proof accepts the session's key (its
// origin); a nil proof is the session's owner. It returns nil, nil when no
// session is parked (or it was deleted meanwhile), and nil with proof's
// error when the caller is refused: the session then stays parked. proof
// is called without parking's lock. The caller owns what it claimed: it
// resumes it, puts it back or deletes it.
func (pk *parking) claim(uid, session string, proof func(origin core.Fence) error) (*parkedSession, error) {
	p := pk.peek(uid, session)
	if p == nil {
		return nil, nil
	}
	if proof != nil {
		if err := proof(p.origin); err != nil {
			return nil, err
		}
	}
	if !pk.takeExact(p) {
		return nil, nil
	}
	return p, nil
}

// takeExact takes p out when it is still parked, and reports whether it
// was.
func (pk *parking) takeExact(p *parkedSession) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	g := pk.grants[p.fence.GrantUID]
	if g == nil || g.sessions[p.session] != p {
		return false
	}
	delete(g.sessions, p.session)
	return true
}

// parkedAs returns the parked session that was fiber fence, nil when
// none; it stays parked.
func (pk *parking) parkedAs(fence core.Fence) *parkedSession {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	g := pk.grants[fence.GrantUID]
	if g == nil {
		return nil
	}
	for _, p := range g.sessions {
		if p.fence == fence {
			return p
		}
	}
	return nil
}

// count is how many sessions of grant uid are parked and their images'
// bytes.
func (pk *parking) count(uid string) (n int, bytes int64) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if g := pk.grants[uid]; g != nil {
		for _, p := range g.sessions {
			n++
			bytes += p.image.Bytes
		}
	}
	return n, bytes
}

// status is grant uid's parked sessions for the status, by session name.
func (pk *parking) status(uid string) []api.ParkedSession {
	pk.mu.Lock()
	var out []api.ParkedSession
	if g := pk.grants[uid]; g != nil {
		for _, p := range g.sessions {
			out = append(out, api.ParkedSession{
				Session: p.session, FiberID: p.fence.String(), ImageBytes: p.image.Bytes, OwnBytes: p.image.OwnBytes, ParkedAt: p.at, By: p.by,
			})
		}
	}
	pk.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Session < out[j].Session })
	return out
}

// turn waits, until ctx ends, for grant uid's turn to park: one park per
// grant at a time, so its bounds are counted exactly. give ends the turn.
// It answers errClosed for a grant that is not open.
func (pk *parking) turn(ctx context.Context, uid string) (give func(), err error) {
	pk.mu.Lock()
	g := pk.grants[uid]
	pk.mu.Unlock()
	if g == nil {
		return nil, errClosed
	}
	t := g.turn
	select {
	case t <- struct{}{}:
		return func() { <-t }, nil
	default:
	}
	select {
	case t <- struct{}{}:
		return func() { <-t }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// firstAsk reports whether a pressure park of open grant uid is yet to be
// asked for the pressure reading taken at reading, and marks it asked.
func (pk *parking) firstAsk(uid string, reading time.Time) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	g := pk.grants[uid]
	if g == nil || g.pressureAt.Equal(reading) {
		return false
	}
	g.pressureAt = reading
	return true
}
