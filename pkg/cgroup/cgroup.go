package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// Mount returns the directory where the cgroup2 filesystem is mounted, read
// from /proc/self/mountinfo: /sys/fs/cgroup in a Pod, /sys/fs/cgroup/unified
// on a hybrid host. It fails when there is no cgroup2 mount (the error wraps
// errors.ErrUnsupported) or mountinfo cannot be read. Callers: Self, and
// commands that print where fiberd would carve.
func Mount() (string, error) { return mount() }

// Self returns the absolute directory of the cgroup this process runs in:
// the cgroup2 mount joined with the "0::" line of /proc/self/cgroup. It fails
// when either file cannot be read, there is no cgroup v2 hierarchy (errors
// wrapping errors.ErrUnsupported), or the path lies outside the mount. The
// Kubernetes home calls it when its Config.CgroupRoot is empty and hands the
// result to Delegate.
func Self() (string, error) { return self() }

// Delegate makes root, a cgroup v2 directory handed to fiberd, usable as a
// subtree: it creates root/fiberd, moves every process listed in
// root/cgroup.procs into it (fiberd itself among them when root is
// fiberd's own cgroup), creates root/grants, and enables for the children of
// root and of grants every controller offered in root/cgroup.controllers.
// Each controller is written separately; one that cannot be enabled is logged
// once on log and skipped. It returns the grants directory, the root to give
// NewTree. Delegate is idempotent: existing directories are reused.
//
// It fails, naming the path and the fix, when root is not a writable cgroup
// v2 directory or a process cannot be moved (as on a host's top cgroup,
// whose kernel threads never move: delegate a Pod's or a unit's cgroup). The Kubernetes home calls it at
// start with the result of Self.
func Delegate(root string, log logr.Logger) (grants string, err error) {
	return delegate(root, log)
}

// Check reports whether dir is a cgroup v2 directory (it holds cgroup.procs
// and cgroup.controllers). It fails naming dir and the fix, and wraps
// errors.ErrUnsupported off Linux. The standalone home calls it on an
// explicit -cgroup-root before it carves there.
func Check(dir string) error { return checkDir(dir) }

// EnterFD moves the calling process into the cgroup whose directory is open
// as dirfd, by writing "0" to cgroup.procs relative to dirfd (openat). A
// forked child calls it with the descriptor it received from Leaf.Open (the
// proc backend's zygote passes that descriptor to the child). A process
// started with exec should instead be placed at birth with
// CLONE_INTO_CGROUP: in Go, SysProcAttr{UseCgroupFD: true, CgroupFD: fd}.
// It fails when dirfd is not a cgroup v2 directory or the write is refused,
// and wraps errors.ErrUnsupported off Linux.
func EnterFD(dirfd int) error { return enterFD(dirfd) }

// Config configures a Tree.
type Config struct {
	// Root is the cgroup v2 directory under which grant cgroups are carved:
	// the grants directory returned by Delegate, or the operator's
	// -cgroup-root. Required; must be absolute and already exist.
	Root string
	// Logger receives one line per controller or pressure file the machine
	// lacks. Default klog.Background().
	Logger logr.Logger
}

// Validate reports the first field that is wrong and how to fix it.
func (c Config) Validate() error {
	switch {
	case c.Root == "":
		return fmt.Errorf("cgroup: Config.Root is empty: set it to a delegated cgroup v2 directory (see Delegate) or pass -cgroup-root")
	case !filepath.IsAbs(c.Root):
		return fmt.Errorf("cgroup: Config.Root %q is not absolute: give the full path under the cgroup2 mount", c.Root)
	}
	return nil
}

// withDefaults fills the documented defaults; it does no I/O.
func (c Config) withDefaults() Config {
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	c.Root = filepath.Clean(c.Root)
	return c
}

// Tree carves grant cgroups and fiber leaves under one root. It holds no
// descriptors and needs no Close; it remembers which missing controllers and
// pressure files it has already logged. Safe for concurrent use.
type Tree struct {
	root string
	log  logr.Logger

	mu     sync.Mutex
	warned map[string]bool
}

