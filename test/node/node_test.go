//go:build e2enode

package node

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/test/kubenode"
)

// The tests run in this file's order: TestReadinessGate first, while no grant is due for
// renewal (it stops the issuer for a while), TestRenewal last, when the main grant Pod's first
// grant has reached half its lease.

// mainPod is TestGrantPod's grant Pod in namespace "grants", which later tests reuse.
var mainPod struct {
	g   *grantPod
	iat time.Time // its first grant's
	exp time.Time
}

// The grant Pod stays NotReady while fiberd has no warm template (here: the issuer is down, so
// no grant), its Service's EndpointSlice lists it not ready; once fiberd sets the readiness gate
// the Pod turns Ready, and only then does the EndpointSlice list it ready.
func TestReadinessGate(t *testing.T) {
	c := shared(t)
	const ns = "ready"
	c.grantNamespace(t, ns)
	c.kubectl(t, "", "-n", issuerNamespace, "scale", "deployment/grant-issuer", "--replicas=0")
	issuerBack := false
	t.Cleanup(func() {
		if !issuerBack {
			_, _ = c.kubectlErr("", "-n", issuerNamespace, "scale", "deployment/grant-issuer", "--replicas=1")
		}
	})
	c.waitIssuerPods(t, 0)

	tl := c.watchTimeline(t, ns)
	if err := c.apply(ns, "grant-pod.yaml"); err != nil {
		t.Fatal(err)
	}
	// Running, but not Ready: fiberd retries the grant fetch (and, past GrantFetchTimeout,
	// exits and is restarted), its readiness probe fails until a template is warm, and the
	// gate is not set.
	p := c.waitPod(t, ns, podName, waitPod, "running with fiberd started", func(p *corev1.Pod) (bool, string) {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && containerStarted(p), conditions(p)
	})
	if isTrue(p, corev1.PodReady) {
		t.Fatalf("the Pod is Ready with the issuer down: %s", conditions(p))
	}
	ip := p.Status.PodIP
	time.Sleep(3 * time.Second)
	p = c.waitPod(t, ns, podName, time.Second, "still running", func(p *corev1.Pod) (bool, string) { return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase) })
	if r := condition(p, corev1.PodReady); r == nil || r.Status != corev1.ConditionFalse {
		t.Errorf("Ready condition %+v 3 s into the outage, want False", r)
	}
	if isTrue(p, corev1.ContainersReady) {
		t.Errorf("fiberd's container is ready without a warm template: %s", conditions(p))
	}
	if g := condition(p, readinessGate); g != nil && g.Status == corev1.ConditionTrue {
		t.Errorf("the gate is %+v without a grant", g)
	}
	if ready, listed := c.endpointReady(t, ns, ip); ready {
		t.Errorf("the EndpointSlice lists %s ready while the Pod is not", ip)
	} else {
		t.Logf("EndpointSlice during the outage: %s listed=%v ready=false", ip, listed)
	}
	if !strings.Contains(c.logs(t, ns, podName, false), "Grant fetch failed; retrying") {
		t.Errorf("fiberd did not log the failing grant fetch")
	}

	t0 := time.Now()
	c.kubectl(t, "", "-n", issuerNamespace, "scale", "deployment/grant-issuer", "--replicas=1")
	issuerBack = true
	c.kubectl(t, "", "-n", issuerNamespace, "rollout", "status", "deployment/grant-issuer", "--timeout=3m")
	p = c.waitPod(t, ns, podName, waitPod, "Ready once the issuer is back", podReady)
	record("readiness: issuer scaled back up to the grant Pod Ready", time.Since(t0))
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if ready, _ := c.endpointReady(t, ns, ip); ready {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the EndpointSlice never listed %s ready", ip)
		}
	}
	tl.stop()
	tl.check(t, ip)
}

// timeline records the grant Pod's and the fiberd Service's EndpointSlices' versions as a
// watch delivers them, in arrival order.
type timeline struct {
	mu     sync.Mutex
	events []tlEvent
	cancel context.CancelFunc
	done   sync.WaitGroup
}

type tlEvent struct {
	at  time.Time
	pod *corev1.Pod
	eps *discoveryv1.EndpointSlice
}

func (c *cluster) watchTimeline(t *testing.T, ns string) *timeline {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	tl := &timeline{cancel: cancel}
	t.Cleanup(tl.stop)
	pw, err := c.cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", podName).String()})
	if err != nil {
		t.Fatal(err)
	}
	ew, err := c.cs.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=fiberd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []watch.Interface{pw, ew} {
		tl.done.Add(1)
		go func() {
			defer tl.done.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					e := tlEvent{at: time.Now()}
					switch o := ev.Object.(type) {
					case *corev1.Pod:
						e.pod = o
					case *discoveryv1.EndpointSlice:
						e.eps = o
					default:
						continue
					}
					tl.mu.Lock()
					tl.events = append(tl.events, e)
					tl.mu.Unlock()
				}
			}
		}()
	}
	return tl
}

func (tl *timeline) stop() {
	tl.cancel()
	tl.done.Wait()
}

