package kubernetes_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

// condition is the readiness condition of the Pod k holds, nil for none.
func condition(t *testing.T, k *fake.Kube) *corev1.PodCondition {
	t.Helper()
	p, ok := k.Pod(testNS, testPod)
	if !ok {
		t.Fatal("the Pod is gone")
	}
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == kubernetes.PodConditionZygoteReady {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func TestConditionNames(t *testing.T) {
	// The controller's readiness gate and its readers match these strings.
	if kubernetes.PodConditionZygoteReady != "fiberd.io/zygote-ready" ||
		kubernetes.ReasonTemplateWarm != "TemplateWarm" ||
		kubernetes.ReasonNoWarmTemplate != "NoWarmTemplate" {
		t.Fatalf("condition names changed: %q %q %q", kubernetes.PodConditionZygoteReady, kubernetes.ReasonTemplateWarm, kubernetes.ReasonNoWarmTemplate)
	}
}

// PublishReady "sets the Pod condition when that flips 'any template is
// warm'": True with ReasonTemplateWarm, False with ReasonNoWarmTemplate, a
// message naming the grant, stamped by the clock; no patch when nothing
// flipped. Ready "reports whether any grant's template is warm".
func TestPublishReadySetsConditionOnFlip(t *testing.T) {
	h, k, _ := newHome(t, nil)
	ctx := context.Background()
	steps := []struct {
		uid     string
		ready   bool
		patches int
		status  corev1.ConditionStatus // "" = no condition yet
		reason  string
		names   string
	}{
		{"grant-a", false, 0, "", "", ""}, // cold stays cold
		{"grant-a", true, 1, corev1.ConditionTrue, kubernetes.ReasonTemplateWarm, "grant-a"},
		{"grant-b", true, 1, corev1.ConditionTrue, kubernetes.ReasonTemplateWarm, "grant-a"},  // still warm
		{"grant-a", false, 1, corev1.ConditionTrue, kubernetes.ReasonTemplateWarm, "grant-a"}, // b still warm
		{"grant-b", false, 2, corev1.ConditionFalse, kubernetes.ReasonNoWarmTemplate, "grant-b"},
		{"grant-b", false, 2, corev1.ConditionFalse, kubernetes.ReasonNoWarmTemplate, "grant-b"},
	}
	for i, s := range steps {
		if err := h.PublishReady(ctx, s.uid, s.ready); err != nil {
			t.Fatalf("step %d: PublishReady: %v", i, err)
		}
		if n := k.Calls(fake.PatchPodStatus); n != s.patches {
			t.Fatalf("step %d (%s %v): %d patches, want %d", i, s.uid, s.ready, n, s.patches)
		}
		if want := s.status == corev1.ConditionTrue; h.Ready() != want {
			t.Fatalf("step %d: Ready() = %v, want %v", i, h.Ready(), want)
		}
		c := condition(t, k)
		if s.status == "" {
			if c != nil {
				t.Fatalf("step %d: condition %+v, want none", i, c)
			}
			continue
		}
		if c == nil || c.Status != s.status || c.Reason != s.reason || !strings.Contains(c.Message, s.names) {
			t.Fatalf("step %d: condition %+v, want %s/%s naming %s", i, c, s.status, s.reason, s.names)
		}
		if !c.LastTransitionTime.Time.Equal(epoch) {
			t.Fatalf("step %d: lastTransitionTime %v, want the clock's %v", i, c.LastTransitionTime, epoch)
		}
	}
	// The patch carried only this condition: the Pod's others are intact.
	p, _ := k.Pod(testNS, testPod)
	kept := false
	for _, c := range p.Status.Conditions {
		kept = kept || c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue
	}
	if len(p.Status.Conditions) != 2 || !kept {
		t.Fatalf("conditions after the patches: %+v; want PodScheduled kept beside ours", p.Status.Conditions)
	}
}

// The patch is one strategic merge patch of status.conditions holding only
// this condition.
func TestPublishReadyPatchShape(t *testing.T) {
	h, k, _ := newHome(t, nil)
	if err := h.PublishReady(context.Background(), "grant-a", true); err != nil {
		t.Fatal(err)
	}
	var patch struct {
		Status struct {
			Conditions []map[string]any `json:"conditions"`
		} `json:"status"`
	}
	raw := k.Patches()[0]
	if err := json.Unmarshal(raw, &patch); err != nil {
		t.Fatalf("patch %s: %v", raw, err)
	}
	if len(patch.Status.Conditions) != 1 {
		t.Fatalf("patch %s: want exactly one condition", raw)
	}
	c := patch.Status.Conditions[0]
	for _, f := range []string{"type", "status", "reason", "message", "lastTransitionTime"} {
		if _, ok := c[f]; !ok {
			t.Errorf("patch %s has no %s", raw, f)
		}
	}
	var top map[string]any
	_ = json.Unmarshal(raw, &top)
	if len(top) != 1 {
		t.Errorf("patch %s touches more than status", raw)
	}
}

// A failed patch is returned, the record stands, and "a poll round that
// reads the Pod and finds the condition disagreeing with Ready() patches
// again".
func TestFailedPatchIsRepairedByTheNextRound(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	k.Fail(fake.PatchPodStatus, errors.New("apiserver: 503"))
	if err := h.PublishReady(context.Background(), "grant-a", true); err == nil {
		t.Fatal("PublishReady hid the failed patch")
	}
	if !h.Ready() {
		t.Fatal("Ready() is false after a failed patch; the record must stand")
	}
	k.Fail(fake.PatchPodStatus, nil)
	tick(t, clk, 15*time.Second)
	eventually(t, "the condition repaired, naming the warm grant", func() bool {
		c := condition(t, k)
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == kubernetes.ReasonTemplateWarm &&
			strings.Contains(c.Message, "grant-a")
	})
}

// Someone else's write is repaired the same way, and a round that finds
// the condition agreeing sends no patch.
func TestOtherWriterIsRepairedAndAgreementIsLeftAlone(t *testing.T) {
	h, k, clk := newHome(t, nil)
	if err := h.PublishReady(context.Background(), "grant-a", true); err != nil {
		t.Fatal(err)
	}
	run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	settle()
	if n := k.Calls(fake.PatchPodStatus); n != 1 {
		t.Fatalf("%d patches with the condition already right, want the 1 from PublishReady", n)
	}
	p, _ := k.Pod(testNS, testPod)
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == kubernetes.PodConditionZygoteReady {
			p.Status.Conditions[i].Status = corev1.ConditionFalse
			p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(epoch)
		}
	}
	k.SetPod(p)
	tick(t, clk, 15*time.Second)
	eventually(t, "the condition repaired", func() bool {
		c := condition(t, k)
		return c != nil && c.Status == corev1.ConditionTrue
	})
}

// A Pod without the condition agrees with "not ready": no patch.
func TestNoConditionAgreesWithNotReady(t *testing.T) {
	h, k, clk := newHome(t, nil)
	run(t, h)
	rounds(t, k, 1)
	tick(t, clk, 15*time.Second)
	rounds(t, k, 2)
	settle()
	if n := k.Calls(fake.PatchPodStatus); n != 0 {
		t.Fatalf("%d patches for a home that never was ready", n)
	}
}

// Poll: "It is also how long one round may take." A readiness patch that
// hangs (the agent's context has no deadline) holds up no poll round: the
// Pod, its Namespace and its claims are read every Poll, the health stays
// in sync for longer than the stale TTL, the repair waits for a later
// round, and Run returns when its context ends while the patch still
// hangs.
func TestHangingPatchHoldsUpNoRound(t *testing.T) {
	h, k, clk := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 10 * time.Second; c.Poll = 2 * time.Second })
	k.SetPod(withClaim(newPod(), "gpu"))
	k.SetResourceClaim(newClaim("gpu"))
	entered := make(chan struct{}, 16)
	release := make(chan struct{})
	k.Intercept(fake.PatchPodStatus, func(context.Context, string, string) error {
		entered <- struct{}{}
		<-release // a write stuck on the wire, whatever its context says
		return errors.New("stuck write released by the test")
	})
	published := make(chan error, 1)
	t.Cleanup(func() {
		close(release)
		<-published
	})
	stop := run(t, h)
	rounds(t, k, 1)
	go func() { published <- h.PublishReady(context.Background(), "grant-a", true) }()
	<-entered
	for i := 2; i <= 8; i++ { // 14s of rounds: beyond the 10s stale TTL
		tick(t, clk, 2*time.Second)
		rounds(t, k, i)
	}
	if !h.Health().Healthy() {
		t.Fatal("stale although every round read the Pod")
	}
	if got := h.Health().LastSync(); !got.Equal(epoch.Add(14 * time.Second)) {
		t.Fatalf("LastSync = %v, want the eighth round's %v", got, epoch.Add(14*time.Second))
	}
	if n := k.Calls(fake.PatchPodStatus); n != 1 {
		t.Fatalf("%d patches; a round must not start a repair while a patch is in flight", n)
	}
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return while a readiness patch hangs")
	}
}

