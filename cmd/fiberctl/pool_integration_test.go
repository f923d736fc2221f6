//go:build integration

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/test/kubeapi"
)

// TestClonePoolReadsARealCluster: fiberctl clone -pool with -kubeconfig and -namespace reads the
// pool's EndpointSlices from a real API server (the harness's admin kubeconfig) and asks the Pod
// they list. The Pod's address is TEST-NET (192.0.2.0/24, never routed), so the Clone cannot be
// served: the error names the Pod and its address, and -deadline bounds the call.
func TestClonePoolReadsARealCluster(t *testing.T) {
	env := kubeapi.NewEnv(t)
	pod := env.CreateGrantPod(t, kubeapi.GrantPod{Name: "web-0", Labels: map[string]string{"fiberd.io/pool": "web", "fiberd.io/serving": "true"}})
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-abc", Namespace: env.Namespace, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("api"), Port: ptr.To[int32](8484), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"192.0.2.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: env.Namespace, Name: pod.Name, UID: pod.UID},
		}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.Admin.DiscoveryV1().EndpointSlices(env.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, _, errs := runPool(t, nil, "clone", "-pool", "web", "-namespace", env.Namespace, "-kubeconfig", env.CP.Kubeconfig(), "-deadline", "2s")
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("fiberctl clone -pool -deadline 2s took %v", took)
	}
	if code != grantcli.ExitFailure || !strings.Contains(errs, "pool "+env.Namespace+"/web: no grant Pod served the Clone: pod web-0 (192.0.2.10:8484)") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
	// A pool with no slice at all: no ready grant Pod, and where to look.
	code, _, errs = runPool(t, nil, "clone", "-pool", "none", "-namespace", env.Namespace, "-kubeconfig", env.CP.Kubeconfig())
	if code != grantcli.ExitFailure || !strings.Contains(errs, "pool "+env.Namespace+"/none has no ready grant Pod") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}
