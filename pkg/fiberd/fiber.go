package fiberd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
)

// handleOf is the agent's handle of fiber f, nil for a fiber the agent did
// not make (a ledger entry of a test, a reservation's placeholder). Every
// read of core.Fiber.Handle goes through it.
func handleOf(f core.Fiber) *fiberHandle {
	h, _ := f.Handle.(*fiberHandle)
	return h
}

// makeFiber is the one way a fiber is made, for Clone reservation res on
// the grant as v shows it: a new fork of its template with payload, or,
// when parked is set, that parked session brought back from its image. In
// order: its listener (a new one; for a parked TCP session its address
// bound again), its leaf, the backend's Clone or Resume under ctx
// (startFiber), and the ledger's commit (commitFiber). Every failure
// before the commit goes through one undo: what was made for the fiber is
// freed, and a parked session is put back parked, or deleted when its
// image is unusable. The caller cancels res on an error.
//
// Errors: a miss for a grant not warm (or, for a resume, not on a
// checkpointing WARM backend), ports exhausted (SHED), a fork past ctx's
// deadline, a commit refused, and every failed resume; anything else a
// runtime fault.
func (a *Agent) makeFiber(ctx context.Context, res *core.Reservation, v slotView, payload []byte, parked *parkedSession) (api.CloneResponse, error) {
	fence := res.Fence
	if err := a.canMake(v, fence.GrantUID, parked); err != nil {
		return api.CloneResponse{}, err
	}
	h := &fiberHandle{backend: v.backend}
	if parked != nil {
		h.port, h.origin = parked.port, parked.origin
	}
	var leaf *cgroup.Leaf
	// undo frees what was made and settles parked; it returns err.
	undo := func(err error, unusable bool) error {
		if parked != nil {
			h.port = 0 // still the parked session's
		}
		a.freeFiber(core.Fiber{Handle: h})
		if leaf != nil {
			_ = leaf.Remove() // after a failed Clone or Resume the leaf is ours
		}
		switch {
		case parked != nil && unusable:
			a.park.delete(parked, "unusable")
		case parked != nil:
			a.park.put(parked)
		}
		return err
	}

	lf, url, err := a.fiberListener(fence, h, parked)
	if err != nil {
		return api.CloneResponse{}, undo(a.listenerError(fence, parked, err), false)
	}
	if lf != nil {
		defer lf.Close() // the fiber holds its own copy
	}
	if leaf, err = a.fiberLeaf(v, fence, h); err != nil {
		return api.CloneResponse{}, undo(fmt.Errorf("fiber %s: cgroup leaf: %w", fence, err), false)
	}
	leafPath := ""
	if leaf != nil {
		leafPath = leaf.Path()
	}
	if unusable, err := a.startFiber(ctx, v, fence, h, lf, leafPath, payload, parked); err != nil {
		return api.CloneResponse{}, undo(err, unusable)
	}
	h.leaf = leafPath
	if err := a.commitFiber(res, v, h, url, parked); err != nil {
		return api.CloneResponse{}, err
	}
	a.notify()
	kind := api.KindCreate
	if parked != nil {
		kind = api.KindResume
	}
	return api.CloneResponse{FiberID: fence.String(), Endpoint: url, Fence: fence, Kind: kind}, nil
}

// canMake refuses to make a fiber of grant uid when the slot as v shows it
// is not admitted with a backend: admitted in the ledger after the slot was
// read (the reconcile is still warming it). A parked session resumes only
// on the checkpointing WARM backend; refused, it is put back parked. The
// refusal is a miss.
func (a *Agent) canMake(v slotView, uid string, parked *parkedSession) error {
	b := v.backend
	if v.admitted && b != nil && (parked == nil || (a.park.ck != nil && b == a.cfg.Warm)) {
		return nil
	}
	if parked != nil {
		a.park.put(parked)
		return a.miss(fmt.Errorf("grant %q session %q is parked, and its grant is not warm on the WARM backend now", uid, parked.session))
	}
	return a.miss(fmt.Errorf("grant %q: template not warm", uid))
}

// listenerError is the Clone's error for fiber fence whose listener could
// not be bound: a miss for a parked session's, SHED when ports are
// exhausted, else a runtime fault.
func (a *Agent) listenerError(fence core.Fence, parked *parkedSession, err error) error {
	switch {
	case parked != nil:
		return a.miss(fmt.Errorf("session %q: resume: its listener: %w", parked.session, err))
	case errors.Is(err, endpoint.ErrExhausted):
		m := core.Shed(fmt.Sprintf("fiber %s: %v", fence, err), a.cfg.Issuer, a.cfg.RetryAfter)
		m.Cause = err
		return m
	}
	return fmt.Errorf("fiber %s: endpoint: %w", fence, err)
}

