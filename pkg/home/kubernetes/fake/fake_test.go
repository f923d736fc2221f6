package fake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

var _ kubernetes.Kube = (*fake.Kube)(nil)

func pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1", Labels: map[string]string{"a": "b"}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: "fiberd.io/zygote-ready", Status: corev1.ConditionFalse, Reason: "NoWarmTemplate"},
		}},
	}
}

// Every read of something not set is NotFound; set objects are served as
// copies the caller may change.
func TestServesFromMemory(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	if _, err := k.GetPod(ctx, "ns", "p"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetPod before SetPod: %v, want NotFound", err)
	}
	if _, err := k.GetNamespace(ctx, "ns"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetNamespace: %v, want NotFound", err)
	}
	if _, err := k.GetResourceClaim(ctx, "ns", "c"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetResourceClaim: %v, want NotFound", err)
	}
	if err := k.PatchPodStatus(ctx, "ns", "p", []byte(`{}`)); !apierrors.IsNotFound(err) {
		t.Fatalf("PatchPodStatus: %v, want NotFound", err)
	}

	k.SetPod(pod())
	k.SetNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	k.SetResourceClaim(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}})
	p, err := k.GetPod(ctx, "ns", "p")
	if err != nil || p.UID != "u1" {
		t.Fatalf("GetPod = %v, %v", p, err)
	}
	p.Labels["a"] = "changed"
	if again, _ := k.GetPod(ctx, "ns", "p"); again.Labels["a"] != "b" {
		t.Fatal("GetPod returned the stored Pod, not a copy")
	}
	if n, err := k.GetNamespace(ctx, "ns"); err != nil || n.Name != "ns" {
		t.Fatalf("GetNamespace = %v, %v", n, err)
	}
	if c, err := k.GetResourceClaim(ctx, "ns", "c"); err != nil || c.Name != "c" {
		t.Fatalf("GetResourceClaim = %v, %v", c, err)
	}

	k.DeletePod("ns", "p")
	k.DeleteNamespace("ns")
	k.DeleteResourceClaim("ns", "c")
	if _, err := k.GetPod(ctx, "ns", "p"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetPod after DeletePod: %v", err)
	}
	if _, err := k.GetNamespace(ctx, "ns"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetNamespace after DeleteNamespace: %v", err)
	}
	if _, err := k.GetResourceClaim(ctx, "ns", "c"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetResourceClaim after DeleteResourceClaim: %v", err)
	}
}

// PatchPodStatus applies a strategic merge patch, merging conditions by
// type, and keeps only the status, as the status subresource does.
func TestPatchPodStatus(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	k.SetPod(pod())
	patch := []byte(`{"metadata":{"labels":{"a":"patched"}},"status":{"conditions":[{"type":"fiberd.io/zygote-ready","status":"True","reason":"TemplateWarm"}]}}`)
	if err := k.PatchPodStatus(ctx, "ns", "p", patch); err != nil {
		t.Fatal(err)
	}
	p, _ := k.Pod("ns", "p")
	if p.Labels["a"] != "b" {
		t.Fatal("a status patch changed the metadata")
	}
	if len(p.Status.Conditions) != 2 {
		t.Fatalf("conditions %+v, want both kept", p.Status.Conditions)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "fiberd.io/zygote-ready" && (c.Status != corev1.ConditionTrue || c.Reason != "TemplateWarm") {
			t.Fatalf("condition %+v not patched", c)
		}
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			t.Fatalf("condition %+v changed", c)
		}
	}
	if got := k.Patches(); len(got) != 1 || string(got[0]) != string(patch) {
		t.Fatalf("Patches() = %q", got)
	}
	if err := k.PatchPodStatus(ctx, "ns", "p", []byte(`not json`)); !apierrors.IsBadRequest(err) {
		t.Fatalf("a broken patch: %v, want BadRequest", err)
	}
}

// Calls counts per method, failed calls too; Fail injects an error per
// method until cleared; Intercept may block until ctx ends.
func TestCallsFailAndIntercept(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	k.SetPod(pod())
	boom := errors.New("boom")
	k.Fail(fake.GetPod, boom)
	if _, err := k.GetPod(ctx, "ns", "p"); !errors.Is(err, boom) {
		t.Fatalf("GetPod with Fail: %v", err)
	}
	if _, err := k.GetNamespace(ctx, "ns"); errors.Is(err, boom) {
		t.Fatal("Fail of GetPod hit GetNamespace")
	}
	k.Fail(fake.GetPod, nil)
	if _, err := k.GetPod(ctx, "ns", "p"); err != nil {
		t.Fatalf("GetPod after clearing Fail: %v", err)
	}
	if n := k.Calls(fake.GetPod); n != 2 {
		t.Fatalf("Calls(GetPod) = %d, want 2", n)
	}
	if n := k.Calls(fake.GetNamespace); n != 1 {
		t.Fatalf("Calls(GetNamespace) = %d, want 1", n)
	}

	var gotNS, gotName string
	k.Intercept(fake.PatchPodStatus, func(ctx context.Context, ns, name string) error {
		gotNS, gotName = ns, name
		<-ctx.Done()
		return ctx.Err()
	})
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := k.PatchPodStatus(tctx, "ns", "p", []byte(`{}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked patch: %v", err)
	}
	if gotNS != "ns" || gotName != "p" {
		t.Fatalf("intercept saw %q/%q", gotNS, gotName)
	}
}

// SetNoResourceClaims: a cluster without resource.k8s.io.
func TestNoResourceClaims(t *testing.T) {
	ctx := context.Background()
	k := fake.New()
	k.SetResourceClaim(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}})
	k.SetNoResourceClaims(true)
	if _, err := k.GetResourceClaim(ctx, "ns", "c"); !errors.Is(err, kubernetes.ErrNoResourceClaims) {
		t.Fatalf("GetResourceClaim: %v, want ErrNoResourceClaims", err)
	}
	k.SetNoResourceClaims(false)
	if _, err := k.GetResourceClaim(ctx, "ns", "c"); err != nil {
		t.Fatalf("GetResourceClaim after the group is back: %v", err)
	}
}

// A cancelled context fails every call, as a client's would.
func TestCancelledContext(t *testing.T) {
	k := fake.New()
	k.SetPod(pod())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := k.GetPod(ctx, "ns", "p"); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetPod with a cancelled context: %v", err)
	}
}
