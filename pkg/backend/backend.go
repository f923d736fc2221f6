package backend

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// Backend runs fibers of warm templates. The agent holds one per tier it
// serves: Proc for WARM, Exec for BASIC. Every method is safe for concurrent
// use; Clone, Kill and Stop may run at the same time for different fibers
// and grants.
type Backend interface {
	// Tier is the tier the backend serves fibers at: TierWarm for Proc,
	// TierBasic for Exec.
	Tier() core.Tier

	// Warm makes the grant's template ready to clone: Proc starts the
	// zygote in <Cgroup>/zygote and waits until it says READY; Exec
	// checks the command and records the request. Warming a grant that is
	// already warm with the same spec does nothing; a grant warm with
	// another spec is refused (Stop it first); a cold grant (its zygote
	// died) is warmed again. It fails when the spec cannot be served at
	// this tier (core.ErrTierGap), the request is malformed
	// (core.ErrInvalid), the process cannot start, or it is not READY
	// before Config.WarmTimeout or ctx ends; then nothing is left
	// running. A grant the backend cannot isolate as far as
	// req.MinIsolation asks, or whose template asks for "network": "none"
	// where Isolation().NetworkNone is false, is refused with
	// core.ErrTierGap. The agent calls it when it admits a grant.
	Warm(ctx context.Context, req WarmRequest) error

	// Warmed reports whether the grant is warm: Warm succeeded and,
	// for Proc, its zygote has not died since.
	Warmed(grantUID string) bool

	// Isolation reports the isolation this backend gives on this host:
	// the most a grant gets, whether "network": "none" can be served, and
	// what is missing for more. It is found once, when the backend is
	// created, and never changes. The agent shows it at start-up.
	Isolation() IsolationSupport

	// GrantIsolation reports the isolation a warm grant got: the least of
	// Isolation().Level and what its template allows ("isolation":
	// "shared" allows IsolationGrant at most). It is "" when the grant is
	// not warm. The agent shows it per grant in status and metrics.
	GrantIsolation(grantUID string) Isolation

	// Clone creates one fiber of a warm grant and returns once its
	// process exists and is in its leaf (user code may not have run yet;
	// connections queue on the listener meanwhile). ctx carries the
	// caller's deadline; a fiber that appears after ctx ended is killed
	// without an Exit. It fails with ErrCold when the grant is not warm,
	// core.ErrInvalid for a bad request or a fence already running, and
	// with the zygote's reason when it refused. After a failed Clone the
	// leaf is still the caller's to remove; after a successful one the
	// backend removes it when the fiber ends. Clone does not close
	// req.Listener.
	Clone(ctx context.Context, req CloneRequest) (Fiber, error)

	// Kill ends a running fiber and returns once it is gone: with a leaf,
	// through the leaf's cgroup.kill; without, with SIGKILL to its
	// process group. Its Exit (Reason.Killed) is queued before Kill
	// returns. It fails with core.ErrNotFound for a fence that is not
	// running, and with ctx's error when ctx ends first (the fiber is
	// then still being ended). The agent calls it on release.
	Kill(ctx context.Context, fence core.Fence) error

	// Stop ends the grant: every fiber is killed (Reason.Killed), the
	// zygote too, and the grant forgotten. Stopping a grant that is not
	// warm does nothing. It fails when ctx ends before everything is
	// gone. The agent calls it when a grant is yielded.
	Stop(ctx context.Context, grantUID string) error

	// Exits delivers one Exit per fiber that ended (on its own, killed,
	// or with its template) and, for Proc, one Exit with Template set per
	// zygote that died without being stopped. The same channel is
	// returned on every call; it is closed by Close. Exits are queued
	// without bound, so a slow reader never stalls the backend.
	Exits() <-chan Exit

	// Close stops every grant, waits for every goroutine and process it
	// started, and closes Exits. It is idempotent; later calls return
	// the first result.
	Close() error
}

