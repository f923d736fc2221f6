package issuer

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"fiberd.io/fiberd/pkg/grant"
)

var t0 = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

// testRotation is a day's period, 15 minutes' prepublish and 65 minutes' retention.
var testRotation = Rotation{Period: 24 * time.Hour, Prepublish: 15 * time.Minute, Retention: 65 * time.Minute}

// counterKeys makes keys with kids k1, k2, ... in order.
func counterKeys(t *testing.T) func() (jose.JSONWebKey, error) {
	n := 0
	return func() (jose.JSONWebKey, error) {
		n++
		return grant.GenerateKey("EdDSA", "k"+string(rune('0'+n)))
	}
}

func kids(keys []ringKey) string {
	var s []string
	for _, k := range keys {
		s = append(s, k.JWK.KeyID)
	}
	return strings.Join(s, ",")
}

// TestPlanSchedule walks a ring through two rotations: each next key is published Prepublish
// before it signs, and the one it replaces stays published for Retention after.
func TestPlanSchedule(t *testing.T) {
	newKey := counterKeys(t)
	var keys []ringKey
	step := func(at time.Time, wantKids string, wantChanged bool, wantSigner string) {
		t.Helper()
		next, changed, err := plan(keys, at, testRotation, newKey)
		if err != nil {
			t.Fatal(err)
		}
		if got := kids(next); got != wantKids || changed != wantChanged {
			t.Fatalf("at %v: kids %s (changed %v), want %s (changed %v)", at.Sub(t0), got, changed, wantKids, wantChanged)
		}
		if got := next[current(next, at)].JWK.KeyID; got != wantSigner {
			t.Fatalf("at %v: signer %s, want %s", at.Sub(t0), got, wantSigner)
		}
		keys = next
	}
	step(t0, "k1", true, "k1")
	step(t0.Add(23*time.Hour+44*time.Minute), "k1", false, "k1")
	step(t0.Add(23*time.Hour+45*time.Minute), "k1,k2", true, "k1") // published, not signing
	if !keys[1].ActiveAt.Equal(t0.Add(24*time.Hour)) || !keys[1].PublishedAt.Equal(t0.Add(23*time.Hour+45*time.Minute)) {
		t.Fatalf("k2 published %v, active %v", keys[1].PublishedAt, keys[1].ActiveAt)
	}
	step(t0.Add(24*time.Hour-time.Second), "k1,k2", false, "k1")
	step(t0.Add(24*time.Hour), "k1,k2", false, "k2")
	step(t0.Add(25*time.Hour+4*time.Minute), "k1,k2", false, "k2") // k1's grants may live on
	step(t0.Add(25*time.Hour+5*time.Minute), "k2", true, "k2")     // retention over
	step(t0.Add(47*time.Hour+45*time.Minute), "k2,k3", true, "k2")
	step(t0.Add(48*time.Hour), "k2,k3", false, "k3")
}

// TestPlanAfterAnOutage: a ring nobody kept for longer than its period still publishes the next
// key Prepublish before it signs, and keeps signing with the old one meanwhile.
func TestPlanAfterAnOutage(t *testing.T) {
	newKey := counterKeys(t)
	keys, _, _ := plan(nil, t0, testRotation, newKey)
	late := t0.Add(72 * time.Hour)
	keys, changed, err := plan(keys, late, testRotation, newKey)
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	if kids(keys) != "k1,k2" || !keys[1].ActiveAt.Equal(late.Add(testRotation.Prepublish)) {
		t.Fatalf("kids %s, k2 active at %v, want k1,k2 with k2 active at %v", kids(keys), keys[1].ActiveAt, late.Add(testRotation.Prepublish))
	}
	if current(keys, late) != 0 {
		t.Fatal("the new key signs before it was published for Prepublish")
	}
}

func testScheme(t *testing.T) *fake.ClientBuilder {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(scheme(t))
}

