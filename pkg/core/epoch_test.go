package core

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	clocktesting "k8s.io/utils/clock/testing"
)

func readEpoch(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestEpochMissingFileStartsAtOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epoch")
	s, err := OpenEpochStore(path, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if s.Current() != 1 {
		t.Fatalf("epoch = %d, want 1 for a missing file", s.Current())
	}
	if got := readEpoch(t, path); got != "1" {
		t.Fatalf("file holds %q, want 1 persisted before use", got)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("epoch file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestEpochEachStartAddsOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epoch")
	for want := uint64(1); want <= 3; want++ {
		s, err := OpenEpochStore(path, nil, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		if s.Current() != want {
			t.Fatalf("start %d: epoch %d", want, s.Current())
		}
	}
}

func TestEpochCorruptFileUsesUnixTime(t *testing.T) {
	for _, content := range []string{"garbage", "", "0", "-5", "12x"} {
		t.Run(content, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "epoch")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1_800_000_000, 0)
			var logged []string
			log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
			s, err := OpenEpochStore(path, clocktesting.NewFakePassiveClock(now), log)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := s.Current(), uint64(now.Unix())+1; got != want {
				t.Fatalf("epoch %d, want Unix time + 1 = %d", got, want)
			}
			if len(logged) == 0 || !strings.Contains(logged[0], "corrupt") {
				t.Fatalf("corrupt epoch file not logged: %q", logged)
			}
		})
	}
}

func TestEpochNotPersistedIsNotServed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epoch")
	// A directory at the path cannot be read as a file, nor replaced by
	// rename, so the store must fail rather than serve an epoch it did not
	// persist.
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenEpochStore(path, nil, logr.Discard()); err == nil {
		t.Fatal("OpenEpochStore succeeded though the epoch could not be persisted")
	}
}

func TestEpochBumpPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "epoch")
	s, err := OpenEpochStore(path, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.Bump()
	if err != nil || n != 2 || s.Current() != 2 {
		t.Fatalf("Bump = %d, %v; Current %d; want 2", n, err, s.Current())
	}
	if got := readEpoch(t, path); got != "2" {
		t.Fatalf("file holds %q after Bump, want 2", got)
	}
	s2, err := OpenEpochStore(path, nil, logr.Discard())
	if err != nil || s2.Current() != 3 {
		t.Fatalf("restart after bump: epoch %d, %v; want 3", s2.Current(), err)
	}
}

func TestEpochFailedWriteKeepsPreviousFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "epoch")
	s, err := OpenEpochStore(path, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	// Make the rename target a non-empty directory so the rename fails after
	// the temp file was written.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Bump(); err == nil {
		t.Fatal("Bump reported success though the file could not be replaced")
	}
	if s.Current() != 2 {
		t.Fatalf("in-memory epoch %d after a failed persist, want 2 (old fences must die anyway)", s.Current())
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temporary file %s left behind after a failed write", e.Name())
		}
	}
}