// check: every Pod version that is Ready has the gate True; no EndpointSlice version lists ip
// ready before the first Pod version that is Ready; a version running with its container ready but
// not Ready was seen. "Before" is by resourceVersion: with one etcd they are its revisions, one
// sequence over every resource, whereas two watches may deliver in either order.
func (tl *timeline) check(t *testing.T, ip string) {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	rv := func(m metav1.Object) uint64 {
		n, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Fatalf("resourceVersion %q of %s is not an etcd revision", m.GetResourceVersion(), m.GetName())
		}
		return n
	}
	var podReadyRV, epsReadyRV uint64
	var podReadyAt, epsReadyAt time.Time
	for _, e := range tl.events {
		if p := e.pod; p != nil {
			ready := isTrue(p, corev1.PodReady)
			if ready && !isTrue(p, readinessGate) {
				t.Errorf("Pod version %s is Ready without the gate: %s", p.ResourceVersion, conditions(p))
			}
			if ready && (podReadyRV == 0 || rv(p) < podReadyRV) {
				podReadyRV, podReadyAt = rv(p), e.at
			}
		}
		if s := e.eps; s != nil {
			for _, ep := range s.Endpoints {
				if slices.Contains(ep.Addresses, ip) && ep.Conditions.Ready != nil && *ep.Conditions.Ready && (epsReadyRV == 0 || rv(s) < epsReadyRV) {
					epsReadyRV, epsReadyAt = rv(s), e.at
				}
			}
		}
	}
	if podReadyRV == 0 || epsReadyRV == 0 {
		t.Errorf("watched no Ready Pod (revision %d) or no ready endpoint (revision %d)", podReadyRV, epsReadyRV)
		return
	}
	if epsReadyRV < podReadyRV {
		t.Errorf("the EndpointSlice listed %s ready at revision %d, before the Pod was Ready (revision %d)", ip, epsReadyRV, podReadyRV)
	}
	t.Logf("Pod Ready at revision %d, its endpoint ready at revision %d (%v apart as the watches delivered them)", podReadyRV, epsReadyRV, epsReadyAt.Sub(podReadyAt))
}

// endpointReady reports whether an EndpointSlice of the fiberd Service lists ip ready, and
// whether it lists ip at all.
func (c *cluster) endpointReady(t testing.TB, ns, ip string) (ready, listed bool) {
	t.Helper()
	l, err := c.cs.DiscoveryV1().EndpointSlices(ns).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=fiberd"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		for _, ep := range s.Endpoints {
			if slices.Contains(ep.Addresses, ip) {
				listed = true
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					ready = true
				}
			}
		}
	}
	return ready, listed
}

func (c *cluster) waitIssuerPods(t testing.TB, n int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		l, err := c.cs.CoreV1().Pods(issuerNamespace).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=grant-issuer"})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d issuer Pods after 2 minutes, want %d", len(l.Items), n)
		}
	}
}

