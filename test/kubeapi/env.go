package kubeapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ReadinessGate is the Pod condition type a grant Pod lists as its readiness gate, the one
// fiberd's Kubernetes home sets once a template is warm. Spelled out here, not imported, so this
// package imports nothing of fiberd.
const ReadinessGate = "fiberd.io/zygote-ready"

// DefaultNode is the spec.nodeName of grant Pods that name none. No Node object is needed: with
// no scheduler, binding at creation is how a Pod gets a node here.
const DefaultNode = "node-1"

// opTimeout bounds each API call the helpers make.
const opTimeout = 30 * time.Second

// Env is one test's corner of a control plane: a namespace of its own and an admin client.
type Env struct {
	// CP is the control plane the namespace lives in.
	CP *ControlPlane
	// Namespace is the test's fresh namespace.
	Namespace string
	// Admin is a cluster-admin clientset.
	Admin kubernetes.Interface
}

// NewEnv gives t a fresh namespace on the shared control plane (see Shared). It skips t when the
// binaries are missing.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	return Shared(t).NewEnv(t)
}

// NewEnv gives t a fresh namespace on cp, named after the test with a random suffix. The
// namespace is left behind when t ends: deleting one never completes here, and the control plane
// is thrown away anyway.
func (cp *ControlPlane) NewEnv(t testing.TB) *Env {
	t.Helper()
	e := &Env{CP: cp, Namespace: namespaceName(t.Name()), Admin: cp.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.Namespace}}
	if _, err := e.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubeapi: namespace %q: %v", e.Namespace, err)
	}
	return e
}

// namespaceName turns a test name into a DNS-1123 label: lower case, runs of other characters
// as one '-', at most 63 characters with an 8-hex random suffix.
func namespaceName(test string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(test) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	base := strings.Trim(b.String(), "-")
	if len(base) > 54 {
		base = strings.TrimRight(base[:54], "-")
	}
	if base == "" {
		base = "test"
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return base + "-" + hex.EncodeToString(suffix[:])
}

func (e *Env) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// CreateServiceAccount creates a ServiceAccount in the namespace. Nothing creates "default" ones
// here, so every account a Pod or a token names must be made this way.
func (e *Env) CreateServiceAccount(t testing.TB, name string) *corev1.ServiceAccount {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace}}
	got, err := e.Admin.CoreV1().ServiceAccounts(e.Namespace).Create(e.ctx(t), sa, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: serviceaccount %s/%s: %v", e.Namespace, name, err)
	}
	return got
}

// TokenOptions shapes a ServiceAccount token from Token.
type TokenOptions struct {
	// Pod binds the token to this Pod (name and UID) as the kubelet's projected token is: it
	// stops authenticating soon after the Pod is deleted, and a TokenReview of it carries the
	// Pod's name and UID. Nil means an unbound token.
	Pod *corev1.Pod
	// Audiences of the token. Empty means the API server's own, so the token authenticates to it.
	Audiences []string
	// Expiration is the token's lifetime, at least 10 minutes (the API server's minimum). Zero
	// means one hour.
	Expiration time.Duration
}

// Token mints a token of the ServiceAccount through the TokenRequest API, which must exist
// (CreateServiceAccount).
func (e *Env) Token(t testing.TB, serviceAccount string, opts TokenOptions) string {
	t.Helper()
	exp := int64(time.Hour / time.Second)
	if opts.Expiration > 0 {
		exp = int64(opts.Expiration / time.Second)
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         opts.Audiences,
		ExpirationSeconds: &exp,
	}}
	if opts.Pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: opts.Pod.Name, UID: opts.Pod.UID,
		}
	}
	got, err := e.Admin.CoreV1().ServiceAccounts(e.Namespace).CreateToken(e.ctx(t), serviceAccount, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: token of serviceaccount %s/%s: %v", e.Namespace, serviceAccount, err)
	}
	return got.Status.Token
}

