// Command fiberd is the agent daemon: one per home (a host, or a Kubernetes
// grant Pod). It admits the grants its home delivers, keeps their templates
// warm, and serves Clone on an HTTP API over a unix socket and TCP.
//
// Usage:
//
//	fiberd -dev                                  # a laptop: nothing else needed
//	fiberd -issuer URL [-issuer-keys FILE] -templates DIR [-grants-dir DIR] [flags]
//	fiberd -home kubernetes -templates DIR -grants-dir DIR [-grant-token-file F -grant-issuer-url URL] [flags]
//
// Run "fiberd -h" for every flag. A TCP listener (-listen, default
// 127.0.0.1:8484) needs -tls-cert, -tls-key and -client-ca, or
// -insecure-plaintext; -listen= serves the unix socket only.
//
// Exit status: 0 after SIGTERM or SIGINT once drained (fibers released,
// zygotes stopped); 1 when fiberd cannot start or fails; 2 on a bad flag,
// with a message naming it, and when another fiberd runs on the same
// -state (the message names its pid).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/grant"
	"fiberd.io/fiberd/pkg/home"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/standalone"
)

// The homes satisfy the agent's optional interfaces structurally; these
// lines keep them honest where both sides are imported.
var (
	_ fiberd.IssuerOverrider = (*standalone.Home)(nil)
	_ fiberd.IssuerOverrider = (*kubernetes.Home)(nil)
	_ fiberd.ScopeLoser      = (*kubernetes.Home)(nil)
	_ fiberd.EndpointHoster  = (*kubernetes.Home)(nil)
	_ fiberd.IssuerOverrider = podIPHome{}
	_ fiberd.ScopeLoser      = podIPHome{}
	_ fiberd.EndpointHoster  = podIPHome{}
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	env := environ{vars: map[string]string{}}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env.vars[k] = v
		}
	}
	env.hostname, _ = os.Hostname()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		// The first signal drains; a second one kills, as by default.
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], env, os.Stdout, os.Stderr))
}

// run is fiberd from its arguments to its exit status. ctx ending is the
// signal to drain and stop.
func run(ctx context.Context, args []string, env environ, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, env, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "fiberd: %v\nRun \"fiberd -h\" for the flags.\n", err)
		return exitUsage
	}
	var kfs flag.FlagSet
	klog.InitFlags(&kfs)
	_ = kfs.Set("v", strconv.Itoa(o.verbosity))
	log := klog.Background()
	becomeSubreaper(log)

	var dev *devSetup
	if o.dev {
		if dev, err = prepareDev(&o, log); err != nil {
			fmt.Fprintf(stderr, "fiberd -dev: %v\n", err)
			return startFailure(err)
		}
		defer dev.cleanup(log)
	}
	// The Configs the flags make speak before anything is built.
	if err := o.validate(); err != nil {
		fmt.Fprintf(stderr, "fiberd: %v\nRun \"fiberd -h\" for the flags.\n", err)
		return exitUsage
	}

	// A -state that is not fiberd's, or that another fiberd holds, is
	// refused before anything is built (a home may carve or delegate
	// cgroups, or read its Pod): New judges and locks it again itself.
	if err := fiberd.CheckStateDir(o.state); err != nil {
		fmt.Fprintf(stderr, "fiberd: %v\n", err)
		return startFailure(err)
	}
	agent, err := build(ctx, o, log)
	if err != nil && ctx.Err() != nil {
		// SIGTERM while starting (the grant fetch, the wait for the Pod's
		// address): nothing was served, so nothing is left to drain.
		log.Info("fiberd stopped by a signal before it started", "during", err.Error())
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "fiberd: %v\n", err)
		return startFailure(err)
	}
	log.Info("fiberd starting", "home", o.home, "epoch", agent.Epoch(), "state", o.state,
		"socket", agent.SocketPath(), "listen", addrString(agent))

	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		done <- agent.Run(ctx)
		close(stopped)
	}()
	if dev != nil {
		dev.announce(ctx, agent, stopped, stdout, log)
	}
	if err := <-done; err != nil {
		fmt.Fprintf(stderr, "fiberd: %v\n", err)
		return exitFailure
	}
	log.Info("fiberd stopped: every fiber released, every zygote stopped")
	return exitOK
}

// startFailure is the exit status for err, which stopped fiberd before it
// served: exitUsage for a bad flag and when another agent holds the -state
// (the command line must name another), exitFailure otherwise.
func startFailure(err error) int {
	var fe *flagError
	if errors.Is(err, fiberd.ErrStateInUse) || errors.As(err, &fe) {
		return exitUsage
	}
	return exitFailure
}

