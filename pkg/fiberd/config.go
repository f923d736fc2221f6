package fiberd

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
)

// Defaults of Config. cmd/fiberd uses DefaultListen as the default of its
// -listen flag; Config itself reads an empty Listen as "no TCP listener".
const (
	// DefaultListen is the TCP address of the API cmd/fiberd listens on
	// unless -listen says otherwise.
	DefaultListen = "127.0.0.1:8484"
	// DefaultThrashRate is how many Clones per second each caller's
	// thrash budget admits in the long run.
	DefaultThrashRate = 200
	// DefaultThrashBurst is how many Clones each caller's thrash budget
	// admits at once.
	DefaultThrashBurst = 200
	// DefaultFiberPidsMax is each fiber leaf's pids.max unless
	// -fiber-pids-max says otherwise: room for a build's parallel jobs and
	// an interpreter's threads, and a fork bomb's end.
	DefaultFiberPidsMax = 4096
	// DefaultGrantCPUWeight is each grant cgroup's cpu.weight, the
	// kernel's own default: every grant weighs the same.
	DefaultGrantCPUWeight = 100
	// DefaultPressureThreshold is the memory pressure (PSI "some avg10", in
	// percent) above which cmd/fiberd's -pressure-threshold sheds a
	// grant's Clones unless the flag says otherwise: the grant's tasks
	// stalled on memory for more than 6 of the last 10 seconds, deep in
	// reclaim, where another fiber would only deepen it. Config itself
	// reads a zero PressureThreshold as "off".
	DefaultPressureThreshold = 60
	// DefaultRetryAfter is the back-off a SHED asks for when the miss
	// names none.
	DefaultRetryAfter = time.Second
	// DefaultCloneDeadline bounds a Clone whose request names no deadline.
	DefaultCloneDeadline = 10 * time.Second
	// DefaultResyncInterval is how often every grant is reconciled again
	// when no event asked for it.
	DefaultResyncInterval = 5 * time.Second
	// DefaultPortRange is the TCP port range fibers of the inet families
	// listen on.
	DefaultPortRange = "20000-20999"
	// DefaultDenyFor is how long a revocation lasts at least.
	DefaultDenyFor = 24 * time.Hour
	// DefaultBudgetInterval is how often the W budget of fibers whose
	// leaf does not enforce it is measured.
	DefaultBudgetInterval = time.Second
)

