package pool

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// t0 is the tests' fake now.
var t0 = time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)

// runningPod is pool's grant Pod of the given ordinal as the API server would hold it once its
// node ran it and it became ready, changed by mut.
func runningPod(t *testing.T, pool *v1alpha1.FiberPool, ord int32, mut func(*corev1.Pod)) corev1.Pod {
	t.Helper()
	p, err := GrantPod(pool, ord, Shape{})
	if err != nil {
		t.Fatal(err)
	}
	p.UID = types.UID(fmt.Sprintf("uid-%s-%s", p.Name, p.Labels[LabelRevision]))
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = fmt.Sprintf("10.0.0.%d", ord+1)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if mut != nil {
		mut(p)
	}
	return *p
}

// draining marks a Pod as the controller does when it starts draining it at started.
func draining(started time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Labels[LabelServing] = "false"
		p.Annotations[AnnotationDrainStarted] = started.Format(time.RFC3339)
	}
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// TestPlan checks which ordinals a reconcile creates, which Pods it drains and which it deletes.
func TestPlan(t *testing.T) {
	pool := testPool(nil)
	rev, err := Revision(pool, Shape{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(t0)
	pod := func(ord int32, mut func(*corev1.Pod)) corev1.Pod { return runningPod(t, pool, ord, mut) }
	uid := func(ord int32) types.UID { return types.UID(fmt.Sprintf("uid-web-%d-%s", ord, rev)) }
	tests := []struct {
		name      string
		replicas  int32
		grace     *time.Duration
		pods      []corev1.Pod
		inUse     map[types.UID]fiberCount
		create    []int32
		remove    []string
		drain     []string
		serve     []string
		active    []string
		draining  []string
		waiting   int
		scaleDown int
		next      time.Time
	}{
		{name: "empty pool of 4", replicas: 4, create: []int32{0, 1, 2, 3}},
		{
			name: "a hole is filled", replicas: 4,
			pods:   []corev1.Pod{pod(0, nil), pod(1, nil), pod(3, nil)},
			create: []int32{2}, active: []string{"web-0", "web-1", "web-3"},
		},
		{
			name: "scale down drains the highest first", replicas: 2,
			pods:  []corev1.Pod{pod(0, nil), pod(2, nil), pod(1, nil), pod(3, nil)},
			drain: []string{"web-3", "web-2"}, active: []string{"web-0", "web-1"}, draining: []string{"web-3", "web-2"},
			scaleDown: 2, next: t0.Add(DefaultDrainGracePeriod),
		},
		{
			name: "scale down deletes a pod that never ran at once", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, func(p *corev1.Pod) { p.Status = corev1.PodStatus{Phase: corev1.PodPending} })},
			remove: []string{"web-1"}, active: []string{"web-0"}, scaleDown: 1,
		},
		{
			name: "a drain grace period of zero deletes at once", replicas: 1, grace: ptr.To(time.Duration(0)),
			pods:   []corev1.Pod{pod(0, nil), pod(1, nil)},
			remove: []string{"web-1"}, active: []string{"web-0"}, scaleDown: 1,
		},
		{
			name: "a draining pod with fibers unknown waits its grace period", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Minute)))},
			active: []string{"web-0"}, draining: []string{"web-1"}, scaleDown: 1,
			next: t0.Add(DefaultDrainGracePeriod - time.Minute),
		},
		{
			name: "a draining pod with fibers in use waits its grace period", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Minute)))},
			inUse:  map[types.UID]fiberCount{uid(1): {n: 3, at: t0}},
			active: []string{"web-0"}, draining: []string{"web-1"}, scaleDown: 1,
			next: t0.Add(DefaultDrainGracePeriod - time.Minute),
		},
		{
			name: "a draining pod whose fibers ended is deleted", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Minute)))},
			inUse:  map[types.UID]fiberCount{uid(1): {n: 0, at: t0}},
			remove: []string{"web-1"}, active: []string{"web-0"}, scaleDown: 1,
		},
		{
			name: "no fibers counted before the drain settled is not enough", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Second)))},
			inUse:  map[types.UID]fiberCount{uid(1): {n: 0, at: t0}},
			active: []string{"web-0"}, draining: []string{"web-1"}, scaleDown: 1,
			next: t0.Add(DefaultDrainGracePeriod - time.Second),
		},
		{
			name: "no fibers counted before the drain started is not enough", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Minute)))},
			inUse:  map[types.UID]fiberCount{uid(1): {n: 0, at: t0.Add(-2 * time.Minute)}},
			active: []string{"web-0"}, draining: []string{"web-1"}, scaleDown: 1,
			next: t0.Add(DefaultDrainGracePeriod - time.Minute),
		},
		{
			name: "a draining pod past its grace period is deleted, fibers or not", replicas: 1,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-DefaultDrainGracePeriod)))},
			inUse:  map[types.UID]fiberCount{uid(1): {n: 5, at: t0}},
			remove: []string{"web-1"}, active: []string{"web-0"}, scaleDown: 1,
		},
		{
			name: "the pool's own grace period counts", replicas: 1, grace: ptr.To(10 * time.Second),
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-10*time.Second)))},
			remove: []string{"web-1"}, active: []string{"web-0"}, scaleDown: 1,
		},
		{
			name: "serving=false without the annotation starts a drain now", replicas: 1,
			pods:  []corev1.Pod{pod(0, nil), pod(1, func(p *corev1.Pod) { p.Labels[LabelServing] = "false" })},
			drain: []string{"web-1"}, active: []string{"web-0"}, draining: []string{"web-1"}, scaleDown: 1,
			next: t0.Add(DefaultDrainGracePeriod),
		},
		{
			name: "a drain once started finishes, even if the ordinal is wanted again", replicas: 2,
			pods:   []corev1.Pod{pod(0, nil), pod(1, draining(t0.Add(-time.Minute)))},
			active: []string{"web-0"}, draining: []string{"web-1"}, waiting: 1,
			next: t0.Add(DefaultDrainGracePeriod - time.Minute),
		},
		{
			name: "a pod of an earlier controller gets the serving label", replicas: 1,
			pods:  []corev1.Pod{pod(0, func(p *corev1.Pod) { delete(p.Labels, LabelServing) })},
			serve: []string{"web-0"}, active: []string{"web-0"},
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
			if tc.grace != nil {
				p.Spec.DrainGracePeriod = &metav1.Duration{Duration: *tc.grace}
			}
			pl := planFor(p, tc.pods, planInput{now: t0, revision: rev, inUse: tc.inUse})
			if !slices.Equal(pl.create, tc.create) {
				t.Errorf("create %v, want %v", pl.create, tc.create)
			}
			for what, got := range map[string][2][]string{
				"remove": {names(pl.remove), tc.remove}, "drain": {names(pl.drain), tc.drain},
				"serve": {names(pl.serve), tc.serve}, "active": {names(pl.active), tc.active},
				"draining": {names(pl.draining), tc.draining},
			} {
				if !slices.Equal(got[0], got[1]) {
					t.Errorf("%s %v, want %v", what, got[0], got[1])
				}
			}
			if pl.waiting != tc.waiting || pl.scaleDown != tc.scaleDown {
				t.Errorf("waiting %d scaleDown %d, want %d %d", pl.waiting, pl.scaleDown, tc.waiting, tc.scaleDown)
			}
			if !pl.next.Equal(tc.next) {
				t.Errorf("next %v, want %v", pl.next, tc.next)
			}
			if pl.rolling {
				t.Error("rolling, want not")
			}
		})
	}
}

