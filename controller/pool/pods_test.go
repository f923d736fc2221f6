package pool

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
)

const testTemplate = "counter@sha256:b8a44e5b32edeca662477df20448d539f68f075ab4542853b9cbf2ee78714b4a"

func testPool(mut func(*v1alpha1.FiberPool)) *v1alpha1.FiberPool {
	p := &v1alpha1.FiberPool{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: types.UID("pool-uid")},
		Spec: v1alpha1.FiberPoolSpec{
			Template:  v1alpha1.TemplateSpec{Name: testTemplate, Image: "fiberd:dev"},
			Replicas:  ptr.To[int32](4),
			FibersMax: 8,
		},
	}
	if mut != nil {
		mut(p)
	}
	return p
}

// grantPodYAML is deploy/kubernetes/grant-pod.yaml, the shape written out for users.
func grantPodYAML(t *testing.T) *corev1.Pod {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "grant-pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("grant-pod.yaml: %v", err)
	}
	return &pod
}

// TestGrantPodMatchesYAML holds the builder to deploy/kubernetes/grant-pod.yaml wherever the two
// must agree, so neither can drift: a change to one fails here until the other follows.
func TestGrantPodMatchesYAML(t *testing.T) {
	want := grantPodYAML(t)
	got, err := GrantPod(testPool(func(p *v1alpha1.FiberPool) {
		p.Spec.Template.Name = want.Annotations[AnnotationTemplate]
		p.Spec.Template.Image = want.Spec.Containers[0].Image
	}), 0, Shape{})
	if err != nil {
		t.Fatal(err)
	}
	wc, gc := want.Spec.Containers[0], got.Spec.Containers[0]
	checks := []struct {
		what      string
		got, want any
	}{
		{"annotations", got.Annotations, want.Annotations},
		{"hostUsers", got.Spec.HostUsers, want.Spec.HostUsers},
		{"serviceAccountName", got.Spec.ServiceAccountName, want.Spec.ServiceAccountName},
		{"automountServiceAccountToken", got.Spec.AutomountServiceAccountToken, want.Spec.AutomountServiceAccountToken},
		{"restartPolicy", got.Spec.RestartPolicy, want.Spec.RestartPolicy},
		{"terminationGracePeriodSeconds", got.Spec.TerminationGracePeriodSeconds, want.Spec.TerminationGracePeriodSeconds},
		{"pod securityContext", got.Spec.SecurityContext, want.Spec.SecurityContext},
		{"readinessGates", got.Spec.ReadinessGates, want.Spec.ReadinessGates},
		{"volumes", got.Spec.Volumes, want.Spec.Volumes},
		{"container name", gc.Name, wc.Name},
		{"image", gc.Image, wc.Image},
		{"imagePullPolicy", gc.ImagePullPolicy, wc.ImagePullPolicy},
		{"command", gc.Command, wc.Command},
		{"env", gc.Env, wc.Env},
		{"ports", gc.Ports, wc.Ports},
		{"readinessProbe", gc.ReadinessProbe, wc.ReadinessProbe},
		{"container securityContext", gc.SecurityContext, wc.SecurityContext},
		{"resources", gc.Resources, wc.Resources},
		{"volumeMounts", gc.VolumeMounts, wc.VolumeMounts},
	}
	for _, c := range checks {
		if !equality.Semantic.DeepEqual(c.got, c.want) {
			t.Errorf("%s differs from grant-pod.yaml:\n got %+v\nwant %+v", c.what, c.got, c.want)
		}
	}
	// The builder adds the pool's isolation after the file's arguments.
	if len(gc.Args) < len(wc.Args) || !slices.Equal(gc.Args[:len(wc.Args)], wc.Args) {
		t.Errorf("args do not start with grant-pod.yaml's:\n got %q\nwant %q", gc.Args, wc.Args)
	}
	for k, v := range want.Labels {
		if got.Labels[k] != v {
			t.Errorf("label %s = %q, want %q as in grant-pod.yaml", k, got.Labels[k], v)
		}
	}
}

