package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/standalone"
)

// Defaults of the flags that are not the library's own.
const (
	defaultState  = "/var/lib/fiberd"
	defaultRunDir = "/run/fiberd"
	// devIssuer is the issuer -dev signs its grants as. The .invalid TLD
	// never resolves: its keys are verified offline.
	devIssuer = "https://fiberd.dev.invalid"
)

// options is everything the flags and the environment say, checked. run
// turns it into the homes' and the agent's Configs.
type options struct {
	home string // standalone.Name or kubernetes.Name
	dev  bool

	listen, socket        string
	listenSet             bool // -listen was given on the command line
	stateSet, runDirSet   bool // -state, -run-dir were given
	state, runDir         string
	nodeID                string
	issuer, issuerKeys    string
	issuerCAFile          string
	jwksMaxStale          time.Duration
	maxLease              time.Duration
	clockSkew             time.Duration
	grantsDir, templates  string
	endpointFamily        endpoint.Family
	endpointHost          string
	portRange             endpoint.PortRange
	cgroupRoot            string
	noCgroups             bool
	devices               []string
	staleTTL              time.Duration
	thrashRate            float64
	thrashBurst           int
	pressureThreshold     float64
	isolation             backend.Isolation
	scratchSize           int64 // bytes; 0: backend.DefaultScratchSize
	minIsolation          backend.Isolation
	ids                   idRange // zero: chosen at start (chooseIDs)
	fiberPidsMax          int64
	grantCPUWeight        int
	criu                  string // "" for no checkpoints
	parkMaxImages         int
	parkMaxBytes          int64
	parkIdleAfter         time.Duration
	pressurePark          bool
	tlsCert, tlsKey       string
	clientCA              string
	insecurePlaintext     bool
	insecureNonLoopback   bool // plaintext on a non-loopback address the operator named
	adminUnsafe           bool
	verbosity             int
	kubeconfig            string
	podName, podNamespace string
	podUID                string
	podIPs                string // -pod-ips as given
	podIP                 string // the -endpoint-family address of podIPs; "" for none
	grantTokenFile        string
	grantIssuerURL        string
	grantCAFile           string
}

// environ is what parseFlags reads besides its arguments: environment
// variables and the host name (the default node id).
type environ struct {
	vars     map[string]string
	hostname string
}

// flagError is a bad command line: exit status 2, the message names the flag.
type flagError struct{ msg string }

func (e *flagError) Error() string { return e.msg }

func bad(flagName, format string, args ...any) error {
	return &flagError{msg: "-" + flagName + ": " + fmt.Sprintf(format, args...)}
}

