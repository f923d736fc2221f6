package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
)

var _ backend.Checkpointer = (*Backend)(nil)

// checkpoints is the fake's CHECKPOINT tier: off until EnableCheckpoint.
type checkpoints struct {
	on     bool
	bytes  int64                // the size of every image Park writes
	images map[string]fakeImage // by image directory
	parks  int
	resums int
	// listeners are the running fibers' listeners, [network, address]:
	// Park records them in the image, as the proc backend does.
	listeners map[core.Fence][2]string
}

// noteListener records fiber f's listener. The caller holds b.mu.
func (c *checkpoints) noteListener(f core.Fence, network, addr string) {
	if c.listeners == nil {
		c.listeners = map[core.Fence][2]string{}
	}
	c.listeners[f] = [2]string{network, addr}
}

// listenerAddr is the network ("tcp" or "unix") and address of a
// listening socket, empty when f is none.
func listenerAddr(f *os.File) (network, addr string) {
	if f == nil {
		return "", ""
	}
	l, err := net.FileListener(f)
	if err != nil {
		return "", ""
	}
	defer l.Close()
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	switch a := l.Addr().(type) {
	case *net.TCPAddr:
		return "tcp", a.String()
	case *net.UnixAddr:
		return "unix", a.Name
	}
	return "", ""
}

// fakeImage is what the fake remembers of an image it wrote.
type fakeImage struct {
	fence    core.Fence
	template string
	network  string // the listener's, "" for none
	// memory is the parked fiber's CloneRequest (without its listener):
	// what a real image holds of it (its payload, its devices), which
	// the resumed fiber's Request reports.
	memory backend.CloneRequest
}

// imageFile is the one file of a fake image.
const imageFile = "pages-1.img"

// EnableCheckpoint makes the fake a working Checkpointer whose images are
// imageBytes large (a file of that size in the image directory, sparse).
// A new fake has no CHECKPOINT tier: CheckpointSupport says so.
func (b *Backend) EnableCheckpoint(imageBytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ck.on, b.ck.bytes = true, imageBytes
	if b.ck.images == nil {
		b.ck.images = map[string]fakeImage{}
	}
}

// CheckpointSupport is nil once EnableCheckpoint ran, else an error
// wrapping core.ErrTierGap.
func (b *Backend) CheckpointSupport(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ck.on {
		return fmt.Errorf("checkpoint tier absent: fake backend without EnableCheckpoint: %w", core.ErrTierGap)
	}
	return nil
}

// CheckpointIsolated is CheckpointSupport's answer for IsolationNone and
// IsolationFiber, as for the proc backend with a patched CRIU (or the
// CheckpointIsolated hook's for IsolationFiber), and a tier gap at
// IsolationGrant, where CRIU would have to dump the zygote's PID namespace
// whole.
func (b *Backend) CheckpointIsolated(level backend.Isolation) error {
	if err := b.CheckpointSupport(context.Background()); err != nil {
		return err
	}
	switch {
	case level == backend.IsolationGrant:
		return fmt.Errorf("fake: isolation %q shares the PID namespace its zygote leads: %w", level, core.ErrTierGap)
	case level == backend.IsolationFiber && b.hooks.CheckpointIsolated != nil:
		return b.hooks.CheckpointIsolated(level)
	}
	return nil
}

