package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
)

// Names fixed by deploy/kubernetes and hack/images.sh.
const (
	manifestImage   = "fiberd:dev"              // every manifest's image
	fiberdImage     = "fiberd.local/fiberd:dev" // hack/images.sh's build of it
	issuerNamespace = "fiberd-system"           // issuer.yaml
	grantPodName    = "grant-0"                 // grant-pod.yaml
	grantNamespace  = "bench-fiberd"
	fibersMaxLine   = `fiberd.io/fibers-max: "8"` // grant-pod.yaml's grant size
)

// grantPod is a Ready grant Pod and a client of its API on the Pod IP.
type grantPod struct {
	uid, ip string
	cl      *client.Client
}

// fiberdRow is fiberd as users deploy it on Kubernetes: deploy/kubernetes applied as
// docs/kubernetes.md says (the development issuer, a grant namespace, the grant Pod), only the
// image names and the grant's fibers.max (to fit the burst) changed. Each worker is a Clone
// through fiberd's API on the Pod IP (TLS 1.3 with a client certificate, from this host as
// another Pod would), timed until the fiber answers the first HTTP byte at the endpoint the
// Clone returned; released by Release.
func (e *nodeEnv) fiberdRow(ctx context.Context) NodeRow {
	row := NodeRow{Mode: modeNodeFiberd, What: "Clone through fiberd's API on the grant Pod's IP (mTLS), until the fiber answers the first HTTP byte; release: Release"}
	e.p.Phasef("%s: deploying the issuer and a grant Pod (deploy/kubernetes)", row.Mode)
	g, err := e.deployGrantPod(ctx)
	if err != nil {
		row.Note = "the grant Pod did not become Ready: " + err.Error()
		return row
	}
	defer e.removeGrantPod(ctx)
	start := func(ctx context.Context, name string) (nodeWorker, error) {
		t0 := time.Now()
		resp, err := g.cl.Clone(ctx, api.CloneRequest{GrantUID: g.uid})
		if err != nil {
			return nodeWorker{}, fmt.Errorf("clone: %w", err)
		}
		hostPort, ok := strings.CutPrefix(resp.Endpoint, "tcp://")
		if !ok {
			return nodeWorker{}, fmt.Errorf("fiber %s: endpoint %q is not tcp://host:port", resp.FiberID, resp.Endpoint)
		}
		d, err := firstByteWithin(ctx, hostPort, t0)
		if err != nil {
			return nodeWorker{}, fmt.Errorf("fiber %s: %w", resp.FiberID, err)
		}
		return nodeWorker{ms: Ms(d), podUID: g.uid, release: func(ctx context.Context) error { return g.cl.Release(ctx, resp.FiberID) }}, nil
	}
	memoryBefore := func(ctx context.Context) (any, error) {
		m, err := podPss([]string{g.uid})
		return m[g.uid], err
	}
	memoryAfter := func(ctx context.Context, before any, ws []nodeWorker) (NodeMemory, error) {
		b := before.(PodPss)
		m, err := podPss([]string{g.uid})
		if err != nil {
			return NodeMemory{}, err
		}
		a, n := m[g.uid], float64(len(ws))
		return NodeMemory{
			Workers:   len(ws),
			WorkerKiB: max(0, float64(a.Worker-b.Worker)) / n,
			PodKiB:    float64(b.Worker+b.Pause+b.Shim) / n,
			Note: fmt.Sprintf("the grant Pod without fibers (fiberd and the zygote %s MiB, pause and shim %s MiB) shared by the %d fibers; no Pod added, so no kubelet growth",
				num(float64(b.Worker)/1024), num(float64(b.Pause+b.Shim)/1024), len(ws)),
		}, nil
	}
	if err := e.runRow(ctx, &row, rowDriver{start: start, memoryBefore: memoryBefore, memoryAfter: memoryAfter}); err != nil {
		row.Measured, row.Note = false, err.Error()
		return row
	}
	row.Note = fmt.Sprintf("deploy/kubernetes as a user applies it: grant Pod, development issuer; the C template (counter.json, `%s`) warm in the grant Pod's zygote; grant fibers.max %d", strings.Join(e.spec.Args, " "), e.fibersMax())
	return row
}

// fibersMax is the grant's fibers.max: the burst fits in it.
func (e *nodeEnv) fibersMax() int { return max(8, e.o.nodeBurst+4) }

// manifest is deploy/kubernetes/<name> with the image names substituted.
func (e *nodeEnv) manifest(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(e.root, "deploy", "kubernetes", name))
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(b), "image: "+manifestImage+"\n", "image: "+fiberdImage+"\n"), nil
}