// PublishReady: a readiness write is bounded by Poll, like every read of a
// round, whatever the caller's context; so is its wait for a write still in
// flight. The failure is returned, and the record stands.
func TestPublishReadyIsBoundedByPoll(t *testing.T) {
	const poll = 100 * time.Millisecond // real time: the bound is I/O time
	t.Run("the patch", func(t *testing.T) {
		h, k, _ := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 4 * poll; c.Poll = poll })
		deadline := make(chan time.Duration, 1)
		k.Intercept(fake.PatchPodStatus, func(ctx context.Context, _, _ string) error {
			dl, ok := ctx.Deadline()
			if !ok {
				dl = time.Now().Add(time.Hour)
			}
			deadline <- time.Until(dl)
			<-ctx.Done() // an API server that never answers
			return ctx.Err()
		})
		done := make(chan error, 1)
		go func() { done <- h.PublishReady(context.Background(), "grant-a", true) }()
		if left := <-deadline; left > poll {
			t.Fatalf("the patch's context ends in %v, want at most Poll (%v)", left, poll)
		}
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("PublishReady reported a patch that never landed as done")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("PublishReady still waits on a patch that never answers")
		}
		if !h.Ready() {
			t.Fatal("Ready() is false after a failed patch; the record must stand")
		}
	})
	t.Run("the wait for a patch in flight", func(t *testing.T) {
		h, k, _ := newHome(t, func(c *kubernetes.Config) { c.StaleTTL = 4 * poll; c.Poll = poll })
		entered := make(chan struct{}, 4)
		release := make(chan struct{})
		k.Intercept(fake.PatchPodStatus, func(context.Context, string, string) error {
			entered <- struct{}{}
			<-release
			return errors.New("stuck write released by the test")
		})
		first := make(chan error, 1)
		go func() { first <- h.PublishReady(context.Background(), "grant-a", true) }()
		t.Cleanup(func() {
			close(release)
			<-first
		})
		<-entered
		second := make(chan error, 1)
		go func() { second <- h.PublishReady(context.Background(), "grant-a", false) }()
		select {
		case err := <-second:
			if err == nil {
				t.Fatal("PublishReady reported a patch it could not send as done")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("PublishReady waits without bound for the patch in flight")
		}
	})
}
