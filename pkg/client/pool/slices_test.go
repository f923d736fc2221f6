package pool

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// slice is an EndpointSlice of Service svc with port "api" 8484 and eps.
func slice(name, svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("api"), Port: ptr.To[int32](8484), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

// podEP is an endpoint of Pod name at ip; ready nil leaves the condition unset.
func podEP(name, ip string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ready},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		NodeName:   ptr.To("node-1"),
	}
}

func names(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.PodName+"@"+e.Addr)
	}
	return out
}

func TestEndpointsOf(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	terminating := podEP("p-term", "10.0.0.9", no)
	terminating.Conditions.Terminating = yes
	noRef := podEP("p-noref", "10.0.0.8", yes)
	noRef.TargetRef = nil
	noUID := podEP("p-nouid", "10.0.0.7", yes)
	noUID.TargetRef.UID = ""
	notPod := podEP("p-node", "10.0.0.6", yes)
	notPod.TargetRef.Kind = "Node"
	noAddr := podEP("p-noaddr", "", yes)
	noAddr.Addresses = nil
	a := slice("a", "p", podEP("p-1", "10.0.0.1", yes), podEP("p-0", "10.0.0.2", nil), podEP("p-2", "10.0.0.3", no),
		terminating, noRef, noUID, notPod, noAddr)
	// The same Pod in two slices (a slice being split) counts once.
	b := slice("b", "p", podEP("p-1", "10.0.0.1", yes), podEP("p-3", "10.0.0.4", yes))
	wrongPort := slice("c", "p", podEP("p-4", "10.0.0.5", yes))
	wrongPort.Ports[0].Name = ptr.To("metrics")
	udp := slice("d", "p", podEP("p-5", "10.0.0.10", yes))
	udp.Ports[0].Protocol = ptr.To(corev1.ProtocolUDP)
	fqdn := slice("e", "p", podEP("p-6", "p-6.example", yes))
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	v6 := slice("f", "p", podEP("p-7", "fd00::7", yes))
	v6.AddressType = discoveryv1.AddressTypeIPv6

	got := EndpointsOf([]*discoveryv1.EndpointSlice{a, b, wrongPort, udp, fqdn, v6}, "api")
	want := []string{"p-0@10.0.0.2:8484", "p-1@10.0.0.1:8484", "p-3@10.0.0.4:8484", "p-7@[fd00::7]:8484"}
	if !slices.Equal(names(got), want) {
		t.Errorf("EndpointsOf = %v, want %v", names(got), want)
	}
	if got[0].PodUID != "uid-p-0" || got[0].Node != "node-1" {
		t.Errorf("first endpoint %+v, want UID uid-p-0 on node-1", got[0])
	}
}

// waitFor polls the source until its endpoints are want.
func waitFor(t *testing.T, src Source, want ...string) Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := src.Snapshot()
		if got := names(s.Endpoints); slices.Equal(got, want) {
			return s
		} else if time.Now().After(deadline) {
			t.Fatalf("endpoints %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSliceSourceFollowsTheSlices(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	cs := fake.NewClientset(
		slice("p-abc", "p", podEP("p-0", "10.0.0.1", yes), podEP("p-1", "10.0.0.2", no)),
		slice("other-abc", "other", podEP("o-0", "10.0.1.1", yes)),
	)
	src := NewSliceSource(cs.DiscoveryV1().EndpointSlices("ns"), "ns", "p", SliceOptions{Resync: time.Second})
	if s := src.Snapshot(); s.Synced || len(s.Endpoints) != 0 {
		t.Fatalf("snapshot before Start = %+v", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src.Start(ctx)
	defer src.Stop()
	if err := src.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, src, "p-0@10.0.0.1:8484")
	if !s.Synced {
		t.Error("not Synced after WaitSynced")
	}
	slices := cs.DiscoveryV1().EndpointSlices("ns")
	upd := slice("p-abc", "p", podEP("p-0", "10.0.0.1", yes), podEP("p-1", "10.0.0.2", yes))
	if _, err := slices.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2 := waitFor(t, src, "p-0@10.0.0.1:8484", "p-1@10.0.0.2:8484")
	if s2.Version <= s.Version {
		t.Errorf("version %d after a change, was %d", s2.Version, s.Version)
	}
	if err := slices.Delete(ctx, "p-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, src)
	src.Stop()
	src.Stop()
}

func TestSliceSourceStopWithoutStart(t *testing.T) {
	src := NewSliceSource(fake.NewClientset().DiscoveryV1().EndpointSlices("ns"), "ns", "p", SliceOptions{})
	src.Stop()
	src.Start(context.Background()) // after Stop: starts nothing
	if src.Snapshot().Synced {
		t.Error("a stopped source says it synced")
	}
}

func TestOpen(t *testing.T) {
	yes := ptr.To(true)
	cs := fake.NewClientset(slice("p-abc", "p", podEP("p-0", "10.0.0.1", yes)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Open(ctx, cs.DiscoveryV1().EndpointSlices("ns"), Config{Namespace: "ns", Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(p.Endpoints()); !slices.Equal(got, []string{"p-0@10.0.0.1:8484"}) {
		t.Errorf("Endpoints = %v", got)
	}
	p.Close() // stops the watch: goleak checks
	if _, err := Open(ctx, cs.DiscoveryV1().EndpointSlices(""), Config{Name: "p"}); err == nil {
		t.Error("Open without a namespace worked")
	}
}
