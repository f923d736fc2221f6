package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

// "New builds the home. It reads nothing from the cluster."
func TestNewReadsNothingFromTheCluster(t *testing.T) {
	_, k, _ := newHome(t, nil)
	for _, m := range []string{fake.GetPod, fake.GetNamespace, fake.GetResourceClaim, fake.PatchPodStatus} {
		if n := k.Calls(m); n != 0 {
			t.Errorf("New made %d %s calls, want none", n, m)
		}
	}
}

// "The first read happens in ... the first poll round." The round runs as
// Run starts, and reads the Pod, then its Namespace.
func TestFirstPollRoundRunsAtOnce(t *testing.T) {
	h, k, _ := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
}

// Poll: "how often the API server is asked", "Default half of StaleTTL".
func TestPollDefaultsToHalfStaleTTL(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second })
	run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 4*time.Second)
	settle()
	if n := k.Calls(fake.GetPod); n != 1 {
		t.Fatalf("after 4s of a 5s poll: %d Pod reads, want 1", n)
	}
	tick(t, clk, time.Second)
	rounds(t, k, 2)
	tick(t, clk, 5*time.Second)
	rounds(t, k, 3)
}

// Poll: "It is also how long one round may take."
func TestPollBoundsOneRound(t *testing.T) {
	const poll = 100 * time.Millisecond // real time: a round's bound is I/O time
	h, k, _ := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 4 * poll; c.Poll = poll })
	type seen struct {
		left time.Duration
		ok   bool
	}
	got := make(chan seen, 1)
	k.Intercept(fake.GetPod, func(ctx context.Context, _, _ string) error {
		dl, ok := ctx.Deadline()
		select {
		case got <- seen{time.Until(dl), ok}:
		default:
		}
		<-ctx.Done() // an API server that never answers
		return ctx.Err()
	})
	run(t, h)
	s := <-got
	if !s.ok || s.left > poll {
		t.Fatalf("the Pod read's context: deadline set %v, %v left; want a deadline at most Poll (%v) away", s.ok, s.left, poll)
	}
	// The round goes on to the Namespace once the Pod read timed out.
	eventually(t, "the Namespace read after the Pod read timed out", func() bool { return k.Calls(fake.GetNamespace) >= 1 })
}

// StaleTTL: "how long the API server may go without answering for the Pod
// before the home is unhealthy"; New: "The health starts in sync, so a Pod
// the API server has not answered for yet is not unhealthy before the
// stale TTL has passed."
func TestHealthStartsInSyncAndGoesStaleAfterStaleTTL(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 2 * time.Second })
	k.Fail(fake.GetPod, errors.New("connection refused"))
	if !h.Health().Healthy() {
		t.Fatal("a new home is unhealthy; the health must start in sync")
	}
	if got := h.Health().StaleTTL(); got != 10*time.Second {
		t.Fatalf("StaleTTL = %v, want the configured 10s", got)
	}
	run(t, h)
	for i := 1; i <= 4; i++ { // 8s: still inside the TTL
		rounds(t, k, i)
		tick(t, clk, 2*time.Second)
	}
	rounds(t, k, 5)
	if !h.Health().Healthy() {
		t.Fatal("unhealthy 8s into a 10s TTL")
	}
	tick(t, clk, 2*time.Second)
	rounds(t, k, 6)
	if h.Health().Healthy() {
		t.Fatal("still healthy 10s without the API server answering for the Pod")
	}
	// The API server answers again: the next round marks a sync.
	k.Fail(fake.GetPod, nil)
	tick(t, clk, 2*time.Second)
	eventually(t, "healthy again after the Pod was read", h.Health().Healthy)
}

func TestDefaultStaleTTL(t *testing.T) {
	h, _, _ := newHome(t, nil)
	if kubernetes.DefaultStaleTTL != 30*time.Second {
		t.Fatalf("DefaultStaleTTL = %v, want 30s", kubernetes.DefaultStaleTTL)
	}
	if got := h.Health().StaleTTL(); got != kubernetes.DefaultStaleTTL {
		t.Fatalf("default StaleTTL = %v, want DefaultStaleTTL", got)
	}
}

// Clock: "drives the polls and stamps the health."
func TestClockStampsTheHealth(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	eventually(t, "the sync stamped by the fake clock", func() bool { return h.Health().LastSync().Equal(epoch.Add(15 * time.Second)) })
}

// A Pod read that fails is no sync.
func TestFailedPodReadIsNoSync(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	k.Fail(fake.GetPod, errors.New("boom"))
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	settle()
	if got := h.Health().LastSync(); !got.Equal(epoch) {
		t.Fatalf("LastSync = %v after a failed read, want the first round's %v", got, epoch)
	}
}