func newRing(t *testing.T, c client.Client, clk *clocktesting.FakeClock) *KeyRing {
	t.Helper()
	r, err := NewKeyRing(KeyRingConfig{Client: c, Namespace: "fiberd-system", Name: DefaultSecretName,
		Rotation: testRotation, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func signer(t *testing.T, r *KeyRing) string {
	t.Helper()
	ks, err := r.KeySet()
	if err != nil {
		t.Fatal(err)
	}
	return ks.Signer().KeyID()
}

func published(t *testing.T, r *KeyRing) []string {
	t.Helper()
	ks, err := r.KeySet()
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(ks.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range set.Keys {
		out = append(out, k.KeyID)
	}
	slices.Sort(out)
	return out
}

// TestKeyRingPersists: a second ring on the same Secret, a restart, serves the same keys; a
// rotation keeps the old key published, and the signer moves to the new one at its time even
// without a sync.
func TestKeyRingPersists(t *testing.T) {
	ctx := context.Background()
	c := testScheme(t).Build()
	clk := clocktesting.NewFakeClock(t0)
	a := newRing(t, c, clk)
	if _, err := a.KeySet(); err == nil {
		t.Fatal("KeySet before any sync answered a key set")
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := signer(t, a)
	var sec corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "fiberd-system", Name: DefaultSecretName}, &sec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sec.Data[SecretDataKey]), `"d":`) {
		t.Fatal("the Secret does not hold the private key: a restart could not sign with it")
	}

	restarted := newRing(t, c, clk)
	if err := restarted.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := signer(t, restarted); got != first {
		t.Fatalf("after a restart the signer is %s, want %s", got, first)
	}

	clk.SetTime(t0.Add(23*time.Hour + 45*time.Minute))
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := restarted.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published(t, restarted); len(got) != 2 || !slices.Contains(got, first) {
		t.Fatalf("published %v: want the signing key %s and the next one", got, first)
	}
	if got := signer(t, restarted); got != first {
		t.Fatalf("the next key signs %v early", 15*time.Minute)
	}
	clk.SetTime(t0.Add(24 * time.Hour))
	second := signer(t, restarted)
	if second == first {
		t.Fatal("the signer did not move to the next key at its time")
	}
	if got := published(t, restarted); !slices.Contains(got, first) {
		t.Fatalf("published %v: the old key left while grants it signed may be valid", got)
	}
	clk.SetTime(t0.Add(25*time.Hour + 5*time.Minute))
	if err := restarted.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published(t, restarted); len(got) != 1 || got[0] != second {
		t.Fatalf("published %v after the retention, want only %s", got, second)
	}
}

// TestKeyRingRace: two replicas rotate at once; the one whose write conflicts reads the other's
// ring, and both publish and sign the same keys.
func TestKeyRingRace(t *testing.T) {
	ctx := context.Background()
	base := testScheme(t).Build()
	clk := clocktesting.NewFakeClock(t0)
	a := newRing(t, base, clk)
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var raced atomic.Bool
	racing := interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if raced.CompareAndSwap(false, true) {
				// The other replica writes between this one's read and its write.
				if err := a.Sync(ctx); err != nil {
					t.Error(err)
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	b := newRing(t, racing, clk)
	clk.SetTime(t0.Add(23*time.Hour + 50*time.Minute))
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !raced.Load() {
		t.Fatal("the race did not happen")
	}
	if ka, kb := strings.Join(a.KeyIDs(), ","), strings.Join(b.KeyIDs(), ","); ka != kb || len(a.KeyIDs()) != 2 {
		t.Fatalf("replica a has %s, b has %s: want the same two keys", ka, kb)
	}
}

// TestKeyRingRefusesACorruptSecret: a Secret that is not a ring is an error naming the fix, and
// is left as it is.
func TestKeyRingRefusesACorruptSecret(t *testing.T) {
	ctx := context.Background()
	bad := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "fiberd-system", Name: DefaultSecretName},
		Data:       map[string][]byte{SecretDataKey: []byte(`{"keys":[{"jwk":{"kty":"oct","k":"AAAA","kid":"x"}}]}`)},
	}
	c := testScheme(t).WithObjects(bad).Build()
	r := newRing(t, c, clocktesting.NewFakeClock(t0))
	err := r.Sync(ctx)
	if err == nil || !strings.Contains(err.Error(), "delete it to start a new ring") {
		t.Fatalf("Sync = %v, want a refusal saying how to fix the Secret", err)
	}
	var got corev1.Secret
	if err := c.Get(ctx, client.ObjectKeyFromObject(bad), &got); err != nil {
		t.Fatal(err)
	}
	if string(got.Data[SecretDataKey]) != string(bad.Data[SecretDataKey]) {
		t.Fatal("the corrupt Secret was overwritten")
	}
}

// TestKeyRingRun: Run loads the keys, and returns once its context ends.
func TestKeyRingRun(t *testing.T) {
	c := testScheme(t).Build()
	r := newRing(t, c, clocktesting.NewFakeClock(t0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.Loaded() != nil {
		if time.Now().After(deadline) {
			t.Fatal("Run did not load the keys")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestNewKeyRingValidates(t *testing.T) {
	c := testScheme(t).Build()
	for _, tc := range []struct {
		name string
		cfg  KeyRingConfig
		want string
	}{
		{"no namespace", KeyRingConfig{Client: c, Name: "k", Rotation: testRotation}, "POD_NAMESPACE"},
		{"no retention", KeyRingConfig{Client: c, Namespace: "n", Name: "k"}, "retention"},
		{"prepublish over period", KeyRingConfig{Client: c, Namespace: "n", Name: "k",
			Rotation: Rotation{Period: time.Hour, Prepublish: 2 * time.Hour, Retention: time.Hour}}, "prepublish"},
		{"resync over prepublish", KeyRingConfig{Client: c, Namespace: "n", Name: "k", Resync: time.Hour, Rotation: testRotation}, "resync"},
		{"bad algorithm", KeyRingConfig{Client: c, Namespace: "n", Name: "k", Algorithm: "RS256", Rotation: testRotation}, "EdDSA or ES256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewKeyRing(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewKeyRing = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestKeyRingRunRetries: a sync that fails (the API server down) is retried a second later, not
// a resync later, and the keys load once it answers.
func TestKeyRingRunRetries(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	c := interceptor.NewClient(testScheme(t).Build().(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if down.Load() {
				return errors.New("connection refused")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	clk := clocktesting.NewFakeClock(t0)
	r := newRing(t, c, clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("Run did not wait after the failed sync", clk.HasWaiters)
	if r.Loaded() == nil {
		t.Fatal("keys loaded while the API server is down")
	}
	down.Store(false)
	clk.Step(time.Second)
	waitFor("the keys did not load a second after the API server came back", func() bool { return r.Loaded() == nil })
}
