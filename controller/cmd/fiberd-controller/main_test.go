package main

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/issuer"
)

// TestIssuerFlags: by default the controller serves grants itself at the URL its grant Pods are
// pointed at; the issuer's flags are checked before anything starts.
func TestIssuerFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "fiberd-system")
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.issuer.issuerOn() || o.issuerURL != issuer.DefaultURL || o.issuer.namespace != "fiberd-system" {
		t.Fatalf("defaults %+v: want the issuer on, at %s, its keys in $POD_NAMESPACE", o, issuer.DefaultURL)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"-issuer-key-prepublish=48h"}, env: "fiberd-system", want: "prepublish"},
		{args: []string{"-issuer-max-lease=1m", "-issuer-lease=10m"}, env: "fiberd-system", want: "longest lease"},
		{args: []string{"-issuer-url=http://x"}, env: "fiberd-system", want: "-issuer-url"},
		{args: nil, env: "", want: "POD_NAMESPACE"},
	} {
		t.Setenv("POD_NAMESPACE", tc.env)
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) with POD_NAMESPACE=%q = %v, want an error about %q", tc.args, tc.env, err, tc.want)
		}
	}
	t.Setenv("POD_NAMESPACE", "")
	o, err = parseFlags([]string{"-issuer-bind-address=0", "-issuer-url=https://grant-issuer.fiberd-system.svc"}, io.Discard)
	if err != nil || o.issuer.issuerOn() {
		t.Fatalf("issuer off: %+v, %v", o.issuer, err)
	}
}

// TestDeployManifests holds deploy/controller to the code: the Deployment's arguments parse, its
// issuer serves on the port the fiberd-issuer Service targets, -issuer-url names that Service, and
// the container's user can read every Secret it mounts (the kubelet writes their files owned by
// root, group the Pod's fsGroup when it has one, with the volume's defaultMode).
func TestDeployManifests(t *testing.T) {
	read := func(name string, into any) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "controller", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var dep appsv1.Deployment
	read("deployment.yaml", &dep)
	var svc corev1.Service
	read("issuer.yaml", &svc)
	c := dep.Spec.Template.Spec.Containers[0]
	t.Setenv("POD_NAMESPACE", dep.Namespace)
	o, err := parseFlags(c.Args, io.Discard)
	if err != nil {
		t.Fatalf("deployment.yaml's args: %v", err)
	}
	if !o.issuer.issuerOn() {
		t.Fatal("deployment.yaml turns the issuer off")
	}
	if want := "https://" + svc.Name + "." + svc.Namespace + ".svc"; o.issuerURL != want {
		t.Errorf("-issuer-url %s, want the issuer Service's %s", o.issuerURL, want)
	}
	port := -1
	for _, p := range c.Ports {
		if p.Name == svc.Spec.Ports[0].TargetPort.StrVal {
			port = int(p.ContainerPort)
		}
	}
	if !strings.HasSuffix(o.issuer.bindAddress, ":"+strconv.Itoa(port)) {
		t.Errorf("-issuer-bind-address %s, but the Service targets container port %d", o.issuer.bindAddress, port)
	}
	if svc.Spec.Ports[0].Port != 443 {
		t.Errorf("the issuer Service listens on %d: -issuer-url names no port, so 443", svc.Spec.Ports[0].Port)
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the issuer Service selects %s=%s, which the controller's Pods do not carry", k, v)
		}
	}
	ps := dep.Spec.Template.Spec.SecurityContext
	if ps == nil || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Fatal("deployment.yaml runs the controller as root: set securityContext.runAsUser")
	}
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret == nil || !mounted[v.Name] {
			continue
		}
		mode := int32(corev1.SecretVolumeSourceDefaultMode)
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
		byGroup := ps.FSGroup != nil && mode&0o040 != 0
		if mode&0o004 == 0 && !byGroup {
			t.Errorf("the Secret volume %s (mode %#o) is unreadable by user %d: its files are root's, group the Pod's fsGroup (%v); set fsGroup or a mode readable by others",
				v.Name, mode, *ps.RunAsUser, ps.FSGroup)
		}
	}
}
