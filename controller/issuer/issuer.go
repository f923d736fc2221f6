package issuer

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shared "fiberd.io/fiberd/pkg/issuer"
)

// The permissions the issuer needs cluster-wide; `make generate` writes them into
// deploy/controller/role.yaml. Its keys Secret is in the controller's own namespace, granted by
// a Role in deploy/controller/rbac.yaml.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get

// DefaultURL is the issuer's URL in deploy/controller: its fiberd-issuer Service in
// fiberd-system. cmd/fiberd-controller's -issuer-url defaults to it, and hands it to the pool
// Reconciler, so the grant Pods it creates fetch their grants here.
const DefaultURL = "https://fiberd-issuer.fiberd-system.svc"

// Defaults of Config.
const (
	// DefaultSecretName is the keys Secret's name.
	DefaultSecretName = "fiberd-issuer-keys"
	// DefaultLease is the lease of a pool that names none: 10 minutes, renewed every 5.
	DefaultLease = shared.DefaultLease
	// DefaultMaxLease is the longest lease the issuer signs: an hour. A key stays published
	// this long, plus DefaultMargin, after it stopped signing.
	DefaultMaxLease = time.Hour
	// DefaultMargin is added to MaxLease before a retired key leaves the JWKS: clock skew
	// between replicas and fiberd, and a replica that has not yet read the newest ring.
	DefaultMargin = 5 * time.Minute
	// shutdownGrace bounds how long Start waits for requests in flight once its context ends.
	shutdownGrace = 5 * time.Second
)

// Config is what New needs. cmd/fiberd-controller fills it from flags.
type Config struct {
	// IssuerURL is the issuer's own https URL, as grant Pods reach it: the iss of every grant,
	// the audience their projected tokens must carry, fiberd's -issuer and -grant-issuer-url.
	// Required.
	IssuerURL string
	// ListenAddress is where Start serves HTTPS, such as ":8443". Required by Start.
	ListenAddress string
	// CertFile and KeyFile are the PEM serving certificate (chain) for IssuerURL's host and its
	// key. Required by Start, which loads them again whenever they change.
	CertFile, KeyFile string
	// Namespace and SecretName locate the keys Secret. Namespace is required (the controller's
	// own); SecretName defaults to DefaultSecretName.
	Namespace, SecretName string
	// RotationPeriod is how long one key signs. Default DefaultRotationPeriod.
	RotationPeriod time.Duration
	// Prepublish is how long a key is published before it signs. Default DefaultPrepublish.
	Prepublish time.Duration
	// Lease is the lease of a pool whose spec names none. Default DefaultLease.
	Lease time.Duration
	// MaxLease is the longest lease signed; a pool asking more is refused (403). Default
	// DefaultMaxLease.
	MaxLease time.Duration
	// Margin is added to MaxLease to keep a retired key published. Default DefaultMargin.
	Margin time.Duration
	// ReviewTimeout bounds the API calls of one grant request. Default
	// shared.DefaultReviewTimeout.
	ReviewTimeout time.Duration
	// Resync is how often the keys Secret is read. Default DefaultResync.
	Resync time.Duration
	// Clock tells the time. Default the real clock.
	Clock clock.WithTicker
	// Logger receives a line per grant, refusal and key change. Default klog's.
	Logger logr.Logger
}

