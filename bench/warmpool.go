package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
)

// The agent-sandbox module and its objects (extensions.agents.x-k8s.io/v1beta1).
const (
	sandboxModule     = "sigs.k8s.io/agent-sandbox"
	sandboxController = sandboxModule + "/cmd/agent-sandbox-controller"
	sandboxAPI        = "extensions.agents.x-k8s.io/v1beta1"
	sandboxNamespace  = "bench-sandbox"
	sandboxPool       = "counter"
)

var (
	claimGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	poolGVR  = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// sandboxVersion is the agent-sandbox version the tools module requires.
func sandboxVersion(ctx context.Context, root string) string {
	v, err := toolsGo(ctx, root, "list", "-m", "-f", "{{.Version}}", sandboxModule)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return v
}

// toolsGo runs the go command in the checkout's tools module and returns its trimmed stdout.
func toolsGo(ctx context.Context, root string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(root, "tools")
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
	}
	return strings.TrimSpace(string(out)), err
}

// warmPoolRow is the alternative most Kubernetes users reach for: kubernetes-sigs/agent-sandbox's
// controller (built from the module proxy in the tools module, never in fiberd's go.mod) run
// against the node's API server with its CRDs applied, a SandboxTemplate of the C template and
// a SandboxWarmPool of it big enough that every claim of the run finds a warm Sandbox. Each
// worker is a SandboxClaim, timed from its create call until the claimed Sandbox's Pod IP (from
// the claim's status) answers the first HTTP byte; released by deleting the claim and waiting
// until the claimed Pod is gone and the pool is full again.
func (e *nodeEnv) warmPoolRow(ctx context.Context, res *NodeResult) NodeRow {
	row := NodeRow{Mode: modeNodeWarmPool, What: "create a SandboxClaim of a full warm pool, until the claimed Pod IP answers the first HTTP byte; release: delete the claim, until its Pod is gone and the pool full"}
	replicas := e.o.nodeBurst + 4
	e.p.Phasef("%s: building agent-sandbox-controller in the tools module", row.Mode)
	bin := filepath.Join(e.work, "agent-sandbox-controller")
	if _, err := toolsGo(ctx, e.root, "build", "-o", bin, sandboxController); err != nil {
		row.Note = "the agent-sandbox controller did not build here: " + err.Error()
		return row
	}
	dir, err := toolsGo(ctx, e.root, "list", "-m", "-f", "{{.Dir}}", sandboxModule)
	if err != nil {
		row.Note = "the agent-sandbox module's CRDs were not found: " + err.Error()
		return row
	}
	stop, err := e.startSandbox(ctx, bin, filepath.Join(dir, "k8s", "crds"), replicas)
	if stop != nil {
		defer stop()
	}
	if err != nil {
		row.Note = "agent-sandbox did not fill its warm pool: " + err.Error()
		return row
	}
	dyn, err := dynamic.NewForConfig(e.kc.cfg)
	if err != nil {
		row.Note = err.Error()
		return row
	}
	err = e.runRow(ctx, &row, rowDriver{
		start:        func(ctx context.Context, name string) (nodeWorker, error) { return e.claim(ctx, dyn, name, replicas) },
		memoryBefore: e.censusAny,
		memoryAfter: func(ctx context.Context, before any, ws []nodeWorker) (NodeMemory, error) {
			// The pool refills behind the claims: read once it is full, as it stays.
			if err := e.poolFull(ctx, dyn, replicas); err != nil {
				return NodeMemory{}, err
			}
			m, err := e.podMemory(ctx, before, ws)
			m.Note = strings.TrimPrefix(fmt.Sprintf("%s; the pool's %d idle Pods hold about %s MiB more", m.Note, replicas, mib(float64(replicas)*m.TotalKiB())), "; ")
			return m, err
		},
	})
	if err != nil {
		row.Measured, row.Note = false, err.Error()
		return row
	}
	row.Note = fmt.Sprintf("agent-sandbox %s, pool of %d warm Sandboxes (the C template, `%s`, a TCP readiness probe every 1 s); the pool's idle Pods are not counted per worker",
		sandboxVersion(ctx, e.root), replicas, strings.Join(e.spec.Args, " "))
	return row
}

