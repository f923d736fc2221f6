package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

// The permissions the Reconciler needs; `make generate` writes them into
// deploy/controller/role.yaml.
//
// +kubebuilder:rbac:groups=fiberd.io,resources=fiberpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=fiberd.io,resources=fiberpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fiberd.io,resources=fiberpools/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update

// ownerIndex is the field index of Pods by the name of the FiberPool that controls them.
const ownerIndex = "fiberd.io/controller-pool"

// DefaultMaxConcurrentReconciles is Config.MaxConcurrentReconciles when it is zero.
const DefaultMaxConcurrentReconciles = 4

// Config configures a Reconciler. The zero value works.
type Config struct {
	// Shape is what grant Pods get from the controller rather than their pool. The zero value
	// is deploy/kubernetes/grant-pod.yaml's.
	Shape Shape
	// Clock stamps conditions' lastTransitionTime. Nil means the real clock.
	Clock clock.PassiveClock
	// MaxConcurrentReconciles is how many pools are reconciled at once (one reconcile per pool at
	// a time in any case). Zero means DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// Fibers is how grant Pods' fibers in use are read. The zero value reads none: they are
	// unknown, and drains wait their whole grace period.
	Fibers FibersConfig
}

// withDefaults fills the empty fields of c. It does no I/O.
func (c Config) withDefaults() Config {
	c.Shape = c.Shape.withDefaults()
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.MaxConcurrentReconciles == 0 {
		c.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	c.Fibers = c.Fibers.withDefaults()
	return c
}

// Validate reports the first field of c that cannot work, and how to fix it.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Shape.validate(); err != nil {
		return err
	}
	if c.MaxConcurrentReconciles < 0 {
		return fmt.Errorf("pool: MaxConcurrentReconciles %d: want 0 (the default, %d) or more", c.MaxConcurrentReconciles, DefaultMaxConcurrentReconciles)
	}
	return c.Fibers.validate()
}

// Reconciler keeps FiberPools' grant Pods, Services and status. What it knows of a pool is what
// the manager's cache holds, and the drains in progress are in the Pods' labels and annotations;
// the one thing it keeps between reconciles is the fibers in use its Pods last reported (for
// Config.Fibers.Interval), which a restart only reads again.
type Reconciler struct {
	client client.Client
	cfg    Config
	fibers *fiberCounter // nil without Config.Fibers.TLS
}

// CacheOptions restricts a manager's cache of Pods and Services to grant Pods and Services of
// pools (those with LabelPool), so the controller does not hold every Pod and Service of the
// cluster. A manager that runs the Reconciler should be made with them (cmd/fiberd-controller and
// the tests do).
func CacheOptions() cache.Options {
	hasPool, err := labels.NewRequirement(LabelPool, selection.Exists, nil)
	if err != nil {
		// The requirement is a constant; failing here is a programming error.
		panic(fmt.Sprintf("pool: label requirement: %v", err))
	}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:     {Label: labels.NewSelector().Add(*hasPool)},
		&corev1.Service{}: {Label: labels.NewSelector().Add(*hasPool)},
	}}
}

// poolOf is the ownerIndex of a Pod: the name of the FiberPool that controls it, if one does.
func poolOf(o client.Object) []string {
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != "FiberPool" || ref.APIVersion != v1alpha1.GroupVersion.String() {
		return nil
	}
	return []string{ref.Name}
}

// Setup validates cfg, registers the Pods' owner index with mgr's cache and adds a Reconciler
// to mgr, watching FiberPools and the Pods and Services they control. It starts nothing: mgr.Start does.
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, ownerIndex, poolOf)
	if err != nil {
		return fmt.Errorf("pool: index of pods by pool: %w", err)
	}
	r := &Reconciler{client: mgr.GetClient(), cfg: cfg, fibers: newFiberCounter(cfg.Fibers)}
	return ctrl.NewControllerManagedBy(mgr).
		Named("fiberpool").
		// A pool's own status writes change no generation, and need no reconcile.
		For(&v1alpha1.FiberPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: cfg.MaxConcurrentReconciles}).
		Complete(r)
}