// Park ends running fiber req.Fence with an Exit saying Parked and writes
// its image into req.Dir: one file of the EnableCheckpoint size. It fails
// as the Park hook says (the fiber keeps running), with core.ErrTierGap
// without EnableCheckpoint, core.ErrNotFound for a fiber not running,
// core.ErrInvalid for a Dir that exists, and backend.ErrTooLarge when the
// image would be over req.MaxBytes; core.ErrInvalid also for a request the
// proc backend refuses as malformed (no grant, a Dir that is not a clean
// absolute path, no Template, a negative MaxBytes).
func (b *Backend) Park(ctx context.Context, req backend.ParkRequest) (backend.Image, error) {
	if err := b.CheckpointSupport(ctx); err != nil {
		return backend.Image{}, err
	}
	if err := req.Validate(); err != nil {
		return backend.Image{}, err
	}
	if b.hooks.Park != nil {
		if err := b.hooks.Park(ctx, req); err != nil {
			return backend.Image{}, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	memory, ok := b.fibers[req.Fence]
	if !ok {
		return backend.Image{}, fmt.Errorf("fiber %s: park: %w", req.Fence, core.ErrNotFound)
	}
	if req.MaxBytes > 0 && b.ck.bytes > req.MaxBytes {
		return backend.Image{}, fmt.Errorf("fiber %s: park: %d bytes, over %d: %w", req.Fence, b.ck.bytes, req.MaxBytes, backend.ErrTooLarge)
	}
	if _, err := os.Lstat(req.Dir); err == nil {
		return backend.Image{}, fmt.Errorf("fiber %s: park: %s exists: %w", req.Fence, req.Dir, core.ErrInvalid)
	}
	if err := os.Mkdir(req.Dir, 0o700); err != nil {
		return backend.Image{}, fmt.Errorf("fiber %s: park: %w", req.Fence, err)
	}
	f, err := os.Create(filepath.Join(req.Dir, imageFile))
	if err == nil {
		err = errors.Join(f.Truncate(b.ck.bytes), f.Close())
	}
	if err != nil {
		_ = os.RemoveAll(req.Dir)
		return backend.Image{}, fmt.Errorf("fiber %s: park: %w", req.Fence, err)
	}
	delete(b.fibers, req.Fence)
	ln := b.ck.listeners[req.Fence]
	delete(b.ck.listeners, req.Fence)
	b.ck.images[req.Dir] = fakeImage{fence: req.Fence, template: req.Template, network: ln[0], memory: memory}
	b.ck.parks++
	b.pushLocked(backend.Exit{GrantUID: req.Fence.GrantUID, Fence: req.Fence, Reason: backend.ExitReason{Parked: true}})
	return backend.Image{Dir: req.Dir, Bytes: b.ck.bytes, OwnBytes: b.ck.bytes / 2, Network: ln[0], Addr: ln[1]}, nil
}

// Resume brings an image Park wrote back as running fiber req.Fence, whose
// Request is the parked fiber's (its payload, devices and so on: what its
// memory held) with req's fence and leaf. It fails as the Resume hook says;
// with backend.ErrImageUnusable for an image it did not write or that is
// gone from disk, or of another grant, epoch or template; with
// backend.ErrCold for a grant not warm; with core.ErrInvalid for a request
// the proc backend refuses as malformed (no grant, a relative Image or
// Leaf, no Template), a fence not newer than the parked one, a fence
// already running, or a unix image without a unix Listener. The image
// stays on disk. Resumed.Listener is req.Listener.
func (b *Backend) Resume(ctx context.Context, req backend.ResumeRequest) (backend.Resumed, error) {
	if err := b.CheckpointSupport(ctx); err != nil {
		return backend.Resumed{}, err
	}
	if err := req.Validate(); err != nil {
		return backend.Resumed{}, err
	}
	if b.hooks.Resume != nil {
		if err := b.hooks.Resume(ctx, req); err != nil {
			return backend.Resumed{}, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := req.Fence
	img, ok := b.ck.images[req.Image]
	if _, err := os.Stat(filepath.Join(req.Image, imageFile)); !ok || err != nil {
		return backend.Resumed{}, fmt.Errorf("fiber %s: resume %s: no image: %w", f, req.Image, backend.ErrImageUnusable)
	}
	switch {
	case img.fence.GrantUID != f.GrantUID || img.fence.Epoch != f.Epoch || img.template != req.Template:
		return backend.Resumed{}, fmt.Errorf("fiber %s: resume: image of %s (%s): %w", f, img.fence, img.template, backend.ErrImageUnusable)
	case !newer(f, img.fence):
		return backend.Resumed{}, fmt.Errorf("fiber %s: resume: fence not newer than the parked fiber's %s: %w", f, img.fence, core.ErrInvalid)
	case b.closed || b.cold[f.GrantUID]:
		return backend.Resumed{}, fmt.Errorf("grant %q: %w", f.GrantUID, backend.ErrCold)
	}
	if _, ok := b.warm[f.GrantUID]; !ok {
		return backend.Resumed{}, fmt.Errorf("grant %q: %w", f.GrantUID, backend.ErrCold)
	}
	if _, ok := b.fibers[f]; ok {
		return backend.Resumed{}, fmt.Errorf("fiber %s: already running: %w", f, core.ErrInvalid)
	}
	network, addr := listenerAddr(req.Listener)
	if img.network == "unix" && network != "unix" {
		return backend.Resumed{}, fmt.Errorf("fiber %s: resume: the image's listener is a unix socket; Listener is %q: %w", f, network, core.ErrInvalid)
	}
	memory := img.memory
	memory.Fence, memory.Leaf = f, req.Leaf
	b.fibers[f] = memory
	b.ck.noteListener(f, network, addr)
	b.pid++
	b.ck.resums++
	return backend.Resumed{Fiber: backend.Fiber{Fence: f, PID: b.pid, Isolation: b.levels[f.GrantUID]}, Listener: req.Listener}, nil
}

// newer reports whether fence f is strictly newer than parked.
func newer(f, parked core.Fence) bool {
	c, ok := f.Compare(parked)
	return ok && c > 0
}

// Images lists the image directories Park wrote that are still on disk.
func (b *Backend) Images() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for dir := range b.ck.images {
		if _, err := os.Stat(dir); err == nil {
			out = append(out, dir)
		}
	}
	sort.Strings(out)
	return out
}

// CheckpointCounts reports how many Parks and Resumes succeeded.
func (b *Backend) CheckpointCounts() (parks, resumes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ck.parks, b.ck.resums
}
