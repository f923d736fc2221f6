package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"fiberd.io/fiberd/pkg/home/kubernetes"
)

var _ kubernetes.Kube = (*Kube)(nil)

// The method names Calls, Fail and Intercept take.
const (
	GetPod           = "GetPod"
	GetNamespace     = "GetNamespace"
	GetResourceClaim = "GetResourceClaim"
	PatchPodStatus   = "PatchPodStatus"
)

// InterceptFunc runs before the method it is set for serves a call. A
// non-nil error is returned in place of the answer. It may block, for
// example until ctx ends, to model a slow API server. For GetNamespace,
// namespace and name are both the Namespace's name.
type InterceptFunc func(ctx context.Context, namespace, name string) error

type key struct{ namespace, name string }

// Kube is an in-memory kubernetes.Kube. The zero value is not usable; call
// New. It is safe for concurrent use.
type Kube struct {
	mu         sync.Mutex
	pods       map[key]*corev1.Pod
	namespaces map[string]*corev1.Namespace
	claims     map[key]*metav1.PartialObjectMetadata
	calls      map[string]int
	intercepts map[string]InterceptFunc
	noClaims   bool
	version    int
	patches    [][]byte
}

// New returns an empty Kube: every read is NotFound until the test sets
// the object.
func New() *Kube {
	return &Kube{
		pods:       map[key]*corev1.Pod{},
		namespaces: map[string]*corev1.Namespace{},
		claims:     map[key]*metav1.PartialObjectMetadata{},
		calls:      map[string]int{},
		intercepts: map[string]InterceptFunc{},
	}
}

// SetPod stores a copy of pod under its namespace and name, replacing any
// Pod there.
func (k *Kube) SetPod(pod *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := pod.DeepCopy()
	p.ResourceVersion = k.nextVersion()
	k.pods[key{p.Namespace, p.Name}] = p
}

// DeletePod removes the Pod at once; later reads are NotFound.
func (k *Kube) DeletePod(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pods, key{namespace, name})
}

// Pod returns a copy of the stored Pod, and false when there is none.
func (k *Kube) Pod(namespace, name string) (*corev1.Pod, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pods[key{namespace, name}]
	if !ok {
		return nil, false
	}
	return p.DeepCopy(), true
}

// SetNamespace stores a copy of ns, replacing any Namespace of its name.
func (k *Kube) SetNamespace(ns *corev1.Namespace) {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := ns.DeepCopy()
	n.ResourceVersion = k.nextVersion()
	k.namespaces[n.Name] = n
}

// DeleteNamespace removes the Namespace at once, and nothing in it.
func (k *Kube) DeleteNamespace(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.namespaces, name)
}

// SetResourceClaim stores a copy of the claim's metadata under its
// namespace and name.
func (k *Kube) SetResourceClaim(claim *metav1.PartialObjectMetadata) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := claim.DeepCopy()
	if c.Kind == "" {
		c.TypeMeta = metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"}
	}
	c.ResourceVersion = k.nextVersion()
	k.claims[key{c.Namespace, c.Name}] = c
}

// DeleteResourceClaim removes the claim at once.
func (k *Kube) DeleteResourceClaim(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.claims, key{namespace, name})
}

// SetNoResourceClaims makes the cluster serve no resource.k8s.io group
// (true), so GetResourceClaim returns kubernetes.ErrNoResourceClaims, or
// serve it again (false).
func (k *Kube) SetNoResourceClaims(none bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.noClaims = none
}

// Fail makes every later call of method return err; a nil err ends it.
// It replaces an Intercept of the same method.
func (k *Kube) Fail(method string, err error) {
	if err == nil {
		k.Intercept(method, nil)
		return
	}
	k.Intercept(method, func(context.Context, string, string) error { return err })
}

// Intercept runs fn before every later call of method; a nil fn ends it.
func (k *Kube) Intercept(method string, fn InterceptFunc) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if fn == nil {
		delete(k.intercepts, method)
		return
	}
	k.intercepts[method] = fn
}

// Calls is how many times method was called, failed calls included.
func (k *Kube) Calls(method string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls[method]
}

// Patches are the patches PatchPodStatus applied, oldest first.
func (k *Kube) Patches() [][]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([][]byte, len(k.patches))
	for i, p := range k.patches {
		out[i] = append([]byte(nil), p...)
	}
	return out
}

// enter counts a call and runs its intercept, outside the lock.
func (k *Kube) enter(ctx context.Context, method, namespace, name string) error {
	k.mu.Lock()
	k.calls[method]++
	fn := k.intercepts[method]
	k.mu.Unlock()
	if fn != nil {
		if err := fn(ctx, namespace, name); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// GetPod returns a copy of the stored Pod, or a NotFound error.
func (k *Kube) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if err := k.enter(ctx, GetPod, namespace, name); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pods[key{namespace, name}]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}
	return p.DeepCopy(), nil
}

// GetNamespace returns a copy of the stored Namespace, or a NotFound error.
func (k *Kube) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	if err := k.enter(ctx, GetNamespace, name, name); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	n, ok := k.namespaces[name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, name)
	}
	return n.DeepCopy(), nil
}

// GetResourceClaim returns a copy of the stored claim's metadata, a
// NotFound error, or kubernetes.ErrNoResourceClaims after
// SetNoResourceClaims(true).
func (k *Kube) GetResourceClaim(ctx context.Context, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	if err := k.enter(ctx, GetResourceClaim, namespace, name); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.noClaims {
		return nil, kubernetes.ErrNoResourceClaims
	}
	c, ok := k.claims[key{namespace, name}]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
	return c.DeepCopy(), nil
}

// PatchPodStatus applies a strategic merge patch to the stored Pod and
// keeps only the status it yields, as the status subresource does. A Pod
// that is not stored is NotFound; a patch that does not apply is
// BadRequest.
func (k *Kube) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	if err := k.enter(ctx, PatchPodStatus, namespace, name); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.pods[key{namespace, name}]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	}
	orig, err := json.Marshal(p)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Pod{})
	if err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("pod %s/%s: strategic merge patch: %v", namespace, name, err))
	}
	var out corev1.Pod
	if err := json.Unmarshal(merged, &out); err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("pod %s/%s: patched pod: %v", namespace, name, err))
	}
	np := p.DeepCopy()
	np.Status = out.Status
	np.ResourceVersion = k.nextVersion()
	k.pods[key{namespace, name}] = np
	k.patches = append(k.patches, append([]byte(nil), patch...))
	return nil
}

// nextVersion is the next resourceVersion; k.mu is held.
func (k *Kube) nextVersion() string {
	k.version++
	return strconv.Itoa(k.version)
}
