//go:build integration

package kubeapi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The harness does what the Kubernetes home's tests rely on: a namespace, a grant Pod, its
// addresses written as a kubelet would, a bound ServiceAccount token that works and is reviewed
// with the Pod's identity, RBAC enforced, claims and deletion with grace period 0.
func TestSharedControlPlaneServesAGrantPod(t *testing.T) {
	env := NewEnv(t)
	ctx := ctxFor(t)
	if _, err := env.Admin.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{}); err != nil {
		t.Fatalf("the test's namespace: %v", err)
	}
	if again := NewEnv(t); again.CP != env.CP {
		t.Fatal("a second NewEnv started a second shared control plane")
	} else if again.Namespace == env.Namespace {
		t.Fatal("a second NewEnv reused the namespace")
	}

	env.CreateServiceAccount(t, "fiberd")
	if v := env.CP.ResourceClaimVersion(t); v != "v1" {
		t.Fatalf("resource.k8s.io served as %q, want v1", v)
	}
	env.CreateResourceClaim(t, "gpu")
	pod := env.CreateGrantPod(t, GrantPod{Name: "grant-0", ServiceAccount: "fiberd", Claims: map[string]string{"gpu": "gpu"}})
	if pod.UID == "" || pod.Spec.NodeName != DefaultNode || len(pod.Spec.ReadinessGates) != 1 ||
		pod.Spec.ReadinessGates[0].ConditionType != ReadinessGate || len(pod.Spec.ResourceClaims) != 1 {
		t.Fatalf("grant pod not shaped as asked: %+v", pod.Spec)
	}

	env.SetPodIPs(t, "grant-0", "10.1.2.3", "fd00::3")
	got := env.GetPod(t, "grant-0")
	if got.Status.PodIP != "10.1.2.3" || len(got.Status.PodIPs) != 2 || got.Status.PodIPs[1].IP != "fd00::3" {
		t.Fatalf("after SetPodIPs the pod reads podIP %q podIPs %v", got.Status.PodIP, got.Status.PodIPs)
	}

	// A token bound to the Pod authenticates as the ServiceAccount, carries the Pod, and gets
	// only what RBAC grants.
	saCfg := env.ServiceAccountConfig(t, "fiberd", TokenOptions{Pod: pod})
	sa, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.CoreV1().Pods(env.Namespace).Get(ctx, "grant-0", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("GET pod as the ServiceAccount without a Role: %v, want Forbidden", err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
	}
	if _, err := env.Admin.RbacV1().Roles(env.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "fiberd", Namespace: env.Namespace}},
	}
	if _, err := env.Admin.RbacV1().RoleBindings(env.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := sa.CoreV1().Pods(env.Namespace).Get(ctx, "grant-0", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("GET pod as the ServiceAccount with a Role never succeeded: %v", err)
	}
	review, err := env.Admin.AuthenticationV1().TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: saCfg.BearerToken}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.User
	if !review.Status.Authenticated || u.Username != "system:serviceaccount:"+env.Namespace+":fiberd" ||
		strings.Join(u.Extra["authentication.kubernetes.io/pod-name"], ",") != "grant-0" ||
		strings.Join(u.Extra["authentication.kubernetes.io/pod-uid"], ",") != string(pod.UID) {
		t.Fatalf("TokenReview of the bound token: %+v", review.Status)
	}

	env.DeletePod(t, "grant-0")
	if _, err := env.Admin.CoreV1().Pods(env.Namespace).Get(ctx, "grant-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("GET pod after DeletePod: %v, want NotFound", err)
	}
	env.DeleteResourceClaim(t, "gpu")
}

// A finalizer keeps a Pod Terminating after DeletePod, and a deleted namespace stays Terminating:
// the two states the home's scope-loss tests cause.
func TestTerminatingStatesLast(t *testing.T) {
	env := NewEnv(t)
	ctx := ctxFor(t)
	env.CreateGrantPod(t, GrantPod{Name: "kept", Finalizers: []string{"fiberd.io/test"}})
	env.DeletePod(t, "kept")
	if p := env.GetPod(t, "kept"); p.DeletionTimestamp == nil {
		t.Fatal("a pod with a finalizer has no deletionTimestamp after DeletePod")
	}
	env.RemoveFinalizers(t, "kept")
	env.DeleteNamespace(t)
	ns, err := env.Admin.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{})
	if err != nil || ns.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("namespace after DeleteNamespace: %v, phase %v; want Terminating", err, ns.Status.Phase)
	}
}

// Stop makes the API server unreachable, Restart brings it back on the same address with the same
// data and new flags, which is what the liveness and discovery tests need.
func TestStopAndRestartWithOtherFlags(t *testing.T) {
	cp := Start(t, Options{})
	env := cp.NewEnv(t)
	client := cp.Client()
	cfg := cp.Config()
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	if cp.Running() {
		t.Fatal("Running() after Stop")
	}
	ctx := ctxFor(t)
	if _, err := client.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answered after Stop")
	}
	if err := cp.Restart(Options{RuntimeConfig: "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true"}); err != nil {
		t.Fatal(err)
	}
	if got := cp.Config().Host; got != cfg.Host {
		t.Fatalf("Restart moved the API server from %s to %s", cfg.Host, got)
	}
	if _, err := client.CoreV1().Namespaces().Get(ctx, env.Namespace, metav1.GetOptions{}); err != nil {
		t.Fatalf("a client made before Stop, after Restart: %v", err)
	}
	if v := cp.ResourceClaimVersion(t); v != "v1beta2" {
		t.Fatalf("after Restart with v1beta2 only, resource.k8s.io is served as %q", v)
	}
	env.CreateResourceClaim(t, "beta")
	if err := cp.Restart(Options{RuntimeConfig: "resource.k8s.io/v1=false"}); err != nil {
		t.Fatal(err)
	}
	if v := cp.ResourceClaimVersion(t); v != "" {
		t.Fatalf("with resource.k8s.io/v1=false the group is still served as %q", v)
	}
}

// kube-up.sh's watchdog stops the control plane once the process that started it is gone, so a
// test binary killed by its timeout leaves nothing running.
func TestWatchdogStopsOrphanedControlPlane(t *testing.T) {
	bin, script := requireTools(t)
	dir, err := os.MkdirTemp("", "kubeapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command(script, "clean", dir).Run()
	})
	owner := exec.Command("sleep", "600")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	start := exec.Command(script, "start", dir)
	start.Env = append(os.Environ(), "FIBERD_KUBE_BIN="+bin, "FIBERD_KUBE_WATCH_PID="+strconv.Itoa(owner.Process.Pid))
	if out, err := start.CombinedOutput(); err != nil {
		_ = owner.Process.Kill()
		t.Fatalf("kube-up.sh start: %v\n%s", err, out)
	}
	var pids []int
	for _, name := range []string{"apiserver", "etcd", "watchdog"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := exec.Command(script, "status", dir).Run(); err != nil {
		t.Fatalf("status of a running control plane: %v", err)
	}

	_ = owner.Process.Kill()
	_ = owner.Wait()
	err = wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, pid := range pids {
			if alive(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("processes %v still alive 30 s after their owner died", pids)
	}
	if err := exec.Command(script, "status", dir).Run(); err == nil {
		t.Fatal("status says running after the watchdog stopped it")
	}
}

// alive reports whether pid runs and is not a zombie waiting to be reaped.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
