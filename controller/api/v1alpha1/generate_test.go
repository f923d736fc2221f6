package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGenerated runs controller-gen (a tool of this module) into a temporary directory and fails
// when the checked-in DeepCopy methods, CRD or ClusterRole differ from what it writes: run `make
// generate` and commit. The first run compiles controller-gen (about a minute on a cold cache).
func TestGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: controller-gen is not run")
	}
	out := t.TempDir()
	cmd := exec.Command("go", "tool", "controller-gen",
		"object", "paths=./api/...", "output:object:dir="+out,
		"crd", "output:crd:dir="+out, "rbac:roleName=fiberd-controller", "output:rbac:dir="+out, "paths=./...")
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen: %v\n%s", err, b)
	}
	for gen, checkedIn := range map[string]string{
		"zz_generated.deepcopy.go":  "zz_generated.deepcopy.go",
		"fiberd.io_fiberpools.yaml": filepath.Join("..", "..", "..", "deploy", "controller", "fiberd.io_fiberpools.yaml"),
		"role.yaml":                 filepath.Join("..", "..", "..", "deploy", "controller", "role.yaml"),
	} {
		want, err := os.ReadFile(filepath.Join(out, gen))
		if err != nil {
			t.Fatalf("controller-gen wrote no %s: %v", gen, err)
		}
		got, err := os.ReadFile(checkedIn)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make generate` and commit the result", checkedIn)
		}
	}
}
