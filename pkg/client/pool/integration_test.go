//go:build integration

package pool

// Integration test of the pool client against a real kube-apiserver and etcd (test/kubeapi): the
// client follows EndpointSlice objects the test writes as the endpointslice controller would,
// with the permissions deploy/kubernetes/pool-client-rbac.yaml grants and nothing more, and the
// test counts its requests to the API server. Run with `make test-integration`.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/test/kubeapi"
)

// itWait bounds how long the test waits for the watch to deliver a change.
const itWait = 20 * time.Second

// apiCounter counts the requests a client sends to the API server, by verb.
type apiCounter struct {
	mu   sync.Mutex
	reqs []string // "GET /apis/...?watch=true"
}

func (c *apiCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		c.reqs = append(c.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

func (c *apiCounter) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// applyPoolClientRBAC creates deploy/kubernetes/pool-client-rbac.yaml's Role and RoleBinding and
// its ServiceAccount in env's namespace.
func applyPoolClientRBAC(t *testing.T, env *kubeapi.Env) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "kubernetes", "pool-client-rbac.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sa := ""
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		raw, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *rbacv1.Role:
			_, err = env.Admin.RbacV1().Roles(env.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			sa = o.Subjects[0].Name
			_, err = env.Admin.RbacV1().RoleBindings(env.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", path, obj)
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if sa == "" {
		t.Fatalf("%s binds no ServiceAccount", path)
	}
	env.CreateServiceAccount(t, sa)
	return sa
}

// poolSlice is an EndpointSlice of the pool's Service as the endpointslice controller writes it,
// each endpoint a grant Pod at its IP with its ready condition.
func poolSlice(ns, name, pool string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: pool,
			discoveryv1.LabelManagedBy:   "pool-client-test",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(APIPort), Port: ptr.To[int32](8484), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

func podEndpoint(p *corev1.Pod, ip string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		NodeName:   ptr.To(p.Spec.NodeName),
	}
}

// waitEndpoints waits until the pool lists exactly the Pods named, in name order.
func waitEndpoints(t *testing.T, p *Pool, want ...string) {
	t.Helper()
	deadline := time.Now().Add(itWait)
	for {
		var got []string
		for _, e := range p.Endpoints() {
			got = append(got, e.PodName)
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool lists %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPoolFollowsRealEndpointSlices(t *testing.T) {
	env := kubeapi.NewEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const pool = "p"

	// The grant Pods (real UIDs), their fake agents on loopback, and the Pod IPs the slices
	// name: the API server refuses loopback endpoint addresses, so the client's dialer maps
	// each Pod IP to its agent.
	var (
		pods  []*corev1.Pod
		ags   []*agent
		route = map[string]string{}
	)
	for i := range 3 {
		name := fmt.Sprintf("%s-%d", pool, i)
		pd := env.CreateGrantPod(t, kubeapi.GrantPod{Name: name, Labels: map[string]string{"fiberd.io/pool": pool, "fiberd.io/serving": "true"}})
		pods = append(pods, pd)
		a := newAgent(t, name, string(pd.UID), serve)
		ags = append(ags, a)
		route[fmt.Sprintf("10.244.0.%d:8484", i+1)] = a.srv.Listener.Addr().String()
	}
	ip := func(i int) string { return fmt.Sprintf("10.244.0.%d", i+1) }
	d := &net.Dialer{Timeout: 5 * time.Second}
	transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		to, ok := route[addr]
		if !ok {
			return nil, fmt.Errorf("no agent for %s", addr)
		}
		return d.DialContext(ctx, network, to)
	}}
	defer transport.CloseIdleConnections()

	// The pool's Service as the controller keeps it (no endpointslice controller runs here:
	// the test writes the slices).
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: env.Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"fiberd.io/pool": pool, "fiberd.io/serving": "true"},
			Ports:     []corev1.ServicePort{{Name: APIPort, Port: 8484, TargetPort: intstr.FromInt32(8484), Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := env.Admin.CoreV1().Services(env.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slicesAPI := env.Admin.DiscoveryV1().EndpointSlices(env.Namespace)
	a, err := slicesAPI.Create(ctx, poolSlice(env.Namespace, pool+"-a", pool, podEndpoint(pods[0], ip(0), true), podEndpoint(pods[1], ip(1), false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slicesAPI.Create(ctx, poolSlice(env.Namespace, pool+"-b", pool, podEndpoint(pods[2], ip(2), true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another Service's slice in the namespace is not the pool's.
	if _, err := slicesAPI.Create(ctx, poolSlice(env.Namespace, "other-a", "other", podEndpoint(pods[1], ip(1), true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The client (NewSliceClient's, as fiberctl's), with the RBAC of deploy/kubernetes/pool-client-rbac.yaml only, its requests
	// counted.
	sa := applyPoolClientRBAC(t, env)
	rc := env.ServiceAccountConfig(t, sa, kubeapi.TokenOptions{})
	var counter apiCounter
	rc.Wrap(counter.wrap)
	sc, err := NewSliceClient(rc, env.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Open(ctx, sc, Config{Namespace: env.Namespace, Name: pool, Transport: transport, AttemptTimeout: time.Second})
	if err != nil {
		t.Fatalf("Open with pool-client-rbac.yaml's permissions: %v", err)
	}
	defer p.Close()
	waitEndpoints(t, p, "p-0", "p-2")

	clone := func(session string) api.CloneResponse {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		resp, err := p.Clone(cctx, api.CloneRequest{Session: session})
		if err != nil {
			t.Fatalf("Clone: %v", err)
		}
		return resp
	}
	apiBefore := counter.snapshot()
	for range 30 {
		clone("")
	}
	if ags[1].calls() != 0 {
		t.Errorf("the not-ready p-1 got %d Clones", ags[1].calls())
	}
	if ags[0].calls() == 0 || ags[2].calls() == 0 {
		t.Errorf("Clones not spread over the ready Pods: p-0 %d, p-2 %d", ags[0].calls(), ags[2].calls())
	}
	sess := clone("s1")

	// p-1 turns ready: the watch sees the update.
	a.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	if _, err := slicesAPI.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEndpoints(t, p, "p-0", "p-1", "p-2")
	for i := 0; ags[1].calls() == 0; i++ {
		if i == 100 {
			t.Fatal("100 Clones and none reached p-1 after it turned ready")
		}
		clone("")
	}
	if again := clone("s1"); again.FiberID != sess.FiberID || again.Kind != api.KindAttach {
		t.Errorf("session s1 went to %s (%s) after a Pod joined, want its fiber %s", again.FiberID, again.Kind, sess.FiberID)
	}

	// p-2 drains: its slice is removed. Clones stop reaching it; Release of its fibers still does.
	var onP2 string
	for i := 0; onP2 == ""; i++ {
		if i == 100 {
			t.Fatal("100 Clones and none reached p-2")
		}
		if r := clone(""); strings.HasPrefix(r.FiberID, string(pods[2].UID)+"/") {
			onP2 = r.FiberID
		}
	}
	if err := slicesAPI.Delete(ctx, pool+"-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEndpoints(t, p, "p-0", "p-1")
	n2 := ags[2].calls()
	for range 20 {
		clone("")
	}
	if ags[2].calls() != n2 {
		t.Errorf("the drained p-2 got %d Clones after it left the slices", ags[2].calls()-n2)
	}
	if err := p.Release(ctx, onP2); err != nil {
		t.Fatalf("Release of a fiber of the drained Pod: %v", err)
	}
	ags[2].mu.Lock()
	released := slices.Contains(ags[2].released, onP2)
	ags[2].mu.Unlock()
	if !released {
		t.Errorf("p-2 did not see the Release of %s", onP2)
	}

	// Not one write, and no request per Clone: the list and watch only.
	for _, r := range counter.snapshot() {
		if !strings.HasPrefix(r, "GET ") {
			t.Errorf("the pool client wrote to the API server: %s", r)
		}
		if !strings.Contains(r, "endpointslices") {
			t.Errorf("the pool client read something besides EndpointSlices: %s", r)
		}
	}
	if after := counter.snapshot(); len(after) > len(apiBefore)+2 {
		t.Errorf("%d API requests during 150-odd Clones, want at most a watch re-opened: %v", len(after)-len(apiBefore), after[len(apiBefore):])
	}
}

func TestOpenNamesMissingPermissions(t *testing.T) {
	env := kubeapi.NewEnv(t)
	env.CreateServiceAccount(t, "nobody")
	cs, err := kubernetes.NewForConfig(env.ServiceAccountConfig(t, "nobody", kubeapi.TokenOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = Open(ctx, cs.DiscoveryV1().EndpointSlices(env.Namespace), Config{Namespace: env.Namespace, Name: "p"})
	if err == nil {
		t.Fatal("Open without list/watch on endpointslices worked")
	}
	for _, want := range []string{"forbidden", "list and watch on endpointslices.discovery.k8s.io in " + env.Namespace} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open = %v, lacks %q", err, want)
		}
	}
}
