//go:build e2enode

package node

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/test/kubenode"
)

// Names of TestPool: deploy/controller's, its example pool's and controller/pool's labels.
const (
	poolNS           = "pools"
	poolName         = "counter"                                 // the example's pool
	poolExample      = "examples/counter-pool.yaml"              // under deploy/controller
	controllerName   = "fiberd-controller"                       // deployment.yaml's Deployment and Pod label
	leaderLease      = "fiberd-controller.fiberd.io"             // the controller's -leader-election-id
	controllerIssuer = "https://fiberd-issuer.fiberd-system.svc" // its -issuer-url
	poolClientSA     = "pool-client"                             // pool-client-rbac.yaml's subject
	poolLabel        = "fiberd.io/pool"
	servingLabel     = "fiberd.io/serving"
	ordinalLabel     = "fiberd.io/ordinal"
	revisionLabel    = "fiberd.io/revision"
)

const (
	poolCloneMs = "pool: Clone through the pool client (client Pod)" // its record() name
	waitPool    = 4 * time.Minute                                    // the longest wait for the pool's Pods
)

// TestPool is issue 28's pool on the real cluster, with a second node: deploy/controller applied
// as a user applies it (the controller runs as a Pod, its issuer serves the grant Pods' grants), a
// FiberPool of 4 grant Pods spread over both nodes, Clones from a client Pod routed by
// pkg/client/pool to every one of them with no API server write per Clone, a grant Pod killed
// (Clones fail over within their deadline, the pool heals), scale-down to 2 (drained Pods leave the
// Service and go, no Clone fails) and a rolling change with the controller restarted mid-way (no
// Clone refused, never more than one surge Pod, the roll finishes).
func TestPool(t *testing.T) {
	c := shared(t)
	n2 := c.poolNode(t)
	t0 := time.Now()
	c.deployController(t)
	record("pool: deploy/controller applied to Available", time.Since(t0))
	c.grantNamespace(t, poolNS)
	t.Cleanup(func() {
		// The Pods go with the namespace; the node's Close kills what is left of them.
		_, _ = c.kubectlErr("", "delete", "namespace", poolNS, "--wait=false")
	})
	c.kubectl(t, "", "-n", poolNS, "create", "serviceaccount", poolClientSA)
	if err := c.apply(poolNS, "pool-client-rbac.yaml"); err != nil {
		t.Fatal(err)
	}

	// 2. The example pool, 4 Pods, on both nodes.
	t0 = time.Now()
	c.kubectl(t, poolManifest(t), "-n", poolNS, "apply", "-f", "-")
	pods := c.waitPool(t, 4, waitPool, nil)
	record("pool: example pool applied to 4 grant Pods Ready", time.Since(t0))
	nodes := map[string][]string{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = append(nodes[p.Spec.NodeName], p.Name)
	}
	t.Logf("grant Pods per node: %v", nodes)
	if len(nodes[c.node.Name()]) == 0 || len(nodes[n2.Name()]) == 0 {
		t.Fatalf("the pool's 4 grant Pods are not spread over both nodes %s and %s: %v", c.node.Name(), n2.Name(), nodes)
	}
	// Each grant Pod's grant is the controller issuer's, for that Pod.
	for _, p := range pods {
		dir := c.node.Dir()
		if p.Spec.NodeName == n2.Name() {
			dir = n2.Dir()
		}
		state := filepath.Join(dir, "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "state")
		_, _, claims := readGrant(t, state, string(p.UID))
		if iss := fmt.Sprint(claims["iss"]); iss != controllerIssuer {
			t.Errorf("grant Pod %s's grant was issued by %s, not the controller's issuer %s", p.Name, iss, controllerIssuer)
		}
		if aud := fmt.Sprint(claims["aud"]); !strings.Contains(aud, p.Name) {
			t.Errorf("grant Pod %s's grant is for %s", p.Name, aud)
		}
	}
	if ok, why := c.poolCondition(t, "FibersCounted"); !ok {
		t.Errorf("the pool does not count fibers in use with the controller's client certificate: %s", why)
	}

	// 3. Clones from another Pod, routed by the pool client to all four, no API write per Clone.
	if out, err := c.kubectlErr("", "auth", "can-i", "create", "pods", "-n", poolNS,
		"--as=system:serviceaccount:"+poolNS+":"+poolClientSA); err == nil || strings.TrimSpace(out) != "no" {
		t.Errorf("the pool client's ServiceAccount may create Pods (%q, %v): pool-client-rbac.yaml should grant list and watch of EndpointSlices only", out, err)
	}
	const clones = 400
	writes0 := c.apiWrites(t)
	t0 = time.Now()
	cl := c.startPoolClient(t, "pool-client-burst", clones)
	cycles := cl.wait(t)
	elapsed := time.Since(t0)
	writes := c.apiWrites(t) - writes0
	if len(cycles) != clones {
		t.Fatalf("the client printed %d cycles, want %d", len(cycles), clones)
	}
	served := map[string]int{}
	for _, cy := range cycles {
		if cy.Error != "" {
			t.Errorf("cycle %d through the pool failed at %s: %s", cy.N, cy.Stage, cy.Error)
			continue
		}
		if !strings.Contains(cy.Body, "fence="+cy.FiberID) {
			t.Errorf("cycle %d: the fiber %s at %s answered %q, not as itself", cy.N, cy.FiberID, cy.Endpoint, cy.Body)
		}
		served[cy.Pod]++
		recordMs(poolCloneMs, cy.CloneMs)
	}
	t.Logf("%d Clones through the pool client in %v, served per Pod %v; API server writes meanwhile %d (client Pod's own life, leases, status included)", clones, elapsed.Round(time.Millisecond), served, writes)
	for _, p := range pods {
		if served[p.Name] == 0 {
			t.Errorf("grant Pod %s (node %s) served none of %d Clones: %v", p.Name, p.Spec.NodeName, clones, served)
		}
	}
	// Every other writer (leases, the kubelets' and the controller's status, the client Pod's own
	// creation) counts too: about 20 to 50 here. Half a write per Clone leaves room for a slow
	// machine's longer run and none for a write per Clone.
	if writes >= clones/2 {
		t.Errorf("the API server took %d writes during %d Clones: the pool client should write nothing per Clone", writes, clones)
	}
	recordMs("pool: API server writes per Clone (all writers, ×1000)", float64(writes)*1000/clones)

	// 4. A grant Pod killed, twice: deleted at once (it leaves the EndpointSlices with its Pod
	// object), then its fiberd SIGKILLed (the Pod stays listed until the kubelet sees the
	// container die). Clones fail over to the other Pods within their deadline; the pool heals.
	cl = c.startPoolClient(t, "pool-client-kill", 0, "-interval=20ms")
	cl.waitCycles(t, 20)
	type kill struct {
		pod          string
		from, healed int // the client's cycles before the kill and at the heal
	}
	var kills []kill
	victim := c.pod(t, poolName+"-1")
	k := kill{pod: victim.Name, from: len(cl.cycles(t))}
	killed := time.Now()
	c.kubectl(t, "", "-n", poolNS, "delete", "pod", victim.Name, "--grace-period=0", "--force")
	c.waitPool(t, 4, waitPool, func(p []corev1.Pod) bool {
		for _, p := range p {
			if p.Name == victim.Name && p.UID == victim.UID {
				return false
			}
		}
		return true
	})
	record("pool: grant Pod deleted at once to 4 Ready again (heal)", time.Since(killed))
	k.healed = len(cl.cycles(t))
	kills = append(kills, k)
	cl.waitCycles(t, k.healed+20)

	var onPrimary *corev1.Pod
	for _, p := range c.poolPods(t) {
		if p.Spec.NodeName == c.node.Name() && p.Name != victim.Name {
			onPrimary = &p
			break
		}
	}
	if onPrimary == nil {
		t.Fatalf("no grant Pod but %s on the node %s: %v", victim.Name, c.node.Name(), podSummary(c.poolPods(t)))
	}
	g := c.readGrantPod(t, onPrimary)
	k = kill{pod: onPrimary.Name, from: len(cl.cycles(t))}
	killed = time.Now()
	if err := syscall.Kill(g.hostPID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing fiberd of %s (pid %d): %v", onPrimary.Name, g.hostPID, err)
	}
	c.waitPool(t, 4, waitPool, func(p []corev1.Pod) bool {
		for _, p := range p {
			if p.Name == onPrimary.Name {
				return p.UID == onPrimary.UID && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > g.restarts
			}
		}
		return false
	})
	record("pool: grant Pod's fiberd killed to 4 Ready again (heal)", time.Since(killed))
	k.healed = len(cl.cycles(t))
	kills = append(kills, k)
	cl.waitCycles(t, k.healed+20)
	cycles = cl.stop(t)

	for _, k := range kills {
		var worst float64
		for _, cy := range cycles {
			if cy.N > k.from && cy.N <= k.healed+1 && cy.CloneMs > worst {
				worst = cy.CloneMs
			}
		}
		recordMs("pool: failover, slowest Clone from a kill to the heal", worst)
		t.Logf("killed %s: %d Clones until the pool healed, the slowest %.1f ms", k.pod, k.healed-k.from, worst)
		if k.healed <= k.from {
			t.Errorf("no Clone was made between the kill of %s and the heal", k.pod)
		}
	}
	for _, cy := range cycles {
		switch {
		case cy.Stage == "clone":
			t.Errorf("cycle %d: a Clone failed although 3 grant Pods served: %s", cy.N, cy.Error)
		case cy.Error != "" && (cy.Pod == kills[0].pod || cy.Pod == kills[1].pod):
			// A killed Pod's fibers end with it: their answer or release may fail, not the Clone.
			t.Logf("cycle %d on %s, a killed Pod: %s", cy.N, cy.Pod, cy.Error)
		case cy.Error != "":
			t.Errorf("cycle %d on %s, which was not killed, failed at %s: %s", cy.N, cy.Pod, cy.Stage, cy.Error)
		}
	}
	t.Logf("the kills: %d Clones in all", len(cycles))

	// 5. Scale to 2: the drained Pods leave the Service, then are deleted, no Clone fails.
	cl = c.startPoolClient(t, "pool-client-scale", 0, "-interval=20ms")
	cl.waitCycles(t, 20)
	t0 = time.Now()
	c.kubectl(t, "", "-n", poolNS, "scale", "fiberpool", poolName, "--replicas=2")
	drained := []string{poolName + "-2", poolName + "-3"}
	left := map[string]bool{}
	for end := time.Now().Add(waitPool); len(left) < len(drained); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after %v the drained Pods %v are not all gone (gone: %v); pool status: %+v", waitPool, drained, left, c.poolStatus(t))
		}
		listed := c.sliceAddresses(t)
		for _, name := range drained {
			p, err := c.cs.CoreV1().Pods(poolNS).Get(c.ctx(t, 30*time.Second), name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				left[name] = true
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Labels[servingLabel] == "false" && listed[p.Status.PodIP] && time.Since(drainStarted(p)) > 5*time.Second {
				t.Errorf("Pod %s has drained for %v and is still in the Service's EndpointSlices", name, time.Since(drainStarted(p)).Round(time.Second))
			}
		}
	}
	drainTime := time.Since(t0)
	record("pool: scale 4 to 2, to the drained Pods deleted", drainTime)
	if drainTime > 2*time.Minute {
		t.Errorf("the drained Pods took %v to go: with fibers counted they should go once released, not at drainGracePeriod's end", drainTime)
	}
	c.waitPool(t, 2, waitPool, nil)
	cl.waitCycles(t, len(cl.cycles(t))+20)
	cycles = cl.stop(t)
	for _, cy := range cycles {
		if cy.Error != "" {
			t.Errorf("cycle %d during the scale-down failed at %s: %s", cy.N, cy.Stage, cy.Error)
		}
	}
	t.Logf("the scale-down: %d Clones, none failed", len(cycles))

	// 6. A rolling change with the controller restarted mid-way.
	rev0 := c.poolStatus(t).UpdateRevision
	cl = c.startPoolClient(t, "pool-client-roll", 0, "-interval=20ms")
	cl.waitCycles(t, 20)
	w := c.watchPoolPods(t)
	t0 = time.Now()
	c.kubectl(t, "", "-n", poolNS, "patch", "fiberpool", poolName, "--type=merge", "-p", `{"spec":{"fibersMax":6}}`)
	// The controller goes once the surge Pod is there: mid-roll.
	surge := poolName + "-2"
	c.waitPod(t, poolNS, surge, waitPool, "the roll's surge Pod created", func(*corev1.Pod) (bool, string) { return true, "" })
	leader := c.leader(t)
	c.kubectl(t, "", "-n", issuerNamespace, "delete", "pod", leader)
	t.Logf("the roll started; deleted the controller's leader Pod %s %v after the change", leader, time.Since(t0).Round(time.Millisecond))
	var st poolStatus
	for end := time.Now().Add(2 * waitPool); ; time.Sleep(500 * time.Millisecond) {
		st = c.poolStatus(t)
		pods := c.poolPods(t)
		done := st.UpdateRevision != rev0 && st.UpdatedReplicas == 2 && st.ReadyReplicas == 2 && st.DrainingReplicas == 0 && len(pods) == 2
		for _, p := range pods {
			done = done && p.Labels[revisionLabel] == st.UpdateRevision && isTrue(&p, corev1.PodReady)
		}
		if done {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the roll did not finish in %v: status %+v, Pods %v", 2*waitPool, st, podSummary(pods))
		}
	}
	record("pool: roll of 2 Pods (controller restarted mid-way)", time.Since(t0))
	if now := c.leader(t); now == leader {
		t.Errorf("the deleted controller Pod %s still leads after the roll", leader)
	}
	if st.Fibers.Capacity != 2*6 {
		t.Errorf("after the roll to fibersMax 6 the pool's capacity is %d, want 2 Pods × 6", st.Fibers.Capacity)
	}
	most, dups := w.stop()
	if most > 3 {
		t.Errorf("the pool of 2 had %d Pods at once during the roll: one surge Pod at most", most)
	}
	for _, d := range dups {
		t.Errorf("duplicate Pods during the roll: %s", d)
	}
	cl.waitCycles(t, len(cl.cycles(t))+20)
	cycles = cl.stop(t)
	for _, cy := range cycles {
		if cy.Error != "" {
			t.Errorf("cycle %d during the roll failed at %s: %s", cy.N, cy.Stage, cy.Error)
		}
	}
	t.Logf("the roll: revision %s to %s, at most %d Pods at once, %d Clones, none failed", rev0, st.UpdateRevision, most, len(cycles))
}