// SpareStatus is what a grant's spares are, for status and metrics.
type SpareStatus struct {
	// Supported is set when the grant's zygote hands spares over (it said
	// "READY spares").
	Supported bool
	// Want is how many spares the grant should have now: min(W, max -
	// running), 0 when unsupported or given up (Failed).
	Want int
	// Ready is how many spares are forked and waiting.
	Ready int
	// Failed is set when spares kept failing and the zygote gets no more
	// until one is taken or SetSpares is called.
	Failed bool
	// Taken counts the Clones a spare served since the zygote started.
	Taken uint64
}

// Sparer is a Backend that keeps spare fibers per grant (the grant's
// fibers.warm): forked ahead and waiting, so a Clone hands one its fiber
// instead of forking. Proc implements it. Spares are no fibers: Clone
// takes them, but Kill, Exits and the fiber counts never see them.
type Sparer interface {
	// SetSpares sets how many spares a warm grant keeps: min(warm, max -
	// its running fibers). Warm starts with the grant's Fibers.Warm and
	// Fibers.Max; the agent calls SetSpares when a renewal changes them.
	// It returns at once; spares are forked and ended in the background.
	SetSpares(grantUID string, warm, max int)
	// RenewSpares ends the grant's waiting spares and forks new ones; the
	// agent calls it on an epoch bump.
	RenewSpares(grantUID string)
	// Spares reports the grant's spares; zero when it is not warm.
	Spares(grantUID string) SpareStatus
	// SparePIDs lists the waiting spares' pids, for measuring their
	// memory.
	SparePIDs(grantUID string) []int
}

// MaxPayload is the largest Clone payload, 4096 bytes, the API's limit.
const MaxPayload = 4096

// WarmRequest asks a backend to warm one grant's template.
type WarmRequest struct {
	// Grant is the admitted grant; its UID names the zygote and its
	// fibers. Required.
	Grant core.Grant
	// Spec is the template to run, resolved from Grant.Template by
	// template.Dir.Resolve. Required.
	Spec template.Spec
	// Cgroup is the grant's cgroup v2 directory (<root>/<uid>). Proc
	// starts the zygote in Cgroup/zygote (creating it when missing) and
	// removes that leaf when the zygote ends; the grant directory itself
	// stays the caller's. Empty runs without cgroups.
	Cgroup string
	// Devices is the grant's device channel, passed to the template as
	// FIBERD_DEVICES and FIBERD_DEVICE_CLAIMS (comma-separated, empty when
	// none).
	Devices core.DeviceChannel
	// RunDir is the grant's run directory: created (0700) when missing,
	// the default working directory, and the home of the log file
	// (zygote.log for Proc, fibers.log for Exec) that takes the
	// template's stdout and stderr up to Config.LogMaxBytes. Required.
	// An isolated grant (GrantIsolation not IsolationNone) works in
	// RunDir/home instead, a directory the backend creates owned by the
	// grant's user (the template cannot reach RunDir itself, nor write
	// its log file).
	RunDir string
	// Records, when set, is where the backend records the processes it
	// starts for the grant that no cgroup holds: Proc's zygote, and each
	// fiber (Proc or Exec) whose CloneRequest has no Leaf. Each record is
	// made once the process exists and removed once it has been reaped,
	// so a fiberd restarted after a crash ends what is left
	// (procrec.Dir.Sweep). Nil (the default) records nothing.
	Records *procrec.Dir
	// MinIsolation is the least isolation the grant may run with; Warm
	// fails with core.ErrTierGap when the grant would get less. Default
	// IsolationNone: any.
	MinIsolation Isolation
}

// CloneRequest asks a backend for one fiber.
type CloneRequest struct {
	// Fence names the fiber; its GrantUID picks the warm grant. Required.
	Fence core.Fence
	// Listener is the fiber's bound, listening socket; the fiber gets it
	// as descriptor 3 with LISTEN_FDS=1 and LISTEN_PID=<its pid>. The
	// caller keeps and closes its own copy. Required.
	Listener *os.File
	// Leaf is the fiber's cgroup v2 leaf directory, created by the
	// caller (cgroup.Grant.Fiber). The fiber enters it before user code
	// runs. Empty runs without a cgroup; the fiber is then killed by
	// process group.
	Leaf string
	// Payload is handed to the fiber as FIBERD_PAYLOAD (hex) and, with
	// the SDKs, as bytes. At most MaxPayload bytes. Default none.
	Payload []byte
}

