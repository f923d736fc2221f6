package repotest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Root returns the module root: the working directory or the nearest
// directory above it that holds a go.mod. It fails t, naming the working
// directory, when there is none (a test binary run outside the checkout).
func Root(t testing.TB) string {
	t.Helper()
	root, err := find()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func find() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("module root: no go.mod in %s or above; run the test inside the checkout", wd)
		}
	}
}
