//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/template"
	"fiberd.io/fiberd/test/kubeapi"
)

// Names fixed by the manifests.
const (
	podName          = "grant-0"       // grant-pod.yaml
	fiberdAccount    = "fiberd"        // rbac.yaml
	issuerAccount    = "grant-issuer"  // issuer.yaml
	issuerNamespace  = "fiberd-system" // issuer.yaml
	readinessGate    = "fiberd.io/zygote-ready"
	reasonWarm       = "TemplateWarm"
	annTemplate      = "fiberd.io/template"
	annFibersMax     = "fiberd.io/fibers-max"
	templateName     = "counter"
	waitLong         = 90 * time.Second
	defaultStaleTTL  = 6 * time.Second
	defaultLease     = 10 * time.Minute
	processStopGrace = 15 * time.Second
)

// ------------------------------------------------------------------------------------ binaries

var binaries struct {
	once sync.Once
	dir  string
	err  error
}

// bin builds fiberd, fiberctl and grant-issuer once per test binary and returns the path of name.
// Building happens on first use, after the test has its control plane, so a run that skips for
// missing kube binaries builds nothing.
func bin(t testing.TB, name string) string {
	t.Helper()
	binaries.once.Do(func() {
		dir, err := os.MkdirTemp("", "fiberd-e2e-bin-")
		if err != nil {
			binaries.err = err
			return
		}
		binaries.dir = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/fiberd", "./cmd/fiberctl", "./cmd/grant-issuer")
		cmd.Dir = repotest.Root(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			binaries.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binaries.err != nil {
		t.Fatalf("building the commands: %v", binaries.err)
	}
	return filepath.Join(binaries.dir, name)
}

// ----------------------------------------------------------------------------------- manifests

// manifest reads deploy/kubernetes/<name> into typed objects, in file order.
func manifest(t testing.TB, name string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repotest.Root(t), "deploy", "kubernetes", name))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var objs []runtime.Object
	for {
		var ext runtime.RawExtension
		if err := dec.Decode(&ext); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(bytes.TrimSpace(ext.Raw)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(ext.Raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		t.Fatalf("%s holds no object", name)
	}
	return objs
}

// placement says where apply puts the objects of a manifest.
type placement struct {
	// namespace is where objects without one go.
	namespace string
	// namespaces renames namespaces the manifest names (issuer.yaml's fiberd-system), in
	// Namespace objects, metadata.namespace and binding subjects.
	namespaces map[string]string
	// suffix is appended to the names of cluster-scoped RBAC objects, so tests sharing a
	// control plane do not collide; references to them follow.
	suffix string
	// edit changes an object before it is created; it may drop it by returning false.
	edit func(obj runtime.Object) bool
}

func (p placement) ns(n string) string {
	if n == "" {
		return p.namespace
	}
	if m, ok := p.namespaces[n]; ok {
		return m
	}
	return n
}

// apply creates the objects with the admin client. Every kind the manifests use is handled; a new
// kind fails the test, so no manifest can hold an object the suite does not create.
func apply(t testing.TB, env *kubeapi.Env, objs []runtime.Object, p placement) []runtime.Object {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	renamed := map[string]string{}
	for _, o := range objs {
		if cr, ok := o.(*rbacv1.ClusterRole); ok {
			renamed[cr.Name] = cr.Name + "-" + p.suffix
		}
	}
	subjects := func(ss []rbacv1.Subject) {
		for i := range ss {
			if ss[i].Kind == rbacv1.ServiceAccountKind {
				ss[i].Namespace = p.ns(ss[i].Namespace)
			}
		}
	}
	roleRef := func(r *rbacv1.RoleRef) {
		if r.Kind == "ClusterRole" {
			if n, ok := renamed[r.Name]; ok {
				r.Name = n
			}
		}
	}
	a := env.Admin
	var created []runtime.Object
	for _, o := range objs {
		o = o.DeepCopyObject()
		if p.edit != nil && !p.edit(o) {
			continue
		}
		var err error
		switch x := o.(type) {
		case *corev1.Namespace:
			x.Name = p.ns(x.Name)
			_, err = a.CoreV1().Namespaces().Create(ctx, x, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			x.Namespace = p.ns(x.Namespace)
			_, err = a.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *corev1.Service:
			x.Namespace = p.ns(x.Namespace)
			_, err = a.CoreV1().Services(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *corev1.Pod:
			x.Namespace = p.ns(x.Namespace)
			var got *corev1.Pod
			got, err = a.CoreV1().Pods(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
			if err == nil {
				o = got
			}
		case *appsv1.Deployment:
			x.Namespace = p.ns(x.Namespace)
			_, err = a.AppsV1().Deployments(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *networkingv1.NetworkPolicy:
			x.Namespace = p.ns(x.Namespace)
			_, err = a.NetworkingV1().NetworkPolicies(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.Role:
			x.Namespace = p.ns(x.Namespace)
			_, err = a.RbacV1().Roles(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			x.Namespace = p.ns(x.Namespace)
			subjects(x.Subjects)
			roleRef(&x.RoleRef)
			_, err = a.RbacV1().RoleBindings(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			x.Name = renamed[x.Name]
			_, err = a.RbacV1().ClusterRoles().Create(ctx, x, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			x.Name = x.Name + "-" + p.suffix
			subjects(x.Subjects)
			roleRef(&x.RoleRef)
			_, err = a.RbacV1().ClusterRoleBindings().Create(ctx, x, metav1.CreateOptions{})
		default:
			t.Fatalf("apply: the suite does not know how to create a %T; teach apply", o)
		}
		if err != nil {
			t.Fatalf("apply %T: %v", o, err)
		}
		created = append(created, o)
	}
	return created
}

// -------------------------------------------------------------------------------------- TLS

// issuerPKI is a throw-away CA and a serving certificate for 127.0.0.1.
type issuerPKI struct {
	caFile, certFile, keyFile string
}

func newIssuerPKI(t testing.TB, dir string) issuerPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fiberd-e2e issuer CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "grant-issuer"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := issuerPKI{
		caFile: filepath.Join(dir, "ca.crt"), certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"),
	}
	write := func(path, typ string, der []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.caFile, "CERTIFICATE", caDER)
	write(p.certFile, "CERTIFICATE", leafDER)
	write(p.keyFile, "EC PRIVATE KEY", keyDER)
	return p
}

// freePort is a TCP port on 127.0.0.1 nothing listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeKubeconfig writes a kubeconfig that authenticates with token only (no client
// certificate), as a Pod's in-cluster configuration does, and returns its path.
func writeKubeconfig(t testing.TB, dir, name string, cp *kubeapi.ControlPlane, token string) string {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: %s
current-context: e2e
`, cp.URL(), base64.StdEncoding.EncodeToString(cp.CAData()), name, token, name)
	p := filepath.Join(dir, name+".kubeconfig")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ------------------------------------------------------------------------------------ processes

// proc is a command the suite started, its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // Wait's, once done is closed
}

// start runs the command in a process group of its own, output to dir/<name>.log; t.Cleanup
// stops it (SIGTERM, then SIGKILL of its group) and, when t failed, prints the log's tail.
func start(t testing.TB, dir, name string, env []string, path string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("---- last lines of %s (%s):\n%s", name, logPath, tail(logPath, 60))
		}
	})
	return p
}

// stop ends the process: SIGTERM, up to processStopGrace, then SIGKILL of its whole group. It
// returns once the process is gone and reports how it ended.
func (p *proc) stop(t testing.TB) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(processStopGrace):
		t.Errorf("%s ignored SIGTERM for %v; killing its process group", p.name, processStopGrace)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return p.err
}

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// output is the process's log so far.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// gone reports whether pid has exited (no such process, or a zombie awaiting its reaper).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// ----------------------------------------------------------------------------------- waiting

// eventually polls cond every 200 ms until it holds or within passes; the failure names what and
// cond's last word.
func eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s: %s", within, what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ------------------------------------------------------------------------------------- the rig

// rigOpts shapes one grant Pod with its issuer and fiberd.
type rigOpts struct {
	// cp is the control plane; nil means the test binary's shared one.
	cp *kubeapi.ControlPlane
	// podIP is the Pod's IP, 127.0.0.x. Required.
	podIP string
	// lease is the issuer's -lease. Zero means defaultLease.
	lease time.Duration
	// fibersMax is the Pod's fiberd.io/fibers-max. Zero means 4.
	fibersMax int
	// staleTTL is fiberd's -stale-ttl. Zero means defaultStaleTTL.
	staleTTL time.Duration
	// claim, when set, is a ResourceClaim created and named in the Pod's spec.resourceClaims.
	claim string
	// dropRule, when set ("pods/status"), removes that resource from rbac.yaml's Role.
	dropRule string
	// noGrantYet leaves the Pod without its grant annotations, as a controller that has not
	// assigned a grant yet.
	noGrantYet bool
	// beforeServe, when set, runs once fiberd started and before the rig waits for its socket.
	beforeServe func(r *rig)
}

// rig is one grant Pod on the API server with its issuer and its fiberd running.
type rig struct {
	t         testing.TB
	opts      rigOpts
	env       *kubeapi.Env
	dir       string
	pod       *corev1.Pod
	issuerURL string
	issuerNS  string
	pki       issuerPKI
	issuer    *proc
	fiberd    *proc
	state     string
	socket    string
	client    *client.Client
	tplRef    string
}

// newRig applies the manifests, creates the grant Pod, plays the kubelet (Pod IP, bound token),
// starts the issuer and fiberd, and waits until fiberd answers on its socket.
func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	if o.lease == 0 {
		o.lease = defaultLease
	}
	if o.fibersMax == 0 {
		o.fibersMax = 4
	}
	if o.staleTTL == 0 {
		o.staleTTL = defaultStaleTTL
	}
	cp := o.cp
	if cp == nil {
		cp = kubeapi.Shared(t)
	}
	python := requirePython(t)
	r := &rig{t: t, opts: o, env: cp.NewEnv(t)}
	// Short: fiberd binds unix sockets under it.
	dir, err := os.MkdirTemp("", "e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r.dir = dir
	r.issuerURL = fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	r.tplRef = writeTemplate(t, filepath.Join(dir, "templates"), python)

	// The grant Pods' NetworkPolicy: the API server takes it as written
	// (nothing here enforces it).
	apply(t, r.env, manifest(t, "networkpolicy.yaml"), placement{namespace: r.env.Namespace, suffix: r.env.Namespace})

	// fiberd's ServiceAccount and RBAC (rbac.yaml), in the Pod's namespace.
	apply(t, r.env, manifest(t, "rbac.yaml"), placement{
		namespace: r.env.Namespace, suffix: r.env.Namespace,
		edit: func(obj runtime.Object) bool {
			if role, ok := obj.(*rbacv1.Role); ok && o.dropRule != "" {
				var rules []rbacv1.PolicyRule
				for _, rule := range role.Rules {
					var res []string
					for _, x := range rule.Resources {
						if x != o.dropRule {
							res = append(res, x)
						}
					}
					if len(res) > 0 {
						rule.Resources = res
						rules = append(rules, rule)
					}
				}
				role.Rules = rules
			}
			return true
		},
	})
	// The issuer's Namespace, ServiceAccount, RBAC, Deployment and Service (issuer.yaml), in a
	// namespace of the test's own.
	r.issuerNS = "issuer-" + randomHex(t, 4)
	apply(t, r.env, manifest(t, "issuer.yaml"), placement{
		namespace: r.issuerNS, namespaces: map[string]string{issuerNamespace: r.issuerNS}, suffix: r.env.Namespace,
	})
	// The grant Pod (grant-pod.yaml), as the controller would make it for this test: bound to a
	// node, naming this test's issuer and template.
	if o.claim != "" {
		r.env.CreateResourceClaim(t, o.claim)
	}
	created := apply(t, r.env, manifest(t, "grant-pod.yaml"), placement{
		namespace: r.env.Namespace,
		edit: func(obj runtime.Object) bool {
			pod := obj.(*corev1.Pod)
			r.editPod(pod)
			return true
		},
	})
	r.pod = created[0].(*corev1.Pod)
	// The kubelet's part: the Pod's IP, then the Pod's bound token for the issuer's audience.
	r.env.SetPodIPs(t, podName, o.podIP)
	grantToken := r.env.Token(t, fiberdAccount, kubeapi.TokenOptions{
		Pod: r.pod, Audiences: []string{r.issuerURL}, Expiration: 10 * time.Minute,
	})
	tokenFile := filepath.Join(dir, "grant-token")
	if err := os.WriteFile(tokenFile, []byte(grantToken), 0o600); err != nil {
		t.Fatal(err)
	}

	r.pki = newIssuerPKI(t, dir)
	r.startIssuer()

	// fiberd's access to the API server: a token of the Pod's own service account (audience the
	// API server), not bound to the Pod, so the agent keeps reading the cluster after its Pod is
	// deleted or replaced under it, which is what the scope-loss checks look at.
	kubeconfig := writeKubeconfig(t, dir, "fiberd", cp, r.env.Token(t, fiberdAccount, kubeapi.TokenOptions{}))
	r.state = filepath.Join(dir, "state")
	r.socket = filepath.Join(r.state, "fiberd.sock")
	args := []string{
		"-home=kubernetes",
		// The checks read fibers' host pids and park them: fibers here run as fiberd, unisolated
		// (isolation fiber, the default, is make e2e-node's, in a grant Pod).
		"-isolation=none",
		"-listen=",
		"-socket=" + r.socket,
		"-state=" + r.state,
		"-run-dir=" + filepath.Join(dir, "run"),
		"-grants-dir=" + filepath.Join(r.state, "grants"),
		"-templates=" + filepath.Join(dir, "templates"),
		"-endpoint-family=inet4",
		"-cgroup-root=" + testCgroup(t),
		"-stale-ttl=" + o.staleTTL.String(),
		"-kubeconfig=" + kubeconfig,
		"-issuer=" + r.issuerURL,
		"-grant-issuer-url=" + r.issuerURL,
		"-grant-token-file=" + tokenFile,
		"-grant-ca-file=" + r.pki.caFile,
	}
	// The downward API of grant-pod.yaml. Key discovery trusts
	// -grant-ca-file, as the issuer is the controller.
	env := []string{
		"POD_NAME=" + r.pod.Name, "POD_NAMESPACE=" + r.pod.Namespace, "POD_UID=" + string(r.pod.UID),
	}
	r.fiberd = start(t, dir, "fiberd", env, bin(t, "fiberd"), args...)
	if o.beforeServe != nil {
		o.beforeServe(r)
	}
	r.client, err = client.New(client.Config{Addr: "unix://" + r.socket, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, waitLong, "fiberd answers /healthz on its socket", func() (bool, string) {
		if !r.fiberd.alive() {
			t.Fatalf("fiberd exited: %v\n%s", r.fiberd.err, tail(r.fiberd.log, 40))
		}
		err := r.client.Healthz(context.Background())
		return err == nil, fmt.Sprint(err)
	})
	return r
}

// editPod turns grant-pod.yaml's Pod into this test's: the template and fibers.max annotations
// (the controller's), the issuer URL as the projected token's audience and in the arguments, the
// node (the scheduler's) and a ResourceClaim when asked for.
func (r *rig) editPod(pod *corev1.Pod) {
	t := r.t
	if pod.Name != podName {
		t.Fatalf("grant-pod.yaml names Pod %q, the suite expects %q", pod.Name, podName)
	}
	pod.Annotations[annTemplate] = r.tplRef
	pod.Annotations[annFibersMax] = strconv.Itoa(r.opts.fibersMax)
	if r.opts.noGrantYet {
		delete(pod.Annotations, annTemplate)
		delete(pod.Annotations, annFibersMax)
	}
	pod.Spec.NodeName = kubeapi.DefaultNode
	for i := range pod.Spec.Volumes {
		if pr := pod.Spec.Volumes[i].Projected; pr != nil {
			for j := range pr.Sources {
				if sat := pr.Sources[j].ServiceAccountToken; sat != nil {
					sat.Audience = r.issuerURL
				}
			}
		}
	}
	c := &pod.Spec.Containers[0]
	for i, a := range c.Args {
		for _, f := range []string{"-issuer=", "-grant-issuer-url="} {
			if strings.HasPrefix(a, f) {
				c.Args[i] = f + r.issuerURL
			}
		}
	}
	if r.opts.claim != "" {
		claim := r.opts.claim
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "dev", ResourceClaimName: &claim})
	}
}

// startIssuer starts grant-issuer serve with the issuer's own service account.
func (r *rig) startIssuer() {
	t := r.t
	keyFile := filepath.Join(r.dir, "issuer-key.jwk")
	if _, err := os.Stat(keyFile); err != nil {
		out, err := exec.Command(bin(t, "grant-issuer"), "keygen", "-out", keyFile).CombinedOutput()
		if err != nil {
			t.Fatalf("grant-issuer keygen: %v\n%s", err, out)
		}
	}
	kc := filepath.Join(r.dir, "grant-issuer.kubeconfig")
	if _, err := os.Stat(kc); err != nil {
		kc = writeKubeconfig(t, r.dir, "grant-issuer", r.env.CP, r.tokenIn(r.issuerNS, issuerAccount))
	}
	port := strings.TrimPrefix(r.issuerURL, "https://127.0.0.1:")
	r.issuer = start(t, r.dir, "grant-issuer", nil, bin(t, "grant-issuer"), "serve",
		"-listen=127.0.0.1:"+port, "-issuer="+r.issuerURL, "-key="+keyFile,
		"-tls-cert="+r.pki.certFile, "-tls-key="+r.pki.keyFile, "-kubeconfig="+kc, "-lease="+r.opts.lease.String())
	hc := r.httpsClient()
	eventually(t, 30*time.Second, "the issuer answers /healthz", func() (bool, string) {
		if !r.issuer.alive() {
			t.Fatalf("grant-issuer exited: %v\n%s", r.issuer.err, tail(r.issuer.log, 40))
		}
		resp, err := hc.Get(r.issuerURL + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
}

// tokenIn mints an unbound token of a ServiceAccount in namespace ns.
func (r *rig) tokenIn(ns, account string) string {
	e := *r.env
	e.Namespace = ns
	return e.Token(r.t, account, kubeapi.TokenOptions{})
}

func (r *rig) httpsClient() *http.Client {
	pool := x509.NewCertPool()
	b, err := os.ReadFile(r.pki.caFile)
	if err != nil {
		r.t.Fatal(err)
	}
	pool.AppendCertsFromPEM(b)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = pool
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// requirePython finds the real python3 executable (not a shim), or skips.
func requirePython(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("python3 is needed for the example template: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// writeTemplate writes the spec of the Python counter example of this checkout into dir and
// returns the grant's reference to it, name@sha256:<digest>.
func writeTemplate(t testing.TB, dir, python string) string {
	t.Helper()
	root := repotest.Root(t)
	spec := map[string]any{
		"command": python,
		"args":    []string{filepath.Join(root, "examples", "templates", "python", "counter.py")},
		"env":     map[string]string{"PYTHONPATH": filepath.Join(root, "sdk", "zygote", "python"), "PYTHONUNBUFFERED": "1"},
		"zygote":  true,
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, templateName+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return templateName + "@sha256:" + template.Digest(b)
}

// ------------------------------------------------------------------------------ fiberd queries

func (r *rig) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	r.t.Cleanup(cancel)
	return ctx
}

func (r *rig) status() api.Status {
	r.t.Helper()
	st, err := r.client.Status(r.ctx())
	if err != nil {
		r.t.Fatalf("status: %v", err)
	}
	return st
}

// podGrant is the status of the Pod's own grant, if admitted.
func (r *rig) podGrant() (api.GrantStatus, bool) {
	for _, g := range r.status().Grants {
		if g.UID == string(r.pod.UID) {
			return g, true
		}
	}
	return api.GrantStatus{}, false
}

// waitWarm waits for the Pod's grant to be admitted with its template warm.
func (r *rig) waitWarm() {
	r.t.Helper()
	eventually(r.t, waitLong, "the Pod's grant admitted and its template warm", func() (bool, string) {
		g, ok := r.podGrant()
		if !ok {
			return false, fmt.Sprintf("no grant %s in %+v", r.pod.UID, r.status().Grants)
		}
		return g.Warm, fmt.Sprintf("grant %+v", g)
	})
}

// grantFile is the Pod's grant as fetched, and its iat and exp.
func (r *rig) grantFile() (tok []byte, iat, exp time.Time) {
	r.t.Helper()
	tok, err := os.ReadFile(filepath.Join(r.state, "grants", string(r.pod.UID)+".jwt"))
	if err != nil {
		return nil, time.Time{}, time.Time{}
	}
	parts := strings.Split(strings.TrimSpace(string(tok)), ".")
	if len(parts) != 3 {
		r.t.Fatalf("grant file is not a compact JWS: %q", tok)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		r.t.Fatal(err)
	}
	var c struct {
		Iat int64 `json:"iat"`
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		r.t.Fatal(err)
	}
	return tok, time.Unix(c.Iat, 0), time.Unix(c.Exp, 0)
}

// fiber is one cloned fiber and the process that answered on its endpoint.
type fiber struct {
	id       string
	endpoint string
	pid      int
}

var pidRE = regexp.MustCompile(`\bpid=(\d+)`)

// clone asks fiberd for a fiber of the Pod's grant by its UID with fiberctl, and checks the
// fiber answers HTTP on the Pod's IP.
func (r *rig) clone() fiber {
	r.t.Helper()
	resp, err := r.fiberctlClone()
	if err != nil {
		r.t.Fatalf("fiberctl clone: %v", err)
	}
	return r.check(resp)
}

// fiberctlClone runs `fiberctl -addr unix://SOCK -o json clone -grant-uid UID`.
func (r *rig) fiberctlClone() (api.CloneResponse, error) {
	r.t.Helper()
	cmd := exec.Command(bin(r.t, "fiberctl"), "-addr", "unix://"+r.socket, "-o", "json", "clone", "-grant-uid", string(r.pod.UID))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return api.CloneResponse{}, fmt.Errorf("%v: %s%s", err, stdout.String(), stderr.String())
	}
	var resp api.CloneResponse
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return api.CloneResponse{}, fmt.Errorf("fiberctl -o json printed %q: %v", stdout.String(), err)
	}
	return resp, nil
}

// check GETs the fiber's endpoint, which must be on the Pod IP, and reads its pid.
func (r *rig) check(resp api.CloneResponse) fiber {
	r.t.Helper()
	host := strings.TrimPrefix(resp.Endpoint, "tcp://")
	if h, _, err := net.SplitHostPort(host); err != nil || h != r.opts.podIP {
		r.t.Fatalf("fiber %s endpoint %q is not on the Pod IP %s", resp.FiberID, resp.Endpoint, r.opts.podIP)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	var body string
	eventually(r.t, 20*time.Second, "the fiber answers HTTP on "+host, func() (bool, string) {
		res, err := hc.Get("http://" + host + "/")
		if err != nil {
			return false, err.Error()
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		body = string(b)
		return res.StatusCode == 200, res.Status + " " + body
	})
	if !strings.Contains(body, "fence="+resp.FiberID) {
		r.t.Errorf("fiber %s answered %q, without its fence", resp.FiberID, body)
	}
	m := pidRE.FindStringSubmatch(body)
	if m == nil {
		r.t.Fatalf("fiber %s answered %q, without its pid", resp.FiberID, body)
	}
	pid, _ := strconv.Atoi(m[1])
	return fiber{id: resp.FiberID, endpoint: resp.Endpoint, pid: pid}
}

// cloneErr is a Clone of the Pod's grant over the API, for misses.
func (r *rig) cloneErr() *client.Error {
	r.t.Helper()
	resp, err := r.client.Clone(r.ctx(), api.CloneRequest{GrantUID: string(r.pod.UID)})
	if err == nil {
		r.t.Fatalf("clone served %+v, want a miss", resp)
	}
	ce, ok := client.AsError(err)
	if !ok {
		r.t.Fatalf("clone: %v, want an API error", err)
	}
	return ce
}

// condition is the Pod's readiness-gate condition, read back through the API.
func (r *rig) condition() *corev1.PodCondition {
	pod := r.env.GetPod(r.t, podName)
	for i := range pod.Status.Conditions {
		if string(pod.Status.Conditions[i].Type) == readinessGate {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// assertEnded checks the fibers' ids answer 404 and their processes are gone.
func (r *rig) assertEnded(fibers []fiber) {
	r.t.Helper()
	for _, f := range fibers {
		err := r.client.Release(r.ctx(), f.id)
		ce, ok := client.AsError(err)
		if !ok || !ce.IsNotFound() || ce.Status != http.StatusNotFound {
			r.t.Errorf("release of old fiber %s = %v, want 404 NOT_FOUND", f.id, err)
		}
		eventually(r.t, 20*time.Second, fmt.Sprintf("process %d of fiber %s gone", f.pid, f.id), func() (bool, string) {
			return gone(f.pid), "still running"
		})
	}
}

// logHas reports whether fiberd's log has a line holding every word.
func (p *proc) logHas(words ...string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(p.output()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		ok := true
		for _, w := range words {
			if !strings.Contains(line, w) {
				ok = false
				break
			}
		}
		if ok {
			return line, true
		}
	}
	return "", false
}

// apiResponse is the Clone answer f came from, for check.
func apiResponse(f fiber) api.CloneResponse {
	return api.CloneResponse{FiberID: f.id, Endpoint: f.endpoint}
}

// testCgroup makes a cgroup v2 directory named after the test for fiberd's -cgroup-root, and
// removes it (killing what is left in it) in t.Cleanup. Register it before starting fiberd, so the
// removal runs after fiberd stopped. It skips when no writable cgroup2 mount exists.
func testCgroup(t testing.TB) string {
	t.Helper()
	mount := ""
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("cgroup v2 is needed: %v", err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			mount = f[4]
			break
		}
	}
	if mount == "" {
		t.Skip("cgroup v2 is needed: no cgroup2 mount in /proc/self/mountinfo")
	}
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	dir := filepath.Join(mount, "fiberd-e2e", name+"-"+randomHex(t, 3))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("a writable cgroup v2 mount is needed: %v", err)
	}
	t.Cleanup(func() { removeCgroup(t, dir) })
	return dir
}

// removeCgroup kills every process under dir and removes the tree, deepest first.
func removeCgroup(t testing.TB, dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		for try := 0; try < 50; try++ {
			if err = os.Remove(dirs[i]); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !os.IsNotExist(err) {
			t.Errorf("removing test cgroup %s: %v", dirs[i], err)
		}
	}
	_ = os.Remove(filepath.Dir(dir)) // fiberd-e2e, when no other test uses it
}
