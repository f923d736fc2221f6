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

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
)

// Keys of a TokenReview's status.user.extra that the API server fills for a
// token bound to a Pod. ExtraNodeName is there from Kubernetes 1.30 on
// (ServiceAccountTokenPodNodeInfo).
const (
	ExtraPodName  = "authentication.kubernetes.io/pod-name"
	ExtraPodUID   = "authentication.kubernetes.io/pod-uid"
	ExtraNodeName = "authentication.kubernetes.io/node-name"
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
	// DefaultLease is the lease of a grant whose Terms name none: 10
	// minutes.
	DefaultLease = 10 * time.Minute
	// DefaultReviewTimeout bounds the API calls of one grant request.
	DefaultReviewTimeout = 10 * time.Second
)

// MaxBearer bounds the bearer token read from a request. A service-account
// token is about 1 KiB; a longer header is refused unread by the API server.
const MaxBearer = 16 << 10

// Terms is what a Policy decides of a Pod's grant. The Server adds what
// binds the grant to the Pod and the issuer: UID, audience, issuer and the
// times.
type Terms struct {
	// Template is the grant's template, "name@sha256:<64 hex>".
	Template string
	// Fibers is the grant's capacity; Max at least 1, Warm at most Max.
	Fibers core.Fibers
	// WBudget is the bytes one fiber may dirty; zero is no budget.
	WBudget int64
	// Lease is how long the grant is issued for. Zero means Config.Lease.
	Lease time.Duration
}

// Policy decides the grant of a Pod whose bound token the Server reviewed
// and which it read and checked (UID, service account, node, not
// terminating). It answers the Terms, or a Refusal made by NotYet, Refuse or
// Unavailable; any other error is answered 503 with its text. It is called
// concurrently and must honour ctx, which bounds the whole request.
type Policy interface {
	Terms(ctx context.Context, pod *corev1.Pod) (Terms, error)
}

// PolicyFunc is a Policy of one function.
type PolicyFunc func(ctx context.Context, pod *corev1.Pod) (Terms, error)

// Terms calls f.
func (f PolicyFunc) Terms(ctx context.Context, pod *corev1.Pod) (Terms, error) { return f(ctx, pod) }

// Refusal is a grant request answered with something other than a grant: an
// HTTP status and the reason, which is sent as the body and logged.
type Refusal struct {
	Status int
	Reason string
}

// Error is the reason.
func (r *Refusal) Error() string { return r.Reason }

func refuse(status int, format string, args ...any) *Refusal {
	return &Refusal{Status: status, Reason: fmt.Sprintf(format, args...)}
}

// NotYet is a Policy's answer for a Pod that will have a grant but not yet:
// 404, and the home retries.
func NotYet(format string, args ...any) error {
	return refuse(http.StatusNotFound, format, args...)
}

// Refuse is a Policy's answer for a Pod that must not have a grant: 403.
func Refuse(format string, args ...any) error {
	return refuse(http.StatusForbidden, format, args...)
}

// Unavailable is a Policy's answer when it cannot decide now: 503, and the
// home retries.
func Unavailable(format string, args ...any) error {
	return refuse(http.StatusServiceUnavailable, format, args...)
}