// Config is what cmd/fiberd (or a test) hands New. Every field documents its
// default; withDefaults applies them without I/O, and Validate names the
// first field that is wrong and how to fix it.
type Config struct {
	// Home is where the agent runs, already built by the caller. Required.
	// The agent calls Grants, Run and, when it stops, Close: it owns the
	// home once New got past Validate, and closes it also when New fails
	// after that. When Validate refuses the Config, New leaves the home
	// (and Warm and Basic) to the caller.
	Home home.Home

	// Issuer is the issuer URL grant tokens must carry in iss. Required.
	// Every miss body names it.
	Issuer string
	// NodeID is this home's node id, the aud every grant token must carry
	// (in Kubernetes the Pod name). Required.
	NodeID string
	// Keys finds the issuer's public keys: a *grant.Cache (keys found by
	// OIDC discovery, refreshed by the home) or a *grant.StaticKeys (a
	// local JWKS, -issuer-keys). Required.
	Keys grant.KeySource
	// MaxLease, when positive, refuses tokens whose lease is longer. Zero
	// (the default) accepts any lease.
	MaxLease time.Duration
	// ClockSkew is how far the issuer's clock may run ahead of this home's
	// (-clock-skew): a token whose iat is more than ClockSkew in the future
	// is refused (401), as is one whose nbf is more than ClockSkew away.
	// Default grant.DefaultLeeway (one minute).
	ClockSkew time.Duration

	// Templates is the directory of template specs (-templates), one
	// <name>.json per template. Required.
	Templates string
	// Warm is the proc backend, serving tier WARM from a zygote per grant.
	// The agent owns Warm and Basic as it owns Home: it stops their grants
	// and closes them when Run ends (or New fails after Validate). Nil means no WARM tier: every grant is served by Basic, and a grant
	// whose MinTier is WARM or above is refused with a tier gap.
	Warm backend.Backend
	// Basic is the exec backend, serving tier BASIC by fork+exec. Nil means
	// no BASIC tier. At least one of Warm and Basic is required. A grant is
	// served by Warm when its template spec says "zygote": true and Warm is
	// set, else by Basic; a grant whose MinTier the chosen backend cannot
	// reach is refused with a tier gap (412).
	Basic backend.Backend

	// StateDir is the agent's state directory (-state). Required, absolute.
	// The agent creates StateDir/private with mode 0700 and keeps there
	// the epoch file (private/epoch), the revocations (private/denied.json)
	// and the admin socket (private/admin.sock).
	StateDir string
	// RunDir is where fibers' unix sockets are bound (-run-dir), created
	// 0700. Default StateDir/run.
	RunDir string

	// Listen is the TCP address of the API (-listen). Empty (the zero
	// value) means no TCP listener; cmd/fiberd defaults its flag to
	// DefaultListen. A TCP listener needs TLSCert, TLSKey and ClientCA,
	// or InsecurePlaintext.
	Listen string
	// Socket is the path of the API's unix socket (-socket), mode 0600 in
	// a directory the agent creates 0700 when missing. Default
	// StateDir/fiberd.sock. "-" means no unix socket. Callers on the
	// socket count as authenticated: its file mode is the protection.
	Socket string
	// TLSCert and TLSKey are the PEM files of the TCP listener's server
	// certificate, and ClientCA the PEM bundle client certificates must
	// chain to. All three or none. With them the listener speaks TLS 1.3
	// only and requires a verified client certificate.
	TLSCert  string
	TLSKey   string
	ClientCA string
	// InsecurePlaintext lets the TCP listener serve plain HTTP when no TLS
	// files are given (-insecure-plaintext). Callers over it are not
	// authenticated: they cannot self-admit the home's own grant. Without
	// InsecureAllowNonLoopback the address must be a loopback IP or
	// "localhost". Default false: New refuses a TCP listener without TLS.
	InsecurePlaintext bool
	// InsecureAllowNonLoopback lets a plaintext listener bind a
	// non-loopback address, which the operator must name explicitly in
	// Listen (a wildcard host such as ":8484" or "0.0.0.0:8484" counts as
	// non-loopback). Meaningful only with InsecurePlaintext. Default false.
	InsecureAllowNonLoopback bool

	// EndpointFamily is the family fibers are reached at (-endpoint-family).
	// Default endpoint.Unix: a socket under RunDir.
	EndpointFamily endpoint.Family
	// EndpointHost is the IP fibers of the inet families listen on and
	// advertise (-endpoint-host), used when the home is no EndpointHoster
	// or answers "". Default the family's loopback.
	EndpointHost string
	// PortRange is the TCP ports fibers of the inet families listen on
	// (-port-range). Default DefaultPortRange.
	PortRange endpoint.PortRange

	// ThrashRate is the Clones per second a caller's thrash budget admits
	// in the long run; a Clone over its caller's budget is SHED. Each
	// caller has a budget of its own, ThrashRate and ThrashBurst each (the
	// one budget of the whole node before): a Clone carrying a token that
	// verifies spends its grant's; any other, its connection's: the unix
	// socket peer's uid, the TLS client certificate, or the plaintext
	// listener's remote address (an IPv6 one by its /64). So a Clone
	// naming a grant that does not exist costs its caller only. The agent
	// remembers the budgets of the 4096 callers that cloned most recently;
	// one forgotten comes back to a full budget. Default DefaultThrashRate.
	ThrashRate float64
	// ThrashBurst is the Clones a caller's thrash budget admits at once.
	// Default DefaultThrashBurst.
	ThrashBurst int
	// PressureThreshold is the memory pressure, in percent (0 to 100), above
	// which a Clone of a grant is SHED whatever the lane's health: the
	// "some avg10" of memory.pressure in the grant's cgroup, the share of
	// the last 10 seconds in which at least one of its tasks was stalled
	// waiting for memory. A Clone is never shed for pressure when the
	// home has no cgroup root, when the kernel offers no memory.pressure
	// (logged once), or when the file cannot be read (logged); CPU
	// pressure never sheds. One reading per grant is reused for a second
	// on Clock, so a burst costs one read. Zero (the default) turns the
	// check off; cmd/fiberd defaults its -pressure-threshold flag to
	// DefaultPressureThreshold. Validate refuses a value outside [0, 100].
	PressureThreshold float64
	// RetryAfter is the Retry-After of a SHED that names no back-off of its
	// own. Default DefaultRetryAfter. Sent in whole seconds, at least 1.
	RetryAfter time.Duration
	// CloneDeadline bounds a Clone whose request names no deadlineMs, and
	// caps one that names a longer one. Default DefaultCloneDeadline.
	CloneDeadline time.Duration
	// ResyncInterval is how often every grant's state is checked again, a
	// safety net beside the events that drive it (a lease's end, a zygote's
	// death, a lane delivery), and how often watchers are woken to see the
	// lane's health. Default DefaultResyncInterval.
	ResyncInterval time.Duration
	// DenyFor is how long a grant its lane removed stays revoked at least:
	// a Clone presenting one of its tokens is refused until the lane
	// delivers it again, or until the later of DenyFor after the removal
	// and the end of the latest lease of it the agent saw. Revocations are
	// kept in StateDir/private/denied.json and outlive a restart. Default
	// DefaultDenyFor.
	DenyFor time.Duration
	// BudgetInterval is how often the agent measures the private memory of
	// each fiber of a grant with a W budget (wBudget) that no memory.max
	// enforces, and ends those over it. Default DefaultBudgetInterval.
	BudgetInterval time.Duration

	// Clock reads the time, drives the lease and revocation timers and the
	// resync, and times Clone deadlines.
	// Default the real clock.
	Clock clock.WithTickerAndDelayedExecution
	// Logger receives the agent's log lines. Default klog.Background().
	Logger logr.Logger
	// Registry is where the agent registers its metrics, and what GET
	// /metrics serves. Default a new registry of the agent's own (never
	// the global one).
	Registry *prometheus.Registry

	// Limits bound what one client may cost the API and admin listeners:
	// timeouts, a cap on open connections, the shares of that cap of
	// connections that have not authenticated, and each caller's watch
	// streams. Each zero field takes its default (see Limits).
	Limits Limits

	// Park configures parking fibers (the CHECKPOINT tier, which the Warm
	// backend offers when it is a backend.Checkpointer whose CRIU works):
	// the bounds of each grant's parked images, a park's time, and parking
	// under memory pressure (off by default). Each zero field takes its
	// default (see ParkLimits).
	Park ParkLimits
	// MinIsolation is the least isolation a grant may run with
	// (-min-isolation): a grant whose backend gives less on this host
	// (Backend.Isolation), or whose template allows less ("isolation":
	// "shared" under backend.IsolationFiber), is refused with a tier gap
	// (412 TIER_GAP) and never served less isolated. Default
	// backend.IsolationNone: any. Validate refuses a value that is not a
	// level.
	MinIsolation backend.Isolation
	// FiberPidsMax is each fiber leaf's pids.max (-fiber-pids-max), where
	// the grant's cgroup has the pids controller: the processes and threads
	// one fiber may have at once, so a fork bomb ends at it. Default
	// DefaultFiberPidsMax; negative means none.
	FiberPidsMax int64
	// GrantCPUWeight is each grant cgroup's cpu.weight (-grant-cpu-weight,
	// 1 to 10000), where the cgroup root has the cpu controller: grants
	// share the CPU in proportion to it, however many fibers each runs.
	// Default DefaultGrantCPUWeight, the same for every grant.
	GrantCPUWeight int

	// AdminUnsafe enables the admin socket's test-only routes POST /issuer
	// and POST /scope-lost (-admin-unsafe). Validate refuses it unless the
	// binary was built with the testhooks tag (see TestHooks). Default
	// false: the routes answer 403 (and without the tag do not exist).
	AdminUnsafe bool
}

