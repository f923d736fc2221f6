package issuer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
)

// SecretDataKey is the key of the keys Secret's data that holds the key ring, JSON:
//
//	{"keys":[{"jwk":{...private JWK...},"publishedAt":"RFC 3339","activeAt":"RFC 3339"}]}
//
// A key is in the JWKS from publishedAt on, signs from activeAt on (until the next key's
// activeAt), and is dropped once the next key has been signing for Rotation.Retention.
const SecretDataKey = "keys.json"

// Defaults of Rotation.
const (
	// DefaultRotationPeriod is how long one key signs: a day.
	DefaultRotationPeriod = 24 * time.Hour
	// DefaultPrepublish is how long a key is in the JWKS before it signs: longer than fiberd's
	// grant.DefaultMinRefreshInterval (a minute) and than KeyRing's resync, so every fiberd
	// that refreshes its keys for the new kid finds it, and every replica has read it.
	DefaultPrepublish = 15 * time.Minute
	// DefaultResync is how often a KeyRing reads its Secret and rotates when due.
	DefaultResync = time.Minute
)

// maxSyncAttempts bounds the read-plan-write rounds of one Sync that lose a race to another
// writer of the Secret (a conflict, or a create that finds it made).
const maxSyncAttempts = 5

// Rotation is a key ring's schedule.
type Rotation struct {
	// Period is how long one key signs before the next takes over. Default
	// DefaultRotationPeriod.
	Period time.Duration
	// Prepublish is how long a new key is published before it signs. Default
	// DefaultPrepublish; less than Period.
	Prepublish time.Duration
	// Retention is how long a key stays published after the next one took over: the longest
	// lease the issuer signs plus a margin for clock skew, so every grant a key signed expires
	// while it is still published. Required.
	Retention time.Duration
}

func (r Rotation) withDefaults() Rotation {
	if r.Period == 0 {
		r.Period = DefaultRotationPeriod
	}
	if r.Prepublish == 0 {
		r.Prepublish = DefaultPrepublish
	}
	return r
}

// Validate reports a schedule that cannot work, after defaults.
func (r Rotation) Validate() error {
	r = r.withDefaults()
	switch {
	case r.Period < time.Minute:
		return fmt.Errorf("issuer: key rotation period %v: want at least 1m", r.Period)
	case r.Prepublish < 0 || r.Prepublish >= r.Period:
		return fmt.Errorf("issuer: key prepublish %v: want more than 0 and less than the rotation period %v", r.Prepublish, r.Period)
	case r.Retention <= 0:
		return fmt.Errorf("issuer: key retention %v: want the longest lease plus a margin", r.Retention)
	}
	return nil
}

// ringKey is one key of the ring as the Secret holds it.
type ringKey struct {
	JWK         jose.JSONWebKey `json:"jwk"`
	PublishedAt time.Time       `json:"publishedAt"`
	ActiveAt    time.Time       `json:"activeAt"`
}

// ringFile is the Secret's SecretDataKey.
type ringFile struct {
	Keys []ringKey `json:"keys"`
}

// current is the index of the key that signs at now: the last whose ActiveAt is not after now.
// keys are sorted by ActiveAt. Before the first ActiveAt (a replica whose clock is behind the
// one that wrote the ring) it is the first key, which is published.
func current(keys []ringKey, now time.Time) int {
	i := 0
	for j, k := range keys {
		if !k.ActiveAt.After(now) {
			i = j
		}
	}
	return i
}

// plan is the ring at now under schedule r, from keys (sorted by ActiveAt): a first key, active
// at once, when there is none; the next key, published now and active Prepublish later at the
// soonest, once the current key has signed for Period less Prepublish and no next key waits;
// and without the keys whose successor has been signing for Retention. It reports whether
// anything changed. newKey makes a key.
func plan(keys []ringKey, now time.Time, r Rotation, newKey func() (jose.JSONWebKey, error)) ([]ringKey, bool, error) {
	out := slices.Clone(keys)
	changed := false
	if len(out) == 0 {
		k, err := newKey()
		if err != nil {
			return nil, false, err
		}
		out = append(out, ringKey{JWK: k, PublishedAt: now, ActiveAt: now})
		changed = true
	}
	cur := current(out, now)
	if last := out[len(out)-1]; cur == len(out)-1 && !now.Before(last.ActiveAt.Add(r.Period-r.Prepublish)) {
		k, err := newKey()
		if err != nil {
			return nil, false, err
		}
		active := last.ActiveAt.Add(r.Period)
		if soonest := now.Add(r.Prepublish); active.Before(soonest) {
			active = soonest
		}
		out = append(out, ringKey{JWK: k, PublishedAt: now, ActiveAt: active})
		changed = true
	}
	kept := out[:0:0]
	for i, k := range out {
		if i < cur && !now.Before(out[i+1].ActiveAt.Add(r.Retention)) {
			changed = true
			continue
		}
		kept = append(kept, k)
	}
	return kept, changed, nil
}

