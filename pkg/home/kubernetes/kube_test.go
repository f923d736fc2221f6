package kubernetes_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"fiberd.io/fiberd/pkg/home/kubernetes"
)

// apiServer is the few endpoints of an API server NewKube's client talks
// to, enough to check the requests it makes. The real API server is the
// integration tests'.
type apiServer struct {
	*httptest.Server
	mu       sync.Mutex
	versions []string // resource.k8s.io versions; nil: no group
	seen     []string // "METHOD path content-type"
	patch    []byte
	// claimGone makes the claim gpu answer the 404 the API server gives
	// for a missing object: a Status naming it.
	claimGone bool
	// front404 makes every claim path answer the plain 404 of something in
	// front of the API server that does not know the path.
	front404 bool
	// front404Core does the same for the Pod and Namespace paths.
	front404Core bool
}

// set changes what s serves, under its lock.
func (s *apiServer) set(fn func(s *apiServer)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s)
}

func newAPIServer(t *testing.T, versions []string) *apiServer {
	t.Helper()
	s := &apiServer{versions: versions}
	notFound := func(w http.ResponseWriter, what string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: what + " not found",
		})
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		if r.Method == http.MethodPatch {
			s.patch = body
		}
		versions, claimGone, front404, front404Core := s.versions, s.claimGone, s.front404, s.front404Core
		s.mu.Unlock()
		p := r.URL.Path
		if front404Core && strings.HasPrefix(p, "/api/v1/namespaces/") {
			http.NotFound(w, r)
			return
		}
		if name, ok := strings.CutPrefix(p, "/api/v1/namespaces/team-a/pods/"); ok && name != testPod && name != testPod+"/status" {
			// The API server's answer for a Pod that does not exist: a
			// Status naming it.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{
				TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
				Message: `pods "` + name + `" not found`,
				Details: &metav1.StatusDetails{Name: name, Kind: "pods"},
			})
			return
		}
		if version, ok := strings.CutPrefix(p, "/apis/resource.k8s.io/"); ok && strings.HasSuffix(p, "/resourceclaims/gpu") {
			version, _, _ = strings.Cut(version, "/")
			if front404 || !slices.Contains(versions, version) {
				// What a proxy answers, and the API server too for a
				// version it does not serve: no Status, no name.
				http.NotFound(w, r)
				return
			}
			if claimGone {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_ = json.NewEncoder(w).Encode(metav1.Status{
					TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
					Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
					Message: `resourceclaims.resource.k8s.io "gpu" not found`,
					Details: &metav1.StatusDetails{Name: "gpu", Group: "resource.k8s.io", Kind: "resourceclaims"},
				})
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case p == "/apis/resource.k8s.io":
			if versions == nil {
				notFound(w, "group")
				return
			}
			g := metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: "resource.k8s.io"}
			for _, v := range versions {
				g.Versions = append(g.Versions, metav1.GroupVersionForDiscovery{GroupVersion: "resource.k8s.io/" + v, Version: v})
			}
			_ = json.NewEncoder(w).Encode(g)
		case strings.HasPrefix(p, "/apis/resource.k8s.io/") && strings.HasSuffix(p, "/namespaces/team-a/resourceclaims/gpu"):
			_ = json.NewEncoder(w).Encode(metav1.PartialObjectMetadata{
				TypeMeta:   metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"},
				ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "gpu", UID: "claim-uid"},
			})
		case p == "/api/v1/namespaces/team-a/pods/"+testPod, p == "/api/v1/namespaces/team-a/pods/"+testPod+"/status":
			pod := newPod()
			pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
			_ = json.NewEncoder(w).Encode(pod)
		case p == "/api/v1/namespaces/team-a":
			ns := newNamespace()
			ns.TypeMeta = metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"}
			_ = json.NewEncoder(w).Encode(ns)
		default:
			notFound(w, p)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// NewKube "discovers which resource.k8s.io version it serves", preferring
