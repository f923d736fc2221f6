package pool

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestPlan checks which ordinals a reconcile creates and which Pods it deletes.
func TestPlan(t *testing.T) {
	pool := testPool(nil)
	now := metav1.Now()
	pod := func(ord int32, mut func(*corev1.Pod)) corev1.Pod {
		p, err := GrantPod(pool, ord, Shape{})
		if err != nil {
			t.Fatal(err)
		}
		p.UID = types.UID("uid-" + p.Name)
		if mut != nil {
			mut(p)
		}
		return *p
	}
	names := func(pods []*corev1.Pod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p.Name)
		}
		return out
	}
	tests := []struct {
		name      string
		replicas  int32
		pods      []corev1.Pod
		create    []int32
		remove    []string
		active    []string
		waiting   int
		scaleDown int
	}{
		{name: "empty pool of 4", replicas: 4, create: []int32{0, 1, 2, 3}},
		{
			name: "a hole is filled", replicas: 4,
			pods:   []corev1.Pod{pod(0, nil), pod(1, nil), pod(3, nil)},
			create: []int32{2}, active: []string{"web-0", "web-1", "web-3"},
		},
		{
			name: "scale down deletes the highest first", replicas: 2,
			pods:   []corev1.Pod{pod(0, nil), pod(2, nil), pod(1, nil), pod(3, nil)},
			remove: []string{"web-3", "web-2"}, active: []string{"web-0", "web-1"}, scaleDown: 2,
		},
		{
			name: "a failed pod is deleted, recreated once gone", replicas: 2,
			pods:   []corev1.Pod{pod(0, nil), pod(1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })},
			remove: []string{"web-1"}, active: []string{"web-0"}, waiting: 1,
		},
		{
			name: "a terminating pod blocks its ordinal", replicas: 2,
			pods:   []corev1.Pod{pod(0, nil), pod(1, func(p *corev1.Pod) { p.DeletionTimestamp = &now })},
			active: []string{"web-0"}, waiting: 1,
		},
		{
			name: "pods of another owner are not ours", replicas: 1,
			// An earlier pool's Pod of the same name: ignored, and its ordinal asked for again
			// (AlreadyExists until the garbage collector removes it).
			pods:   []corev1.Pod{pod(0, func(p *corev1.Pod) { p.OwnerReferences[0].UID = "old-pool" })},
			create: []int32{0},
		},
		{
			name: "a pod whose name does not match its ordinal is removed", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, func(p *corev1.Pod) { p.Labels[LabelOrdinal] = "0"; p.Name = "web-x" })},
			remove: []string{"web-x"}, active: []string{"web-0"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := pool.DeepCopy()
			p.Spec.Replicas = ptr.To(tc.replicas)
			pl := planFor(p, tc.pods)
			if !slices.Equal(pl.create, tc.create) {
				t.Errorf("create %v, want %v", pl.create, tc.create)
			}
			if got := names(pl.remove); !slices.Equal(got, tc.remove) {
				t.Errorf("remove %v, want %v", got, tc.remove)
			}
			if got := names(pl.active); !slices.Equal(got, tc.active) {
				t.Errorf("active %v, want %v", got, tc.active)
			}
			if pl.waiting != tc.waiting || pl.scaleDown != tc.scaleDown {
				t.Errorf("waiting %d scaleDown %d, want %d %d", pl.waiting, pl.scaleDown, tc.waiting, tc.scaleDown)
			}
		})
	}
}
