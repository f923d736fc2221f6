package backend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// The CHECKPOINT tier of the proc backend: Park and Resume with CRIU.
//
// A parked fiber was the zygote's child: criu dump kills it, the zygote
// reaps it and says EXITED, and finish queues its Exit once Park has said
// whether the image is complete (Reason.Parked) or not (the reason it
// died). A resumed fiber is restored with --restore-sibling, so it is
// fiberd's own child, not the zygote's: no EXITED ever comes for it. It
// lives in the grant's fiber map like any other fiber (Kill, Stop and the
// zygote's death reach it), and the watcher, one goroutine per Proc polling
// the pidfds of every resumed fiber, reaps it and finishes it. The
// zygote's teardown (wait) therefore leaves resumed fibers to the watcher
// and only waits for them (splitResumed, awaitResumed). The watcher and
// the reaping are in resumed_linux.go, the criu command in criu_linux.go.
//
// Lock order: Proc.mu, then zygote.mu, then procCkpt.mu; none is held
// across a process start or a wait.

var _ Checkpointer = (*Proc)(nil)

// procCkpt is the Proc's checkpoint state.
type procCkpt struct {
	probeMu  sync.Mutex
	probing  chan struct{} // closed when the running probe ends; nil when none runs
	probed   bool          // a probe finished (not cut short by its ctx)
	criu     *criu         // the working CRIU, when probed and working
	probeErr error         // why there is none, when probed

	mu       sync.Mutex // guards watched, started, closing, abandon, sweep, wakeR, wakeW
	watched  map[*fiber]*zygote
	started  bool
	sweep    bool // a SIGCHLD came: look for orphans of resumed fibers to reap
	closing  bool // Close asked the watcher to end once no fiber is left
	abandon  bool // Close's time is up: end now, fibers or not
	wakeR    *os.File
	wakeW    *os.File
	stopped  chan struct{} // closed when the watcher goroutine has returned
	stopOnce sync.Once

	// spawn starts criu restore, from a thread that outlives the fibers
	// it restores (spawn_linux.go).
	spawn threadSpawner
	// shelfSpawn starts criu restore of an isolated fiber, from a thread
	// in the shelf's mount namespace (shelf_linux.go); shelf is set by
	// its setup, and read once its start or serving has returned.
	shelfSpawn threadSpawner
	shelf      *shelf
}

// fiberCkpt is a fiber's park and resume state.
type fiberCkpt struct {
	// resumed is set before a resumed fiber is published: fiberd, not
	// the zygote, is its parent and the watcher reaps it.
	resumed bool
	// park is the Park in progress, if any.
	park atomic.Pointer[parkOp]
	// templateDied is set by the zygote's teardown for a resumed fiber it
	// is about to kill, so its Exit says so.
	templateDied atomic.Bool
}

// parkOp is one Park of a fiber; done is closed once ok is final.
type parkOp struct {
	done chan struct{}
	ok   bool
}

// reason is what finish reports: Parked when the fiber ended because its
// image is complete (it waits for the Park in progress to know),
// TemplateDied for a resumed fiber its zygote's death killed, else r.
func (c *fiberCkpt) reason(r ExitReason) ExitReason {
	if op := c.park.Load(); op != nil {
		<-op.done
		if op.ok {
			return ExitReason{Parked: true}
		}
	}
	if c.templateDied.Load() {
		return ExitReason{TemplateDied: true}
	}
	return r
}

// CheckpointSupport implements Checkpointer.
func (p *Proc) CheckpointSupport(ctx context.Context) error {
	_, err := p.criu(ctx)
	return err
}

// CheckpointIsolated implements Checkpointer.
func (p *Proc) CheckpointIsolated(level Isolation) error {
	switch level {
	case "", IsolationNone:
		return nil
	case IsolationGrant:
		return fmt.Errorf("its grant runs at isolation %q, where a fiber shares the PID namespace its zygote leads, and CRIU dumps a PID namespace only whole; isolation fiber (the default) parks: %w", level, core.ErrTierGap)
	}
	c := &p.ck
	c.probeMu.Lock()
	cr, probed := c.criu, c.probed
	c.probeMu.Unlock()
	switch {
	case !probed || cr == nil:
		return fmt.Errorf("no working CRIU: %w", core.ErrTierGap)
	case !cr.patched:
		return fmt.Errorf("its grant runs at isolation %q, in a user namespace of its own, and the CRIU at %s lacks fiberd's patches for it: build it with hack/criu.sh (make criu): %w", level, cr.path, core.ErrTierGap)
	case cr.unprivileged:
		return fmt.Errorf("its grant runs at isolation %q, in a user namespace of its own, which CRIU restores only with CAP_SYS_ADMIN, and fiberd lacks it: %w", level, core.ErrTierGap)
	case p.iso.noPark != nil:
		return fmt.Errorf("its grant runs at isolation %q: %v: %w", level, p.iso.noPark, core.ErrTierGap)
	}
	return nil
}

