package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
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
	if err := pool.Setup(ctx, mgr, pool.Config{Shape: pool.Shape{IssuerURL: o.issuerURL}}); err != nil {
		return err
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
	log.Info("starting", "leaderElection", o.leaderElect, "issuer", o.issuerURL, "servesGrants", o.issuer.issuerOn())
	return mgr.Start(ctx)
}