// NewTree validates cfg, checks that Root is a cgroup v2 directory, and
// enables for Root's children the controllers Root offers (each missing or
// refused one logged once, not an error). It fails when Root does not exist
// or is not a cgroup v2 directory. pkg/backend calls it once with the home's
// CgroupRoot.
func NewTree(cfg Config) (*Tree, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	t := &Tree{root: cfg.Root, log: cfg.Logger, warned: map[string]bool{}}
	if err := checkDir(t.root); err != nil {
		return nil, err
	}
	if err := enableControllers(t.root, t.warnOnce); err != nil {
		return nil, err
	}
	return t, nil
}

// Root returns the directory the tree carves under.
func (t *Tree) Root() string { return t.root }

// warnOnce logs msg with its key/values the first time key is seen.
func (t *Tree) warnOnce(key, msg string, kv ...any) {
	if t == nil {
		return
	}
	t.mu.Lock()
	seen := t.warned[key]
	t.warned[key] = true
	t.mu.Unlock()
	if !seen {
		t.log.Info(msg, kv...)
	}
}

// Grant creates (or reuses) the grant's cgroup <root>/<uid>, enables the
// offered controllers for its children, and creates its zygote leaf. It fails
// when uid is not a single path element or a directory cannot be made.
// pkg/backend calls it when a grant is admitted.
func (t *Tree) Grant(uid string) (Grant, error) {
	if err := checkName(uid); err != nil {
		return Grant{}, fmt.Errorf("grant %q: %w", uid, err)
	}
	g := Grant{UID: uid, Dir: Leaf{path: filepath.Join(t.root, uid), t: t}}
	g.Zygote = Leaf{path: filepath.Join(g.Dir.path, "zygote"), t: t}
	if err := makeDir(g.Dir.path); err != nil {
		return Grant{}, fmt.Errorf("grant %q: %w", uid, err)
	}
	if err := enableControllers(g.Dir.path, t.warnOnce); err != nil {
		return Grant{}, fmt.Errorf("grant %q: %w", uid, err)
	}
	if err := makeDir(g.Zygote.path); err != nil {
		return Grant{}, fmt.Errorf("grant %q: %w", uid, err)
	}
	return g, nil
}

// checkName accepts a single, ordinary path element.
func checkName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return fmt.Errorf("cgroup name %q is not a directory name", name)
	case strings.ContainsAny(name, "/\x00\n"):
		return fmt.Errorf("cgroup name %q contains '/', NUL or newline", name)
	case strings.HasPrefix(name, "cgroup."):
		return fmt.Errorf("cgroup name %q collides with the kernel's cgroup.* files", name)
	}
	return nil
}

// Grant is one grant's cgroup: Dir never holds processes itself; the zygote
// and every fiber are leaves below it.
type Grant struct {
	// UID is the grant's uid, the name of Dir.
	UID string
	// Dir is <root>/<uid>. Kill, WaitEmpty and Remove on it act on the
	// whole grant.
	Dir Leaf
	// Zygote is <root>/<uid>/zygote, where the proc backend runs the
	// grant's zygote.
	Zygote Leaf
}

// Fiber creates (or reuses) the fiber leaf <root>/<uid>/f-<epoch>-<seq>.
// It fails when the directory cannot be made. pkg/backend calls it per
// Clone before the fiber's process exists.
func (g Grant) Fiber(epoch, seq uint64) (Leaf, error) {
	l := Leaf{path: filepath.Join(g.Dir.path, fmt.Sprintf("f-%d-%d", epoch, seq)), t: g.Dir.t}
	if err := makeDir(l.path); err != nil {
		return Leaf{}, fmt.Errorf("grant %q: fiber %d-%d: %w", g.UID, epoch, seq, err)
	}
	return l, nil
}

// Remove ends the grant: it kills every process under Dir, waits until Dir
// is empty, and removes Dir with every leaf below it. Removing a grant that
// is already gone succeeds. It fails when ctx ends first or the kernel
// refuses. pkg/backend calls it when a grant is yielded.
func (g Grant) Remove(ctx context.Context) error { return g.Dir.Destroy(ctx) }

// Leaf is one cgroup v2 directory: usually a fiber's or the zygote's leaf,
// though every method also works on a grant's Dir (acting on its subtree).
// A Leaf is a path, cheap to copy; it holds no descriptor. The zero Leaf is
// not usable.
type Leaf struct {
	path string
	t    *Tree // may be nil: then nothing is logged
}

