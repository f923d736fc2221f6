package fiberd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
)

// Parking: the CHECKPOINT tier in the agent.
//
// A running fiber of a session is parked by POST /v1/park (or, with
// ParkLimits.Pressure, by the agent for its grant's memory pressure): under
// the session's gate the WARM backend (a backend.Checkpointer) writes its
// process tree to an image in StateDir/private/parked/<uid>/<epoch>-<seq>
// and ends it; the fiber leaves the ledger (its place under fibers.max is free) and
// its session is kept as parked on the grant's slot. A Clone naming the
// session resumes it: a reservation (a place, a new fence) as for a
// new fiber, then backend Resume of the image into a new leaf, with the
// fiber's listener: a new unix socket, or its TCP address bound again (the
// port stays held while it is parked). The image is deleted once resumed,
// when the parked fiber id is released, and when the grant ends, the epoch
// moves or fiberd starts (images are never resumed across epochs).
//
// A parked session has one owner at a time: the slot's map, or the one
// call (resume, release, yield, epoch bump) that took it out of the map.
// A resume that fails puts it back unless it is unusable or its grant,
// template or epoch moved meanwhile; then it is deleted.

// Defaults of ParkLimits.
const (
	// DefaultParkMaxImages bounds the parked sessions of one grant.
	DefaultParkMaxImages = 32
	// DefaultParkMaxBytes bounds the images of one grant, in bytes.
	DefaultParkMaxBytes = 2 << 30
	// DefaultParkTimeout bounds one park.
	DefaultParkTimeout = 30 * time.Second
	// DefaultParkIdleAfter is how long a fiber must go unnamed by any
	// Clone before a pressure park may take it.
	DefaultParkIdleAfter = 30 * time.Second
)

// ParkLimits configure parking (the CHECKPOINT tier). A zero field takes
// its default; Config.Validate refuses a negative one.
type ParkLimits struct {
	// MaxImages bounds the parked sessions of one grant: a park past it is
	// refused (507) and the fiber keeps running. Default
	// DefaultParkMaxImages (32).
	MaxImages int
	// MaxBytes bounds the summed size of one grant's images: a park is
	// refused (507) when the room left is used up, and a fiber whose
	// memory is larger than the room left is refused before it is dumped.
	// The estimate leaves out an image's metadata, so the sum may pass the
	// bound by a few hundred KiB per image. Default DefaultParkMaxBytes
	// (2 GiB).
	MaxBytes int64
	// Timeout bounds one park, from the gate of its session to the image
	// on disk; the answer to POST /v1/park gets it on top of
	// Limits.WriteTimeout. Default DefaultParkTimeout (30 s).
	Timeout time.Duration
	// Pressure lets a Clone that its grant's memory pressure would shed
	// (Config.PressureThreshold) park the grant's largest idle fiber
	// instead, and be served: at most one park per pressure reading (one
	// a second), of a fiber with a session (not the Clone's own) that no
	// Clone named for IdleAfter and with no connection open to its
	// endpoint; its size is its private dirty memory. When no fiber can
	// be parked, the Clone is shed as before. Default false (-pressure-park).
	Pressure bool
	// IdleAfter is how long a fiber must go unnamed by any Clone (created,
	// attached or resumed) before a pressure park may take it. Default
	// DefaultParkIdleAfter (30 s).
	IdleAfter time.Duration
}

func (l ParkLimits) withDefaults() ParkLimits {
	if l.MaxImages == 0 {
		l.MaxImages = DefaultParkMaxImages
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultParkMaxBytes
	}
	if l.Timeout == 0 {
		l.Timeout = DefaultParkTimeout
	}
	if l.IdleAfter == 0 {
		l.IdleAfter = DefaultParkIdleAfter
	}
	return l
}

