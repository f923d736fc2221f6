package pool

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// DefaultDrainGracePeriod is a pool's drainGracePeriod when its spec has none (the CRD defaults
// it too).
const DefaultDrainGracePeriod = 5 * time.Minute

// drainSettle is how long after a Pod started draining a count of no fibers in use must have
// been read to end the drain (or the grace period, if shorter). A client that picked the Pod from
// the Service's EndpointSlices just before it left them has had that long to Clone on it, and a
// count read before the drain started says nothing of the fibers created since.
const drainSettle = 5 * time.Second

// plan is what one reconcile of a pool does to its grant Pods, worked out from the Pods it
// controls, the clock and the fibers in use its Pods last reported, without any I/O.
type plan struct {
	// create are the ordinals to create a Pod for, ascending: those below spec.replicas with no
	// Pod, and the surge ordinal (spec.replicas) while rolling.
	create []int32
	// remove are the Pods to delete now: failed ones, ones whose name or ordinal label is not
	// the controller's, and draining ones done draining (no fibers in use, never started, or
	// past the grace period; a count of no fibers ends a drain only when read drainSettle after
	// it started).
	remove []*corev1.Pod
	// drain are the Pods to start draining now: scale-down (ordinals above spec.replicas,
	// highest first), then at most one Pod of an older revision for the roll. A Pod that never
	// got a Pod IP, or any Pod of a pool whose drainGracePeriod is zero, is in remove instead.
	drain []*corev1.Pod
	// serve are active Pods without LabelServing "true" (made by an earlier controller): they get
	// it, so the pool's Service selects them.
	serve []*corev1.Pod
	// active are the Pods that serve or will: not being deleted, not failed, not draining and
	// wanted (below spec.replicas, or the surge ordinal while rolling); by ordinal. Those in
	// drain are not.
	active []*corev1.Pod
	// draining are the Pods that drain and stay so after this reconcile: those already draining
	// and not done, and those in drain.
	draining []*corev1.Pod
	// waiting is how many wanted ordinals wait for their Pod to be gone (being deleted, failed,
	// or draining for the roll) before it is created again.
	waiting int
	// scaleDown is how many Pods drain, or start to, because their ordinal is no longer wanted.
	scaleDown int
	// rolling is set while the pool has Pods of an older revision below spec.replicas, or keeps
	// the surge Pod until every ordinal has a ready Pod of the current revision.
	rolling bool
	// outdated is how many active Pods below spec.replicas are of an older revision.
	outdated int
	// updated is how many active Pods are of the current revision.
	updated int
	// next is when a draining Pod's grace period ends, the soonest; zero when none drains.
	next time.Time
}

// planInput is what planFor works from besides the pool and its Pods.
type planInput struct {
	// now is the time drains are measured against.
	now time.Time
	// revision is the pool's current revision (Revision).
	revision string
	// inUse are the fibers in use each Pod last reported, by UID, and when; a Pod absent is
	// unknown.
	inUse map[types.UID]fiberCount
}

