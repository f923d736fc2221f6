//go:build e2enode

package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/test/kubeapi"
	"fiberd.io/fiberd/test/kubenode"
)

// cluster is the suite's control plane, node and development issuer, shared by every test.
type cluster struct {
	cp     *kubeapi.ControlPlane
	node   *kubenode.Node
	before kubenode.HostState
	work   string // certificates, keys, the images
	images string // hack/images.sh's output
	cs     kubernetes.Interface

	issuerCA, apiCA, clientCA *authority
}

var fixture struct {
	once sync.Once
	c    *cluster
	err  error
}

// shared is the suite's cluster; the first call builds the images and starts the control plane,
// the node and the issuer. It skips t when the machine cannot run a node, or fails it under
// FIBERD_KUBE_REQUIRED=1.
func shared(t *testing.T) *cluster {
	t.Helper()
	if err := kubenode.Missing(); err != nil {
		if os.Getenv("FIBERD_KUBE_REQUIRED") == "1" {
			t.Fatalf("%v (FIBERD_KUBE_REQUIRED=1 forbids skipping)", err)
		}
		t.Skip(err)
	}
	fixture.once.Do(func() { fixture.c, fixture.err = setup() })
	if fixture.err != nil {
		t.Fatalf("e2e-node setup: %v", fixture.err)
	}
	return fixture.c
}

func setup() (*cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := &cluster{}
	var err error
	if c.before, err = kubenode.ReadHost(); err != nil {
		return nil, err
	}
	if c.work, err = os.MkdirTemp("", "e2e-node-"); err != nil {
		return nil, err
	}
	fixture.c = c // teardown removes what is made from here on, also on failure
	c.images = filepath.Join(c.work, "images")
	t0 := time.Now()
	digests, err := kubenode.BuildImages(ctx, c.images)
	if err != nil {
		return nil, err
	}
	record("setup: hack/images.sh (5 images)", time.Since(t0))
	fmt.Printf("e2e-node: images %v\n", digests)

	t0 = time.Now()
	if c.cp, err = kubeapi.New(kubeapi.Options{NodeAddress: kubenode.DefaultAddress}); err != nil {
		return nil, err
	}
	record("setup: control plane start (kube-up.sh)", time.Since(t0))
	c.cs = c.cp.Client()
	t0 = time.Now()
	if c.node, err = kubenode.Start(ctx, c.cp.Dir(), kubenode.Options{Images: c.images}); err != nil {
		return nil, err
	}
	record("setup: node start to Ready (node-up.sh)", time.Since(t0))
	t0 = time.Now()
	if err := c.node.Import(ctx, filepath.Join(c.images, "fiberd.tar"), filepath.Join(c.images, "node-client.tar"),
		filepath.Join(c.images, "counter-pod.tar")); err != nil {
		return nil, err
	}
	record("setup: image import (fiberd, node-client, counter-pod)", time.Since(t0))

	for _, a := range []**authority{&c.issuerCA, &c.apiCA, &c.clientCA} {
		if *a, err = newAuthority(); err != nil {
			return nil, err
		}
	}
	t0 = time.Now()
	if err := c.deployIssuer(ctx); err != nil {
		return nil, err
	}
	record("setup: development issuer applied to Available", time.Since(t0))
	return c, nil
}

// teardown stops the node (with the Pods still running) and the control plane, then checks
// that the machine holds nothing of the node's.
func teardown() error {
	c := fixture.c
	if c == nil {
		return nil
	}
	var errs []error
	if c.node != nil {
		t0 := time.Now()
		if err := c.node.Close(); err != nil {
			errs = append(errs, err)
		}
		record("teardown: node-up.sh clean with Pods running", time.Since(t0))
	}
	if c.cp != nil {
		if err := c.cp.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.node != nil {
		if left := settle(c.before, c.node.Dir(), c.node.Name()); len(left) > 0 {
			errs = append(errs, fmt.Errorf("the node left behind:\n  %s", strings.Join(left, "\n  ")))
		} else {
			fmt.Println("e2e-node: the node left nothing behind (processes, mounts, interfaces, nftables tables, cgroups, files, kernel settings)")
		}
	}
	os.RemoveAll(c.work)
	return errors.Join(errs...)
}

// settle compares the machine with before until nothing of the node's is left or 15 s passed
// (this machine's init reaps orphans slowly) and returns what is left.
func settle(before kubenode.HostState, dir, name string) []string {
	var left []string
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		after, err := kubenode.ReadHost()
		if err != nil {
			return []string{err.Error()}
		}
		left = kubenode.Leftovers(before, after, dir, name)
		if len(left) == 0 || time.Now().After(end) {
			return left
		}
	}
}