func (l ParkLimits) validate() error {
	switch {
	case l.MaxImages < 0:
		return fmt.Errorf("Park.MaxImages %d is negative: set -park-max-images to a count, or 0 for the default %d", l.MaxImages, DefaultParkMaxImages)
	case l.MaxBytes < 0:
		return fmt.Errorf("Park.MaxBytes %d is negative: set -park-max-bytes to a size, or 0 for the default %d", l.MaxBytes, DefaultParkMaxBytes)
	case l.Timeout < 0:
		return fmt.Errorf("Park.Timeout %v is negative: use 0 for the default %v", l.Timeout, DefaultParkTimeout)
	case l.IdleAfter < 0:
		return fmt.Errorf("Park.IdleAfter %v is negative: set -park-idle-after to a duration, or 0 for the default %v", l.IdleAfter, DefaultParkIdleAfter)
	}
	return nil
}

// What parked a session (api.ParkedSession.By, the "by" label of
// fiberd_parks_total).
const (
	parkByAPI      = "api"
	parkByPressure = "pressure"
)

// The agent's park errors; writeError maps them (and the backend's
// ErrBusy, ErrTooLarge and ErrNoSpace) to 409 and 507.
var (
	// errBusy is a park that cannot proceed now: another Clone or park
	// of the session, or another park of the grant, holds it up past the
	// park's time.
	errBusy = errors.New("busy")
	// errNoRoom is a park refused by ParkLimits.
	errNoRoom = errors.New("no room for another parked image")
)

// parkState is the agent's part of the CHECKPOINT tier.
type parkState struct {
	// ck is the WARM backend's Checkpointer when its CHECKPOINT tier
	// works; nil otherwise, and why says what is missing.
	ck  backend.Checkpointer
	why error
	// dir is StateDir/private/parked: one directory of images per grant.
	dir string
	m   *parkMetrics
	// size is a fiber's size for a pressure park: fiberSize, replaced by
	// tests before Run.
	size func(h *fiberHandle) (int64, error)
	// bg runs the deletions of spent images, off the resume's path; Run
	// waits for it before it returns.
	bg sync.WaitGroup
}

// parkedSession is one parked session on its grant's slot.
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

// initPark prepares parking in New: it deletes the images of a previous
// run (of an older epoch: never resumed), asks the WARM backend whether it
// can checkpoint (once; said in the log and the status) and registers the
// park metrics.
func (a *Agent) initPark(ctx context.Context, private string) error {
	a.park.dir = filepath.Join(private, "parked")
	a.park.size = a.fiberSize
	if err := os.RemoveAll(a.park.dir); err != nil {
		return fmt.Errorf("fiberd: parked images of the previous run in %s: %w", a.park.dir, err)
	}
	if err := os.Mkdir(a.park.dir, 0o700); err != nil {
		return fmt.Errorf("fiberd: parked images directory: %w", err)
	}
	ck, ok := a.cfg.Warm.(backend.Checkpointer)
	switch {
	case a.cfg.Warm == nil:
		a.park.why = fmt.Errorf("no WARM backend: only fibers forked from a zygote can be parked: %w", core.ErrTierGap)
	case !ok:
		a.park.why = fmt.Errorf("the WARM backend cannot checkpoint: %w", core.ErrTierGap)
	default:
		if err := ck.CheckpointSupport(ctx); err != nil {
			a.park.why = err
		} else {
			a.park.ck = ck
		}
	}
	if a.park.ck != nil {
		a.log.Info("CHECKPOINT tier present: fibers of zygote templates can be parked", "images", a.park.dir,
			"maxImages", a.cfg.Park.MaxImages, "maxBytes", a.cfg.Park.MaxBytes, "pressurePark", a.cfg.Park.Pressure)
	} else {
		a.log.Info("CHECKPOINT tier absent: fibers cannot be parked (POST /v1/park answers 412)", "reason", a.park.why.Error())
	}
	var err error
	a.park.m, err = newParkMetrics(a.cfg.Registry, a)
	if err != nil {
		return fmt.Errorf("fiberd: metrics: %w", err)
	}
	return nil
}

// Checkpoint says whether this agent can park fibers (the CHECKPOINT tier)
// and, when not, what is missing; found once by New. cmd/fiberd -dev says
// it at start.
func (a *Agent) Checkpoint() api.Checkpoint { return a.checkpointStatus() }

// checkpointStatus is the CHECKPOINT tier's state for the status.
func (a *Agent) checkpointStatus() api.Checkpoint {
	if a.park.ck != nil {
		return api.Checkpoint{Available: true}
	}
	c := api.Checkpoint{}
	if a.park.why != nil {
		c.Reason = a.park.why.Error()
	}
	return c
}