// startFiber starts fiber fence under ctx with listener lf in leaf
// leafPath: the backend's Clone with payload, or the checkpointer's Resume
// of parked's image. It records the process in h. unusable says a failed
// resume's image can never be resumed.
func (a *Agent) startFiber(ctx context.Context, v slotView, fence core.Fence, h *fiberHandle, lf *os.File, leafPath string, payload []byte, parked *parkedSession) (unusable bool, err error) {
	if parked == nil {
		bf, err := v.backend.Clone(ctx, backend.CloneRequest{Fence: fence, Listener: lf, Payload: payload, Leaf: leafPath})
		switch {
		case err == nil:
			h.pid, h.iso = bf.PID, bf.Isolation
			return false, nil
		case errors.Is(err, backend.ErrCold):
			return false, a.miss(fmt.Errorf("grant %q: template not warm: %w", fence.GrantUID, err))
		case ctx.Err() != nil:
			return false, a.miss(fmt.Errorf("fiber %s: not forked within the Clone's deadline: %w", fence, err))
		}
		return false, fmt.Errorf("fiber %s: clone: %w", fence, err)
	}
	rs, err := a.park.ck.Resume(ctx, backend.ResumeRequest{Fence: fence, Image: parked.image.Dir, Template: v.grant.Template, Listener: lf, Leaf: leafPath})
	if err != nil {
		unusable = errors.Is(err, backend.ErrImageUnusable)
		cause := fmt.Errorf("session %q: resume of %s failed: %w", parked.session, parked.fence, err)
		if unusable {
			cause = fmt.Errorf("session %q: its parked image cannot be resumed and is deleted (a Clone of the session now starts it afresh): %w", parked.session, err)
		}
		a.log.Info("Resume failed", "fiber", fence.String(), "session", parked.session, "reason", err.Error())
		return unusable, a.miss(cause)
	}
	if rs.Listener != nil && rs.Listener != lf {
		_ = rs.Listener.Close() // the fiber holds its own copy
	}
	h.pid = rs.Fiber.PID
	return false, nil
}

// commitFiber commits the started fiber of handle h and endpoint url to
// reservation res. A resume is a use, and its image is removed off the
// caller's path. When the ledger refuses (the grant was yielded or the
// epoch moved meanwhile) the fiber is released, a parked image deleted,
// and the refusal returned as a miss.
func (a *Agent) commitFiber(res *core.Reservation, v slotView, h *fiberHandle, url string, parked *parkedSession) error {
	fence := res.Fence
	now := a.cfg.Clock.Now()
	if parked != nil {
		h.used.Store(now.UnixNano()) // a resume is a use
	}
	f := core.Fiber{Endpoint: url, Tier: a.tierOf(v.backend, fence.GrantUID), Created: now, Handle: h}
	if cerr := a.ledger.Commit(res, f); cerr != nil {
		// The new fiber belongs to nobody now, and a parked image is of a
		// grant or an epoch that is gone.
		kctx, cancel := core.WithTimeout(context.Background(), a.cfg.Clock, drainTimeout)
		a.releaseFiber(kctx, core.Fiber{Fence: fence, Handle: h})
		cancel()
		if parked != nil {
			parked.port = 0 // freed with the fiber
			a.park.delete(parked, "stale")
		}
		return a.miss(cerr)
	}
	if parked != nil {
		parked.port = 0 // the fiber's now
		// Unlinking an image of tens of MiB takes milliseconds: not on the
		// resumed fiber's path to its caller.
		dir := parked.image.Dir
		a.park.bg.Go(func() { a.park.removeImage(dir, "resumed") })
		a.log.V(1).Info("Session resumed", "fiber", fence.String(), "session", parked.session, "parkedAs", parked.fence.String())
	}
	return nil
}

// fiberListener binds the listener of fiber fence: a new one, or for a
// parked TCP session its address again. It returns the descriptor (a copy
// the caller closes) and the endpoint URL; h records the port or socket
// file to free later.
func (a *Agent) fiberListener(fence core.Fence, h *fiberHandle, parked *parkedSession) (*os.File, string, error) {
	if parked == nil || parked.image.Network == "unix" {
		return a.listen(fence, h)
	}
	if parked.image.Network != "tcp" {
		return nil, parked.endpoint, nil
	}
	l, err := endpoint.ListenAt(parked.image.Addr)
	if err != nil {
		return nil, "", err
	}
	defer l.Close() // the descriptor keeps the socket bound; Resume closes it for CRIU
	lf, err := l.(*net.TCPListener).File()
	return lf, parked.endpoint, err
}

// listen binds a new listener of fiber fence and returns its descriptor
// (a copy the caller closes) and endpoint URL; h records the port or
// socket file to free later.
func (a *Agent) listen(fence core.Fence, h *fiberHandle) (*os.File, string, error) {
	if a.ports == nil {
		path := filepath.Join(a.cfg.RunDir, "fibers", fence.GrantUID+"-"+strconv.FormatUint(fence.Epoch, 10)+"-"+strconv.FormatUint(fence.Seq, 10)+".sock")
		ln, url, err := endpoint.ListenUnix(path)
		if err != nil {
			return nil, "", err
		}
		h.sock = path
		ul := ln.(*net.UnixListener)
		ul.SetUnlinkOnClose(false)
		f, err := ul.File()
		ul.Close()
		if err != nil {
			return nil, "", err
		}
		return f, url, nil
	}
	ln, url, err := a.ports.Listen(a.cfg.EndpointFamily, a.host)
	if err != nil {
		return nil, "", err
	}
	tl := ln.(*net.TCPListener)
	h.port = tl.Addr().(*net.TCPAddr).Port
	f, err := tl.File()
	tl.Close()
	if err != nil {
		return nil, "", err
	}
	return f, url, nil
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