// withDefaults returns c with its zero fields defaulted. It does no I/O.
func (c Config) withDefaults() Config {
	if c.RunDir == "" && c.StateDir != "" {
		c.RunDir = filepath.Join(c.StateDir, "run")
	}
	if c.Socket == "" && c.StateDir != "" {
		c.Socket = filepath.Join(c.StateDir, "fiberd.sock")
	}
	if c.PortRange == (endpoint.PortRange{}) {
		c.PortRange, _ = endpoint.ParsePortRange(DefaultPortRange)
	}
	c.ThrashRate = cmp.Or(c.ThrashRate, DefaultThrashRate)
	c.FiberPidsMax = cmp.Or(c.FiberPidsMax, DefaultFiberPidsMax)
	c.GrantCPUWeight = cmp.Or(c.GrantCPUWeight, DefaultGrantCPUWeight)
	c.ThrashBurst = cmp.Or(c.ThrashBurst, DefaultThrashBurst)
	c.RetryAfter = cmp.Or(c.RetryAfter, DefaultRetryAfter)
	c.CloneDeadline = cmp.Or(c.CloneDeadline, DefaultCloneDeadline)
	c.ResyncInterval = cmp.Or(c.ResyncInterval, DefaultResyncInterval)
	c.DenyFor = cmp.Or(c.DenyFor, DefaultDenyFor)
	c.BudgetInterval = cmp.Or(c.BudgetInterval, DefaultBudgetInterval)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	c.ClockSkew = cmp.Or(c.ClockSkew, grant.DefaultLeeway)
	c.Limits = c.Limits.withDefaults()
	c.Park = c.Park.withDefaults()
	return c
}