// Fiber is a running fiber as Clone returns it.
type Fiber struct {
	// Fence is the fiber's fence, as requested.
	Fence core.Fence
	// PID is the fiber's process id in fiberd's PID namespace (not the
	// one the zygote reported from its own namespace).
	PID int
	// Isolation is the isolation the fiber got: its grant's, except that
	// a fiber the zygote did not put in PID and mount namespaces of its
	// own (a zygote without the SDK's support) reports IsolationGrant
	// under a grant of IsolationFiber. The proc backend checks it on the
	// process itself.
	Isolation Isolation
}

// Exit reports that a fiber, or a grant's zygote, ended.
type Exit struct {
	// GrantUID is the grant the process belonged to.
	GrantUID string
	// Fence is the fiber that ended; zero when Template is set.
	Fence core.Fence
	// Template is set when the exit is the zygote's own: it died without
	// Stop and the grant is now cold. Its fibers' Exits come first.
	Template bool
	// Reason says how it ended.
	Reason ExitReason
}

// ExitReason says how a fiber or zygote ended. Exactly one of Parked,
// Signal, TemplateDied, or a plain exit Code applies; Killed and
// MemoryMax may accompany any of them.
type ExitReason struct {
	// Parked is set when the fiber ended because Park wrote its image:
	// its session lives on in the image (see Checkpointer).
	Parked bool
	// Code is the exit code when the process exited by itself.
	Code int
	// Signal is the signal's name ("SIGKILL") when a signal ended it.
	Signal string
	// TemplateDied is set when the fiber was ended because its zygote
	// died; the fiber's own status is then unknown.
	TemplateDied bool
	// Killed is set when the fiber was ended by Kill or Stop.
	Killed bool
	// MemoryMax is set when the kernel's OOM killer ended processes of the
	// fiber's leaf at its memory.max (memory.events oom_kill, read before
	// the leaf is removed): the fiber went over the memory its grant
	// allows.
	MemoryMax bool
	// Unreported is set when fiberd killed the fiber and its zygote never
	// reported the end (EXITED): fiberd saw the process gone itself. A
	// template that keeps doing this is broken or hostile.
	Unreported bool
}

// String reads "exit:0", "signal:SIGSEGV", "template died", "killed",
// "killed (its zygote did not report the end)", "parked" or "memory.max".
func (r ExitReason) String() string {
	switch {
	case r.Parked:
		return "parked"
	case r.MemoryMax:
		return "memory.max"
	case r.Killed && r.Unreported:
		return "killed (its zygote did not report the end)"
	case r.Killed:
		return "killed"
	case r.TemplateDied:
		return "template died"
	case r.Signal != "":
		return "signal:" + r.Signal
	}
	return "exit:" + strconv.Itoa(r.Code)
}