// A grant Pod applied as a user would turns Ready; its grant was fetched with the token the
// kubelet projected for the issuer's audience; a client in another Pod clones over mTLS on the
// Pod IP and gets the fiber's HTTP answer at the advertised endpoint; fiberd says once that it
// runs without per-fiber cgroups here.
func TestGrantPod(t *testing.T) {
	c := shared(t)
	const ns = "grants"
	c.grantNamespace(t, ns)
	t0 := time.Now()
	if err := c.apply(ns, "grant-pod.yaml"); err != nil {
		t.Fatal(err)
	}
	p := c.waitPod(t, ns, podName, waitPod, "Ready", podReady)
	record("grant Pod: kubectl apply to Ready", time.Since(t0))
	g := c.readGrantPod(t, p)
	mainPod.g = g
	t.Logf("grant Pod %s/%s uid %s on %s, fiberd pid %d on the host", ns, podName, g.uid, g.ip, g.hostPID)

	// The projected token: for the issuer's audience, bound to this Pod, accepted by TokenReview.
	tokFile := fmt.Sprintf("/proc/%d/root/var/run/secrets/fiberd.io/grant-token/token", g.hostPID)
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	if aud := jwtClaims(t, string(tok))["aud"]; !slices.Contains(asStrings(aud), issuerURL) {
		t.Errorf("the projected token's audience is %v, want %s", aud, issuerURL)
	}
	tr, err := c.cs.AuthenticationV1().TokenReviews().Create(c.ctx(t, 30*time.Second), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: string(tok), Audiences: []string{issuerURL}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := tr.Status
	if !st.Authenticated || st.User.Username != "system:serviceaccount:"+ns+":fiberd" ||
		!slices.Contains(st.User.Extra["authentication.kubernetes.io/pod-uid"], g.uid) {
		t.Errorf("TokenReview of the projected token: %+v, want the Pod's service account, bound to uid %s", st, g.uid)
	}

	// The grant fiberd fetched with it: in the Pod's state volume, minted for this Pod.
	iat, exp, claims := readGrant(t, c.stateDir(g.uid), g.uid)
	mainPod.iat, mainPod.exp = iat, exp
	if claims["iss"] != issuerURL || !slices.Contains(asStrings(claims["aud"]), podName) || exp.Sub(iat) != lease {
		t.Errorf("the fetched grant: iss %v aud %v lease %v; want %s, %s, %v", claims["iss"], claims["aud"], exp.Sub(iat), issuerURL, podName, lease)
	}
	issuerLog := c.kubectl(t, "", "-n", issuerNamespace, "logs", "deployment/grant-issuer")
	if !grepLine(issuerLog, "grant issued", g.uid) {
		t.Errorf("the issuer logged no grant issued for %s:\n%s", g.uid, issuerLog)
	}
	flog := c.logs(t, ns, podName, false)
	if !strings.Contains(flog, "Fetched this Pod's grant") {
		t.Errorf("fiberd did not log the grant fetch")
	}
	if n := strings.Count(flog, "Running without per-fiber cgroups"); n != 1 {
		t.Errorf("fiberd said %d times that it runs without per-fiber cgroups, want once", n)
	}
	if gs, ok := podGrant(t, g); !ok || !gs.Warm {
		t.Errorf("fiberd's grant %s: %+v, want it admitted and warm", g.uid, gs)
	}

	// A caller in another Pod: Clone over mTLS on the Pod IP, then the fiber's answer.
	cy := c.runClient(t, g, "client-first", 1, false)[0]
	if h, _, err := net.SplitHostPort(strings.TrimPrefix(cy.Endpoint, "tcp://")); err != nil || h != g.ip {
		t.Errorf("the fiber's endpoint %q is not on the Pod IP %s", cy.Endpoint, g.ip)
	}
	if !strings.Contains(cy.Body, "fence="+cy.FiberID) {
		t.Errorf("the fiber answered %q, without its fence %s", cy.Body, cy.FiberID)
	}
	t.Logf("the client Pod cloned %s at %s in %.1f ms, first byte at %.1f ms: %q", cy.FiberID, cy.Endpoint, cy.CloneMs, cy.FirstByteMs, strings.TrimSpace(cy.Body))
	checkIsolation(t, c, g, cy.Body)
	recordMs("clone from another Pod over mTLS: first Clone", cy.CloneMs)
	recordMs("clone from another Pod over mTLS: first Clone to first byte", cy.FirstByteMs)

	// As docs/kubernetes.md shows a caller with one grant Pod in the namespace: fiberctl on the
	// Service's name, which the cluster DNS answers with the ready Pod's address, and which
	// fiberd's certificate names.
	out := c.runPod(t, ns, "fiberctl", fiberdImage, []string{"/usr/local/bin/fiberctl"}, []string{
		"-addr", "fiberd." + ns + ".svc:8484", "-ca", "/tls/ca.crt", "-tls-cert", "/tls/tls.crt", "-tls-key", "/tls/tls.key",
		"-o", "json", "clone", "-grant-uid", g.uid})
	var resp api.CloneResponse
	if err := json.Unmarshal([]byte(out), &resp); err != nil || !strings.HasPrefix(resp.FiberID, g.uid+"/") {
		t.Errorf("fiberctl clone through fiberd.%s.svc printed %q (%v), want a fiber of grant %s", ns, out, err, g.uid)
	} else {
		t.Logf("fiberctl in a Pod cloned %s through fiberd.%s.svc:8484", resp.FiberID, ns)
		if err := g.agent(t).Release(c.ctx(t, 30*time.Second), resp.FiberID); err != nil {
			t.Errorf("release of %s: %v", resp.FiberID, err)
		}
	}
}

// What the manifests claim about security holds in the running containers: fiberd's and the
// issuer's run as 65532, with no capability, no privilege escalation, the runtime's seccomp
// filter (fiberd) and a read-only root file system.
func TestSecurityContext(t *testing.T) {
	c := shared(t)
	if mainPod.g == nil {
		t.Skip("TestGrantPod did not run")
	}
	// grant-pod.yaml: fiberd-caps as 65532 of the Pod's own user namespace, holding the three
	// capabilities isolation needs from its file capabilities (so no no_new_privs).
	const isolating = "00000000002000c1" // CAP_CHOWN, CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN
	checkSecurity(t, "fiberd", mainPod.g.hostPID, security{userns: true, seccomp: true, prm: isolating, bnd: isolating, nnp: "0"})
	l, err := c.cs.CoreV1().Pods(issuerNamespace).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=grant-issuer"})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("issuer Pods: %v, %d", err, len(l.Items))
	}
	ip := c.readGrantPod(t, &l.Items[0])
	none := "0000000000000000"
	checkSecurity(t, "grant-issuer", ip.hostPID, security{prm: none, bnd: none, nnp: "1"})
}

// security is what a container's process must show in /proc/PID/status.
type security struct {
	userns   bool   // in a user namespace of its own (hostUsers: false): ids are read through its map
	seccomp  bool   // under a seccomp filter
	prm, bnd string // CapPrm (and CapEff), CapBnd
	nnp      string // NoNewPrivs
}

func checkSecurity(t *testing.T, what string, pid int, want security) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			status[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	// The ids as the container sees them: the host's, through its user namespace's map.
	um, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := strings.Fields(string(um))
	identity := len(m) == 3 && m[0] == "0" && m[1] == "0" && m[2] == "4294967295"
	if identity == want.userns {
		t.Errorf("%s (pid %d): uid_map %q; want a user namespace of its own: %v", what, pid, strings.TrimSpace(string(um)), want.userns)
	}
	inside := func(ids string) string {
		if identity || len(m) != 3 {
			return ids
		}
		in, _ := strconv.ParseUint(m[0], 10, 32)
		out, _ := strconv.ParseUint(m[1], 10, 32)
		var r []string
		for _, f := range strings.Fields(ids) {
			v, _ := strconv.ParseUint(f, 10, 32)
			r = append(r, strconv.FormatUint(v-out+in, 10))
		}
		return strings.Join(r, " ")
	}
	status["Uid"], status["Gid"] = inside(status["Uid"]), inside(status["Gid"])
	w := map[string]string{
		"Uid": "65532 65532 65532 65532", "Gid": "65532 65532 65532 65532",
		"CapInh": "0000000000000000", "CapPrm": want.prm, "CapEff": want.prm,
		"CapBnd": want.bnd, "CapAmb": "0000000000000000", "NoNewPrivs": want.nnp,
	}
	if want.seccomp {
		w["Seccomp"] = "2"
	}
	for k, v := range w {
		if status[k] != v {
			t.Errorf("%s (pid %d): %s is %q, want %q", what, pid, k, status[k], v)
		}
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	rootRO := false
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == "/" {
			rootRO = slices.Contains(strings.Split(f[5], ","), "ro")
		}
	}
	if !rootRO {
		t.Errorf("%s (pid %d): the root file system is mounted read-write", what, pid)
	}
	t.Logf("%s: uid %s (uid_map %s), CapEff %s, CapBnd %s, NoNewPrivs %s, Seccomp %s, root read-only %v", what, status["Uid"], strings.Join(m, " "), status["CapEff"], status["CapBnd"], status["NoNewPrivs"], status["Seccomp"], rootRO)
}