// sim plays the API server, kubelet and fiberd for planFor: it applies each plan as the
// Reconciler would, makes created Pods ready a step later, and ends draining Pods' fibers when
// fibersEnd says so.
type sim struct {
	t         *testing.T
	pool      *v1alpha1.FiberPool
	pods      map[string]corev1.Pod
	now       time.Time
	step      time.Duration
	inUse     map[types.UID]fiberCount
	fibersEnd bool // draining Pods report 0 fibers in use once drained for a step
	seq       int
}

func newSim(t *testing.T, pool *v1alpha1.FiberPool) *sim {
	s := &sim{t: t, pool: pool, pods: map[string]corev1.Pod{}, now: t0, step: 10 * time.Second, inUse: map[types.UID]fiberCount{}}
	for o := range *pool.Spec.Replicas {
		pod := runningPod(t, pool, o, nil)
		s.pods[pod.Name] = pod
	}
	return s
}

// reconcile runs one plan and applies it, then lets time pass.
func (s *sim) reconcile() plan {
	s.t.Helper()
	rev, err := Revision(s.pool, Shape{})
	if err != nil {
		s.t.Fatal(err)
	}
	var list []corev1.Pod
	for _, name := range slices.Sorted(maps.Keys(s.pods)) {
		q := s.pods[name]
		list = append(list, *q.DeepCopy())
	}
	pl := planFor(s.pool, list, planInput{now: s.now, revision: rev, inUse: s.inUse})
	for _, pod := range pl.drain {
		q := s.pods[pod.Name]
		draining(s.now)(&q)
		s.pods[pod.Name] = q
		s.inUse[q.UID] = fiberCount{n: 2, at: s.now}
	}
	for _, pod := range pl.remove {
		delete(s.pods, pod.Name)
	}
	// Pods made in an earlier step become ready now; those made now, at the next step.
	for name, q := range s.pods {
		if q.Status.PodIP == "" {
			q.Status.Phase, q.Status.PodIP = corev1.PodRunning, "10.1.0.1"
			q.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			s.pods[name] = q
		}
	}
	for _, o := range pl.create {
		pod, err := GrantPod(s.pool, o, Shape{})
		if err != nil {
			s.t.Fatal(err)
		}
		s.seq++
		pod.UID = types.UID(fmt.Sprintf("uid-%d", s.seq))
		s.pods[pod.Name] = *pod
	}
	if s.fibersEnd {
		for _, q := range s.pods {
			if q.Labels[LabelServing] == "false" {
				s.inUse[q.UID] = fiberCount{n: 0, at: s.now.Add(s.step)}
			}
		}
	}
	s.now = s.now.Add(s.step)
	return pl
}

