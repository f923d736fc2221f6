package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"fiberd.io/fiberd/internal/grantcli"
	"fiberd.io/fiberd/pkg/client/pool"
)

// poolCluster is a fake cluster whose namespace "grants" has the pool "p":
// an EndpointSlice listing a grant Pod per agent address, ready, each
// Pod's UID its name (fakeAgent sheds the grant "full").
func poolCluster(t *testing.T, pods map[string]string) kubeFunc {
	t.Helper()
	cs := fake.NewClientset()
	for name, addr := range pods {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(port)
		// A slice has one port for all its endpoints: each agent gets one.
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "p-" + name, Namespace: "grants", Labels: map[string]string{discoveryv1.LabelServiceName: "p"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("api"), Port: ptr.To(int32(n))}},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{host},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: name, Namespace: "grants", UID: types.UID(name)},
			}},
		}
		if err := cs.Tracker().Add(es); err != nil {
			t.Fatal(err)
		}
	}
	return func(kubeconfig, namespace string) (pool.SliceClient, string, error) {
		if kubeconfig == "bad" {
			return nil, "", errors.New(`-kubeconfig "bad": no such file`)
		}
		if namespace == "" {
			namespace = "grants" // the kubeconfig context's
		}
		return cs.DiscoveryV1().EndpointSlices(namespace), namespace, nil
	}
}

func runPool(t *testing.T, kube kubeFunc, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, clock: clocktesting.NewFakePassiveClock(testNow), kube: kube})
	return code, out.String(), errb.String()
}

func TestClonePool(t *testing.T) {
	full, fullAddr := newAgent(t)
	ok, okAddr := newAgent(t)
	kube := poolCluster(t, map[string]string{"full": fullAddr, "g-ok": okAddr})

	// The Pod that sheds is asked at most once; the other serves.
	for range 4 {
		code, out, errs := runPool(t, kube, "clone", "-pool", "p", "-session", "s1", "-payload", "hi", "-deadline", "5s")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		for _, want := range []string{"fiber     g-ok/2/5", "kind      create", "pod       g-ok (" + okAddr + ")", "took"} {
			if !strings.Contains(out, want) {
				t.Errorf("output %q lacks %q", out, want)
			}
		}
	}
	if len(full.requests) > 4 {
		t.Errorf("the shedding Pod was asked %d times in 4 Clones", len(full.requests))
	}
	last := ok.requests[len(ok.requests)-1]
	for _, want := range []string{`"grantUID":"g-ok"`, `"session":"s1"`, `"payload":"aGk="`} {
		if !strings.Contains(last, want) {
			t.Errorf("request %s lacks %s", last, want)
		}
	}

	// JSON names the Pod.
	code, out, _ := runPool(t, kube, "-o", "json", "clone", "-pool", "p")
	var got poolCloneOutput
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.FiberID != "g-ok/2/5" || got.Pod != "g-ok" || got.PodAddr != okAddr {
		t.Fatalf("exit %d, output %q", code, out)
	}

	// Release and park go to the fiber's Pod.
	if code, out, errs := runPool(t, kube, "release", "-pool", "p", "g-ok/2/5"); code != 0 || out != "released g-ok/2/5\n" {
		t.Fatalf("release -pool: exit %d, %q %q", code, out, errs)
	}
	if last := ok.requests[len(ok.requests)-1]; !strings.Contains(last, `POST /v1/release {"fiberID":"g-ok/2/5"}`) {
		t.Errorf("request %s", last)
	}
	if code, _, errs := runPool(t, kube, "park", "-pool", "p", "other/2/5"); code != grantcli.ExitFailure || !strings.Contains(errs, "no grant Pod of UID other") {
		t.Errorf("park of an unknown Pod's fiber: exit %d, %q", code, errs)
	}
}

func TestClonePoolAllShed(t *testing.T) {
	full, fullAddr := newAgent(t)
	kube := poolCluster(t, map[string]string{"full": fullAddr})
	code, out, errs := runPool(t, kube, "-o", "json", "clone", "-pool", "p")
	if code != grantcli.ExitFailure {
		t.Fatalf("exit %d, want %d", code, grantcli.ExitFailure)
	}
	if !strings.Contains(errs, "pool grants/p: no grant Pod served the Clone: pod full (") || !strings.Contains(errs, "429 SHED: at fibers.max") {
		t.Errorf("stderr %q", errs)
	}
	if !strings.Contains(out, `"code":"SHED"`) {
		t.Errorf("stdout %q: want the miss body", out)
	}
	if len(full.requests) != 1 {
		t.Errorf("the Pod was asked %d times, want once", len(full.requests))
	}
}

func TestClonePoolEmpty(t *testing.T) {
	kube := poolCluster(t, map[string]string{})
	code, _, errs := runPool(t, kube, "clone", "-pool", "p", "-namespace", "grants")
	if code != grantcli.ExitFailure || !strings.Contains(errs, "pool grants/p has no ready grant Pod") || !strings.Contains(errs, "kubectl -n grants get endpointslices -l kubernetes.io/service-name=p") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}

func TestClonePoolUsage(t *testing.T) {
	kube := poolCluster(t, map[string]string{})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"clone", "-pool", "p", "-grant-uid", "g1"}, "leave out -grant-uid and -grant"},
		{[]string{"-addr", "127.0.0.1:1", "clone", "-pool", "p"}, "leave out -addr"},
		{[]string{"clone", "-namespace", "x", "-grant-uid", "g1"}, "go with -pool NAME"},
		{[]string{"release", "-kubeconfig", "k", "g1/1/1"}, "go with -pool NAME"},
		{[]string{"clone", "-pool", "p", "-kubeconfig", "bad"}, `-kubeconfig "bad": no such file`},
		{[]string{"clone"}, "or the pool: -pool NAME"},
	} {
		code, _, errs := runPool(t, kube, tc.args...)
		if code != grantcli.ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs, grantcli.ExitUsage, tc.want)
		}
	}
}