// At returns a Leaf for an existing cgroup directory, without checking it.
// Missing pressure files are not logged for such a Leaf. Tests and tools use
// it; fiberd gets its leaves from Tree.
func At(path string) Leaf { return Leaf{path: filepath.Clean(path)} }

// Path returns the leaf's absolute directory.
func (l Leaf) Path() string { return l.path }

// String returns the path, so a Leaf prints well in logs and errors.
func (l Leaf) String() string { return l.path }

// Open opens the leaf's directory (O_RDONLY|O_DIRECTORY|O_CLOEXEC) for
// handing to a process that must enter it: pass the descriptor to a forked
// child, which calls EnterFD, or use it as the CLONE_INTO_CGROUP descriptor
// of an exec. The caller closes the file. It fails when the leaf is gone.
func (l Leaf) Open() (*os.File, error) { return openDir(l.path) }

// OpenEntry opens the leaf's cgroup.procs with O_PATH (and O_CLOEXEC): a
// descriptor that lets its holder do nothing but name the file. A process
// given it enters the leaf by opening /proc/self/fd/<fd> for writing and
// writing "0", and the kernel checks that open, and the migration, against
// that process's own credentials, never fiberd's: a template that passes
// the descriptor on gains no one anything (docs/security.md). The caller
// closes the file. It fails when the leaf is gone.
func (l Leaf) OpenEntry() (*os.File, error) { return openEntry(l.path) }

// ChownProcs lets user id enter processes into the leaf: it makes id the
// owner of the leaf's cgroup.procs. The kernel lets a process move another
// into a cgroup when it may write that cgroup's cgroup.procs and the one of
// the two cgroups' nearest common ancestor, so giving the grant's own user
// the grant's Dir and each of its fiber leaves lets that user move its
// processes between them, and nothing from outside the grant in. Only root
// may give a file to another user.
func (l Leaf) ChownProcs(id int) error { return chownProcs(l.path, id) }

// AddProc moves process pid (its whole thread group) into the leaf by
// writing its pid to cgroup.procs. It fails when the process is gone, the
// leaf is gone, or the kernel refuses (e.g. the leaf has children with
// controllers enabled).
func (l Leaf) AddProc(pid int) error { return addProc(l.path, pid) }

// Procs lists the pids in the leaf's own cgroup.procs (not its children's).
func (l Leaf) Procs() ([]int, error) { return readProcs(l.path) }

// Kill ends every process in the leaf and below it by writing "1" to
// cgroup.kill (kernel 5.14 and later), which returns once the kernel has
// sent SIGKILL to all of them; use WaitEmpty to wait for them to be gone.
// Where cgroup.kill is absent it sends SIGKILL to every pid listed in the
// subtree's cgroup.procs files, again and again until they are all empty.
// Killing a leaf that no longer exists fails with an error satisfying
// errors.Is(err, fs.ErrNotExist). It fails when ctx ends before the fallback is done.
func (l Leaf) Kill(ctx context.Context) error { return kill(ctx, l.path) }

// WaitEmpty returns once no process is left in the leaf or below it
// (cgroup.events says "populated 0"). It watches cgroup.events with inotify
// rather than polling. A leaf that is gone counts as empty. It fails when
// ctx ends first, returning ctx's error.
func (l Leaf) WaitEmpty(ctx context.Context) error {
	return waitEvent(ctx, l.path, "populated", "0")
}

// Freeze stops every process in the leaf and below it (writes "1" to
// cgroup.freeze) and returns once the kernel reports "frozen 1" in
// cgroup.events. It fails when ctx ends first or the leaf is gone.
func (l Leaf) Freeze(ctx context.Context) error { return freeze(ctx, l.path, true) }

// Thaw resumes a frozen leaf (writes "0" to cgroup.freeze) and returns once
// cgroup.events says "frozen 0". It fails when ctx ends first or the leaf is
// gone.
func (l Leaf) Thaw(ctx context.Context) error { return freeze(ctx, l.path, false) }

