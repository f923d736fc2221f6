package devkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/template"
)

func TestWriteSpecKeepsEqualFile(t *testing.T) {
	dir := t.TempDir()
	spec := CounterCSpec("/opt/t/counter", true, "--init-ms", "200")
	b, err := WriteSpec(dir, "counter-c", spec)
	if err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"command\": \"/opt/t/counter\",\n  \"args\": [\n    \"--init-ms\",\n    \"200\"\n  ],\n  \"zygote\": true\n}\n"
	if string(b) != want {
		t.Fatalf("spec bytes (their digest is in every grant) changed:\n%s\nwant\n%s", b, want)
	}
	path := filepath.Join(dir, "counter-c.json")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteSpec(dir, "counter-c", spec); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); !fi.ModTime().Equal(old) {
		t.Errorf("an equal spec was rewritten (mtime %v, want %v)", fi.ModTime(), old)
	}
	spec.Zygote = false
	b2, err := WriteSpec(dir, "counter-c", spec)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if string(got) != string(b2) || template.Digest(b2) == template.Digest(b) {
		t.Errorf("a changed spec was not written: file %q, returned %q", got, b2)
	}
	if _, err := template.Parse(got); err != nil {
		t.Errorf("written spec does not parse: %v", err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		zygote bool
		want   string
	}{{true, "counter-c"}, {false, "counter-c-cold"}} {
		if got := ColdName("counter-c", tc.zygote); got != tc.want {
			t.Errorf("ColdName(counter-c, %v) = %q, want %q", tc.zygote, got, tc.want)
		}
	}
	py := CounterPySpec("/src", "/usr/bin/python3", false, "--init-ms", "5")
	if py.Args[0] != "/src/examples/templates/python/counter.py" || py.Env["PYTHONPATH"] != "/src/sdk/zygote/python" || py.Zygote || py.Workdir != "" {
		t.Errorf("CounterPySpec = %+v", py)
	}
}

func TestIsCheckout(t *testing.T) {
	dir := t.TempDir()
	if IsCheckout(dir) {
		t.Fatal("an empty directory is a checkout")
	}
	for _, p := range []string{"examples/templates/c/counter.c", "examples/templates/python/counter.py", "sdk/zygote/c/build.sh"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !IsCheckout(dir) {
		t.Fatal("a directory with the examples is no checkout")
	}
}

// TestCopyPythonExample: the copy has the checkout's layout, others may
// read it, and an equal file is left alone.
func TestCopyPythonExample(t *testing.T) {
	root := checkout(t)
	dir := filepath.Join(t.TempDir(), "examples")
	got, err := CopyPythonExample(root, dir)
	if err != nil || got != dir {
		t.Fatalf("CopyPythonExample = %q, %v", got, err)
	}
	spec := CounterPySpec(dir, "/usr/bin/python3", true)
	for _, p := range []string{spec.Args[0], filepath.Join(spec.Env["PYTHONPATH"], "fiberzygote.py")} {
		want, _ := os.ReadFile(filepath.Join(root, strings.TrimPrefix(p, dir)))
		b, err := os.ReadFile(p)
		if err != nil || string(b) != string(want) || len(b) == 0 {
			t.Fatalf("%s: %v, or not the checkout's file", p, err)
		}
		for d := p; d != filepath.Dir(dir); d = filepath.Dir(d) {
			st, err := os.Stat(d)
			if err != nil {
				t.Fatal(err)
			}
			if want := os.FileMode(0o644); !st.IsDir() && st.Mode().Perm() != want || st.IsDir() && st.Mode().Perm() != 0o755 {
				t.Errorf("%s has mode %v, want 0644 for a file and 0755 for a directory", d, st.Mode().Perm())
			}
		}
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(spec.Args[0], old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyPythonExample(root, dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(spec.Args[0]); !st.ModTime().Equal(old) {
		t.Error("an equal file was copied again")
	}
}

// TestSharePythonExample: as root, a copy others can read, outside the
// directories an isolated grant sees empty, shared by checkouts with the
// same files and apart for other files.
func TestSharePythonExample(t *testing.T) {
	root := checkout(t)
	if os.Geteuid() != 0 {
		if _, err := SharePythonExample(root); err == nil {
			t.Error("SharePythonExample succeeded without root")
		}
		t.Skip("not root: SharePythonExample cannot make its directory")
	}
	a, err := SharePythonExample(root)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(a) != ExamplesBase {
		t.Errorf("SharePythonExample = %q, want a directory under %s", a, ExamplesBase)
	}
	spec := CounterPySpec(a, "/usr/bin/python3", true)
	for _, p := range []string{spec.Args[0], filepath.Join(spec.Env["PYTHONPATH"], "fiberzygote.py")} {
		if err := backend.ReadableByGrants(p); err != nil {
			t.Error(err)
		}
	}
	// Another checkout with the same files shares the copy; with other
	// files it gets its own.
	other := filepath.Join(t.TempDir(), "checkout")
	if _, err := CopyPythonExample(root, other); err != nil {
		t.Fatal(err)
	}
	if b, err := SharePythonExample(other); err != nil || b != a {
		t.Errorf("SharePythonExample of an equal checkout = %q, %v; want %q", b, err, a)
	}
	f := filepath.Join(other, pythonFiles[0])
	if err := os.WriteFile(f, []byte("# changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := SharePythonExample(other)
	if err != nil || c == a {
		t.Fatalf("SharePythonExample of changed files = %q, %v; want a directory other than %q", c, err, a)
	}
	t.Cleanup(func() { os.RemoveAll(c) })
	if b, _ := os.ReadFile(filepath.Join(c, pythonFiles[0])); string(b) != "# changed\n" {
		t.Errorf("the changed copy holds %q", b)
	}
}

// TestPythonInterpreter: the interpreter found is one an isolated grant
// can read whenever the host has one.
func TestPythonInterpreter(t *testing.T) {
	py, err := PythonInterpreter()
	if err != nil {
		t.Skip(err)
	}
	readable := false
	for _, p := range systemPythons {
		readable = readable || backend.ReadableByGrants(p) == nil
	}
	if err := backend.ReadableByGrants(py); readable && err != nil {
		t.Errorf("PythonInterpreter = %s: %v, while the host has a python3 others can read", py, err)
	}
}

// TestBuildCounterC: the binary others may run, rebuilt only when a
// source is newer.
func TestBuildCounterC(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no cc")
	}
	out := t.TempDir()
	bin, err := BuildCounterC(checkout(t), out)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(bin)
	if err != nil || st.Mode().Perm()&0o005 != 0o005 {
		t.Fatalf("%s: %v, mode %v: want a binary others may run", bin, err, st.Mode())
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 1 {
		t.Errorf("the build left %d entries in %s, want the binary alone", len(entries), out)
	}
	if again, err := BuildCounterC(checkout(t), out); err != nil || again != bin {
		t.Fatalf("second build: %q, %v", again, err)
	}
	if st2, _ := os.Stat(bin); !st2.ModTime().Equal(st.ModTime()) {
		t.Error("an up-to-date binary was built again")
	}
}

// checkout is the checkout this test runs in.
func checkout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil || !IsCheckout(root) {
		t.Fatalf("%s is no checkout: %v", root, err)
	}
	return root
}