// criu returns the probed CRIU, probing it once.
func (p *Proc) criu(ctx context.Context) (*criu, error) {
	c := &p.ck
	for {
		c.probeMu.Lock()
		if c.probed {
			cr, err := c.criu, c.probeErr
			c.probeMu.Unlock()
			return cr, err
		}
		if wait := c.probing; wait != nil {
			c.probeMu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("checkpoint: waiting for the CRIU probe: %w", ctx.Err())
			}
		}
		done := make(chan struct{})
		c.probing = done
		c.probeMu.Unlock()

		cr, err := probeCRIU(ctx, p.cfg.CRIU, p.cfg.Path)
		c.probeMu.Lock()
		c.probing = nil
		if ctx.Err() == nil || err == nil {
			c.probed, c.criu = true, cr
			if err != nil {
				c.probeErr = fmt.Errorf("checkpoint tier absent: %v: %w", err, core.ErrTierGap)
				p.log.Info("Checkpoint tier absent: fibers cannot be parked", "reason", err.Error())
			} else {
				p.log.Info("Checkpoint tier ready", "criu", cr.path, "version", cr.version, "unprivileged", cr.unprivileged, "isolatedFibers", cr.patched)
			}
		}
		cr, perr := c.criu, c.probeErr
		probed := c.probed
		c.probeMu.Unlock()
		close(done)
		if !probed {
			return nil, fmt.Errorf("checkpoint: probing CRIU: %w", ctx.Err())
		}
		return cr, perr
	}
}

// findFiber returns the grant's zygote and the running fiber of fence.
func (p *Proc) findFiber(fence core.Fence) (*zygote, *fiber) {
	z := p.zygoteOf(fence.GrantUID)
	if z == nil {
		return nil, nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	return z, z.fibers[fence.String()]
}

// Park implements Checkpointer. Its steps: parkTarget finds the fiber and
// checks it may be parked, parkFacts learns what its image will hold,
// dump runs criu dump into Dir+partialSuffix, writeImage completes the
// image (manifest, rename), and awaitParked waits for the fiber's end.
// Whatever fails undoes the partial image and leaves the fiber to end for
// its own reason.
func (p *Proc) Park(ctx context.Context, req ParkRequest) (img Image, err error) {
	if err := req.Validate(); err != nil {
		return Image{}, err
	}
	name := req.Fence.String()
	wrap := func(err error) error { return fmt.Errorf("fiber %s: park: %w", name, err) }
	cr, z, f, err := p.parkTarget(ctx, req)
	if err != nil {
		return Image{}, wrap(err)
	}
	op := &parkOp{done: make(chan struct{})}
	if !f.ck.park.CompareAndSwap(nil, op) {
		return Image{}, wrap(fmt.Errorf("a park of this fiber is under way: %w", core.ErrInvalid))
	}
	tmp := req.Dir + partialSuffix
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
			f.ck.park.Store(nil)
			close(op.done) // op.ok stays false: the fiber, if it ended, ended for its own reason
		}
	}()
	m, err := parkFacts(cr, z, f, req)
	if err != nil {
		return Image{}, wrap(err)
	}
	dumped, err := p.dump(ctx, cr, z, f, m, tmp)
	if err != nil {
		return Image{}, wrap(err)
	}
	// criu has killed the fiber; the image is complete once its manifest
	// is written and the directory renamed.
	if err := writeImage(tmp, req.Dir, &m.manifest); err != nil {
		return Image{}, wrap(err)
	}
	op.ok = true
	close(op.done)
	p.awaitParked(f)
	img = Image{Dir: req.Dir, Bytes: m.bytes(), OwnBytes: m.OwnBytes, Network: netName(m.Network), Addr: m.Addr}
	p.log.V(1).Info("Fiber parked", "fence", name, "image", req.Dir, "bytes", img.Bytes, "own", img.OwnBytes, "dump", dumped)
	return img, nil
}

