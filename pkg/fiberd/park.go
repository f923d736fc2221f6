package fiberd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

// Parking: the CHECKPOINT tier in the agent.
//
// A running fiber of a session is parked by POST /v1/park (or, with
// ParkLimits.Pressure, by the agent for its grant's memory pressure): under
// the session's gate the WARM backend (a backend.Checkpointer) writes its
// process tree to an image in StateDir/private/parked/<uid>/<epoch>-<seq>
// and ends it; the fiber leaves the ledger (its place under fibers.max is
// free) and its session is kept parked (parking.go). A Clone naming the
// session resumes it: a reservation (a place, a new fence) as for a
// new fiber, then backend Resume of the image into a new leaf, with the
// fiber's listener: a new unix socket, or its TCP address bound again (the
// port stays held while it is parked). The image is deleted once resumed,
// when the parked fiber id is released, and when the grant ends, the epoch
// moves or fiberd starts (images are never resumed across epochs).
//
// A resume that fails puts the session back unless its image is unusable
// or its grant, template or epoch moved meanwhile; then it is deleted.

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
	l.MaxImages = cmp.Or(l.MaxImages, DefaultParkMaxImages)
	l.MaxBytes = cmp.Or(l.MaxBytes, DefaultParkMaxBytes)
	l.Timeout = cmp.Or(l.Timeout, DefaultParkTimeout)
	l.IdleAfter = cmp.Or(l.IdleAfter, DefaultParkIdleAfter)
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

// The agent's park errors, in the classes of the backend's ErrBusy and
// ErrTooLarge: core.ErrBusy (409) and core.ErrInsufficientStorage (507).
var (
	// errBusy is a park that cannot proceed now: another Clone or park
	// of the session, or another park of the grant, holds it up past the
	// park's time.
	errBusy = core.NewError(core.ErrBusy, "busy")
	// errNoRoom is a park refused by ParkLimits.
	errNoRoom = core.NewError(core.ErrInsufficientStorage, "no room for another parked image")
	// errClosed is a park of a grant that was yielded meanwhile.
	errClosed = fmt.Errorf("grant not admitted: %w", core.ErrNotFound)
)

// initPark prepares parking in New: it deletes the images of a previous
// run (of an older epoch: never resumed), asks the WARM backend whether it
// can checkpoint (once; said in the log and the status) and registers the
// park metrics.
func (a *Agent) initPark(ctx context.Context, private string) error {
	a.park.dir = filepath.Join(private, "parked")
	a.park.size = a.fiberSize
	a.park.log = a.log
	a.park.ports = a.ports
	a.park.epoch = a.ledger.Epoch()
	a.park.asks = make(chan pressureAsk, pressureAsks)
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
		c := api.Checkpoint{Available: true}
		if a.cfg.Warm != nil && a.cfg.Warm.Isolation().Level == backend.IsolationFiber {
			if err := a.errIsolatedPark(backend.IsolationFiber); err != nil {
				c.Isolated = err.Error()
			}
		}
		return c
	}
	c := api.Checkpoint{}
	if a.park.why != nil {
		c.Reason = a.park.why.Error()
	}
	return c
}

// tierOf is the tier backend b serves grant uid's fibers at: CHECKPOINT
// for the WARM backend when it can park them, else b's own. Whether it can
// depends on the grant's isolation (Checkpointer.CheckpointIsolated): a
// grant at "grant" shares its zygote's PID namespace, and one at "fiber"
// needs a CRIU with fiberd's patches; such a grant is served at WARM.
func (a *Agent) tierOf(b backend.Backend, uid string) core.Tier {
	if b == nil {
		return ""
	}
	if a.park.ck != nil && b == a.cfg.Warm && a.park.ck.CheckpointIsolated(b.GrantIsolation(uid)) == nil {
		return core.TierCheckpoint
	}
	return b.Tier()
}

// errIsolatedPark says why an isolated grant's fibers cannot be parked,
// and the way out.
func (a *Agent) errIsolatedPark(level backend.Isolation) error {
	err := a.park.ck.CheckpointIsolated(level)
	if err == nil {
		return nil
	}
	return fmt.Errorf("%v; fiberd -isolation none parks every grant's fibers", strings.TrimSuffix(err.Error(), ": "+core.ErrTierGap.Error()))
}