func (c Config) withDefaults() Config {
	if c.SecretName == "" {
		c.SecretName = DefaultSecretName
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.Margin == 0 {
		c.Margin = DefaultMargin
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// Validate reports the first field of c that cannot work, and how to fix it. It does no I/O.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := shared.ValidIssuerURL(c.IssuerURL); err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	switch {
	case c.Lease < time.Second:
		return fmt.Errorf("issuer: default lease %v: want at least 1s", c.Lease)
	case c.MaxLease < c.Lease:
		return fmt.Errorf("issuer: longest lease %v is below the default lease %v: raise it", c.MaxLease, c.Lease)
	case c.Margin < 0:
		return fmt.Errorf("issuer: margin %v is negative", c.Margin)
	case c.ReviewTimeout < 0:
		return fmt.Errorf("issuer: review timeout %v is negative", c.ReviewTimeout)
	case c.Namespace == "":
		return errors.New("issuer: the keys Secret's namespace is empty: name the controller's own")
	}
	if err := c.rotation().Validate(); err != nil {
		return err
	}
	if resync := cmp.Or(c.Resync, DefaultResync); resync >= cmp.Or(c.Prepublish, DefaultPrepublish) {
		return fmt.Errorf("issuer: key resync %v: want less than the prepublish time %v, so every replica publishes a key before it signs", resync, cmp.Or(c.Prepublish, DefaultPrepublish))
	}
	return nil
}

// rotation is the key ring's schedule: a retired key stays published for MaxLease + Margin.
func (c Config) rotation() Rotation {
	return Rotation{Period: c.RotationPeriod, Prepublish: c.Prepublish, Retention: c.MaxLease + c.Margin}
}

// Issuer is the controller's grant issuer: the shared grant exchange (pkg/issuer) with
// PoolPolicy and a KeyRing. As a manager Runnable it serves HTTPS and keeps the ring on every
// replica, leader or not, so every replica the issuer's Service selects answers.
type Issuer struct {
	cfg     Config
	ring    *KeyRing
	server  *shared.Server
	handler http.Handler
}

// New builds the issuer. live must read from the API server, not a cache: it reviews tokens,
// reads the Pod a token is bound to (a deleted Pod must be seen at once), and reads and writes
// the keys Secret; its scheme needs core/v1, authentication/v1 and the FiberPool types. pools
// reads FiberPools, normally the manager's cache; live answers for a pool it does not hold. New
// does no I/O.
func New(cfg Config, live client.Client, pools client.Reader) (*Issuer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if live == nil || pools == nil {
		return nil, errors.New("issuer: New needs a live client and a reader of FiberPools")
	}
	ring, err := NewKeyRing(KeyRingConfig{
		Client:    live,
		Namespace: cfg.Namespace,
		Name:      cfg.SecretName,
		Rotation:  cfg.rotation(),
		Resync:    cfg.Resync,
		Clock:     cfg.Clock,
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	srv, err := shared.New(shared.Config{
		IssuerURL:     cfg.IssuerURL,
		Keys:          ring,
		Policy:        PoolPolicy{Pools: pools, Live: live},
		Cluster:       Cluster{Client: live},
		Lease:         cfg.Lease,
		MaxLease:      cfg.MaxLease,
		ReviewTimeout: cfg.ReviewTimeout,
		Clock:         cfg.Clock,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	registerMetrics()
	return &Issuer{cfg: cfg, ring: ring, server: srv, handler: counted(srv)}, nil
}

// Handler is the issuer's HTTP handler: discovery, JWKS, /v1/grant and /healthz under the
// issuer URL's path. It counts grant answers in fiberd_issuer_grant_requests_total.
func (i *Issuer) Handler() http.Handler { return i.handler }

// Ring is the issuer's key ring.
func (i *Issuer) Ring() *KeyRing { return i.ring }

// Ready is a readiness check: it fails until the keys are loaded.
func (i *Issuer) Ready(*http.Request) error { return i.ring.Loaded() }

// NeedLeaderElection is false: every replica issues grants, and the keys Secret, not a leader,
// orders their rotations.
func (i *Issuer) NeedLeaderElection() bool { return false }

// Start serves HTTPS on Config.ListenAddress and keeps the key ring until ctx ends; then it
// stops serving (requests in flight get shutdownGrace) and returns once both have ended. It
// fails at once when the certificate cannot be loaded or the address cannot be listened on, and
// when serving fails. The certificate files are watched: a handshake after either changed loads
// them again (a renewed Secret needs no restart).
func (i *Issuer) Start(ctx context.Context) error {
	if i.cfg.ListenAddress == "" || i.cfg.CertFile == "" || i.cfg.KeyFile == "" {
		return errors.New("issuer: a listen address, a certificate and its key are needed to serve")
	}
	certs, err := newCertReloader(i.cfg.CertFile, i.cfg.KeyFile, i.cfg.Logger)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", i.cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("issuer: listen on %s: %w", i.cfg.ListenAddress, err)
	}
	hs := &http.Server{
		Handler:           i.handler,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          nil,
	}
	ringCtx, stopRing := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = i.ring.Run(ringCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- hs.ServeTLS(ln, "", "") }()
	i.cfg.Logger.Info("Issuer serving", "address", ln.Addr().String(), "issuer", i.cfg.IssuerURL,
		"secret", i.cfg.Namespace+"/"+i.cfg.SecretName)
	var result error
	select {
	case err := <-served:
		result = fmt.Errorf("issuer: serving on %s: %w", i.cfg.ListenAddress, err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		if err := hs.Shutdown(sctx); err != nil {
			_ = hs.Close()
		}
		cancel()
		<-served
	}
	stopRing()
	wg.Wait()
	return result
}

// Cluster is the shared server's Cluster (pkg/issuer) of a controller-runtime client that reads
// from the API server.
type Cluster struct{ Client client.Client }

// ReviewToken creates the TokenReview; the API server fills its status.
func (c Cluster) ReviewToken(ctx context.Context, tr *authenticationv1.TokenReview) (*authenticationv1.TokenReview, error) {
	out := tr.DeepCopy()
	if err := c.Client.Create(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetPod reads the Pod.
func (c Cluster) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
		return nil, err
	}
	return &pod, nil
}