// readyServing counts the Pods that are in the pool's Service and ready.
func (s *sim) readyServing() int32 {
	n := int32(0)
	for _, q := range s.pods {
		if q.Labels[LabelServing] == "true" && ready(&q) {
			n++
		}
	}
	return n
}

// roll changes the pool's image and runs reconciles until the pool settles, checking at every
// step that the ready serving Pods never drop below replicas, that the Pods never exceed
// replicas+1 and that at most one drains (unless scaling, which drains Pods above replicas);
// it returns how many steps the roll took.
func (s *sim) roll(image string) int {
	return s.run(image, false)
}

func (s *sim) run(image string, scaling bool) int {
	s.t.Helper()
	want := *s.pool.Spec.Replicas
	s.pool.Spec.Template.Image = image
	rev, _ := Revision(s.pool, Shape{})
	for i := 0; i < 200; i++ {
		pl := s.reconcile()
		if got := s.readyServing(); got < want {
			s.t.Fatalf("step %d: %d ready serving pods, want at least %d (pods %v)", i, got, want, s.names())
		}
		if len(s.pods) > int(want)+1 && !scaling {
			s.t.Fatalf("step %d: %d pods, want at most replicas+1 = %d (pods %v)", i, len(s.pods), want+1, s.names())
		}
		if len(pl.draining) > 1 && !scaling {
			s.t.Fatalf("step %d: %d pods draining, want one at a time", i, len(pl.draining))
		}
		settled := len(s.pods) == int(want) && !pl.rolling && len(pl.create) == 0 && len(pl.remove) == 0 && len(pl.drain) == 0
		for o := range want {
			q, ok := s.pods[PodName(s.pool.Name, o)]
			settled = settled && ok && q.Labels[LabelRevision] == rev && q.Labels[LabelServing] == "true" && ready(&q)
		}
		if settled {
			return i
		}
	}
	s.t.Fatalf("roll not settled after 200 steps: pods %v", s.names())
	return 0
}

func (s *sim) names() []string {
	var out []string
	for name, q := range s.pods {
		out = append(out, fmt.Sprintf("%s(%s,%s,ready=%v)", name, q.Labels[LabelRevision], q.Labels[LabelServing], ready(&q)))
	}
	slices.Sort(out)
	return out
}