// poolNode starts the test's second node (the grant Pods' and the controller's images imported);
// the test's cleanup stops it and deletes its Node object.
func (c *cluster) poolNode(t *testing.T) *kubenode.Node {
	t.Helper()
	ctx := c.ctx(t, 5*time.Minute)
	n2, err := kubenode.Start(ctx, c.cp.Dir(), kubenode.Options{Name: "fiberd-node-pool", CIDR: "10.244.2.0/24", Bridge: "fiberd2", Secondary: true, Images: c.images})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.kubectlErr("", "delete", "node", n2.Name(), "--ignore-not-found"); err != nil {
			t.Errorf("deleting the second node's Node: %v", err)
		}
	})
	t.Cleanup(func() {
		if err := n2.Close(); err != nil {
			t.Errorf("stopping the second node: %v", err)
		}
	})
	if err := n2.Import(ctx, filepath.Join(c.images, "fiberd.tar")); err != nil {
		t.Fatal(err)
	}
	return n2
}

// deployController applies every file of deploy/controller as `kubectl apply -f deploy/controller/`
// does (only the image and its pull policy changed), after the Secrets its header asks for: the
// issuer's serving certificate and the client certificate fibers in use are read with. The test's
// cleanup deletes the Deployment.
func (c *cluster) deployController(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	crt, key, err := c.issuerCA.files(dir, "fiberd-issuer", false, "fiberd-issuer.fiberd-system.svc", "fiberd-issuer.fiberd-system.svc.cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	cliCrt, cliKey, err := c.clientCA.files(dir, "controller", true)
	if err != nil {
		t.Fatal(err)
	}
	apiCA := filepath.Join(dir, "api-ca.crt")
	if err := os.WriteFile(apiCA, c.apiCA.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c.kubectl(t, "", "-n", issuerNamespace, "create", "secret", "tls", "fiberd-issuer-tls", "--cert="+crt, "--key="+key)
	c.kubectl(t, "", "-n", issuerNamespace, "create", "secret", "generic", "fiberd-controller-client-tls",
		"--from-file=tls.crt="+cliCrt, "--from-file=tls.key="+cliKey, "--from-file=ca.crt="+apiCA)

	files, err := filepath.Glob(filepath.Join(repoRoot(), "deploy", "controller", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/controller: %v (%d files)", err, len(files))
	}
	sort.Strings(files)
	var all []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, string(b))
	}
	m := strings.Join(all, "\n---\n")
	const from = "image: " + manifestImage + "\n        imagePullPolicy: IfNotPresent\n"
	if !strings.Contains(m, from) {
		t.Fatalf("deploy/controller/deployment.yaml has no %q to set the image in", from)
	}
	m = strings.ReplaceAll(m, from, "image: "+fiberdImage+"\n        imagePullPolicy: Never\n")
	t.Cleanup(func() {
		_, _ = c.kubectlErr("", "-n", issuerNamespace, "delete", "deployment", controllerName, "--ignore-not-found")
	})
	c.kubectl(t, m, "apply", "-f", "-")
	if _, err := c.kubectlErr("", "-n", issuerNamespace, "rollout", "status", "deployment/"+controllerName, "--timeout=150s"); err != nil {
		t.Fatalf("%v\n%s", err, c.controllerDiagnostics())
	}
}

// controllerDiagnostics is what says why the controller is not Available: its Pods, their
// events and logs.
func (c *cluster) controllerDiagnostics() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"-n", issuerNamespace, "get", "pods", "-o", "wide"},
		{"-n", issuerNamespace, "describe", "pods", "-l", "app.kubernetes.io/name=" + controllerName},
		{"-n", issuerNamespace, "logs", "--tail=60", "--prefix", "-l", "app.kubernetes.io/name=" + controllerName},
	} {
		out, err := c.kubectlErr("", args...)
		fmt.Fprintf(&b, "kubectl %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
		}
	}
	return b.String()
}

