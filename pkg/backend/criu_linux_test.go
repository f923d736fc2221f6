package backend

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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
	// The log's lines are quoted, and decide nothing: a filesystem with
	// room is not full whatever the log says (decision 99).
	err := criuFailure("dump", exitErr(t, "exit 1"), log, t.TempDir(), false)
	if !strings.Contains(err.Error(), got) || strings.Contains(err.Error(), log) || errors.Is(err, ErrNoSpace) {
		t.Fatalf("criuFailure = %v, want the log's error lines, no log path, no ErrNoSpace", err)
	}
	if err := criuFailure("restore", exitErr(t, "exit 1"), log, t.TempDir(), true); !strings.Contains(err.Error(), "(log "+log+")") {
		t.Fatalf("criuFailure of a kept log = %v, want the log named", err)
	}
}

// exitErr runs sh -c script, which must fail, and returns its error: an
// *exec.ExitError, as a failed criu run gives.
func exitErr(t *testing.T, script string) error {
	t.Helper()
	err := exec.Command("sh", "-c", script).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sh -c %q: %v, want an exit error", script, err)
	}
	return err
}

// smallTmpfs mounts a tmpfs with opts on a new directory, unmounted at the
// end of the test; it skips the test where that is not allowed.
func smallTmpfs(t *testing.T, opts string) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, opts); err != nil {
		t.Skipf("cannot mount a tmpfs (%s): %v", opts, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// TestCRIUFailureNoSpace: a criu that exited with an error is said to have
// failed for space (ErrNoSpace, and a message saying so) exactly when the
// image's filesystem is full, by blocks or by inodes, whatever its log
// says; a criu killed by a signal never is.
func TestCRIUFailureNoSpace(t *testing.T) {
	blocks := smallTmpfs(t, "size=64k,mode=0700")
	filler, err := os.Create(filepath.Join(blocks, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = filler.Write(make([]byte, 4096))
	}
	filler.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the tmpfs: %v, want ENOSPC", err)
	}
	inodes := smallTmpfs(t, "size=1m,nr_inodes=2,mode=0700")
	if err := os.WriteFile(filepath.Join(inodes, "only"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	noLog := filepath.Join(t.TempDir(), "none.log")
	for _, c := range []struct {
		name   string
		runErr error
		dir    string
		full   bool
	}{
		{"no block left", exitErr(t, "exit 1"), blocks, true},
		{"no inode left", exitErr(t, "exit 1"), inodes, true},
		{"room left", exitErr(t, "exit 1"), t.TempDir(), false},
		{"criu killed", exitErr(t, "kill -KILL $$"), blocks, false},
	} {
		err := criuFailure("dump", c.runErr, noLog, c.dir, false)
		said := strings.Contains(err.Error(), "no space left on device")
		if errors.Is(err, ErrNoSpace) != c.full || said != c.full {
			t.Errorf("%s: criuFailure = %v; want ErrNoSpace and a message saying so: %v", c.name, err, c.full)
		}
	}
	if ents, _ := os.ReadDir(inodes); len(ents) != 1 {
		t.Errorf("the space probe left files: %v", ents)
	}
	os.Remove(filepath.Join(blocks, "filler"))
	if filesystemFull(blocks) {
		t.Error("filesystemFull of an emptied tmpfs = true")
	}
}

// TestPidHolder: a pid is still held when the process that held it
// before holds it now, and only then.
func TestPidHolder(t *testing.T) {
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pid := child.Process.Pid
	h := holderOf(pid)
	if !h.held || !h.stillHeld(pid) {
		t.Fatalf("holder of a running child's pid = %+v, still held %v; want held", h, h.stillHeld(pid))
	}
	if (pidHolder{}).stillHeld(pid) {
		t.Error("a pid free before is still held by what held it")
	}
	if (pidHolder{held: true, start: h.start + 1}).stillHeld(pid) {
		t.Error("a pid held by another process now (another start time) is still held")
	}
	child.Process.Kill()
	child.Wait()
	if h.stillHeld(pid) || holderOf(pid).held && holderOf(pid).start == h.start {
		t.Error("the pid of a reaped child is still held")
	}
	if holderOf(1 << 30).held {
		t.Error("a pid above pid_max is held")
	}
}

// TestRestoreFailureClassified: a failed restore says the fiber's pid is
// taken exactly when criu exited by itself, the fiber did not lead a pid
// namespace of its own, and what held the pid before criu started holds
// it still.
func TestRestoreFailureClassified(t *testing.T) {
	image := t.TempDir()
	const taken = "is taken by another process"
	pid1 := holderOf(1)
	for _, c := range []struct {
		name   string
		runErr error
		m      manifest
		holder pidHolder
		want   bool
	}{
		{"pid held", exitErr(t, "exit 1"), manifest{PID: 1}, pid1, true},
		{"pid free before", exitErr(t, "exit 1"), manifest{PID: 1}, pidHolder{}, false},
		{"pid held by another", exitErr(t, "exit 1"), manifest{PID: 1}, pidHolder{held: true, start: pid1.start + 1}, false},
		{"own pid namespace", exitErr(t, "exit 1"), manifest{PID: 1, OwnPIDNS: true}, pid1, false},
		{"criu killed", exitErr(t, "kill -KILL $$"), manifest{PID: 1}, pid1, false},
	} {
		err := restoreFailure(c.runErr, nil, image, c.m, c.holder)
		if got := strings.Contains(err.Error(), taken); got != c.want || errors.Is(err, ErrImageUnusable) {
			t.Errorf("%s: restoreFailure = %v; want a pid taken: %v", c.name, err, c.want)
		}
	}
}

// unixListener listens on a new unix socket path and returns it with its
// path and inode.
func unixListener(t *testing.T) (*net.UnixListener, string, uint64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "l.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, addr, ino := fileListener(f)
	if n != "unix" || addr != path || ino == 0 {
		t.Fatalf("fileListener = %q %q %d", n, addr, ino)
	}
	return l, path, ino
}

// TestDumpFailureBusy: a failed dump of a fiber with a unix listener is
// ErrBusy exactly when criu exited by itself and a connection to that
// listener is open, queued or accepted; a connection to another listener,
// or a TCP fiber, is not.
func TestDumpFailureBusy(t *testing.T) {
	l, path, ino := unixListener(t)
	other, otherPath, _ := unixListener(t)
	m := manifest{Network: "unix", Addr: path, Inode: ino}
	busy := func(runErr error, m manifest) bool {
		err := dumpFailure(runErr, nil, t.TempDir(), os.Getpid(), m)
		is := errors.Is(err, ErrBusy)
		if is != strings.Contains(err.Error(), "unix listener is open or waiting") {
			t.Errorf("dumpFailure = %v: ErrBusy %v, but the message does not agree", err, is)
		}
		return is
	}
	exit1 := exitErr(t, "exit 1")
	if busy(exit1, m) {
		t.Error("no connection: ErrBusy")
	}
	oc, err := net.Dial("unix", otherPath)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	defer other.Close()
	if busy(exit1, m) {
		t.Error("a connection to another listener only: ErrBusy")
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if !busy(exit1, m) {
		t.Error("a queued connection: not ErrBusy")
	}
	if busy(exitErr(t, "kill -KILL $$"), m) {
		t.Error("criu killed: ErrBusy")
	}
	if busy(exit1, manifest{Network: "tcp", Addr: path, Inode: ino}) {
		t.Error("a TCP fiber: ErrBusy")
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if !busy(exit1, m) {
		t.Error("an accepted connection: not ErrBusy")
	}
	c.Close()
	s.Close()
	if busy(exit1, m) {
		t.Error("the connection closed: ErrBusy")
	}
}
