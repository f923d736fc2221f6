//go:build integration

package pool

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/test/kubeapi"
)

// newPool creates a pool "web" of testPool, changed by mut, in env's namespace.
func newPool(t *testing.T, env *kubeapi.Env, c client.Client, mut func(*v1alpha1.FiberPool)) *v1alpha1.FiberPool {
	t.Helper()
	p := testPool(mut)
	p.UID, p.Namespace = "", env.Namespace
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func newClient(t *testing.T, env *kubeapi.Env) client.Client {
	t.Helper()
	c, err := client.New(env.CP.Config(), client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	installCRD(t, c)
	return c
}

// patchPool merge-patches the pool's spec.
func patchPool(t *testing.T, c client.Client, p *v1alpha1.FiberPool, patch string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

func getPool(t *testing.T, c client.Client, p *v1alpha1.FiberPool) *v1alpha1.FiberPool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got v1alpha1.FiberPool
	if err := c.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// live are the Pods not being deleted, by name.
func live(pods []corev1.Pod) map[string]corev1.Pod {
	m := map[string]corev1.Pod{}
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			m[p.Name] = p
		}
	}
	return m
}

// TestPoolService checks the pool's Service: headless, named like the pool, selecting its
// serving grant Pods on port api, owned by the pool, and put back when changed.
func TestPoolService(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c := newClient(t, env)
	stop := startManager(t, env)
	defer stop()
	p := newPool(t, env, c, func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](2) })

	var svc *corev1.Service
	eventually(t, "service web", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := env.Admin.CoreV1().Services(env.Namespace).Get(ctx, "web", metav1.GetOptions{})
		svc = s
		return err == nil
	})
	want := map[string]string{"fiberd.io/pool": "web", "fiberd.io/serving": "true"}
	if !maps.Equal(svc.Spec.Selector, want) {
		t.Errorf("selector %v, want %v", svc.Spec.Selector, want)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.PublishNotReadyAddresses {
		t.Errorf("clusterIP %q publishNotReadyAddresses %v, want None and false", svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "api" || svc.Spec.Ports[0].Port != 8484 ||
		svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP || svc.Spec.Ports[0].TargetPort.StrVal != "api" {
		t.Errorf("ports %+v, want api TCP 8484", svc.Spec.Ports)
	}
	got := getPool(t, c, p)
	if g := got.Spec.DrainGracePeriod; g == nil || g.Duration != DefaultDrainGracePeriod {
		t.Errorf("drainGracePeriod %v, want the CRD's default %v", g, DefaultDrainGracePeriod)
	}
	if ref := metav1.GetControllerOf(svc); ref == nil || ref.UID != got.UID {
		t.Errorf("service controller %+v, want the pool", ref)
	}
	eventually(t, "2 pods", func() bool { return len(live(listPods(t, env, "web"))) == 2 })
	for _, pod := range listPods(t, env, "web") {
		if pod.Labels[LabelServing] != "true" || pod.Labels[LabelRevision] != got.Status.UpdateRevision && got.Status.UpdateRevision != "" {
			t.Errorf("pod %s labels %v, want serving and the pool's revision %q", pod.Name, pod.Labels, got.Status.UpdateRevision)
		}
	}

	// Someone points the Service elsewhere: the controller puts its selector back.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Admin.CoreV1().Services(env.Namespace).Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"spec":{"selector":{"fiberd.io/serving":null,"app":"other"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "selector restored", func() bool {
		s, err := env.Admin.CoreV1().Services(env.Namespace).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && maps.Equal(s.Spec.Selector, want)
	})
}