// parseFlags reads args (without the program name) and env into options.
// It does no I/O. Every error is a *flagError naming the flag; -h and
// -help return flag.ErrHelp after writing the usage to usage.
func parseFlags(args []string, env environ, usage io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fiberd", flag.ContinueOnError)
	// Errors are returned, not printed: run prints one line naming the
	// flag. Only -h prints the flags.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}

	fs.StringVar(&o.home, "home", standalone.Name, "where fiberd runs: standalone or kubernetes")
	fs.BoolVar(&o.dev, "dev", false, "laptop mode: a temporary state dir (or -state), a local issuer and its grants for the example templates, plaintext API on loopback")
	fs.StringVar(&o.listen, "listen", fiberd.DefaultListen, "TCP address of the API; empty for none (needs -tls-cert, -tls-key and -client-ca, or -insecure-plaintext)")
	fs.StringVar(&o.socket, "socket", "", "unix socket of the API (default <state>/fiberd.sock; \"-\" for none)")
	fs.StringVar(&o.state, "state", defaultState, "state directory (epoch, admin socket); under -dev a new temporary directory unless given")
	fs.StringVar(&o.runDir, "run-dir", defaultRunDir, "directory of fibers' sockets and logs; under -dev <state>/run unless given")
	fs.StringVar(&o.nodeID, "node-id", "", "this home's node id, the audience of its grants (default the host name; the Pod name under -home kubernetes)")
	fs.StringVar(&o.issuer, "issuer", "", "issuer URL grant tokens carry in iss; its keys are found by OIDC discovery unless -issuer-keys is given")
	fs.StringVar(&o.issuerKeys, "issuer-keys", "", "local JWKS `FILE` of the issuer's public keys, verified offline (no discovery)")
	fs.StringVar(&o.issuerCAFile, "issuer-ca-file", "", "PEM CA bundle the issuer's discovery and JWKS certificates must chain to (default -grant-ca-file, else the system roots)")
	fs.DurationVar(&o.jwksMaxStale, "jwks-max-stale", grant.DefaultMaxStale, "how old the issuer's keys may grow before tokens are unverifiable (SHED)")
	fs.DurationVar(&o.maxLease, "max-lease", 0, "refuse grants with a longer lease (0: any)")
	fs.DurationVar(&o.clockSkew, "clock-skew", grant.DefaultLeeway, "how far the issuer's clock may run ahead: grants issued (iat) further in the future are refused")
	fs.StringVar(&o.grantsDir, "grants-dir", "", "directory polled for *.jwt grant files (empty: grants arrive only inside Clone requests; under -dev <state>/grants)")
	fs.StringVar(&o.templates, "templates", "", "directory of template specs, one <name>.json each (under -dev: default <state>/templates, written from examples/templates; given, -dev mints a grant per spec in it)")
	family := fs.String("endpoint-family", "", "how fibers are reached: unix, inet4 or inet6 (default unix; inet4 under -dev and -home kubernetes)")
	fs.StringVar(&o.endpointHost, "endpoint-host", "", "IP fibers listen on and advertise (default the family's loopback; the Pod IP under -home kubernetes)")
	portRange := fs.String("port-range", fiberd.DefaultPortRange, "TCP ports of inet fibers, FIRST-LAST")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "", "cgroup v2 directory fibers are carved under (default a delegated subtree of fiberd's own cgroup; \"none\" for no cgroups)")
	devices := fs.String("devices", "", "comma-separated device paths or ids handed to every template (standalone: a static set; kubernetes: what the driver exposed to the Pod, handed with its ResourceClaim)")
	isolation := fs.String("isolation", "", "how far grants and fibers are kept apart: none, grant (a user and namespaces per grant) or fiber (also a PID namespace and /tmp per fiber); default fiber; the host or Pod may allow less, which fiberd logs once at start")
	ids := fs.String("ids", "", fmt.Sprintf("FIRST-LAST: the user and group ids isolated grants run as, one per grant, mapped in fiberd's user namespace and owned by nobody else (default %d-%d, or, in a user namespace that does not map those, such as a Pod's with hostUsers: false, the second quarter from the top of the ids it maps: 32768-49151 of 0-65535)", backend.DefaultIDFirst, uint64(backend.DefaultIDFirst)+uint64(backend.DefaultIDCount)-1))
	fs.Int64Var(&o.fiberPidsMax, "fiber-pids-max", 0, fmt.Sprintf("each fiber's pids.max, where the cgroup root has the pids controller: the processes and threads one fiber may run (0: %d; -1: none)", fiberd.DefaultFiberPidsMax))
	fs.IntVar(&o.grantCPUWeight, "grant-cpu-weight", 0, fmt.Sprintf("each grant's cpu.weight, 1 to 10000, where the cgroup root has the cpu controller: grants share the CPU in proportion (0: %d)", fiberd.DefaultGrantCPUWeight))
	scratchSize := fs.String("scratch-size", "", fmt.Sprintf("the size of each tmpfs an isolated fiber gets on /tmp, /var/tmp and /dev/shm when its grant has no wBudget, as a quantity such as 64Mi (a grant with a wBudget gets that size; default %dMi)", backend.DefaultScratchSize>>20))
	minIsolation := fs.String("min-isolation", string(backend.IsolationNone), "refuse grants (TIER_GAP) that would get less isolation than this on this host: none, grant or fiber")
	fs.DurationVar(&o.staleTTL, "stale-ttl", standalone.DefaultStaleTTL, "how long the control plane may be silent before misses turn from DEFERRED_FALLBACK to SHED (0: the home's default)")
	fs.Float64Var(&o.thrashRate, "thrash-rate", fiberd.DefaultThrashRate, "Clones per second admitted in the long run to each caller (a grant by its token, a unix socket peer uid, a TLS client certificate, a plaintext remote address); more are SHED (0: the default)")
	fs.IntVar(&o.thrashBurst, "thrash-burst", fiberd.DefaultThrashBurst, "Clones admitted at once to each caller before the thrash rate applies (0: the default)")
	fs.Float64Var(&o.pressureThreshold, "pressure-threshold", fiberd.DefaultPressureThreshold, "memory pressure of a grant's cgroup (PSI some avg10, percent) above which its Clones are SHED; 0 turns the check off")
	fs.StringVar(&o.criu, "criu", backend.DefaultCRIUPath(), "the criu binary (4.2 or later) fibers are parked with, the CHECKPOINT tier; `none` for no parking (hack/criu.sh builds one at the default)")
	fs.IntVar(&o.parkMaxImages, "park-max-images", fiberd.DefaultParkMaxImages, "parked sessions one grant may keep")
	fs.Int64Var(&o.parkMaxBytes, "park-max-bytes", fiberd.DefaultParkMaxBytes, "bytes of parked images one grant may keep")
	fs.BoolVar(&o.pressurePark, "pressure-park", false, "under memory pressure (-pressure-threshold), park a grant's largest idle fiber instead of shedding a Clone")
	fs.DurationVar(&o.parkIdleAfter, "park-idle-after", fiberd.DefaultParkIdleAfter, "how long no Clone must name a fiber before -pressure-park may park it")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM server certificate of the TCP listener (with -tls-key and -client-ca)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM key of -tls-cert")
	fs.StringVar(&o.clientCA, "client-ca", "", "PEM CA bundle client certificates must chain to")
	fs.BoolVar(&o.insecurePlaintext, "insecure-plaintext", false, "serve the TCP listener without TLS (loopback only, unless -listen names a non-loopback address)")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (kubernetes; empty: in-cluster)")
	fs.StringVar(&o.podName, "pod-name", env.vars["POD_NAME"], "this Pod's name (kubernetes; default $POD_NAME)")
	fs.StringVar(&o.podNamespace, "pod-namespace", env.vars["POD_NAMESPACE"], "this Pod's namespace (kubernetes; default $POD_NAMESPACE)")
	fs.StringVar(&o.podUID, "pod-uid", env.vars["POD_UID"], "this Pod's UID (kubernetes; default $POD_UID)")
	fs.StringVar(&o.podIPs, "pod-ips", env.vars["POD_IPS"], "this Pod's IPs, comma-separated, as the downward API's status.podIPs gives them: the -endpoint-family one is advertised without reading the Pod (kubernetes; default $POD_IPS)")
	fs.StringVar(&o.grantTokenFile, "grant-token-file", "", "bound service-account token sent to fetch the Pod's grant (kubernetes; empty: no fetch)")
	fs.StringVar(&o.grantIssuerURL, "grant-issuer-url", "", "https URL of the controller the grant is fetched from (kubernetes)")
	fs.StringVar(&o.grantCAFile, "grant-ca-file", "", "PEM CA bundle of the grant endpoint (kubernetes; empty: system roots)")
	if fiberd.TestHooks {
		fs.BoolVar(&o.adminUnsafe, "admin-unsafe", false, "TEST ONLY: enable the admin socket's POST /issuer and POST /scope-lost")
	}

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(usage, "usage: fiberd [flags]   (fiberd -dev: a laptop setup that needs nothing else)")
			fs.SetOutput(usage)
			fs.PrintDefaults()
			return o, err
		}
		return o, &flagError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return o, &flagError{msg: fmt.Sprintf("unexpected argument %q: fiberd takes flags only", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.listenSet, o.stateSet, o.runDirSet = set["listen"], set["state"], set["run-dir"]

	var err error
	if o.endpointFamily, err = parseFamily(*family, o.home, o.dev); err != nil {
		return o, bad("endpoint-family", "%v", err)
	}
	if o.portRange, err = endpoint.ParsePortRange(*portRange); err != nil {
		return o, bad("port-range", "%v", err)
	}
	if *devices != "" {
		for d := range strings.SplitSeq(*devices, ",") {
			d = strings.TrimSpace(d)
			if d == "" {
				return o, bad("devices", "empty entry in %q: list device paths or ids separated by commas", *devices)
			}
			o.devices = append(o.devices, d)
		}
	}
	if o.cgroupRoot == "none" {
		o.cgroupRoot, o.noCgroups = "", true
	}
	if o.isolation, err = parseIsolation(*isolation); err != nil {
		return o, bad("isolation", "%v", err)
	}
	if o.ids, err = parseIDRange(*ids); err != nil {
		return o, bad("ids", "%v", err)
	}
	if *scratchSize != "" {
		q, err := resource.ParseQuantity(*scratchSize)
		if err != nil || q.Sign() <= 0 {
			return o, bad("scratch-size", "%q is not a positive size: give bytes or a quantity such as 64Mi", *scratchSize)
		}
		o.scratchSize = q.Value()
	}
	if o.minIsolation, err = backend.ParseIsolation(*minIsolation); err != nil {
		return o, bad("min-isolation", "%v", err)
	}
	if !o.isolation.AtLeast(o.minIsolation) {
		return o, bad("min-isolation", "%s is more than -isolation %s gives: every grant would be refused; raise -isolation or lower -min-isolation", o.minIsolation, o.isolation)
	}
	switch {
	case o.criu == "none":
		o.criu = ""
	case o.criu != "" && !filepath.IsAbs(o.criu):
		return o, bad("criu", "%q is not absolute: give the full path of the criu binary, or none", o.criu)
	}

	if err := o.check(set, env); err != nil {
		return o, err
	}
	return o, nil
}

// parseIsolation reads -isolation, fiber by default in every home: on a
// standalone host grants are tenants side by side; in a grant Pod the Pod is
// the grant's boundary, and fiber keeps each session's processes, /proc and
// /tmp from the others'. Where the host or the Pod lacks the privilege the
// backends give less and fiberd says so once at start (decision 63), so a
// Pod without it serves as before, at isolation none, visibly.
func parseIsolation(s string) (backend.Isolation, error) {
	if s == "" {
		return backend.IsolationFiber, nil
	}
	return backend.ParseIsolation(s)
}

// parseFamily reads -endpoint-family, defaulting it by home.
func parseFamily(s, home string, dev bool) (endpoint.Family, error) {
	if s == "" {
		if dev || home == kubernetes.Name {
			return endpoint.Inet4, nil
		}
		return endpoint.Unix, nil
	}
	return endpoint.ParseFamily(s)
}

// check validates the flags against each other and fills the defaults that
// depend on others. set holds the flags given on the command line.
func (o *options) check(set map[string]bool, env environ) error {
	switch o.home {
	case standalone.Name, kubernetes.Name:
	default:
		return bad("home", "%q is not a home: use standalone or kubernetes", o.home)
	}
	kube := o.home == kubernetes.Name

	if o.jwksMaxStale <= 0 {
		return bad("jwks-max-stale", "%v is not positive", o.jwksMaxStale)
	}
	if o.endpointHost != "" && o.endpointFamily == endpoint.Unix {
		return bad("endpoint-host", "has no use with -endpoint-family unix")
	}

	if o.dev {
		if err := o.checkDev(set, kube); err != nil {
			return err
		}
	} else if err := o.checkIssuer(); err != nil {
		return err
	}
	if err := o.checkListen(); err != nil {
		return err
	}

	if kube {
		return o.checkKube()
	}
	for _, name := range []string{"kubeconfig", "pod-name", "pod-namespace", "pod-uid", "pod-ips", "grant-token-file", "grant-issuer-url", "grant-ca-file"} {
		if set[name] {
			return bad(name, "applies to -home kubernetes only")
		}
	}
	if o.nodeID == "" {
		o.nodeID = env.hostname
	}
	return nil
}

// checkDev checks what -dev allows: it makes its own issuer and grants and
// serves plaintext on loopback.
func (o *options) checkDev(set map[string]bool, kube bool) error {
	if kube {
		return bad("dev", "runs the standalone home only: drop -home kubernetes")
	}
	for _, name := range []string{"issuer", "issuer-keys", "grants-dir", "tls-cert", "tls-key", "client-ca"} {
		if set[name] {
			return bad(name, "cannot be combined with -dev, which makes its own issuer, grants and plaintext loopback API")
		}
	}
	if o.listen != "" {
		host, _, err := net.SplitHostPort(o.listen)
		if err != nil {
			return bad("listen", "%q is not host:port: %v", o.listen, err)
		}
		if !endpoint.IsLoopbackHost(host) {
			return bad("listen", "-dev serves plaintext on loopback only; %q is not a loopback address", o.listen)
		}
	}
	o.insecurePlaintext = true
	o.issuer = devIssuer
	return nil
}

// checkIssuer checks -issuer and -issuer-keys outside -dev.
func (o *options) checkIssuer() error {
	if o.issuer == "" {
		return bad("issuer", "is required: the issuer URL grant tokens carry in iss (or run -dev)")
	}
	if o.issuerKeys != "" {
		if !filepath.IsAbs(o.issuerKeys) {
			return bad("issuer-keys", "%q is not an absolute path", o.issuerKeys)
		}
		if o.issuerCAFile != "" {
			return bad("issuer-ca-file", "is for key discovery; -issuer-keys verifies offline and dials nothing")
		}
		return nil // verified offline: the issuer is only compared with iss
	}
	u, err := url.Parse(o.issuer)
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return bad("issuer", "%q is not an absolute URL without query or fragment", o.issuer)
	}
	if u.Scheme != "https" && !(u.Scheme == "http" && endpoint.IsLoopbackHost(u.Hostname())) {
		return bad("issuer", "%q must be https (http only to a loopback issuer), or give -issuer-keys to verify offline", o.issuer)
	}
	return nil
}