// ServiceAccountConfig is a client configuration that authenticates as the ServiceAccount with a
// fresh Token, and trusts the control plane's CA; no client certificate. Its permissions are what
// RBAC grants the account, nothing by default.
func (e *Env) ServiceAccountConfig(t testing.TB, serviceAccount string, opts TokenOptions) *rest.Config {
	t.Helper()
	token := e.Token(t, serviceAccount, opts)
	cfg := e.CP.Config()
	return &rest.Config{
		Host:            cfg.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData},
		QPS:             cfg.QPS,
		Burst:           cfg.Burst,
	}
}

// WriteToken writes token to a fresh file under t.TempDir, mode 0600, as the kubelet projects a
// token into a Pod, and returns its path.
func WriteToken(t testing.TB, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token), 0o600); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	return p
}

// GrantPod describes a grant Pod for CreateGrantPod.
type GrantPod struct {
	// Name of the Pod. Required.
	Name string
	// ServiceAccount is spec.serviceAccountName. Empty means none (the field stays empty, since
	// the ServiceAccount admission plugin is off). It need not exist to create the Pod.
	ServiceAccount string
	// NodeName is spec.nodeName. Empty means DefaultNode.
	NodeName string
	// Claims are spec.resourceClaims, pod claim name to ResourceClaim name, in the order of the
	// pod claim names. Empty means none. The ResourceClaims need not exist to create the Pod.
	Claims map[string]string
	// Finalizers keep the Pod, Terminating, after its deletion until they are removed.
	Finalizers []string
	// Labels of the Pod.
	Labels map[string]string
}

// CreateGrantPod creates a Pod shaped as the controller makes grant Pods: one container "fiberd",
// the ReadinessGate, bound to a node. It stays Pending, since no kubelet runs; SetPodIPs plays the
// kubelet's part.
func (e *Env) CreateGrantPod(t testing.TB, p GrantPod) *corev1.Pod {
	t.Helper()
	if p.Name == "" {
		t.Fatal("kubeapi: GrantPod.Name is empty")
	}
	node := p.NodeName
	if node == "" {
		node = DefaultNode
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: e.Namespace, Labels: p.Labels, Finalizers: p.Finalizers,
		},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: p.ServiceAccount,
			Containers: []corev1.Container{{
				Name:  "fiberd",
				Image: "fiberd.invalid/fiberd:test",
			}},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: ReadinessGate}},
		},
	}
	for _, claim := range slices.Sorted(maps.Keys(p.Claims)) {
		rc := p.Claims[claim]
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{
			Name: claim, ResourceClaimName: &rc,
		})
	}
	got, err := e.Admin.CoreV1().Pods(e.Namespace).Create(e.ctx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: pod %s/%s: %v", e.Namespace, p.Name, err)
	}
	return got
}

// GetPod reads a Pod of the namespace.
func (e *Env) GetPod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	got, err := e.Admin.CoreV1().Pods(e.Namespace).Get(e.ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubeapi: pod %s/%s: %v", e.Namespace, name, err)
	}
	return got
}

// SetPodIPs writes status.podIP and status.podIPs as the kubelet does once the Pod's sandbox has
// its network, with a JSON merge patch of the status subresource that touches nothing else (the
// conditions the home writes stay). ips[0] is the primary IP; none clears both fields.
func (e *Env) SetPodIPs(t testing.TB, name string, ips ...string) *corev1.Pod {
	t.Helper()
	type podIP struct {
		IP string `json:"ip"`
	}
	status := map[string]any{"podIP": nil, "podIPs": nil}
	if len(ips) > 0 {
		list := make([]podIP, len(ips))
		for i, ip := range ips {
			list[i] = podIP{IP: ip}
		}
		status["podIP"], status["podIPs"] = ips[0], list
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	got, err := e.Admin.CoreV1().Pods(e.Namespace).Patch(e.ctx(t), name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("kubeapi: podIPs of pod %s/%s: %v", e.Namespace, name, err)
	}
	return got
}

// DeletePod deletes the Pod with grace period 0, as a kubelet would confirm it: without a kubelet,
// a graceful deletion of a bound Pod never completes. It returns once the Pod is gone, or, when
// finalizers keep it, once it is Terminating. A Pod already gone is not an error.
func (e *Env) DeletePod(t testing.TB, name string) {
	t.Helper()
	ctx := e.ctx(t)
	pods := e.Admin.CoreV1().Pods(e.Namespace)
	zero := int64(0)
	err := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatalf("kubeapi: delete pod %s/%s: %v", e.Namespace, name, err)
	}
	err = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && p.DeletionTimestamp != nil && len(p.Finalizers) > 0, nil
	})
	if err != nil {
		t.Fatalf("kubeapi: pod %s/%s still there after deletion: %v", e.Namespace, name, err)
	}
}

