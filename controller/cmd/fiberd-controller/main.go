package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/issuer"
	"fiberd.io/fiberd/controller/pool"
	fclient "fiberd.io/fiberd/pkg/client"
)

// options are the command's flags.
type options struct {
	metricsAddr   string
	probeAddr     string
	leaderElect   bool
	leaderNS      string
	leaderID      string
	issuerURL     string
	verbosity     int
	leaseDuration time.Duration
	issuer        issuerOptions
	tlsDir        string
	serverName    string
	fibersEvery   time.Duration
}

// issuerOptions are the flags of the controller's grant issuer.
type issuerOptions struct {
	bindAddress, certFile, keyFile, namespace, secret string
	rotation, prepublish, lease, maxLease             time.Duration
}

// issuerOn reports whether this controller serves grants itself.
func (o issuerOptions) issuerOn() bool { return o.bindAddress != "0" && o.bindAddress != "" }

// parseFlags reads args into options, refusing what cannot work with a message naming the flag.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("fiberd-controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", `address the Prometheus metrics are served on (plain HTTP, /metrics); "0" serves none`)
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", `address of the health probes /healthz and /readyz; "0" serves none`)
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "take a Lease before reconciling, so that of several replicas one is active")
	fs.StringVar(&o.leaderNS, "leader-election-namespace", "", "namespace of the leader election Lease; empty means the Pod's own (required outside a cluster)")
	fs.StringVar(&o.leaderID, "leader-election-id", "fiberd-controller.fiberd.io", "name of the leader election Lease")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a leader that stopped renewing keeps the Lease")
	fs.StringVar(&o.issuerURL, "issuer-url", issuer.DefaultURL, "the issuer grant Pods fetch their grants from (fiberd's -issuer and -grant-issuer-url, the audience of their grant token): this controller's own issuer, as its Service names it, unless -issuer-bind-address=0")
	fs.StringVar(&o.issuer.bindAddress, "issuer-bind-address", ":8443", `address the grant issuer serves HTTPS on (discovery, JWKS, /v1/grant); "0" serves none, and -issuer-url must then name another issuer`)
	fs.StringVar(&o.issuer.certFile, "issuer-tls-cert", "/etc/fiberd/issuer-tls/tls.crt", "PEM serving certificate (chain) of the issuer, for -issuer-url's host")
	fs.StringVar(&o.issuer.keyFile, "issuer-tls-key", "/etc/fiberd/issuer-tls/tls.key", "PEM private key of -issuer-tls-cert")
	fs.StringVar(&o.issuer.namespace, "issuer-keys-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the issuer's keys Secret: the controller's own (default $POD_NAMESPACE)")
	fs.StringVar(&o.issuer.secret, "issuer-keys-secret", issuer.DefaultSecretName, "name of the Secret the issuer keeps its signing keys in; every replica shares it")
	fs.DurationVar(&o.issuer.rotation, "issuer-key-rotation", issuer.DefaultRotationPeriod, "how long one signing key signs before the next takes over")
	fs.DurationVar(&o.issuer.prepublish, "issuer-key-prepublish", issuer.DefaultPrepublish, "how long a new key is in the JWKS before it signs")
	fs.DurationVar(&o.issuer.lease, "issuer-lease", issuer.DefaultLease, "lease of the grants of a pool whose spec.lease is empty")
	fs.DurationVar(&o.issuer.maxLease, "issuer-max-lease", issuer.DefaultMaxLease, "longest lease signed (a pool asking more is refused); a retired key stays published this long plus a margin")
	fs.StringVar(&o.tlsDir, "fiberd-tls-dir", "", "directory of the client certificate the controller reads grant Pods' fibers in use with (GET /v1/status on their API port): tls.crt and tls.key, signed by the grant Pods' client CA, and ca.crt, the CA of fiberd's serving certificate. Empty, or a directory with none of the three: fibers in use are unknown and drains wait their whole grace period")
	fs.StringVar(&o.serverName, "fiberd-server-name", pool.DefaultFibersServerName, `name checked in fiberd's serving certificate while dialling a grant Pod's IP; "{namespace}" and "{pool}" are replaced by the Pod's`)
	fs.DurationVar(&o.fibersEvery, "fibers-interval", pool.DefaultFibersInterval, "how often each grant Pod's fibers in use are read, at most")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity: 0 logs each Pod created or deleted, higher values add controller-runtime's detail")
	config.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: fiberd-controller takes flags only", fs.Arg(0))
	}
	if o.leaderElect && o.leaderID == "" {
		return o, errors.New("-leader-election-id is empty: name the Lease, or run with -leader-elect=false")
	}
	if o.leaseDuration < 5*time.Second {
		return o, fmt.Errorf("-leader-election-lease-duration %s: want 5s or more", o.leaseDuration)
	}
	if err := (pool.Config{Shape: pool.Shape{IssuerURL: o.issuerURL}}).Validate(); err != nil {
		return o, fmt.Errorf("-issuer-url: %w", err)
	}
	if o.issuer.issuerOn() {
		if o.issuer.namespace == "" {
			return o, errors.New("-issuer-keys-namespace is empty and POD_NAMESPACE is unset: name the controller's namespace, or run with -issuer-bind-address=0")
		}
		if err := o.issuerConfig().Validate(); err != nil {
			return o, fmt.Errorf("-issuer-url, -issuer-key-*, -issuer-*lease: %w", err)
		}
	}
	if o.fibersEvery < time.Second {
		return o, fmt.Errorf("-fibers-interval %s: want 1s or more", o.fibersEvery)
	}
	return o, nil
}

