package repotest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// From this package's directory the root is two levels up and holds the
// module's go.mod.
func TestRootIsTheModuleRoot(t *testing.T) {
	root := Root(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Dir(filepath.Dir(wd)); root != want {
		t.Errorf("Root = %s, want %s", root, want)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.HasPrefix(string(mod), "module fiberd.io/fiberd\n") {
		t.Errorf("go.mod at the root: %v, %.40q", err, mod)
	}
}

// Outside any module the search fails, naming where it started.
func TestFindFailsOutsideAModule(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	root, err := find()
	if err == nil {
		t.Skipf("the temp directory %s lies in a module (go.mod in %s)", dir, root)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("find() = %v, want an error naming %s", err, dir)
	}
}
