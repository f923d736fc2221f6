package grant

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
)

// MaxDocumentSize bounds the discovery document and the JWKS, 1 MiB. A
// larger body is refused without reading the rest of it.
const MaxDocumentSize = 1 << 20

// Defaults of CacheOptions.
const (
	// DefaultMaxStale is how old the last successful key load may be before
	// tokens become unverifiable: 24 hours, so an issuer outage of a day
	// does not stop admissions, while a retired key is not trusted forever.
	DefaultMaxStale = 24 * time.Hour
	// DefaultMinRefreshInterval spaces the refreshes an unknown kid
	// triggers: one a minute at most.
	DefaultMinRefreshInterval = time.Minute
	// DefaultRequestTimeout bounds each HTTP request of a refresh.
	DefaultRequestTimeout = 10 * time.Second
)

// wellKnown is the OIDC discovery path appended to the issuer URL.
const wellKnown = "/.well-known/openid-configuration"

// CacheOptions tunes a Cache. The zero value is usable: every field has a
// default, applied by NewCache without I/O.
type CacheOptions struct {
	// HTTPClient fetches the discovery document and the JWKS. Default a
	// client with Timeout DefaultRequestTimeout and the system roots; pass
	// one with a custom TLS configuration to trust a private CA.
	HTTPClient *http.Client
	// RequestTimeout bounds each request of a refresh, on top of ctx and
	// of HTTPClient's own timeout. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// MaxStale is how old the last successful load may be before Key
	// answers core.ErrUnverifiable. Default DefaultMaxStale (24h).
	MaxStale time.Duration
	// MinRefreshInterval is the least time between two refreshes started
	// by Key (an unknown kid, keys never loaded or stale). Refresh itself
	// is never limited, but counts. Default DefaultMinRefreshInterval (1m).
	MinRefreshInterval time.Duration
	// Clock reads the time for staleness and the refresh limit. Default
	// clock.RealClock{}.
	Clock clock.PassiveClock
	// Logger logs refreshes: failures at V(1), successes at V(2). The owner
	// that drives Refresh logs an outage, once when it starts and once when
	// it ends; a failed refresh Key starts reaches the caller as its error.
	// The zero Logger means klog.Background(); note that logr.Discard() is
	// the zero Logger too, so for silence pass a logger with a sink that
	// drops lines.
	Logger logr.Logger
}

// Validate reports the first option that is wrong, and how to fix it.
func (o CacheOptions) Validate() error {
	switch {
	case o.RequestTimeout < 0:
		return fmt.Errorf("grant cache: RequestTimeout %v is negative: use 0 for the default %v: %w", o.RequestTimeout, DefaultRequestTimeout, core.ErrInvalid)
	case o.MaxStale < 0:
		return fmt.Errorf("grant cache: MaxStale %v is negative: use 0 for the default %v: %w", o.MaxStale, DefaultMaxStale, core.ErrInvalid)
	case o.MinRefreshInterval < 0:
		return fmt.Errorf("grant cache: MinRefreshInterval %v is negative: use 0 for the default %v: %w", o.MinRefreshInterval, DefaultMinRefreshInterval, core.ErrInvalid)
	}
	return nil
}

// withDefaults returns o with its zero fields defaulted. It does no I/O.
func (o CacheOptions) withDefaults() CacheOptions {
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: o.RequestTimeout}
	}
	if o.MaxStale == 0 {
		o.MaxStale = DefaultMaxStale
	}
	if o.MinRefreshInterval == 0 {
		o.MinRefreshInterval = DefaultMinRefreshInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
	return o
}

// Cache is the issuer's key set, found by OIDC discovery: Refresh reads
// <issuer>/.well-known/openid-configuration, checks that its issuer is the
// configured one, and loads the JWKS at its jwks_uri. The set holds several
// kids at once, so an issuer can rotate keys by publishing the new one before
// signing with it.
//
// The Cache has no goroutine of its own: its owner, the home's Run
// (pkg/home/standalone or pkg/home/kubernetes), calls Refresh on its own
// schedule, and Key refreshes on demand. It is safe for concurrent use.
type Cache struct {
	issuer    string
	discovery string
	opts      CacheOptions

	// fetchMu serialises refreshes; it is held across the HTTP requests.
	fetchMu     sync.Mutex
	lastAttempt time.Time // guarded by fetchMu

	mu        sync.RWMutex
	keys      map[string]jose.JSONWebKey
	loadedAt  time.Time // last successful load; zero when never loaded
	lastErr   error     // last refresh failure, nil after a success
	attempted time.Time // lastAttempt, for RefreshIn, which must not wait for a refresh in flight
}

