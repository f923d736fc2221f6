package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// ErrNoResourceClaims is what GetResourceClaim returns when the cluster
// serves no resource.k8s.io group, so no ResourceClaim can be read.
var ErrNoResourceClaims = errors.New("the cluster serves no resource.k8s.io API")

// Kube is the slice of the Kubernetes API the home touches. NewKube serves
// it from a cluster, and fake.Kube from memory.
//
// A Pod, Namespace or ResourceClaim that does not exist is an error for
// which apierrors.IsNotFound (k8s.io/apimachinery/pkg/api/errors) is true,
// and only that: the home ends the Pod's scope on a claim's NotFound.
type Kube interface {
	// GetPod reads one Pod.
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// GetNamespace reads one Namespace.
	GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error)
	// GetResourceClaim reads the metadata of one ResourceClaim, which is
	// all the home needs from it. It returns ErrNoResourceClaims when the
	// cluster serves no resource.k8s.io group.
	GetResourceClaim(ctx context.Context, namespace, name string) (*metav1.PartialObjectMetadata, error)
	// PatchPodStatus applies a strategic merge patch to the Pod's status
	// subresource.
	PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error
}

// resourceGroup is the API group of ResourceClaims.
const resourceGroup = "resource.k8s.io"

// resourceVersions are the resource.k8s.io versions NewKube reads claims
// at, most preferred first.
var resourceVersions = []string{"v1", "v1beta2", "v1beta1"}

// NewKube connects to the cluster cfg names and discovers which
// resource.k8s.io version it serves. A cluster without that group still
// works, and GetResourceClaim then returns ErrNoResourceClaims.
//
// Pods, Namespaces and the status patch go through the typed clientset,
// ResourceClaims through the metadata client at the first of v1, v1beta2
// and v1beta1 the cluster serves. ctx bounds the discovery request. NewKube
// fails when cfg is unusable or discovery fails for another reason than
// the group being absent.
//
// The version is discovered again when a claim read gets a 404 that does
// not name the claim, which is what a version or group no longer served
// answers, and when none was served: GetResourceClaim then reads at the
// version served now, returns ErrNoResourceClaims when there is none, and
// an error that is no NotFound when the version is still served (something
// in front of the API server answered). Only the API server's own NotFound
// for the claim is NotFound.
func NewKube(ctx context.Context, cfg *rest.Config) (Kube, error) {
	if cfg == nil {
		return nil, errors.New("kubernetes: NewKube: rest config is nil: build one with rest.InClusterConfig or clientcmd")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: clientset for %s: %w", cfg.Host, err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: metadata client for %s: %w", cfg.Host, err)
	}
	k := &kube{cs: cs, md: md, discovery: cs.Discovery().RESTClient()}
	version, err := discoverResourceVersion(ctx, k.discovery)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: discovering %s at %s: %w", resourceGroup, cfg.Host, err)
	}
	k.version = version
	return k, nil
}

// discoverResourceVersion asks the API server which versions of
// resource.k8s.io it serves and returns the preferred one of ours, "" when
// the group is absent or serves none of ours.
func discoverResourceVersion(ctx context.Context, rc rest.Interface) (string, error) {
	raw, err := rc.Get().AbsPath("/apis", resourceGroup).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var g metav1.APIGroup
	if err := json.Unmarshal(raw, &g); err != nil {
		return "", fmt.Errorf("decoding the APIGroup: %w", err)
	}
	served := make(map[string]bool, len(g.Versions))
	for _, v := range g.Versions {
		served[v.Version] = true
	}
	for _, v := range resourceVersions {
		if served[v] {
			return v, nil
		}
	}
	return "", nil
}

// kube is Kube served by client-go.
type kube struct {
	cs        kubernetes.Interface
	md        metadata.Interface
	discovery rest.Interface

	mu      sync.Mutex
	version string // the resource.k8s.io version claims are read at; "": none served
}

// GetPod reads the Pod. NotFound is the API server's own answer for it
// (see apiNotFound); a 404 from something in front of the API server is
// an error of another kind, so it is neither a deleted Pod nor an answer.
func (k *kube) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p, err := k.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	return p, ownNotFound(err, "pod", name)
}

// GetNamespace reads the Namespace; NotFound as for GetPod.
func (k *kube) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns, err := k.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	return ns, ownNotFound(err, "namespace", name)
}

// ownNotFound is err, except that a NotFound the API server did not send
// for name becomes an error that is no NotFound and says what answered.
func ownNotFound(err error, kind, name string) error {
	if !apierrors.IsNotFound(err) || apiNotFound(err, name) {
		return err
	}
	return fmt.Errorf("GET %s %s answered 404 without naming it: something in front of the API server (a proxy?) does not know the path: %v", kind, name, err)
}

// GetResourceClaim reads the claim at the resource.k8s.io version last
// discovered. NotFound means the claim does not exist, and nothing else
// does: a 404 that does not name the claim (the plain answer to a path
// nobody serves) is the version no longer served, or something in front of
// the API server that does not know the path. Then it asks which version
// the cluster serves now, and reads the claim there once; it returns
// ErrNoResourceClaims when the cluster serves none of ours, and an error
// saying what answered when it still serves the same one. Without a version
// it asks the same way first, so a group switched on again is found.
func (k *kube) GetResourceClaim(ctx context.Context, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	k.mu.Lock()
	version := k.version
	k.mu.Unlock()
	if version != "" {
		c, err := k.getClaim(ctx, version, namespace, name)
		if !apierrors.IsNotFound(err) || apiNotFound(err, name) {
			return c, err
		}
	}
	now, err := k.rediscover(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("a 404 that does not name the claim, and asking which %s version is served failed: %w", resourceGroup, err)
	case now == "":
		return nil, ErrNoResourceClaims
	case now != version:
		c, err := k.getClaim(ctx, now, namespace, name)
		if !apierrors.IsNotFound(err) || apiNotFound(err, name) {
			return c, err
		}
	}
	// Not a NotFound: the claim may well exist.
	return nil, fmt.Errorf("GET %s/%s answered 404 without naming the claim, while the API server serves that version: something in front of the API server (a proxy?) does not know the path",
		resourceGroup, now)
}

func (k *kube) getClaim(ctx context.Context, version, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	gvr := schema.GroupVersionResource{Group: resourceGroup, Version: version, Resource: "resourceclaims"}
	return k.md.Resource(gvr).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
}

// rediscover asks the API server which resource.k8s.io version it serves
// now, and reads claims there from now on.
func (k *kube) rediscover(ctx context.Context) (string, error) {
	version, err := discoverResourceVersion(ctx, k.discovery)
	if err != nil {
		return "", err
	}
	k.mu.Lock()
	k.version = version
	k.mu.Unlock()
	return version, nil
}

// apiNotFound reports whether err is the API server's answer for an
// object name that does not exist: a Status it sent, NotFound, naming the
// object. client-go makes a NotFound of any 404, with the request's name in
// it; one built from a body that was no Status carries the cause
// UnexpectedServerResponse.
func apiNotFound(err error, name string) bool {
	var se apierrors.APIStatus
	if !apierrors.IsNotFound(err) || apierrors.IsUnexpectedServerError(err) || !errors.As(err, &se) {
		return false
	}
	d := se.Status().Details
	return d != nil && d.Name == name
}

func (k *kube) PatchPodStatus(ctx context.Context, namespace, name string, patch []byte) error {
	_, err := k.cs.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}
