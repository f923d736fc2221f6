package fiberd

import (
	"context"
	"sort"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// Parking under memory pressure (ParkLimits.Pressure): the rung of the
// ladder between shedding a Clone and yielding the grant. A Clone that
// pressureShed would refuse parks the grant's largest idle fiber instead
// and is served; one park per pressure reading, so a burst of Clones
// within a second parks one fiber and sheds the rest.

// pressureAsks bounds the pressure parks waiting for pressureLoop; a Clone
// that finds the queue full is shed.
const pressureAsks = 16

// pressureAsk is a Clone's ask for a pressure park of grant uid, not of
// its own session skip. done (buffered) says whether a fiber was parked.
type pressureAsk struct {
	uid, skip string
	done      chan bool
}

// parkForPressure asks, for a Clone of slot s's grant that its memory
// pressure would shed, for the grant's largest idle fiber (not of the
// Clone's own session) to be parked, and waits for the answer within ctx
// (the Clone's deadline); it reports whether one was parked. It asks at
// most once per pressure reading of the grant. The park is parking's
// queued work (pressureLoop), never a dump on the Clone's goroutine or
// under its locks: a Clone whose deadline passes stops waiting, and the
// park it asked for still makes room for the next.
func (a *Agent) parkForPressure(ctx context.Context, s *slot, session string) bool {
	if !a.cfg.Park.Pressure || a.park.ck == nil || s == nil {
		return false
	}
	s.pressure.mu.Lock()
	reading := s.pressure.at
	s.pressure.mu.Unlock()
	if !a.park.firstAsk(s.uid, reading) {
		return false // this reading's park is made (or being tried)
	}
	ask := pressureAsk{uid: s.uid, skip: session, done: make(chan bool, 1)}
	select {
	case a.park.asks <- ask:
	default:
		return false
	}
	select {
	case parked := <-ask.done:
		return parked
	case <-ctx.Done():
		return false
	}
}

// pressureLoop makes the pressure parks asked, one at a time, until ctx
// ends. Run starts it.
func (a *Agent) pressureLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ask := <-a.park.asks:
			ask.done <- a.pressurePark(ctx, ask.uid, ask.skip)
		}
	}
}

// pressurePark parks grant uid's largest idle fiber not of session skip,
// and reports whether it parked one. Each park is bounded by
// ParkLimits.Timeout.
func (a *Agent) pressurePark(ctx context.Context, uid, skip string) bool {
	for _, f := range a.idleFibers(uid, skip) {
		resp, err := a.parkFiber(ctx, f, parkByPressure, true)
		if err == nil {
			a.log.Info("Parked a fiber for the grant's memory pressure", "grant", uid, "fiber", resp.FiberID, "session", resp.Session, "own", resp.OwnBytes)
			return true
		}
		a.log.V(1).Info("Fiber not parked for pressure", "fiber", f.Fence.String(), "reason", err.Error())
		if ctx.Err() != nil {
			return false
		}
	}
	return false
}

// idleFibers lists grant uid's fibers a pressure park may take, largest
// first: with a session other than skip, on the checkpointing backend,
// named by no Clone for ParkLimits.IdleAfter, and with no connection open
// to their endpoint. Their size is their private dirty memory (the W
// budget's measure); a fiber that cannot be measured is left out.
func (a *Agent) idleFibers(uid, skip string) []core.Fiber {
	now := a.cfg.Clock.Now()
	var (
		out   []core.Fiber
		size  = map[core.Fence]int64{}
		conns *openConns
	)
	for _, gs := range a.ledger.Snapshot() {
		if gs.Grant.UID != uid {
			continue
		}
		for _, f := range gs.Running {
			h := handleOf(f)
			if h == nil || f.Session == "" || f.Session == skip || h.backend != a.cfg.Warm || h.pid <= 0 {
				continue
			}
			used := f.Created
			if n := h.used.Load(); n != 0 {
				used = time.Unix(0, n)
			}
			if now.Sub(used) < a.cfg.Park.IdleAfter {
				continue
			}
			if conns == nil {
				conns = readOpenConns()
			}
			if conns.has(h) {
				continue
			}
			n, err := a.park.size(h)
			if err != nil {
				continue
			}
			size[f.Fence] = n
			out = append(out, f)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return size[out[i].Fence] > size[out[j].Fence] })
	return out
}

// fiberSize is the private dirty memory of fiber h's processes (its leaf's,
// or its session's without a leaf), as the W budget measures it.
func (a *Agent) fiberSize(h *fiberHandle) (int64, error) {
	var pids []int
	if h.leaf != "" {
		pids, _ = cgroup.At(h.leaf).Procs()
	} else {
		pids = sessionMembers()[h.pid]
	}
	return a.measure(pids)
}

// has reports whether fiber h's endpoint has a connection open.
func (c *openConns) has(h *fiberHandle) bool {
	return (h.port != 0 && c.ports[h.port]) || (h.sock != "" && c.paths[h.sock])
}