// parkTarget returns the working CRIU, the grant's zygote and the running
// fiber req names. It fails with the probe's error when CRIU is absent,
// with core.ErrNotFound when the fiber is not running or its grant is
// being stopped, and with core.ErrInvalid when req.Dir exists already.
func (p *Proc) parkTarget(ctx context.Context, req ParkRequest) (*criu, *zygote, *fiber, error) {
	cr, err := p.criu(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	z, f := p.findFiber(req.Fence)
	if f == nil {
		return nil, nil, nil, core.ErrNotFound
	}
	z.mu.Lock()
	ending := z.cold || z.stopping
	z.mu.Unlock()
	if ending {
		return nil, nil, nil, fmt.Errorf("its grant is being stopped: %w", core.ErrNotFound)
	}
	if _, err := os.Lstat(req.Dir); err == nil {
		return nil, nil, nil, fmt.Errorf("image directory %s exists already: %w", req.Dir, core.ErrInvalid)
	}
	return cr, z, f, nil
}

// parkFacts describes the fiber f of z (describeFiber) and fills in the
// manifest fields req and the grant decide. It fails with
// core.ErrNotFound when the fiber is gone, with ErrTooLarge when the
// memory criu would write is over req.MaxBytes, and with describeFiber's
// errors.
func parkFacts(cr *criu, z *zygote, f *fiber, req ParkRequest) (fiberFacts, error) {
	parent := z.proc.Pid
	if f.ck.resumed {
		parent = os.Getpid()
	}
	pidfd, _, err := fiberPidfd(f.pid, parent)
	if err != nil {
		return fiberFacts{}, fmt.Errorf("%v: %w", err, core.ErrNotFound)
	}
	m, err := describeFiber(pidfd, f.pid)
	_ = unix.Close(pidfd)
	if err != nil {
		return fiberFacts{}, err
	}
	if req.MaxBytes > 0 && m.dumpBytes > req.MaxBytes {
		return fiberFacts{}, fmt.Errorf("its memory to write is %d bytes, over the bound of %d: %w", m.dumpBytes, req.MaxBytes, ErrTooLarge)
	}
	if m.UserNS = ownUserNS(f.pid); m.UserNS {
		if err := z.p.CheckpointIsolated(IsolationFiber); err != nil {
			return fiberFacts{}, err
		}
		m.Externals = z.ext
	}
	m.Version = manifestVersion
	m.GrantUID, m.Epoch, m.Seq = req.Fence.GrantUID, req.Fence.Epoch, req.Fence.Seq
	m.Template, m.SpecDigest, m.CRIU = req.Template, specDigest(z.spec), cr.version
	return m, nil
}

// dump runs criu dump of fiber f into the new directory tmp (removed and
// made anew) and returns how long criu took. criu kills the fiber once its
// image is written; when criu fails the fiber runs on. The error then is
// dumpFailure's, or ctx's when ctx ended.
func (p *Proc) dump(ctx context.Context, cr *criu, z *zygote, f *fiber, m fiberFacts, tmp string) (_ time.Duration, err error) {
	if err := os.RemoveAll(tmp); err != nil {
		return 0, err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return 0, err
	}
	if m.UserNS {
		// criu restore looks for optional image files from inside the
		// fiber's user namespace, as a stranger to the host: it must be
		// told "no such file", not "permission denied". The files are
		// as criu writes them (0644), reached only through the
		// directories above, fiberd's (0700).
		if err := os.Chmod(tmp, 0o711); err != nil {
			return 0, err
		}
	}
	start := p.cfg.Clock.Now()
	args := cr.flags("dump", "-t", strconv.Itoa(f.pid), "-D", tmp, "-o", "dump.log",
		"--tcp-close", "--skip-in-flight", "--manage-cgroups=ignore")
	if m.UserNS {
		// The host's mounts the fiber sees are external, those it cannot
		// reach left out (shelf_linux.go).
		args = append(args, "--ext-mount-map", "auto")
		for _, ext := range m.Externals {
			args = append(args, "--external", ext.Key)
		}
		hidden, err := hiddenMounts(f.pid)
		if err != nil {
			return 0, fmt.Errorf("the fiber's mounts: %v: %w", err, core.ErrNotFound)
		}
		for _, mp := range hidden {
			args = append(args, "--skip-mnt", mp)
		}
	}
	cmd := cr.command(ctx, args...)
	cmd.Dir = tmp
	// criu leads a session of its own, recorded like a fiber without a
	// leaf: what it forks during the dump has no parent-death signal, and
	// a crash of fiberd would leave it; the next start ends the session.
	cmd.SysProcAttr.Setsid = true
	if z.guarded && m.UserNS && m.Network != "unix" {
		remark, uerr := unmarkForDump(f, z)
		if uerr != nil {
			return 0, uerr
		}
		defer func() { remark(err == nil) }()
	}
	if out, rerr := runRecorded(cmd, z.recs, p.cfg.KillTimeout); rerr != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("criu dump: %w", ctx.Err())
		}
		return 0, dumpFailure(rerr, out, tmp, f.pid, m.manifest)
	}
	return p.cfg.Clock.Since(start), nil
}

// unmarkForDump clears the endpoint guard's mark of the fiber's listener
// (descriptor 3) for criu dump, and returns what sets it again should the
// fiber run on. criu 4.2 dumps a socket's mark when it is not 0 and
// restores it from inside the fiber's user namespace, which may not set
// one (EPERM: CAP_NET_ADMIN over the host's network), so the image must
// hold none; criu's pre-resume hook marks the restored listener before the
// fiber runs (criuhook_linux.go). While criu dumps, the fiber is frozen,
// and a connection another grant's fiber opens meanwhile waits unaccepted:
// criu's --skip-in-flight drops it from the image, and the fiber's end
// resets it; only a failed dump leaves it queued for the fiber. remark
// closes fiberd's copy of the listener, and marks it again first when the
// dump failed.
func unmarkForDump(f *fiber, z *zygote) (remark func(dumped bool), err error) {
	parent := z.proc.Pid
	if f.ck.resumed {
		parent = os.Getpid()
	}
	pidfd, _, err := fiberPidfd(f.pid, parent)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, core.ErrNotFound)
	}
	fd, err := unix.PidfdGetfd(pidfd, 3, 0)
	if err == nil {
		if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 0); err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		_ = unix.Close(pidfd)
		return nil, fmt.Errorf("clearing the mark of the fiber's listener for criu: %w", err)
	}
	return func(dumped bool) {
		defer unix.Close(pidfd)
		defer unix.Close(fd)
		if dumped {
			return
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(GuardMark(z.id))); err != nil {
			z.p.log.Error(err, "Endpoint guard: the listener of a fiber criu could not park is not marked again; ending the fiber", "pid", f.pid)
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		}
	}, nil
}

// dumpFailure explains a failed criu dump of the fiber at pid into tmp,
// from criu's exit and what is left, never from the text of its log (see
// criuFailure): when criu exited by itself, the fiber has a unix listener
// and a connection to it is open or queued (unixPeersOf, read once criu
// has let the fiber run on), the error wraps ErrBusy; else it is
// criuFailure's (wrapping ErrNoSpace when tmp's filesystem is full). The
// last lines of criu's output, if any, are appended.
func dumpFailure(runErr error, out []byte, tmp string, pid int, m manifest) error {
	err := criuFailure("dump", runErr, filepath.Join(tmp, "dump.log"), tmp, false)
	if m.Network == "unix" && criuExited(runErr) && unixPeersOf(pid, m.Addr, m.Inode) > 0 {
		err = fmt.Errorf("a connection to its unix listener is open or waiting to be accepted, and CRIU cannot park one end of a unix connection: park it once it is idle: %w (%w)", ErrBusy, err)
	}
	if len(out) > 0 {
		err = fmt.Errorf("%w; output: %s", err, lastLines(out, 2))
	}
	return err
}

