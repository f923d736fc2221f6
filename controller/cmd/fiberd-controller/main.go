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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"fiberd.io/fiberd/controller/api/v1alpha1"
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
}

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
	fs.StringVar(&o.issuerURL, "issuer-url", pool.DefaultIssuerURL, "the issuer grant Pods fetch their grants from (fiberd's -issuer and -grant-issuer-url, the audience of their grant token)")
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
	return o, nil
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
	log.Info("starting", "leaderElection", o.leaderElect, "issuer", o.issuerURL)
	return mgr.Start(ctx)
}