// TestPlanRoll rolls a pool to a new image: one Pod at a time, the surge Pod first, ready
// capacity never below replicas, and the highest ordinal of the old revision replaced first.
func TestPlanRoll(t *testing.T) {
	for _, replicas := range []int32{1, 3, 5} {
		t.Run(fmt.Sprint(replicas), func(t *testing.T) {
			s := newSim(t, testPool(func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To(replicas) }))
			s.fibersEnd = true
			if n := s.reconcile(); n.rolling || len(n.create)+len(n.drain)+len(n.remove) > 0 {
				t.Fatalf("a settled pool plans %+v", n)
			}

			s.pool.Spec.Template.Image = "fiberd:v2"
			pl := s.reconcile()
			if !pl.rolling || !slices.Equal(pl.create, []int32{replicas}) || len(pl.drain)+len(pl.remove) != 0 {
				t.Fatalf("first step of the roll: rolling %v create %v drain %v remove %v; want the surge ordinal %d created, nothing drained",
					pl.rolling, pl.create, names(pl.drain), names(pl.remove), replicas)
			}
			if pl = s.reconcile(); len(pl.drain)+len(pl.remove) != 0 {
				t.Fatalf("second step drains %v removes %v before the surge pod is ready", names(pl.drain), names(pl.remove))
			}
			pl = s.reconcile()
			if want := []string{PodName("web", replicas-1)}; !slices.Equal(names(pl.drain), want) {
				t.Fatalf("third step drains %v, want %v: the highest old ordinal, once the surge pod is ready", names(pl.drain), want)
			}
			steps := s.roll("fiberd:v2")
			t.Logf("%d replicas rolled in %d more steps", replicas, steps)
		})
	}
}

// TestPlanRollWaitsForGrace rolls a pool whose Pods never report their fibers: each old Pod is
// deleted only once the drain grace period has passed on the fake clock.
func TestPlanRollWaitsForGrace(t *testing.T) {
	s := newSim(t, testPool(func(p *v1alpha1.FiberPool) {
		p.Spec.Replicas = ptr.To[int32](2)
		p.Spec.DrainGracePeriod = &metav1.Duration{Duration: time.Minute}
	}))
	start := s.now
	steps := s.roll("fiberd:v2")
	// Two old Pods and the surge drain a minute each, one after the other.
	if took := time.Duration(steps) * s.step; took < 3*time.Minute {
		t.Errorf("roll took %v on the fake clock, want at least 3 drain grace periods of 1m", took)
	}
	t.Logf("rolled in %d steps, %v", steps, s.now.Sub(start))
}

// TestPlanRollStuck keeps the old Pods serving while the new revision never becomes ready: a
// roll to a broken image costs no capacity.
func TestPlanRollStuck(t *testing.T) {
	s := newSim(t, testPool(func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](3) }))
	s.pool.Spec.Template.Image = "fiberd:broken"
	for i := 0; i < 20; i++ {
		pl := s.reconcile()
		for name, q := range s.pods { // the new revision crashes: never ready
			if q.Labels[LabelRevision] != "" && q.Spec.Containers[0].Image == "fiberd:broken" {
				q.Status.Conditions = nil
				s.pods[name] = q
			}
		}
		if len(pl.drain)+len(pl.remove) > 0 {
			t.Fatalf("step %d drains %v removes %v while the new revision is not ready", i, names(pl.drain), names(pl.remove))
		}
	}
	if len(s.pods) != 4 || s.readyServing() != 3 {
		t.Fatalf("pods %v, want the 3 old ones serving and one surge pod", s.names())
	}
}

// TestPlanScaleDownDuringRoll scales a rolling pool down: the Pods above the new count drain, and
// the roll goes on with the surge at the new count.
func TestPlanScaleDownDuringRoll(t *testing.T) {
	s := newSim(t, testPool(func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](4) }))
	s.fibersEnd = true
	s.pool.Spec.Template.Image = "fiberd:v2"
	s.reconcile()
	s.reconcile()
	s.pool.Spec.Replicas = ptr.To[int32](2)
	s.run("fiberd:v2", true)
}