// tierOf is the tier backend b serves grant uid's fibers at: CHECKPOINT
// for the WARM backend when it can park them, else b's own. A grant
// served isolated ("grant" or "fiber") runs in a user namespace of its
// own, which the CRIU fiberd drives cannot dump (design decision 65), so
// it is served at WARM.
func (a *Agent) tierOf(b backend.Backend, uid string) core.Tier {
	if b == nil {
		return ""
	}
	if a.park.ck != nil && b == a.cfg.Warm && parkable(b.GrantIsolation(uid)) {
		return core.TierCheckpoint
	}
	return b.Tier()
}

// parkable reports whether fibers isolated at level can be parked: those
// without isolation, and those of a grant not warm yet ("").
func parkable(level backend.Isolation) bool {
	return level == "" || level == backend.IsolationNone
}

// errIsolatedPark says why an isolated grant's fibers cannot be parked,
// and the way out.
func errIsolatedPark(level backend.Isolation) error {
	return fmt.Errorf("its grant runs at isolation %q, in a user namespace of its own, which CRIU cannot dump here; run fiberd with -isolation none to park this grant's fibers", level)
}

// parkFloor refuses, once warm, a grant needing CHECKPOINT whose fibers
// its isolation keeps from being parked (a tier gap: 412).
func (a *Agent) parkFloor(s *slot) error {
	v := s.view()
	if v.grant.MinTier != core.TierCheckpoint || v.backend == nil {
		return nil
	}
	if t := a.tierOf(v.backend, s.uid); t != core.TierCheckpoint {
		return fmt.Errorf("grant %q: needs tier CHECKPOINT: %v: %w", s.uid, errIsolatedPark(v.backend.GrantIsolation(s.uid)), core.ErrTierGap)
	}
	return nil
}