// v1, then v1beta2, then v1beta1; "A cluster without that group still
// works, and GetResourceClaim then returns ErrNoResourceClaims."
func TestNewKubeDiscoversTheResourceVersion(t *testing.T) {
	tests := []struct {
		name     string
		versions []string
		want     string // "" = ErrNoResourceClaims
	}{
		{"all three", []string{"v1beta1", "v1beta2", "v1"}, "v1"},
		{"betas", []string{"v1beta1", "v1beta2"}, "v1beta2"},
		{"v1beta1", []string{"v1beta1"}, "v1beta1"},
		{"only an alpha", []string{"v1alpha3"}, ""},
		{"no group", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newAPIServer(t, tt.versions)
			k, err := kubernetes.NewKube(t.Context(), &rest.Config{Host: s.URL})
			if err != nil {
				t.Fatalf("NewKube: %v", err)
			}
			c, err := k.GetResourceClaim(t.Context(), testNS, "gpu")
			if tt.want == "" {
				if !errors.Is(err, kubernetes.ErrNoResourceClaims) {
					t.Fatalf("GetResourceClaim: %v, want ErrNoResourceClaims", err)
				}
				if _, err := k.GetPod(t.Context(), testNS, testPod); err != nil {
					t.Fatalf("GetPod on a cluster without resource.k8s.io: %v", err)
				}
				return
			}
			if err != nil || c.Name != "gpu" {
				t.Fatalf("GetResourceClaim = %v, %v", c, err)
			}
			want := "GET /apis/resource.k8s.io/" + tt.want + "/namespaces/team-a/resourceclaims/gpu "
			if reqs := s.requests(); reqs[len(reqs)-1] != want {
				t.Fatalf("last request %q, want %q", reqs[len(reqs)-1], want)
			}
		})
	}
}

// The typed clientset reads Pods and Namespaces, and the status patch is a
// strategic merge patch of the status subresource. A missing object is
// NotFound.
func TestNewKubeRequests(t *testing.T) {
	s := newAPIServer(t, []string{"v1"})
	k, err := kubernetes.NewKube(t.Context(), &rest.Config{Host: s.URL})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := k.GetPod(t.Context(), testNS, testPod); err != nil || string(p.UID) != testUID {
		t.Fatalf("GetPod = %v, %v", p, err)
	}
	if n, err := k.GetNamespace(t.Context(), testNS); err != nil || n.Name != testNS {
		t.Fatalf("GetNamespace = %v, %v", n, err)
	}
	if _, err := k.GetPod(t.Context(), testNS, "gone"); !apierrors.IsNotFound(err) {
		t.Fatalf("GetPod of a missing Pod: %v, want NotFound", err)
	}
	// A 404 that does not come from the API server for the object (a
	// proxy's) is no NotFound: neither a deleted Pod nor an answer for it.
	s.set(func(s *apiServer) { s.front404Core = true })
	if _, err := k.GetPod(t.Context(), testNS, testPod); err == nil || apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "in front of the API server") {
		t.Fatalf("GetPod answered by a proxy's 404: %v, want an error that is no NotFound and says what answered", err)
	}
	if _, err := k.GetNamespace(t.Context(), testNS); err == nil || apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "in front of the API server") {
		t.Fatalf("GetNamespace answered by a proxy's 404: %v, want an error that is no NotFound", err)
	}
	s.set(func(s *apiServer) { s.front404Core = false })
	patch := []byte(`{"status":{"conditions":[{"type":"fiberd.io/zygote-ready","status":"True"}]}}`)
	if err := k.PatchPodStatus(t.Context(), testNS, testPod, patch); err != nil {
		t.Fatalf("PatchPodStatus: %v", err)
	}
	reqs := s.requests()
	want := "PATCH /api/v1/namespaces/team-a/pods/" + testPod + "/status application/strategic-merge-patch+json"
	if reqs[len(reqs)-1] != want {
		t.Fatalf("patch request %q, want %q", reqs[len(reqs)-1], want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if string(s.patch) != string(patch) {
		t.Fatalf("patch body %s, want %s", s.patch, patch)
	}
}

// NewKube fails when discovery fails for another reason than the group
// being absent.
func TestNewKubeFailsOnBrokenDiscovery(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "etcd down", http.StatusInternalServerError)
	}))
	defer s.Close()
	if _, err := kubernetes.NewKube(t.Context(), &rest.Config{Host: s.URL}); err == nil {
		t.Fatal("NewKube ignored a failed discovery")
	}
	if _, err := kubernetes.NewKube(t.Context(), nil); err == nil {
		t.Fatal("NewKube(nil) succeeded")
	}
}