// NewCache returns an empty cache of issuerURL's keys. issuerURL must be an
// absolute https URL, or http to a loopback host (a development issuer), with
// no query or fragment. NewCache does no I/O: the keys load on the first
// Refresh or Key.
func NewCache(issuerURL string, opts CacheOptions) (*Cache, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := checkURL("issuer URL", issuerURL); err != nil {
		return nil, fmt.Errorf("grant cache: %v: %w", err, core.ErrInvalid)
	}
	return &Cache{
		issuer:    issuerURL,
		discovery: strings.TrimSuffix(issuerURL, "/") + wellKnown,
		opts:      opts.withDefaults(),
	}, nil
}

// Issuer is the issuer URL the cache was built with.
func (c *Cache) Issuer() string { return c.issuer }

// LastRefresh is when the key set was last loaded successfully, by the
// cache's clock; zero when it never was. A home counts its advance as a
// sign the issuer is alive.
func (c *Cache) LastRefresh() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.loadedAt
}

// RefreshIn is how long, by the cache's clock, until the owner's
// background refresh is due, by the keys' own lifetime: half of MaxStale
// after the last successful load, so a refresh that fails leaves the other
// half for retries, as a grant is renewed at half its lease. While the set
// never loaded or the last refresh failed, it is due MinRefreshInterval
// after the last attempt; it is never due sooner than that. It is 0 (due
// now) before any attempt, and never negative. A refresh Key starts counts
// like any other. The Kubernetes home's Run sleeps this long between
// refreshes.
func (c *Cache) RefreshIn() time.Duration {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.attempted.IsZero() {
		return 0
	}
	due := c.attempted.Add(c.opts.MinRefreshInterval)
	if !c.loadedAt.IsZero() && c.lastErr == nil {
		if half := c.loadedAt.Add(c.opts.MaxStale / 2); half.After(due) {
			due = half
		}
	}
	return max(due.Sub(c.opts.Clock.Now()), 0)
}

// Refresh loads the key set now, whatever the time since the last refresh,
// and replaces the cached set when it succeeds. On failure the previous set
// stays, and ages towards MaxStale. The error names the issuer and the step
// that failed. Refreshes are serialised: a Refresh waits for one in flight.
func (c *Cache) Refresh(ctx context.Context) error {
	c.fetchMu.Lock()
	defer c.fetchMu.Unlock()
	return c.refreshLocked(ctx)
}

// refreshLocked fetches and stores the key set. fetchMu must be held.
func (c *Cache) refreshLocked(ctx context.Context) error {
	c.lastAttempt = c.opts.Clock.Now()
	c.mu.Lock()
	c.attempted = c.lastAttempt
	c.mu.Unlock()
	keys, err := c.fetch(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.lastErr = err
		c.opts.Logger.V(1).Info("Issuer keys refresh failed", "issuer", c.issuer, "err", err)
		return err
	}
	c.keys = keys
	c.loadedAt = c.opts.Clock.Now()
	c.lastErr = nil
	c.opts.Logger.V(2).Info("Issuer keys refreshed", "issuer", c.issuer, "keys", len(keys))
	return nil
}

// Key returns the public key kid.
//
// A known kid in a fresh set is answered from memory. An unknown kid, a set
// never loaded, or one whose last load is older than MaxStale triggers one
// refresh, unless a refresh started less than MinRefreshInterval ago. Then:
// a set never loaded or still stale answers an error wrapping
// core.ErrUnverifiable; an unknown kid in a fresh set answers one wrapping
// core.ErrUnauthenticated ("unknown kid"). A call that needs a refresh
// waits for one already in flight; each request of a refresh is bounded by
// RequestTimeout and ctx. The Verifier calls Key for every token.
func (c *Cache) Key(ctx context.Context, kid string) (*jose.JSONWebKey, error) {
	if k, err := c.lookup(kid); err == nil {
		return k, nil
	}
	c.fetchMu.Lock()
	if c.lastAttempt.IsZero() || !c.opts.Clock.Now().Before(c.lastAttempt.Add(c.opts.MinRefreshInterval)) {
		// The error is kept in lastErr and reported by lookup below.
		_ = c.refreshLocked(ctx)
	}
	c.fetchMu.Unlock()
	return c.lookup(kid)
}