// Config configures a backend. Both NewProc and NewExec take it; fields
// one of them does not use are ignored there.
type Config struct {
	// Logger receives lifecycle lines. Default klog.Background(); a Logger
	// with a nil sink (including logr.Discard()) counts as unset.
	Logger logr.Logger
	// Clock times the warm and kill timeouts. Default clock.RealClock{}.
	Clock clock.WithDelayedExecution
	// WarmTimeout bounds how long a zygote may take to say READY.
	// Default 30s.
	WarmTimeout time.Duration
	// KillTimeout bounds how long ending a fiber's leftovers (the rest of
	// its leaf) may take before the leaf is given up and logged, and for
	// Proc how long the killed fibers of an ended zygote are waited for
	// (and reaped) before those still running are logged. Default 10s.
	KillTimeout time.Duration
	// LogMaxBytes caps each template log file; output beyond it is
	// dropped after one marker line. Default 1 MiB.
	LogMaxBytes int64
	// Path is the PATH in a template's environment (a spec's env may
	// override it) and the path a bare command name is looked up in.
	// Default "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".
	Path string
	// CRIU is the criu binary (4.2 or later) the proc backend parks and
	// resumes fibers with: the CHECKPOINT tier (see Checkpointer). It must
	// be absolute. Default "": no checkpoints; Park and Resume then fail
	// with core.ErrTierGap. hack/criu.sh builds one at DefaultCRIUPath.
	CRIU string
	// Shell runs the exec backend's one-line shim that sets LISTEN_PID to
	// the fiber's own pid before it execs the template (the pid is not
	// known before the fork). Must be a POSIX sh. Default "/bin/sh".
	Shell string
	// Isolation is the most isolation the backend gives a grant. Default
	// IsolationNone (fibers run as fiberd, in its namespaces). With more,
	// the backend finds at creation what the host allows (it needs root,
	// or CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID, and user namespaces),
	// gives every grant at most that, and logs one line at V(1) saying
	// what is missing when it is less than asked (see Backend.Isolation,
	// which the agent logs at start). The exec
	// backend starts every fiber isolated on its own, so any level above
	// none gives its fibers IsolationFiber.
	Isolation Isolation
	// IDs is the pool of user and group ids isolated grants run as.
	// Default: a pool of the backend's own of DefaultIDCount ids from
	// DefaultIDFirst. Give both backends of one fiberd the same pool, or
	// a grant of one and a grant of the other may run as the same user.
	// Unused without isolation.
	IDs *IDPool
	// ScratchSize is the size, in bytes, of each tmpfs an isolated grant
	// or fiber gets on its scratch directories (/tmp, /var/tmp and
	// /dev/shm) when its grant has no wBudget; a grant with one gets that
	// size instead (see Grant.WBudget). Writing files there cannot take
	// more of the host's memory than that per directory. Default
	// DefaultScratchSize. Unused without isolation.
	ScratchSize int64
	// NoEndpointGuard turns the endpoint guard off: isolated grants' TCP
	// listeners are not marked and no nftables table is made, so a fiber
	// of one grant can connect to another grant's fiber's endpoint
	// (Isolation().EndpointsApart is false and Missing says so). For the
	// tests' controls and the benchmarks' pairs; fiberd never sets it.
	NoEndpointGuard bool
	// GrantNetworks says every grant the backend serves has a network
	// namespace of its own, as in a grant Pod (one grant per Pod): no
	// endpoint guard is made, none being needed, and
	// Isolation().EndpointsApart is true. fiberd sets it under -home
	// kubernetes.
	GrantNetworks bool
}

// DefaultScratchSize is Config.ScratchSize's default: 256 MiB.
const DefaultScratchSize int64 = 256 << 20

// DefaultPath is Config.Path's default.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Validate reports the first field that is wrong and how to fix it.
func (c Config) Validate() error {
	switch {
	case c.WarmTimeout < 0:
		return fmt.Errorf("backend: Config.WarmTimeout %v is negative: leave it 0 for 30s or give a positive duration", c.WarmTimeout)
	case c.KillTimeout < 0:
		return fmt.Errorf("backend: Config.KillTimeout %v is negative: leave it 0 for 10s or give a positive duration", c.KillTimeout)
	case c.LogMaxBytes < 0:
		return fmt.Errorf("backend: Config.LogMaxBytes %d is negative: leave it 0 for 1 MiB", c.LogMaxBytes)
	case c.CRIU != "" && !filepath.IsAbs(c.CRIU):
		return fmt.Errorf("backend: Config.CRIU %q is not absolute: give the full path of the criu binary, or leave it empty for no checkpoints", c.CRIU)
	case c.Shell != "" && !filepath.IsAbs(c.Shell):
		return fmt.Errorf("backend: Config.Shell %q is not absolute: give the full path of a POSIX sh", c.Shell)
	case c.ScratchSize < 0:
		return fmt.Errorf("backend: Config.ScratchSize %d is negative: leave it 0 for %d MiB or give a size in bytes", c.ScratchSize, DefaultScratchSize>>20)
	case c.Isolation.rank() < 0:
		return fmt.Errorf("backend: Config.Isolation %q: want %q, %q or %q", string(c.Isolation), IsolationNone, IsolationGrant, IsolationFiber)
	}
	return nil
}

