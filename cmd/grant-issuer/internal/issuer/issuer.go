package issuer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
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

// Keys of a TokenReview's status.user.extra that the API server fills for a
// token bound to a Pod.
const (
	ExtraPodName = "authentication.kubernetes.io/pod-name"
	ExtraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Paths the server answers, relative to the issuer URL's path.
const (
	// PathDiscovery is the OIDC discovery document.
	PathDiscovery = "/.well-known/openid-configuration"
	// PathJWKS is the JWK set, the discovery document's jwks_uri.
	PathJWKS = "/openid/v1/jwks"
	// PathGrant is the grant exchange.
	PathGrant = "/v1/grant"
	// PathHealthz answers 200 "ok" while the server runs.
	PathHealthz = "/healthz"
)

// Defaults of Config.
const (
	// DefaultLease is the lease of a minted grant: 10 minutes.
	DefaultLease = 10 * time.Minute
	// DefaultReviewTimeout bounds the API calls of one grant request.
	DefaultReviewTimeout = 10 * time.Second
)

// maxBearer bounds the bearer token read from a request. A service-account
// token is about 1 KiB; a longer header is refused unread by the API server.
const maxBearer = 16 << 10

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
	u, err := url.Parse(c.IssuerURL)
	if err != nil {
		return fmt.Errorf("issuer: Config.IssuerURL %q: %v", c.IssuerURL, err)
	}
	if u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("issuer: Config.IssuerURL %q: want an absolute https URL with a host and no user, query or fragment", c.IssuerURL)
	}
	if strings.HasSuffix(c.IssuerURL, "/") {
		return fmt.Errorf("issuer: Config.IssuerURL %q ends in '/': drop the trailing slash", c.IssuerURL)
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

// Server is the issuer's HTTP handler. It is safe for concurrent use and
// holds no goroutine of its own; the caller serves it (with TLS).
type Server struct {
	cfg       Config
	mux       *http.ServeMux
	discovery []byte
	jwks      []byte
}

// New validates cfg and builds the handler. It does no I/O.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	jwks, err := grant.PublicJWKS(cfg.Keys...)
	if err != nil {
		return nil, fmt.Errorf("issuer: Config.Keys: %w", err)
	}
	algs := []string{}
	seen := map[string]bool{}
	for _, k := range cfg.Keys {
		if k.Algorithm != "" && !seen[k.Algorithm] {
			seen[k.Algorithm] = true
			algs = append(algs, k.Algorithm)
		}
	}
	prefix := mustPath(cfg.IssuerURL)
	discovery, err := json.Marshal(map[string]any{
		"issuer":                                cfg.IssuerURL,
		"jwks_uri":                              cfg.IssuerURL + PathJWKS,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": algs,
	})
	if err != nil {
		return nil, fmt.Errorf("issuer: discovery document: %w", err)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), discovery: discovery, jwks: jwks}
	s.mux.HandleFunc(prefix+PathDiscovery, s.document("application/json", s.discovery))
	s.mux.HandleFunc(prefix+PathJWKS, s.document("application/jwk-set+json", s.jwks))
	s.mux.HandleFunc(prefix+PathGrant, s.serveGrant)
	s.mux.HandleFunc(prefix+PathHealthz, s.document("text/plain; charset=utf-8", []byte("ok\n")))
	return s, nil
}

// mustPath is the path of a URL Validate accepted.
func mustPath(raw string) string {
	u, _ := url.Parse(raw)
	return u.EscapedPath()
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// document serves a fixed body to GET and HEAD.
func (s *Server) document(contentType string, body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(body)
	}
}

// refusal is a grant request answered with something other than a grant.
type refusal struct {
	status int
	reason string
}

func refuse(status int, format string, args ...any) *refusal {
	return &refusal{status: status, reason: fmt.Sprintf(format, args...)}
}

// podRef names a Pod in logs and refusals: namespace/name.
type podRef struct {
	namespace, name, uid, serviceAccount string
}

func (p podRef) String() string {
	if p.name == "" {
		return ""
	}
	return p.namespace + "/" + p.name
}

// serveGrant is GET /v1/grant.
func (s *Server) serveGrant(w http.ResponseWriter, r *http.Request) {
	var ref podRef
	tok, rf := s.grant(r, &ref)
	if rf != nil {
		s.cfg.Logger.Info("grant refused", "status", rf.status, "reason", rf.reason,
			"pod", ref.String(), "podUID", ref.uid, "remote", r.RemoteAddr)
		if rf.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", "GET, HEAD")
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, rf.reason, rf.status)
		return
	}
	w.Header().Set("Content-Type", "application/jwt")
	w.Header().Set("Content-Length", strconv.Itoa(len(tok)))
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(tok)
}

// grant runs the exchange described in the package documentation and
// returns the minted token or the refusal. ref is filled in as the Pod
// becomes known.
func (s *Server) grant(r *http.Request, ref *podRef) ([]byte, *refusal) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return nil, refuse(http.StatusMethodNotAllowed, "method %s not allowed: use GET", r.Method)
	}
	token, rf := bearer(r)
	if rf != nil {
		return nil, rf
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReviewTimeout)
	defer cancel()
	if rf := s.review(ctx, token, ref); rf != nil {
		return nil, rf
	}
	g, rf := s.podGrant(ctx, *ref)
	if rf != nil {
		return nil, rf
	}
	tok, err := s.cfg.Signer.Mint(g)
	if err != nil {
		return nil, refuse(http.StatusInternalServerError, "minting the grant failed: %v", err)
	}
	s.cfg.Logger.Info("grant issued", "pod", ref.String(), "podUID", g.UID, "template", g.Template,
		"fibersMax", g.Fibers.Max, "expiry", g.Expiry.UTC().Format(time.RFC3339), "remote", r.RemoteAddr)
	return tok, nil
}