// writeImage completes the image criu wrote into tmp: it lists the image
// files into m, writes m as the manifest and renames tmp to dir. An error
// says the fiber ended but its image could not be written.
func writeImage(tmp, dir string, m *manifest) error {
	files, err := imageFiles(tmp)
	if err != nil {
		return err
	}
	m.Files = files
	b, err := json.Marshal(m)
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, manifestName), b, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		return fmt.Errorf("the fiber ended but its image could not be written: %w", err)
	}
	return nil
}

// awaitParked waits, at most KillTimeout, for the parked fiber f to be
// finished: its Exit (Parked) follows the zygote's EXITED, or the
// watcher's reap. A fiber not seen ending in time is logged, not failed:
// its image is complete.
func (p *Proc) awaitParked(f *fiber) {
	wctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	defer cancel()
	select {
	case <-f.done:
	case <-wctx.Done():
		p.log.Info("Parked fiber's exit not seen in time", "fence", f.fence.String(), "pid", f.pid)
	}
}

func netName(n string) string {
	if n == "tcp6" {
		return "tcp"
	}
	return n
}

// fiberFacts is what Park learns of a fiber before dumping it.
type fiberFacts struct {
	manifest
	dumpBytes int64 // the memory criu will write, estimated
}

// maxTreeProcs bounds the processes of one fiber Park looks at.
const maxTreeProcs = 4096

// describeFiber reads the fiber's listener (descriptor 3), its pipes among
// descriptors 0-2, its pid namespace and its memory.
func describeFiber(pidfd, pid int) (fiberFacts, error) {
	var m fiberFacts
	m.PID = pid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		m.Comm = strings.TrimSpace(string(b))
	}
	ns, err := nsPIDs(pid)
	if err != nil {
		return m, err
	}
	switch {
	case len(ns) > 1 && ns[len(ns)-1] == 1:
		m.OwnPIDNS = true
	case len(ns) > 1:
		return m, fmt.Errorf("the fiber is pid %d of a pid namespace it does not lead; CRIU parks only the init of a pid namespace, or a process of fiberd's: %w", ns[len(ns)-1], core.ErrTierGap)
	}
	if fd, err := unix.PidfdGetfd(pidfd, 3, 0); err == nil {
		m.Network, m.Addr, m.Inode = listenerOf(fd)
		proto, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
		_ = unix.Close(fd)
		if proto == unix.IPPROTO_MPTCP {
			return m, fmt.Errorf("its listener %s is a Multipath TCP socket, which CRIU cannot dump; bind TCP listeners with MPTCP off (net.ListenConfig.SetMultipathTCP(false), as pkg/endpoint does): %w", m.Addr, core.ErrTierGap)
		}
	}
	seen := map[uint64]bool{}
	for fd := 0; fd <= 2; fd++ {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		if err != nil {
			continue
		}
		if s, ok := strings.CutPrefix(link, "pipe:["); ok {
			ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
			if err == nil && !seen[ino] {
				seen[ino] = true
				m.Pipes = append(m.Pipes, ino)
			}
		}
	}
	for _, q := range processTree(pid) {
		st := procKB(fmt.Sprintf("/proc/%d/status", q), "RssAnon:", "RssShmem:", "VmSwap:")
		m.dumpBytes += st << 10
		m.OwnBytes += procKB(fmt.Sprintf("/proc/%d/smaps_rollup", q), "Private_Dirty:") << 10
	}
	return m, nil
}

// ownUserNS reports whether the process at pid has a user namespace other
// than fiberd's.
func ownUserNS(pid int) bool {
	theirs, err := nsInode(pid, "user")
	if err != nil {
		return false
	}
	ours, err := nsInode(os.Getpid(), "user")
	return err == nil && theirs != ours
}

// listenerOf describes a listening stream socket: its network, address and
// inode; all zero when fd is something else.
func listenerOf(fd int) (network, addr string, ino uint64) {
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return "", "", 0
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "", "", 0
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", "", 0
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return "tcp", net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), st.Ino
	case *unix.SockaddrInet6:
		return "tcp6", net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), st.Ino
	case *unix.SockaddrUnix:
		if a.Name == "" {
			return "", "", 0
		}
		return "unix", a.Name, st.Ino
	}
	return "", "", 0
}

// nsPIDs reads the NSpid line of /proc/<pid>/status: the pid in each
// namespace from fiberd's inward.
func nsPIDs(pid int) ([]int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, core.ErrNotFound)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("/proc/%d/status: NSpid %q", pid, rest)
				}
				out = append(out, n)
			}
			return out, nil
		}
	}
	return []int{pid}, nil
}

// processTree is pid and its descendants (at most maxTreeProcs).
func processTree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && len(out) < maxTreeProcs; i++ {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", out[i], t.Name()))
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil && len(out) < maxTreeProcs {
					out = append(out, n)
				}
			}
		}
	}
	return out
}

// procKB sums the "key: N kB" lines of a /proc file.
func procKB(path string, keys ...string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, k := range keys {
			if rest, ok := strings.CutPrefix(line, k); ok {
				if fs := strings.Fields(rest); len(fs) > 0 {
					v, _ := strconv.ParseInt(fs[0], 10, 64)
					n += v
				}
			}
		}
	}
	return n
}

