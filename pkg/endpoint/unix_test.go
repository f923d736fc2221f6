package endpoint

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.sock")
	l, url, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("ListenUnix: %v", err)
	}
	defer l.Close()
	if url != "unix://"+path {
		t.Fatalf("url = %q", url)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, want a socket with 0600", fi.Mode())
	}
	network, address, err := Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial(network, address)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.Close()
}

func TestListenUnixReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.sock")
	// A socket file with nobody behind it, as a crashed fiberd leaves.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket not in place: %v", err)
	}
	l, _, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	l.Close()
}

func TestListenUnixRefuses(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, sub, link, "rel.sock", "/" + strings.Repeat("x", MaxUnixPath)} {
		if l, _, err := ListenUnix(path); err == nil {
			l.Close()
			t.Errorf("ListenUnix(%q) succeeded, want an error", path)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("regular file changed: %q, %v", b, err)
	}
	if fi, err := os.Stat(sub); err != nil || !fi.IsDir() {
		t.Errorf("directory changed: %v", err)
	}
}