// ------------------------------------------------------------------------------------ kubectl

// kubectl runs the node's kubectl with the admin kubeconfig, stdin from in, and returns stdout.
func (c *cluster) kubectl(t testing.TB, in string, args ...string) string {
	t.Helper()
	out, err := c.kubectlErr(in, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (c *cluster) kubectlErr(in string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.node.Bin(), "kubectl"), append([]string{"--kubeconfig", c.cp.Kubeconfig(), "--cache-dir", filepath.Join(c.work, "kubectl-cache")}, args...)...)
	cmd.Stdin = strings.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// manifest is deploy/kubernetes/<name> with the image names substituted, the only change the
// suite makes to what a user applies.
func manifest(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "kubernetes", name))
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(b), "image: "+manifestImage+"\n", "image: "+fiberdImage+"\n"), nil
}

func repoRoot() string {
	root, err := kubenode.Root()
	if err != nil {
		panic(err)
	}
	return root
}

// apply is `kubectl apply -f -` of a manifest of deploy/kubernetes in namespace ns ("" for the
// manifest's own).
func (c *cluster) apply(ns, name string) error {
	m, err := manifest(name)
	if err != nil {
		return err
	}
	args := []string{"apply", "-f", "-"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	_, err = c.kubectlErr(m, args...)
	return err
}

// deployIssuer applies issuer.yaml as its header says: the manifest, a signing key, a serving
// certificate for grant-issuer.fiberd-system.svc; then waits for the Deployment.
func (c *cluster) deployIssuer(ctx context.Context) error {
	if err := c.apply("", "issuer.yaml"); err != nil {
		return err
	}
	key := filepath.Join(c.work, "key.jwk")
	if out, err := exec.CommandContext(ctx, filepath.Join(c.images, "bin", "grant-issuer"), "keygen", "-out", key).CombinedOutput(); err != nil {
		return fmt.Errorf("grant-issuer keygen: %v\n%s", err, out)
	}
	crt, k, err := c.issuerCA.files(c.work, "issuer", false, "grant-issuer.fiberd-system.svc", "grant-issuer.fiberd-system.svc.cluster.local")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.work, "issuer-ca.crt"), c.issuerCA.certPEM, 0o644); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-n", issuerNamespace, "create", "secret", "generic", "grant-issuer-key", "--from-file=key.jwk=" + key},
		{"-n", issuerNamespace, "create", "secret", "tls", "grant-issuer-tls", "--cert=" + crt, "--key=" + k},
		{"-n", issuerNamespace, "rollout", "status", "deployment/grant-issuer", "--timeout=3m"},
	} {
		if _, err := c.kubectlErr("", args...); err != nil {
			return err
		}
	}
	return nil
}