// checkListen settles what only the command line says about -listen: a
// plaintext listener on a non-loopback address counts as named explicitly
// (Config.InsecureAllowNonLoopback) when -listen was given and names a
// host, not a wildcard; and -insecure-plaintext conflicts with TLS. The
// rest (the TLS files together, host:port, TLS or plaintext on loopback)
// is fiberd.Config's Validate.
func (o *options) checkListen() error {
	tls := o.tlsCert != "" || o.tlsKey != "" || o.clientCA != ""
	if tls && o.insecurePlaintext && !o.dev {
		return bad("insecure-plaintext", "conflicts with -tls-cert: pick TLS or plaintext")
	}
	if o.listen == "" || tls || !o.insecurePlaintext || !o.listenSet {
		return nil
	}
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil || endpoint.IsLoopbackHost(host) {
		return nil // Validate names a malformed address
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return nil // a wildcard is never named explicitly: Validate refuses it
	}
	o.insecureNonLoopback = true
	return nil
}

// pickPodIP checks -pod-ips and picks its first address of
// -endpoint-family into podIP; none of the family (or the unix family)
// leaves podIP empty, and the home reads the Pod for its address.
func (o *options) pickPodIP() error {
	if strings.TrimSpace(o.podIPs) == "" {
		return nil
	}
	for s := range strings.SplitSeq(o.podIPs, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || a.Zone() != "" {
			return bad("pod-ips", "%q is not a list of IP addresses: set $POD_IPS from the downward API field status.podIPs", o.podIPs)
		}
		if o.podIP != "" {
			continue
		}
		switch {
		case o.endpointFamily == endpoint.Inet4 && a.Unmap().Is4():
			o.podIP = a.Unmap().String()
		case o.endpointFamily == endpoint.Inet6 && a.Is6() && !a.Is4In6():
			o.podIP = a.String()
		}
	}
	return nil
}