// Remove deletes the leaf's directory and every cgroup below it, children
// first. A leaf already gone is not an error. It fails (EBUSY) while a
// process is still inside: Kill and WaitEmpty first.
func (l Leaf) Remove() error { return removeTree(l.path) }

// Destroy ends the leaf for good: Kill, then WaitEmpty, then Remove. A leaf
// already gone succeeds. It fails when ctx ends before the leaf is empty or
// the kernel refuses. Grant.Remove calls it on Dir; pkg/backend calls it when
// a fiber or a zygote has ended, to take whatever it left behind with it.
func (l Leaf) Destroy(ctx context.Context) error {
	if err := l.Kill(ctx); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if err := l.WaitEmpty(ctx); err != nil {
		return err
	}
	return l.Remove()
}

// Enabled reports whether controller is enabled for the leaf's children:
// listed in its cgroup.subtree_control. The agent asks a grant's Dir
// whether its fibers' leaves have the memory controller. It fails when the
// file cannot be read.
func (l Leaf) Enabled(controller string) (bool, error) { return enabled(l.path, controller) }

// SetMemoryLimit bounds the memory charged to the leaf: max to memory.max
// (the kernel reclaims, then ends the leaf's processes with its OOM killer
// at it), high to memory.high (throttled and reclaimed hard above it; high
// must not exceed max), and memory.oom.group set to 1, so an OOM kill ends
// the leaf's processes together. The memory controller must be enabled for
// the leaf (its parent's cgroup.subtree_control). It fails naming the
// first file that cannot be written; a missing memory.oom.group (kernels
// before 4.19) is no error.
func (l Leaf) SetMemoryLimit(max, high int64) error { return setMemoryLimit(l.path, max, high) }

// SetPidsMax caps the processes and threads in the leaf and below it at n
// (pids.max): a fork that would pass it fails with EAGAIN, so a fork bomb
// ends at the cap. It needs the pids controller enabled for the leaf (see
// Enabled on its parent). n must be positive.
func (l Leaf) SetPidsMax(n int64) error { return setPidsMax(l.path, n) }

// SetCPUWeight sets the leaf's cpu.weight (1 to 10000; the kernel's
// default is 100): under contention siblings share the CPU in proportion
// to their weights, whatever the number of processes in each. It needs the
// cpu controller enabled for the leaf.
func (l Leaf) SetCPUWeight(w int) error { return setCPUWeight(l.path, w) }

// OOMKills is the "oom_kill" count of the leaf's memory.events: how many of
// its processes the kernel's OOM killer ended at its memory.max. ok is
// false when the file is absent (no memory controller). The backends read
// it when a fiber ends, to tell an end at the fiber's memory.max.
func (l Leaf) OOMKills() (n int64, ok bool, err error) { return oomKills(l.path) }

// Pressure is the leaf's pressure stall information: the "some avg10"
// figure, the percentage of the last 10 seconds in which at least one of its
// tasks was stalled on the resource.
type Pressure struct {
	// Memory is "some avg10" of memory.pressure; meaningful only when
	// HasMemory.
	Memory float64
	// HasMemory is false when memory.pressure is absent (no memory
	// controller or PSI off).
	HasMemory bool
	// CPU is "some avg10" of cpu.pressure; meaningful only when HasCPU.
	CPU float64
	// HasCPU is false when cpu.pressure is absent.
	HasCPU bool
}

// Pressure reads memory.pressure and cpu.pressure. A missing file is not an
// error: its Has field is false, and a Leaf from a Tree logs that once. It
// fails when a file exists but cannot be read or parsed.
func (l Leaf) Pressure() (Pressure, error) {
	var p Pressure
	var err error
	if p.Memory, p.HasMemory, err = readPressure(l.path, "memory.pressure"); err != nil {
		return Pressure{}, err
	}
	if !p.HasMemory {
		l.t.warnOnce("pressure:memory", "memory.pressure is absent; memory pressure unavailable", "cgroup", l.path)
	}
	if p.CPU, p.HasCPU, err = readPressure(l.path, "cpu.pressure"); err != nil {
		return Pressure{}, err
	}
	if !p.HasCPU {
		l.t.warnOnce("pressure:cpu", "cpu.pressure is absent; CPU pressure unavailable", "cgroup", l.path)
	}
	return p, nil
}