// Cluster is what the Server asks of the API server. A client-go clientset
// fits in three lines (see cmd/grant-issuer/internal/issuer); this package
// does not import client-go, which test/layout keeps to pkg/home/kubernetes
// and commands.
type Cluster interface {
	// ReviewToken creates the TokenReview and returns the API server's
	// answer.
	ReviewToken(ctx context.Context, review *authenticationv1.TokenReview) (*authenticationv1.TokenReview, error)
	// GetPod reads a Pod from the API server, not from a cache: the
	// exchange is where a grant is revoked, so it must see a deletion at
	// once. A missing Pod is an error apierrors.IsNotFound recognises.
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// Config is what New needs.
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
	// Keys gives the signing key and the published keys, read on every
	// request. Required.
	Keys Keys
	// Policy decides each Pod's grant. Required.
	Policy Policy
	// Cluster reviews tokens and reads Pods. Required. The issuer's account
	// needs create on tokenreviews and get on pods.
	Cluster Cluster
	// Lease is the lease of a grant whose Terms name none. Default
	// DefaultLease; at least one second.
	Lease time.Duration
	// MaxLease, when set, refuses (403) Terms with a longer lease: an
	// issuer that rotates keys keeps a retired key published for the
	// longest lease it signs, so it must bound it.
	MaxLease time.Duration
	// ReviewTimeout bounds the TokenReview, the Pod read and the Policy of
	// one request. Default DefaultReviewTimeout.
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

// ValidIssuerURL reports whether raw can be an issuer's URL: an absolute
// https URL with a host, no user, query, fragment or trailing slash.
func ValidIssuerURL(raw string) error {
	if raw == "" {
		return errors.New("the issuer URL is empty: set the issuer's own https URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("issuer URL %q: %v", raw, err)
	}
	if u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("issuer URL %q: want an absolute https URL with a host and no user, query or fragment", raw)
	}
	if strings.HasSuffix(raw, "/") {
		return fmt.Errorf("issuer URL %q ends in '/': drop the trailing slash", raw)
	}
	return nil
}

// Validate reports the first thing wrong with c, after defaults, and how to
// fix it.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.IssuerURL == "" {
		return errors.New("issuer: Config.IssuerURL is empty: set the issuer's own https URL")
	}
	if err := ValidIssuerURL(c.IssuerURL); err != nil {
		return fmt.Errorf("issuer: Config.IssuerURL: %w", err)
	}
	switch {
	case c.Keys == nil:
		return errors.New("issuer: Config.Keys is nil: give StaticKeys or a rotating key ring")
	case c.Policy == nil:
		return errors.New("issuer: Config.Policy is nil: say how a Pod's grant is decided")
	case c.Cluster == nil:
		return errors.New("issuer: Config.Cluster is nil: pass the cluster's TokenReview and Pod API")
	case c.Lease < time.Second:
		return fmt.Errorf("issuer: Config.Lease %v: must be at least 1s", c.Lease)
	case c.MaxLease != 0 && c.MaxLease < c.Lease:
		return fmt.Errorf("issuer: Config.MaxLease %v is below Config.Lease %v: raise it, or 0 for no bound", c.MaxLease, c.Lease)
	case c.ReviewTimeout < 0:
		return fmt.Errorf("issuer: Config.ReviewTimeout %v: must not be negative", c.ReviewTimeout)
	}
	return nil
}

// Server is the issuer's HTTP handler. It is safe for concurrent use and
// holds no goroutine of its own; the caller serves it (with TLS).
type Server struct {
	cfg Config
	mux *http.ServeMux
}

// New validates cfg and builds the handler. It does no I/O.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	prefix := mustPath(cfg.IssuerURL)
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.mux.HandleFunc(prefix+PathDiscovery, s.keyDocument("application/json", s.discovery))
	s.mux.HandleFunc(prefix+PathJWKS, s.keyDocument("application/jwk-set+json", func(ks *KeySet) ([]byte, error) { return ks.jwks, nil }))
	s.mux.HandleFunc(prefix+PathGrant, s.serveGrant)
	s.mux.HandleFunc(prefix+PathHealthz, func(w http.ResponseWriter, r *http.Request) {
		writeDocument(w, r, "text/plain; charset=utf-8", []byte("ok\n"))
	})
	return s, nil
}

// mustPath is the path of a URL Validate accepted.
func mustPath(raw string) string {
	u, _ := url.Parse(raw)
	return u.EscapedPath()
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// discovery is the OIDC discovery document of ks.
func (s *Server) discovery(ks *KeySet) ([]byte, error) {
	algs := ks.algs
	if algs == nil {
		algs = []string{}
	}
	return json.Marshal(map[string]any{
		"issuer":                                s.cfg.IssuerURL,
		"jwks_uri":                              s.cfg.IssuerURL + PathJWKS,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": algs,
	})
}

// keyDocument serves a document made from the current key set; 503 while
// there is none.
func (s *Server) keyDocument(contentType string, body func(*KeySet) ([]byte, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ks, err := s.cfg.Keys.KeySet()
		if err != nil {
			http.Error(w, "no keys to publish yet: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		b, err := body(ks)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeDocument(w, r, contentType, b)
	}
}

// writeDocument answers GET and HEAD with body.
func writeDocument(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
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

// podRef names a Pod in logs and refusals: namespace/name.
type podRef struct {
	namespace, name, uid, serviceAccount, node string
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
		s.cfg.Logger.Info("grant refused", "status", rf.Status, "reason", rf.Reason,
			"pod", ref.String(), "podUID", ref.uid, "remote", r.RemoteAddr)
		if rf.Status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", "GET, HEAD")
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, rf.Reason, rf.Status)
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
func (s *Server) grant(r *http.Request, ref *podRef) ([]byte, *Refusal) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return nil, refuse(http.StatusMethodNotAllowed, "method %s not allowed: use GET", r.Method)
	}
	token, rf := bearer(r)
	if rf != nil {
		return nil, rf
	}
	ks, err := s.cfg.Keys.KeySet()
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "no signing key loaded yet: %v", err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReviewTimeout)
	defer cancel()
	if rf := s.review(ctx, token, ref); rf != nil {
		return nil, rf
	}
	pod, rf := s.readPod(ctx, ref)
	if rf != nil {
		return nil, rf
	}
	g, rf := s.podGrant(ctx, pod)
	if rf != nil {
		return nil, rf
	}
	tok, err := ks.signer.Mint(g)
	if err != nil {
		return nil, refuse(http.StatusInternalServerError, "minting the grant failed: %v", err)
	}
	s.cfg.Logger.Info("grant issued", "pod", ref.String(), "podUID", g.UID, "node", pod.Spec.NodeName,
		"template", g.Template, "fibersMax", g.Fibers.Max, "kid", ks.signer.KeyID(),
		"expiry", g.Expiry.UTC().Format(time.RFC3339), "remote", r.RemoteAddr)
	return tok, nil
}

// bearer reads the request's bearer token.
func bearer(r *http.Request) (string, *Refusal) {
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
	case len(token) > MaxBearer:
		return "", refuse(http.StatusUnauthorized, "the bearer token is longer than %d bytes", MaxBearer)
	case strings.ContainsAny(token, " \t\r\n"):
		return "", refuse(http.StatusUnauthorized, "the bearer token holds white space")
	}
	return token, nil
}