// The scope-loss reasons, each a sentence of the overview: "the home loses
// it when the Pod is gone, replaced or terminating, the namespace
// terminates, a claim is deleted under a live Pod".
func TestScopeLost(t *testing.T) {
	now := metav1.NewTime(epoch)
	tests := []struct {
		name   string
		claim  bool
		change func(k *fake.Kube)
		want   string
	}{
		{"pod deleted", false, func(k *fake.Kube) { k.DeletePod(testNS, testPod) }, "pod deleted"},
		{"pod replaced", false, func(k *fake.Kube) {
			p := newPod()
			p.UID = types.UID(otherUID)
			k.SetPod(p)
		}, "pod replaced"},
		{"pod terminating", false, func(k *fake.Kube) {
			p := newPod()
			p.DeletionTimestamp = &now
			k.SetPod(p)
		}, "pod terminating"},
		{"namespace deleted", false, func(k *fake.Kube) { k.DeleteNamespace(testNS) }, "namespace deleted"},
		{"namespace terminating phase", false, func(k *fake.Kube) {
			n := newNamespace()
			n.Status.Phase = corev1.NamespaceTerminating
			k.SetNamespace(n)
		}, "namespace terminating"},
		{"namespace deletion timestamp", false, func(k *fake.Kube) {
			n := newNamespace()
			n.DeletionTimestamp = &now
			k.SetNamespace(n)
		}, "namespace terminating"},
		{"claim deleted", true, func(k *fake.Kube) { k.DeleteResourceClaim(testNS, "gpu") }, "resource claim gpu deleted"},
		{"claim being deleted", true, func(k *fake.Kube) {
			c := newClaim("gpu")
			c.DeletionTimestamp = &now
			k.SetResourceClaim(c)
		}, "resource claim gpu deleted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, k, clk := newHome(t, nil)
			if tt.claim {
				k.SetPod(withClaim(newPod(), "gpu"))
				k.SetResourceClaim(newClaim("gpu"))
			}
			var lost scopeLosses
			h.OnScopeLost(lost.fn)
			run(t, h)
			rounds(t, k, 1)
			settle()
			if got := lost.get(); len(got) != 0 {
				t.Fatalf("scope lost %q before anything changed", got)
			}
			tt.change(k)
			tick(t, clk, 15*time.Second)
			eventually(t, "scope loss "+tt.want, func() bool { return lost.count(tt.want) == 1 })
			// Once per reason: more rounds deliver it no more.
			tick(t, clk, 15*time.Second)
			rounds(t, k, 3)
			settle()
			if n := lost.count(tt.want); n != 1 {
				t.Fatalf("%q delivered %d times, want once", tt.want, n)
			}
		})
	}
}

// "a claim is deleted under a live Pod": a terminating Pod's claims going
// away is the Pod's own end, reported as such.
func TestClaimDeletedUnderTerminatingPodIsNotAClaimLoss(t *testing.T) {
	h, k, clk := newHome(t, nil)
	k.SetPod(withClaim(newPod(), "gpu"))
	k.SetResourceClaim(newClaim("gpu"))
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	rounds(t, k, 1)
	p := withClaim(newPod(), "gpu")
	now := metav1.NewTime(epoch)
	p.DeletionTimestamp = &now
	k.SetPod(p)
	k.DeleteResourceClaim(testNS, "gpu")
	tick(t, clk, 15*time.Second)
	eventually(t, "pod terminating", func() bool { return lost.count("pod terminating") == 1 })
	settle()
	if got := lost.get(); !slices.Equal(got, []string{"pod terminating"}) {
		t.Fatalf("reasons = %q, want only \"pod terminating\"", got)
	}
}

// Claims come from status.resourceClaimStatuses for claims made from a
// template, and from spec for claims named directly.
func TestScopeLostGeneratedClaimDeleted(t *testing.T) {
	h, k, clk := newHome(t, nil)
	p := newPod()
	tmpl := "gpu-template"
	gen := "grant-pod-0-dev-abcde"
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: &tmpl}}
	p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "dev", ResourceClaimName: &gen}}
	k.SetPod(p)
	k.SetResourceClaim(newClaim(gen))
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	rounds(t, k, 1)
	eventually(t, "the generated claim read", func() bool { return k.Calls(fake.GetResourceClaim) >= 1 })
	k.DeleteResourceClaim(testNS, gen)
	tick(t, clk, 15*time.Second)
	eventually(t, "claim loss", func() bool { return lost.count("resource claim "+gen+" deleted") == 1 })
}

