// Package pool is the FiberPool controller: it keeps each pool's grant Pods and Service, drains
// the Pods it no longer wants, rolls a changed spec one Pod at a time, and reports all of it in
// the pool's status.
//
// # What it does
//
// For a FiberPool with spec.replicas = N, the Reconciler keeps N grant Pods named
// "<pool>-<ordinal>", ordinals 0 to N-1, each controlled by the pool (a controller owner
// reference, so deleting the pool deletes them) and shaped by GrantPod after
// deploy/kubernetes/grant-pod.yaml: fiberd as the one container, its security context, volumes
// and readiness gate fiberd.io/zygote-ready, the pool's template in the fiberd.io/template and
// fiberd.io/fibers-max annotations, and a topology spread over nodes. Each carries the labels
// fiberd.io/pool, fiberd.io/ordinal, fiberd.io/serving "true" and fiberd.io/revision (Revision: a
// hash of the Pod GrantPod builds). A missing ordinal is created; a Pod that failed (phase Failed
// or Succeeded) is deleted and, once gone, created again under its ordinal.
//
// It keeps the pool's Service (PoolService): headless, named like the pool, selecting
// fiberd.io/pool and fiberd.io/serving "true", port "api" 8484. Its EndpointSlices are the pool's
// ready grant Pods that take new sessions; clients find the pool there.
//
// A Pod the pool no longer wants drains: it gets fiberd.io/serving "false" (it leaves the
// Service) and the fiberd.io/drain-started annotation, and is deleted once its fibers in use are
// 0 or spec.drainGracePeriod has passed. Scale-down drains the ordinals at or above N, highest
// first. A spec change that changes the Pods' revision rolls them: the surge Pod (ordinal N, new
// revision) is created first; once the ready serving Pods number more than N, one Pod of the old
// revision drains (the highest ordinal), its ordinal is created again at the new revision once it
// is gone, and so on; the surge Pod drains once every ordinal has a ready Pod of the new revision.
// The ready serving Pods never drop below N during a roll, and the Pods never exceed N+1.
//
// Fibers in use are read from each running Pod's fiberd (GET /v1/status on its API port) with the
// client certificate of Config.Fibers, at most once an interval per Pod, a few at once, each read
// bounded in time. Without a certificate they are unknown, the condition FibersCounted says so,
// and drains last their whole grace period.
//
// The status counts the Pods that serve or will (the surge Pod included), the ready ones (PodReady
// True), those of the current revision and those draining, the pool's fiber capacity (ready
// serving Pods times spec.fibersMax) and fibers in use, and sets the conditions Available,
// Progressing (reasons ScalingUp, RollingUpdate, Draining, Replacing, WaitingForReady, Settled),
// ReplicaFailure and FibersCounted.
//
// Names are the duplicate guard: a Pod's name is its ordinal, so a controller that restarts, or
// reads a cache that has not yet seen its own creations, at worst asks for a name that exists and
// gets AlreadyExists, which is not an error here. Drains are in the Pods' labels and annotations,
// so a restarted controller resumes them; the only state kept between reconciles is the fibers in
// use last read, which a restart reads again. Every write to an existing Pod holds for its UID.
// docs/design.md decisions 104 and 107 say why.
//
// # What it does not do yet
//
// It does not issue grants: package issuer does, which cmd/fiberd-controller runs beside the
// Reconciler and points the grant Pods at (Shape.IssuerURL); it mints each Pod's grant from the
// Pod's fiberd.io/template annotation (so a Pod of an older revision keeps its template during a
// roll) and the pool's fibersMax, fibersWarm, wBudget and lease. It does not yet scale on fibers
// in use, or adopt Pods it does not control.
//
// # Who imports it
//
// cmd/fiberd-controller, bench/scale (which measures it with 1,000 grant Pods; docs/benchmarks.md
// "At scale, by simulation") and this module's tests. It imports the API (api/v1alpha1),
// controller-runtime and, from fiberd, the template reference parser only.
package pool