// parkFloor refuses, once warm, a grant needing CHECKPOINT whose fibers
// its isolation keeps from being parked (a tier gap: 412).
func (a *Agent) parkFloor(s *slot) error {
	v := s.view()
	if v.grant.MinTier != core.TierCheckpoint || v.backend == nil {
		return nil
	}
	if t := a.tierOf(v.backend, s.uid); t != core.TierCheckpoint {
		return fmt.Errorf("grant %q: needs tier CHECKPOINT: %v: %w", s.uid, a.errIsolatedPark(v.backend.GrantIsolation(s.uid)), core.ErrTierGap)
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
	h := handleOf(f)
	if h == nil || h.backend == nil {
		return resp, &tierGap{fence: fence, tier: f.Tier, why: a.park.why}
	}
	if t := a.tierOf(h.backend, uid); t != core.TierCheckpoint {
		why := a.park.why
		switch {
		case h.backend != a.cfg.Warm:
			why = errors.New("only fibers forked from a zygote (a template with \"zygote\": true) can be parked; this one was started by fork+exec")
		case a.park.ck != nil:
			why = a.errIsolatedPark(h.backend.GrantIsolation(uid))
		}
		return resp, &tierGap{fence: fence, tier: t, why: why}
	}
	if f.Session == "" {
		return resp, fmt.Errorf("fiber %s has no session: a parked fiber comes back when a Clone names its session, so only a fiber cloned with a session can be parked: %w", fence, core.ErrInvalid)
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
	give, err := a.park.turn(gateCtx, uid)
	switch {
	case errors.Is(err, errClosed):
		return resp, errNotFound(fence)
	case err != nil:
		return resp, fmt.Errorf("fiber %s: another park of grant %q is under way: %w", fence, uid, errBusy)
	}
	defer give()
	if _, err := a.ledger.Lookup(fence); err != nil {
		return resp, err
	}
	g, ok := a.ledger.Grant(uid)
	if !ok {
		return resp, errNotFound(fence)
	}
	tmpl := g.Template
	n, used := a.park.count(uid)
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
		a.park.removeImage(img.Dir, "ended")
		return resp, fmt.Errorf("fiber %s ended while it was parked; its image is deleted: %w", fence, core.ErrNotFound)
	}
	p := &parkedSession{session: fiber.Session, fence: fence, origin: keyFence(fiber), image: img, template: tmpl, endpoint: fiber.Endpoint, at: a.cfg.Clock.Now(), by: by}
	if fh := handleOf(fiber); fh != nil {
		// The port stays held for the resume, which binds it again; a unix
		// socket file is freed (the resume binds a new one). The handle is
		// not changed: a snapshot taken before the park may still read it.
		p.port = fh.port
		if fh.sock != "" {
			_ = os.Remove(fh.sock)
		}
	}
	if !a.park.put(p) {
		a.notify()
		return resp, fmt.Errorf("fiber %s: its grant ended or the epoch moved while it was parked; its image is deleted: %w", fence, core.ErrNotFound)
	}
	a.log.V(1).Info("Fiber parked", "fiber", fence.String(), "session", p.session, "by", by, "image", img.Dir, "bytes", img.Bytes, "own", img.OwnBytes, "took", a.cfg.Clock.Since(start))
	a.notify()
	return api.ParkResponse{FiberID: fence.String(), Session: p.session, ImageBytes: img.Bytes, OwnBytes: img.OwnBytes}, nil
}

// releaseParked serves the release of a parked session's fiber id: the
// caller proves it may (authorizeFiber, with the session's release key),
// and the image is deleted. It answers core.ErrNotFound when fence names
// no parked session.
func (a *apiServer) releaseParked(ctx context.Context, req api.FiberRequest, fence core.Fence, authed bool) error {
	p := a.park.parkedAs(fence)
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
	if !a.park.takeExact(p) {
		return errNotFound(fence) // resumed or deleted meanwhile
	}
	a.park.delete(p, "released")
	a.notify()
	return nil
}

// parkStatus fills grant uid's parked sessions in its status.
func (a *Agent) parkStatus(uid string, out *api.GrantStatus) {
	out.ParkedSessions = a.park.status(uid)
	out.Parked = len(out.ParkedSessions)
	for _, p := range out.ParkedSessions {
		out.ParkedBytes += p.ImageBytes
	}
}

// touch records that a Clone named fiber f (attached to it): a pressure
// park leaves it alone for ParkLimits.IdleAfter.
func (a *Agent) touch(f *core.Fiber) {
	if h := handleOf(*f); h != nil {
		h.used.Store(a.cfg.Clock.Now().UnixNano())
	}
}
