package standalone

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
)

// Name is what this home is selected by (-home standalone).
const Name = "standalone"

// DefaultStaleTTL is how long the issuer may go without a successful key
// refresh before the home counts as unhealthy.
const DefaultStaleTTL = 30 * time.Second

// Config is what cmd/fiberd hands New. Every field documents its default;
// defaults are applied without I/O.
type Config struct {
	// GrantsDir is the directory of grant files (-grants-dir), polled for
	// *.jwt files and created 0700 when missing. Empty means no lane:
	// grants arrive only inside Clone requests, and Grants returns a nil
	// channel.
	GrantsDir string
	// GrantsPoll is how often GrantsDir is read. Default
	// home.DefaultGrantsPoll.
	GrantsPoll time.Duration

	// Cache is the issuer's key cache (-issuer without -issuer-keys). Run
	// refreshes it every RefreshInterval, and each successful refresh is a
	// sign the control plane is alive. Nil means no issuer to watch, as
	// with keys verified offline: the home is then always healthy.
	Cache *grant.Cache
	// StaleTTL is how long the issuer may go without a successful refresh
	// before the home is unhealthy (-stale-ttl). Default DefaultStaleTTL.
	// Unused without a Cache.
	StaleTTL time.Duration
	// RefreshInterval is how often Run refreshes Cache. Default a third of
	// StaleTTL, so one failed refresh does not make the home unhealthy.
	// It must be shorter than StaleTTL.
	RefreshInterval time.Duration

	// CgroupRoot is the cgroup v2 directory fiberd may carve
	// (-cgroup-root). It must exist; New fails when it is not a cgroup v2
	// directory. Empty means this process's own cgroup, delegated with
	// cgroup.Delegate: fiberd moves into its "fiberd" leaf and carves under
	// the "grants" child. When this process runs in the hierarchy's root
	// cgroup, which nothing may be moved out of wholesale, the home carves
	// under <mount>/fiberd instead and moves nothing. When cgroup v2 is
	// missing or not writable, the home logs that once and runs without
	// cgroups.
	CgroupRoot string
	// NoCgroups runs without cgroups whatever CgroupRoot says
	// (-cgroup-root=none): CgroupRoot() is "". Default false.
	NoCgroups bool

	// Devices are the device paths or ids of this host handed to every
	// grant's template (-devices), as a static device channel. Empty
	// means no devices.
	Devices []string

	// Clock drives the refreshes and the lane, and stamps the health.
	// Default the real clock.
	Clock clock.WithTicker
	// Logger receives the home's log lines. Default klog.Background().
	Logger logr.Logger
}

// withDefaults fills the zero fields of c. It does no I/O.
func (c Config) withDefaults() Config {
	if c.GrantsPoll == 0 {
		c.GrantsPoll = home.DefaultGrantsPoll
	}
	if c.StaleTTL == 0 {
		c.StaleTTL = DefaultStaleTTL
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = c.StaleTTL / 3
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// Validate reports the first thing wrong with c, after defaults, naming the
// field and the fix. It does no I/O.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.GrantsPoll < 0:
		return fmt.Errorf("standalone home: GrantsPoll %v is negative: use a positive interval, or 0 for %v", c.GrantsPoll, home.DefaultGrantsPoll)
	case c.StaleTTL < 0:
		return fmt.Errorf("standalone home: StaleTTL %v is negative: set -stale-ttl to a positive duration, or 0 for %v", c.StaleTTL, DefaultStaleTTL)
	case c.RefreshInterval <= 0:
		return fmt.Errorf("standalone home: RefreshInterval %v is not positive: use 0 for a third of StaleTTL", c.RefreshInterval)
	case c.Cache != nil && c.RefreshInterval >= c.StaleTTL:
		return fmt.Errorf("standalone home: RefreshInterval %v is not shorter than StaleTTL %v: the issuer would go stale between refreshes; shorten it", c.RefreshInterval, c.StaleTTL)
	case c.GrantsDir != "" && !filepath.IsAbs(c.GrantsDir):
		return fmt.Errorf("standalone home: GrantsDir %q is not absolute: set -grants-dir to an absolute path", c.GrantsDir)
	case c.CgroupRoot != "" && !filepath.IsAbs(c.CgroupRoot):
		return fmt.Errorf("standalone home: CgroupRoot %q is not absolute: set -cgroup-root to a directory under the cgroup2 mount", c.CgroupRoot)
	}
	for i, d := range c.Devices {
		if d == "" {
			return fmt.Errorf("standalone home: Devices[%d] is empty: list device paths or ids separated by commas in -devices", i)
		}
	}
	return nil
}

// Home is the standalone home. It implements home.Home and the agent's
// optional IssuerOverrider (SetIssuerReachable).
type Home struct {
	cfg        Config
	log        logr.Logger
	lane       *home.FileLane // nil without GrantsDir
	health     *core.SourceHealth
	cgroupRoot string
	sys        cgroupSys
	carved     bool // cgroupRoot is a child of the root cgroup this home made

	mu         sync.Mutex
	ready      map[string]bool // by grant UID: its template is warm
	running    bool            // Run was called
	laneCancel context.CancelFunc
	closed     bool
}