// TestPoolDrain scales a pool of 4 to 2 with fibers in use read from fake fiberds over TLS: both
// Pods leave the Service at once (serving=false), the one without fibers is deleted at its first
// count after the drain settled (drainSettle), the one with fibers when the grace period ends,
// also across a controller restart.
func TestPoolDrain(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c := newClient(t, env)
	fake := newFakeFiberd(t, "fiberd."+env.Namespace+".svc")
	for o, n := range []int64{1, 1, 0, 2} { // web-2 has no fibers, web-3 two
		fake.pod("127.0.0."+string(rune('1'+o)), n)
	}
	cfg := Config{Fibers: fake.config("")}
	cfg.Fibers.Interval = 300 * time.Millisecond
	stop := startManagerWith(t, env, cfg)
	defer func() { stop() }()

	const grace = 12 * time.Second
	p := newPool(t, env, c, func(p *v1alpha1.FiberPool) { p.Spec.DrainGracePeriod = &metav1.Duration{Duration: grace} })
	eventually(t, "4 ready, 4 fibers in use", func() bool {
		simulate(t, env, listPods(t, env, "web"))
		s := getPool(t, c, p).Status
		return s.ReadyReplicas == 4 && s.Fibers.InUse != nil && *s.Fibers.InUse == 4 &&
			meta.IsStatusConditionTrue(s.Conditions, v1alpha1.ConditionFibersCounted)
	})

	patchPool(t, c, p, `{"spec":{"replicas":2}}`)
	start := time.Now()
	eventually(t, "web-2 and web-3 out of the service", func() bool {
		pods := listPods(t, env, "web")
		n := 0
		for _, pod := range pods {
			if pod.Labels[LabelServing] == "false" && pod.Annotations[AnnotationDrainStarted] != "" {
				n++
			}
		}
		return n == 2
	})
	// The pool's Service now selects web-0 and web-1 only: the draining Pods left its
	// EndpointSlices.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	selected, err := env.Admin.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(ServiceSelector("web")).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := live(selected.Items); len(got) != 2 || got["web-0"].Name == "" || got["web-1"].Name == "" {
		t.Errorf("the service selects %v, want web-0 and web-1", slices.Sorted(maps.Keys(got)))
	}
	eventually(t, "web-2 deleted, web-3 draining", func() bool {
		pods := live(listPods(t, env, "web"))
		web3 := pods["web-3"]
		_, has2 := pods["web-2"]
		return !has2 && web3.Labels[LabelServing] == "false"
	})
	if took := time.Since(start); took < drainSettle-time.Second || took > grace-2*time.Second {
		t.Errorf("web-2, with no fibers, deleted %v after the drain started; want after drainSettle (%v), well before the grace period (%v)", took, drainSettle, grace)
	}
	s := getPool(t, c, p).Status
	if s.DrainingReplicas != 1 || s.ReadyReplicas != 2 || s.Replicas != 2 {
		t.Errorf("status draining %d ready %d replicas %d, want 1 2 2", s.DrainingReplicas, s.ReadyReplicas, s.Replicas)
	}
	if c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionProgressing); c == nil || c.Reason != v1alpha1.ReasonDraining {
		t.Errorf("Progressing %+v, want reason Draining", c)
	}

	// The controller restarts mid-drain: the drain goes on from the annotation.
	stop()
	stop = startManagerWith(t, env, cfg)
	time.Sleep(time.Second)
	if _, ok := live(listPods(t, env, "web"))["web-3"]; !ok && time.Since(start) < grace-time.Second {
		t.Fatalf("web-3 deleted %v after the drain started, with 2 fibers in use and a grace period of %v", time.Since(start), grace)
	}
	eventually(t, "web-3 deleted after the grace period", func() bool {
		_, ok := live(listPods(t, env, "web"))["web-3"]
		return !ok
	})
	if took := time.Since(start); took < grace-time.Second {
		t.Errorf("web-3 deleted %v after the drain started, want the grace period %v", took, grace)
	}
	if got := live(listPods(t, env, "web")); len(got) != 2 {
		t.Errorf("pods %v, want web-0 and web-1", got)
	}
}

// controllerRBAC is a client configuration of a ServiceAccount bound to a copy of
// deploy/controller/role.yaml's ClusterRole (named for the test's namespace, so tests do not
// share it): the permissions `make generate` derives from the Reconciler's markers, no more.
func controllerRBAC(t *testing.T, env *kubeapi.Env) *rest.Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "controller", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	name := "fiberd-controller-" + env.Namespace
	role.Name = name
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.CreateServiceAccount(t, "fiberd-controller")
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "fiberd-controller", Namespace: env.Namespace}},
	}
	if _, err := env.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = env.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = env.Admin.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return env.ServiceAccountConfig(t, "fiberd-controller", kubeapi.TokenOptions{})
}

// TestPoolDrainNoCertificate drains without a client certificate: fibers in use are unknown,
// the status says so, and the Pods are deleted at the end of the grace period. The controller
// runs with deploy/controller's ClusterRole only, so a verb missing there fails here.
func TestPoolDrainNoCertificate(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c := newClient(t, env)
	stop := startManagerAs(t, controllerRBAC(t, env), Config{})
	defer stop()
	const grace = 3 * time.Second
	p := newPool(t, env, c, func(p *v1alpha1.FiberPool) {
		p.Spec.Replicas = ptr.To[int32](2)
		p.Spec.DrainGracePeriod = &metav1.Duration{Duration: grace}
	})
	eventually(t, "2 ready", func() bool {
		simulate(t, env, listPods(t, env, "web"))
		return getPool(t, c, p).Status.ReadyReplicas == 2
	})
	s := getPool(t, c, p).Status
	if cond := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionFibersCounted); cond == nil ||
		cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonNoClientCertificate || s.Fibers.InUse != nil {
		t.Errorf("FibersCounted %+v in use %v, want False NoClientCertificate and none", cond, s.Fibers.InUse)
	}
	patchPool(t, c, p, `{"spec":{"replicas":1}}`)
	start := time.Now()
	eventually(t, "web-1 draining", func() bool {
		return live(listPods(t, env, "web"))["web-1"].Labels[LabelServing] == "false"
	})
	eventually(t, "web-1 deleted", func() bool {
		_, ok := live(listPods(t, env, "web"))["web-1"]
		return !ok
	})
	if took := time.Since(start); took < grace-500*time.Millisecond {
		t.Errorf("web-1 deleted after %v, want the grace period %v", took, grace)
	}
}

