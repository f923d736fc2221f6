package kubernetes

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
)

// CgroupRoot: "Empty means the cgroup this process runs in, under
// /sys/fs/cgroup, delegated: fiberd moves into its `fiberd` leaf and carves
// under its `grants` child." The delegation itself is pkg/cgroup's and
// tested there; here, that New asks for it, and that without a cgroup to
// delegate the home runs without per-fiber cgroups, saying so once.
func TestResolveCgroupRoot(t *testing.T) {
	self := func() (string, error) { return "/sys/fs/cgroup/kubepods/pod1/c1", nil }
	var delegated []string
	delegate := func(root string, _ logr.Logger) (string, error) {
		delegated = append(delegated, root)
		return root + "/grants", nil
	}
	got, err := resolveCgroupRoot("", self, delegate, logr.Discard())
	if err != nil || got != "/sys/fs/cgroup/kubepods/pod1/c1/grants" {
		t.Fatalf("empty CgroupRoot: %q, %v; want the grants child of the delegated cgroup", got, err)
	}
	if !slices.Equal(delegated, []string{"/sys/fs/cgroup/kubepods/pod1/c1"}) {
		t.Fatalf("delegated %q, want this process's cgroup", delegated)
	}

	delegated = nil
	got, err = resolveCgroupRoot("/sys/fs/cgroup/fiberd.slice", self, delegate, logr.Discard())
	if err != nil || got != "/sys/fs/cgroup/fiberd.slice" || delegated != nil {
		t.Fatalf("set CgroupRoot: %q, %v, delegated %q; want it as given, nothing delegated", got, err, delegated)
	}

	// No cgroup to delegate: no per-fiber cgroups, and one log line saying
	// why and what would give them.
	for _, tc := range []struct {
		name     string
		self     func() (string, error)
		delegate func(string, logr.Logger) (string, error)
		reason   string
	}{
		{"delegation refused", self, func(string, logr.Logger) (string, error) {
			return "", errors.New("read-only file system")
		}, "/sys/fs/cgroup/kubepods/pod1/c1: read-only file system"},
		{"no cgroup v2", func() (string, error) { return "", errors.New("no cgroup2 mount") }, delegate, "no cgroup2 mount"},
	} {
		var lines []string
		log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
		got, err := resolveCgroupRoot("", tc.self, tc.delegate, log)
		if err != nil || got != "" {
			t.Errorf("%s: %q, %v; want no cgroup root and no error", tc.name, got, err)
		}
		if len(lines) != 1 || !strings.Contains(lines[0], "without per-fiber cgroups") || !strings.Contains(lines[0], tc.reason) || !strings.Contains(lines[0], "-cgroup-root") {
			t.Errorf("%s: logged %q; want one line saying so, the reason %q and the fix", tc.name, lines, tc.reason)
		}
	}
}

// The Pod's claims: named directly in spec, or generated from a template
// and named in status.
func TestPodClaims(t *testing.T) {
	ptr := func(s string) *string { return &s }
	p := &corev1.Pod{
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{
			{Name: "direct", ResourceClaimName: ptr("shared-gpu")},
			{Name: "tmpl", ResourceClaimTemplateName: ptr("gpu-template")},
			{Name: "unneeded", ResourceClaimTemplateName: ptr("t2")},
		}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{
			{Name: "tmpl", ResourceClaimName: ptr("pod-tmpl-x7k")},
			{Name: "unneeded"}, // nil: no claim was needed
		}},
	}
	if got, want := podClaims(p), []string{"shared-gpu", "pod-tmpl-x7k"}; !slices.Equal(got, want) {
		t.Fatalf("podClaims = %q, want %q", got, want)
	}
	if got := podClaims(&corev1.Pod{}); len(got) != 0 {
		t.Fatalf("podClaims of a Pod without claims = %q", got)
	}
}
