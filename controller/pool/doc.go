// Package pool is the FiberPool controller: it keeps each pool's grant Pods and reports them in
// the pool's status.
//
// # What it does
//
// For a FiberPool with spec.replicas = N, the Reconciler keeps N grant Pods named
// "<pool>-<ordinal>", ordinals 0 to N-1, each controlled by the pool (a controller owner
// reference, so deleting the pool deletes them) and shaped by GrantPod after
// deploy/kubernetes/grant-pod.yaml: fiberd as the one container, its security context, volumes
// and readiness gate fiberd.io/zygote-ready, the pool's template in the fiberd.io/template and
// fiberd.io/fibers-max annotations, and a topology spread over nodes. A missing ordinal is created;
// a Pod that failed (phase Failed or Succeeded) is deleted and, once gone, created again under
// its ordinal; ordinals at or above N are deleted. The status counts the Pods that exist and the
// ready ones (PodReady True), the pool's fiber capacity (ready Pods times spec.fibersMax), and
// sets the conditions Available, Progressing and ReplicaFailure.
//
// Names are the duplicate guard: a Pod's name is its ordinal, so a controller that restarts, or
// reads a cache that has not yet seen its own creations, at worst asks for a name that exists and
// gets AlreadyExists, which is not an error here. No in-memory expectations are kept.
//
// # What it does not do yet
//
// It does not issue grants: package issuer does, which cmd/fiberd-controller runs beside the
// Reconciler and points the grant Pods at (Shape.IssuerURL); it mints each Pod's grant from the
// Pod's fiberd.io/template annotation and the pool's fibersMax, fibersWarm, wBudget and lease. It
// does not yet drain a Pod before deleting it on scale-down, roll Pods when the template or image
// changes (a change reaches new Pods only), scale on fibers in use, adopt Pods it does not
// control, or count fibers in use.
//
// # Who imports it
//
// cmd/fiberd-controller and this module's tests. It imports the API (api/v1alpha1),
// controller-runtime and, from fiberd, the template reference parser only.
package pool