// planFor works out p's plan from pods, the Pods of p's namespace the cache has for p. It
// considers only the Pods p controls (owner reference with p's UID): a Pod of an earlier pool of
// the same name is left to the garbage collector, and its name blocks its ordinal until it is gone.
//
// The roll keeps spec.replicas ready Pods serving: it creates the surge Pod (ordinal
// spec.replicas, current revision) first, and drains a ready Pod of an older revision only while
// the ready serving Pods are more than spec.replicas, one at a time; a Pod of an older revision
// that is not ready takes no capacity away and drains first. The drained ordinal is created again
// at the current revision once its Pod is gone, and the surge Pod drains when no ordinal below
// spec.replicas lacks a ready Pod of the current revision.
func planFor(p *v1alpha1.FiberPool, pods []corev1.Pod, in planInput) plan {
	want := int32(0)
	if p.Spec.Replicas != nil {
		want = *p.Spec.Replicas
	}
	grace := DefaultDrainGracePeriod
	if p.Spec.DrainGracePeriod != nil {
		grace = max(p.Spec.DrainGracePeriod.Duration, 0)
	}

	var pl plan
	// startDrain drains pod, or deletes it at once when it never ran (no Pod IP: no fiber was
	// reachable on it) or the pool drains for no time.
	startDrain := func(pod *corev1.Pod) {
		if pod.Status.PodIP == "" || grace == 0 {
			pl.remove = append(pl.remove, pod)
		} else {
			pl.drain = append(pl.drain, pod)
		}
	}
	taken := map[int32]bool{}
	var candidates, draining []*corev1.Pod
	for i := range pods {
		pod := &pods[i]
		if !metav1.IsControlledBy(pod, p) {
			continue
		}
		ordinal, ok := ordinalOf(p.Name, pod)
		if !ok {
			if pod.DeletionTimestamp == nil {
				pl.remove = append(pl.remove, pod)
			}
			continue
		}
		taken[ordinal] = true
		switch {
		case pod.DeletionTimestamp != nil:
			if ordinal < want {
				pl.waiting++
			}
		case failed(pod):
			if ordinal < want {
				pl.waiting++
			}
			pl.remove = append(pl.remove, pod)
		case pod.Labels[LabelServing] == "false":
			draining = append(draining, pod)
		default:
			candidates = append(candidates, pod)
		}
	}
	byOrdinal := func(a, b *corev1.Pod) int {
		oa, _ := ordinalOf(p.Name, a)
		ob, _ := ordinalOf(p.Name, b)
		return cmp.Compare(oa, ob)
	}
	slices.SortFunc(candidates, byOrdinal)
	slices.SortFunc(draining, byOrdinal)

	// Is the pool rolling? While a Pod of an older revision holds an ordinal below spec.replicas
	// (serving or draining), or while the surge Pod stands in for an ordinal that has no ready
	// Pod of the current revision yet.
	current := map[int32]bool{} // ordinals below want with a ready serving Pod of the revision
	surgeCurrent := false
	for _, pod := range candidates {
		o, _ := ordinalOf(p.Name, pod)
		switch {
		case o < want && pod.Labels[LabelRevision] != in.revision:
			pl.rolling = true
		case o < want && ready(pod):
			current[o] = true
		case o == want && pod.Labels[LabelRevision] == in.revision:
			surgeCurrent = true
		}
	}
	for _, pod := range draining {
		if o, _ := ordinalOf(p.Name, pod); o < want && pod.Labels[LabelRevision] != in.revision {
			pl.rolling = true
		}
	}
	if !pl.rolling && surgeCurrent && int32(len(current)) < want {
		pl.rolling = true
	}

	// Sort the serving Pods into active and those to drain because they are not wanted.
	var excess, outdated []*corev1.Pod
	for _, pod := range candidates {
		o, _ := ordinalOf(p.Name, pod)
		switch {
		case o < want || (o == want && pl.rolling && pod.Labels[LabelRevision] == in.revision):
			pl.active = append(pl.active, pod)
			if pod.Labels[LabelRevision] == in.revision {
				pl.updated++
			} else {
				outdated = append(outdated, pod)
			}
		default:
			excess = append(excess, pod)
		}
	}
	pl.outdated = len(outdated)
	slices.Reverse(excess) // highest ordinal first
	pl.scaleDown = len(excess)
	for _, pod := range excess {
		startDrain(pod)
	}

	// One Pod of an older revision drains at a time, and a ready one only while the ready
	// serving Pods outnumber spec.replicas.
	rollDraining := false
	for _, pod := range draining {
		if o, _ := ordinalOf(p.Name, pod); o <= want {
			rollDraining = true
		}
	}
	if pl.rolling && !rollDraining && len(outdated) > 0 {
		readyServing := int32(0)
		for _, pod := range pl.active {
			if ready(pod) {
				readyServing++
			}
		}
		var pick *corev1.Pod
		for _, pod := range slices.Backward(outdated) {
			if !ready(pod) {
				pick = pod
				break
			}
		}
		if pick == nil && readyServing-1 >= want {
			pick = outdated[len(outdated)-1]
		}
		if pick != nil {
			startDrain(pick)
			pl.active = slices.DeleteFunc(pl.active, func(q *corev1.Pod) bool { return q == pick })
			pl.outdated--
			pl.waiting++
		}
	}
	for _, pod := range pl.active {
		if pod.Labels[LabelServing] != "true" {
			pl.serve = append(pl.serve, pod)
		}
	}

	// Draining Pods: delete the done ones, keep the others and note the soonest deadline.
	for _, pod := range draining {
		o, _ := ordinalOf(p.Name, pod)
		if o > want || (o == want && !pl.rolling) {
			pl.scaleDown++
		} else {
			pl.waiting++
		}
		started, ok := drainStarted(pod)
		if !ok {
			// Labelled "false" by someone else, or the annotation lost: the drain starts now.
			startDrain(pod)
			continue
		}
		deadline := started.Add(grace)
		c, known := in.inUse[pod.UID]
		switch {
		case pod.Status.PodIP == "":
			pl.remove = append(pl.remove, pod) // never ran: no fiber was reachable on it
		case known && c.n == 0 && !c.at.Before(started.Add(min(drainSettle, grace))):
			pl.remove = append(pl.remove, pod)
		case !in.now.Before(deadline):
			pl.remove = append(pl.remove, pod)
		default:
			pl.draining = append(pl.draining, pod)
			if pl.next.IsZero() || deadline.Before(pl.next) {
				pl.next = deadline
			}
		}
	}
	for _, pod := range pl.drain {
		pl.draining = append(pl.draining, pod)
		if d := in.now.Add(grace); pl.next.IsZero() || d.Before(pl.next) {
			pl.next = d
		}
	}

	for o := int32(0); o < want; o++ {
		if !taken[o] {
			pl.create = append(pl.create, o)
		}
	}
	if pl.rolling && !taken[want] {
		pl.create = append(pl.create, want)
	}
	return pl
}

// drainStarted is when pod started draining, from AnnotationDrainStarted; false when the
// annotation is missing or not RFC 3339.
func drainStarted(pod *corev1.Pod) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, pod.Annotations[AnnotationDrainStarted])
	return t, err == nil
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
