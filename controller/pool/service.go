package pool

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// ServiceSelector is what a pool's Service selects: the pool's grant Pods that serve (not those
// draining). Its EndpointSlices list those of them that are Ready.
func ServiceSelector(poolName string) map[string]string {
	return map[string]string{LabelPool: poolName, LabelServing: "true"}
}

// PoolService builds p's Service: headless, named like the pool, in its namespace, controlled by
// it, selecting ServiceSelector, with the one port "api" (TCP 8484, fiberd's API: TLS 1.3 with
// client certificates) and no address of a Pod that is not ready. Clients find the pool's grant
// Pods in its EndpointSlices (label kubernetes.io/service-name=<pool>). It is pure.
func PoolService(p *v1alpha1.FiberPool) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:      p.Name,
			Namespace: p.Namespace,
			Labels:    map[string]string{LabelName: "fiberd", LabelPool: p.Name},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(p, v1alpha1.GroupVersion.WithKind("FiberPool")),
			},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 ServiceSelector(p.Name),
			PublishNotReadyAddresses: false,
			Ports: []corev1.ServicePort{{
				Name:       "api",
				Protocol:   corev1.ProtocolTCP,
				Port:       apiPort,
				TargetPort: intstr.FromString("api"),
			}},
		},
	}
}

// ensureService creates p's Service, or puts back what of it the controller decides (selector,
// ports, labels) when someone changed it. A Service of that name the pool does not control is an
// error naming it: the controller neither adopts nor replaces it.
func (r *Reconciler) ensureService(ctx context.Context, log logr.Logger, p *v1alpha1.FiberPool) error {
	want := PoolService(p)
	var got corev1.Service
	err := r.client.Get(ctx, client.ObjectKeyFromObject(want), &got)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create service %s/%s: %w", want.Namespace, want.Name, err)
		}
		log.Info("created pool service", "service", want.Name)
		return nil
	case err != nil:
		return fmt.Errorf("service %s/%s: %w", want.Namespace, want.Name, err)
	}
	if !metav1.IsControlledBy(&got, p) {
		return fmt.Errorf("service %s/%s exists and is not this pool's: delete or rename it, the pool's Service must have the pool's name", got.Namespace, got.Name)
	}
	if got.Spec.ClusterIP != corev1.ClusterIPNone {
		// clusterIP cannot be changed in place.
		return fmt.Errorf("service %s/%s has clusterIP %s, want None (headless): delete it and the controller makes it again", got.Namespace, got.Name, got.Spec.ClusterIP)
	}
	upd := got.DeepCopy()
	upd.Spec.Selector = want.Spec.Selector
	upd.Spec.Ports = want.Spec.Ports
	upd.Spec.PublishNotReadyAddresses = false
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		upd.Labels[k] = v
	}
	// The API server fills each port's nodePort and appProtocol as it sees fit; compare what
	// the controller sets.
	if equality.Semantic.DeepEqual(got.Labels, upd.Labels) && !got.Spec.PublishNotReadyAddresses &&
		equality.Semantic.DeepEqual(got.Spec.Selector, upd.Spec.Selector) && samePorts(got.Spec.Ports, want.Spec.Ports) {
		return nil
	}
	if err := r.client.Update(ctx, upd); err != nil {
		if apierrors.IsConflict(err) {
			return nil // the cache was behind; the Service's change reconciles the pool again
		}
		return fmt.Errorf("update service %s/%s: %w", got.Namespace, got.Name, err)
	}
	log.Info("restored pool service", "service", got.Name)
	return nil
}

// samePorts compares the fields of the Services' ports the controller sets.
func samePorts(a, b []corev1.ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Protocol != b[i].Protocol || a[i].Port != b[i].Port || a[i].TargetPort != b[i].TargetPort {
			return false
		}
	}
	return true
}
