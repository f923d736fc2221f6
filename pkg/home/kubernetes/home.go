package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
)

var _ home.Home = (*Home)(nil)

// Home is the Kubernetes home. It implements home.Home, and the optional
// fiberd.ScopeLoser, fiberd.EndpointHoster and the issuer override behind
// the admin socket.
type Home struct {
	cfg        Config
	kube       Kube
	clk        clock.WithTicker
	log        logr.Logger
	health     *core.SourceHealth
	cgroupRoot string
	fetch      *fetcher       // nil: no grant fetch
	lane       *home.FileLane // nil: no GrantsDir

	// waitCtx ends the EndpointHost wait; Close and the end of Run's
	// context cancel it.
	waitCtx    context.Context
	cancelWait context.CancelFunc
	closeOnce  sync.Once

	// markMu orders the health marks: a round checks paused and marks the
	// health under it, and SetIssuerReachable pauses and marks under it,
	// so no round marks after the override.
	markMu sync.Mutex
	paused bool

	// patching is held, by sending into it, across a patch of the Pod
	// condition, so the last patch sent carries the last state. It is a
	// channel, not a mutex, so a wait for it ends with the waiter's
	// context: PublishReady waits at most Poll, and a poll round never
	// waits (it repairs the condition in a later round instead).
	patching chan struct{}

	mu        sync.Mutex
	running   bool
	pod       *corev1.Pod     // last Pod stored, nil before the first
	warm      map[string]bool // grants whose template is warm
	ownGrant  []byte
	ownClaims tokenClaims
	onLost    func(ctx context.Context, reason string)
	lost      map[string]bool // reasons already queued
	pending   []string        // reasons not yet delivered
	// claimsUnservedSince is the time of the round from which the live
	// Pod's claims have not all been served; zero while they are (see
	// checkClaims). lastPodRound is the time of the last round that read
	// the live Pod.
	claimsUnservedSince time.Time
	lastPodRound        time.Time
	failing             map[string]bool // what is failing, to log changes only
	keysFailing         bool            // the last key refresh failed
	lostSignal          chan struct{}
}