// Reconcile brings one pool's grant Pods and Service to its spec and writes its status. The
// manager calls it for each pool whose spec, Pods or Service changed, never twice at once for one
// pool. It reads the pool and its Pods from the cache and their fibers in use from fiberd (when
// configured), keeps the Service, starts and ends drains, creates and deletes Pods, and patches
// the pool's status when it changed. It asks to be called again when a drain's grace period ends
// and, reading fibers in use, after Config.Fibers.Interval. It returns an error, which requeues
// the pool with backoff, when the Service could not be kept, a Pod not created, drained or
// deleted, or the status not written.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logr.FromContextOrDiscard(ctx)
	var p v1alpha1.FiberPool
	if err := r.client.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) && r.fibers != nil {
			r.fibers.forget(req.NamespacedName)
		}
		// A pool gone takes its Pods and Service with it (owner references, garbage collection).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if p.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	revision, err := Revision(&p, r.cfg.Shape)
	if err != nil {
		// The CRD refuses such a spec; one that got in waits for a fix, retrying does not help.
		log.Error(err, "pool spec makes no grant pod")
		return ctrl.Result{}, nil
	}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(p.Namespace), client.MatchingFields{ownerIndex: p.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("pods of pool %s/%s: %w", p.Namespace, p.Name, err)
	}
	now := r.cfg.Clock.Now()

	var inUse map[types.UID]fiberCount
	var unknown []string
	if r.fibers != nil {
		var mine []*corev1.Pod
		for i := range pods.Items {
			if metav1.IsControlledBy(&pods.Items[i], &p) {
				mine = append(mine, &pods.Items[i])
			}
		}
		inUse, unknown = r.fibers.count(ctx, req.NamespacedName, mine, now)
	}
	pl := planFor(&p, pods.Items, planInput{now: now, revision: revision, inUse: inUse})

	serviceErr := r.ensureService(ctx, log, &p)
	drainErr := errors.Join(r.drainPods(ctx, log, pl.drain, now), r.servePods(ctx, pl.serve))
	deleteErr := r.deletePods(ctx, log, pl.remove, inUse)
	created, createErr := r.createPods(ctx, log, &p, pl.create)

	orig := p.DeepCopy()
	r.setStatus(&p, pl, revision, created, inUse, unknown, failures{
		create: createErr, delete: deleteErr, drain: drainErr, service: serviceErr,
	})
	var statusErr error
	if !equality.Semantic.DeepEqual(orig.Status, p.Status) {
		if err := r.client.Status().Patch(ctx, &p, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
			statusErr = fmt.Errorf("status of pool %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return ctrl.Result{RequeueAfter: r.requeueAfter(pl, now)}, errors.Join(serviceErr, drainErr, deleteErr, createErr, statusErr)
}

// requeueAfter is when the pool should be reconciled again with nothing else happening: when its
// soonest drain ends, and, reading fibers in use, after an interval while it has Pods (to see a
// draining Pod's fibers end, and keep status.fibers.inUse current). Zero means never.
func (r *Reconciler) requeueAfter(pl plan, now time.Time) time.Duration {
	var after time.Duration
	if !pl.next.IsZero() {
		// A second late rather than early: a deadline reached a little early would be seen as
		// not yet passed and cost one more reconcile.
		after = max(pl.next.Sub(now), 0) + time.Second
	}
	if r.fibers != nil && len(pl.active)+len(pl.draining) > 0 {
		if after == 0 || r.cfg.Fibers.Interval < after {
			after = r.cfg.Fibers.Interval
		}
	}
	return after
}

// drainPods starts draining the Pods: LabelServing "false" (they leave the pool's Service) and
// AnnotationDrainStarted now, in one patch that holds only for the Pod of that UID. A Pod gone or
// replaced is not an error.
func (r *Reconciler) drainPods(ctx context.Context, log logr.Logger, pods []*corev1.Pod, now time.Time) error {
	var errs []error
	stamp := now.UTC().Format(time.RFC3339)
	for _, pod := range pods {
		patch := map[string]any{"metadata": map[string]any{
			"uid":         pod.UID,
			"labels":      map[string]string{LabelServing: "false"},
			"annotations": map[string]string{AnnotationDrainStarted: stamp},
		}}
		if err := r.patchPod(ctx, pod, patch); err != nil {
			errs = append(errs, fmt.Errorf("drain pod %s/%s: %w", pod.Namespace, pod.Name, err))
			continue
		}
		log.Info("draining grant pod", "pod", pod.Name, "revision", pod.Labels[LabelRevision])
	}
	return errors.Join(errs...)
}

// servePods labels the Pods LabelServing "true", so the pool's Service selects them.
func (r *Reconciler) servePods(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, pod := range pods {
		patch := map[string]any{"metadata": map[string]any{
			"uid":    pod.UID,
			"labels": map[string]string{LabelServing: "true"},
		}}
		if err := r.patchPod(ctx, pod, patch); err != nil {
			errs = append(errs, fmt.Errorf("label pod %s/%s serving: %w", pod.Namespace, pod.Name, err))
		}
	}
	return errors.Join(errs...)
}

// patchPod merge-patches pod's metadata. The patch names pod's UID, which the API server holds
// as a precondition: a replacement of the same name answers Conflict, ignored like NotFound.
func (r *Reconciler) patchPod(ctx context.Context, pod *corev1.Pod, patch map[string]any) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	err = r.client.Patch(ctx, pod.DeepCopy(), client.RawPatch(types.MergePatchType, b))
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// createPods creates the grant Pods of the given ordinals in batches of 1, 2, 4 and so on, and
// stops at the first batch with a failure, so a pool that cannot get Pods (a quota, a webhook)
// costs a few refused requests per reconcile rather than one per missing Pod. A Pod that
// already exists counts as created: it is the one a cache that lags behind asked for again.
// It returns how many exist now among those asked for.
func (r *Reconciler) createPods(ctx context.Context, log logr.Logger, p *v1alpha1.FiberPool, ordinals []int32) (int, error) {
	created := 0
	for batch := 1; len(ordinals) > 0; batch *= 2 {
		n := min(batch, len(ordinals))
		var errs []error
		for _, o := range ordinals[:n] {
			pod, err := GrantPod(p, o, r.cfg.Shape)
			if err != nil {
				return created, err
			}
			err = r.client.Create(ctx, pod)
			switch {
			case err == nil:
				log.Info("created grant pod", "pod", pod.Name)
				created++
			case apierrors.IsAlreadyExists(err):
				created++
			default:
				errs = append(errs, fmt.Errorf("create pod %s/%s: %w", pod.Namespace, pod.Name, err))
			}
		}
		if len(errs) > 0 {
			return created, errors.Join(errs...)
		}
		ordinals = ordinals[n:]
	}
	return created, nil
}

// deletePods deletes the Pods, each only if it is still the Pod of that UID (a replacement of
// the same name is never deleted by mistake). A Pod already gone or replaced is not an error.
// inUse, the fibers in use the Pods last reported, is for the log. It returns the failures
// joined.
func (r *Reconciler) deletePods(ctx context.Context, log logr.Logger, pods []*corev1.Pod, inUse map[types.UID]fiberCount) error {
	var errs []error
	for _, pod := range pods {
		uid := pod.UID
		err := r.client.Delete(ctx, pod, client.Preconditions{UID: &uid})
		switch {
		case err == nil:
			kv := []any{"pod", pod.Name, "phase", pod.Status.Phase}
			if started, ok := drainStarted(pod); ok && pod.Labels[LabelServing] == "false" {
				kv = append(kv, "drainStarted", started)
				if c, ok := inUse[pod.UID]; ok {
					kv = append(kv, "fibersInUse", c.n)
				}
			}
			log.Info("deleted grant pod", kv...)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			errs = append(errs, fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}
	return errors.Join(errs...)
}

// failures are the errors of one reconcile's writes, for the ReplicaFailure condition.
type failures struct {
	create, delete, drain, service error
}

// setStatus writes into p.Status what this reconcile saw and did: pl's active Pods plus those
// created are the replicas, the active ready ones the ready replicas, inUse (by Pod UID) the
// fibers in use, unknown the Pods whose fibers in use could not be read.
func (r *Reconciler) setStatus(p *v1alpha1.FiberPool, pl plan, revision string, created int, inUse map[types.UID]fiberCount, unknown []string, f failures) {
	want := int32(0)
	if p.Spec.Replicas != nil {
		want = *p.Spec.Replicas
	}
	readyCount := int32(0)
	for _, pod := range pl.active {
		if ready(pod) {
			readyCount++
		}
	}
	s := &p.Status
	s.ObservedGeneration = p.Generation
	s.Replicas = int32(len(pl.active) + created)
	s.ReadyReplicas = readyCount
	s.UpdatedReplicas = int32(pl.updated + created)
	s.DrainingReplicas = int32(len(pl.draining))
	s.UpdateRevision = revision
	s.Fibers.Capacity = int64(readyCount) * int64(p.Spec.FibersMax)
	s.Fibers.InUse = nil
	if r.fibers != nil && (len(inUse) > 0 || len(unknown) == 0) {
		// Some counted, or all (none at all is 0): absent only when nothing is known.
		var n int64
		for _, c := range inUse {
			n += c.n
		}
		s.Fibers.InUse = &n
	}
	s.Selector = labels.SelectorFromSet(Selector(p.Name)).String()

	now := metav1.NewTime(r.cfg.Clock.Now())
	set := func(typ string, status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: message,
			ObservedGeneration: p.Generation, LastTransitionTime: now,
		})
	}

	if readyCount >= want {
		set(v1alpha1.ConditionAvailable, metav1.ConditionTrue, v1alpha1.ReasonReplicasReady,
			fmt.Sprintf("%d of %d grant pods ready", readyCount, want))
	} else {
		set(v1alpha1.ConditionAvailable, metav1.ConditionFalse, v1alpha1.ReasonReplicasNotReady,
			fmt.Sprintf("%d of %d grant pods ready", readyCount, want))
	}

	switch {
	case pl.rolling:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonRollingUpdate,
			fmt.Sprintf("replacing grant pods with revision %s one at a time: %d of an older revision left, %d draining",
				revision, pl.outdated, len(pl.draining)))
	case len(pl.create) > 0:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonScalingUp,
			fmt.Sprintf("creating %d grant pods", len(pl.create)))
	case pl.scaleDown > 0:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonDraining,
			fmt.Sprintf("draining %d grant pods above ordinal %d: each is deleted once its fibers end or the drain grace period passes", pl.scaleDown, want-1))
	case pl.waiting > 0:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonReplacing,
			fmt.Sprintf("replacing %d failed or deleted grant pods", pl.waiting))
	case readyCount < int32(len(pl.active)):
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonWaitingForReady,
			fmt.Sprintf("%d grant pods not ready yet", int32(len(pl.active))-readyCount))
	default:
		set(v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReasonSettled,
			fmt.Sprintf("%d grant pods, all ready", len(pl.active)))
	}

	switch {
	case f.create != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonCreateFailed, clip(f.create.Error()))
	case f.delete != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonDeleteFailed, clip(f.delete.Error()))
	case f.drain != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonDrainFailed, clip(f.drain.Error()))
	case f.service != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonServiceFailed, clip(f.service.Error()))
	default:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionFalse, v1alpha1.ReasonNoFailure, "")
	}

	switch {
	case r.fibers == nil:
		set(v1alpha1.ConditionFibersCounted, metav1.ConditionFalse, v1alpha1.ReasonNoClientCertificate,
			"the controller has no client certificate for fiberd's API (fiberd-controller -fiberd-tls-dir): fibers in use are unknown, and draining pods wait the whole drainGracePeriod")
	case len(unknown) > 0:
		set(v1alpha1.ConditionFibersCounted, metav1.ConditionFalse, v1alpha1.ReasonStatusUnreachable,
			clip(fmt.Sprintf("%d grant pods did not report their fibers in use: %s", len(unknown), strings.Join(unknown, "; "))))
	default:
		set(v1alpha1.ConditionFibersCounted, metav1.ConditionTrue, v1alpha1.ReasonCounted,
			fmt.Sprintf("%d grant pods reported their fibers in use", len(inUse)))
	}
}

// maxMessage bounds a condition's message: API errors joined for many Pods can be long, and the
// first few say what went wrong.
const maxMessage = 1024

func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-3] + "..."
}