// grantNamespace makes namespace ns ready for grant Pods as docs/kubernetes.md tells a user:
// rbac.yaml, service.yaml, the issuer's CA, fiberd's API certificate (for fiberd.NS.svc, with the
// client CA) and, for the suite's callers, a client certificate (fiberd-client-tls).
func (c *cluster) grantNamespace(t *testing.T, ns string) {
	t.Helper()
	c.kubectl(t, "", "create", "namespace", ns)
	for _, m := range []string{"rbac.yaml", "service.yaml"} {
		if err := c.apply(ns, m); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	apiCrt, apiKey, err := c.apiCA.files(dir, "api", false, "fiberd."+ns+".svc")
	if err != nil {
		t.Fatal(err)
	}
	cliCrt, cliKey, err := c.clientCA.files(dir, "client", true, "")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	clientCA := write("client-ca.crt", c.clientCA.certPEM)
	apiCA := write("api-ca.crt", c.apiCA.certPEM)
	c.kubectl(t, "", "-n", ns, "create", "configmap", "grant-issuer-ca", "--from-file=ca.crt="+filepath.Join(c.work, "issuer-ca.crt"))
	c.kubectl(t, "", "-n", ns, "create", "secret", "generic", "fiberd-api-tls",
		"--from-file=tls.crt="+apiCrt, "--from-file=tls.key="+apiKey, "--from-file=client-ca.crt="+clientCA)
	c.kubectl(t, "", "-n", ns, "create", "secret", "generic", "fiberd-client-tls",
		"--from-file=tls.crt="+cliCrt, "--from-file=tls.key="+cliKey, "--from-file=ca.crt="+apiCA)
}

// ------------------------------------------------------------------------------------ Pods

func (c *cluster) ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitPod polls the Pod until cond holds, failing t after within with cond's last word and
// the Pod's events.
func (c *cluster) waitPod(t testing.TB, ns, name string, within time.Duration, what string, cond func(*corev1.Pod) (bool, string)) *corev1.Pod {
	t.Helper()
	end := time.Now().Add(within)
	var last string
	for {
		p, err := c.cs.CoreV1().Pods(ns).Get(c.ctx(t, 30*time.Second), name, metav1.GetOptions{})
		switch {
		case err == nil:
			ok, why := cond(p)
			if ok {
				return p
			}
			last = why
		case apierrors.IsNotFound(err):
			last = "no such Pod"
		default:
			last = err.Error()
		}
		if time.Now().After(end) {
			ev, _ := c.kubectlErr("", "-n", ns, "get", "events", "--sort-by=.lastTimestamp")
			logs, _ := c.kubectlErr("", "-n", ns, "logs", "--tail=40", name)
			t.Fatalf("after %v: Pod %s/%s: %s: %s\nevents:\n%s\nits logs (the last 40 lines):\n%s", within, ns, name, what, last, ev, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func isTrue(p *corev1.Pod, typ corev1.PodConditionType) bool {
	c := condition(p, typ)
	return c != nil && c.Status == corev1.ConditionTrue
}

// containerStarted reports whether the Pod's one container is running (ready or not).
func containerStarted(p *corev1.Pod) bool {
	return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
}

func podReady(p *corev1.Pod) (bool, string) {
	if isTrue(p, corev1.PodReady) {
		return true, ""
	}
	return false, fmt.Sprintf("phase %s, conditions %s", p.Status.Phase, conditions(p))
}

func conditions(p *corev1.Pod) string {
	var b strings.Builder
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s(%s) ", c.Type, c.Status, c.Reason)
	}
	return b.String()
}

// grantPod is a running grant Pod as the host sees it.
type grantPod struct {
	ns, uid, ip string
	containerID string
	hostPID     int // fiberd's pid on the host
	restarts    int32
}

// readGrantPod reads the Pod's UID, IP, container and fiberd's host pid; the Pod must run.
func (c *cluster) readGrantPod(t testing.TB, p *corev1.Pod) *grantPod {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].ContainerID == "" {
		t.Fatalf("Pod %s/%s has no running container: %+v", p.Namespace, p.Name, p.Status.ContainerStatuses)
	}
	cs := p.Status.ContainerStatuses[0]
	g := &grantPod{ns: p.Namespace, uid: string(p.UID), ip: p.Status.PodIP, restarts: cs.RestartCount,
		containerID: strings.TrimPrefix(cs.ContainerID, "containerd://")}
	g.hostPID = c.taskPID(t, g.containerID)
	return g
}

// taskPID is the host pid of a container's process, from the node's containerd.
func (c *cluster) taskPID(t testing.TB, containerID string) int {
	t.Helper()
	out, err := exec.Command("ctr", "--address", filepath.Join(c.node.Dir(), "containerd.sock"), "-n", "k8s.io", "tasks", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr tasks ls: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == containerID && f[2] == "RUNNING" {
			pid, _ := strconv.Atoi(f[1])
			return pid
		}
	}
	t.Fatalf("container %s has no running task:\n%s", containerID, out)
	return 0
}

// agent is a client of fiberd's unix socket in the container, reached through its root.
func (g *grantPod) agent(t testing.TB) *client.Client {
	t.Helper()
	cl, err := client.New(client.Config{Addr: fmt.Sprintf("unix:///proc/%d/root/var/lib/fiberd/state/fiberd.sock", g.hostPID), Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// stateDir is the Pod's state emptyDir on the host; fiberd's -state is its
// state/ directory, the grants directory its grants/.
func (c *cluster) stateDir(uid string) string {
	return filepath.Join(c.node.Dir(), "kubelet", "pods", uid, "volumes", "kubernetes.io~empty-dir", "state")
}

// logs is the Pod's log (previous: the container run before the current one).
func (c *cluster) logs(t testing.TB, ns, name string, previous bool) string {
	t.Helper()
	b, err := c.cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Previous: previous}).DoRaw(c.ctx(t, 30*time.Second))
	if err != nil {
		t.Fatalf("logs of %s/%s: %v", ns, name, err)
	}
	return string(b)
}

// waitServiceAccount waits for the namespace's "default" ServiceAccount, which the controller
// manager creates, so Pods that name none are admitted.
func (c *cluster) waitServiceAccount(t testing.TB, ns string) {
	t.Helper()
	for end := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		_, err := c.cs.CoreV1().ServiceAccounts(ns).Get(c.ctx(t, 30*time.Second), "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no default ServiceAccount in %s after a minute: %v", ns, err)
		}
	}
}

// Cycle is a line test/node/client prints.
type Cycle struct {
	N           int     `json:"n"`
	FiberID     string  `json:"fiberID"`
	Endpoint    string  `json:"endpoint"`
	Body        string  `json:"body"`
	CloneMs     float64 `json:"cloneMs"`
	FirstByteMs float64 `json:"firstByteMs"`
	Error       string  `json:"error"`
	Stage       string  `json:"stage"` // the step that failed: clone, get or release
	Pod         string  `json:"pod"`   // the grant Pod that served, in the client's -pool mode
}

// runClient runs test/node/client in a Pod of namespace ns against grant Pod g for n cycles
// and returns its lines; the Pod must succeed.
func (c *cluster) runClient(t *testing.T, g *grantPod, name string, n int, keep bool) []Cycle {
	t.Helper()
	out := c.runPod(t, g.ns, name, clientImage, nil, []string{"-addr=https://" + g.ip + ":8484", "-server-name=fiberd." + g.ns + ".svc",
		"-tls-cert=/tls/tls.crt", "-tls-key=/tls/tls.key", "-ca=/tls/ca.crt",
		"-grant-uid=" + g.uid, "-n=" + strconv.Itoa(n), "-keep=" + strconv.FormatBool(keep)})
	var cycles []Cycle
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var cy Cycle
		if err := json.Unmarshal([]byte(line), &cy); err != nil {
			t.Fatalf("client printed %q: %v", line, err)
		}
		cycles = append(cycles, cy)
	}
	if len(cycles) != n {
		t.Fatalf("client printed %d cycles, want %d:\n%s", len(cycles), n, out)
	}
	return cycles
}

// runPod runs a Pod of image (command and args as given) in namespace ns, as user 65532 with
// the client certificate of grantNamespace at /tls, until it ends, and returns its log; it must
// succeed.
func (c *cluster) runPod(t *testing.T, ns, name, image string, command, args []string) string {
	t.Helper()
	c.waitServiceAccount(t, ns)
	no := false
	uid := int64(65532)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			SecurityContext:              &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: ptr(true)},
			Containers: []corev1.Container{{
				Name: "client", Image: image, ImagePullPolicy: corev1.PullNever, Command: command, Args: args,
				VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "fiberd-client-tls", DefaultMode: ptr(int32(0o444)),
			}}}},
		},
	}
	if _, err := c.cs.CoreV1().Pods(ns).Create(c.ctx(t, 30*time.Second), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := c.waitPod(t, ns, name, waitPod, "the Pod finished", func(p *corev1.Pod) (bool, string) {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, string(p.Status.Phase)
	})
	out := c.logs(t, ns, name, false)
	if p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("Pod %s %s:\n%s", name, p.Status.Phase, out)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// ------------------------------------------------------------------------------------ PKI

// authority is a throw-away CA issuing P-256 certificates.
type authority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

var serial struct {
	sync.Mutex
	n int64
}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	return big.NewInt(serial.n + 100)
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "fiberd e2e-node CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// files issues a certificate (a client one when client, else a server one for dns) into
// dir/name.crt and dir/name.key and returns their paths.
func (a *authority) files(dir, name string, client bool, dns ...string) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, d := range dns {
			if d != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, d)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &k.PublicKey, a.key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	return crt, key, nil
}