// lookup answers kid from the cached set.
func (c *Cache) lookup(kid string) (*jose.JSONWebKey, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.loadedAt.IsZero() {
		if c.lastErr != nil {
			return nil, fmt.Errorf("issuer %q keys never loaded (%v): %w", c.issuer, c.lastErr, core.ErrUnverifiable)
		}
		return nil, fmt.Errorf("issuer %q keys never loaded: %w", c.issuer, core.ErrUnverifiable)
	}
	if age := c.opts.Clock.Since(c.loadedAt); age > c.opts.MaxStale {
		return nil, fmt.Errorf("issuer %q keys loaded %v ago, over the max staleness %v: %w", c.issuer, age.Round(time.Second), c.opts.MaxStale, core.ErrUnverifiable)
	}
	k, ok := c.keys[kid]
	if !ok {
		return nil, fmt.Errorf("kid %s: unknown kid for issuer %q: %w", printable(kid), c.issuer, core.ErrUnauthenticated)
	}
	return &k, nil
}

// fetch reads the discovery document, then the JWKS it points to.
func (c *Cache) fetch(ctx context.Context) (map[string]jose.JSONWebKey, error) {
	body, err := c.get(ctx, c.discovery)
	if err != nil {
		return nil, fmt.Errorf("issuer %q: discovery: %w", c.issuer, err)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("issuer %q: discovery document is not JSON: %v", c.issuer, err)
	}
	if strings.TrimSuffix(doc.Issuer, "/") != strings.TrimSuffix(c.issuer, "/") {
		return nil, fmt.Errorf("issuer %q: discovery document names issuer %q", c.issuer, doc.Issuer)
	}
	if err := checkURL("jwks_uri", doc.JWKSURI); err != nil {
		return nil, fmt.Errorf("issuer %q: discovery: %v", c.issuer, err)
	}
	body, err = c.get(ctx, doc.JWKSURI)
	if err != nil {
		return nil, fmt.Errorf("issuer %q: jwks %s: %w", c.issuer, doc.JWKSURI, err)
	}
	keys, err := parseJWKS(body)
	if err != nil {
		return nil, fmt.Errorf("issuer %q: jwks %s: %w", c.issuer, doc.JWKSURI, err)
	}
	return keys, nil
}

// get fetches u, refusing any status but 200 and any body over
// MaxDocumentSize.
func (c *Cache) get(ctx context.Context, u string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %s", u, resp.Status)
	}
	if resp.ContentLength > MaxDocumentSize {
		return nil, fmt.Errorf("GET %s: body of %d bytes is over the limit of %d", u, resp.ContentLength, MaxDocumentSize)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDocumentSize+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", u, err)
	}
	if len(body) > MaxDocumentSize {
		return nil, fmt.Errorf("GET %s: body is over the limit of %d bytes", u, MaxDocumentSize)
	}
	return body, nil
}

// checkURL accepts an absolute https URL, or http to a loopback host, with
// no query, fragment or user info.
func checkURL(what, s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%s %q: %v", what, s, err)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s %q must be an absolute URL with a host and no user, query or fragment", what, s)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if endpoint.IsLoopbackHost(u.Hostname()) {
			return nil
		}
	}
	return fmt.Errorf("%s %q must be https (http only to a loopback host)", what, s)
}