// checkIsolation: the grant Pod of grant-pod.yaml isolates each fiber. fiberd said so once at
// start, its status and metrics say fiber for the tier and the grant, and the fiber that answered
// body (the counter template's "fence=... pid=N ...") is PID 1 of a PID namespace of its own.
func checkIsolation(t *testing.T, c *cluster, g *grantPod, body string) {
	t.Helper()
	flog := c.logs(t, g.ns, podName, false)
	if !grepLine(flog, `"Isolation"`, `warm="fiber"`) || strings.Contains(flog, "Isolation is less than asked") || strings.Contains(flog, "Isolation is off") {
		t.Errorf("fiberd's start-up line says no isolation fiber:\n%s", tailLines(flog, 30))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := g.agent(t).Status(ctx)
	if err != nil {
		t.Fatalf("fiberd status: %v", err)
	}
	for _, ti := range st.Isolation {
		if ti.Tier == core.TierWarm && (ti.Level != "fiber" || ti.Missing != "") {
			t.Errorf("fiberd's status: tier %s isolates %q (missing %q), want fiber", ti.Tier, ti.Level, ti.Missing)
		}
	}
	if gs, ok := podGrant(t, g); !ok || gs.Isolation != "fiber" {
		t.Errorf("fiberd's grant %s isolates %q, want fiber", g.uid, gs.Isolation)
	}
	metrics := socketGet(t, g, "/metrics")
	if want := fmt.Sprintf(`fiberd_grant_isolation{grant=%q,level="fiber"} 1`, g.uid); !strings.Contains(metrics, want) {
		t.Errorf("fiberd's metrics lack %s", want)
	}
	if !regexp.MustCompile(`\bpid=1\b`).MatchString(body) {
		t.Errorf("the fiber answered %q, want pid=1: PID 1 of a PID namespace of its own", strings.TrimSpace(body))
	}
}

// socketGet GETs path on fiberd's unix socket, through the Pod's root.
func socketGet(t testing.TB, g *grantPod, path string) string {
	t.Helper()
	sock := fmt.Sprintf("/proc/%d/root/var/lib/fiberd/state/fiberd.sock", g.hostPID)
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	res, err := hc.Get("http://fiberd" + path)
	if err != nil {
		t.Fatalf("GET %s on fiberd's socket: %v", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s on fiberd's socket: %s, %v", path, res.Status, err)
	}
	return string(b)
}

// 100 clone/release cycles from another Pod leave no zombie in the grant Pod, where fiberd is
// PID 1, and no fiber running.
func TestNoZombies(t *testing.T) {
	c := shared(t)
	g := mainPod.g
	if g == nil {
		t.Skip("TestGrantPod did not run")
	}
	const n = 100
	cycles := c.runClient(t, g, "client-cycles", n, false)
	for _, cy := range cycles {
		if !strings.Contains(cy.Body, "fence="+cy.FiberID) {
			t.Fatalf("cycle %d: the fiber answered %q, without its fence", cy.N, cy.Body)
		}
		recordMs("clone from another Pod over mTLS: Clone (100 cycles)", cy.CloneMs)
		recordMs("clone from another Pod over mTLS: Clone to first byte (100 cycles)", cy.FirstByteMs)
	}
	ns := pidNS(t, g.hostPID)
	var zombies, live []string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		zombies, live = procsInNS(ns)
		if len(zombies) == 0 || time.Now().After(end) {
			break
		}
	}
	if len(zombies) > 0 {
		t.Errorf("zombies in the grant Pod after %d cycles: %v", n, zombies)
	}
	t.Logf("processes in the grant Pod after %d cycles: %v", n, live)
	if gs, _ := podGrant(t, g); gs.Running != 0 {
		t.Errorf("%d fibers still running after %d clone/release cycles", gs.Running, n)
	}
}

// The kubelet restarts a killed fiberd: the epoch moves forward (its file is on the Pod's
// volume), fiber ids of the old run answer 404, and no fiber of the old run is alive.
func TestRestart(t *testing.T) {
	c := shared(t)
	const ns = "restart"
	c.grantNamespace(t, ns)
	if err := c.apply(ns, "grant-pod.yaml"); err != nil {
		t.Fatal(err)
	}
	g := c.readGrantPod(t, c.waitPod(t, ns, podName, waitPod, "Ready", podReady))
	agent := g.agent(t)
	old := []api.CloneResponse{cloneAndGet(t, agent, g), cloneAndGet(t, agent, g)}
	st, err := agent.Status(c.ctx(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	epochFile := filepath.Join(c.stateDir(g.uid), "state", "private", "epoch")
	before := readEpochFile(t, epochFile)
	oldRun := podProcs(t, g.hostPID)

	t0 := time.Now()
	if err := syscall.Kill(g.hostPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p := c.waitPod(t, ns, podName, waitPod, "its container restarted", func(p *corev1.Pod) (bool, string) {
		cs := p.Status.ContainerStatuses
		if len(cs) != 1 || cs[0].RestartCount < 1 || cs[0].ContainerID == "" || strings.TrimPrefix(cs[0].ContainerID, "containerd://") == g.containerID || cs[0].State.Running == nil {
			return false, fmt.Sprintf("%+v", cs)
		}
		return true, ""
	})
	// The readiness gate still says True, as the killed run left it, until the new run publishes
	// its own; the exec readiness probe (fiberctl status -ready) keeps the new container, and so
	// the Pod, not Ready until the new run has a warm template. Wait for the new run's word.
	if isTrue(p, corev1.PodReady) && !grepLine(c.logs(t, ns, podName, false), "Published the Pod's readiness", "ready=true") {
		t.Errorf("the Pod shows Ready on the killed run's condition before the new fiberd published its own: %+v", p.Status.Conditions)
	}
	g2 := c.readGrantPod(t, p)
	agent2 := g2.agent(t)
	for end := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := agent2.Healthz(ctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the restarted fiberd does not answer on its socket: %v", err)
		}
	}
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if grepLine(c.logs(t, ns, podName, false), "Published the Pod's readiness", "ready=true") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the restarted fiberd did not publish the Pod's readiness:\n%s", tailLines(c.logs(t, ns, podName, false), 30))
		}
	}
	p = c.waitPod(t, ns, podName, waitPod, "Ready", podReady)
	record("restart: fiberd SIGKILLed to the new run's readiness published and the Pod Ready", time.Since(t0))
	if last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.ExitCode != 137 {
		t.Errorf("the killed run ended %+v, want exit code 137 (SIGKILL)", last)
	}
	st2, err := agent2.Status(c.ctx(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	after := readEpochFile(t, epochFile)
	if st2.Epoch <= st.Epoch || after <= before || after != st2.Epoch {
		t.Errorf("epoch %d (file %d) before the kill, %d (file %d) after; want it to move forward, file and agent agreeing", st.Epoch, before, st2.Epoch, after)
	}
	for _, f := range old {
		err := agent2.Release(c.ctx(t, 30*time.Second), f.FiberID)
		if ce, ok := client.AsError(err); !ok || !ce.IsNotFound() {
			t.Errorf("release of %s from the old run: %v, want 404", f.FiberID, err)
		}
	}
	if live := stillAlive(oldRun); len(live) > 0 {
		t.Errorf("processes of the old run still alive: %v", live)
	}
	if prev := c.logs(t, ns, podName, true); !strings.Contains(prev, "Agent serving") {
		t.Errorf("the previous run's log does not show it serving:\n%s", prev)
	}
	cloneAndGet(t, agent2, g2)
}

// kubectl delete pod: fiberd gets SIGTERM, releases every fiber and exits 0 within the grace
// period.
func TestDeletePod(t *testing.T) {
	c := shared(t)
	const ns = "delete"
	c.grantNamespace(t, ns)
	if err := c.apply(ns, "grant-pod.yaml"); err != nil {
		t.Fatal(err)
	}
	p := c.waitPod(t, ns, podName, waitPod, "Ready", podReady)
	g := c.readGrantPod(t, p)
	agent := g.agent(t)
	cloneAndGet(t, agent, g)
	cloneAndGet(t, agent, g)
	procs := podProcs(t, g.hostPID)
	logs := c.followLogs(t, ns)
	term := c.watchTermination(t, ns)

	t0 := time.Now()
	c.kubectl(t, "", "-n", ns, "delete", "pod", podName, "--timeout=2m")
	d := time.Since(t0)
	record("delete: kubectl delete pod (drain) to the Pod gone", d)
	grace := time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	if d >= grace {
		t.Errorf("kubectl delete pod took %v, not within the grace period %v", d, grace)
	}
	ts := term.wait(t)
	if ts == nil || ts.ExitCode != 0 {
		t.Fatalf("fiberd's container ended %+v, want exit code 0", ts)
	}
	out := logs.wait(t)
	if d, ok := drainTime(out); ok {
		record("delete: fiberd's drain, \"Agent draining\" to \"fiberd stopped\" (its log)", d)
	}
	for _, want := range []string{"Agent draining", `"Grant yielded"`, "fiberd stopped: every fiber released"} {
		if !strings.Contains(out, want) {
			t.Errorf("fiberd's log lacks %s:\n%s", want, tailLines(out, 30))
		}
	}
	if !grepLine(out, `"Grant yielded"`, `reason="agent stopping"`, "fibers=2") {
		t.Errorf("fiberd did not yield the grant with its 2 fibers on SIGTERM:\n%s", tailLines(out, 30))
	}
	if live := stillAlive(procs); len(live) > 0 {
		t.Errorf("processes of the deleted Pod alive: %v", live)
	}
}

// Deleting the Namespace ends the fibers before the kubelet kills the container: fiberd
// releases them (on the scope loss or on the SIGTERM of the Pod's deletion, whichever reaches it
// first) and exits 0; the namespace then goes away.
func TestDeleteNamespace(t *testing.T) {
	c := shared(t)
	const ns = "doomed"
	c.grantNamespace(t, ns)
	if err := c.apply(ns, "grant-pod.yaml"); err != nil {
		t.Fatal(err)
	}
	g := c.readGrantPod(t, c.waitPod(t, ns, podName, waitPod, "Ready", podReady))
	agent := g.agent(t)
	cloneAndGet(t, agent, g)
	cloneAndGet(t, agent, g)
	procs := podProcs(t, g.hostPID)
	logs := c.followLogs(t, ns)
	term := c.watchTermination(t, ns)

	t0 := time.Now()
	c.kubectl(t, "", "delete", "namespace", ns, "--wait=false")
	ts := term.wait(t)
	if ts == nil || ts.ExitCode != 0 {
		t.Fatalf("fiberd's container ended %+v, want exit code 0 (not killed)", ts)
	}
	record("namespace delete: to fiberd's container finished", time.Since(t0))
	out := logs.wait(t)
	if d, ok := drainTime(out); ok {
		record("namespace delete: fiberd's drain (its log)", d)
	}
	lost := grepLine(out, "Epoch bumped; every running fiber released", "fibers=2")
	drained := grepLine(out, `"Grant yielded"`, `reason="agent stopping"`, "fibers=2")
	switch {
	case lost:
		t.Logf("the fibers ended on the scope loss, before the SIGTERM")
	case drained:
		t.Logf("the fibers ended in the drain of the Pod's SIGTERM (the namespace controller deleted the Pod before fiberd's next poll)")
	default:
		t.Errorf("fiberd's log shows neither the scope loss nor the drain releasing the 2 fibers:\n%s", tailLines(out, 30))
	}
	if !strings.Contains(out, "fiberd stopped: every fiber released") {
		t.Errorf("fiberd did not stop cleanly:\n%s", tailLines(out, 30))
	}
	if live := stillAlive(procs); len(live) > 0 {
		t.Errorf("processes of the Pod alive after its namespace's deletion: %v", live)
	}
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, err := c.cs.CoreV1().Namespaces().Get(c.ctx(t, 30*time.Second), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("namespace %s still there 2 minutes after its deletion: %v", ns, err)
		}
	}
	record("namespace delete: to the namespace gone", time.Since(t0))
}

// A second node of the same control plane, on its own bridge and Pod network, runs a Pod, and
// cleaning it with the Pod running leaves nothing of it on the machine.
func TestSecondNode(t *testing.T) {
	c := shared(t)
	before, err := kubenode.ReadHost()
	if err != nil {
		t.Fatal(err)
	}
	ctx := c.ctx(t, 5*time.Minute)
	n2, err := kubenode.Start(ctx, c.cp.Dir(), kubenode.Options{Name: "fiberd-node-2", CIDR: "10.244.1.0/24", Bridge: "fiberd1", Secondary: true, Images: c.images})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	// A closed node's Node object would stay, NotReady, and the scheduler could still pick it
	// for a later test's Pod: delete it as a removed node is deleted.
	t.Cleanup(func() {
		if _, err := c.kubectlErr("", "delete", "node", n2.Name(), "--ignore-not-found"); err != nil {
			t.Errorf("deleting the second node's Node: %v", err)
		}
	})
	if err := n2.Import(ctx, filepath.Join(c.images, "counter-pod.tar")); err != nil {
		t.Fatal(err)
	}
	c.kubectl(t, "", "create", "namespace", "second")
	c.waitServiceAccount(t, "second")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: "second"},
		Spec: corev1.PodSpec{
			NodeName: n2.Name(),
			Containers: []corev1.Container{{Name: "counter", Image: "fiberd.local/counter-pod:dev", ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}},
		},
	}
	if _, err := c.cs.CoreV1().Pods("second").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := c.waitPod(t, "second", "worker", waitPod, "Running on the second node", func(p *corev1.Pod) (bool, string) {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", string(p.Status.Phase)
	})
	if !strings.HasPrefix(p.Status.PodIP, "10.244.1.") {
		t.Errorf("the Pod on the second node has IP %s, outside its network 10.244.1.0/24", p.Status.PodIP)
	}
	body := httpGet(t, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/", 30*time.Second)
	t.Logf("the second node's Pod answers: %q", strings.TrimSpace(body))
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	if left := settle(before, n2.Dir(), n2.Name()); len(left) > 0 {
		t.Errorf("cleaning the second node with its Pod running left:\n  %s", strings.Join(left, "\n  "))
	}
}

// The controller manager collects garbage as on a real cluster: deleting an owner deletes what
// it owns.
func TestGarbageCollection(t *testing.T) {
	c := shared(t)
	const ns = "garbage"
	c.kubectl(t, "", "create", "namespace", ns)
	cms := c.cs.CoreV1().ConfigMaps(ns)
	owner, err := cms.Create(c.ctx(t, 30*time.Second), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owned", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
	}}}}
	if _, err := cms.Create(c.ctx(t, 30*time.Second), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(c.ctx(t, 30*time.Second), owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		_, err := cms.Get(c.ctx(t, 30*time.Second), "owned", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the owned ConfigMap is still there a minute after its owner's deletion: %v", err)
		}
	}
	record("garbage collection: owner deleted to the owned object gone", time.Since(t0))
}

