package layout

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "fiberd.io/fiberd"

type pkg struct {
	ImportPath string
	Doc        string
	Name       string
	Deps       []string
	Imports    []string
}

// listPackages runs `go list -deps=false -json ./...` from the module root.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no package doc comment (add a doc.go)", p.ImportPath)
		}
	}
}

func own(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

func under(path, prefix string) bool {
	return path == module+"/"+prefix || strings.HasPrefix(path, module+"/"+prefix+"/")
}

func TestImportsPointInward(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, d := range p.Deps {
			switch {
			case under(p.ImportPath, "pkg/core") && own(d):
				t.Errorf("%s imports %s: pkg/core imports nothing of the project", p.ImportPath, d)
			case strings.HasPrefix(d, "k8s.io/client-go/") || d == "k8s.io/client-go":
				// The pool client watches a pool's EndpointSlices (docs/design.md
				// decision 106): a caller's library, which the agent never imports.
				if !under(p.ImportPath, "pkg/home/kubernetes") && !under(p.ImportPath, "pkg/client/pool") && !under(p.ImportPath, "cmd") &&
					!under(p.ImportPath, "test") && !under(p.ImportPath, "bench") {
					t.Errorf("%s depends on %s: only pkg/home/kubernetes, pkg/client/pool, commands and tests may use client-go", p.ImportPath, d)
				}
			case under(p.ImportPath, "pkg/fiberd") && under(d, "pkg/client"):
				t.Errorf("%s imports %s: the agent never imports a client of itself", p.ImportPath, d)
			case under(p.ImportPath, "pkg/home") && under(d, "pkg/fiberd"):
				t.Errorf("%s imports %s: a home never imports the agent; satisfy its interfaces structurally", p.ImportPath, d)
			case (under(p.ImportPath, "pkg/grant") || under(p.ImportPath, "pkg/endpoint") ||
				under(p.ImportPath, "pkg/cgroup") || under(p.ImportPath, "pkg/backend")) &&
				(under(d, "pkg/fiberd") || under(d, "pkg/home")):
				t.Errorf("%s imports %s: imports point down (cmd -> fiberd -> home/backend/grant -> core)", p.ImportPath, d)
			}
		}
	}
}
