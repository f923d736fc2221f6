package pool

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// fakeReconciler is a Reconciler on controller-runtime's fake client holding pool and pods, with
// a fake clock at t0.
func fakeReconciler(t *testing.T, pool *v1alpha1.FiberPool, pods ...corev1.Pod) (*Reconciler, client.Client, *clocktesting.FakePassiveClock) {
	return fakeReconcilerWith(t, FibersConfig{}, pool, pods...)
}

// fakeReconcilerWith is fakeReconciler reading fibers in use as fc says.
func fakeReconcilerWith(t *testing.T, fc FibersConfig, pool *v1alpha1.FiberPool, pods ...corev1.Pod) (*Reconciler, client.Client, *clocktesting.FakePassiveClock) {
	t.Helper()
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{pool}
	for i := range pods {
		objs = append(objs, &pods[i])
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.FiberPool{}).
		WithIndex(&corev1.Pod{}, ownerIndex, poolOf).Build()
	clk := clocktesting.NewFakePassiveClock(t0)
	cfg := Config{Clock: clk, Fibers: fc}.withDefaults()
	return &Reconciler{client: c, cfg: cfg, fibers: newFiberCounter(cfg.Fibers)}, c, clk
}

// TestReconcileDrainTimeout scales a pool down on a fake clock: the Pod is labelled out of the
// Service and stamped, the reconcile asks to come back when the grace period ends, nothing
// happens before, and the Pod is deleted after.
func TestReconcileDrainTimeout(t *testing.T) {
	pool := testPool(func(p *v1alpha1.FiberPool) {
		p.Spec.Replicas = ptr.To[int32](1)
		p.Spec.DrainGracePeriod = &metav1.Duration{Duration: time.Minute}
	})
	r, c, clk := fakeReconciler(t, pool, runningPod(t, pool, 0, nil), runningPod(t, pool, 1, nil))
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)}

	res, err := r.Reconcile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Minute + time.Second; res.RequeueAfter != want {
		t.Errorf("requeue after %v, want the grace period and a second, %v", res.RequeueAfter, want)
	}
	var web1 corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "web-1"}, &web1); err != nil {
		t.Fatal(err)
	}
	if web1.Labels[LabelServing] != "false" || web1.Annotations[AnnotationDrainStarted] != "2026-12-05T08:00:00Z" {
		t.Errorf("web-1 labels %v annotations %v, want serving=false and the drain's start", web1.Labels, web1.Annotations)
	}
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "web"}, &svc); err != nil {
		t.Errorf("the pool's service: %v", err)
	}
	var got v1alpha1.FiberPool
	if err := c.Get(ctx, req.NamespacedName, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.DrainingReplicas != 1 || got.Status.ReadyReplicas != 1 || got.Status.Fibers.InUse != nil {
		t.Errorf("status %+v, want 1 draining, 1 ready, fibers in use unknown", got.Status)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFibersCounted); cond == nil || cond.Reason != v1alpha1.ReasonNoClientCertificate {
		t.Errorf("FibersCounted %+v, want NoClientCertificate", cond)
	}

	clk.SetTime(t0.Add(time.Minute - time.Second))
	if res, err = r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&web1), &web1); err != nil {
		t.Fatalf("web-1 before its grace period ended: %v", err)
	}
	if res.RequeueAfter != 2*time.Second {
		t.Errorf("requeue after %v a second before the deadline, want 2s", res.RequeueAfter)
	}

	clk.SetTime(t0.Add(time.Minute))
	if res, err = r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&web1), &web1); !apierrors.IsNotFound(err) {
		t.Errorf("web-1 after its grace period: %v, want deleted", err)
	}
	if res.RequeueAfter != 0 {
		t.Errorf("requeue after %v with nothing draining and no fibers to read, want none", res.RequeueAfter)
	}
}

// TestReconcileForeignService leaves a Service of the pool's name it does not control alone and
// says so in ReplicaFailure.
func TestReconcileForeignService(t *testing.T) {
	pool := testPool(func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](0) })
	r, c, _ := fakeReconciler(t, pool)
	ctx := context.Background()
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"}, Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.9"}}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)}); err == nil {
		t.Error("reconcile with someone else's service of the pool's name: no error")
	}
	var got v1alpha1.FiberPool
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &got); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReplicaFailure); cond == nil || cond.Reason != v1alpha1.ReasonServiceFailed {
		t.Errorf("ReplicaFailure %+v, want ServiceFailed", cond)
	}
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKeyFromObject(other), &svc); err != nil || svc.Spec.ClusterIP != "10.0.0.9" || len(svc.OwnerReferences) != 0 {
		t.Errorf("the foreign service was changed: %+v, %v", svc, err)
	}
}

// TestReconcileFibersInUse reports the fibers in use the Pods' fiberd answered, and names the
// Pod that did not answer.
func TestReconcileFibersInUse(t *testing.T) {
	f := newFakeFiberd(t, "fiberd.ns.svc")
	f.pod("127.0.0.1", 3)
	f.pod("127.0.0.2", 4)
	f.pod("127.0.0.3", 0)
	f.unreachable("127.0.0.3")
	pool := testPool(func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](3) })
	at := func(ip string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Status.PodIP = ip } }
	r, c, _ := fakeReconcilerWith(t, f.config(""), pool,
		runningPod(t, pool, 0, at("127.0.0.1")), runningPod(t, pool, 1, at("127.0.0.2")), runningPod(t, pool, 2, at("127.0.0.3")))
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != DefaultFibersInterval {
		t.Errorf("requeue after %v, want the fibers interval %v to read them again", res.RequeueAfter, DefaultFibersInterval)
	}
	var got v1alpha1.FiberPool
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(pool), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Fibers.InUse == nil || *got.Status.Fibers.InUse != 7 || got.Status.Fibers.Capacity != 24 {
		t.Errorf("fibers %+v, want 7 in use of 24", got.Status.Fibers)
	}
	cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFibersCounted)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonStatusUnreachable || !strings.Contains(cond.Message, "web-2") {
		t.Errorf("FibersCounted %+v, want False StatusUnreachable naming web-2", cond)
	}
}
