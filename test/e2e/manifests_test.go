//go:build e2e

package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/fiberd"
	"fiberd.io/fiberd/pkg/template"
)

// The manifests agree with each other and with the image: the Pod names the digest of the
// template spec the Dockerfile bakes in, its token's audience is the issuer's URL, and every path
// the Dockerfile copies exists. (Each manifest is also applied to a real API server by newRig.)
func TestManifestsAgree(t *testing.T) {
	root := repotest.Root(t)
	pod := manifest(t, "grant-pod.yaml")[0].(*corev1.Pod)

	spec, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "templates", "counter.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := template.Parse(spec); err != nil {
		t.Errorf("templates/counter.json: %v", err)
	}
	if got, want := pod.Annotations[annTemplate], "counter@sha256:"+template.Digest(spec); got != want {
		t.Errorf("grant-pod.yaml %s = %q, want %q (the digest of templates/counter.json)", annTemplate, got, want)
	}
	if pod.Annotations[annFibersMax] == "" {
		t.Errorf("grant-pod.yaml has no %s", annFibersMax)
	}

	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != "fiberd" {
		t.Errorf("grant-pod.yaml: want fiberd as the only container, got %d containers", len(pod.Spec.Containers))
	}
	if len(pod.Spec.ReadinessGates) != 1 || pod.Spec.ReadinessGates[0].ConditionType != readinessGate {
		t.Errorf("grant-pod.yaml readiness gates %+v, want %s", pod.Spec.ReadinessGates, readinessGate)
	}
	if pod.Spec.ServiceAccountName != fiberdAccount {
		t.Errorf("grant-pod.yaml serviceAccountName %q, want rbac.yaml's %q", pod.Spec.ServiceAccountName, fiberdAccount)
	}
	c := pod.Spec.Containers[0]
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	envs := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			envs[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for name, path := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid", "POD_IPS": "status.podIPs"} {
		if envs[name] != path {
			t.Errorf("grant-pod.yaml env %s from %q, want the downward API's %s", name, envs[name], path)
		}
	}
	for _, e := range c.Env {
		if e.Name == "SSL_CERT_FILE" {
			t.Errorf("grant-pod.yaml sets SSL_CERT_FILE: fiberd trusts -grant-ca-file for key discovery itself, and SSL_CERT_FILE would replace the roots of every other connection")
		}
	}
	var audience string
	var expiry int64
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				audience = s.ServiceAccountToken.Audience
				if s.ServiceAccountToken.ExpirationSeconds != nil {
					expiry = *s.ServiceAccountToken.ExpirationSeconds
				}
			}
		}
	}
	if audience == "" || audience != args["-grant-issuer-url"] || audience != args["-issuer"] {
		t.Errorf("grant-pod.yaml token audience %q, -issuer %q, -grant-issuer-url %q: want one URL", audience, args["-issuer"], args["-grant-issuer-url"])
	}
	if expiry != 600 {
		t.Errorf("grant-pod.yaml token expirationSeconds %d, want 600", expiry)
	}
	if len(c.Ports) != 1 || !strings.HasSuffix(args["-listen"], ":"+strconv.Itoa(int(c.Ports[0].ContainerPort))) {
		t.Errorf("grant-pod.yaml ports %+v do not match -listen %q", c.Ports, args["-listen"])
	}

	// The NetworkPolicy selects the grant Pod, admits callers to its API
	// port and clients to fiberd's endpoint ports (its default
	// -port-range, which the Pod keeps).
	np := manifest(t, "networkpolicy.yaml")[0].(*networkingv1.NetworkPolicy)
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("networkpolicy.yaml selects %s=%s; grant-pod.yaml has %q", k, v, pod.Labels[k])
		}
	}
	if _, set := args["-port-range"]; set {
		t.Errorf("grant-pod.yaml sets -port-range %q: networkpolicy.yaml admits the default's", args["-port-range"])
	}
	pr, err := endpoint.ParsePortRange(fiberd.DefaultPortRange)
	if err != nil {
		t.Fatal(err)
	}
	if len(np.Spec.Ingress) != 2 || len(np.Spec.Ingress[0].Ports) != 1 || len(np.Spec.Ingress[1].Ports) != 1 {
		t.Fatalf("networkpolicy.yaml ingress %+v: want one rule for the API and one for the endpoints", np.Spec.Ingress)
	}
	if p := np.Spec.Ingress[0].Ports[0]; p.Port == nil || p.Port.IntValue() != int(c.Ports[0].ContainerPort) {
		t.Errorf("networkpolicy.yaml admits callers at %v; the API is at %d", p.Port, c.Ports[0].ContainerPort)
	}
	if p := np.Spec.Ingress[1].Ports[0]; p.Port == nil || p.EndPort == nil || p.Port.IntValue() != pr.First || int(*p.EndPort) != pr.Last {
		t.Errorf("networkpolicy.yaml admits clients at %v-%v; fiberd's endpoints are %s", p.Port, p.EndPort, pr)
	}

	// The issuer serves at the URL the Pod names.
	var dep *appsv1.Deployment
	for _, o := range manifest(t, "issuer.yaml") {
		if d, ok := o.(*appsv1.Deployment); ok {
			dep = d
		}
	}
	if dep == nil {
		t.Fatal("issuer.yaml has no Deployment")
	}
	found := false
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if a == "-issuer="+audience {
			found = true
		}
	}
	if !found {
		t.Errorf("issuer.yaml's grant-issuer does not serve as %q: %q", audience, dep.Spec.Template.Spec.Containers[0].Args)
	}

	// Every COPY source of the Dockerfile exists.
	f, err := os.Open(filepath.Join(root, "deploy", "kubernetes", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[0] != "COPY" || strings.HasPrefix(fields[1], "--from") {
			continue
		}
		for _, src := range fields[1 : len(fields)-1] {
			if _, err := os.Stat(filepath.Join(root, src)); err != nil {
				t.Errorf("Dockerfile copies %s: %v", src, err)
			}
		}
	}
}