// Resume implements Checkpointer. Its steps: readImage checks the image,
// reserveResume finds the grant's warm zygote and reserves the fence,
// prepareRestore builds criu's command line and the descriptors it
// inherits, restore runs criu restore (ending what a failed one left),
// adoptRestored takes the restored process as a fiber, and publishResumed
// makes it one of the grant's fibers, watched. What a step set up is
// undone when Resume returns (restoreSetup.release), in reverse order.
func (p *Proc) Resume(ctx context.Context, req ResumeRequest) (res Resumed, err error) {
	if err := req.Validate(); err != nil {
		return Resumed{}, err
	}
	name := req.Fence.String()
	wrap := func(err error) error { return fmt.Errorf("fiber %s: resume %s: %w", name, req.Image, err) }
	cr, err := p.criu(ctx)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	m, err := readImage(req)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	z, pc, err := p.reserveResume(req, m)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	defer z.unreserve(pc)
	rs, err := prepareRestore(cr, z, req, m)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	defer rs.release(p)
	startTick, restored, err := p.restore(ctx, cr, z, req, m, rs)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	f, lst, err := p.adoptRestored(req, m, startTick, z.recs)
	if err != nil {
		return Resumed{}, wrap(err)
	}
	if lst != nil && z.guarded {
		// The hook marked it already; this only checks, and marks a
		// fiber restored without the hook.
		if err := markListener(lst, z.id); err != nil {
			_ = lst.Close()
			p.discard(f)
			return Resumed{}, wrap(err)
		}
	}
	if err := p.publishResumed(z, f, lst); err != nil {
		return Resumed{}, wrap(err)
	}
	p.log.V(1).Info("Fiber resumed", "fence", name, "pid", f.pid, "image", req.Image, "restore", restored)
	res.Listener = rs.listener
	if lst != nil {
		res.Listener = lst
	}
	res.Fiber = Fiber{Fence: req.Fence, PID: f.pid}
	return res, nil
}

// readImage reads the manifest of the image req names and checks that the
// image may be resumed for req: complete (a manifest, and every image file
// it lists with its size), of a version fiberd reads, and req's (usableFor).
// Its errors wrap ErrImageUnusable, or are parseManifest's or usableFor's.
func readImage(req ResumeRequest) (manifest, error) {
	b, err := core.ReadFileBounded(filepath.Join(req.Image, manifestName), maxManifestBytes)
	if err != nil {
		return manifest{}, fmt.Errorf("no complete image: %v: %w", err, ErrImageUnusable)
	}
	m, err := parseManifest(b)
	if err != nil {
		return manifest{}, err
	}
	if err := m.usableFor(req); err != nil {
		return manifest{}, err
	}
	if err := checkFiles(req.Image, m.Files); err != nil {
		return manifest{}, err
	}
	return m, nil
}

// reserveResume returns the zygote of req's grant with req's fence
// reserved in it (reserveLocked): the grant must be warm, since the
// resumed fiber is one of its fibers and writes to its log. The
// reservation is never answered by the zygote; the caller drops it
// (unreserve) or publishResumed replaces it with the fiber. It fails with
// ErrCold when the grant is not warm, ErrImageUnusable when its template
// spec changed since the park, and core.ErrInvalid when the fence is
// taken.
func (p *Proc) reserveResume(req ResumeRequest, m manifest) (*zygote, *pendingClone, error) {
	z := p.zygoteOf(req.Fence.GrantUID)
	if z == nil {
		return nil, nil, fmt.Errorf("grant not warm: %w", ErrCold)
	}
	if d := specDigest(z.spec); d != m.SpecDigest {
		return nil, nil, fmt.Errorf("the grant's template spec changed since the park: %w", ErrImageUnusable)
	}
	z.mu.Lock()
	pc, err := z.reserveLocked(req.Fence, req.Leaf)
	z.mu.Unlock()
	return z, pc, err
}

// restoreSetup is criu restore's command line and what it inherits, built
// by prepareRestore and added to by restore.
type restoreSetup struct {
	args  []string
	extra []*os.File // criu's descriptors 3 and up, named in args by --inherit-fd
	// relock answers criu's action script of an isolated fiber's restore
	// (criuhook_linux.go); nil for others.
	relock *relockHook
	// listener is what Resume returns as Resumed.Listener unless criu
	// binds a new one: req.Listener for a unix image, else nil.
	listener *os.File
	// undo is run by release, last first: descriptors to close, a unix
	// path to put back, a record to remove.
	undo []func(p *Proc)
}

// inherit hands f to criu as the descriptor that was id in the image.
func (rs *restoreSetup) inherit(f *os.File, id string) {
	rs.extra = append(rs.extra, f)
	rs.args = append(rs.args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 2+len(rs.extra), id))
}

// release runs rs.undo, last first, and empties it.
func (rs *restoreSetup) release(p *Proc) {
	for i := len(rs.undo) - 1; i >= 0; i-- {
		rs.undo[i](p)
	}
	rs.undo = nil
}

// prepareRestore builds the criu restore command line for image m of req:
// a new write end of the grant's log pipe for each pipe the fiber wrote to
// (ErrCold when there is no log to write to), and the listener
// (restoreListener). On error what it opened is released.
func prepareRestore(cr *criu, z *zygote, req ResumeRequest, m manifest) (*restoreSetup, error) {
	rs := &restoreSetup{args: cr.flags("restore", "-D", req.Image, "-o", "restore.log", "-d", "--restore-sibling",
		"--pidfile", restoredPidfile, "--tcp-close", "--manage-cgroups=ignore")}
	if len(m.Pipes) > 0 {
		logW, err := z.out.writer()
		if err != nil {
			return nil, fmt.Errorf("the grant's log: %v: %w", err, ErrCold)
		}
		rs.undo = append(rs.undo, func(*Proc) { _ = logW.Close() })
		for _, ino := range m.Pipes {
			rs.inherit(logW, fmt.Sprintf("pipe:[%d]", ino))
		}
	}
	if err := rs.restoreListener(req, m); err != nil {
		rs.release(z.p)
		return nil, err
	}
	if m.UserNS {
		if err := rs.restoreIsolated(z.p, req.Image, m); err != nil {
			rs.release(z.p)
			return nil, err
		}
		if z.guarded && m.Network != "unix" {
			// The hook marks the listener criu bound before the fiber
			// runs (the image holds no mark: see unmarkForDump).
			rs.relock.mark = GuardMark(z.id)
		}
	}
	return rs, nil
}

