//go:build integration

package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"fiberd.io/fiberd/controller/api/v1alpha1"
	"fiberd.io/fiberd/test/kubeapi"
)

func TestMain(m *testing.M) { os.Exit(kubeapi.Main(m)) }

func testScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// installCRD applies deploy/controller's CRD and waits until it is established.
func installCRD(t *testing.T, c client.Client) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "controller", "fiberd.io_fiberpools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Create(ctx, &crd); err != nil && !isExists(err) {
		t.Fatalf("crd: %v", err)
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var got apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: crd.Name}, &got); err != nil {
			return false, nil
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("crd not established: %v", err)
	}
}

func isExists(err error) bool { return apierrors.IsAlreadyExists(err) }

// startManager runs a manager with the Reconciler until the returned stop is called; stop
// returns once Start has returned.
func startManager(t *testing.T, env *kubeapi.Env) (stop func()) {
	return startManagerWith(t, env, Config{})
}

// startManagerWith is startManager with the Reconciler configured by cfg.
func startManagerWith(t *testing.T, env *kubeapi.Env, cfg Config) (stop func()) {
	return startManagerAs(t, env.CP.Config(), cfg)
}

// startManagerAs is startManagerWith talking to the API server with rc.
func startManagerAs(t *testing.T, rc *rest.Config, cfg Config) (stop func()) {
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:  testScheme(t),
		Cache:   CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// Each manager of a test registers the same controller name.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := Setup(ctx, mgr, cfg); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop within 30 s")
		}
	}
}

// simulate plays scheduler and kubelet for the pool's Pods: marks each Running and Ready, with
// the Pod IP 127.0.0.<ordinal+1> (where a fakeFiberd may answer for it).
func simulate(t *testing.T, env *kubeapi.Env, pods []corev1.Pod) {
	for _, p := range pods {
		if ready(&p) || p.DeletionTimestamp != nil {
			continue
		}
		now := metav1.Now()
		ip := "127.0.0.1"
		if o, err := strconv.Atoi(p.Labels[LabelOrdinal]); err == nil {
			ip = fmt.Sprintf("127.0.0.%d", o+1)
		}
		st := map[string]any{"status": map[string]any{"phase": "Running", "podIP": ip, "podIPs": []map[string]string{{"ip": ip}},
			"conditions": []corev1.PodCondition{
				{Type: ReadinessGate, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			}}}
		b, _ := json.Marshal(st)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := env.Admin.CoreV1().Pods(env.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
		cancel()
		if err != nil {
			t.Logf("status of %s: %v", p.Name, err)
		}
	}
}

func listPods(t *testing.T, env *kubeapi.Env, pool string) []corev1.Pod {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := env.Admin.CoreV1().Pods(env.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=" + pool})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// eventually polls cond for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within 30 s", what)
	}
}

func TestPoolLifecycle(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c, err := client.New(env.CP.Config(), client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	installCRD(t, c)
	stop := startManager(t, env)
	defer func() { stop() }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := testPool(nil)
	p.UID, p.Namespace = "", env.Namespace
	p.Spec.DrainGracePeriod = &metav1.Duration{Duration: time.Second}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	names := func(pods []corev1.Pod) map[string]types.UID {
		m := map[string]types.UID{}
		for _, p := range pods {
			if p.DeletionTimestamp == nil {
				m[p.Name] = p.UID
			}
		}
		return m
	}
	eventually(t, "4 pods", func() bool { return len(names(listPods(t, env, "web"))) == 4 })
	for _, pod := range listPods(t, env, "web") {
		if ref := metav1.GetControllerOf(&pod); ref == nil || ref.UID != p.UID {
			t.Errorf("pod %s: controller %+v, want the pool", pod.Name, ref)
		}
		if len(pod.Spec.TopologySpreadConstraints) != 1 || len(pod.Spec.ReadinessGates) != 1 {
			t.Errorf("pod %s: spread %v gates %v", pod.Name, pod.Spec.TopologySpreadConstraints, pod.Spec.ReadinessGates)
		}
	}
	available := func() bool {
		var got v1alpha1.FiberPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			return false
		}
		return got.Status.ReadyReplicas == *got.Spec.Replicas && got.Status.Fibers.Capacity == int64(*got.Spec.Replicas)*8 &&
			meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionAvailable)
	}
	eventually(t, "readyReplicas 4, Available", func() bool { simulate(t, env, listPods(t, env, "web")); return available() })

	// A deleted Pod comes back under its ordinal.
	before := names(listPods(t, env, "web"))
	env.DeletePod(t, "web-2")
	eventually(t, "web-2 replaced", func() bool {
		now := names(listPods(t, env, "web"))
		return len(now) == 4 && now["web-2"] != "" && now["web-2"] != before["web-2"]
	})

	// A restarted manager makes no duplicate.
	stop()
	stop = startManager(t, env)
	time.Sleep(2 * time.Second)
	if got := listPods(t, env, "web"); len(got) != 4 {
		t.Fatalf("after restart %d pods, want 4", len(got))
	}

	// Scale to 2: the highest ordinals go.
	if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":2}}`))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "web-0 and web-1 left", func() bool {
		now := names(listPods(t, env, "web"))
		return len(now) == 2 && now["web-0"] != "" && now["web-1"] != ""
	})
	eventually(t, "available at 2", func() bool { simulate(t, env, listPods(t, env, "web")); return available() })
}

func TestPoolValidation(t *testing.T) {
	env := kubeapi.NewEnv(t)
	c, err := client.New(env.CP.Config(), client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	installCRD(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, mut := range map[string]func(*v1alpha1.FiberPool){
		"negative-replicas": func(p *v1alpha1.FiberPool) { p.Spec.Replicas = ptr.To[int32](-1) },
		"no-template":       func(p *v1alpha1.FiberPool) { p.Spec.Template = v1alpha1.TemplateSpec{} },
		"negative-grace":    func(p *v1alpha1.FiberPool) { p.Spec.DrainGracePeriod = &metav1.Duration{Duration: -time.Second} },
	} {
		p := testPool(mut)
		p.Name, p.UID, p.Namespace = name, "", env.Namespace
		if err := c.Create(ctx, p); err == nil {
			t.Errorf("%s: created, want refused", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