// checkKube checks the Kubernetes home's flags.
func (o *options) checkKube() error {
	if o.podName == "" {
		return bad("pod-name", "is required under -home kubernetes (or set $POD_NAME)")
	}
	if o.podNamespace == "" {
		return bad("pod-namespace", "is required under -home kubernetes (or set $POD_NAMESPACE)")
	}
	if o.podUID == "" {
		return bad("pod-uid", "is required under -home kubernetes (or set $POD_UID)")
	}
	if o.nodeID == "" {
		o.nodeID = o.podName
	}
	if err := o.pickPodIP(); err != nil {
		return err
	}
	if o.noCgroups {
		return bad("cgroup-root", "\"none\" is for the standalone home: the Kubernetes home carves the Pod's own cgroup")
	}
	if o.cgroupRoot != "" && !filepath.IsAbs(o.cgroupRoot) {
		return bad("cgroup-root", "%q is not absolute: give a directory under the cgroup2 mount", o.cgroupRoot)
	}
	if o.grantsDir != "" && !filepath.IsAbs(o.grantsDir) {
		return bad("grants-dir", "%q is not an absolute path", o.grantsDir)
	}
	if o.staleTTL < 0 {
		return bad("stale-ttl", "%v is negative", o.staleTTL)
	}
	if o.grantsDir == "" && !(fiberd.TestHooks && o.adminUnsafe) {
		return bad("grants-dir", "is required under -home kubernetes: the home admits grants from its files (an empty one is allowed only in a testhooks build under -admin-unsafe)")
	}
	if o.grantTokenFile != "" {
		if o.grantIssuerURL == "" {
			return bad("grant-issuer-url", "is required with -grant-token-file")
		}
		u, err := url.Parse(o.grantIssuerURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return bad("grant-issuer-url", "%q must be an https URL", o.grantIssuerURL)
		}
		if o.grantsDir == "" {
			return bad("grants-dir", "is required with -grant-token-file: the fetched grant is written there")
		}
	} else if o.grantIssuerURL != "" || o.grantCAFile != "" {
		return bad("grant-token-file", "is required with -grant-issuer-url and -grant-ca-file")
	}
	return nil
}

