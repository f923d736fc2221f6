package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FiberPool is a pool of grant Pods of one template in one namespace. The controller keeps
// spec.replicas grant Pods, named "<pool>-<ordinal>" with ordinals 0 to replicas-1, each running
// fiberd with a grant of the pool's template for up to spec.fibersMax fibers, and a headless
// Service named like the pool whose EndpointSlices list the ready ones that take new sessions.
// It drains a Pod before deleting it, rolls a spec change one Pod at a time through one extra
// Pod (ordinal replicas), and reports in status how many are ready and how many fibers they can
// hold and hold now.
//
// The name is at most 52 characters, so that "<pool>-<ordinal>" stays a DNS-1123 label and the
// pool's name fits the fiberd.io/pool label.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=fp,categories=fiberd
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.template.name`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Fibers",type=integer,JSONPath=`.status.fibers.capacity`
// +kubebuilder:printcolumn:name="In-Use",type=integer,JSONPath=`.status.fibers.inUse`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 52",message="a FiberPool's name is at most 52 characters: its grant Pods are named <pool>-<ordinal>"
type FiberPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the pool should be.
	// +required
	Spec FiberPoolSpec `json:"spec"`
	// Status is what the controller last saw of the pool's grant Pods.
	// +optional
	Status FiberPoolStatus `json:"status,omitempty"`
}

// FiberPoolSpec is what a pool should be: how many grant Pods, of which template, with how many
// fibers each, and where they may run.
//
// +kubebuilder:validation:XValidation:rule="!has(self.fibersWarm) || self.fibersWarm <= self.fibersMax",message="fibersWarm must not exceed fibersMax"
type FiberPoolSpec struct {
	// Template is what every grant of the pool runs, and the image its grant Pods run.
	// +required
	Template TemplateSpec `json:"template"`

	// Replicas is the number of grant Pods the pool keeps: the ordinals 0 to replicas-1. Zero
	// keeps none. Required: a pool scaled on its fibers in use (minimum and maximum replicas)
	// will be a sibling field, with a rule that exactly one of the two is set.
	// +required
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas"`

	// FibersMax is each grant's fibers.max: the fibers one grant Pod may run at once. The
	// controller's issuer mints it into every grant and renewal (the grant Pods'
	// fiberd.io/fibers-max annotation carries it for the development issuer).
	// +required
	// +kubebuilder:validation:Minimum=1
	FibersMax int32 `json:"fibersMax"`

	// FibersWarm is each grant's fibers.warm: the spare fibers fiberd forks ahead of any Clone,
	// so a Clone is a hand-over. Empty or zero means none; at most FibersMax. The controller's
	// issuer mints it into every grant and renewal; the development issuer mints none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FibersWarm int32 `json:"fibersWarm,omitempty"`

	// WBudget is each grant's wBudget: the private memory (and isolated scratch) one fiber may
	// dirty, such as 64Mi, in whole bytes. Empty means no budget. The controller's issuer mints
	// it into every grant and renewal.
	// +optional
	WBudget *resource.Quantity `json:"wBudget,omitempty"`

	// Lease is how long each grant is issued for; fiberd renews it at half. Empty means the
	// issuer's default (fiberd-controller -issuer-lease, 10m); longer than its -issuer-max-lease
	// (1h) is refused. It also bounds how long a grant outlives its Pod's or pool's deletion. The
	// development issuer uses its -lease.
	// +optional
	Lease *metav1.Duration `json:"lease,omitempty"`

	// Isolation is how far fiberd keeps the grant Pods' fibers apart: "fiber" (the default: a
	// user and namespaces per grant, and a PID namespace and /tmp per fiber), "grant" (per grant
	// only) or "none". It is both fiberd's -isolation and its -min-isolation, so a Pod whose node
	// cannot give that much refuses its grant (and never becomes ready) instead of serving less.
	// "fiber" and "grant" run /usr/local/bin/fiberd-caps with its four capabilities in the Pod's
	// user namespace; "none" runs plain /usr/local/bin/fiberd with none.
	// +optional
	// +kubebuilder:default=fiber
	Isolation Isolation `json:"isolation,omitempty"`

	// Pod is what the grant Pods get besides what the controller decides: where they may run and
	// what they request.
	// +optional
	Pod PodSpec `json:"pod,omitempty"`

	// DrainGracePeriod is how long a grant Pod the pool no longer wants (scale-down, or an old
	// revision replaced during a roll) is kept after it stopped taking new sessions: it leaves the
	// pool's Service at once (label fiberd.io/serving "false") and is deleted when its fibers in
	// use reach 0 or this period has passed, whichever comes first. Without a client certificate
	// to read fibers in use (fiberd-controller -fiberd-tls-dir) the controller waits the whole
	// period. Zero deletes at once. Default 5m.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="drainGracePeriod must not be negative"
	DrainGracePeriod *metav1.Duration `json:"drainGracePeriod,omitempty"`
}

