package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"fiberd.io/fiberd/internal/repotest"
)

// TestHookedTestsRunInBothBuilds: make test runs pkg/fiberd's tests in
// its testhooks build only where HOOKED_TESTS names them. A test whose
// assertions read TestHooks, or that exists only in that build, must be
// named there, or its testhooks half would never run.
func TestHookedTestsRunInBothBuilds(t *testing.T) {
	root := repotest.Root(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^HOOKED_TESTS := (.+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile sets no HOOKED_TESTS")
	}
	hooked, err := regexp.Compile(strings.ReplaceAll(string(m[1]), "$$", "$"))
	if err != nil {
		t.Fatalf("HOOKED_TESTS %q: %v", m[1], err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "pkg/fiberd/*_test.go"))
	found := 0
	for _, path := range files {
		fs := token.NewFileSet()
		f, err := parser.ParseFile(fs, path, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		tagged := false
		for _, c := range f.Comments {
			for _, l := range c.List {
				if strings.HasPrefix(l.Text, "//go:build") && strings.Contains(l.Text, "testhooks") {
					tagged = true
				}
			}
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			if !tagged && !mentions(fn.Body, "TestHooks") {
				continue
			}
			found++
			if !hooked.MatchString(fn.Name.Name) {
				t.Errorf("%s (%s) depends on the testhooks tag but HOOKED_TESTS in the Makefile does not name it: make test would never run it in that build", fn.Name.Name, filepath.Base(path))
			}
		}
	}
	if found == 0 {
		t.Error("found no test of pkg/fiberd that depends on the testhooks tag: is HOOKED_TESTS still needed?")
	}
}

// mentions reports whether n uses the identifier name.
func mentions(n ast.Node, name string) bool {
	seen := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			seen = true
		}
		return !seen
	})
	return seen
}