// decodeRing reads the Secret's ring, refusing what this issuer could not have written.
func decodeRing(data []byte) ([]ringKey, error) {
	var f ringFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, k := range f.Keys {
		if _, err := grant.NewSigner(k.JWK); err != nil {
			return nil, fmt.Errorf("key %d: %v", i, err)
		}
		if seen[k.JWK.KeyID] {
			return nil, fmt.Errorf("key %d: kid %q repeats", i, k.JWK.KeyID)
		}
		seen[k.JWK.KeyID] = true
		if k.ActiveAt.IsZero() || k.PublishedAt.After(k.ActiveAt) {
			return nil, fmt.Errorf("key %d (kid %q): activeAt %v is missing or before publishedAt %v", i, k.JWK.KeyID, k.ActiveAt, k.PublishedAt)
		}
	}
	slices.SortStableFunc(f.Keys, func(a, b ringKey) int { return a.ActiveAt.Compare(b.ActiveAt) })
	return f.Keys, nil
}

// ringState is a loaded ring: its keys, and the key set each would sign with.
type ringState struct {
	keys []ringKey
	sets []*shared.KeySet
}

// newRingState builds the key sets of keys: each key signs, all are published.
func newRingState(keys []ringKey) (*ringState, error) {
	all := make([]jose.JSONWebKey, len(keys))
	for i, k := range keys {
		all[i] = k.JWK
	}
	st := &ringState{keys: keys}
	for _, k := range keys {
		ks, err := shared.NewKeySet(k.JWK, all...)
		if err != nil {
			return nil, err
		}
		st.sets = append(st.sets, ks)
	}
	return st, nil
}

// KeyRingConfig is what NewKeyRing needs.
type KeyRingConfig struct {
	// Client reads and writes the Secret. Required; it should not read from a cache, so a
	// replica sees another's write at its next Sync.
	Client client.Client
	// Namespace and Name of the Secret. Required.
	Namespace, Name string
	// Rotation is the schedule.
	Rotation Rotation
	// Algorithm of new keys: "EdDSA" (the default) or "ES256".
	Algorithm string
	// Resync is how often Run syncs. Default DefaultResync; below Rotation.Prepublish.
	Resync time.Duration
	// Clock tells the time. Default the real clock.
	Clock clock.WithTicker
	// Logger receives a line per key made or dropped, and per failed sync. Default klog's.
	Logger logr.Logger
}

// KeyRing is the issuer's signing keys, kept in a Secret that is their single source: every
// replica reads it, and the one that finds a rotation due writes it with the resourceVersion it
// read, so two replicas never both rotate (the loser of the race reads the winner's keys). A
// restart reads the same keys back. KeySet answers the shared server from the last ring read. It
// is safe for concurrent use.
type KeyRing struct {
	cfg   KeyRingConfig
	state atomic.Pointer[ringState]
}