// hack/images.sh's fiberd image holds the files deploy/kubernetes/Dockerfile copies into its
// final stage, at the same paths, and no others (beyond the base layout).
func TestImageLayout(t *testing.T) {
	c := shared(t)
	df, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "kubernetes", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	final := string(df)[strings.LastIndex(string(df), "\nFROM "):]
	var want []string
	for _, line := range strings.Split(final, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "COPY" {
			continue
		}
		args := f[1:]
		if strings.HasPrefix(args[0], "--from=") {
			args = args[1:]
		}
		srcs, dest := args[:len(args)-1], args[len(args)-1]
		if dest == "/" {
			continue // the base layout
		}
		for _, s := range srcs {
			if strings.HasSuffix(dest, "/") {
				want = append(want, dest+filepath.Base(s))
			} else {
				want = append(want, dest)
			}
		}
	}
	got := imageFiles(t, filepath.Join(c.images, "fiberd.tar"))
	slices.Sort(want)
	var own []string
	for _, f := range got {
		if f != "/etc/passwd" && f != "/etc/group" {
			own = append(own, f)
		}
	}
	if !slices.Equal(own, want) {
		t.Errorf("the fiberd image holds %q, the Dockerfile copies %q", own, want)
	}
}

// The main grant Pod's grant is renewed by half its lease, and fiberd took the new lease.
func TestRenewal(t *testing.T) {
	c := shared(t)
	g := mainPod.g
	if g == nil || mainPod.iat.IsZero() {
		t.Skip("TestGrantPod did not run")
	}
	half := mainPod.iat.Add(lease / 2)
	var iat time.Time
	for end := half.Add(40 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		iat, _, _ = readGrant(t, c.stateDir(g.uid), g.uid)
		if iat.After(mainPod.iat) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the grant issued %v was not renewed by %v (half its lease, plus 40 s)", mainPod.iat, half)
		}
	}
	d := iat.Sub(mainPod.iat)
	t.Logf("renewed %v after the first grant (lease %v)", d, lease)
	if d > lease/2+2*time.Second {
		t.Errorf("the renewal came %v after the first grant, later than half the lease %v", d, lease/2)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		gs, _ := podGrant(t, g)
		if gs.LeaseExpiry.After(mainPod.exp) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("fiberd holds lease %v, not the renewed one", gs.LeaseExpiry)
		}
	}
	if n := strings.Count(c.kubectl(t, "", "-n", issuerNamespace, "logs", "deployment/grant-issuer"), g.uid); n < 2 {
		t.Errorf("the issuer logged the Pod %d times, want the first grant and its renewal", n)
	}
}