var _ home.Home = (*Home)(nil)

// New validates cfg and builds the home: it creates GrantsDir when missing
// and settles the cgroup root (delegating this process's cgroup when
// CgroupRoot is empty, which moves this process and its cgroup's other
// processes into the "fiberd" leaf). It reads no grant; that starts with
// Grants. It fails on an invalid cfg, a GrantsDir that cannot be created,
// or a CgroupRoot that is not a cgroup v2 directory.
func New(cfg Config) (*Home, error) {
	return newHome(cfg, hostCgroups{})
}

// cgroupSys is the host's cgroup v2 hierarchy as New sees it; tests fake
// it.
type cgroupSys interface {
	Mount() (string, error)
	Self() (string, error)
	Delegate(root string, log logr.Logger) (string, error)
	// Check fails unless dir is a cgroup v2 directory.
	Check(dir string) error
	// MakeDir creates dir as a cgroup, or reuses it.
	MakeDir(dir string) error
	// RemoveDir removes the cgroup dir; it fails while dir has processes
	// or children.
	RemoveDir(dir string) error
}

func newHome(cfg Config, sys cgroupSys) (*Home, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.Devices = slices.Clone(cfg.Devices)
	h := &Home{
		cfg:   cfg,
		sys:   sys,
		log:   cfg.Logger.WithName("standalone"),
		ready: make(map[string]bool),
	}
	if cfg.Cache != nil {
		h.health = core.NewSourceHealth(cfg.StaleTTL, cfg.Clock)
	} else {
		// No issuer to watch: a health that never goes stale. Only the
		// admin override can make it unhealthy.
		h.health = core.NewSourceHealth(time.Duration(math.MaxInt64), cfg.Clock)
	}
	if cfg.GrantsDir != "" {
		lane, err := home.NewFileLane(home.FileLaneConfig{
			Dir:     cfg.GrantsDir,
			Poll:    cfg.GrantsPoll,
			Clock:   cfg.Clock,
			Logger:  h.log,
			PeekUID: grant.PeekUID,
		})
		if err != nil {
			return nil, fmt.Errorf("standalone home: %w", err)
		}
		h.lane = lane
	}
	root, err := h.settleCgroupRoot(sys)
	if err != nil {
		return nil, err
	}
	h.cgroupRoot = root
	return h, nil
}

// settleCgroupRoot picks the cgroup root as Config.CgroupRoot documents.
func (h *Home) settleCgroupRoot(sys cgroupSys) (string, error) {
	c := h.cfg
	if c.NoCgroups {
		h.log.Info("Running without cgroups, as configured")
		return "", nil
	}
	if c.CgroupRoot != "" {
		if err := sys.Check(c.CgroupRoot); err != nil {
			return "", fmt.Errorf("standalone home: CgroupRoot %q: %w", c.CgroupRoot, err)
		}
		return c.CgroupRoot, nil
	}
	without := func(err error) (string, error) {
		h.log.Info("Running without cgroups: cgroup v2 is missing or not writable here; set -cgroup-root to a writable cgroup v2 directory to carve fibers' cgroups", "reason", err.Error())
		return "", nil
	}
	mount, err := sys.Mount()
	if err != nil {
		return without(err)
	}
	self, err := sys.Self()
	if err != nil {
		return without(err)
	}
	if filepath.Clean(self) == filepath.Clean(mount) {
		// The root cgroup holds every process of the host (and kernel
		// threads, which never move): carve a child of it, move nothing.
		// The root is exempt from the no-internal-processes rule.
		root := filepath.Join(mount, "fiberd")
		if err := sys.MakeDir(root); err != nil {
			return without(err)
		}
		h.log.Info("This process runs in the root cgroup; carving fibers under a child of it", "cgroupRoot", root)
		h.carved = true
		return root, nil
	}
	grants, err := sys.Delegate(self, h.log)
	if err != nil {
		return without(err)
	}
	h.log.Info("Delegated this process's cgroup", "cgroup", self, "cgroupRoot", grants)
	return grants, nil
}

// Name is "standalone".
func (h *Home) Name() string { return Name }

// Grants starts the file lane and returns its channel, closed once ctx
// ends or Close is called. Without GrantsDir it returns a nil channel and
// no error: grants arrive only inside Clone requests. The agent calls it
// once; a second call is an error.
func (h *Home) Grants(ctx context.Context) (<-chan home.GrantEvent, error) {
	if h.lane == nil {
		return nil, nil
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, errors.New("standalone home: Grants after Close")
	}
	ctx, cancel := context.WithCancel(ctx)
	if h.laneCancel != nil {
		h.mu.Unlock()
		cancel()
		return nil, errors.New("standalone home: Grants called twice")
	}
	h.laneCancel = cancel
	h.mu.Unlock()
	ch, err := h.lane.Events(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("standalone home: %w", err)
	}
	return ch, nil
}

