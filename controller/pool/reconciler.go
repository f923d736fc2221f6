package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
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
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete

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
	return nil
}

// Reconciler keeps FiberPools' grant Pods and status. It holds no state between reconciles
// beyond its configuration: what it knows of a pool is what the manager's cache holds.
type Reconciler struct {
	client client.Client
	cfg    Config
}

// CacheOptions restricts a manager's cache of Pods to grant Pods of pools (those with
// LabelPool), so the controller does not hold every Pod of the cluster. A manager that runs the
// Reconciler should be made with them (cmd/fiberd-controller and the tests do).
func CacheOptions() cache.Options {
	hasPool, err := labels.NewRequirement(LabelPool, selection.Exists, nil)
	if err != nil {
		// The requirement is a constant; failing here is a programming error.
		panic(fmt.Sprintf("pool: label requirement: %v", err))
	}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.NewSelector().Add(*hasPool)},
	}}
}

// Setup validates cfg, registers the Pods' owner index with mgr's cache and adds a Reconciler
// to mgr, watching FiberPools and the Pods they control. It starts nothing: mgr.Start does.
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, ownerIndex, func(o client.Object) []string {
		ref := metav1.GetControllerOf(o)
		if ref == nil || ref.Kind != "FiberPool" || ref.APIVersion != v1alpha1.GroupVersion.String() {
			return nil
		}
		return []string{ref.Name}
	})
	if err != nil {
		return fmt.Errorf("pool: index of pods by pool: %w", err)
	}
	r := &Reconciler{client: mgr.GetClient(), cfg: cfg}
	return ctrl.NewControllerManagedBy(mgr).
		Named("fiberpool").
		// A pool's own status writes change no generation, and need no reconcile.
		For(&v1alpha1.FiberPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Pod{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: cfg.MaxConcurrentReconciles}).
		Complete(r)
}

// Reconcile brings one pool's grant Pods to its spec and writes its status. The manager calls it
// for each pool whose spec or Pods changed, never twice at once for one pool. It reads the pool
// and its Pods from the cache, creates and deletes Pods, and patches the pool's status when it
// changed. It returns an error, which requeues the pool with backoff, when a Pod could not be
// created or deleted or the status not written.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logr.FromContextOrDiscard(ctx)
	var p v1alpha1.FiberPool
	if err := r.client.Get(ctx, req.NamespacedName, &p); err != nil {
		// A pool gone takes its Pods with it (owner references, garbage collection).
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if p.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.InNamespace(p.Namespace), client.MatchingFields{ownerIndex: p.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("pods of pool %s/%s: %w", p.Namespace, p.Name, err)
	}
	pl := planFor(&p, pods.Items)

	deleteErr := r.deletePods(ctx, log, pl.remove)
	created, createErr := r.createPods(ctx, log, &p, pl.create)

	orig := p.DeepCopy()
	r.setStatus(&p, pl, created, createErr, deleteErr)
	var statusErr error
	if !equality.Semantic.DeepEqual(orig.Status, p.Status) {
		if err := r.client.Status().Patch(ctx, &p, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
			statusErr = fmt.Errorf("status of pool %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return ctrl.Result{}, errors.Join(deleteErr, createErr, statusErr)
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
// It returns the failures joined.
func (r *Reconciler) deletePods(ctx context.Context, log logr.Logger, pods []*corev1.Pod) error {
	var errs []error
	for _, pod := range pods {
		uid := pod.UID
		err := r.client.Delete(ctx, pod, client.Preconditions{UID: &uid})
		switch {
		case err == nil:
			log.Info("deleted grant pod", "pod", pod.Name, "phase", pod.Status.Phase)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			errs = append(errs, fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}
	return errors.Join(errs...)
}

// setStatus writes into p.Status what this reconcile saw and did: pl's active Pods plus those
// created are the replicas, the active ready ones the ready replicas.
func (r *Reconciler) setStatus(p *v1alpha1.FiberPool, pl plan, created int, createErr, deleteErr error) {
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
	s.Fibers.Capacity = int64(readyCount) * int64(p.Spec.FibersMax)
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
	case len(pl.create) > 0:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonScalingUp,
			fmt.Sprintf("creating %d grant pods", len(pl.create)))
	case pl.scaleDown > 0:
		set(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.ReasonScalingDown,
			fmt.Sprintf("deleting %d grant pods above ordinal %d", pl.scaleDown, want-1))
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
	case createErr != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonCreateFailed, clip(createErr.Error()))
	case deleteErr != nil:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionTrue, v1alpha1.ReasonDeleteFailed, clip(deleteErr.Error()))
	default:
		set(v1alpha1.ConditionReplicaFailure, metav1.ConditionFalse, v1alpha1.ReasonNoFailure, "")
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