// New builds the home. It reads nothing from the cluster. The first read
// happens in EndpointHost, Devices or the first poll round. The health
// starts in sync, so a Pod the API server has not answered for yet is not
// unhealthy before the stale TTL has passed.
//
// With a grant token file, New fetches the Pod's grant before it returns,
// retrying for up to GrantFetchTimeout. It fails when no grant came by
// then, unless the grants directory holds an unexpired grant file for the
// Pod. Run renews the grant from there.
//
// ctx bounds New's own work, which is the first grant fetch. When ctx ends
// first, New closes the home and returns ctx's cause. ctx is not the home's
// lifetime. Run's context and Close end the home once New has returned it.
//
// New also readies the cgroup subtree (see Config.CgroupRoot); when an
// empty CgroupRoot finds no cgroup to delegate, it logs why once and the
// home runs without per-fiber cgroups. It fails on an invalid Config, with
// Validate's error.
func New(ctx context.Context, cfg Config) (*Home, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cfg.Devices = slices.Clone(cfg.Devices)
	root, err := resolveCgroupRoot(cfg.CgroupRoot, cgroup.Self, cgroup.Delegate, cfg.Logger)
	if err != nil {
		return nil, err
	}
	h := &Home{
		cfg:        cfg,
		kube:       cfg.Kube,
		clk:        cfg.Clock,
		log:        cfg.Logger,
		health:     core.NewSourceHealth(cfg.StaleTTL, cfg.Clock),
		cgroupRoot: root,
		warm:       map[string]bool{},
		lost:       map[string]bool{},
		failing:    map[string]bool{},
		lostSignal: make(chan struct{}, 1),
		patching:   make(chan struct{}, 1),
	}
	h.waitCtx, h.cancelWait = context.WithCancel(context.Background())
	if cfg.GrantsDir != "" {
		h.lane, err = home.NewFileLane(home.FileLaneConfig{
			Dir:     cfg.GrantsDir,
			Poll:    cfg.GrantsPoll,
			Clock:   cfg.Clock,
			Logger:  cfg.Logger.WithName("lane"),
			PeekUID: grant.PeekUID,
		})
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("kubernetes home: GrantsDir %s: %w", cfg.GrantsDir, err)
		}
	}
	if cfg.fetchOn() {
		if h.fetch, err = newFetcher(cfg); err != nil {
			h.Close()
			return nil, err
		}
		if err := h.firstFetch(ctx); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// resolveCgroupRoot is Config.CgroupRoot when set, and otherwise the
// grants directory of this process's own cgroup, delegated; "" (no
// per-fiber cgroups, logged once) when there is none to delegate.
func resolveCgroupRoot(root string, self func() (string, error), delegate func(string, logr.Logger) (string, error), log logr.Logger) (string, error) {
	if root != "" {
		return root, nil
	}
	without := func(err error) (string, error) {
		log.Info("Running without per-fiber cgroups: this container has no delegated, writable cgroup v2; fibers share the container's cgroup. For per-fiber cgroups give it one (cgroup v2, its own cgroup namespace, /sys/fs/cgroup writable by fiberd's user) or set -cgroup-root",
			"reason", err.Error())
		return "", nil
	}
	own, err := self()
	if err != nil {
		return without(fmt.Errorf("finding this process's cgroup: %w", err))
	}
	grants, err := delegate(own, log)
	if err != nil {
		return without(fmt.Errorf("delegating the cgroup %s: %w", own, err))
	}
	log.Info("Delegated this process's cgroup", "cgroup", own, "grants", grants)
	return grants, nil
}

// firstFetch is New's grant fetch: retried until GrantFetchTimeout, with
// an unexpired grant file of the Pod as the fallback. The deadline is on
// the clock, and it ends an attempt in flight as well as a wait between
// attempts.
func (h *Home) firstFetch(ctx context.Context) error {
	deadline := h.clk.Now().Add(h.cfg.GrantFetchTimeout)
	fctx, cancel := onClock(ctx, h.clk, h.cfg.GrantFetchTimeout,
		fmt.Errorf("GrantFetchTimeout %v passed: %w", h.cfg.GrantFetchTimeout, context.DeadlineExceeded))
	token, claims, err := h.fetch.fetchUntil(fctx, h.clk, h.log, deadline, nil)
	cancel()
	if err == nil {
		h.setOwnGrant(token, claims)
		h.log.Info("Fetched this Pod's grant", "path", h.fetch.path, "expiry", claims.Expiry, "renewAt", claims.RenewAt())
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	b, c, ferr := h.grantFile()
	if ferr == nil {
		h.setOwnGrant(b, c)
		h.log.Error(err, "No grant fetched in time; using the unexpired grant file", "path", h.fetch.path, "expiry", c.Expiry)
		return nil
	}
	h.log.Error(ferr, "No grant fetched in time, and the grant file cannot stand in", "path", h.fetch.path)
	return fmt.Errorf("kubernetes home: Pod %s/%s: no grant from %s within %v (%w), and %w: check that the controller serves this Pod's grant and accepts its service-account token, or raise GrantFetchTimeout",
		h.cfg.PodNamespace, h.cfg.PodName, h.fetch.url, h.cfg.GrantFetchTimeout, err, ferr)
}

// grantFile reads the grant file the fetch writes, GrantsDir/<PodUID>.jwt,
// and returns its token when it is this Pod's grant and unexpired. The
// error names the file and why it cannot stand in for a fetch.
func (h *Home) grantFile() ([]byte, tokenClaims, error) {
	b, err := core.ReadFileBounded(h.fetch.path, maxTokenSize)
	if err != nil {
		return nil, tokenClaims{}, fmt.Errorf("grant file %s: %w", h.fetch.path, err)
	}
	b = bytes.TrimSpace(b)
	c, err := grant.PeekLease(b)
	switch {
	case err != nil:
		return nil, tokenClaims{}, fmt.Errorf("grant file %s: %w", h.fetch.path, err)
	case c.UID != h.cfg.PodUID:
		return nil, tokenClaims{}, fmt.Errorf("grant file %s holds grant %s, not this Pod's %s", h.fetch.path, c.UID, h.cfg.PodUID)
	case !h.clk.Now().Before(c.Expiry):
		return nil, tokenClaims{}, fmt.Errorf("grant file %s holds a grant expired at %v", h.fetch.path, c.Expiry)
	}
	return b, c, nil
}

func (h *Home) setOwnGrant(token []byte, c tokenClaims) {
	if c.UID != h.cfg.PodUID {
		h.log.Info("The Pod's grant carries another UID than the Pod's; it is admitted on the Pod UID only if the agent accepts it", "jti", c.UID, "podUID", h.cfg.PodUID)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ownGrant = slices.Clone(token)
	h.ownClaims = c
}

// Name is "kubernetes", the constant Name this home is selected by.
func (h *Home) Name() string { return Name }

// Health is the API server's liveness for this Pod. Each poll round that
// reads the Pod marks a sync, and the health goes stale after StaleTTL
// without one. SetIssuerReachable overrides it.
func (h *Home) Health() *core.SourceHealth { return h.health }

// CgroupRoot is the cgroup v2 directory fibers are carved under:
// Config.CgroupRoot when set, otherwise the `grants` child of this
// process's delegated cgroup, which New prepared; "" when there was none
// to delegate (no per-fiber cgroups).
func (h *Home) CgroupRoot() string { return h.cgroupRoot }

// Grants polls the projected directory. A new or changed *.jwt file is
// GrantAdded, a removed one GrantRemoved.
//
// The directory is GrantsDir, read every GrantsPoll; the grant fetch
// writes there too. Without GrantsDir, Grants returns a nil channel and a
// nil error: grants arrive only inside Clone requests. The channel closes
// when ctx ends. Grants may be called once.
func (h *Home) Grants(ctx context.Context) (<-chan home.GrantEvent, error) {
	if h.lane == nil {
		return nil, nil
	}
	ch, err := h.lane.Events(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubernetes home: grants directory %s: %w", h.cfg.GrantsDir, err)
	}
	return ch, nil
}

// OwnGrant is the Pod's own grant, the file the grant fetch wrote. Clone
// admits it on the Pod UID in place of the token presented. A home without
// a grant fetch holds none.
func (h *Home) OwnGrant() ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ownGrant == nil {
		return nil, false
	}
	return slices.Clone(h.ownGrant), true
}

// SelfAdmitUID is the Pod UID, since the controller issues this Pod's grant
// under it and a token for an earlier Pod of the same name must not
// self-admit here.
func (h *Home) SelfAdmitUID() string { return h.cfg.PodUID }

// OnScopeLost sets what is called, once per reason and on a goroutine of
// the home's own, when the Pod's scope goes away under it. fiberd wires its
// epoch bump.
//
// The goroutine is Run's, and fn gets Run's context; the next reason waits
// for fn to return. A reason that comes while no fn is set is only logged.
func (h *Home) OnScopeLost(fn func(ctx context.Context, reason string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onLost = fn
}

// Run drives the liveness poll, the delivery of scope losses, the key cache
// refresh and the grant renewal until ctx ends. It returns only once all of
// them have stopped. A second Run logs and returns at once, as a shared
// informer does.
//
// The first poll round runs at once, then one every Poll; a round waits
// for nothing longer than Poll. The key cache is refreshed on a loop of its
// own, when grant.Cache.RefreshIn says the keys are due: at once when they
// never loaded, then at half the cache's MaxStale after each load, and once
// per its MinRefreshInterval while refreshes fail; an outage is logged when
// it starts and when it ends. The end of ctx also cuts short a wait in
// EndpointHost.
func (h *Home) Run(ctx context.Context) {
	h.mu.Lock()
	if h.running {
		h.mu.Unlock()
		h.log.Info("Run called again; ignored, the home is already run")
		return
	}
	h.running = true
	h.mu.Unlock()

	// The end of ctx cuts an EndpointHost wait short at once, not only
	// once everything below has stopped.
	context.AfterFunc(ctx, h.cancelWait)
	var wg sync.WaitGroup
	wg.Go(func() { h.pollLoop(ctx) })
	wg.Go(func() { h.deliverLoop(ctx) })
	if h.cfg.Cache != nil {
		wg.Go(func() { h.keyLoop(ctx) })
	}
	if h.fetch != nil {
		wg.Go(func() { h.renewLoop(ctx) })
	}
	wg.Wait()
	h.cancelWait()
	if h.fetch != nil {
		h.fetch.transport.CloseIdleConnections()
	}
}

// Close ends what New started, the wait for the Pod's address in
// EndpointHost. Run's context ends everything else.
//
// Close is idempotent, and it waits on nothing it does not end: not on Run,
// and not on the grants directory's poll, which the context given to
// Grants ends (its channel closes as the poll's last act). So Close may run
// before or after those contexts end.
func (h *Home) Close() {
	h.closeOnce.Do(func() {
		h.cancelWait()
		if h.fetch != nil {
			h.fetch.transport.CloseIdleConnections()
		}
	})
}

// SetIssuerReachable is the test-only override behind fiberd's admin
// socket. false marks the API server unreachable now and keeps it so. true
// resumes the polls and marks it reachable. The pause comes first, and it
// waits for a round marking the health, so the mark here is the last one.
//
// While paused, poll rounds and key refreshes are skipped: no Pod read, no
// scope check, no key cache refresh. Resuming also restarts the count of
// how long the claims have been unreadable.
func (h *Home) SetIssuerReachable(reachable bool) {
	h.markMu.Lock()
	defer h.markMu.Unlock()
	if !reachable {
		h.paused = true
		h.health.MarkUnreachable()
		h.log.Info("API server marked unreachable by the override; polls paused")
		return
	}
	h.paused = false
	h.health.Resume()
	h.mu.Lock()
	h.claimsUnservedSince = time.Time{}
	h.mu.Unlock()
	h.log.Info("API server marked reachable by the override; polls resumed")
}

func (h *Home) isPaused() bool {
	h.markMu.Lock()
	defer h.markMu.Unlock()
	return h.paused
}

// markSync records that the API server answered for the Pod, unless the
// override paused the polls meanwhile.
func (h *Home) markSync() {
	h.markMu.Lock()
	defer h.markMu.Unlock()
	if !h.paused {
		h.health.MarkSync()
	}
}

// Scope is the facts the Pod is made of. Before the first Pod is stored it
// holds what the configuration knows, the namespace, the Pod name and its
// UID. A stored Pod adds the service account, the node and one claim per
// ResourceClaim.
//
// The claims are named namespace, pod, pod_uid, service_account, node and
// resource_claim; empty facts are left out.
func (h *Home) Scope() []core.ScopeClaim {
	s := []core.ScopeClaim{
		{Name: "namespace", Value: h.cfg.PodNamespace},
		{Name: "pod", Value: h.cfg.PodName},
		{Name: "pod_uid", Value: h.cfg.PodUID},
	}
	pod := h.storedPod()
	if pod == nil {
		return s
	}
	if pod.Spec.ServiceAccountName != "" {
		s = append(s, core.ScopeClaim{Name: "service_account", Value: pod.Spec.ServiceAccountName})
	}
	if pod.Spec.NodeName != "" {
		s = append(s, core.ScopeClaim{Name: "node", Value: pod.Spec.NodeName})
	}
	for _, c := range podClaims(pod) {
		s = append(s, core.ScopeClaim{Name: "resource_claim", Value: c})
	}
	return s
}

// Devices is the Pod's ResourceClaim with the devices the driver exposed,
// a static set when the Pod has devices but no claim, and nothing
// otherwise. The claim is the Pod's, so there is nothing to release per
// grant. The Pod is read first when it has not been yet. A failed read
// never fails the admission, since fiberd does not retry one until the
// grant changes. The answer is then the static set, or no channel without
// devices.
//
// The devices are Config.Devices; the release function does nothing, and
// the error is always nil.
func (h *Home) Devices(ctx context.Context, _ core.Grant) (core.DeviceChannel, func(), error) {
	release := func() {}
	pod := h.storedPod()
	if pod == nil {
		p, err := h.readPod(ctx)
		if err != nil {
			h.log.Error(err, "Reading the Pod for its ResourceClaims failed; handing the static devices", "devices", len(h.cfg.Devices))
		}
		pod = p
	}
	var claims []string
	if pod != nil {
		claims = podClaims(pod)
	}
	switch {
	case len(claims) > 0:
		return core.DeviceChannel{Kind: core.DeviceKindDRA, Devices: slices.Clone(h.cfg.Devices), Claims: claims}, release, nil
	case len(h.cfg.Devices) > 0:
		return core.DeviceChannel{Kind: core.DeviceKindStatic, Devices: slices.Clone(h.cfg.Devices)}, release, nil
	}
	return core.DeviceChannel{}, release, nil
}

// errReplaced is a Pod read with another UID than the configured one.
var errReplaced = errors.New("the Pod was replaced (another UID)")

// readPod reads the Pod and stores it when it is this Pod. The read is
// bounded by Poll, like every request to the API server.
func (h *Home) readPod(ctx context.Context) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Poll)
	defer cancel()
	pod, err := h.kube.GetPod(ctx, h.cfg.PodNamespace, h.cfg.PodName)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", h.cfg.PodNamespace, h.cfg.PodName, err)
	}
	if string(pod.UID) != h.cfg.PodUID {
		return nil, fmt.Errorf("pod %s/%s: UID %s, want %s: %w", h.cfg.PodNamespace, h.cfg.PodName, pod.UID, h.cfg.PodUID, errReplaced)
	}
	h.storePod(pod)
	return pod, nil
}

func (h *Home) storedPod() *corev1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pod
}

func (h *Home) storePod(p *corev1.Pod) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pod = p
}

// podClaims names the ResourceClaims the Pod uses, in the order of
// spec.resourceClaims: a claim named there directly, or the one generated
// from a template, which status.resourceClaimStatuses names. Status entries
// without a spec entry follow.
func podClaims(p *corev1.Pod) []string {
	generated := map[string]string{}
	var order []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil && *s.ResourceClaimName != "" {
			generated[s.Name] = *s.ResourceClaimName
			order = append(order, s.Name)
		}
	}
	var names []string
	seen := map[string]bool{}
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	inSpec := map[string]bool{}
	for _, c := range p.Spec.ResourceClaims {
		inSpec[c.Name] = true
		if c.ResourceClaimName != nil {
			add(*c.ResourceClaimName)
		} else {
			add(generated[c.Name])
		}
	}
	for _, n := range order {
		if !inSpec[n] {
			add(generated[n])
		}
	}
	return names
}