// handlePark serves POST /v1/park.
func (a *apiServer) handlePark(w http.ResponseWriter, r *http.Request) {
	f, err := a.fiberOf(w, r)
	if err != nil {
		a.writeError(w, err)
		return
	}
	resp, err := a.parkFiber(r.Context(), f, parkByAPI, false)
	if err != nil {
		if a.writeError(w, err) == outcomeInternal {
			a.log.Error(err, "Park failed", "fiber", f.Fence.String())
		}
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// parkFiber parks running fiber f (see the comment at the top). by says
// who asks; try makes it give up at once when the session's gate or the
// grant's park turn is taken (a pressure park). Errors: a tier gap (412)
// when the fiber's tier cannot park, core.ErrInvalid (400) for a fiber
// without a session, core.ErrNotFound (404) when it ended first, errBusy
// or backend.ErrBusy (409), errNoRoom, backend.ErrTooLarge or
// backend.ErrNoSpace (507), anything else a fault (500). On every error
// but a fault of CRIU's the fiber runs on.
func (a *Agent) parkFiber(ctx context.Context, f core.Fiber, by string, try bool) (resp api.ParkResponse, err error) {
	fence, uid := f.Fence, f.Fence.GrantUID
	start := a.cfg.Clock.Now()
	defer func() { a.park.m.parked(by, err, a.cfg.Clock.Since(start)) }()
	h, _ := f.Handle.(*fiberHandle)
	if h == nil || h.backend == nil {
		return resp, &tierGap{fence: fence, tier: f.Tier, why: a.park.why}
	}
	if t := a.tierOf(h.backend, uid); t != core.TierCheckpoint {
		why := a.park.why
		switch {
		case h.backend != a.cfg.Warm:
			why = errors.New("only fibers forked from a zygote (a template with \"zygote\": true) can be parked; this one was started by fork+exec")
		case a.park.ck != nil:
			why = errIsolatedPark(h.backend.GrantIsolation(uid))
		}
		return resp, &tierGap{fence: fence, tier: t, why: why}
	}
	if f.Session == "" {
		return resp, fmt.Errorf("fiber %s has no session: a parked fiber comes back when a Clone names its session, so only a fiber cloned with a session can be parked: %w", fence, core.ErrInvalid)
	}
	s := a.slotOf(uid)
	if s == nil {
		return resp, errNotFound(fence)
	}
	ctx, cancel := core.WithTimeout(ctx, a.cfg.Clock, a.cfg.Park.Timeout)
	defer cancel()
	gateCtx := ctx
	if try {
		done, cancelNow := context.WithCancel(ctx)
		cancelNow()
		gateCtx = done
	}
	unlock, err := a.ledger.LockSession(gateCtx, uid, f.Session)
	if err != nil {
		return resp, fmt.Errorf("fiber %s: another Clone or park of its session is under way: %w", fence, errBusy)
	}
	defer unlock()
	if err := s.takeParkTurn(gateCtx); err != nil {
		return resp, fmt.Errorf("fiber %s: another park of grant %q is under way: %w", fence, uid, errBusy)
	}
	defer s.giveParkTurn()
	if _, err := a.ledger.Lookup(fence); err != nil {
		return resp, err
	}

	s.mu.Lock()
	n, used, tmpl := len(s.parked), parkedBytes(s.parked), s.grant.Template
	s.mu.Unlock()
	room := a.cfg.Park.MaxBytes - used
	switch {
	case n >= a.cfg.Park.MaxImages:
		return resp, fmt.Errorf("fiber %s: grant %q has %d parked sessions, its bound (-park-max-images %d): release or resume one first: %w", fence, uid, n, a.cfg.Park.MaxImages, errNoRoom)
	case room <= 0:
		return resp, fmt.Errorf("fiber %s: grant %q's parked images hold %d bytes, its bound (-park-max-bytes %d): release or resume one first: %w", fence, uid, used, a.cfg.Park.MaxBytes, errNoRoom)
	}
	dir := filepath.Join(a.park.dir, uid, strconv.FormatUint(fence.Epoch, 10)+"-"+strconv.FormatUint(fence.Seq, 10))
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return resp, fmt.Errorf("fiber %s: park: %w", fence, err)
	}
	img, err := a.park.ck.Park(ctx, backend.ParkRequest{Fence: fence, Dir: dir, Template: tmpl, MaxBytes: room})
	if err != nil {
		if errors.Is(err, backend.ErrTooLarge) {
			err = fmt.Errorf("%w: grant %q has %d bytes of room left for parked images (-park-max-bytes %d)", err, uid, room, a.cfg.Park.MaxBytes)
		}
		if ctx.Err() != nil && !errors.Is(err, core.ErrNotFound) {
			err = fmt.Errorf("%w (the park's bound is %v)", err, a.cfg.Park.Timeout)
		}
		return resp, err
	}

	// The fiber has ended; its Exit (Parked) is left to this call.
	fiber, ok := a.ledger.Remove(fence)
	if !ok {
		// Released, yielded, or of an ended epoch while it was dumped.
		a.removeImage(img.Dir, "ended")
		return resp, fmt.Errorf("fiber %s ended while it was parked; its image is deleted: %w", fence, core.ErrNotFound)
	}
	p := &parkedSession{session: fiber.Session, fence: fence, origin: keyFence(fiber), image: img, template: tmpl, endpoint: fiber.Endpoint, at: a.cfg.Clock.Now(), by: by}
	if fh, ok := fiber.Handle.(*fiberHandle); ok {
		// The port stays held for the resume, which binds it again; a unix
		// socket file is freed (the resume binds a new one). The handle is
		// not changed: a snapshot taken before the park may still read it.
		p.port = fh.port
		if fh.sock != "" {
			_ = os.Remove(fh.sock)
		}
	}
	if !a.putParked(s, p) {
		a.notify()
		return resp, fmt.Errorf("fiber %s: its grant ended or the epoch moved while it was parked; its image is deleted: %w", fence, core.ErrNotFound)
	}
	a.log.V(1).Info("Fiber parked", "fiber", fence.String(), "session", p.session, "by", by, "image", img.Dir, "bytes", img.Bytes, "own", img.OwnBytes, "took", a.cfg.Clock.Since(start))
	a.notify()
	return api.ParkResponse{FiberID: fence.String(), Session: p.session, ImageBytes: img.Bytes, OwnBytes: img.OwnBytes}, nil
}

// parkedBytes sums the images' sizes.
func parkedBytes(m map[string]*parkedSession) int64 {
	var n int64
	for _, p := range m {
		n += p.image.Bytes
	}
	return n
}

// takeParkTurn waits, until ctx ends, for the grant's turn to park: one
// park per grant at a time, so its bounds are counted exactly.
func (s *slot) takeParkTurn(ctx context.Context) error {
	s.mu.Lock()
	if s.parkTurn == nil {
		s.parkTurn = make(chan struct{}, 1)
	}
	turn := s.parkTurn
	s.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slot) giveParkTurn() {
	s.mu.Lock()
	turn := s.parkTurn
	s.mu.Unlock()
	<-turn
}

// putParked keeps p on slot s, unless its grant was yielded or its
// template changed, or the epoch moved, since it was parked: then its image
// is deleted (and its port freed), and putParked reports false.
func (a *Agent) putParked(s *slot, p *parkedSession) bool {
	s.mu.Lock()
	ok := !s.gone && s.admitted && s.grant.Template == p.template && a.ledger.Epoch() == p.fence.Epoch
	var old *parkedSession
	if ok {
		if s.parked == nil {
			s.parked = map[string]*parkedSession{}
		}
		old = s.parked[p.session]
		s.parked[p.session] = p
	}
	s.mu.Unlock()
	if old != nil && old != p {
		a.deleteParked(old, "replaced")
	}
	if !ok {
		a.deleteParked(p, "stale")
	}
	return ok
}

// peekParked returns session's parked session on slot s, nil when it has
// none; it stays on the slot, its owner.
func (s *slot) peekParked(session string) *parkedSession {
	if s == nil || session == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parked[session]
}

// takeParked takes session's parked session out of slot s, nil when it has
// none. The caller owns it.
func (s *slot) takeParked(session string) *parkedSession {
	if s == nil || session == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.parked[session]
	delete(s.parked, session)
	return p
}

// deleteParked deletes p's image and frees its port. reason labels
// fiberd_parked_images_deleted_total.
func (a *Agent) deleteParked(p *parkedSession, reason string) {
	if p.port != 0 && a.ports != nil {
		a.ports.Release(p.port)
	}
	a.removeImage(p.image.Dir, reason)
	a.log.V(1).Info("Parked session deleted", "fiber", p.fence.String(), "session", p.session, "reason", reason)
}

// removeImage deletes an image directory, logging a failure.
func (a *Agent) removeImage(dir, reason string) {
	if err := backend.RemoveImage(dir); err != nil {
		a.log.Error(err, "Parked image not deleted", "image", dir)
	}
	a.park.m.deleted.WithLabelValues(reason).Inc()
}

// dropParked deletes every parked session of slot s: its grant ended
// (yield) or the epoch moved. With grantEnded the grant's image directory
// goes too.
func (a *Agent) dropParked(s *slot, reason string, grantEnded bool) {
	s.mu.Lock()
	parked := s.parked
	s.parked = nil
	s.mu.Unlock()
	for _, p := range parked {
		a.deleteParked(p, reason)
	}
	if grantEnded && a.park.dir != "" {
		if err := os.RemoveAll(filepath.Join(a.park.dir, s.uid)); err != nil {
			a.log.Error(err, "Grant's parked images directory not removed", "grant", s.uid)
		}
	}
	if len(parked) > 0 {
		a.log.Info("Parked sessions deleted", "grant", s.uid, "count", len(parked), "reason", reason)
	}
}

// dropAllParked deletes the parked sessions of every grant: the epoch
// moved, and no image of the old one may be resumed.
func (a *Agent) dropAllParked(reason string) {
	a.mu.Lock()
	slots := make([]*slot, 0, len(a.slots))
	for _, s := range a.slots {
		slots = append(slots, s)
	}
	a.mu.Unlock()
	for _, s := range slots {
		a.dropParked(s, reason, false)
	}
}

// resume brings parked session p back for Clone reservation res on the
// grant's slot s as v shows it: its listener (a new unix socket, or its
// TCP address bound again), a new leaf, the backend's Resume, and the
// commit. Every failure is a capacity miss; the image is deleted when it
// is unusable or spent, and put back on the slot otherwise. The caller
// cancels res on an error.
func (a *Agent) resume(ctx context.Context, res *core.Reservation, v slotView, s *slot, p *parkedSession) (api.CloneResponse, error) {
	fence := res.Fence
	uid := fence.GrantUID
	b := v.backend
	if a.park.ck == nil || b == nil || b != a.cfg.Warm || !v.admitted {
		a.putParked(s, p)
		return api.CloneResponse{}, a.miss(fmt.Errorf("grant %q session %q is parked, and its grant is not warm on the WARM backend now", uid, p.session))
	}
	h := &fiberHandle{backend: b, port: p.port, origin: p.origin}
	var (
		lf  *os.File
		url = p.endpoint
		err error
	)
	switch p.image.Network {
	case "unix":
		lf, url, err = a.listen(fence, h)
	case "tcp":
		var l net.Listener
		if l, err = endpoint.ListenAt(p.image.Addr); err == nil {
			lf, err = l.(*net.TCPListener).File()
			l.Close() // lf keeps the socket bound; Resume closes it for CRIU
		}
	}
	if err != nil {
		h.port = 0 // still the parked session's
		a.freeFiber(core.Fiber{Handle: h})
		a.putParked(s, p)
		return api.CloneResponse{}, a.miss(fmt.Errorf("session %q: resume: its listener: %w", p.session, err))
	}
	if lf != nil {
		defer lf.Close()
	}
	leaf, err := a.fiberLeaf(v, fence, h)
	if err != nil {
		h.port = 0
		a.freeFiber(core.Fiber{Handle: h})
		a.putParked(s, p)
		return api.CloneResponse{}, fmt.Errorf("fiber %s: cgroup leaf: %w", fence, err)
	}
	req := backend.ResumeRequest{Fence: fence, Image: p.image.Dir, Template: v.grant.Template, Listener: lf}
	if leaf != nil {
		req.Leaf = leaf.Path()
	}
	rs, err := a.park.ck.Resume(ctx, req)
	if err != nil {
		h.port = 0
		a.freeFiber(core.Fiber{Handle: h})
		if leaf != nil {
			_ = leaf.Remove() // after a failed Resume the leaf is ours
		}
		cause := fmt.Errorf("session %q: resume of %s failed: %w", p.session, p.fence, err)
		if errors.Is(err, backend.ErrImageUnusable) {
			a.deleteParked(p, "unusable")
			cause = fmt.Errorf("session %q: its parked image cannot be resumed and is deleted (a Clone of the session now starts it afresh): %w", p.session, err)
		} else {
			a.putParked(s, p)
		}
		a.log.Info("Resume failed", "fiber", fence.String(), "session", p.session, "reason", err.Error())
		return api.CloneResponse{}, a.miss(cause)
	}
	if rs.Listener != nil && rs.Listener != lf {
		_ = rs.Listener.Close() // the fiber holds its own copy
	}
	h.pid, h.leaf = rs.Fiber.PID, req.Leaf
	now := a.cfg.Clock.Now()
	h.used.Store(now.UnixNano())
	f := core.Fiber{Endpoint: url, Tier: a.tierOf(b, uid), Created: now, Handle: h}
	if cerr := a.ledger.Commit(res, f); cerr != nil {
		// The grant was yielded or the epoch moved meanwhile: the image
		// is of a grant or an epoch that is gone.
		kctx, cancel := core.WithTimeout(context.Background(), a.cfg.Clock, drainTimeout)
		a.releaseFiber(kctx, core.Fiber{Fence: fence, Handle: h})
		cancel()
		p.port = 0 // freed with the fiber
		a.deleteParked(p, "stale")
		return api.CloneResponse{}, a.miss(cerr)
	}
	p.port = 0 // the fiber's now
	// Unlinking an image of tens of MiB takes milliseconds: not on the
	// resumed fiber's path to its caller.
	dir := p.image.Dir
	a.park.bg.Go(func() { a.removeImage(dir, "resumed") })
	a.log.V(1).Info("Session resumed", "fiber", fence.String(), "session", p.session, "parkedAs", p.fence.String())
	a.notify()
	return api.CloneResponse{FiberID: fence.String(), Endpoint: url, Fence: fence, Kind: api.KindResume}, nil
}

// fiberLeaf carves fiber fence's leaf on the grant's cgroup, as v shows
// it, with the W budget's memory.max where the leaf can enforce it (else h
// is marked measured) and Config.FiberPidsMax where it has the pids
// controller; nil without a cgroup. A limit that cannot be written is
// logged, and the fiber runs without it.
func (a *Agent) fiberLeaf(v slotView, fence core.Fence, h *fiberHandle) (*cgroup.Leaf, error) {
	budget := v.grant.WBudget
	h.measured = budget > 0
	if v.cg == nil {
		return nil, nil
	}
	l, err := v.cg.Fiber(fence.Epoch, fence.Seq)
	if err != nil {
		return nil, err
	}
	if budget > 0 && v.memCgroup {
		if err := l.SetMemoryLimit(budget, memoryHigh(budget)); err != nil {
			a.log.Error(err, "Cannot set the fiber's memory.max; measuring its W budget instead", "fiber", fence.String())
		} else {
			h.measured = false
		}
	}
	if v.pidsCgroup && a.cfg.FiberPidsMax > 0 {
		if err := l.SetPidsMax(a.cfg.FiberPidsMax); err != nil {
			a.log.Error(err, "Cannot set the fiber's pids.max; it runs without", "fiber", fence.String())
		}
	}
	return &l, nil
}

// releaseParked serves the release of a parked session's fiber id: the
// caller proves it may (authorizeFiber, with the session's release key),
// and the image is deleted. It answers core.ErrNotFound when fence names
// no parked session.
func (a *apiServer) releaseParked(ctx context.Context, req api.FiberRequest, fence core.Fence, authed bool) error {
	s := a.slotOf(fence.GrantUID)
	p := s.parkedAs(fence)
	if p == nil {
		return errNotFound(fence)
	}
	if err := a.authorizeFiber(ctx, authed, req, fence, p.origin); err != nil {
		return err
	}
	unlock, err := a.ledger.LockSession(ctx, fence.GrantUID, p.session)
	if err != nil {
		return fmt.Errorf("fiber %s: a Clone of its parked session is resuming it: %w", fence, errBusy)
	}
	defer unlock()
	s.mu.Lock()
	mine := s.parked[p.session] == p
	if mine {
		delete(s.parked, p.session)
	}
	s.mu.Unlock()
	if !mine {
		return errNotFound(fence) // resumed or deleted meanwhile
	}
	a.deleteParked(p, "released")
	a.notify()
	return nil
}

// parkedAs returns the parked session that was fiber fence, nil when none.
func (s *slot) parkedAs(fence core.Fence) *parkedSession {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.parked {
		if p.fence == fence {
			return p
		}
	}
	return nil
}

// parkStatus fills slot s's parking part of its grant's status: the tier
// its fibers are served at, and its parked sessions.
func (a *Agent) parkStatus(s *slot, out *api.GrantStatus) {
	s.mu.Lock()
	b, admitted := s.backend, s.admitted
	parked := make([]*parkedSession, 0, len(s.parked))
	for _, p := range s.parked {
		parked = append(parked, p)
	}
	s.mu.Unlock()
	if admitted && b != nil {
		out.Tier = a.tierOf(b, s.uid) // outside mu: a call into the backend
	}
	sort.Slice(parked, func(i, j int) bool { return parked[i].session < parked[j].session })
	for _, p := range parked {
		out.Parked++
		out.ParkedBytes += p.image.Bytes
		out.ParkedSessions = append(out.ParkedSessions, api.ParkedSession{
			Session: p.session, FiberID: p.fence.String(), ImageBytes: p.image.Bytes, OwnBytes: p.image.OwnBytes, ParkedAt: p.at, By: p.by,
		})
	}
}

// touch records that a Clone named fiber f (attached to it): a pressure
// park leaves it alone for ParkLimits.IdleAfter.
func (a *Agent) touch(f *core.Fiber) {
	if h, ok := f.Handle.(*fiberHandle); ok {
		h.used.Store(a.cfg.Clock.Now().UnixNano())
	}
}
