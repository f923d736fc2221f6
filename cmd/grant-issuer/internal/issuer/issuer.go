package issuer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
)

// Annotations of a grant Pod that the issuer reads its grant from.
const (
	// AnnotationTemplate names the template the Pod's grant runs,
	// "name@sha256:<64 hex>". It is the grant annotation: while the key is
	// absent the Pod has no grant yet (404); present but malformed is a
	// refusal (403).
	AnnotationTemplate = "fiberd.io/template"
	// AnnotationFibersMax is the grant's fibers.max, a decimal integer of at
	// least 1. Absent or malformed while AnnotationTemplate is present is a
	// refusal (403).
	AnnotationFibersMax = "fiberd.io/fibers-max"
)

// Names the shared server (pkg/issuer) defines, kept here for this
// package's callers.
const (
	ExtraPodName = shared.ExtraPodName
	ExtraPodUID  = shared.ExtraPodUID

	PathDiscovery = shared.PathDiscovery
	PathJWKS      = shared.PathJWKS
	PathGrant     = shared.PathGrant
	PathHealthz   = shared.PathHealthz

	// DefaultLease is the lease of a minted grant: 10 minutes.
	DefaultLease = shared.DefaultLease
	// DefaultReviewTimeout bounds the API calls of one grant request.
	DefaultReviewTimeout = shared.DefaultReviewTimeout
)

// maxBearer bounds the bearer token read from a request.
const maxBearer = shared.MaxBearer

// Config is what New needs. cmd/grant-issuer fills it from flags.
type Config struct {
	// IssuerURL is the issuer's own URL: the iss of every grant, the
	// discovery document's issuer, and the base of its jwks_uri. Required:
	// an absolute https URL with no query, fragment or trailing slash. Its
	// path, if any, prefixes every route.
	IssuerURL string
	// Audience is the audience the bearer token must carry, asked of the
	// TokenReview. Empty means IssuerURL, which is what a grant Pod's
	// projected token names.
	Audience string
	// Signer mints the grants. Required.
	Signer *grant.Signer
	// Keys are the keys published in the JWKS, private or public (only the
	// public halves are served). Required: one of them must have the
	// Signer's kid. More keys let fiberd trust the next key before the
	// issuer signs with it.
	Keys []jose.JSONWebKey
	// Kube is the cluster that reviews tokens and holds the Pods. Required.
	// The issuer's account needs create on tokenreviews and get on pods.
	Kube kubernetes.Interface
	// Lease is the lease of every minted grant. Default DefaultLease; at
	// least one second.
	Lease time.Duration
	// ReviewTimeout bounds the TokenReview and the Pod read of one request.
	// Default DefaultReviewTimeout.
	ReviewTimeout time.Duration
	// Clock stamps iat. Default the real clock.
	Clock clock.PassiveClock
	// Logger receives one line per grant and per refusal. Default klog's.
	Logger logr.Logger
}

// withDefaults returns c with every empty field defaulted. It does no I/O.
func (c Config) withDefaults() Config {
	if c.Audience == "" {
		c.Audience = c.IssuerURL
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.ReviewTimeout == 0 {
		c.ReviewTimeout = DefaultReviewTimeout
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger.GetSink() == nil {
		c.Logger = klog.Background()
	}
	return c
}

// Validate reports the first thing wrong with c, after defaults, and how to
// fix it.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.IssuerURL == "" {
		return errors.New("issuer: Config.IssuerURL is empty: set the issuer's own https URL")
	}
	if err := shared.ValidIssuerURL(c.IssuerURL); err != nil {
		return fmt.Errorf("issuer: Config.IssuerURL: %w", err)
	}
	if c.Signer == nil {
		return errors.New("issuer: Config.Signer is nil: make one with grant.NewSigner")
	}
	if !slices.ContainsFunc(c.Keys, func(k jose.JSONWebKey) bool { return k.KeyID == c.Signer.KeyID() }) {
		return fmt.Errorf("issuer: Config.Keys has no key with the signer's kid %q: publish the signing key", c.Signer.KeyID())
	}
	if c.Kube == nil {
		return errors.New("issuer: Config.Kube is nil: pass a clientset of the cluster")
	}
	if c.Lease < time.Second {
		return fmt.Errorf("issuer: Config.Lease %v: must be at least 1s", c.Lease)
	}
	if c.ReviewTimeout < 0 {
		return fmt.Errorf("issuer: Config.ReviewTimeout %v: must not be negative", c.ReviewTimeout)
	}
	return nil
}

// Server is the development issuer's HTTP handler: pkg/issuer's Server
// with a Policy that reads the Pod's annotations. It is safe for concurrent
// use and holds no goroutine of its own; the caller serves it (with TLS).
type Server struct {
	*shared.Server
}

// New validates cfg and builds the handler. It does no I/O.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	set, err := shared.NewSignerKeySet(cfg.Signer, cfg.Keys...)
	if err != nil {
		return nil, fmt.Errorf("issuer: Config.Keys: %w", err)
	}
	srv, err := shared.New(shared.Config{
		IssuerURL:     cfg.IssuerURL,
		Audience:      cfg.Audience,
		Keys:          shared.StaticKeys{Set: set},
		Policy:        shared.PolicyFunc(annotationTerms),
		Cluster:       Clientset{cfg.Kube},
		Lease:         cfg.Lease,
		ReviewTimeout: cfg.ReviewTimeout,
		Clock:         cfg.Clock,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Server{Server: srv}, nil
}

// annotationTerms reads the grant from the Pod's annotations.
func annotationTerms(_ context.Context, pod *corev1.Pod) (shared.Terms, error) {
	ref := pod.Namespace + "/" + pod.Name
	template, ok := pod.Annotations[AnnotationTemplate]
	if !ok {
		return shared.Terms{}, shared.NotYet("pod %s has no %s annotation yet: no grant assigned", ref, AnnotationTemplate)
	}
	if err := grant.ValidTemplate(template); err != nil {
		return shared.Terms{}, shared.Refuse("pod %s: annotation %s: %v", ref, AnnotationTemplate, err)
	}
	maxText, ok := pod.Annotations[AnnotationFibersMax]
	if !ok {
		return shared.Terms{}, shared.Refuse("pod %s has %s but no %s annotation", ref, AnnotationTemplate, AnnotationFibersMax)
	}
	max, err := strconv.Atoi(maxText)
	if err != nil || max < 1 {
		return shared.Terms{}, shared.Refuse("pod %s: annotation %s %q: want an integer of at least 1", ref, AnnotationFibersMax, maxText)
	}
	return shared.Terms{Template: template, Fibers: core.Fibers{Max: max}}, nil
}

// Clientset is the shared server's Cluster of a client-go clientset.
type Clientset struct{ Kube kubernetes.Interface }

// ReviewToken creates the TokenReview.
func (c Clientset) ReviewToken(ctx context.Context, tr *authenticationv1.TokenReview) (*authenticationv1.TokenReview, error) {
	return c.Kube.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
}

// GetPod reads the Pod from the API server.
func (c Clientset) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}