// agentConfig is the agent's Config of the options, without the parts
// build makes (Home, Keys, Warm, Basic).
func (o options) agentConfig() fiberd.Config {
	return fiberd.Config{
		Issuer:                   o.issuer,
		NodeID:                   o.nodeID,
		MaxLease:                 o.maxLease,
		ClockSkew:                o.clockSkew,
		Templates:                o.templates,
		StateDir:                 o.state,
		RunDir:                   o.runDir,
		Listen:                   o.listen,
		Socket:                   o.socket,
		TLSCert:                  o.tlsCert,
		TLSKey:                   o.tlsKey,
		ClientCA:                 o.clientCA,
		InsecurePlaintext:        o.insecurePlaintext,
		InsecureAllowNonLoopback: o.insecureNonLoopback,
		EndpointFamily:           o.endpointFamily,
		EndpointHost:             o.endpointHost,
		PortRange:                o.portRange,
		ThrashRate:               o.thrashRate,
		ThrashBurst:              o.thrashBurst,
		PressureThreshold:        o.pressureThreshold,
		MinIsolation:             o.minIsolation,
		FiberPidsMax:             o.fiberPidsMax,
		GrantCPUWeight:           o.grantCPUWeight,
		AdminUnsafe:              o.adminUnsafe,
		Park: fiberd.ParkLimits{
			MaxImages: o.parkMaxImages,
			MaxBytes:  o.parkMaxBytes,
			Pressure:  o.pressurePark,
			IdleAfter: o.parkIdleAfter,
		},
	}
}

// standaloneConfig is the standalone home's Config of the options, with
// the issuer's key cache (nil when keys are verified offline).
func (o options) standaloneConfig(cache *grant.Cache) standalone.Config {
	return standalone.Config{
		GrantsDir:  o.grantsDir,
		Cache:      cache,
		StaleTTL:   o.staleTTL,
		CgroupRoot: o.cgroupRoot,
		NoCgroups:  o.noCgroups,
		Devices:    o.devices,
	}
}

// validate lets the Configs the options make speak: the agent's settings
// (fiberd.Config.ValidateSettings) and, for the standalone home, its
// Config's Validate. Each refusal names its flag. run calls it once the
// options are complete (under -dev, after prepareDev), before anything is
// built.
func (o options) validate() error {
	if err := o.agentConfig().ValidateSettings(); err != nil {
		return &flagError{msg: err.Error()}
	}
	if o.home == standalone.Name {
		if err := o.standaloneConfig(nil).Validate(); err != nil {
			return &flagError{msg: err.Error()}
		}
	}
	return nil
}