// ------------------------------------------------------------------------------------ helpers

func grepLine(text string, words ...string) bool {
	for _, line := range strings.Split(text, "\n") {
		ok := true
		for _, w := range words {
			if !strings.Contains(line, w) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func jwtClaims(t testing.TB, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(tok), ".")
	if len(parts) != 3 {
		t.Fatalf("not a compact JWT: %q", tok)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func asStrings(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// readGrant reads the grant file of uid in a state directory: iat, exp and its claims.
func readGrant(t testing.TB, state, uid string) (iat, exp time.Time, claims map[string]any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "grants", uid+".jwt"))
	if err != nil {
		t.Fatal(err)
	}
	claims = jwtClaims(t, string(b))
	num := func(k string) time.Time {
		f, _ := claims[k].(float64)
		return time.Unix(int64(f), 0)
	}
	return num("iat"), num("exp"), claims
}

func podGrant(t testing.TB, g *grantPod) (api.GrantStatus, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := g.agent(t).Status(ctx)
	if err != nil {
		t.Fatalf("fiberd status: %v", err)
	}
	for _, gs := range st.Grants {
		if gs.UID == g.uid {
			return gs, true
		}
	}
	return api.GrantStatus{}, false
}

// cloneAndGet clones a fiber of the Pod's grant on fiberd's socket and checks it answers on the
// Pod IP.
func cloneAndGet(t testing.TB, agent *client.Client, g *grantPod) api.CloneResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := agent.Clone(ctx, api.CloneRequest{GrantUID: g.uid})
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	hostPort := strings.TrimPrefix(resp.Endpoint, "tcp://")
	if h, _, _ := net.SplitHostPort(hostPort); h != g.ip {
		t.Fatalf("fiber %s at %s, not on the Pod IP %s", resp.FiberID, resp.Endpoint, g.ip)
	}
	if body := httpGet(t, "http://"+hostPort+"/", 20*time.Second); !strings.Contains(body, "fence="+resp.FiberID) {
		t.Fatalf("fiber %s answered %q", resp.FiberID, body)
	}
	return resp
}

func httpGet(t testing.TB, url string, within time.Duration) string {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	var last error
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		res, err := hc.Get(url)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			return string(b)
		}
		last = fmt.Errorf("%s: %q", res.Status, b)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}

func readEpochFile(t testing.TB, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("epoch file %s holds %q", path, b)
	}
	return n
}

