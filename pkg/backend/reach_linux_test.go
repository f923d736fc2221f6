package backend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadableByGrants: what a stranger to the host can read, and what an
// isolated grant sees empty.
func TestReadableByGrants(t *testing.T) {
	if err := ReadableByGrants("/bin/sh"); err != nil {
		t.Errorf("/bin/sh: %v, want readable", err)
	}
	for _, p := range []string{"/tmp/x/y", "/tmp", "/var/tmp/z", "/dev/shm/a", "/sys/fs/cgroup/fiberd"} {
		if err := ReadableByGrants(p); err == nil || !strings.Contains(err.Error(), "sees empty") {
			t.Errorf("%s: %v, want an error saying an isolated grant sees it empty", p, err)
		}
	}
	// A link outside the hidden directories that lies in one is hidden
	// too: the grant sees neither the link nor its directory.
	dir := t.TempDir()
	link := filepath.Join(dir, "sh")
	if err := os.Symlink("/bin/sh", link); err != nil {
		t.Fatal(err)
	}
	if err := ReadableByGrants(link); err == nil {
		t.Errorf("a link under %s counts as readable", dir)
	}
}

// TestReadableByOthers: the mode bits of others along the path decide.
func TestReadableByOthers(t *testing.T) {
	dir := t.TempDir()
	// t.TempDir's directories are 0700; open them as a host's are.
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := filepath.Join(dir, "a")
	b := filepath.Join(a, "b")
	f := filepath.Join(b, "f")
	if err := os.MkdirAll(b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		aMode, bMode os.FileMode
		fMode        os.FileMode
		path         string
		bad          string // in the error, "" for none
	}{
		{"all open", 0o755, 0o755, 0o644, f, ""},
		{"search only", 0o711, 0o711, 0o604, f, ""},
		{"closed directory", 0o755, 0o700, 0o644, f, "directory " + b},
		{"closed above", 0o750, 0o755, 0o644, f, "directory " + a},
		{"unreadable file", 0o755, 0o755, 0o640, f, "not readable"},
		{"directory without read", 0o755, 0o711, 0o644, b, "not readable"},
		{"directory", 0o755, 0o755, 0o644, b, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, m := range []struct {
				p    string
				mode os.FileMode
			}{{a, tc.aMode}, {b, tc.bMode}, {f, tc.fMode}} {
				if err := os.Chmod(m.p, m.mode); err != nil {
					t.Fatal(err)
				}
			}
			err := readableByOthers(tc.path)
			switch {
			case tc.bad == "" && err != nil:
				t.Errorf("readableByOthers(%s) = %v, want nil", tc.path, err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Errorf("readableByOthers(%s) = %v, want an error naming %q", tc.path, err, tc.bad)
			}
		})
	}
	if err := os.Chmod(a, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(b, 0o755); err != nil {
		t.Fatal(err)
	}
}