// "or the cluster has not served the claims for the stale TTL", whether it
// serves no resource.k8s.io group or the reads fail; and not before.
func TestScopeLostClaimsUnreadableForStaleTTL(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"no resource.k8s.io", kubernetes.ErrNoResourceClaims},
		{"read errors", errors.New("etcd timeout")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 2 * time.Second })
			k.SetPod(withClaim(newPod(), "gpu"))
			k.SetResourceClaim(newClaim("gpu"))
			var broken atomic.Bool
			decided := make(chan struct{}, 16)
			k.Intercept(fake.GetResourceClaim, func(context.Context, string, string) error {
				defer func() { decided <- struct{}{} }()
				if broken.Load() {
					return tt.err
				}
				return nil
			})
			var lost scopeLosses
			h.OnScopeLost(lost.fn)
			// round waits for round i to read its claim, sets whether the
			// next round's read fails, and moves the clock on to it.
			wait := func(i int) {
				t.Helper()
				select {
				case <-decided:
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d read no claim", i)
				}
				rounds(t, k, i)
			}
			round := func(i int, nextUnreadable bool) {
				t.Helper()
				wait(i)
				broken.Store(nextUnreadable)
				tick(t, clk, 2*time.Second)
			}
			broken.Store(true)
			run(t, h)
			// Unreadable at 0, 2, 4, 6 and 8s, readable at 10s: no loss,
			// and the count starts over.
			for i := 1; i <= 4; i++ {
				round(i, true)
			}
			round(5, false)
			round(6, true)
			// Unreadable from 12s on: at 20s, 8s later, still no loss.
			for i := 7; i <= 10; i++ {
				round(i, true)
			}
			wait(11)
			settle()
			if got := lost.get(); len(got) != 0 {
				t.Fatalf("scope lost %q with the claims unreadable for less than the TTL", got)
			}
			tick(t, clk, 2*time.Second) // round 12 at 22s: 10s unreadable
			eventually(t, "claims unreadable", func() bool { return lost.count("resource claims unreadable") == 1 })
		})
	}
}

// "Control-plane liveness is the API server answering for the Pod": an
// outage is staleness, for a Pod with claims as for one without. The claims
// are the live Pod's, so they are counted as not served only in rounds that
// read the Pod, and read only beside a Pod read while the API server
// answers for it; an outage (the Pod unread for longer than the stale TTL)
// starts the count over (design decision 89): an outage longer than the
// stale TTL loses no scope, nor do claim reads that failed before it and
// fail again after it; the stale TTL runs from the first round after it
// that reads the Pod but not its claims.
func TestOutageWithClaimsIsStalenessNotScopeLoss(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 2 * time.Second })
	k.SetPod(withClaim(newPod(), "gpu"))
	k.SetResourceClaim(newClaim("gpu"))
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	rounds(t, k, 1)
	down := errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	// Round 2 (2s) reads the Pod but not its claim: the count starts.
	k.Fail(fake.GetResourceClaim, down)
	tick(t, clk, 2*time.Second)
	rounds(t, k, 2)
	// Rounds 3 to 12 (4s to 22s): nothing answers, for twice the stale TTL.
	k.Fail(fake.GetPod, down)
	k.Fail(fake.GetNamespace, down)
	for i := 3; i <= 12; i++ {
		tick(t, clk, 2*time.Second)
		eventually(t, fmt.Sprintf("round %d", i), func() bool { return k.Calls(fake.GetNamespace) >= i })
	}
	settle()
	if h.Health().Healthy() {
		t.Fatal("healthy through an outage longer than the stale TTL")
	}
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("an API server outage lost the scope: %q", got)
	}
	if n := k.Calls(fake.GetResourceClaim); n != 3 {
		t.Fatalf("%d claim reads, want rounds 1, 2 and 3's: the claims are read beside the Pod only after a round that read it", n)
	}

	// The API server answers for the Pod again, but not for its claims: the
	// count starts over with round 13 (24s), not with round 2.
	k.Fail(fake.GetPod, nil)
	k.Fail(fake.GetNamespace, nil)
	for i := 13; i <= 17; i++ { // 24s to 32s: 8s of claims not served
		tick(t, clk, 2*time.Second)
		eventually(t, fmt.Sprintf("round %d's claim read", i), func() bool {
			return k.Calls(fake.GetNamespace) >= i && k.Calls(fake.GetResourceClaim) >= i-9
		})
	}
	settle()
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("scope lost %q with the claims unserved for less than the stale TTL since the outage", got)
	}
	tick(t, clk, 2*time.Second) // 34s: 10s since round 13
	eventually(t, "claims unreadable", func() bool { return lost.count("resource claims unreadable") == 1 })
}