// poolManifest is deploy/controller's example pool with the image set to the suite's build of
// fiberd:dev, never pulled.
func poolManifest(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "controller", poolExample))
	if err != nil {
		t.Fatal(err)
	}
	const from = "    image: " + manifestImage + "\n"
	if !strings.Contains(string(b), from) {
		t.Fatalf("deploy/controller/%s has no %q to set the image in", poolExample, from)
	}
	return strings.Replace(string(b), from, "    image: "+fiberdImage+"\n    imagePullPolicy: Never\n", 1)
}

// poolPods lists the pool's Pods, by name.
func (c *cluster) poolPods(t testing.TB) []corev1.Pod {
	t.Helper()
	l, err := c.cs.CoreV1().Pods(poolNS).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: poolLabel + "=" + poolName})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items
}

func (c *cluster) pod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	p, err := c.cs.CoreV1().Pods(poolNS).Get(c.ctx(t, 30*time.Second), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitPool waits until the pool's Pods are exactly <pool>-0 to <pool>-(n-1), each Ready, serving
// and not terminating, and more holds, and returns them.
func (c *cluster) waitPool(t testing.TB, n int, within time.Duration, more func([]corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	end := time.Now().Add(within)
	for {
		pods := c.poolPods(t)
		ok := len(pods) == n && (more == nil || more(pods))
		for i := range pods {
			p := &pods[i]
			ok = ok && p.Name == poolName+"-"+strconv.Itoa(i) && p.DeletionTimestamp == nil && p.Labels[servingLabel] == "true" && isTrue(p, corev1.PodReady)
		}
		if ok {
			return pods
		}
		if time.Now().After(end) {
			ev, _ := c.kubectlErr("", "-n", poolNS, "get", "events", "--sort-by=.lastTimestamp")
			var logs strings.Builder
			for _, p := range pods {
				if !isTrue(&p, corev1.PodReady) {
					out, _ := c.kubectlErr("", "-n", poolNS, "logs", "--tail=30", p.Name)
					fmt.Fprintf(&logs, "%s's logs:\n%s\n", p.Name, out)
				}
			}
			t.Fatalf("after %v the pool is not %d Ready grant Pods: %v\npool status: %+v\nevents:\n%s\n%s\n%s", within, n, podSummary(pods), c.poolStatus(t), ev, logs.String(), c.controllerDiagnostics())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func podSummary(pods []corev1.Pod) []string {
	var s []string
	for i := range pods {
		p := &pods[i]
		s = append(s, fmt.Sprintf("%s(node %s, %s, serving %s, revision %s, %s)", p.Name, p.Spec.NodeName, p.Status.Phase, p.Labels[servingLabel], p.Labels[revisionLabel], conditions(p)))
	}
	return s
}

// drainStarted is the Pod's fiberd.io/drain-started annotation, or now.
func drainStarted(p *corev1.Pod) time.Time {
	ts, err := time.Parse(time.RFC3339, p.Annotations["fiberd.io/drain-started"])
	if err != nil {
		return time.Now()
	}
	return ts
}

// poolStatus is what the test reads of the FiberPool's status (the controller's module is not
// this one's dependency, so its types are not imported).
type poolStatus struct {
	Replicas         int32  `json:"replicas"`
	ReadyReplicas    int32  `json:"readyReplicas"`
	UpdatedReplicas  int32  `json:"updatedReplicas"`
	DrainingReplicas int32  `json:"drainingReplicas"`
	UpdateRevision   string `json:"updateRevision"`
	Fibers           struct {
		Capacity int64  `json:"capacity"`
		InUse    *int64 `json:"inUse"`
	} `json:"fibers"`
	Conditions []metav1.Condition `json:"conditions"`
}

func (c *cluster) poolStatus(t testing.TB) poolStatus {
	t.Helper()
	out := c.kubectl(t, "", "-n", poolNS, "get", "fiberpool", poolName, "-o", "jsonpath={.status}")
	var st poolStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("the pool's status %q: %v", out, err)
	}
	return st
}

// poolCondition reports whether the pool's condition typ is True, and else what it says.
func (c *cluster) poolCondition(t testing.TB, typ string) (bool, string) {
	t.Helper()
	var last string
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		for _, cond := range c.poolStatus(t).Conditions {
			if cond.Type == typ {
				if cond.Status == metav1.ConditionTrue {
					return true, ""
				}
				last = fmt.Sprintf("%s=%s (%s: %s)", cond.Type, cond.Status, cond.Reason, cond.Message)
			}
		}
		if time.Now().After(end) {
			return false, last
		}
	}
}

// sliceAddresses are the addresses the pool's Service's EndpointSlices list.
func (c *cluster) sliceAddresses(t testing.TB) map[string]bool {
	t.Helper()
	l, err := c.cs.DiscoveryV1().EndpointSlices(poolNS).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + poolName})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, s := range l.Items {
		for _, e := range s.Endpoints {
			for _, a := range e.Addresses {
				m[a] = true
			}
		}
	}
	return m
}

// leader is the name of the controller Pod holding the leader election Lease.
func (c *cluster) leader(t testing.TB) string {
	t.Helper()
	l, err := c.cs.CoordinationV1().Leases(issuerNamespace).Get(c.ctx(t, 30*time.Second), leaderLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		t.Fatalf("the Lease %s has no holder", leaderLease)
	}
	name, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return name
}

// apiWrites is the API server's count of write requests so far (apiserver_request_total of the
// verbs POST, PUT, PATCH, DELETE and APPLY), from its metrics.
func (c *cluster) apiWrites(t testing.TB) int {
	t.Helper()
	b, err := c.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(c.ctx(t, 30*time.Second))
	if err != nil {
		t.Fatalf("the API server's metrics: %v", err)
	}
	n := 0
	seen := false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		seen = true
		i := strings.LastIndexByte(line, ' ')
		write := false
		for _, v := range []string{"POST", "PUT", "PATCH", "DELETE", "APPLY"} {
			write = write || strings.Contains(line, `verb="`+v+`"`)
		}
		if !write {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += int(v)
	}
	if !seen {
		t.Fatal("the API server's metrics have no apiserver_request_total")
	}
	return n
}

// ------------------------------------------------------------------------------------ the client

// poolClient is a Pod of test/node/client cloning through the pool (its -pool mode) on the
// primary node, as the ServiceAccount pool-client.
type poolClient struct {
	c    *cluster
	name string
	uid  string
}

// startPoolClient starts the client Pod with args added to -pool and waits until it runs. With
// n > 0 it makes n cycles and ends; with n = 0 it clones until stop.
func (c *cluster) startPoolClient(t *testing.T, name string, n int, args ...string) *poolClient {
	t.Helper()
	c.waitServiceAccount(t, poolNS)
	uid := int64(65532)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: poolNS},
		Spec: corev1.PodSpec{
			NodeName:           c.node.Name(), // where node-client:dev is imported
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: poolClientSA,
			SecurityContext:    &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: ptr(true)},
			Containers: []corev1.Container{{
				Name: "client", Image: clientImage, ImagePullPolicy: corev1.PullNever,
				Args:         append([]string{"-pool=" + poolName, "-tls-cert=/tls/tls.crt", "-tls-key=/tls/tls.key", "-ca=/tls/ca.crt"}, args...),
				VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}, {Name: "ctl", MountPath: "/ctl"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "fiberd-client-tls", DefaultMode: ptr(int32(0o444))}}},
				{Name: "ctl", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
	c0 := &pod.Spec.Containers[0]
	if n > 0 {
		c0.Args = append(c0.Args, "-n="+strconv.Itoa(n))
	} else {
		c0.Args = append(c0.Args, "-stop-file=/ctl/stop")
	}
	p, err := c.cs.CoreV1().Pods(poolNS).Create(c.ctx(t, 30*time.Second), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl := &poolClient{c: c, name: name, uid: string(p.UID)}
	c.waitPod(t, poolNS, name, waitPod, "the client running", func(p *corev1.Pod) (bool, string) {
		return containerStarted(p) || p.Status.Phase != corev1.PodPending, string(p.Status.Phase)
	})
	return cl
}

// touchStop writes the stop file into the Pod's emptyDir on the node.
func (cl *poolClient) touchStop(t testing.TB) {
	t.Helper()
	dir := filepath.Join(cl.c.node.Dir(), "kubelet", "pods", cl.uid, "volumes", "kubernetes.io~empty-dir", "ctl")
	if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
		t.Fatalf("stopping the client %s: %v", cl.name, err)
	}
}

