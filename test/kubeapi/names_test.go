package kubeapi

import (
	"regexp"
	"strings"
	"testing"
)

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestNamespaceNameIsAFreshDNSLabel(t *testing.T) {
	for _, test := range []string{
		"TestX",
		"TestScopeLoss/pod_replaced_(same_name,_new_UID)",
		"Test" + strings.Repeat("VeryLong", 20),
		"///",
		"",
	} {
		a, b := namespaceName(test), namespaceName(test)
		for _, n := range []string{a, b} {
			if len(n) > 63 || !dns1123Label.MatchString(n) {
				t.Errorf("namespaceName(%q) = %q, not a DNS-1123 label of at most 63 characters", test, n)
			}
		}
		if a == b {
			t.Errorf("namespaceName(%q) gave %q twice; each test needs a fresh namespace", test, a)
		}
	}
	if got := namespaceName("TestScopeLoss/pod_deleted"); !strings.HasPrefix(got, "testscopeloss-pod-deleted-") {
		t.Errorf("namespaceName kept too little of the test name: %q", got)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		ok   bool
	}{
		{"zero", Options{}, true},
		{"flags", Options{RuntimeConfig: "resource.k8s.io/v1=false", APIServerArgs: []string{"--v=2", "--feature-gates=A=true"}}, true},
		{"flag with a space", Options{APIServerArgs: []string{"--v=2 --x"}}, false},
		{"empty flag", Options{APIServerArgs: []string{""}}, false},
		{"runtime config with a space", Options{RuntimeConfig: "a=true, b=false"}, false},
		{"node address", Options{NodeAddress: "10.244.0.1"}, true},
		{"node address not IPv4", Options{NodeAddress: "fd00::1"}, false},
		{"node address not an address", Options{NodeAddress: "node-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.opts.validate(); (err == nil) != tc.ok {
				t.Errorf("validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestMissingBinariesNameTheMakeTarget(t *testing.T) {
	t.Setenv("FIBERD_KUBE_BIN", t.TempDir())
	_, _, err := findTools()
	if err == nil || !strings.Contains(err.Error(), "make kube-tools") {
		t.Fatalf("findTools() with an empty FIBERD_KUBE_BIN = %v, want an error naming `make kube-tools`", err)
	}
}