// A Pod without claims loses nothing when the cluster serves no claims.
func TestNoClaimsNoClaimReads(t *testing.T) {
	h, k, clk := newHome(t, nil)
	k.SetNoResourceClaims(true)
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	for i := 1; i <= 3; i++ {
		rounds(t, k, i)
		tick(t, clk, 15*time.Second)
	}
	settle()
	if n := k.Calls(fake.GetResourceClaim); n != 0 {
		t.Fatalf("%d claim reads for a Pod without claims", n)
	}
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("scope lost: %q", got)
	}
}

// OnScopeLost: "on a goroutine of the home's own": a callback that blocks
// holds up neither the caller nor the polls.
func TestOnScopeLostRunsOnTheHomesGoroutine(t *testing.T) {
	h, k, clk := newHome(t, nil)
	release := make(chan struct{})
	called := make(chan context.Context, 4)
	h.OnScopeLost(func(ctx context.Context, reason string) {
		called <- ctx
		<-release
	})
	k.DeletePod(testNS, testPod)
	stop := run(t, h)
	ctx := <-called
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2) // the poll goes on while the callback blocks
	close(release)
	stop()
	if ctx.Err() == nil {
		t.Fatal("the callback's context is still live after Run returned; want Run's context")
	}
}

// Several reasons are each delivered, in the order found.
func TestScopeLostEachReasonOnce(t *testing.T) {
	h, k, clk := newHome(t, nil)
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	rounds(t, k, 1)
	k.DeletePod(testNS, testPod)
	k.DeleteNamespace(testNS)
	tick(t, clk, 15*time.Second)
	eventually(t, "two reasons", func() bool { return len(lost.get()) == 2 })
	tick(t, clk, 15*time.Second)
	rounds(t, k, 3)
	settle()
	if got := lost.get(); !slices.Equal(got, []string{"pod deleted", "namespace deleted"}) {
		t.Fatalf("reasons = %q, want pod deleted then namespace deleted, once each", got)
	}
}

// SetIssuerReachable: "false marks the API server unreachable now and
// keeps it so."
func TestSetIssuerReachableFalseKeepsUnreachable(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	h.SetIssuerReachable(false)
	if h.Health().Healthy() {
		t.Fatal("healthy right after SetIssuerReachable(false)")
	}
	for i := 0; i < 3; i++ {
		tick(t, clk, 15*time.Second)
	}
	settle()
	if h.Health().Healthy() {
		t.Fatal("healthy again while the override holds")
	}
	if n := k.Calls(fake.GetPod); n != 1 {
		t.Fatalf("%d Pod reads while paused, want the 1 before the pause", n)
	}
}

// "true resumes the polls and marks it reachable."
func TestSetIssuerReachableTrueResumes(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	h.SetIssuerReachable(false)
	tick(t, clk, time.Minute)
	h.SetIssuerReachable(true)
	if !h.Health().Healthy() {
		t.Fatal("unhealthy right after SetIssuerReachable(true)")
	}
	if got := h.Health().LastSync(); !got.Equal(epoch.Add(time.Minute)) {
		t.Fatalf("LastSync = %v, want the resume's %v", got, epoch.Add(time.Minute))
	}
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
}

// "The pause comes first, and it waits for a round marking the health, so
// the mark here is the last one": a round in flight when the override
// lands does not mark the health after it.
func TestSetIssuerReachableOutlastsRoundInFlight(t *testing.T) {
	h, k, _ := newHome(t, nil)
	inRead := make(chan struct{})
	answer := make(chan struct{})
	k.Intercept(fake.GetPod, func(ctx context.Context, _, _ string) error {
		close(inRead)
		<-answer
		return nil
	})
	run(t, h)
	<-inRead
	h.SetIssuerReachable(false)
	close(answer) // the Pod read in flight now succeeds
	rounds(t, k, 1)
	settle()
	if h.Health().Healthy() {
		t.Fatal("the round in flight marked the health after SetIssuerReachable(false)")
	}
	if got := h.Health().LastSync(); !got.Equal(epoch) {
		t.Fatalf("LastSync moved to %v after the override", got)
	}
}

