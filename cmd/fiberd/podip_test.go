package main

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/home/kubernetes"
	"fiberd.io/fiberd/pkg/home/kubernetes/fake"
)

// With a Pod IP from the downward API (-pod-ips, $POD_IPS), the home the
// agent gets advertises it and reads nothing for it; without one it is the
// Kubernetes home as is, which reads the Pod.
func TestWithPodIP(t *testing.T) {
	k := fake.New()
	k.SetPod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "p", UID: "u"},
		Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.9"}}},
	})
	h, err := kubernetes.New(context.Background(), kubernetes.Config{
		Kube: k, PodName: "p", PodNamespace: "n", PodUID: "u",
		Family: endpoint.Inet4, CgroupRoot: t.TempDir(), Logger: logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)

	got := withPodIP(h, options{podIP: "10.0.0.7", endpointFamily: endpoint.Inet4}, logr.Discard())
	eh, ok := got.(fiberd.EndpointHoster)
	if !ok {
		t.Fatal("the home with a Pod IP is no EndpointHoster")
	}
	if ip := eh.EndpointHost(); ip != "10.0.0.7" {
		t.Fatalf("EndpointHost() = %q, want the downward API's 10.0.0.7", ip)
	}
	if n := k.Calls(fake.GetPod); n != 0 {
		t.Fatalf("%d Pod reads for an address the downward API gave", n)
	}
	if _, ok := got.(fiberd.ScopeLoser); !ok {
		t.Error("the home with a Pod IP lost OnScopeLost")
	}
	if _, ok := got.(fiberd.IssuerOverrider); !ok {
		t.Error("the home with a Pod IP lost SetIssuerReachable")
	}

	if got := withPodIP(h, options{endpointFamily: endpoint.Inet4}, logr.Discard()); got != h {
		t.Fatalf("without a Pod IP: %T, want the Kubernetes home itself", got)
	}
	if ip := h.EndpointHost(); ip != "10.0.0.9" || k.Calls(fake.GetPod) != 1 {
		t.Fatalf("the home itself answered %q after %d reads, want the Pod's 10.0.0.9 from one read", ip, k.Calls(fake.GetPod))
	}
}