// withDefaults fills the documented defaults; it does no I/O.
func (c Config) withDefaults() Config {
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.WarmTimeout == 0 {
		c.WarmTimeout = 30 * time.Second
	}
	if c.KillTimeout == 0 {
		c.KillTimeout = 10 * time.Second
	}
	if c.LogMaxBytes == 0 {
		c.LogMaxBytes = 1 << 20
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.Shell == "" {
		c.Shell = "/bin/sh"
	}
	if c.Isolation == "" {
		c.Isolation = IsolationNone
	}
	if c.ScratchSize == 0 {
		c.ScratchSize = DefaultScratchSize
	}
	return c
}

// scratchSize is the size of each scratch tmpfs of an isolated grant g:
// its wBudget, or ScratchSize when it has none.
func (c Config) scratchSize(g core.Grant) int64 {
	if g.WBudget > 0 {
		return g.WBudget
	}
	return c.ScratchSize
}

// checkWarm validates the parts of a WarmRequest every backend needs.
func checkWarm(req WarmRequest) error {
	switch {
	case req.Grant.UID == "":
		return fmt.Errorf("warm: Grant.UID is empty: %w", core.ErrInvalid)
	case req.RunDir == "":
		return fmt.Errorf("grant %q: warm: RunDir is empty: %w", req.Grant.UID, core.ErrInvalid)
	case req.Cgroup != "" && !filepath.IsAbs(req.Cgroup):
		return fmt.Errorf("grant %q: warm: Cgroup %q is not absolute: %w", req.Grant.UID, req.Cgroup, core.ErrInvalid)
	case req.MinIsolation.rank() < 0:
		return fmt.Errorf("grant %q: warm: MinIsolation %q is not a level: %w", req.Grant.UID, string(req.MinIsolation), core.ErrInvalid)
	}
	if err := req.Spec.Validate(); err != nil {
		return fmt.Errorf("grant %q: %w", req.Grant.UID, err)
	}
	return nil
}

// checkClone validates a CloneRequest.
func checkClone(req CloneRequest) error {
	switch {
	case req.Fence.GrantUID == "":
		return fmt.Errorf("clone: Fence.GrantUID is empty: %w", core.ErrInvalid)
	case req.Listener == nil:
		return fmt.Errorf("fiber %s: clone: Listener is nil: %w", req.Fence, core.ErrInvalid)
	case len(req.Payload) > MaxPayload:
		return fmt.Errorf("fiber %s: clone: payload of %d bytes is over %d: %w", req.Fence, len(req.Payload), MaxPayload, core.ErrInvalid)
	case req.Leaf != "" && !filepath.IsAbs(req.Leaf):
		return fmt.Errorf("fiber %s: clone: Leaf %q is not absolute: %w", req.Fence, req.Leaf, core.ErrInvalid)
	}
	return nil
}

// exitQueue is the unbounded queue behind Exits: push never blocks, a pump
// goroutine hands exits to the channel in order.
type exitQueue struct {
	out  chan Exit
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	q      []Exit
	wake   chan struct{}
	closed bool
}

func newExitQueue() *exitQueue {
	e := &exitQueue{out: make(chan Exit), stop: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go e.pump()
	return e
}

func (e *exitQueue) push(x Exit) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.q = append(e.q, x)
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *exitQueue) pump() {
	defer close(e.done)
	defer close(e.out)
	for {
		e.mu.Lock()
		if len(e.q) == 0 {
			e.mu.Unlock()
			select {
			case <-e.wake:
				continue
			case <-e.stop:
				return
			}
		}
		x := e.q[0]
		e.mu.Unlock()
		select {
		case e.out <- x:
			e.mu.Lock()
			e.q[0] = Exit{}
			e.q = e.q[1:]
			e.mu.Unlock()
		case <-e.stop:
			return
		}
	}
}

// close drops undelivered exits, ends the pump and closes out.
func (e *exitQueue) close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return
	}
	e.closed = true
	e.mu.Unlock()
	close(e.stop)
	<-e.done
}