// Validate reports the first field of c that is missing or wrong, after
// defaults, and how to fix it: the parts (Home, Keys, Warm and Basic),
// then ValidateSettings. The error wraps core.ErrInvalid. It does no I/O:
// files named by the TLS fields are read by New.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("fiberd config: "+format+": %w", append(args, core.ErrInvalid)...)
	}
	switch {
	case c.Home == nil:
		return bad("Home is nil: build a home (standalone or kubernetes) and pass it")
	case c.Keys == nil:
		return bad("Keys is nil: pass a *grant.Cache or a *grant.StaticKeys (-issuer-keys)")
	case c.Warm == nil && c.Basic == nil:
		return bad("Warm and Basic are both nil: pass the proc and/or the exec backend")
	}
	return c.ValidateSettings()
}

// ValidateSettings is Validate without the parts a caller builds (Home,
// Keys, Warm, Basic): cmd/fiberd calls it on the Config its flags make
// before it builds any of them, so a bad flag touches nothing. Each
// message names the flag that sets the field. The error wraps
// core.ErrInvalid.
func (c Config) ValidateSettings() error {
	c = c.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("fiberd config: "+format+": %w", append(args, core.ErrInvalid)...)
	}
	switch {
	case c.Issuer == "":
		return bad("Issuer is empty: set -issuer to the issuer URL grant tokens carry in iss")
	case c.NodeID == "":
		return bad("NodeID is empty: set -node-id to this home's node id (the aud of its grants)")
	case c.MaxLease < 0:
		return bad("MaxLease %v is negative: set -max-lease to a duration, or 0 for no limit", c.MaxLease)
	case c.ClockSkew < 0:
		return bad("ClockSkew %v is negative: set -clock-skew to a positive duration, or 0 for the default %v", c.ClockSkew, grant.DefaultLeeway)
	case c.Templates == "":
		return bad("Templates is empty: set -templates to the directory of template specs")
	case !filepath.IsAbs(c.Templates):
		return bad("Templates %q is not an absolute path: set -templates to one", c.Templates)
	case c.StateDir == "" || !filepath.IsAbs(c.StateDir):
		return bad("StateDir %q is not an absolute path: set -state", c.StateDir)
	case !filepath.IsAbs(c.RunDir):
		return bad("RunDir %q is not an absolute path: set -run-dir", c.RunDir)
	case c.Socket != "-" && !filepath.IsAbs(c.Socket):
		return bad("Socket %q is not an absolute path: set -socket to one, or \"-\" for none", c.Socket)
	case !(c.ThrashRate >= 0) || math.IsInf(c.ThrashRate, 0):
		return bad("ThrashRate %v is not a rate: set -thrash-rate to Clones per second, or 0 for the default %d/s", c.ThrashRate, DefaultThrashRate)
	case c.ThrashBurst < 0:
		return bad("ThrashBurst %d is negative: set -thrash-burst to a count, or 0 for the default %d", c.ThrashBurst, DefaultThrashBurst)
	case !(c.PressureThreshold >= 0 && c.PressureThreshold <= 100):
		return bad("PressureThreshold %v is not a percentage from 0 to 100: set -pressure-threshold to one, or 0 to turn pressure shedding off", c.PressureThreshold)
	case c.RetryAfter < 0:
		return bad("RetryAfter %v is negative: use 0 for the default %v", c.RetryAfter, DefaultRetryAfter)
	case c.CloneDeadline < 0:
		return bad("CloneDeadline %v is negative: use 0 for the default %v", c.CloneDeadline, DefaultCloneDeadline)
	case c.ResyncInterval < 0:
		return bad("ResyncInterval %v is negative: use 0 for the default %v", c.ResyncInterval, DefaultResyncInterval)
	case c.DenyFor < 0:
		return bad("DenyFor %v is negative: use 0 for the default %v", c.DenyFor, DefaultDenyFor)
	case c.BudgetInterval < 0:
		return bad("BudgetInterval %v is negative: use 0 for the default %v", c.BudgetInterval, DefaultBudgetInterval)
	case c.MinIsolation != "" && !validIsolation(c.MinIsolation):
		return bad("MinIsolation %q is not an isolation level: set -min-isolation to none, grant or fiber", string(c.MinIsolation))
	case c.GrantCPUWeight < 1 || c.GrantCPUWeight > 10000:
		return bad("GrantCPUWeight %d is out of range: set -grant-cpu-weight from 1 to 10000, or 0 for the default %d", c.GrantCPUWeight, DefaultGrantCPUWeight)
	case c.AdminUnsafe && !TestHooks:
		return bad("AdminUnsafe is set but this binary was built without the testhooks tag: drop -admin-unsafe")
	}
	if err := c.Limits.validate(); err != nil {
		return bad("%v", err)
	}
	if err := c.Park.validate(); err != nil {
		return bad("%v", err)
	}
	if c.EndpointFamily != endpoint.Unix {
		if err := c.PortRange.Validate(); err != nil {
			return bad("PortRange %v: %v: set -port-range to FIRST-LAST", c.PortRange, err)
		}
		if c.EndpointHost != "" {
			ip := net.ParseIP(c.EndpointHost)
			if ip == nil || (c.EndpointFamily == endpoint.Inet4) != (ip.To4() != nil) {
				return bad("EndpointHost %q is not an IP of family %v: set -endpoint-host to one", c.EndpointHost, c.EndpointFamily)
			}
		}
	}
	tlsSet := 0
	for _, f := range []string{c.TLSCert, c.TLSKey, c.ClientCA} {
		if f != "" {
			tlsSet++
		}
	}
	if tlsSet != 0 && tlsSet != 3 {
		return bad("TLSCert, TLSKey and ClientCA: %d of 3 set: set -tls-cert, -tls-key and -client-ca together, or none", tlsSet)
	}
	if c.Listen != "" {
		host, port, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return bad("Listen %q is not host:port (%v): set -listen to one, or -listen= for no TCP listener", c.Listen, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return bad("Listen %q has no valid port: set -listen to host:port", c.Listen)
		}
		if tlsSet == 0 {
			if !c.InsecurePlaintext {
				return bad("Listen %q has no TLS: set -tls-cert, -tls-key and -client-ca, or -insecure-plaintext on a loopback address, or -listen= to serve the unix socket only", c.Listen)
			}
			if !c.InsecureAllowNonLoopback && !endpoint.IsLoopbackHost(host) {
				return bad("Listen %q is plaintext on a non-loopback address: set -listen to a loopback address, add TLS, or name the address to expose explicitly (a wildcard never counts as named)", c.Listen)
			}
		}
	}
	return nil
}
