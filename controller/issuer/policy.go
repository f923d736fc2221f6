package issuer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/controller/pool"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/grant"
	shared "fiberd.io/fiberd/pkg/issuer"
)

// PoolPolicy is the shared server's Policy (pkg/issuer) for grant Pods of FiberPools: it decides
// a Pod's grant from the pool that controls it.
//
// A Pod has a grant when it carries the label fiberd.io/pool naming a pool P, a controller owner
// reference to the FiberPool P in its namespace, and that pool exists with the reference's UID
// and is not being deleted. Its grant's template is the Pod's fiberd.io/template annotation,
// which the controller writes from the pool's spec when it creates the Pod: the template lives in
// the Pod's image, so a Pod created before a change of the pool's template keeps renewing the
// template its image carries until it is replaced. fibers.max, fibers.warm, wBudget and the lease
// come from the pool's spec as it is now, so a change of them reaches every Pod at its next
// renewal.
//
// A draining Pod (label fiberd.io/serving "false") still gets its grant renewed: it keeps serving
// the fibers it holds until the controller deletes it, and the deletion is its revocation.
type PoolPolicy struct {
	// Pools reads FiberPools, normally the manager's cache. Required.
	Pools client.Reader
	// Live reads a FiberPool the cache does not hold, so a pool created a moment ago is not taken
	// for a gone one. Nil means Pools' answer is final.
	Live client.Reader
}

// fiberPoolGroupKind is the kind a grant Pod's controller reference must name.
var fiberPoolGroupKind = schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "FiberPool"}

// Terms decides pod's grant. Its refusals name what to fix.
func (p PoolPolicy) Terms(ctx context.Context, pod *corev1.Pod) (shared.Terms, error) {
	ref := pod.Namespace + "/" + pod.Name
	poolName := pod.Labels[pool.LabelPool]
	if poolName == "" {
		return shared.Terms{}, shared.Refuse("pod %s has no %s label: the controller's issuer grants FiberPools' grant Pods only (use the development issuer for hand-made Pods)", ref, pool.LabelPool)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil {
		return shared.Terms{}, shared.Refuse("pod %s has no controller owner reference: it is not a grant Pod of FiberPool %s", ref, poolName)
	}
	gv, err := schema.ParseGroupVersion(owner.APIVersion)
	if err != nil || gv.WithKind(owner.Kind).GroupKind() != fiberPoolGroupKind || owner.Name != poolName {
		return shared.Terms{}, shared.Refuse("pod %s is controlled by %s %s, not by FiberPool %s", ref, owner.Kind, owner.Name, poolName)
	}
	fp, err := p.pool(ctx, pod.Namespace, poolName)
	switch {
	case apierrors.IsNotFound(err):
		return shared.Terms{}, shared.Refuse("pod %s: its FiberPool %s is gone", ref, poolName)
	case err != nil:
		return shared.Terms{}, shared.Unavailable("pod %s: reading FiberPool %s failed: %v", ref, poolName, err)
	}
	switch {
	case fp.UID != owner.UID:
		return shared.Terms{}, shared.Refuse("pod %s belongs to an earlier FiberPool %s (UID %s, now %s)", ref, poolName, owner.UID, fp.UID)
	case fp.DeletionTimestamp != nil:
		return shared.Terms{}, shared.Refuse("pod %s: its FiberPool %s is being deleted", ref, poolName)
	}
	template, ok := pod.Annotations[pool.AnnotationTemplate]
	if !ok {
		return shared.Terms{}, shared.NotYet("pod %s has no %s annotation yet: no grant assigned", ref, pool.AnnotationTemplate)
	}
	if err := grant.ValidTemplate(template); err != nil {
		return shared.Terms{}, shared.Refuse("pod %s: annotation %s: %v", ref, pool.AnnotationTemplate, err)
	}
	return poolTerms(fp, template)
}

// pool reads the FiberPool, from Live when Pools does not hold it.
func (p PoolPolicy) pool(ctx context.Context, namespace, name string) (*v1alpha1.FiberPool, error) {
	var fp v1alpha1.FiberPool
	key := client.ObjectKey{Namespace: namespace, Name: name}
	err := p.Pools.Get(ctx, key, &fp)
	if apierrors.IsNotFound(err) && p.Live != nil {
		err = p.Live.Get(ctx, key, &fp)
	}
	return &fp, err
}

// poolTerms are the terms fp's spec gives a grant of template.
func poolTerms(fp *v1alpha1.FiberPool, template string) (shared.Terms, error) {
	s := fp.Spec
	name := fp.Namespace + "/" + fp.Name
	t := shared.Terms{
		Template: template,
		Fibers:   core.Fibers{Max: int(s.FibersMax), Warm: int(s.FibersWarm)},
	}
	if s.FibersMax < 1 || s.FibersWarm < 0 || s.FibersWarm > s.FibersMax {
		return shared.Terms{}, shared.Refuse("FiberPool %s: fibersMax %d and fibersWarm %d: want 1 <= fibersMax and 0 <= fibersWarm <= fibersMax", name, s.FibersMax, s.FibersWarm)
	}
	if s.WBudget != nil {
		b, ok := s.WBudget.AsInt64()
		if !ok || b < 0 {
			return shared.Terms{}, shared.Refuse("FiberPool %s: wBudget %s is not a whole, non-negative number of bytes", name, s.WBudget.String())
		}
		t.WBudget = b
	}
	if s.Lease != nil {
		if s.Lease.Duration <= 0 {
			return shared.Terms{}, shared.Refuse("FiberPool %s: lease %s is not positive: set a lease such as 10m, or none for the issuer's default", name, s.Lease.Duration)
		}
		t.Lease = s.Lease.Duration
	}
	return t, nil
}