// restoreIsolated adds what criu restore of a fiber with a user namespace
// of its own needs (see shelf_linux.go): the shelf, the external files
// opened again, and the action script that makes its mounts read-only
// again (criuhook_linux.go), written into image.
func (rs *restoreSetup) restoreIsolated(p *Proc, image string, m manifest) error {
	if _, _, err := p.ck.shelfSpawn.serving(); err != nil {
		return err
	}
	rs.args = append(rs.args, p.ck.shelf.args()...)
	hook, err := writeRelockHook(p.cfg.Shell, image)
	if err != nil {
		return err
	}
	rs.relock = hook
	rs.undo = append(rs.undo, func(*Proc) { _ = hook.close() })
	rs.args = append(rs.args, "--action-script", hook.script)
	for _, ext := range m.Externals {
		f, err := openExternal(ext)
		if err != nil {
			return err
		}
		rs.undo = append(rs.undo, func(*Proc) { _ = f.Close() })
		rs.inherit(f, ext.Key)
	}
	return nil
}

// restoreListener arranges the image's listener. A unix one is
// req.Listener (required, a listening unix socket; core.ErrInvalid
// otherwise), inherited by criu; the socket now at the image's path, which
// criu unlinks, is kept by a hard link and put back by release. A TCP one
// is bound anew by criu: req.Listener, if given, must be at the image's
// address (core.ErrInvalid otherwise) and is closed.
func (rs *restoreSetup) restoreListener(req ResumeRequest, m manifest) error {
	switch m.Network {
	case "unix":
		if req.Listener == nil {
			return fmt.Errorf("the image's listener is a unix socket: Listener is required: %w", core.ErrInvalid)
		}
		if n, _, _ := fileListener(req.Listener); n != "unix" {
			return fmt.Errorf("the image's listener is a unix socket; Listener is %q, not a listening unix socket: %w", n, core.ErrInvalid)
		}
		rs.listener = req.Listener
		rs.inherit(req.Listener, fmt.Sprintf("socket:[%d]", m.Inode))
		// criu unlinks the path the fiber was bound to, even for an
		// inherited socket; whatever is there now keeps its name.
		if st, err := os.Lstat(m.Addr); err == nil && st.Mode()&fs.ModeSocket != 0 {
			keepPath := fmt.Sprintf("%s.keep-%d-%d", m.Addr, req.Fence.Epoch, req.Fence.Seq)
			_ = os.Remove(keepPath)
			if err := os.Link(m.Addr, keepPath); err == nil {
				rs.undo = append(rs.undo, func(p *Proc) {
					if err := os.Rename(keepPath, m.Addr); err != nil {
						p.log.Error(err, "Unix socket path not put back after a resume", "path", m.Addr)
					}
				})
			}
		}
	case "tcp", "tcp6":
		if req.Listener != nil {
			if n, a, _ := fileListener(req.Listener); n != m.Network || a != m.Addr {
				return fmt.Errorf("the image's listener is %s %s; Listener is %s %q: %w", m.Network, m.Addr, n, a, core.ErrInvalid)
			}
			_ = req.Listener.Close() // criu binds the address anew
		}
	}
	return nil
}

// restore runs criu restore of image m (rs's command line) from the
// Proc's restoring thread, in req's leaf when given. It returns
// CLOCK_BOOTTIME in clock ticks just before criu started (bootTicks) and
// how long criu took. A leafless fiber not in a pid namespace of its own
// is recorded at its pid until release, so that a crash of fiberd
// mid-restore does not leave it. On failure what criu left is ended
// (cleanFailedRestore) and the error is restoreFailure's.
func (p *Proc) restore(ctx context.Context, cr *criu, z *zygote, req ResumeRequest, m manifest, rs *restoreSetup) (int64, time.Duration, error) {
	_ = os.Remove(filepath.Join(req.Image, restoredPidfile))
	cmd := cr.command(ctx, rs.args...)
	cmd.Dir = req.Image
	cmd.ExtraFiles = rs.extra
	if req.Leaf != "" {
		leafF, err := cgroup.At(req.Leaf).Open()
		if err != nil {
			return 0, 0, err
		}
		rs.undo = append(rs.undo, func(*Proc) { _ = leafF.Close() })
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(leafF.Fd())
	}
	var outBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	start, startTick := p.cfg.Clock.Now(), bootTicks()
	if req.Leaf == "" && !m.OwnPIDNS {
		p.recordRestoring(z, rs, req.Fence.String(), m.PID, startTick)
	}
	var holder pidHolder // what keeps the fiber's pid from it, if anything
	if !m.OwnPIDNS {
		holder = holderOf(m.PID)
	}
	spawner := &p.ck.spawn
	if m.UserNS {
		spawner = &p.ck.shelfSpawn
	}
	if rs.relock != nil {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(relockWait)
		}
		rs.relock.served = true
		go rs.relock.serve(deadline)
	}
	rerr := spawner.start(cmd)
	if rerr == nil {
		rerr = cmd.Wait()
	}
	if rs.relock != nil {
		if err := rs.relock.close(); err != nil && rerr == nil {
			rerr = err
		}
		rs.relock = nil
	}
	if rerr != nil {
		p.cleanFailedRestore(req.Leaf, m, startTick)
		if ctx.Err() != nil {
			return 0, 0, fmt.Errorf("criu restore: %w", ctx.Err())
		}
		return 0, 0, restoreFailure(rerr, outBuf.Bytes(), req.Image, m, holder)
	}
	return startTick, p.cfg.Clock.Since(start), nil
}