// "A Pod, Namespace or ResourceClaim that does not exist is an error for
// which apierrors.IsNotFound is true", and only then: a 404 that does not
// name the claim is its path not served. GetResourceClaim then asks which
// resource.k8s.io version the cluster serves now, and reads the claim there,
// says ErrNoResourceClaims when it serves none, or says that something in
// front of the API server answered for a path it does not know.
func TestGetResourceClaimTellsAnUnservedPathFromADeletedClaim(t *testing.T) {
	for _, tt := range []struct {
		name   string
		start  []string
		change func(s *apiServer)
		want   string // "claim", "not found", "no claims" or "in front"
		last   string // the last request, "" for any
	}{
		{"claim deleted", []string{"v1"}, func(s *apiServer) { s.claimGone = true }, "not found", ""},
		{"version dropped, another served", []string{"v1beta1"}, func(s *apiServer) { s.versions = []string{"v1"} }, "claim",
			"GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gpu "},
		{"group switched off", []string{"v1"}, func(s *apiServer) { s.versions = nil }, "no claims", "GET /apis/resource.k8s.io "},
		{"group switched on", nil, func(s *apiServer) { s.versions = []string{"v1beta2"} }, "claim",
			"GET /apis/resource.k8s.io/v1beta2/namespaces/team-a/resourceclaims/gpu "},
		{"a proxy in front answers 404", []string{"v1"}, func(s *apiServer) { s.front404 = true }, "in front", "GET /apis/resource.k8s.io "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newAPIServer(t, tt.start)
			k, err := kubernetes.NewKube(t.Context(), &rest.Config{Host: s.URL})
			if err != nil {
				t.Fatal(err)
			}
			if tt.start != nil {
				if _, err := k.GetResourceClaim(t.Context(), testNS, "gpu"); err != nil {
					t.Fatalf("GetResourceClaim before the change: %v", err)
				}
			}
			s.set(tt.change)
			c, err := k.GetResourceClaim(t.Context(), testNS, "gpu")
			switch tt.want {
			case "claim":
				if err != nil || c.Name != "gpu" {
					t.Fatalf("GetResourceClaim = %v, %v; want the claim, read at the version served now", c, err)
				}
			case "not found":
				if !apierrors.IsNotFound(err) {
					t.Fatalf("GetResourceClaim of a deleted claim = %v, want NotFound", err)
				}
			case "no claims":
				if !errors.Is(err, kubernetes.ErrNoResourceClaims) || apierrors.IsNotFound(err) {
					t.Fatalf("GetResourceClaim with the group gone = %v, want ErrNoResourceClaims and not NotFound", err)
				}
			case "in front":
				if err == nil || apierrors.IsNotFound(err) || errors.Is(err, kubernetes.ErrNoResourceClaims) {
					t.Fatalf("GetResourceClaim through a proxy answering 404 = %v, want an error that is neither NotFound nor ErrNoResourceClaims", err)
				}
				if !strings.Contains(err.Error(), "in front of the API server") {
					t.Errorf("error %q does not say what answered", err)
				}
			}
			if reqs := s.requests(); tt.last != "" && reqs[len(reqs)-1] != tt.last {
				t.Fatalf("requests %q, want the last to be %q", reqs, tt.last)
			}
		})
	}
}
