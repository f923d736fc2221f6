package pool

import (
	"cmp"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// plan is what one reconcile of a pool does to its grant Pods, worked out from the Pods it
// controls without any I/O.
type plan struct {
	// create are the ordinals below spec.replicas with no Pod, ascending.
	create []int32
	// remove are the Pods to delete: ordinals at or above spec.replicas (highest first), then
	// failed Pods below it, then Pods whose name or ordinal label is not the controller's.
	remove []*corev1.Pod
	// scaleDown is how many of remove are ordinals at or above spec.replicas.
	scaleDown int
	// active are the Pods that stay: not being deleted, not failed, ordinal below spec.replicas.
	active []*corev1.Pod
	// waiting is how many ordinals below spec.replicas wait for their Pod to be gone (being
	// deleted, or failed and about to be) before it is created again.
	waiting int
}

// planFor works out p's plan from pods, the Pods of p's namespace the cache has for p. It
// considers only the Pods p controls (owner reference with p's UID): a Pod of an earlier pool of
// the same name is left to the garbage collector, and its name blocks its ordinal until it is gone.
func planFor(p *v1alpha1.FiberPool, pods []corev1.Pod) plan {
	want := int32(0)
	if p.Spec.Replicas != nil {
		want = *p.Spec.Replicas
	}
	var pl plan
	taken := map[int32]bool{}
	var excess []*corev1.Pod
	for i := range pods {
		pod := &pods[i]
		if !metav1.IsControlledBy(pod, p) {
			continue
		}
		ordinal, ok := ordinalOf(p.Name, pod)
		switch {
		case !ok:
			if pod.DeletionTimestamp == nil {
				pl.remove = append(pl.remove, pod)
			}
		case ordinal >= want:
			taken[ordinal] = true
			if pod.DeletionTimestamp == nil {
				excess = append(excess, pod)
			}
		case pod.DeletionTimestamp != nil:
			taken[ordinal] = true
			pl.waiting++
		case failed(pod):
			taken[ordinal] = true
			pl.waiting++
			pl.remove = append(pl.remove, pod)
		default:
			taken[ordinal] = true
			pl.active = append(pl.active, pod)
		}
	}
	slices.SortFunc(excess, func(a, b *corev1.Pod) int {
		oa, _ := ordinalOf(p.Name, a)
		ob, _ := ordinalOf(p.Name, b)
		return cmp.Compare(ob, oa)
	})
	pl.scaleDown = len(excess)
	pl.remove = append(excess, pl.remove...)
	for o := int32(0); o < want; o++ {
		if !taken[o] {
			pl.create = append(pl.create, o)
		}
	}
	slices.SortFunc(pl.active, func(a, b *corev1.Pod) int {
		oa, _ := ordinalOf(p.Name, a)
		ob, _ := ordinalOf(p.Name, b)
		return cmp.Compare(oa, ob)
	})
	return pl
}

// ordinalOf is the Pod's ordinal in pool poolName, from its LabelOrdinal; false unless the label
// is a non-negative decimal and the Pod's name is PodName of it.
func ordinalOf(poolName string, pod *corev1.Pod) (int32, bool) {
	n, err := strconv.ParseInt(pod.Labels[LabelOrdinal], 10, 32)
	if err != nil || n < 0 || pod.Name != PodName(poolName, int32(n)) {
		return 0, false
	}
	return int32(n), true
}

// failed reports a Pod that will not run again: with restartPolicy Always that is one evicted or
// otherwise ended by its node (phase Failed), or, defensively, Succeeded.
func failed(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded
}

// ready reports a Pod whose PodReady condition is True.
func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
