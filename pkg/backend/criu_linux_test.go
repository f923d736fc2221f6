package backend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCRIUVersion(t *testing.T) {
	for _, c := range []struct {
		out  string
		want string
		ok   bool
	}{
		{"Version: 4.2.1\n", "4.2.1", true},
		{"Version: 4.2\nGitID: v4.2\n", "4.2", true},
		{"Version: 5.0-rc1\n", "5.0-rc1", true},
		{"Version: 4.1.1\n", "4.1.1", false},
		{"Version: 3.17.1\n", "3.17.1", false},
	} {
		v, err := parseCRIUVersion([]byte(c.out))
		if err != nil || v != c.want {
			t.Errorf("parseCRIUVersion(%q) = %q, %v; want %q", c.out, v, err, c.want)
		}
		if got := versionAtLeast(v, minCRIU); got != c.ok {
			t.Errorf("versionAtLeast(%q, 4.2) = %v, want %v", v, got, c.ok)
		}
	}
	if _, err := parseCRIUVersion([]byte("criu: unknown option\n")); err == nil {
		t.Error("parseCRIUVersion accepted output without a version")
	}
}

func TestOwnDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kdat")
	if err := ownDir(dir); err != nil {
		t.Fatalf("ownDir(new) = %v", err)
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Fatalf("made with mode %v, want 0700", st.Mode())
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := ownDir(dir); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Fatalf("ownDir(world-writable) = %v, want a refusal", err)
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o600)
	if err := ownDir(file); err == nil {
		t.Fatal("ownDir(a file) = nil, want a refusal")
	}
}

func TestErrorLines(t *testing.T) {
	log := filepath.Join(t.TempDir(), "dump.log")
	os.WriteFile(log, []byte(`(00.001) Warn  (criu/kerndat.c:1): something
(00.002) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.003) Error (criu/bfd.c:1): bfd: Error flushing image: No space left on device
(00.004) Error (criu/bfd.c:1): bfd: Error flushing image: No space left on device
(00.005) Error (criu/cr-dump.c:2): Dumping FAILED.
`), 0o600)
	got := errorLines(log, 4)
	if got != "bfd: Error flushing image: No space left on device; Dumping FAILED." {
		t.Fatalf("errorLines = %q", got)
	}
	err := criuFailure("dump", os.ErrClosed, log, t.TempDir(), false)
	if !strings.Contains(err.Error(), "no space left on device") || strings.Contains(err.Error(), log) {
		t.Fatalf("criuFailure = %v", err)
	}
}
