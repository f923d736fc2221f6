package pool

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/pkg/template"
)

// Labels every grant Pod of a pool carries. LabelName and LabelComponent are those of
// deploy/kubernetes/grant-pod.yaml, which deploy/kubernetes/service.yaml selects.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	// LabelPool is the name of the pool that controls the Pod. The controller's cache holds
	// only Pods with this label.
	LabelPool = "fiberd.io/pool"
	// LabelOrdinal is the Pod's ordinal in its pool, in decimal; the Pod is "<pool>-<ordinal>".
	LabelOrdinal = "fiberd.io/ordinal"
	// LabelServing is "true" on a grant Pod that takes new sessions and "false" on one that
	// drains. The pool's Service selects "true" only, so a draining Pod leaves its EndpointSlices.
	LabelServing = "fiberd.io/serving"
	// LabelRevision is the revision of the pool's spec the Pod was made from (Revision): a Pod
	// whose revision is not the pool's current one is rolled.
	LabelRevision = "fiberd.io/revision"
)

// AnnotationDrainStarted is set, with LabelServing "false", when a grant Pod starts draining: the
// time, RFC 3339 in UTC, from which its pool's drainGracePeriod runs. A restarted controller
// resumes the drain from it.
const AnnotationDrainStarted = "fiberd.io/drain-started"

// Annotations the issuer mints a grant Pod's grant from.
const (
	AnnotationTemplate  = "fiberd.io/template"
	AnnotationFibersMax = "fiberd.io/fibers-max"
)

// ReadinessGate is the Pod condition fiberd sets once a template of its grant is warm.
const ReadinessGate = "fiberd.io/zygote-ready"

// DefaultIssuerURL is the issuer grant Pods fetch their grants from when Config.IssuerURL is
// empty: the development issuer of deploy/kubernetes/issuer.yaml.
const DefaultIssuerURL = "https://grant-issuer.fiberd-system.svc"

// The names grant-pod.yaml gives what a namespace of grant Pods must hold (deploy/kubernetes).
const (
	serviceAccount = "fiberd"
	issuerCAConfig = "grant-issuer-ca"
	apiTLSSecret   = "fiberd-api-tls"
	apiPort        = 8484
	podUser        = 65532
	tokenLifetime  = 600 // seconds, the projected grant token's
	hostnameKey    = "kubernetes.io/hostname"
)

// Shape is what grant Pods get from the controller's configuration rather than from their pool.
// The zero value is the shape of deploy/kubernetes/grant-pod.yaml.
type Shape struct {
	// IssuerURL is the issuer's URL: fiberd's -issuer and -grant-issuer-url, and the audience
	// of the projected token fiberd fetches its grant with. Empty means DefaultIssuerURL.
	IssuerURL string
}

func (s Shape) withDefaults() Shape {
	if s.IssuerURL == "" {
		s.IssuerURL = DefaultIssuerURL
	}
	return s
}

// validate reports a Shape that cannot make a working Pod, naming the field.
func (s Shape) validate() error {
	u, err := url.Parse(s.IssuerURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("pool: IssuerURL %q: want an https URL such as %s", s.IssuerURL, DefaultIssuerURL)
	}
	return nil
}

// PodName is the name of a pool's grant Pod of the given ordinal.
func PodName(poolName string, ordinal int32) string {
	return poolName + "-" + strconv.FormatInt(int64(ordinal), 10)
}

// Selector is the labels that select a pool's grant Pods.
func Selector(poolName string) map[string]string {
	return map[string]string{LabelName: "fiberd", LabelComponent: "grant-pod", LabelPool: poolName}
}

// errPoolSpec is wrapped by GrantPod when the pool's spec cannot make a Pod.
var errPoolSpec = errors.New("pool spec")