// Health is the issuer's liveness: in sync as long as a key refresh
// succeeded within StaleTTL. Without a Cache it never goes stale.
func (h *Home) Health() *core.SourceHealth { return h.health }

// CgroupRoot is the cgroup v2 directory fibers are carved under, settled by
// New; "" when the home runs without cgroups.
func (h *Home) CgroupRoot() string { return h.cgroupRoot }

// Devices is the static device channel of Config.Devices, the same for
// every grant, or no channel without devices. There is nothing to release
// per grant. It never fails.
func (h *Home) Devices(_ context.Context, _ core.Grant) (core.DeviceChannel, func(), error) {
	if len(h.cfg.Devices) == 0 {
		return core.DeviceChannel{}, func() {}, nil
	}
	return core.DeviceChannel{Kind: core.DeviceKindStatic, Devices: slices.Clone(h.cfg.Devices)}, func() {}, nil
}

// PublishReady records whether grant grantUID's template is warm. There is
// nothing outside the process to publish to: the agent's status reads it
// back through Ready. It never fails.
func (h *Home) PublishReady(_ context.Context, grantUID string, ready bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	before := len(h.ready) > 0
	if ready {
		h.ready[grantUID] = true
	} else {
		delete(h.ready, grantUID)
	}
	if now := len(h.ready) > 0; now != before {
		h.log.V(1).Info("Readiness changed", "ready", now, "grant", grantUID)
	}
	return nil
}

// Ready reports whether any grant's template is warm, as published.
func (h *Home) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ready) > 0
}

// Scope is nil: a plain host has no scope to lose.
func (h *Home) Scope() []core.ScopeClaim { return nil }

// OwnGrant is nothing: the standalone home fetches no grant of its own.
func (h *Home) OwnGrant() ([]byte, bool) { return nil, false }

// SelfAdmitUID is "": there is no own grant to self-admit.
func (h *Home) SelfAdmitUID() string { return "" }

// SetIssuerReachable is the test-only override behind the agent's admin
// socket. false marks the issuer unreachable now and keeps it so, whatever
// the refreshes; true resumes, counting as a sync now.
func (h *Home) SetIssuerReachable(reachable bool) {
	if reachable {
		h.health.Resume()
		h.log.Info("Issuer override lifted")
		return
	}
	h.health.MarkUnreachable()
	h.log.Info("Issuer marked unreachable by the admin override")
}

// Run refreshes the issuer's keys at once and then every RefreshInterval
// until ctx ends, marking the health in sync after each success; a failure
// is logged when a streak of failures starts and when it ends. Without a
// Cache it only waits for ctx. It returns once its loop has stopped. A
// second Run logs and returns at once.
func (h *Home) Run(ctx context.Context) {
	h.mu.Lock()
	if h.running {
		h.mu.Unlock()
		h.log.Info("Run called twice; ignoring the second call")
		return
	}
	h.running = true
	h.mu.Unlock()

	if h.cfg.Cache == nil {
		<-ctx.Done()
		return
	}
	ticker := h.cfg.Clock.NewTicker(h.cfg.RefreshInterval)
	defer ticker.Stop()
	failing := false
	for {
		err := h.cfg.Cache.Refresh(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			h.health.MarkSync()
			if failing {
				h.log.Info("Issuer keys refreshed again", "issuer", h.cfg.Cache.Issuer())
				failing = false
			}
		case !failing:
			h.log.Error(err, "Cannot refresh the issuer's keys; the home turns unhealthy if this lasts", "issuer", h.cfg.Cache.Issuer(), "staleTTL", h.cfg.StaleTTL)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// Close stops the file lane, if Grants started it, and waits for its
// goroutine. It is idempotent. Run's context ends Run; Close does not wait
// for it.
func (h *Home) Close() {
	h.mu.Lock()
	h.closed = true
	cancel := h.laneCancel
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if h.lane != nil {
		h.lane.Wait()
	}
	if h.carved {
		// The agent has removed its grants' cgroups by now. Another fiberd
		// on this host may still carve under the same child of the root
		// cgroup, and then the removal fails harmlessly: it is not empty.
		if err := h.sys.RemoveDir(h.cgroupRoot); err == nil {
			h.log.V(1).Info("Removed the cgroup this home carved", "cgroupRoot", h.cgroupRoot)
		}
	}
}

// hostCgroups is cgroupSys on this host, through pkg/cgroup.
type hostCgroups struct{}

func (hostCgroups) Mount() (string, error) { return cgroup.Mount() }
func (hostCgroups) Self() (string, error)  { return cgroup.Self() }
func (hostCgroups) Delegate(root string, log logr.Logger) (string, error) {
	return cgroup.Delegate(root, log)
}

func (hostCgroups) Check(dir string) error { return cgroup.Check(dir) }

func (hostCgroups) RemoveDir(dir string) error { return os.Remove(dir) }

func (h hostCgroups) MakeDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return h.Check(dir)
}