// NewKeyRing validates cfg. It does no I/O: Sync or Run loads the keys.
func NewKeyRing(cfg KeyRingConfig) (*KeyRing, error) {
	cfg.Rotation = cfg.Rotation.withDefaults()
	if cfg.Algorithm == "" {
		cfg.Algorithm = string(jose.EdDSA)
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	switch {
	case cfg.Client == nil:
		return nil, errors.New("issuer: KeyRingConfig.Client is nil")
	case cfg.Namespace == "" || cfg.Name == "":
		return nil, fmt.Errorf("issuer: the keys Secret %q in namespace %q: name both (the controller's namespace, from POD_NAMESPACE)", cfg.Name, cfg.Namespace)
	case cfg.Algorithm != string(jose.EdDSA) && cfg.Algorithm != string(jose.ES256):
		return nil, fmt.Errorf("issuer: key algorithm %q: want EdDSA or ES256", cfg.Algorithm)
	case cfg.Resync <= 0 || cfg.Resync >= cfg.Rotation.Prepublish:
		return nil, fmt.Errorf("issuer: key resync %v: want more than 0 and less than the prepublish time %v, so every replica publishes a key before it signs", cfg.Resync, cfg.Rotation.Prepublish)
	}
	if err := cfg.Rotation.Validate(); err != nil {
		return nil, err
	}
	return &KeyRing{cfg: cfg}, nil
}

// KeySet is the set that signs now: the current key of the last ring read, with every key of the
// ring published. It fails until a Sync succeeded.
func (r *KeyRing) KeySet() (*shared.KeySet, error) {
	st := r.state.Load()
	if st == nil {
		return nil, fmt.Errorf("the keys in Secret %s/%s are not loaded yet", r.cfg.Namespace, r.cfg.Name)
	}
	return st.sets[current(st.keys, r.cfg.Clock.Now())], nil
}

// Loaded reports whether a Sync succeeded, for a readiness check: nil once it did.
func (r *KeyRing) Loaded() error {
	_, err := r.KeySet()
	return err
}

// KeyIDs are the kids of the last ring read, oldest first.
func (r *KeyRing) KeyIDs() []string {
	st := r.state.Load()
	if st == nil {
		return nil
	}
	var kids []string
	for _, k := range st.keys {
		kids = append(kids, k.JWK.KeyID)
	}
	return kids
}

// Sync reads the Secret, writes the ring back when the schedule changes it (creating the Secret
// when there is none) and loads it. A write that loses a race to another replica is retried
// from a fresh read, at most maxSyncAttempts times. A Secret whose ring cannot be read is an
// error, and is left as it is.
func (r *KeyRing) Sync(ctx context.Context) error {
	key := client.ObjectKey{Namespace: r.cfg.Namespace, Name: r.cfg.Name}
	for range maxSyncAttempts {
		var sec corev1.Secret
		exists := true
		var keys []ringKey
		switch err := r.cfg.Client.Get(ctx, key, &sec); {
		case apierrors.IsNotFound(err):
			exists = false
		case err != nil:
			return fmt.Errorf("issuer: reading Secret %s: %w", key, err)
		case len(sec.Data[SecretDataKey]) == 0:
			// A Secret made ahead of the controller (to set its labels, say) starts the ring.
		default:
			keys, err = decodeRing(sec.Data[SecretDataKey])
			if err != nil {
				return fmt.Errorf("issuer: Secret %s, %s, is not a key ring: %v: restore it, or delete it to start a new ring (grants signed by the old keys then fail verification at fiberd's next key refresh)", key, SecretDataKey, err)
			}
		}
		now := r.cfg.Clock.Now().UTC().Truncate(time.Second)
		next, changed, err := plan(keys, now, r.cfg.Rotation, r.newKey)
		if err != nil {
			return fmt.Errorf("issuer: making a key: %w", err)
		}
		if changed {
			data, err := json.Marshal(ringFile{Keys: next})
			if err != nil {
				return fmt.Errorf("issuer: encoding the key ring: %w", err)
			}
			if !exists {
				sec = corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{
						"app.kubernetes.io/name":      "fiberd-controller",
						"app.kubernetes.io/component": "issuer-keys",
					}},
					Type: corev1.SecretTypeOpaque,
				}
			}
			if sec.Data == nil {
				sec.Data = map[string][]byte{}
			}
			sec.Data[SecretDataKey] = data
			if !exists {
				err = r.cfg.Client.Create(ctx, &sec)
			} else {
				err = r.cfg.Client.Update(ctx, &sec)
			}
			if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
				r.cfg.Logger.V(1).Info("Another replica wrote the issuer keys first; reading them", "secret", key.String())
				continue
			}
			if err != nil {
				return fmt.Errorf("issuer: writing Secret %s: %w", key, err)
			}
			r.logChange(keys, next, now)
		}
		st, err := newRingState(next)
		if err != nil {
			return fmt.Errorf("issuer: Secret %s: %w", key, err)
		}
		r.state.Store(st)
		publishedKeys.Set(float64(len(st.keys)))
		return nil
	}
	return fmt.Errorf("issuer: Secret %s changed under every one of %d attempts to rotate it", key, maxSyncAttempts)
}

// newKey makes a signing key of the ring's algorithm, its kid the key's thumbprint.
func (r *KeyRing) newKey() (jose.JSONWebKey, error) {
	return grant.GenerateKey(r.cfg.Algorithm, "")
}

// logChange logs the keys a Sync added and dropped.
func (r *KeyRing) logChange(before, after []ringKey, now time.Time) {
	has := func(keys []ringKey, kid string) bool {
		return slices.ContainsFunc(keys, func(k ringKey) bool { return k.JWK.KeyID == kid })
	}
	for _, k := range after {
		if !has(before, k.JWK.KeyID) {
			r.cfg.Logger.Info("Issuer key published", "kid", k.JWK.KeyID, "signsFrom", k.ActiveAt.Format(time.RFC3339), "secret", r.cfg.Namespace+"/"+r.cfg.Name)
		}
	}
	for _, k := range before {
		if !has(after, k.JWK.KeyID) {
			r.cfg.Logger.Info("Issuer key retired: every grant it signed has expired", "kid", k.JWK.KeyID, "at", now.Format(time.RFC3339))
		}
	}
}

// Run syncs at once and then every Resync until ctx ends; a failed sync is logged and retried
// sooner, with a backoff from one second up to Resync. It returns nil when ctx ends.
func (r *KeyRing) Run(ctx context.Context) error {
	backoff := min(time.Second, r.cfg.Resync)
	for {
		wait := r.cfg.Resync
		if err := r.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait = backoff
			backoff = min(2*backoff, r.cfg.Resync)
			r.cfg.Logger.Error(err, "Issuer key sync failed; retrying", "retryIn", wait.String(), "loaded", r.Loaded() == nil)
		} else {
			backoff = min(time.Second, r.cfg.Resync)
		}
		t := r.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}
