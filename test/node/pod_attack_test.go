//go:build e2enode

package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/template"
)

// The attack of pkg/backend's TestIsolationAttack, from a fiber of a grant Pod on the real node:
// fibers of pkg/backend/testdata/attacker.c (hack/images.sh's fiberd-attack image, the fiberd
// image with that template added) hold secrets, and one of them attacks every other process of
// the Pod, fiberd's sockets and state, the Pod's credentials and its writable places. A grant
// Pod serves one grant, so what is kept apart there is sessions: each fiber is a session of its
// own. Another grant is another Pod, kept apart by the runtime.
//
// A parked-then-resumed fiber is not attacked here: CRIU cannot run in a grant Pod (it needs
// CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE over the node's namespaces, and the image has no criu),
// so no fiber of a Pod is parked. pkg/backend's TestIsolationAttackResumed holds that boundary on
// the host, where fibers are parked.

const (
	attackImage = "fiberd.local/fiberd-attack:dev" // hack/images.sh
	attackTag   = "pod"                            // test/node/testdata/attacker.json's --tag
	attackNS    = "attack"
)

// TestAttackInGrantPod: a grant Pod exactly as grant-pod.yaml makes it (only its image and its
// template changed) keeps a session's fiber from listing, signalling (kill 0, kill -1, a pidfd),
// ptracing and reading the environment and files of another session's fiber, of the zygote and
// of fiberd; from writing where they read; from fiberd's sockets and state directory; from the
// Pod's credentials (the grant token, the API token, the API's private key, the fetched grant)
// and from writing in the Pod's volume. The same attack from a Pod that runs fiberd without
// isolation (plain fiberd, -isolation none) reaches each of those targets, so the test can fail.
func TestAttackInGrantPod(t *testing.T) {
	c := shared(t)
	if err := c.node.Import(c.ctx(t, 5*time.Minute), filepath.Join(c.images, "fiberd-attack.tar")); err != nil {
		t.Fatal(err)
	}
	c.grantNamespace(t, attackNS)
	isolated, control := attackPod(t, c.node.Name(), "attack-isolated", false), attackPod(t, c.node.Name(), "attack-control", true)
	for _, p := range []*corev1.Pod{isolated, control} {
		if _, err := c.cs.CoreV1().Pods(attackNS).Create(c.ctx(t, 30*time.Second), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("isolated", func(t *testing.T) {
		g := c.readGrantPod(t, c.waitPod(t, attackNS, isolated.Name, waitPod, "Ready", podReady))
		lines, victims := attackSessions(t, c, g, isolated.Name)
		if o := openLines(lines); len(o) > 0 {
			t.Errorf("attacks that reached their target in the grant Pod:\n%s\n(all attempts:\n%s)", strings.Join(o, "\n"), strings.Join(lines, "\n"))
		}
		for _, v := range victims {
			if body := httpGet(t, v.url+"/planted", 20*time.Second); attackFields(body)["planted"] != "no" {
				t.Errorf("session %s after the attack: %q; want planted=no", v.fiberID, body)
			}
		}
		if p := fmt.Sprintf("/proc/%d/root/var/lib/fiberd/fiberd-attack-%s-shared", g.hostPID, attackTag); exists(p) {
			t.Errorf("a fiber wrote in the Pod's state volume: %s", p)
		}
	})
	t.Run("control", func(t *testing.T) {
		g := c.readGrantPod(t, c.waitPod(t, attackNS, control.Name, waitPod, "Ready", podReady))
		lines, victims := attackSessions(t, c, g, control.Name)
		got := strings.Join(openLines(lines), "\n")
		a1 := strconv.Itoa(victims[0].podPID)
		for _, want := range []string{"list /proc/", "signal -1", "signal 1 OPEN", "signal " + a1, "pidfd " + a1,
			"environ " + a1, "files /tmp/fiberd-attack-" + attackTag + "-" + victims[1].secret,
			"socket /var/lib/fiberd/state/fiberd.sock", "dir /var/lib/fiberd/state OPEN",
			"read /var/run/secrets/kubernetes.io/serviceaccount/token", "read /var/run/secrets/fiberd.io/grant-token/token",
			"shared /var/lib/fiberd OPEN"} {
			if !strings.Contains(got, want) {
				t.Errorf("without isolation, %q did not reach its target; the attack proves nothing:\n%s", want, strings.Join(lines, "\n"))
			}
		}
		if body := httpGet(t, victims[1].url+"/planted", 20*time.Second); attackFields(body)["planted"] != "yes" {
			t.Errorf("without isolation, the victim did not see the planted file: %q", body)
		}
	})
	c.kubectl(t, "", "delete", "namespace", attackNS, "--wait=false")
}

// attackPod is grant-pod.yaml with the attack image and template, named name and bound to node
// nodeName (the one that imported the image); a control Pod
// runs plain fiberd without capabilities at -isolation none, with an emptyDir on /tmp (the
// root file system is read-only) so its fibers have a scratch directory to share.
func attackPod(t *testing.T, nodeName, name string, control bool) *corev1.Pod {
	t.Helper()
	m, err := manifest("grant-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var p corev1.Pod
	if err := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(m), 4096).Decode(&p); err != nil {
		t.Fatalf("grant-pod.yaml: %v", err)
	}
	spec, err := os.ReadFile(filepath.Join(repoRoot(), "test", "node", "testdata", "attacker.json"))
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.Namespace = name, attackNS
	p.Spec.NodeName = nodeName // the node that imported the attack image
	p.Annotations["fiberd.io/template"] = template.Ref{Name: "attacker", Digest: template.Digest(spec)}.String()
	ct := &p.Spec.Containers[0]
	ct.Image, ct.ImagePullPolicy = attackImage, corev1.PullNever
	if control {
		ct.Command = []string{"/usr/local/bin/fiberd"}
		ct.Args = append(ct.Args, "-isolation=none")
		ct.SecurityContext.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
		ct.SecurityContext.AllowPrivilegeEscalation = ptr(false)
		ct.VolumeMounts = append(ct.VolumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return &p
}

// session is a fiber of the attack template: its secret, where it serves, and its pid as the
// Pod numbers it.
type session struct {
	fiberID, url, secret string
	podPID               int
}

// attackSessions clones two victim sessions and an attacker in grant Pod g (named name), has
// the attacker attack the victims, every other process of the Pod, fiberd's sockets and state,
// the Pod's credentials and its state volume, and returns its verdict lines and the victims.
func attackSessions(t *testing.T, c *cluster, g *grantPod, name string) ([]string, []session) {
	t.Helper()
	agent := g.agent(t)
	var ss []session
	for i, s := range []string{"victim-1", "victim-2", "attacker"} {
		secret := fmt.Sprintf("s%d-%x", i, rand.Uint64())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := agent.Clone(ctx, api.CloneRequest{GrantUID: g.uid, Session: s, Payload: []byte(secret)})
		cancel()
		if err != nil {
			t.Fatalf("%s: clone of session %s: %v", name, s, err)
		}
		u := "http://" + strings.TrimPrefix(resp.Endpoint, "tcp://")
		who := attackFields(httpGet(t, u+"/whoami", 20*time.Second))
		if who["secret"] != secret || who["file"] != "yes" {
			t.Fatalf("%s: session %s answered %v; want its secret and its file", name, s, who)
		}
		pid, _ := strconv.Atoi(who["pid"])
		ss = append(ss, session{fiberID: resp.FiberID, url: u, secret: secret, podPID: podPIDOf(t, g, pid, secret)})
	}
	att, victims := ss[2], ss[:2]
	procs := podPIDs(t, g)
	var targets []string
	for _, pid := range procs {
		// A fiber of its own PID namespace is PID 1 there: to it, 1 names itself, not fiberd.
		if pid != att.podPID && !(pid == 1 && att.podPID != 1 && isolatedPID(t, g, att.podPID)) {
			targets = append(targets, strconv.Itoa(pid))
		}
	}
	slices.Sort(targets)
	grants, _ := filepath.Glob(filepath.Join(c.stateDir(g.uid), "grants", "*"))
	reads := []string{"/var/run/secrets/fiberd.io/grant-token/token", "/var/run/secrets/kubernetes.io/serviceaccount/token",
		"/etc/fiberd/api-tls/tls.key"}
	for _, f := range grants {
		reads = append(reads, "/var/lib/fiberd/grants/"+filepath.Base(f))
	}
	// The values are paths and numbers: none needs escaping, and the attacker unescapes none.
	var q []string
	for _, kv := range []struct {
		k string
		v []string
	}{
		{"pids", targets}, {"secrets", []string{victims[0].secret, victims[1].secret}},
		{"socks", []string{"/var/lib/fiberd/state/fiberd.sock", "/var/lib/fiberd/state/private/admin.sock"}},
		{"dirs", []string{"/var/lib/fiberd/state", "/var/lib/fiberd/state/private", "/var/lib/fiberd/grants"}},
		{"reads", reads}, {"shared", []string{"/var/lib/fiberd"}},
	} {
		q = append(q, kv.k+"="+strings.Join(kv.v, ","))
	}
	body := httpGet(t, att.url+"/attack?"+strings.Join(q, "&"), 30*time.Second)
	lines := strings.Split(strings.TrimSpace(body), "\n")
	t.Logf("%s: the attacker (session %s, pid %d in the Pod) against pids %v:\n%s", name, att.fiberID, att.podPID, targets, body)
	if len(lines) < 5*len(targets)+len(reads) {
		t.Fatalf("%s: the attacker tried too little (%d lines for %d pids)", name, len(lines), len(targets))
	}
	for _, want := range []string{"read " + reads[0], "shared /var/lib/fiberd", "dir /var/lib/fiberd/state "} {
		if !strings.Contains(body, want) {
			t.Errorf("%s: the attacker did not try %q", name, want)
		}
	}
	return lines, victims
}

// podPIDOf is the pid, as the Pod numbers it, of the fiber that answered pid=whoami and holds
// secret. A fiber of isolation none answers its pid in the Pod; an isolated one is PID 1 of its
// own namespace, and is found instead as the innermost process whose /tmp holds its secret's
// file.
func podPIDOf(t *testing.T, g *grantPod, whoami int, secret string) int {
	t.Helper()
	if whoami != 1 {
		return whoami
	}
	file := "fiberd-attack-" + attackTag + "-" + secret
	best, depth := 0, 0
	for host, pid := range podPIDs(t, g) {
		if !exists(fmt.Sprintf("/proc/%d/root/tmp/%s", host, file)) {
			continue
		}
		if d := len(nsPIDs(host)); d > depth {
			best, depth = pid, d
		}
	}
	if best == 0 {
		t.Fatalf("no process of the Pod has /tmp/%s", file)
	}
	return best
}

// isolatedPID reports whether the Pod's process pid is PID 1 of a PID namespace of its own.
func isolatedPID(t *testing.T, g *grantPod, pid int) bool {
	for host, p := range podPIDs(t, g) {
		if p == pid {
			ns := nsPIDs(host)
			return len(ns) > 0 && ns[len(ns)-1] == 1 && len(ns) > len(nsPIDs(g.hostPID))
		}
	}
	return false
}

// podPIDs maps the host pid of every process of grant Pod g, in the Pod's PID namespace or one
// nested in it, to its pid as the Pod numbers it.
func podPIDs(t *testing.T, g *grantPod) map[int]int {
	t.Helper()
	level := len(nsPIDs(g.hostPID)) - 1
	if level < 1 {
		t.Fatalf("fiberd (host pid %d) is not in a PID namespace of the Pod's", g.hostPID)
	}
	out := map[int]int{}
	for host := range podProcs(t, g.hostPID) {
		if ns := nsPIDs(host); len(ns) > level {
			out[host] = ns[level]
		}
	}
	return out
}

// nsPIDs is the NSpid line of /proc/pid/status: the process's pid in each PID namespace it is
// in, the host's first.
func nsPIDs(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(rest) {
				n, _ := strconv.Atoi(f)
				out = append(out, n)
			}
			return out
		}
	}
	return nil
}

var attackOpen = regexp.MustCompile(` OPEN\b`)

// openLines are the attacker's lines that reached their target.
func openLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if attackOpen.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// attackFields parses the attacker's "k=v k=v" answers.
func attackFields(body string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(body) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