// cycles parses the cycles the client printed so far (its log also holds the pool client's
// klog lines, which are not JSON).
func (cl *poolClient) cycles(t testing.TB) []Cycle {
	t.Helper()
	out := cl.c.logs(t, poolNS, cl.name, false)
	var cycles []Cycle
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var cy Cycle
		if err := json.Unmarshal([]byte(line), &cy); err != nil {
			t.Fatalf("client %s printed %q: %v", cl.name, line, err)
		}
		cycles = append(cycles, cy)
	}
	return cycles
}

// waitCycles waits until the client printed at least n cycles.
func (cl *poolClient) waitCycles(t testing.TB, n int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got := cl.cycles(t)
		if len(got) >= n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the client %s printed %d cycles in 2 minutes, want %d:\n%s", cl.name, len(got), n, cl.c.logs(t, poolNS, cl.name, false))
		}
	}
}

// stop ends the client and returns its cycles.
func (cl *poolClient) stop(t testing.TB) []Cycle {
	t.Helper()
	cl.touchStop(t)
	return cl.wait(t)
}

// wait waits for the client to end and returns its cycles; the Pod may have failed (a cycle
// failed), which the caller judges from the cycles.
func (cl *poolClient) wait(t testing.TB) []Cycle {
	t.Helper()
	cl.c.waitPod(t, poolNS, cl.name, waitPod, "the client finished", func(p *corev1.Pod) (bool, string) {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, string(p.Status.Phase)
	})
	cycles := cl.cycles(t)
	if len(cycles) == 0 {
		t.Fatalf("the client %s printed no cycle:\n%s", cl.name, cl.c.logs(t, poolNS, cl.name, false))
	}
	return cycles
}

// ------------------------------------------------------------------------------------ Pod watch

// podWatch samples the pool's Pods until stopped: the most that existed at once, and any two
// that claimed the same ordinal.
type podWatch struct {
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	most  int
	dups  []string
}

func (c *cluster) watchPoolPods(t *testing.T) *podWatch {
	w := &podWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stopc:
				return
			case <-tick.C:
			}
			l, err := c.cs.CoreV1().Pods(poolNS).List(c.ctx(t, 30*time.Second), metav1.ListOptions{LabelSelector: poolLabel + "=" + poolName})
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.most = max(w.most, len(l.Items))
			byOrdinal := map[string][]string{}
			for _, p := range l.Items {
				byOrdinal[p.Labels[ordinalLabel]] = append(byOrdinal[p.Labels[ordinalLabel]], p.Name+"/"+string(p.UID))
			}
			for o, names := range byOrdinal {
				if len(names) > 1 {
					d := fmt.Sprintf("ordinal %s: %v", o, names)
					if !slices.Contains(w.dups, d) {
						w.dups = append(w.dups, d)
					}
				}
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the sampling (once; later calls return the same) and returns what it saw.
func (w *podWatch) stop() (most int, dups []string) {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, w.dups
}