// GrantPod builds the grant Pod of the given ordinal of p, controlled by p, labelled serving and
// with its revision (Revision). It is pure: it reads
// nothing but its arguments. It fails, wrapping errPoolSpec, when p's template reference is
// malformed (which the CRD's validation also refuses).
func GrantPod(p *v1alpha1.FiberPool, ordinal int32, shape Shape) (*corev1.Pod, error) {
	shape = shape.withDefaults()
	if _, err := template.ParseRef(p.Spec.Template.Name); err != nil {
		return nil, fmt.Errorf("pool %s/%s: %w: %w", p.Namespace, p.Name, errPoolSpec, err)
	}
	labels := Selector(p.Name)
	labels[LabelOrdinal] = strconv.FormatInt(int64(ordinal), 10)
	labels[LabelServing] = "true"

	isolation := p.Spec.Isolation
	if isolation == "" {
		isolation = v1alpha1.IsolationFiber
	}
	pullPolicy := p.Spec.Template.ImagePullPolicy
	if pullPolicy == "" {
		pullPolicy = corev1.PullIfNotPresent
	}
	resources := defaultResources()
	if p.Spec.Pod.Resources != nil {
		resources = *p.Spec.Pod.Resources.DeepCopy()
	}
	command, security := fiberdCommand(isolation)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      PodName(p.Name, ordinal),
			Namespace: p.Namespace,
			Labels:    labels,
			Annotations: map[string]string{
				AnnotationTemplate:  p.Spec.Template.Name,
				AnnotationFibersMax: strconv.FormatInt(int64(p.Spec.FibersMax), 10),
			},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(p, v1alpha1.GroupVersion.WithKind("FiberPool")),
			},
		},
		Spec: corev1.PodSpec{
			HostUsers:                     ptr.To(false),
			ServiceAccountName:            serviceAccount,
			AutomountServiceAccountToken:  ptr.To(true),
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](podUser),
				RunAsGroup:     ptr.To[int64](podUser),
				FSGroup:        ptr.To[int64](podUser),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: ReadinessGate}},
			Containers: []corev1.Container{{
				Name:            "fiberd",
				Image:           p.Spec.Template.Image,
				ImagePullPolicy: pullPolicy,
				Command:         command,
				Args:            fiberdArgs(shape, isolation),
				Env:             fiberdEnv(),
				Ports: []corev1.ContainerPort{{
					Name: "api", ContainerPort: apiPort, Protocol: corev1.ProtocolTCP,
				}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{
						"/usr/local/bin/fiberctl", "-addr", "unix:///var/lib/fiberd/state/fiberd.sock", "status", "-ready",
					}}},
					PeriodSeconds:    2,
					TimeoutSeconds:   2,
					FailureThreshold: 1,
				},
				SecurityContext: security,
				Resources:       resources,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "state", MountPath: "/var/lib/fiberd"},
					{Name: "grant-token", MountPath: "/var/run/secrets/fiberd.io/grant-token", ReadOnly: true},
					{Name: "issuer-ca", MountPath: "/etc/fiberd/issuer-ca", ReadOnly: true},
					{Name: "api-tls", MountPath: "/etc/fiberd/api-tls", ReadOnly: true},
				},
			}},
			Volumes: fiberdVolumes(shape),
			// ScheduleAnyway, not DoNotSchedule: spreading is a preference, capacity is the
			// promise. With DoNotSchedule a node that is down but not yet removed still counts as
			// a domain holding none of the pool's Pods, so the replacements of its Pods could not
			// be placed anywhere else until it is gone (docs/design.md, decision 104).
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
				MaxSkew:           1,
				TopologyKey:       hostnameKey,
				WhenUnsatisfiable: corev1.ScheduleAnyway,
				LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{LabelPool: p.Name}},
			}},
			NodeSelector:      maps.Clone(p.Spec.Pod.NodeSelector),
			Affinity:          p.Spec.Pod.Affinity.DeepCopy(),
			PriorityClassName: p.Spec.Pod.PriorityClassName,
		},
	}
	for _, t := range p.Spec.Pod.Tolerations {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, *t.DeepCopy())
	}
	pod.Labels[LabelRevision] = podRevision(pod)
	return pod, nil
}

// fiberdCommand is the container's command and security context for an isolation level: with
// isolation, fiberd-caps (fiberd with four file capabilities, which it takes at exec, so it needs
// allowPrivilegeEscalation) and those four added to the bounding set; without, plain fiberd with
// no capability and no escalation.
func fiberdCommand(isolation v1alpha1.Isolation) ([]string, *corev1.SecurityContext) {
	if isolation == v1alpha1.IsolationNone {
		return []string{"/usr/local/bin/fiberd"}, &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	return []string{"/usr/local/bin/fiberd-caps"}, &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(true),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"},
			Add:  []corev1.Capability{"SYS_ADMIN", "SETUID", "SETGID", "CHOWN"},
		},
	}
}

// fiberdArgs is fiberd's command line: grant-pod.yaml's, then the pool's isolation as both the
// level fiberd builds and the least it accepts.
func fiberdArgs(shape Shape, isolation v1alpha1.Isolation) []string {
	return []string{
		"-home=kubernetes",
		"-listen=:" + strconv.Itoa(apiPort),
		"-tls-cert=/etc/fiberd/api-tls/tls.crt",
		"-tls-key=/etc/fiberd/api-tls/tls.key",
		"-client-ca=/etc/fiberd/api-tls/client-ca.crt",
		"-state=/var/lib/fiberd/state",
		"-run-dir=/var/lib/fiberd/run",
		"-grants-dir=/var/lib/fiberd/grants",
		"-templates=/etc/fiberd/templates",
		"-endpoint-family=inet4",
		"-issuer=" + shape.IssuerURL,
		"-grant-issuer-url=" + shape.IssuerURL,
		"-grant-token-file=/var/run/secrets/fiberd.io/grant-token/token",
		"-grant-ca-file=/etc/fiberd/issuer-ca/ca.crt",
		"-isolation=" + string(isolation),
		"-min-isolation=" + string(isolation),
	}
}

// fiberdEnv is the downward API fiberd's Kubernetes home reads its scope from.
func fiberdEnv() []corev1.EnvVar {
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: path},
		}}
	}
	return []corev1.EnvVar{
		field("POD_NAME", "metadata.name"),
		field("POD_NAMESPACE", "metadata.namespace"),
		field("POD_UID", "metadata.uid"),
		field("POD_IPS", "status.podIPs"),
	}
}

// fiberdVolumes are fiberd's state directory, the projected token it fetches its grant with, the
// issuer's CA and its API's TLS material.
func fiberdVolumes(shape Shape) []corev1.Volume {
	return []corev1.Volume{
		{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "grant-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Path:              "token",
				Audience:          shape.IssuerURL,
				ExpirationSeconds: ptr.To[int64](tokenLifetime),
			}}},
		}}},
		{Name: "issuer-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: issuerCAConfig},
		}}},
		{Name: "api-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  apiTLSSecret,
			DefaultMode: ptr.To[int32](0o440),
		}}},
	}
}

// defaultResources are grant-pod.yaml's: fibers share fiberd's container, so its limit is theirs.
func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100m"),
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
	}
}