// build turns the options into a running agent's parts: the issuer's keys,
// the home, the backends and the agent itself. It closes what it built when
// a later step fails.
func build(ctx context.Context, o options, log logr.Logger) (*fiberd.Agent, error) {
	var (
		keys  grant.KeySource
		cache *grant.Cache
	)
	if o.issuerKeys != "" {
		static, err := grant.ReadStaticKeys(o.issuerKeys)
		if err != nil {
			return nil, fmt.Errorf("-issuer-keys: %w", err)
		}
		log.Info("Verifying grants offline", "issuer", o.issuer, "keys", static.KeyIDs())
		keys = static
	} else {
		httpClient, err := issuerClient(o)
		if err != nil {
			return nil, err
		}
		c, err := grant.NewCache(o.issuer, grant.CacheOptions{HTTPClient: httpClient, MaxStale: o.jwksMaxStale, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("-issuer: %w", err)
		}
		keys, cache = c, c
	}

	h, err := buildHome(ctx, o, cache, log)
	if err != nil {
		return nil, err
	}
	// One pool of ids for both backends: no grant of one may run as a
	// user a grant of the other runs as.
	// In a user-namespaced Pod the default pool is not mapped: the ids
	// come from the Pod's own range then (chooseIDs).
	r := o.ids
	if r == (idRange{}) {
		if o.isolation == backend.IsolationNone {
			r = idRange{first: backend.DefaultIDFirst, count: backend.DefaultIDCount}
		} else if r, err = chooseIDs(); err != nil {
			h.Close()
			return nil, fmt.Errorf("-ids: %w", err)
		}
	}
	if o.isolation != backend.IsolationNone {
		log.V(1).Info("Isolated grants' ids", "ids", r.String())
	}
	ids, err := backend.NewIDPool(r.first, r.count)
	if err != nil {
		h.Close()
		return nil, err
	}
	// A grant Pod holds one grant in a network namespace of its own: no
	// other grant's fiber shares its loopback.
	grantNetworks := o.home != standalone.Name
	warm, err := backend.NewProc(backend.Config{Logger: log.WithName("proc"), Isolation: o.isolation, IDs: ids, CRIU: o.criu, ScratchSize: o.scratchSize, GrantNetworks: grantNetworks})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("proc backend: %w", err)
	}
	basic, err := backend.NewExec(backend.Config{Logger: log.WithName("exec"), Isolation: o.isolation, IDs: ids, ScratchSize: o.scratchSize, GrantNetworks: grantNetworks})
	if err != nil {
		warm.Close()
		h.Close()
		return nil, fmt.Errorf("exec backend: %w", err)
	}
	cfg := o.agentConfig()
	cfg.Home, cfg.Keys, cfg.Warm, cfg.Basic, cfg.Logger = h, keys, warm, basic, log
	a, err := fiberd.New(ctx, cfg)
	if err != nil {
		// A Config New refused leaves the parts to us; after that New has
		// closed them itself, and closing again is harmless.
		basic.Close()
		warm.Close()
		h.Close()
		return nil, err
	}
	return a, nil
}

// buildHome builds the home -home names.
func buildHome(ctx context.Context, o options, cache *grant.Cache, log logr.Logger) (home.Home, error) {
	if o.home == standalone.Name {
		cfg := o.standaloneConfig(cache)
		cfg.Logger = log
		h, err := standalone.New(cfg)
		if err != nil {
			return nil, err
		}
		return h, nil
	}

	var (
		rc  *rest.Config
		err error
	)
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes home: cluster config (-kubeconfig %q): %w", o.kubeconfig, err)
	}
	kube, err := kubernetes.NewKube(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes home: %w", err)
	}
	h, err := kubernetes.New(ctx, kubernetes.Config{
		Kube:           kube,
		PodName:        o.podName,
		PodNamespace:   o.podNamespace,
		PodUID:         o.podUID,
		StaleTTL:       o.staleTTL,
		GrantsDir:      o.grantsDir,
		GrantTokenFile: o.grantTokenFile,
		GrantIssuerURL: o.grantIssuerURL,
		GrantCAFile:    o.grantCAFile,
		Cache:          cache,
		Family:         o.endpointFamily,
		Devices:        o.devices,
		CgroupRoot:     o.cgroupRoot,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	return withPodIP(h, o, log), nil
}

// withPodIP is h, answering EndpointHost with the Pod IP -pod-ips gave when
// it holds one of the family.
func withPodIP(h *kubernetes.Home, o options, log logr.Logger) home.Home {
	if o.podIP == "" {
		return h
	}
	log.Info("Advertising the Pod IP the downward API gave; the Pod is not read for it", "ip", o.podIP, "family", o.endpointFamily)
	return podIPHome{Home: h, ip: o.podIP}
}

// podIPHome is the Kubernetes home with the Pod IP the downward API gave
// (-pod-ips, $POD_IPS from status.podIPs): EndpointHost answers it and reads
// nothing, where the home would read the Pod until the kubelet wrote an
// address. Every other method is the home's own. The value reaches the
// agent here, in cmd/, because only cmd/ turns the environment into
// configuration and the home's Config has no field for it (design
// decision 47).
type podIPHome struct {
	*kubernetes.Home
	ip string
}

// EndpointHost is the Pod IP of the configured family from -pod-ips.
func (h podIPHome) EndpointHost() string { return h.ip }

func addrString(a *fiberd.Agent) string {
	if addr := a.Addr(); addr != nil {
		return addr.String()
	}
	return ""
}

// issuerClient is the HTTP client the key cache discovers the issuer's keys
// with: its certificate must chain to -issuer-ca-file, else to
// -grant-ca-file (in Kubernetes the controller is both the issuer and the
// grant endpoint), else to the system roots (nil client).
func issuerClient(o options) (*http.Client, error) {
	flag, file := "issuer-ca-file", o.issuerCAFile
	if file == "" {
		flag, file = "grant-ca-file", o.grantCAFile
	}
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("-%s: %w", flag, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-%s: %s holds no PEM certificate: give the issuer's CA bundle", flag, file)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: grant.DefaultRequestTimeout}, nil
}
