package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// layout writes files into a temporary directory laid out like a cgroupfs
// directory (a regular directory stands in for the kernel's) and returns
// it as a Leaf.
func layout(t *testing.T, files map[string]string) Leaf {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return At(dir)
}

func read(t *testing.T, l Leaf, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.Path(), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSetMemoryLimit: memory.high, memory.max and memory.oom.group are
// written; a kernel without memory.oom.group is no error; a leaf without
// the memory controller (no memory.max) is one, naming the file; high above
// max is refused before anything is written.
func TestSetMemoryLimit(t *testing.T) {
	// Empty files: a regular file keeps what a shorter write leaves of it,
	// where the kernel would not.
	l := layout(t, map[string]string{"memory.max": "", "memory.high": "", "memory.oom.group": ""})
	if err := l.SetMemoryLimit(8<<20, 7<<20); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"memory.max": "8388608", "memory.high": "7340032", "memory.oom.group": "1"} {
		if got := read(t, l, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}

	old := layout(t, map[string]string{"memory.max": "", "memory.high": ""})
	if err := old.SetMemoryLimit(1<<20, 1<<20); err != nil {
		t.Fatalf("without memory.oom.group: %v", err)
	}

	none := layout(t, nil)
	if err := none.SetMemoryLimit(1<<20, 1<<20); err == nil || !strings.Contains(err.Error(), "memory.high") {
		t.Fatalf("without the memory controller: %v, want an error naming memory.high", err)
	}
	if err := l.SetMemoryLimit(1<<20, 2<<20); err == nil {
		t.Fatal("high above max accepted")
	}
	if got := read(t, l, "memory.max"); got != "8388608" {
		t.Fatalf("a refused limit wrote memory.max = %q", got)
	}
}

func TestEnabled(t *testing.T) {
	l := layout(t, map[string]string{"cgroup.subtree_control": "cpu memory pids\n"})
	if ok, err := l.Enabled("memory"); !ok || err != nil {
		t.Fatalf("Enabled(memory) = %v, %v", ok, err)
	}
	if ok, err := l.Enabled("io"); ok || err != nil {
		t.Fatalf("Enabled(io) = %v, %v", ok, err)
	}
	if _, err := layout(t, nil).Enabled("memory"); err == nil {
		t.Fatal("Enabled without cgroup.subtree_control: no error")
	}
}

func TestOOMKills(t *testing.T) {
	l := layout(t, map[string]string{"memory.events": "low 0\nhigh 3\nmax 5\noom 1\noom_kill 2\noom_group_kill 0\n"})
	if n, ok, err := l.OOMKills(); n != 2 || !ok || err != nil {
		t.Fatalf("OOMKills = %d, %v, %v; want 2", n, ok, err)
	}
	if n, ok, err := layout(t, nil).OOMKills(); n != 0 || ok || err != nil {
		t.Fatalf("OOMKills without memory.events = %d, %v, %v; want 0, false", n, ok, err)
	}
	if _, _, err := layout(t, map[string]string{"memory.events": "oom_kill lots\n"}).OOMKills(); err == nil {
		t.Fatal("a malformed oom_kill parsed")
	}
}
