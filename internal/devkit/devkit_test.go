package devkit

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/template"
)

func TestWriteSpecKeepsEqualFile(t *testing.T) {
	dir := t.TempDir()
	spec := CounterCSpec("/opt/t/counter", true, "--init-ms", "200")
	b, err := WriteSpec(dir, "counter-c", spec)
	if err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"command\": \"/opt/t/counter\",\n  \"args\": [\n    \"--init-ms\",\n    \"200\"\n  ],\n  \"workdir\": \"/opt/t\",\n  \"zygote\": true\n}\n"
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
	if py.Args[0] != "/src/examples/templates/python/counter.py" || py.Env["PYTHONPATH"] != "/src/sdk/zygote/python" || py.Zygote {
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