// TestGrantPod checks that each part of a pool's spec lands where it should in its Pods.
func TestGrantPod(t *testing.T) {
	cpu := resource.MustParse("2")
	tests := []struct {
		name  string
		pool  *v1alpha1.FiberPool
		ord   int32
		shape Shape
		check func(t *testing.T, pod *corev1.Pod)
	}{
		{
			name: "identity and ownership",
			pool: testPool(nil), ord: 3,
			check: func(t *testing.T, pod *corev1.Pod) {
				if pod.Name != "web-3" || pod.Namespace != "ns" {
					t.Errorf("pod %s/%s, want ns/web-3", pod.Namespace, pod.Name)
				}
				rev, err := Revision(testPool(nil), Shape{})
				if err != nil || len(rev) != revisionLen {
					t.Fatalf("revision %q, %v", rev, err)
				}
				wantLabels := map[string]string{LabelName: "fiberd", LabelComponent: "grant-pod", LabelPool: "web", LabelOrdinal: "3",
					LabelServing: "true", LabelRevision: rev}
				if !equality.Semantic.DeepEqual(pod.Labels, wantLabels) {
					t.Errorf("labels %v, want %v", pod.Labels, wantLabels)
				}
				ref := metav1.GetControllerOf(pod)
				if ref == nil || ref.UID != "pool-uid" || ref.Kind != "FiberPool" || ref.APIVersion != "fiberd.io/v1alpha1" || !ptr.Deref(ref.BlockOwnerDeletion, false) {
					t.Errorf("controller reference %+v, want the pool's, blocking owner deletion", ref)
				}
				if pod.Annotations[AnnotationTemplate] != testTemplate || pod.Annotations[AnnotationFibersMax] != "8" {
					t.Errorf("annotations %v", pod.Annotations)
				}
			},
		},
		{
			name: "spread over nodes",
			pool: testPool(nil),
			check: func(t *testing.T, pod *corev1.Pod) {
				want := []corev1.TopologySpreadConstraint{{
					MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelPool: "web"}},
				}}
				if !equality.Semantic.DeepEqual(pod.Spec.TopologySpreadConstraints, want) {
					t.Errorf("topologySpreadConstraints %+v, want %+v", pod.Spec.TopologySpreadConstraints, want)
				}
			},
		},
		{
			name: "node selection, resources and pull policy from the pool",
			pool: testPool(func(p *v1alpha1.FiberPool) {
				p.Spec.Template.ImagePullPolicy = corev1.PullAlways
				p.Spec.Pod = v1alpha1.PodSpec{
					NodeSelector:      map[string]string{"pool": "fibers"},
					Tolerations:       []corev1.Toleration{{Key: "fibers", Operator: corev1.TolerationOpExists}},
					Affinity:          &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}},
					Resources:         &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: cpu}},
					PriorityClassName: "high",
				}
			}),
			check: func(t *testing.T, pod *corev1.Pod) {
				s := pod.Spec
				if s.NodeSelector["pool"] != "fibers" || len(s.Tolerations) != 1 || s.Tolerations[0].Key != "fibers" ||
					s.Affinity == nil || s.Affinity.NodeAffinity == nil || s.PriorityClassName != "high" {
					t.Errorf("node selection not taken from the pool: %+v", s)
				}
				c := s.Containers[0]
				if q := c.Resources.Requests[corev1.ResourceCPU]; q.Cmp(cpu) != 0 || len(c.Resources.Limits) != 0 {
					t.Errorf("resources %+v, want the pool's alone", c.Resources)
				}
				if c.ImagePullPolicy != corev1.PullAlways {
					t.Errorf("imagePullPolicy %s, want Always", c.ImagePullPolicy)
				}
			},
		},
		{
			name: "isolation fiber by default",
			pool: testPool(nil),
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				if !slices.Contains(c.Args, "-isolation=fiber") || !slices.Contains(c.Args, "-min-isolation=fiber") {
					t.Errorf("args %q, want -isolation=fiber and -min-isolation=fiber", c.Args)
				}
			},
		},
		{
			name: "isolation none runs plain fiberd with no capability",
			pool: testPool(func(p *v1alpha1.FiberPool) { p.Spec.Isolation = v1alpha1.IsolationNone }),
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				if !slices.Equal(c.Command, []string{"/usr/local/bin/fiberd"}) {
					t.Errorf("command %q, want plain fiberd", c.Command)
				}
				sc := c.SecurityContext
				if ptr.Deref(sc.AllowPrivilegeEscalation, true) || len(sc.Capabilities.Add) != 0 || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
					t.Errorf("securityContext %+v, want no escalation and every capability dropped", sc)
				}
				if !slices.Contains(c.Args, "-isolation=none") {
					t.Errorf("args %q, want -isolation=none", c.Args)
				}
			},
		},
		{
			name:  "issuer URL from the shape",
			pool:  testPool(nil),
			shape: Shape{IssuerURL: "https://issuer.example"},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				for _, a := range []string{"-issuer=https://issuer.example", "-grant-issuer-url=https://issuer.example"} {
					if !slices.Contains(c.Args, a) {
						t.Errorf("args %q, want %s", c.Args, a)
					}
				}
				if aud := pod.Spec.Volumes[1].Projected.Sources[0].ServiceAccountToken.Audience; aud != "https://issuer.example" {
					t.Errorf("token audience %q", aud)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := GrantPod(tc.pool, tc.ord, tc.shape)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, pod)
		})
	}
}

// TestGrantPodRefusesBadTemplate: a malformed reference makes no Pod, and the error names the pool.
func TestGrantPodRefusesBadTemplate(t *testing.T) {
	_, err := GrantPod(testPool(func(p *v1alpha1.FiberPool) { p.Spec.Template.Name = "counter" }), 0, Shape{})
	if err == nil || !strings.Contains(err.Error(), "ns/web") {
		t.Fatalf("err = %v, want one naming pool ns/web", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		fail string
	}{
		{Config{}, ""},
		{Config{Shape: Shape{IssuerURL: "http://issuer"}}, "IssuerURL"},
		{Config{MaxConcurrentReconciles: -1}, "MaxConcurrentReconciles"},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != (tc.fail == "") || (err != nil && !strings.Contains(err.Error(), tc.fail)) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.cfg, err, tc.fail)
		}
	}
}