// bearer reads the request's bearer token.
func bearer(r *http.Request) (string, *refusal) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", refuse(http.StatusUnauthorized, "no Authorization header: send the Pod's bound service-account token as a bearer token")
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", refuse(http.StatusUnauthorized, "Authorization is not a bearer token")
	}
	token = strings.TrimSpace(token)
	switch {
	case token == "":
		return "", refuse(http.StatusUnauthorized, "the bearer token is empty")
	case len(token) > maxBearer:
		return "", refuse(http.StatusUnauthorized, "the bearer token is longer than %d bytes", maxBearer)
	case strings.ContainsAny(token, " \t\r\n"):
		return "", refuse(http.StatusUnauthorized, "the bearer token holds white space")
	}
	return token, nil
}

// review asks the API server who token is, and fills ref with the Pod it is
// bound to.
func (s *Server) review(ctx context.Context, token string, ref *podRef) *refusal {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
		Token:     token,
		Audiences: []string{s.cfg.Audience},
	}}
	res, err := s.cfg.Kube.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return refuse(http.StatusServiceUnavailable, "token review failed: %v", err)
	}
	st := res.Status
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "no reason given"
		}
		return refuse(http.StatusUnauthorized, "token not authenticated for audience %q: %s", s.cfg.Audience, why)
	}
	if !slices.Contains(st.Audiences, s.cfg.Audience) {
		return refuse(http.StatusUnauthorized, "token review did not confirm audience %q (got %q)", s.cfg.Audience, st.Audiences)
	}
	parts := strings.Split(st.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" || parts[2] == "" || parts[3] == "" {
		return refuse(http.StatusForbidden, "user %q is not a service account", st.User.Username)
	}
	ref.namespace, ref.serviceAccount = parts[2], parts[3]
	name, err := oneExtra(st.User.Extra, ExtraPodName)
	if err != nil {
		return refuse(http.StatusForbidden, "token of %s/%s is not bound to a Pod: %v", ref.namespace, ref.serviceAccount, err)
	}
	uid, err := oneExtra(st.User.Extra, ExtraPodUID)
	if err != nil {
		return refuse(http.StatusForbidden, "token of %s/%s is not bound to a Pod: %v", ref.namespace, ref.serviceAccount, err)
	}
	ref.name, ref.uid = name, uid
	return nil
}

// oneExtra is the single non-empty value of extra[key].
func oneExtra(extra map[string]authenticationv1.ExtraValue, key string) (string, error) {
	v := extra[key]
	if len(v) != 1 || v[0] == "" {
		return "", fmt.Errorf("want one %s in the review, got %d", key, len(v))
	}
	return v[0], nil
}

// podGrant reads the Pod ref names and builds its grant.
func (s *Server) podGrant(ctx context.Context, ref podRef) (core.Grant, *refusal) {
	pod, err := s.cfg.Kube.CoreV1().Pods(ref.namespace).Get(ctx, ref.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s does not exist", ref)
	case err != nil:
		return core.Grant{}, refuse(http.StatusServiceUnavailable, "reading pod %s failed: %v", ref, err)
	}
	if string(pod.UID) != ref.uid {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s has UID %s, the token is bound to UID %s: the Pod was replaced", ref, pod.UID, ref.uid)
	}
	if pod.DeletionTimestamp != nil {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s is terminating", ref)
	}
	if pod.Spec.ServiceAccountName != ref.serviceAccount {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s runs as service account %q, the token is of %q", ref, pod.Spec.ServiceAccountName, ref.serviceAccount)
	}
	template, ok := pod.Annotations[AnnotationTemplate]
	if !ok {
		return core.Grant{}, refuse(http.StatusNotFound, "pod %s has no %s annotation yet: no grant assigned", ref, AnnotationTemplate)
	}
	if err := grant.ValidTemplate(template); err != nil {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s: annotation %s: %v", ref, AnnotationTemplate, err)
	}
	maxText, ok := pod.Annotations[AnnotationFibersMax]
	if !ok {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s has %s but no %s annotation", ref, AnnotationTemplate, AnnotationFibersMax)
	}
	max, err := strconv.Atoi(maxText)
	if err != nil || max < 1 {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s: annotation %s %q: want an integer of at least 1", ref, AnnotationFibersMax, maxText)
	}
	if err := grant.ValidUID(ref.uid); err != nil {
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s: UID %q cannot name a grant: %v", ref, ref.uid, err)
	}
	now := s.cfg.Clock.Now().Truncate(time.Second)
	return core.Grant{
		UID:      ref.uid,
		Issuer:   s.cfg.IssuerURL,
		Audience: pod.Name,
		Template: template,
		Fibers:   core.Fibers{Max: max},
		IssuedAt: now,
		Expiry:   now.Add(s.cfg.Lease),
	}, nil
}
