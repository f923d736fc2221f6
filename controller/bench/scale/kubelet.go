package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	homekube "fiberd.io/fiberd/pkg/home/kubernetes"
)

// kubelet plays the scheduler's and the kubelets' part for the grant Pods of one namespace: it
// binds each new Pod to the simulated Node with the fewest Pods, reports it Running with a Pod
// IP (and calls started, where a kubelet would start fiberd's container), and sets the Pod's
// Ready condition True once its readiness gate fiberd.io/zygote-ready is True. A deleted Pod is
// removed at once (grace period 0) after stopped is called. Each step is one API write, as the
// real components make: a Binding, a status patch, a status patch.
type kubelet struct {
	cs      kubernetes.Interface
	ns      string
	nodes   []string
	started func(*corev1.Pod)
	stopped func(*corev1.Pod)
	log     logr.Logger

	queue    workqueue.TypedRateLimitingInterface[string]
	informer cache.SharedIndexInformer

	mu      sync.Mutex
	perNode map[string]int
	nextIP  int
	ready   map[types.UID]time.Time
	running map[types.UID]bool
	readyN  atomic.Int64
}

// newKubelet returns a kubelet of namespace ns over nodes; Run starts it.
func newKubelet(cs kubernetes.Interface, ns string, nodes []string, started, stopped func(*corev1.Pod), log logr.Logger) *kubelet {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	k := &kubelet{
		cs: cs, ns: ns, nodes: nodes, started: started, stopped: stopped, log: log,
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		informer: f.Core().V1().Pods().Informer(),
		perNode:  map[string]int{},
		ready:    map[types.UID]time.Time{},
		running:  map[types.UID]bool{},
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	return k
}

// Run watches the namespace's Pods with workers goroutines until ctx ends, and returns once
// they have all stopped.
func (k *kubelet) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	wg.Go(func() { k.informer.RunWithContext(ctx) })
	go func() {
		<-ctx.Done()
		k.queue.ShutDown()
	}()
	if cache.WaitForCacheSync(ctx.Done(), k.informer.HasSynced) {
		for range workers {
			wg.Go(func() {
				for k.work(ctx) {
				}
			})
		}
	}
	wg.Wait()
}

// readyCount is how many Pods this kubelet has marked Ready.
func (k *kubelet) readyCount() int { return int(k.readyN.Load()) }

func (k *kubelet) work(ctx context.Context) bool {
	key, shut := k.queue.Get()
	if shut {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		if ctx.Err() == nil {
			k.log.V(1).Info("retrying", "pod", key, "err", err.Error())
			k.queue.AddRateLimited(key)
		}
		return true
	}
	k.queue.Forget(key)
	return true
}

// sync moves the Pod key one step on, as its kubelet would.
func (k *kubelet) sync(ctx context.Context, key string) error {
	obj, exists, err := k.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch {
	case pod.DeletionTimestamp != nil:
		k.mu.Lock()
		wasRunning := k.running[pod.UID]
		delete(k.running, pod.UID)
		k.mu.Unlock()
		if wasRunning {
			k.stopped(pod)
		}
		err := k.cs.CoreV1().Pods(k.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	case pod.Spec.NodeName == "":
		return k.bind(ctx, pod)
	case pod.Status.Phase != corev1.PodRunning:
		return k.run(ctx, pod)
	case gateTrue(pod) && !podReady(pod):
		return k.markReady(ctx, pod)
	case podReady(pod):
		k.mu.Lock()
		if _, seen := k.ready[pod.UID]; !seen {
			k.ready[pod.UID] = time.Now()
			k.readyN.Add(1)
		}
		k.mu.Unlock()
	}
	return nil
}

// bind assigns the Pod to the Node holding fewest of this kubelet's Pods, as a scheduler
// spreading over nodes would.
func (k *kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	k.mu.Lock()
	node := k.nodes[0]
	for _, n := range k.nodes[1:] {
		if k.perNode[n] < k.perNode[node] {
			node = n
		}
	}
	k.perNode[node]++
	k.mu.Unlock()
	err := k.cs.CoreV1().Pods(k.ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: k.ns, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		k.mu.Lock()
		k.perNode[node]--
		k.mu.Unlock()
		if apierrors.IsConflict(err) {
			return nil // bound already: the update that says so is on its way
		}
	}
	return err
}

// run reports the Pod Running with an IP of its own, Ready False until the readiness gate is
// True, and starts its home.
func (k *kubelet) run(ctx context.Context, pod *corev1.Pod) error {
	k.mu.Lock()
	k.nextIP++
	ip := fmt.Sprintf("10.%d.%d.%d", 64+k.nextIP>>16&63, k.nextIP>>8&255, k.nextIP&255)
	k.mu.Unlock()
	now := metav1.Now()
	status := map[string]any{
		"phase":     corev1.PodRunning,
		"podIP":     ip,
		"podIPs":    []map[string]string{{"ip": ip}},
		"hostIP":    "192.0.2.1",
		"startTime": now,
		"conditions": []corev1.PodCondition{
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ReadinessGatesNotReady", LastTransitionTime: now,
				Message: "corresponding condition of pod readiness gate \"" + homekube.PodConditionZygoteReady + "\" does not exist."},
		},
		"containerStatuses": []corev1.ContainerStatus{{
			Name: "fiberd", Ready: true, Started: new(true), Image: pod.Spec.Containers[0].Image, ImageID: "sim://fiberd",
			ContainerID: "sim://" + string(pod.UID),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if err := k.patchStatus(ctx, pod, status); err != nil {
		return err
	}
	k.mu.Lock()
	first := !k.running[pod.UID]
	k.running[pod.UID] = true
	k.mu.Unlock()
	if first {
		k.started(pod)
	}
	return nil
}

// markReady sets the Pod's Ready condition True, its readiness gate being True.
func (k *kubelet) markReady(ctx context.Context, pod *corev1.Pod) error {
	now := metav1.Now()
	return k.patchStatus(ctx, pod, map[string]any{"conditions": []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}})
}

// patchStatus sends status as a strategic merge patch of the Pod's status, as a kubelet does,
// held to the Pod's UID.
func (k *kubelet) patchStatus(ctx context.Context, pod *corev1.Pod, status map[string]any) error {
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID}, "status": status})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(k.ns).Patch(ctx, pod.Name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func gateTrue(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if string(c.Type) == homekube.PodConditionZygoteReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