// parseJWKS reads a JWK set of public signing keys. The whole set is refused
// if any member holds private or symmetric key material, lacks a kid, repeats
// a kid, or is not valid JSON. Public keys that cannot check an allowed
// algorithm (RSA, other curves) or whose "use" is not "sig" are left out, so
// an issuer may publish them for other purposes.
func parseJWKS(data []byte) (map[string]jose.JSONWebKey, error) {
	if len(data) > MaxDocumentSize {
		return nil, fmt.Errorf("JWKS of %d bytes is over the limit of %d", len(data), MaxDocumentSize)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("JWKS is not a JSON key set: %v", err)
	}
	if set.Keys == nil {
		return nil, errors.New(`JWKS has no "keys" member`)
	}
	keys := make(map[string]jose.JSONWebKey, len(set.Keys))
	for i, raw := range set.Keys {
		var params map[string]json.RawMessage
		if err := json.Unmarshal(raw, &params); err != nil {
			return nil, fmt.Errorf("JWKS key %d is not a JSON object: %v", i, err)
		}
		for _, p := range []string{"d", "p", "q", "dp", "dq", "qi", "k", "priv", "oth"} {
			if _, ok := params[p]; ok {
				return nil, fmt.Errorf("JWKS key %d holds private or symmetric key material (%q): refused", i, p)
			}
		}
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("JWKS key %d: %v", i, err)
		}
		if !k.IsPublic() || !k.Valid() {
			return nil, fmt.Errorf("JWKS key %d (kid %s) is not a valid public key: refused", i, printable(k.KeyID))
		}
		if k.KeyID == "" {
			return nil, fmt.Errorf("JWKS key %d has no kid", i)
		}
		if _, dup := keys[k.KeyID]; dup {
			return nil, fmt.Errorf("JWKS repeats kid %s", printable(k.KeyID))
		}
		if !signingKey(k) {
			continue
		}
		keys[k.KeyID] = k
	}
	return keys, nil
}

// signingKey reports whether k can check an allowed algorithm and is not
// marked for another use.
func signingKey(k jose.JSONWebKey) bool {
	if k.Use != "" && k.Use != "sig" {
		return false
	}
	switch key := k.Key.(type) {
	case ed25519.PublicKey:
		return k.Algorithm == "" || k.Algorithm == string(jose.EdDSA)
	case *ecdsa.PublicKey:
		return key.Curve == elliptic.P256() && (k.Algorithm == "" || k.Algorithm == string(jose.ES256))
	}
	return false
}

// StaticKeys is a fixed set of issuer public keys read from a local JWKS,
// for fiberd -issuer-keys FILE: tokens are verified offline, and the set
// never goes stale. It is safe for concurrent use.
type StaticKeys struct {
	keys map[string]jose.JSONWebKey
}

// NewStaticKeys reads a JWKS document as parseJWKS does: private or
// symmetric keys, keys without a kid and repeated kids refuse the whole set;
// keys that cannot check EdDSA or ES256 are left out. A set left with no
// usable key is an error too. Errors wrap core.ErrInvalid.
func NewStaticKeys(jwksJSON []byte) (*StaticKeys, error) {
	keys, err := parseJWKS(jwksJSON)
	if err != nil {
		return nil, fmt.Errorf("issuer keys: %v: %w", err, core.ErrInvalid)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("issuer keys: no EdDSA or ES256 signing key in the set: %w", core.ErrInvalid)
	}
	return &StaticKeys{keys: keys}, nil
}

// ReadStaticKeys reads the JWKS file path (at most MaxDocumentSize bytes)
// and returns its keys, as NewStaticKeys does.
func ReadStaticKeys(path string) (*StaticKeys, error) {
	data, err := core.ReadFileBounded(path, MaxDocumentSize)
	if err != nil {
		return nil, fmt.Errorf("issuer keys %s: %w", path, err)
	}
	s, err := NewStaticKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Key returns the key kid, or an error wrapping core.ErrUnauthenticated
// ("unknown kid"). It never answers core.ErrUnverifiable.
func (s *StaticKeys) Key(_ context.Context, kid string) (*jose.JSONWebKey, error) {
	k, ok := s.keys[kid]
	if !ok {
		return nil, fmt.Errorf("kid %s: unknown kid in the local issuer keys: %w", printable(kid), core.ErrUnauthenticated)
	}
	return &k, nil
}

// KeyIDs lists the kids of the set, for logs.
func (s *StaticKeys) KeyIDs() []string {
	ids := make([]string, 0, len(s.keys))
	for id := range s.keys {
		ids = append(ids, id)
	}
	return ids
}