// recordRestoring records, until rs is released, that criu is bringing
// back at pid a fiber of z without a leaf: nothing else would find a
// half-restored fiber after a crash of fiberd. A record that cannot be
// written is logged, not failed.
func (p *Proc) recordRestoring(z *zygote, rs *restoreSetup, name string, pid int, startTick int64) {
	restoring, err := z.recs.AddRestoring(pid, uint64(max(startTick, 0)))
	if err != nil {
		p.log.Error(err, "Resume not recorded: a crash of fiberd mid-resume could leave the fiber", "fence", name)
	}
	rs.undo = append(rs.undo, func(p *Proc) {
		if err := restoring.Remove(); err != nil {
			p.log.Error(err, "Restore record not removed", "fence", name)
		}
	})
}

// restoreFailure explains a failed criu restore of image m, from criu's
// exit and the state it left, never from the text of its log (see
// criuFailure): when criu exited by itself and the pid the fiber must get
// back (m.PID, outside a pid namespace of its own) is still held by holder,
// the process that held it just before criu started, it says so (a
// transient failure: the image is fine); else it is criuFailure's. The
// last lines of criu's output, if any, are appended.
func restoreFailure(runErr error, out []byte, image string, m manifest, holder pidHolder) error {
	logPath := filepath.Join(image, "restore.log")
	if !m.OwnPIDNS && criuExited(runErr) && holder.stillHeld(m.PID) {
		return fmt.Errorf("pid %d, which the fiber must get back, is taken by another process now (log %s)", m.PID, logPath)
	}
	err := criuFailure("restore", runErr, logPath, image, true)
	if len(out) > 0 {
		err = fmt.Errorf("%w; output: %s", err, lastLines(out, 2))
	}
	return err
}

// publishResumed makes f, restored from an image, one of z's fibers in
// place of its reservation, and hands it to the watcher. It fails with
// ErrCold when the zygote ended meanwhile (f is discarded) and with
// errClosed when Close came first (f is killed, reaped and finished
// without an Exit); lst, the copy of f's new listener, is closed then.
func (p *Proc) publishResumed(z *zygote, f *fiber, lst *os.File) error {
	name := f.fence.String()
	z.mu.Lock()
	if z.cold || z.stopping {
		z.mu.Unlock()
		p.discard(f)
		closeFile(lst)
		return fmt.Errorf("the grant's zygote ended meanwhile: %w", ErrCold)
	}
	delete(z.pending, name)
	z.fibers[name] = f
	z.mu.Unlock()
	if p.watch(f, z) {
		return nil
	}
	// Close came first: end the fiber here, without an Exit.
	z.mu.Lock()
	if z.fibers[name] == f {
		delete(z.fibers, name)
	}
	z.mu.Unlock()
	f.silent.Store(true)
	ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	_ = f.signal(ctx)
	p.reapBlocking(ctx, f.pidfd)
	cancel()
	f.closePidfd()
	p.finish(f, ExitReason{Killed: true}) // closes done for whoever waits; removes the leaf
	closeFile(lst)
	return errClosed
}

// closeFile closes f unless it is nil.
func closeFile(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}

// restoredPidfile is where criu restore writes the restored fiber's pid,
// in the image directory.
const restoredPidfile = "restored.pid"