// capacityWatch watches a pool's Pods and records the fewest ready serving Pods and the most
// Pods it saw at once.
type capacityWatch struct {
	mu        sync.Mutex
	pods      map[string]corev1.Pod
	minReady  int
	maxPods   int
	stop      func()
	done      chan struct{}
	watchErrs []error
}

func watchCapacity(t *testing.T, env *kubeapi.Env) *capacityWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := env.Admin.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=web"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := env.Admin.CoreV1().Pods(env.Namespace).Watch(ctx, metav1.ListOptions{
		LabelSelector: LabelPool + "=web", ResourceVersion: l.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	cw := &capacityWatch{pods: map[string]corev1.Pod{}, minReady: 1 << 30, done: make(chan struct{})}
	for _, p := range l.Items {
		cw.pods[p.Name] = p
	}
	cw.record()
	cw.stop = func() { cancel(); w.Stop(); <-cw.done }
	go func() {
		defer close(cw.done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			cw.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(cw.pods, pod.Name)
			} else {
				cw.pods[pod.Name] = *pod
			}
			cw.mu.Unlock()
			cw.record()
		}
	}()
	return cw
}

func (cw *capacityWatch) record() {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	readyServing := 0
	for _, p := range cw.pods {
		if p.Labels[LabelServing] == "true" && ready(&p) && p.DeletionTimestamp == nil {
			readyServing++
		}
	}
	cw.minReady = min(cw.minReady, readyServing)
	cw.maxPods = max(cw.maxPods, len(cw.pods))
}

func (cw *capacityWatch) result() (minReady, maxPods int) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.minReady, cw.maxPods
}

// TestPoolRoll changes a pool's image and watches its Pods: they are replaced one at a time, the
// ready serving Pods never fewer than replicas nor the Pods more than replicas+1, also across a
// controller restart in the middle, and the roll ends with replicas Pods of the new revision
// under their ordinals.
func TestPoolRoll(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c := newClient(t, env)
	stop := startManager(t, env)
	defer func() { stop() }()
	p := newPool(t, env, c, func(p *v1alpha1.FiberPool) {
		p.Spec.Replicas = ptr.To[int32](3)
		p.Spec.DrainGracePeriod = &metav1.Duration{Duration: time.Second}
	})
	eventually(t, "3 ready", func() bool {
		simulate(t, env, listPods(t, env, "web"))
		return getPool(t, c, p).Status.ReadyReplicas == 3
	})
	oldRev := getPool(t, c, p).Status.UpdateRevision

	cw := watchCapacity(t, env)
	patchPool(t, c, p, `{"spec":{"template":{"image":"fiberd:v2"}}}`)

	// The kubelet is slow: a new Pod becomes ready a little after it is created, so the
	// controller has to wait for it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubelet := make(chan struct{})
	go func() {
		defer close(kubelet)
		for ctx.Err() == nil {
			time.Sleep(700 * time.Millisecond)
			simulate(t, env, listPods(t, env, "web"))
		}
	}()
	defer func() { cancel(); <-kubelet }()

	eventually(t, "the surge pod web-3", func() bool { _, ok := live(listPods(t, env, "web"))["web-3"]; return ok })
	eventually(t, "a pod of the old revision draining", func() bool {
		for _, pod := range listPods(t, env, "web") {
			if pod.Labels[LabelServing] == "false" {
				return true
			}
		}
		return false
	})
	// The controller restarts mid-roll.
	stop()
	stop = startManager(t, env)

	var newRev string
	settled := func() bool {
		got := getPool(t, c, p)
		newRev = got.Status.UpdateRevision
		pods := live(listPods(t, env, "web"))
		if len(pods) != 3 || newRev == oldRev {
			return false
		}
		for _, name := range []string{"web-0", "web-1", "web-2"} {
			pod, ok := pods[name]
			if !ok || pod.Labels[LabelRevision] != newRev || pod.Spec.Containers[0].Image != "fiberd:v2" || !ready(&pod) {
				return false
			}
		}
		return got.Status.UpdatedReplicas == 3 && got.Status.ReadyReplicas == 3 &&
			meta.IsStatusConditionFalse(got.Status.Conditions, v1alpha1.ConditionProgressing)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel2()
	for !settled() {
		if ctx2.Err() != nil {
			t.Fatalf("roll not done in 90 s: pods %v", live(listPods(t, env, "web")))
		}
		time.Sleep(200 * time.Millisecond)
	}
	cw.stop()
	minReady, maxPods := cw.result()
	t.Logf("rolled %s to %s: at least %d ready serving pods, at most %d pods", oldRev, newRev, minReady, maxPods)
	if minReady < 3 {
		t.Errorf("ready serving pods fell to %d during the roll, want never below replicas (3)", minReady)
	}
	if maxPods > 4 {
		t.Errorf("%d pods at once during the roll, want at most replicas+1 (4)", maxPods)
	}
}
