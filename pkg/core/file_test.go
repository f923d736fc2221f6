package core

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ReadFileBounded: a file of exactly limit bytes is read whole.
func TestReadFileBoundedReadsUpToTheLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("12345678"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFileBounded(path, 8)
	if err != nil || string(b) != "12345678" {
		t.Fatalf("ReadFileBounded = %q, %v; want the whole file", b, err)
	}
}

// "refusing it ... when it holds more than limit bytes": an error naming
// the path and wrapping ErrInvalid.
func TestReadFileBoundedRefusesALongerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := ReadFileBounded(path, 8)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "8-byte limit") {
		t.Fatalf("ReadFileBounded of 9 bytes, limit 8 = %q, %v; want ErrInvalid naming the path and the limit", b, err)
	}
}

// "A path that is not a regular file (a FIFO, a device) is refused before
// it is opened, so a reader never blocks on it."
func TestReadFileBoundedRefusesAFIFOWithoutBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadFileBounded(path, 8); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("ReadFileBounded of a FIFO = %v; want ErrInvalid, not a regular file", err)
		}
	case <-time.After(10 * time.Second):
		// Opening the FIFO for writing releases the blocked reader.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("ReadFileBounded blocked on a FIFO")
	}
}

// "a missing file fails with fs.ErrNotExist."
func TestReadFileBoundedMissingFile(t *testing.T) {
	_, err := ReadFileBounded(filepath.Join(t.TempDir(), "none"), 8)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadFileBounded of a missing file = %v; want fs.ErrNotExist", err)
	}
}

func TestWriteFileAtomicReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := WriteFileAtomic(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(path, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if string(b) != "two" || fi.Mode().Perm() != 0o644 {
		t.Fatalf("content %q mode %v; want two, 0644", b, fi.Mode().Perm())
	}
}

func TestWriteFileAtomicKeepsOldOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFileAtomic(path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Renaming a file over a non-empty directory fails; the directory stays.
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	os.WriteFile(filepath.Join(sub, "x"), nil, 0o644)
	err := WriteFileAtomic(sub, []byte("two"), 0o644)
	if err == nil || !strings.Contains(err.Error(), sub) {
		t.Fatalf("WriteFileAtomic over a non-empty directory: %v; want an error naming the path", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("directory holds %d entries after a failed write, want 2 (temp file removed)", len(ents))
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Errorf("file = %q, want the previous content", b)
	}
}