// TemplateSpec names a pool's template and the image that carries it.
type TemplateSpec struct {
	// Name is the template reference every grant of the pool carries, "name@sha256:<digest>":
	// the name of the spec file in the image's template directory (a DNS-1123 label) and the
	// 64 lower-case hex digits of its SHA-256. It is the grant Pods' fiberd.io/template
	// annotation. fiberd refuses a grant whose digest is not the spec's in the image.
	// +required
	// +kubebuilder:validation:MaxLength=135
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?@sha256:[0-9a-f]{64}$`
	Name string `json:"name"`

	// Image is the grant Pods' container image: fiberd, fiberctl and the template's files.
	// +required
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`

	// ImagePullPolicy is the container's image pull policy. Empty means IfNotPresent.
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
}

// Isolation is a fiberd isolation level.
// +kubebuilder:validation:Enum=fiber;grant;none
type Isolation string

// The isolation levels, fiberd's -isolation values.
const (
	IsolationFiber Isolation = "fiber"
	IsolationGrant Isolation = "grant"
	IsolationNone  Isolation = "none"
)

// PodSpec is the part of a grant Pod's spec a pool chooses. Everything else (the container, its
// security context, volumes, readiness gate, topology spread) is the controller's.
type PodSpec struct {
	// NodeSelector restricts the grant Pods to nodes with these labels. Empty means any node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations let the grant Pods run on nodes with matching taints. Empty means none.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity is the grant Pods' node and Pod (anti-)affinity. Empty means none. The controller
	// spreads the Pods over nodes with a topology spread constraint in any case.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// Resources of fiberd's container, which its fibers share. Empty means those of
	// deploy/kubernetes/grant-pod.yaml: requests cpu 100m and memory 128Mi, limit memory 1Gi.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// PriorityClassName is the grant Pods' priority class. Empty means the cluster's default.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// FiberPoolStatus is what the controller last saw of a pool's grant Pods.
type FiberPoolStatus struct {
	// ObservedGeneration is the metadata.generation of the spec this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Replicas is the number of the pool's grant Pods that serve or will: they exist, are not
	// being deleted, not failed and not draining. During a roll it counts the surge Pod too, so
	// it may be spec.replicas + 1.
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas is the number of those whose PodReady condition is True: fiberd is up and a
	// template of its grant is warm (the fiberd.io/zygote-ready readiness gate). They are the
	// ready endpoints of the pool's Service.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// UpdatedReplicas is the number of the Replicas of the current revision (UpdateRevision).
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// DrainingReplicas is the number of grant Pods draining: out of the pool's Service, waiting
	// for their fibers to end or spec.drainGracePeriod to pass before they are deleted.
	// +optional
	DrainingReplicas int32 `json:"drainingReplicas"`

	// UpdateRevision is the revision of the grant Pods the spec asks for: a hash of everything
	// the controller puts in a grant Pod, the Pods' fiberd.io/revision label. A Pod of another
	// revision is rolled: replaced one at a time.
	// +optional
	UpdateRevision string `json:"updateRevision,omitempty"`

	// Fibers is the pool's fiber capacity.
	// +optional
	Fibers FibersStatus `json:"fibers,omitempty"`

	// Selector is the label selector of the pool's grant Pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// Conditions are Available, Progressing and ReplicaFailure (see the Condition constants).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FibersStatus counts a pool's fibers.
type FibersStatus struct {
	// Capacity is the fibers the ready grant Pods may run at once: readyReplicas * fibersMax.
	// +optional
	Capacity int64 `json:"capacity"`

	// InUse is the fibers running on the pool's grant Pods, draining ones included, as their
	// fiberd last reported them (GET /v1/status, at most a status interval old). Absent when
	// unknown: the controller has no client certificate for fiberd's API, or no Pod answered.
	// The condition FibersCounted says which, and whether some Pods' counts are missing.
	// +optional
	InUse *int64 `json:"inUse,omitempty"`
}

// The condition types of a FiberPool.
const (
	// ConditionAvailable is True when at least spec.replicas grant Pods are ready (reason
	// ReasonReplicasReady), False otherwise (ReasonReplicasNotReady).
	ConditionAvailable = "Available"
	// ConditionProgressing is True while the controller is replacing grant Pods of an older
	// revision one at a time (ReasonRollingUpdate), creating grant Pods (ReasonScalingUp),
	// draining those above spec.replicas (ReasonDraining), replacing failed or deleted ones
	// (ReasonReplacing) or waiting for them to become ready (ReasonWaitingForReady); False once
	// every Pod the spec asks for is ready (ReasonSettled). ReasonScalingDown is no longer set:
	// Pods above spec.replicas drain.
	ConditionProgressing = "Progressing"
	// ConditionReplicaFailure is True when the last reconcile could not create, delete or drain
	// a grant Pod, or keep the pool's Service (ReasonCreateFailed, ReasonDeleteFailed,
	// ReasonDrainFailed, ReasonServiceFailed; the message holds the API server's answer), False
	// otherwise (ReasonNoFailure).
	ConditionReplicaFailure = "ReplicaFailure"
	// ConditionFibersCounted is True when every grant Pod with a Pod IP reported its fibers in
	// use (ReasonCounted); False when the controller has no client certificate for fiberd's API
	// (ReasonNoClientCertificate: drains wait the whole grace period) or some Pods did not answer
	// (ReasonStatusUnreachable: the message names them; status.fibers.inUse counts the others).
	ConditionFibersCounted = "FibersCounted"
)

// The reasons of the conditions above. Progressing is also True with ReasonRollingUpdate while
// grant Pods of an older revision are replaced, and with ReasonDraining while Pods above
// spec.replicas drain.
const (
	ReasonReplicasReady       = "ReplicasReady"
	ReasonReplicasNotReady    = "ReplicasNotReady"
	ReasonScalingUp           = "ScalingUp"
	ReasonScalingDown         = "ScalingDown"
	ReasonReplacing           = "Replacing"
	ReasonWaitingForReady     = "WaitingForReady"
	ReasonSettled             = "Settled"
	ReasonCreateFailed        = "CreateFailed"
	ReasonDeleteFailed        = "DeleteFailed"
	ReasonNoFailure           = "NoFailure"
	ReasonRollingUpdate       = "RollingUpdate"
	ReasonDraining            = "Draining"
	ReasonDrainFailed         = "DrainFailed"
	ReasonServiceFailed       = "ServiceFailed"
	ReasonCounted             = "Counted"
	ReasonNoClientCertificate = "NoClientCertificate"
	ReasonStatusUnreachable   = "StatusUnreachable"
)

// FiberPoolList is a list of FiberPools.
//
// +kubebuilder:object:root=true
type FiberPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FiberPool `json:"items"`
}