// deployGrantPod applies issuer.yaml, prepares a grant namespace and applies grant-pod.yaml in
// it, as the manifests' headers say, and waits until the grant Pod is Ready (its template
// warm).
func (e *nodeEnv) deployGrantPod(ctx context.Context) (*grantPod, error) {
	dir := filepath.Join(e.work, "grant")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	issuerCA, err := newAuthority("bench issuer CA")
	if err != nil {
		return nil, err
	}
	apiCA, err := newAuthority("bench fiberd API CA")
	if err != nil {
		return nil, err
	}
	clientCA, err := newAuthority("bench client CA")
	if err != nil {
		return nil, err
	}
	m, err := e.manifest("issuer.yaml")
	if err != nil {
		return nil, err
	}
	if _, err := e.kubectl(ctx, m, "apply", "-f", "-"); err != nil {
		return nil, err
	}
	key := filepath.Join(dir, "key.jwk")
	if out, err := execOut(ctx, filepath.Join(e.images, "bin", "grant-issuer"), "keygen", "-out", key); err != nil {
		return nil, fmt.Errorf("grant-issuer keygen: %w\n%s", err, out)
	}
	icrt, ikey, err := issuerCA.issue(dir, "issuer", "grant-issuer.fiberd-system.svc", "grant-issuer.fiberd-system.svc.cluster.local")
	if err != nil {
		return nil, err
	}
	acrt, akey, err := apiCA.issue(dir, "api", "fiberd."+grantNamespace+".svc")
	if err != nil {
		return nil, err
	}
	ccrt, ckey, err := clientCA.issue(dir, "client")
	if err != nil {
		return nil, err
	}
	files := map[string]*authority{"issuer-ca.crt": issuerCA, "api-ca.crt": apiCA, "client-ca.crt": clientCA}
	for name, a := range files {
		if err := a.writeCA(filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	if err := e.namespace(ctx, grantNamespace); err != nil {
		return nil, err
	}
	for _, name := range []string{"rbac.yaml", "service.yaml"} {
		m, err := e.manifest(name)
		if err != nil {
			return nil, err
		}
		if _, err := e.kubectl(ctx, m, "-n", grantNamespace, "apply", "-f", "-"); err != nil {
			return nil, err
		}
	}
	for _, args := range [][]string{
		{"-n", issuerNamespace, "create", "secret", "generic", "grant-issuer-key", "--from-file=key.jwk=" + key},
		{"-n", issuerNamespace, "create", "secret", "tls", "grant-issuer-tls", "--cert=" + icrt, "--key=" + ikey},
		{"-n", grantNamespace, "create", "configmap", "grant-issuer-ca", "--from-file=ca.crt=" + filepath.Join(dir, "issuer-ca.crt")},
		{"-n", grantNamespace, "create", "secret", "generic", "fiberd-api-tls", "--from-file=tls.crt=" + acrt, "--from-file=tls.key=" + akey,
			"--from-file=client-ca.crt=" + filepath.Join(dir, "client-ca.crt")},
		{"-n", issuerNamespace, "rollout", "status", "deployment/grant-issuer", "--timeout=3m"},
	} {
		if _, err := e.kubectl(ctx, "", args...); err != nil {
			return nil, err
		}
	}
	gm, err := e.manifest("grant-pod.yaml")
	if err != nil {
		return nil, err
	}
	if !strings.Contains(gm, fibersMaxLine) {
		return nil, fmt.Errorf("deploy/kubernetes/grant-pod.yaml has no %s to raise to the burst", fibersMaxLine)
	}
	gm = strings.Replace(gm, fibersMaxLine, fmt.Sprintf(`fiberd.io/fibers-max: "%d"`, e.fibersMax()), 1)
	if _, err := e.kubectl(ctx, gm, "-n", grantNamespace, "apply", "-f", "-"); err != nil {
		return nil, err
	}
	var pod *corev1.Pod
	if err := waitForEvery(ctx, 3*time.Minute, 100*time.Millisecond, func() (bool, error) {
		p, err := e.kc.cs.CoreV1().Pods(grantNamespace).Get(ctx, grantPodName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		ev, _ := e.kubectl(ctx, "", "-n", grantNamespace, "get", "events", "--sort-by=.lastTimestamp")
		logs, _ := e.kubectl(ctx, "", "-n", grantNamespace, "logs", grantPodName, "--tail=20")
		return nil, fmt.Errorf("grant Pod %s/%s not Ready: %w\nevents:\n%s\nlog:\n%s", grantNamespace, grantPodName, err, ev, logs)
	}
	tlsCfg, err := client.TLSConfig(ccrt, ckey, filepath.Join(dir, "api-ca.crt"))
	if err != nil {
		return nil, err
	}
	tlsCfg.ServerName = "fiberd." + grantNamespace + ".svc"
	cl, err := client.New(client.Config{Addr: "https://" + net.JoinHostPort(pod.Status.PodIP, "8484"), TLS: tlsCfg, Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	return &grantPod{uid: string(pod.UID), ip: pod.Status.PodIP, cl: cl}, nil
}

// removeGrantPod deletes the grant namespace and the issuer's, and waits until they are gone, so
// the next rows' idle windows count none of their writes (the issuer's TokenReviews on renewal).
func (e *nodeEnv) removeGrantPod(ctx context.Context) {
	if _, err := e.kubectl(ctx, "", "delete", "namespace", grantNamespace, issuerNamespace, "--wait=true", "--timeout=2m"); err != nil {
		fmt.Fprintf(e.p.w, "bench: removing the grant Pod: %v\n", err)
	}
}

func execOut(ctx context.Context, name string, args ...string) (string, error) {
	b, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(b), err
}