// Run: "A second Run logs and returns at once, as a shared informer does."
func TestSecondRunReturnsAtOnce(t *testing.T) {
	logs := logtest.Recorder{Verbosity: 1}
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.Logger = logs.Logger() })
	run(t, h)
	rounds(t, k, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Run(context.Background()) // never cancelled: it must return by itself
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a second Run did not return")
	}
	if len(logs.Matching("Run called again")) != 1 {
		t.Fatalf("the second Run logged no line about it")
	}
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	settle()
	if n := k.Calls(fake.GetPod); n != 2 {
		t.Fatalf("%d Pod reads after one tick, want 2: the second Run polls too", n)
	}
}

// "or the cluster has not served the claims for the stale TTL": an API
// server that answers every read within Poll serves them, however slowly.
// The Pod read and the claim read each take 60% of Poll; the round does
// not cut the claim's for the Pod's. (Round bounds are I/O time, so Poll is
// real time here; the rounds' own times are the fake clock's.)
func TestSlowAnswersWithinPollServeTheClaims(t *testing.T) {
	const poll = time.Second
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 4 * poll; c.Poll = poll })
	k.SetPod(withClaim(newPod(), "gpu"))
	k.SetResourceClaim(newClaim("gpu"))
	var podsDone, claimsDone atomic.Int32
	slow := func(done *atomic.Int32) fake.InterceptFunc {
		return func(ctx context.Context, _, _ string) error {
			defer done.Add(1)
			select {
			case <-time.After(poll * 6 / 10):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	k.Intercept(fake.GetPod, slow(&podsDone))
	k.Intercept(fake.GetResourceClaim, slow(&claimsDone))
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	// Rounds at 0s to 5s on the clock: more than the stale TTL of them.
	for i := 1; i <= 6; i++ {
		eventually(t, fmt.Sprintf("round %d's reads ended", i), func() bool {
			return podsDone.Load() >= int32(i) && claimsDone.Load() >= int32(i)
		})
		if i < 6 {
			tick(t, clk, poll)
		}
	}
	settle()
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("scope lost %q with every read answered within Poll", got)
	}
	if !h.Health().Healthy() {
		t.Fatal("unhealthy with every Pod read answered within Poll")
	}
}

// "or the cluster has not served the claims for the stale TTL", while Pod
// reads flap: a round that cannot read the Pod neither serves the claims
// nor starts their count over, so claims never served are judged although
// every other Pod read fails (and the health stays good throughout).
func TestClaimsJudgedWhilePodReadsFlap(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 2 * time.Second })
	k.SetPod(withClaim(newPod(), "gpu"))
	k.Fail(fake.GetResourceClaim, errors.New("the server is currently unable to handle the request"))
	var n atomic.Int32
	k.Intercept(fake.GetPod, func(context.Context, string, string) error {
		if n.Add(1)%2 == 0 {
			return errors.New("http2: client connection lost")
		}
		return nil
	})
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	// Round i is at 2(i-1)s; the odd rounds read the Pod and not its claim,
	// from 0s on.
	for i := 1; i <= 6; i++ {
		rounds(t, k, i)
		settle()
		if got := lost.get(); len(got) != 0 {
			t.Fatalf("scope lost %q at %v, before the stale TTL", got, clk.Since(epoch))
		}
		if !h.Health().Healthy() {
			t.Fatalf("unhealthy at %v with every other Pod read answered", clk.Since(epoch))
		}
		tick(t, clk, 2*time.Second)
	}
	// Round 7, at 12s, reads the Pod: the claim has not been served for
	// 12s, more than the stale TTL.
	eventually(t, "claims unreadable", func() bool { return lost.count("resource claims unreadable") == 1 })
}

// "Control-plane liveness is the API server answering for the Pod": a
// NotFound is an answer, as a Pod of another UID is. After a Pod is
// deleted, the health stays in sync while the API server keeps answering.
func TestPodNotFoundIsAnAnswer(t *testing.T) {
	h, k, clk := newHome(t, nil)
	var lost scopeLosses
	h.OnScopeLost(lost.fn)
	run(t, h)
	rounds(t, k, 1)
	k.DeletePod(testNS, testPod)
	for i := 2; i <= 4; i++ {
		tick(t, clk, 15*time.Second)
		rounds(t, k, i)
	}
	eventually(t, "the last NotFound marked as a sync", func() bool { return h.Health().LastSync().Equal(epoch.Add(45 * time.Second)) })
	if !h.Health().Healthy() {
		t.Fatal("unhealthy while the API server answers NotFound for the Pod")
	}
	if n := lost.count("pod deleted"); n != 1 {
		t.Fatalf("\"pod deleted\" delivered %d times, want once", n)
	}
}