// startSandbox applies the CRDs, starts the controller (as a cluster's operator would, but on
// this host with the admin kubeconfig, no leader election, metrics and probes off), applies the
// template and the warm pool, and waits until the pool is full. stop ends the controller.
func (e *nodeEnv) startSandbox(ctx context.Context, bin, crds string, replicas int) (stop func(), err error) {
	if _, err := e.kubectl(ctx, "", "apply", "-f", crds); err != nil {
		return nil, err
	}
	if _, err := e.kubectl(ctx, "", "wait", "--for", "condition=established", "--timeout=60s", "crd", "--all"); err != nil {
		return nil, err
	}
	logPath := filepath.Join(e.work, "agent-sandbox-controller.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--extensions", "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(e.kc.dir, "kubeconfig"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// The controller dies with this process, also when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	if err := e.namespace(ctx, sandboxNamespace); err != nil {
		return stop, err
	}
	spec := e.workerPodSpec()
	spec.Containers[0].ReadinessProbe = tcpProbe(8080)
	objs := []map[string]any{
		{"apiVersion": sandboxAPI, "kind": "SandboxTemplate", "metadata": map[string]any{"name": sandboxPool},
			"spec": map[string]any{"networkPolicyManagement": "Unmanaged", "podTemplate": map[string]any{"spec": spec}}},
		{"apiVersion": sandboxAPI, "kind": "SandboxWarmPool", "metadata": map[string]any{"name": sandboxPool},
			"spec": map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": sandboxPool}}},
	}
	for _, o := range objs {
		b, err := json.Marshal(o)
		if err != nil {
			return stop, err
		}
		if _, err := e.kubectl(ctx, string(b), "-n", sandboxNamespace, "apply", "-f", "-"); err != nil {
			return stop, err
		}
	}
	e.p.Phasef("%s: filling a warm pool of %d", modeNodeWarmPool, replicas)
	dyn, err := dynamic.NewForConfig(e.kc.cfg)
	if err != nil {
		return stop, err
	}
	if err := e.poolFull(ctx, dyn, replicas); err != nil {
		return stop, fmt.Errorf("%w (the controller's log: %s)", err, logPath)
	}
	return stop, nil
}

// poolFull waits until the warm pool has replicas ready Sandboxes.
func (e *nodeEnv) poolFull(ctx context.Context, dyn dynamic.Interface, replicas int) error {
	var last int64
	err := waitForEvery(ctx, 5*time.Minute, 50*time.Millisecond, func() (bool, error) {
		u, err := dyn.Resource(poolGVR).Namespace(sandboxNamespace).Get(ctx, sandboxPool, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last, _, _ = unstructured.NestedInt64(u.Object, "status", "readyReplicas")
		return last >= int64(replicas), nil
	})
	if err != nil {
		return fmt.Errorf("the warm pool has %d of %d Sandboxes ready: %w", last, replicas, err)
	}
	return nil
}

// claim creates a SandboxClaim on the warm pool and returns once the claimed Pod IP answered
// the first byte.
func (e *nodeEnv) claim(ctx context.Context, dyn dynamic.Interface, name string, replicas int) (nodeWorker, error) {
	claims := dyn.Resource(claimGVR).Namespace(sandboxNamespace)
	w, err := claims.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nodeWorker{}, err
	}
	defer w.Stop()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": sandboxAPI, "kind": "SandboxClaim", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"warmPoolRef": map[string]any{"name": sandboxPool}},
	}}
	t0 := time.Now()
	if _, err := claims.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return nodeWorker{}, err
	}
	var ip, sandbox string
	if err := watchUntil(ctx, w, 2*time.Minute, func(o any) (bool, error) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return false, nil
		}
		ips, _, _ := unstructured.NestedStringSlice(u.Object, "status", "sandbox", "podIPs")
		sandbox, _, _ = unstructured.NestedString(u.Object, "status", "sandbox", "name")
		if len(ips) > 0 {
			ip = ips[0]
		}
		return ip != "" && sandbox != "", nil
	}); err != nil {
		return nodeWorker{}, fmt.Errorf("claim %s got no Pod IP: %w", name, err)
	}
	d, err := firstByteWithin(ctx, net.JoinHostPort(ip, "8080"), t0)
	if err != nil {
		return nodeWorker{}, fmt.Errorf("claim %s (Sandbox %s): %w", name, sandbox, err)
	}
	pod, err := e.kc.cs.CoreV1().Pods(sandboxNamespace).Get(ctx, sandbox, metav1.GetOptions{})
	if err != nil {
		return nodeWorker{}, fmt.Errorf("claim %s: the Pod of Sandbox %s: %w", name, sandbox, err)
	}
	release := func(ctx context.Context) error {
		if err := claims.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := e.podGone(ctx, sandboxNamespace, sandbox); err != nil {
			return err
		}
		return e.poolFull(ctx, dyn, replicas)
	}
	return nodeWorker{ms: Ms(d), podUID: string(pod.UID), release: release}, nil
}

// tcpProbe is a readiness probe that connects to port every second.
func tcpProbe(port int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}},
		PeriodSeconds: 1,
	}
}