// review asks the API server who token is, and fills ref with the Pod it is
// bound to.
func (s *Server) review(ctx context.Context, token string, ref *podRef) *Refusal {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
		Token:     token,
		Audiences: []string{s.cfg.Audience},
	}}
	res, err := s.cfg.Cluster.ReviewToken(ctx, tr)
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
	if _, ok := st.User.Extra[ExtraNodeName]; ok {
		node, err := oneExtra(st.User.Extra, ExtraNodeName)
		if err != nil {
			return refuse(http.StatusForbidden, "token of pod %s: %v", ref, err)
		}
		ref.node = node
	}
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

// readPod reads the Pod ref names and checks it is the one the token is
// bound to, alive.
func (s *Server) readPod(ctx context.Context, ref *podRef) (*corev1.Pod, *Refusal) {
	pod, err := s.cfg.Cluster.GetPod(ctx, ref.namespace, ref.name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, refuse(http.StatusForbidden, "pod %s does not exist", ref)
	case err != nil:
		return nil, refuse(http.StatusServiceUnavailable, "reading pod %s failed: %v", ref, err)
	}
	switch {
	case string(pod.UID) != ref.uid:
		return nil, refuse(http.StatusForbidden, "pod %s has UID %s, the token is bound to UID %s: the Pod was replaced", ref, pod.UID, ref.uid)
	case pod.DeletionTimestamp != nil:
		return nil, refuse(http.StatusForbidden, "pod %s is terminating", ref)
	case pod.Spec.ServiceAccountName != ref.serviceAccount:
		return nil, refuse(http.StatusForbidden, "pod %s runs as service account %q, the token is of %q", ref, pod.Spec.ServiceAccountName, ref.serviceAccount)
	case pod.Spec.NodeName == "":
		return nil, refuse(http.StatusNotFound, "pod %s is not scheduled to a node yet", ref)
	case ref.node != "" && pod.Spec.NodeName != ref.node:
		return nil, refuse(http.StatusForbidden, "pod %s runs on node %s, the token was issued on node %s", ref, pod.Spec.NodeName, ref.node)
	}
	if err := grant.ValidUID(ref.uid); err != nil {
		return nil, refuse(http.StatusForbidden, "pod %s: UID %q cannot name a grant: %v", ref, ref.uid, err)
	}
	return pod, nil
}

// podGrant asks the Policy for pod's terms and builds its grant.
func (s *Server) podGrant(ctx context.Context, pod *corev1.Pod) (core.Grant, *Refusal) {
	ref := podRef{namespace: pod.Namespace, name: pod.Name}
	t, err := s.cfg.Policy.Terms(ctx, pod)
	if err != nil {
		var rf *Refusal
		if errors.As(err, &rf) {
			return core.Grant{}, rf
		}
		return core.Grant{}, refuse(http.StatusServiceUnavailable, "pod %s: deciding its grant failed: %v", ref, err)
	}
	lease := t.Lease
	if lease == 0 {
		lease = s.cfg.Lease
	}
	switch {
	case lease < time.Second:
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s: lease %v is below 1s", ref, lease)
	case s.cfg.MaxLease != 0 && lease > s.cfg.MaxLease:
		return core.Grant{}, refuse(http.StatusForbidden, "pod %s: lease %v is over the issuer's longest, %v: shorten the lease or raise the issuer's bound", ref, lease, s.cfg.MaxLease)
	}
	now := s.cfg.Clock.Now().Truncate(time.Second)
	g := core.Grant{
		UID:      string(pod.UID),
		Issuer:   s.cfg.IssuerURL,
		Audience: pod.Name,
		Template: t.Template,
		Fibers:   t.Fibers,
		WBudget:  t.WBudget,
		IssuedAt: now,
		Expiry:   now.Add(lease.Truncate(time.Second)),
	}
	return g, nil
}
