package kubernetes_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

const (
	testNS   = "team-a"
	testPod  = "grant-pod-0"
	testUID  = "3f2a9c1e-7b1d-4c55-9b7e-2d4f6a8b0c11"
	otherUID = "9d0c2b1a-0000-4c55-9b7e-2d4f6a8b0c11"
	testNode = "node-7"
	testSA   = "grant-runner"
)

// epoch is the fake clock's start.
var epoch = time.Date(2026, 11, 7, 12, 0, 0, 0, time.UTC)

// newPod is the grant Pod as the API server holds it: scheduled, with an
// IPv4 and an IPv6 address.
func newPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testPod, UID: types.UID(testUID)},
		Spec:       corev1.PodSpec{NodeName: testNode, ServiceAccountName: testSA},
		Status: corev1.PodStatus{
			PodIP:  "10.0.0.7",
			PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}, {IP: "fd00::7"}},
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			},
		},
	}
}

func newNamespace() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
}

func newClaim(name string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID("claim-" + name)}}
}

// withClaim makes p use the ResourceClaim name directly.
func withClaim(p *corev1.Pod, name string) *corev1.Pod {
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "dev-" + name, ResourceClaimName: &name})
	return p
}

// newWorld is a fake cluster holding the Pod and its Namespace.
func newWorld() *fake.Kube {
	k := fake.New()
	k.SetPod(newPod())
	k.SetNamespace(newNamespace())
	return k
}

// quiet is a logger that drops every line (logr.Discard() would mean the
// default, klog).
func quiet() logr.Logger {
	return funcr.New(func(string, string) {}, funcr.Options{})
}

// baseConfig is a valid Config on k and clk with a fixed CgroupRoot, so
// New never delegates the test process's cgroup.
func baseConfig(t *testing.T, k kubernetes.Kube, clk *clocktesting.FakeClock) kubernetes.Config {
	t.Helper()
	return kubernetes.Config{
		Kube:         k,
		PodName:      testPod,
		PodNamespace: testNS,
		PodUID:       testUID,
		CgroupRoot:   t.TempDir(),
		Clock:        clk,
		Logger:       quiet(),
	}
}

// newHome builds a home on a fresh world and fake clock; mutate may change
// the Config first.
func newHome(t *testing.T, mutate func(*kubernetes.Config)) (*kubernetes.Home, *fake.Kube, *clocktesting.FakeClock) {
	t.Helper()
	return newHomeOn(t, clocktesting.NewFakeClock(epoch), mutate)
}

// newHomeOn is newHome on clk, for tests that hand the same clock to
// something else too (a key cache).
func newHomeOn(t *testing.T, clk *clocktesting.FakeClock, mutate func(*kubernetes.Config)) (*kubernetes.Home, *fake.Kube, *clocktesting.FakeClock) {
	t.Helper()
	k := newWorld()
	cfg := baseConfig(t, k, clk)
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := kubernetes.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(h.Close)
	return h, k, clk
}

// run starts h.Run and stops it at cleanup, waiting for it to return. The
// returned stop ends it earlier; it waits too.
func run(t *testing.T, h *kubernetes.Home) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually waits, in real time, for cond; it fails the test after 10 s.
// It synchronises with the home's goroutines; it measures nothing.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle gives the home's goroutines a moment to do what they should not,
// before a test asserts that they did not.
func settle() { time.Sleep(50 * time.Millisecond) }

// rounds waits until k has served n GetPod calls and the round that made
// the nth one has read what a round reads after the Pod: the Namespace and,
// when the Pod k holds is this live Pod and uses claims, each of its claims.
// Tests that call it give the Pod its claims before the first round.
func rounds(t *testing.T, k *fake.Kube, n int) {
	t.Helper()
	perRound := 0
	if p, ok := k.Pod(testNS, testPod); ok && p.UID == types.UID(testUID) && p.DeletionTimestamp == nil {
		perRound = len(claimNames(p))
	}
	eventually(t, fmt.Sprintf("poll round %d", n), func() bool {
		return k.Calls(fake.GetPod) >= n && k.Calls(fake.GetNamespace) >= n &&
			k.Calls(fake.GetResourceClaim) >= n*perRound
	})
}

// claimNames is the set of ResourceClaims p uses: named in its spec, or
// generated from a template and named in its status.
func claimNames(p *corev1.Pod) map[string]bool {
	names := map[string]bool{}
	for _, c := range p.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			names[*c.ResourceClaimName] = true
		}
	}
	for _, c := range p.Status.ResourceClaimStatuses {
		if c.ResourceClaimName != nil {
			names[*c.ResourceClaimName] = true
		}
	}
	return names
}

// tick steps clk by d once the home's goroutines wait on it.
func tick(t *testing.T, clk *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	eventually(t, "a waiter on the clock", clk.HasWaiters)
	clk.Step(d)
}

// scopeLosses records OnScopeLost calls.
type scopeLosses struct {
	mu      sync.Mutex
	reasons []string
}

func (s *scopeLosses) fn(_ context.Context, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reasons = append(s.reasons, reason)
}

func (s *scopeLosses) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reasons...)
}

func (s *scopeLosses) count(reason string) int {
	n := 0
	for _, r := range s.get() {
		if r == reason {
			n++
		}
	}
	return n
}

// token is an unsigned compact JWT with the claims the home reads. The
// home never verifies it; the agent would.
func token(uid string, iat, exp time.Time) []byte {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return []byte(enc(map[string]string{"alg": "EdDSA", "kid": "k1"}) + "." +
		enc(map[string]any{"jti": uid, "iat": iat.Unix(), "exp": exp.Unix(), "aud": testPod}) + "." +
		base64.RawURLEncoding.EncodeToString([]byte("not-a-signature")))
}