// adoptRestored opens a pidfd on the fiber criu restored and checks it is
// fiberd's child; for a TCP image it also takes a copy of the fiber's new
// listener (pidfd_getfd of its descriptor 3). A fiber without a leaf is
// recorded in recs, as a cloned one is.
func (p *Proc) adoptRestored(req ResumeRequest, m manifest, startTick int64, recs *procrec.Dir) (*fiber, *os.File, error) {
	b, err := os.ReadFile(filepath.Join(req.Image, restoredPidfile))
	if err != nil {
		return nil, nil, fmt.Errorf("criu restore wrote no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return nil, nil, fmt.Errorf("criu restore's pid file holds %q", b)
	}
	pidfd, _, err := fiberPidfd(pid, os.Getpid())
	if err != nil {
		// Not ours to reap, or gone already: end what may be left.
		p.cleanFailedRestore(req.Leaf, m, startTick)
		return nil, nil, fmt.Errorf("restored fiber %d: %w", pid, err)
	}
	f := newFiber(req.Fence, pid, req.Leaf)
	f.pidfd = pidfd
	f.ck.resumed = true
	if req.Leaf == "" {
		// As for a cloned fiber: what it starts is found by its session
		// after a crash of fiberd. finish removes the record.
		st, err := procrec.ReadStat(pid)
		if err == nil {
			f.rec, err = recs.AddProcess(pid, st.Start)
		}
		if err != nil {
			p.log.Error(err, "Resumed fiber not recorded: a crash of fiberd would leave what it started", "fence", req.Fence.String())
		}
	}
	var lst *os.File
	if m.Network == "tcp" || m.Network == "tcp6" {
		fd, err := unix.PidfdGetfd(pidfd, 3, 0)
		if err != nil {
			p.discard(f)
			return nil, nil, fmt.Errorf("taking a copy of the restored fiber's listener: %w", os.NewSyscallError("pidfd_getfd", err))
		}
		lst = os.NewFile(uintptr(fd), "listener "+m.Addr)
	}
	return f, lst, nil
}

// discard kills a restored fiber nobody will track and reaps it, removing
// its leaf; it queues no Exit.
func (p *Proc) discard(f *fiber) {
	ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	defer cancel()
	_ = f.signal(ctx)
	p.reapBlocking(ctx, f.pidfd)
	f.closePidfd()
	if f.leaf != "" {
		_ = cgroup.At(f.leaf).Destroy(ctx)
	}
}

// cleanFailedRestore ends whatever a failed criu restore left, and reaps
// what of it is fiberd's child (criu kills the tasks it restored, but the
// restored root, forked as criu's sibling, is fiberd's zombie then): with a
// leaf, every process in it (criu ran there) and every zombie child of
// fiberd that was in it. Without a leaf, only a zombie child of fiberd at
// the fiber's pid that has the fiber's name (or criu's) and was born after
// criu started (restoredZombie): so it is never another child of fiberd's,
// nor whatever holds the pid when criu failed for it being taken; an image of a fiber that led its own
// pid namespace then leaves nothing findable: give Resume a leaf.
// startTick is CLOCK_BOOTTIME in clock ticks just before criu started.
func (p *Proc) cleanFailedRestore(leaf string, m manifest, startTick int64) {
	ctx, cancel := core.WithTimeout(context.Background(), p.cfg.Clock, p.cfg.KillTimeout)
	defer cancel()
	var pids []int
	if leaf != "" {
		pids, _ = cgroup.At(leaf).Procs()
		pids = append(pids, zombieChildrenIn(leaf)...)
	} else if !m.OwnPIDNS && m.Comm != "" && restoredZombie(m.PID, m.Comm, startTick) {
		pids = append(pids, m.PID)
	}
	var fds []int
	for _, pid := range pids {
		if fd, _, err := fiberPidfd(pid, os.Getpid()); err == nil {
			fds = append(fds, fd)
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
	}
	if leaf != "" {
		p.killLeafEach(ctx, leaf)
	}
	for _, fd := range fds {
		p.reapBlocking(ctx, fd)
		_ = unix.Close(fd)
	}
}

// restoredZombie reports whether pid is a zombie child of fiberd named
// comm (or still criu) that was born at or after startTick.
func restoredZombie(pid int, comm string, startTick int64) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	j := strings.IndexByte(string(b), '(')
	if i < 0 || j < 0 || j > i {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	// Until its restore finishes, the restored root is still named criu.
	if name := string(b[j+1 : i]); len(f) < 20 || f[0] != "Z" || (name != comm && name != "criu") {
		return false
	}
	ppid, _ := strconv.Atoi(f[1])
	start, _ := strconv.ParseInt(f[19], 10, 64) // field 22: starttime
	return ppid == os.Getpid() && start >= startTick
}

// bootTicks is CLOCK_BOOTTIME in clock ticks (USER_HZ, 100 on Linux), the
// unit of a process's start time in /proc/<pid>/stat, rounded down.
func bootTicks() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 1<<62 - 1
	}
	return ts.Sec*100 + ts.Nsec/10_000_000
}

// zombieChildrenIn lists fiberd's children that are zombies and were in
// the cgroup v2 leaf when they died (/proc keeps a zombie's cgroup).
func zombieChildrenIn(leaf string) []int {
	mount, err := cgroup.Mount()
	if err != nil {
		return nil
	}
	want := strings.TrimPrefix(leaf, mount)
	var out []int
	for _, pid := range fiberdChildren() {
		if st, err := procrec.ReadStat(pid); err != nil || !st.Zombie {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, line := range strings.Split(string(cg), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok && p == want {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killLeafEach sends SIGKILL to every process in a leaf, again until it is
// empty or ctx ends. Not cgroup.kill: on this kernel (6.18) a process later
// born into a cgroup that was once killed through cgroup.kill
// (CLONE_INTO_CGROUP) is killed at birth, and a retried Resume may reuse the
// leaf.
func (p *Proc) killLeafEach(ctx context.Context, leaf string) {
	for ctx.Err() == nil {
		pids, err := cgroup.At(leaf).Procs()
		if err != nil || len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		select {
		case <-ctx.Done():
		case <-p.cfg.Clock.After(time.Millisecond):
		}
	}
}

// writer opens a new write end of the log pipe (through /proc/self/fd of
// the read end fiberd holds), to hand the grant's log to a resumed fiber.
func (l *logPipe) writer() (*os.File, error) {
	rc, err := l.r.SyscallConn()
	if err != nil {
		return nil, err
	}
	var w *os.File
	var oerr error
	cerr := rc.Control(func(fd uintptr) {
		w, oerr = os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(fd)), os.O_WRONLY|syscall.O_CLOEXEC, 0)
	})
	if cerr != nil {
		return nil, cerr
	}
	return w, oerr
}

// fileListener describes the listening socket behind an *os.File.
func fileListener(f *os.File) (network, addr string, ino uint64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return "", "", 0
	}
	_ = rc.Control(func(fd uintptr) { network, addr, ino = listenerOf(int(fd)) })
	return
}

// runRecorded runs cmd as CombinedOutput does, with a record of it in recs
// (a nil recs records nothing) from its start until it has been waited for,
// so that New's sweep after a crash of fiberd ends its session. Once cmd
// has ended, its output is read for at most waitDelay more (a process it
// forked may outlive it holding the output: a criu killed mid-dump); when
// cmd failed, what is left of its process group is then killed, so that
// nothing of a failed run outlives it.
func runRecorded(cmd *exec.Cmd, recs *procrec.Dir, waitDelay time.Duration) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var rec procrec.Record
	if st, err := procrec.ReadStat(cmd.Process.Pid); err == nil {
		rec, _ = recs.AddProcess(cmd.Process.Pid, st.Start)
	}
	err := cmd.Wait()
	if err != nil && cmd.SysProcAttr != nil && cmd.SysProcAttr.Setsid {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	_ = rec.Remove()
	return out.Bytes(), err
}