// RemoveFinalizers clears the Pod's finalizers, which lets a Terminating Pod go.
func (e *Env) RemoveFinalizers(t testing.TB, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	_, err := e.Admin.CoreV1().Pods(e.Namespace).Patch(e.ctx(t), name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("kubeapi: finalizers of pod %s/%s: %v", e.Namespace, name, err)
	}
}

// DeleteNamespace deletes the test's namespace. With no namespace controller it stays
// Terminating for ever, with its objects, which is how a test makes a namespace terminate.
func (e *Env) DeleteNamespace(t testing.TB) {
	t.Helper()
	if err := e.Admin.CoreV1().Namespaces().Delete(e.ctx(t), e.Namespace, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("kubeapi: delete namespace %s: %v", e.Namespace, err)
	}
}

// ResourceClaimVersion is the resource.k8s.io version the control plane serves, preferring v1,
// then v1beta2, then v1beta1; "" when it serves the group in none of them.
func (cp *ControlPlane) ResourceClaimVersion(t testing.TB) string {
	t.Helper()
	groups, err := cp.Client().Discovery().ServerGroups()
	if err != nil {
		t.Fatalf("kubeapi: discovery: %v", err)
	}
	served := map[string]bool{}
	for _, g := range groups.Groups {
		if g.Name == "resource.k8s.io" {
			for _, v := range g.Versions {
				served[v.Version] = true
			}
		}
	}
	for _, v := range []string{"v1", "v1beta2", "v1beta1"} {
		if served[v] {
			return v
		}
	}
	return ""
}

func (e *Env) claims(t testing.TB) (dynamic.ResourceInterface, string) {
	t.Helper()
	v := e.CP.ResourceClaimVersion(t)
	if v == "" {
		t.Fatal("kubeapi: the control plane serves no resource.k8s.io version")
	}
	dc, err := dynamic.NewForConfig(e.CP.Config())
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	gvr := schema.GroupVersionResource{Group: "resource.k8s.io", Version: v, Resource: "resourceclaims"}
	return dc.Resource(gvr).Namespace(e.Namespace), gvr.GroupVersion().String()
}

// CreateResourceClaim creates an empty ResourceClaim (it requests no device) in the version the
// control plane serves. Nothing allocates it here; its existence is what tests look at.
func (e *Env) CreateResourceClaim(t testing.TB, name string) *metav1.ObjectMeta {
	t.Helper()
	rc, apiVersion := e.claims(t)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       "ResourceClaim",
		"metadata":   map[string]any{"name": name, "namespace": e.Namespace},
		"spec":       map[string]any{},
	}}
	got, err := rc.Create(e.ctx(t), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeapi: resourceclaim %s/%s: %v", e.Namespace, name, err)
	}
	return &metav1.ObjectMeta{Name: got.GetName(), Namespace: got.GetNamespace(), UID: got.GetUID()}
}

// DeleteResourceClaim deletes a ResourceClaim; it is gone at once (nothing holds a finalizer on it
// here).
func (e *Env) DeleteResourceClaim(t testing.TB, name string) {
	t.Helper()
	rc, _ := e.claims(t)
	if err := rc.Delete(e.ctx(t), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("kubeapi: delete resourceclaim %s/%s: %v", e.Namespace, name, err)
	}
}

// String names the environment in test logs.
func (e *Env) String() string { return fmt.Sprintf("namespace %s on %s", e.Namespace, e.CP.URL()) }