// pidNS is the pid namespace of pid, as /proc shows it ("pid:[INODE]").
func pidNS(t testing.TB, pid int) string {
	t.Helper()
	ns := pidNSNoFail(pid)
	if ns == "" {
		t.Fatalf("pid namespace of %d unreadable", pid)
	}
	return ns
}

// podProcs is every process of the container whose process is pid (its pid namespace and those
// nested in it, where isolated grants and fibers run), by host pid and start time, so a check after the namespace is gone is not fooled by a reused pid or
// namespace inode.
func podProcs(t testing.TB, pid int) map[int]string {
	t.Helper()
	ns := pidNS(t, pid)
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if inPidNS(p, ns) {
			if st, ok := startTime(p); ok {
				out[p] = st
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no process in the pid namespace of %d", pid)
	}
	return out
}

// startTime is field 22 of /proc/pid/stat, and whether pid is alive (not a zombie).
func startTime(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// stillAlive lists the processes of procs that still run.
func stillAlive(procs map[int]string) []string {
	var out []string
	for pid, st := range procs {
		if now, ok := startTime(pid); ok && now == st {
			out = append(out, strconv.Itoa(pid))
		}
	}
	slices.Sort(out)
	return out
}

// inPidNS says whether pid's pid namespace is ns (a /proc/PID/ns/pid link's text) or a
// descendant of it, walking up with NS_GET_PARENT.
func inPidNS(pid int, ns string) bool {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	for i := 0; i < 33; i++ { // the kernel nests at most 32 pid namespaces
		l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err == nil && l == ns {
			unix.Close(fd)
			return true
		}
		parent, err := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		unix.Close(fd)
		if err != nil {
			return false
		}
		fd = parent
	}
	unix.Close(fd)
	return false
}

func pidNSNoFail(pid int) string {
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	return ns
}

// procsInNS lists the processes in pid namespace ns or one nested in it (an isolated grant's, a
// fiber's): the zombies, and the live ones.
func procsInNS(ns string) (zombies, live []string) {
	if ns == "" {
		return nil, nil
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if !inPidNS(pid, ns) {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		j := strings.IndexByte(s, '(')
		if i < 0 || j < 0 || i+2 >= len(s) {
			continue
		}
		desc := fmt.Sprintf("%d(%s)", pid, s[j+1:i])
		if s[i+2] == 'Z' {
			zombies = append(zombies, desc)
		} else {
			live = append(live, desc)
		}
	}
	return zombies, live
}

// logStream follows the grant Pod's log until its container ends.
type logStream struct {
	done chan struct{}
	mu   sync.Mutex
	buf  strings.Builder
	err  error
}

func (c *cluster) followLogs(t *testing.T, ns string) *logStream {
	t.Helper()
	ls := &logStream{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	rc, err := c.cs.CoreV1().Pods(ns).GetLogs(podName, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(ls.done)
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ls.mu.Lock()
			ls.buf.WriteString(sc.Text() + "\n")
			ls.mu.Unlock()
		}
		ls.mu.Lock()
		ls.err = sc.Err()
		ls.mu.Unlock()
	}()
	return ls
}

func (ls *logStream) wait(t testing.TB) string {
	t.Helper()
	select {
	case <-ls.done:
	case <-time.After(2 * time.Minute):
		t.Error("fiberd's log did not end within 2 minutes")
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.buf.String()
}

// termWatch watches the grant Pod for its container's termination state.
type termWatch struct {
	done chan *corev1.ContainerStateTerminated
}

func (c *cluster) watchTermination(t *testing.T, ns string) *termWatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	w, err := c.cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", podName).String()})
	if err != nil {
		t.Fatal(err)
	}
	tw := &termWatch{done: make(chan *corev1.ContainerStateTerminated, 1)}
	go func() {
		defer w.Stop()
		var last *corev1.ContainerStateTerminated
		defer func() { tw.done <- last }()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Terminated != nil {
					last = cs.State.Terminated.DeepCopy()
					return
				}
			}
			if ev.Type == watch.Deleted {
				return
			}
		}
	}()
	return tw
}

func (tw *termWatch) wait(t testing.TB) *corev1.ContainerStateTerminated {
	t.Helper()
	select {
	case ts := <-tw.done:
		return ts
	case <-time.After(2 * time.Minute):
		t.Fatal("fiberd's container did not terminate within 2 minutes")
		return nil
	}
}

// drainTime is the time between fiberd's "Agent draining" and "fiberd stopped" log lines, from
// their klog timestamps (microseconds; the date is dropped, so a drain across midnight is missed).
func drainTime(log string) (time.Duration, bool) {
	at := func(word string) (time.Time, bool) {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, word) {
				if f := strings.Fields(line); len(f) > 1 {
					ts, err := time.Parse("15:04:05.000000", f[1])
					return ts, err == nil
				}
			}
		}
		return time.Time{}, false
	}
	from, ok1 := at("Agent draining")
	to, ok2 := at("fiberd stopped")
	return to.Sub(from), ok1 && ok2 && !to.Before(from)
}

// imageFiles lists the regular files of a one-layer image tarball in docker save's layout.
func imageFiles(t testing.TB, path string) []string {
	t.Helper()
	read := func(name string) []byte {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tr := tar.NewReader(f)
		for {
			h, err := tr.Next()
			if err != nil {
				t.Fatalf("%s: no %s: %v", path, name, err)
			}
			if h.Name == name {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
		}
	}
	var manifest []struct{ Layers []string }
	if err := json.Unmarshal(read("manifest.json"), &manifest); err != nil || len(manifest) != 1 || len(manifest[0].Layers) != 1 {
		t.Fatalf("%s: manifest.json %+v, %v; want one image of one layer", path, manifest, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(read(manifest[0].Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files = append(files, "/"+h.Name)
		}
	}
	slices.Sort(files)
	return files
}