// issuerConfig is the issuer's configuration from the flags.
func (o options) issuerConfig() issuer.Config {
	return issuer.Config{
		IssuerURL:      o.issuerURL,
		ListenAddress:  o.issuer.bindAddress,
		CertFile:       o.issuer.certFile,
		KeyFile:        o.issuer.keyFile,
		Namespace:      o.issuer.namespace,
		SecretName:     o.issuer.secret,
		RotationPeriod: o.issuer.rotation,
		Prepublish:     o.issuer.prepublish,
		Lease:          o.issuer.lease,
		MaxLease:       o.issuer.maxLease,
	}
}

// fibersConfig builds the pool's FibersConfig from the flags, reading -fiberd-tls-dir: all three
// files, or none (a Secret not made yet: fibers in use unknown, said in the log and in each
// pool's FibersCounted condition). One or two of them is an error naming what is missing.
func fibersConfig(o options) (pool.FibersConfig, error) {
	fc := pool.FibersConfig{ServerName: o.serverName, Interval: o.fibersEvery}
	if o.tlsDir == "" {
		return fc, nil
	}
	files := []string{"tls.crt", "tls.key", "ca.crt"}
	var present, missing []string
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(o.tlsDir, f)); err == nil {
			present = append(present, f)
		} else {
			missing = append(missing, f)
		}
	}
	switch len(present) {
	case 0:
		return fc, nil
	case len(files):
	default:
		return fc, fmt.Errorf("-fiberd-tls-dir %s has %s but not %s: give all three (or none, to leave fibers in use unknown)",
			o.tlsDir, strings.Join(present, ", "), strings.Join(missing, ", "))
	}
	crt, key := filepath.Join(o.tlsDir, "tls.crt"), filepath.Join(o.tlsDir, "tls.key")
	cfg, err := fclient.TLSConfig(crt, key, filepath.Join(o.tlsDir, "ca.crt"))
	if err != nil {
		return fc, fmt.Errorf("-fiberd-tls-dir: %w", err)
	}
	// The client certificate is read again when its files change (a Secret's certificate
	// renewed in place); the CA is read once.
	rc := &reloadingCert{crt: crt, key: key}
	if _, err := rc.get(); err != nil {
		return fc, fmt.Errorf("-fiberd-tls-dir: %w", err)
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return rc.get() }
	fc.TLS = cfg
	return fc, nil
}

// reloadingCert is a client certificate read from its files, and read again when either file's
// modification time or size changes. A failed read keeps the last good certificate.
type reloadingCert struct {
	crt, key string

	mu    sync.Mutex
	stamp string
	cert  *tls.Certificate
}

// get returns the certificate, reading the files again if they changed since the last read.
func (r *reloadingCert) get() (*tls.Certificate, error) {
	stamp := ""
	for _, f := range []string{r.crt, r.key} {
		fi, err := os.Stat(f)
		if err != nil {
			stamp += "?"
			continue
		}
		stamp += fmt.Sprintf("%d.%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && stamp == r.stamp {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.crt, r.key)
	if err != nil {
		if r.cert != nil {
			return r.cert, nil // mid-update: the pair does not match yet
		}
		return nil, fmt.Errorf("client certificate %s, key %s: %w", r.crt, r.key, err)
	}
	r.cert, r.stamp = &cert, stamp
	return r.cert, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fiberd-controller: %v\n", err)
		os.Exit(2)
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(o.verbosity), textlogger.Output(os.Stderr)))
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error(err, "fiberd-controller stopped")
		os.Exit(1)
	}
}

// run builds the manager and runs it until ctx ends. It returns once every goroutine the
// manager started has ended.
func run(ctx context.Context, o options, log logr.Logger) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		return err
	}
	renew := o.leaseDuration * 2 / 3
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Logger:                        log,
		Cache:                         pool.CacheOptions(),
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              o.leaderID,
		LeaderElectionNamespace:       o.leaderNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &renew,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	fibers, err := fibersConfig(o)
	if err != nil {
		return err
	}
	if err := pool.Setup(ctx, mgr, pool.Config{Shape: pool.Shape{IssuerURL: o.issuerURL}, Fibers: fibers}); err != nil {
		return err
	}
	if fibers.TLS == nil {
		log.Info("no client certificate for fiberd's API (-fiberd-tls-dir): fibers in use are unknown, draining grant pods wait their whole grace period")
	}
	if o.issuer.issuerOn() {
		// The issuer reads Pods and Secrets from the API server itself: the manager's cache holds
		// only pool Pods and may lag a deletion, and it holds no Secrets.
		live, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("issuer client: %w", err)
		}
		icfg := o.issuerConfig()
		icfg.Logger = log.WithName("issuer")
		iss, err := issuer.New(icfg, live, mgr.GetClient())
		if err != nil {
			return err
		}
		if err := mgr.Add(iss); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("issuer-keys", iss.Ready); err != nil {
			return err
		}
	}
	log.Info("starting", "leaderElection", o.leaderElect, "issuer", o.issuerURL, "servesGrants", o.issuer.issuerOn(), "fibersInUse", fibers.TLS != nil)
	return mgr.Start(ctx)
}
