package cgroup

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"fiberd.io/fiberd/internal/logtest"
)

// testCgroup makes an empty cgroup for this test, named after t.Name(),
// beside this process's cgroup (or under the mount root when the process
// sits at the root), and removes it with everything below in t.Cleanup. It
// skips when cgroup v2 is missing or not writable.
func testCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := Mount()
	if err != nil {
		t.Skipf("needs a cgroup v2 mount: %v", err)
	}
	self, err := Self()
	if err != nil {
		t.Skipf("needs this process in a cgroup v2 hierarchy: %v", err)
	}
	base := mnt
	if self != mnt {
		base = filepath.Dir(self)
	}
	name := "fiberd-test-" + strconv.Itoa(os.Getpid()) + "-" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir := filepath.Join(base, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("needs a writable cgroup v2 directory (run as root with cgroup v2 delegated): mkdir %s: %v", dir, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := At(dir).Destroy(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return dir
}

// startSleep starts a long sleep and reaps it in t.Cleanup.
func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	bin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("needs the sleep binary: %v", err)
	}
	cmd := exec.Command(bin, "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// cgroupOf returns the cgroup directory of pid from /proc/<pid>/cgroup.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return cgroupDirOf(t, b)
}

func cgroupDirOf(t *testing.T, procCgroup []byte) string {
	t.Helper()
	p, err := ParseProcCgroup(bytes.NewReader(procCgroup))
	if err != nil {
		t.Fatal(err)
	}
	point, root, err := mountInfo()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := selfDir(point, root, p)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func wantKilled(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("pid %d ended with %v, want SIGKILL", cmd.Process.Pid, err)
	}
}

func readWords(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Fields(string(b))
	slices.Sort(w)
	return w
}

// wantAllEnabled checks that dir enables for its children every controller
// it is offered.
func wantAllEnabled(t *testing.T, dir string) {
	t.Helper()
	offered := readWords(t, filepath.Join(dir, "cgroup.controllers"))
	enabled := readWords(t, filepath.Join(dir, "cgroup.subtree_control"))
	if !slices.Equal(offered, enabled) {
		t.Errorf("%s: subtree_control %v, want all offered %v", dir, enabled, offered)
	}
}

func event(t *testing.T, dir, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := eventValue(b, key)
	return v
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestMountAndSelf(t *testing.T) {
	mnt, err := Mount()
	if err != nil {
		t.Skipf("needs a cgroup v2 mount: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.controllers")); err != nil {
		t.Fatalf("Mount() = %s, not a cgroup v2 root: %v", mnt, err)
	}
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if self != mnt && !strings.HasPrefix(self, mnt+"/") {
		t.Fatalf("Self() = %s, not under the mount %s", self, mnt)
	}
	pids, err := At(self).Procs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("Self() = %s, whose cgroup.procs does not list this process (%d)", self, os.Getpid())
	}
	t.Logf("cgroup2 mount %s, this process in %s, offered controllers %v", mnt, self, readWords(t, filepath.Join(mnt, "cgroup.controllers")))
}

func TestTreeGrantFiberLifecycle(t *testing.T) {
	dir := testCgroup(t)
	ctx := testCtx(t)
	var logs logtest.Recorder
	tree, err := NewTree(Config{Root: dir, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	wantAllEnabled(t, dir)

	g, err := tree.Grant("uid-1")
	if err != nil {
		t.Fatal(err)
	}
	if g.Dir.Path() != filepath.Join(dir, "uid-1") || g.Zygote.Path() != filepath.Join(dir, "uid-1", "zygote") {
		t.Fatalf("grant paths %s, %s", g.Dir, g.Zygote)
	}
	for _, p := range []string{g.Dir.Path(), g.Zygote.Path()} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
			t.Fatalf("grant cgroup not created: %v", err)
		}
	}
	wantAllEnabled(t, g.Dir.Path())
	if _, err := tree.Grant("uid-1"); err != nil {
		t.Fatalf("Grant again (a restart) = %v, want the existing cgroup reused", err)
	}
	if _, err := tree.Grant("../escape"); err == nil {
		t.Fatalf("Grant(../escape) succeeded")
	}
	if !slices.Contains(readWords(t, filepath.Join(dir, "cgroup.controllers")), "memory") {
		if n := logs.Count(`"controller"="memory"`); n != 1 {
			t.Errorf("missing memory controller logged %d times, want once: %q", n, logs.Lines())
		}
	}

	leaf, err := g.Fiber(3, 7)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "uid-1", "f-3-7"); leaf.Path() != want {
		t.Fatalf("fiber leaf %s, want %s", leaf, want)
	}
	cmd := startSleep(t)
	pid := cmd.Process.Pid
	if err := leaf.AddProc(pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := leaf.Procs(); err != nil || !slices.Contains(pids, pid) {
		t.Fatalf("leaf Procs = %v, %v; want %d listed", pids, err, pid)
	}
	if got := cgroupOf(t, pid); got != leaf.Path() {
		t.Fatalf("/proc/%d/cgroup says %s, want %s", pid, got, leaf)
	}
	if event(t, g.Dir.Path(), "populated") != "1" {
		t.Fatalf("grant not populated with a process in its fiber leaf")
	}

	p, err := leaf.Pressure()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file string
		has  bool
		v    float64
	}{{"memory.pressure", p.HasMemory, p.Memory}, {"cpu.pressure", p.HasCPU, p.CPU}} {
		_, serr := os.Stat(filepath.Join(leaf.Path(), c.file))
		if c.has != (serr == nil) {
			t.Errorf("Pressure says %s present=%v, but stat: %v", c.file, c.has, serr)
		}
		if c.v < 0 || c.v > 100 {
			t.Errorf("%s avg10 = %v, outside 0..100", c.file, c.v)
		}
	}

	if err := leaf.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if event(t, leaf.Path(), "frozen") != "1" {
		t.Fatalf("after Freeze, cgroup.events frozen != 1")
	}
	if err := leaf.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if event(t, leaf.Path(), "frozen") != "0" {
		t.Fatalf("after Thaw, cgroup.events frozen != 0")
	}

	if err := leaf.Remove(); err == nil {
		t.Fatalf("Remove of a populated leaf succeeded")
	}
	if err := leaf.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leaf.WaitEmpty(ctx); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, cmd)
	if err := leaf.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leaf.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("leaf still there after Remove: %v", err)
	}
	if err := leaf.Remove(); err != nil {
		t.Fatalf("second Remove = %v, want nil", err)
	}
	if err := leaf.WaitEmpty(ctx); err != nil {
		t.Fatalf("WaitEmpty of a removed leaf = %v, want nil", err)
	}
	if err := leaf.Kill(ctx); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Kill of a removed leaf = %v, want not-exist", err)
	}
}

func TestGrantRemoveEndsEveryProcess(t *testing.T) {
	dir := testCgroup(t)
	ctx := testCtx(t)
	tree, err := NewTree(Config{Root: dir, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	g, err := tree.Grant("uid-2")
	if err != nil {
		t.Fatal(err)
	}
	leaves := []Leaf{g.Zygote}
	for seq := range uint64(2) {
		l, err := g.Fiber(1, seq)
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, l)
	}
	var cmds []*exec.Cmd
	for _, l := range leaves {
		cmd := startSleep(t)
		if err := l.AddProc(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	if err := g.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range cmds {
		wantKilled(t, cmd)
	}
	if _, err := os.Stat(g.Dir.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("grant cgroup still there after Remove: %v", err)
	}
	if err := g.Remove(ctx); err != nil {
		t.Fatalf("second Remove = %v, want nil", err)
	}
}

// TestLeafDestroy: Destroy ends what runs in the leaf and removes it, and
// leaves its siblings alone.
func TestLeafDestroy(t *testing.T) {
	dir := testCgroup(t)
	ctx := testCtx(t)
	tree, err := NewTree(Config{Root: dir, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	g, err := tree.Grant("uid-3")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := g.Fiber(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	inLeaf, inZygote := startSleep(t), startSleep(t)
	if err := leaf.AddProc(inLeaf.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Zygote.AddProc(inZygote.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := leaf.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, inLeaf)
	if _, err := os.Stat(leaf.Path()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("leaf still there after Destroy: %v", err)
	}
	if pids, err := g.Zygote.Procs(); err != nil || !slices.Equal(pids, []int{inZygote.Process.Pid}) {
		t.Fatalf("sibling leaf lists %v, %v after Destroy, want [%d]", pids, err, inZygote.Process.Pid)
	}
	if err := leaf.Destroy(ctx); err != nil {
		t.Fatalf("second Destroy = %v, want nil", err)
	}
}

// TestKillEach covers Kill on kernels without cgroup.kill.
func TestKillEach(t *testing.T) {
	dir := testCgroup(t)
	ctx := testCtx(t)
	child := filepath.Join(dir, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := startSleep(t), startSleep(t)
	if err := At(dir).AddProc(a.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := At(child).AddProc(b.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := killEach(ctx, dir); err != nil {
		t.Fatal(err)
	}
	wantKilled(t, a)
	wantKilled(t, b)
	if pids, err := subtreeProcs(dir); err != nil || len(pids) != 0 {
		t.Fatalf("after killEach, subtree lists %v, %v", pids, err)
	}
	if event(t, dir, "populated") != "0" {
		t.Fatalf("after killEach, still populated")
	}
}

func TestWaitEmpty(t *testing.T) {
	dir := testCgroup(t)
	cmd := startSleep(t)
	if err := At(dir).AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}

	t.Run("ctx already over", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := At(dir).WaitEmpty(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitEmpty = %v, want context.Canceled", err)
		}
	})
	t.Run("ctx ends while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		stop := time.AfterFunc(50*time.Millisecond, cancel)
		defer stop.Stop()
		if err := At(dir).WaitEmpty(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitEmpty = %v, want context.Canceled", err)
		}
	})
	t.Run("wakes when the last process exits", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- At(dir).WaitEmpty(testCtx(t)) }()
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("WaitEmpty = %v, want nil", err)
		}
	})
}

func TestEnterFD(t *testing.T) {
	dir := testCgroup(t)
	f, err := At(dir).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), enterEnv+"=1")
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, stderr.Bytes())
	}
	if got := cgroupDirOf(t, out); got != dir {
		t.Fatalf("child after EnterFD is in %s, want %s", got, dir)
	}
	if err := EnterFD(int(f.Fd()) + 1000); err == nil {
		t.Fatalf("EnterFD of a bad descriptor succeeded")
	}
}

func TestOpenForCloneIntoCgroup(t *testing.T) {
	dir := testCgroup(t)
	f, err := At(dir).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bin, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("needs the sleep binary: %v", err)
	}
	cmd := exec.Command(bin, "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start with CLONE_INTO_CGROUP: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if got := cgroupOf(t, cmd.Process.Pid); got != dir {
		t.Fatalf("child started into %s is in %s", dir, got)
	}
}

func TestDelegate(t *testing.T) {
	dir := testCgroup(t)
	if err := enableControllers(dir, func(string, string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "pod")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := startSleep(t)
	pid := cmd.Process.Pid
	if err := At(root).AddProc(pid); err != nil {
		t.Fatal(err)
	}

	var logs logtest.Recorder
	grants, err := Delegate(root, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "grants"); grants != want {
		t.Fatalf("Delegate = %s, want %s", grants, want)
	}
	if pids, err := At(root).Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("delegated root still holds %v, %v", pids, err)
	}
	if got := cgroupOf(t, pid); got != filepath.Join(root, "fiberd") {
		t.Fatalf("process moved to %s, want %s/fiberd", got, root)
	}
	wantAllEnabled(t, root)
	wantAllEnabled(t, grants)
	if !slices.Contains(readWords(t, filepath.Join(root, "cgroup.controllers")), "memory") {
		if n := logs.Count(`"controller"="memory"`); n != 1 {
			t.Errorf("missing memory controller logged %d times, want once: %q", n, logs.Lines())
		}
	}

	again, err := Delegate(root, logr.Discard())
	if err != nil || again != grants {
		t.Fatalf("second Delegate = %s, %v; want %s, nil", again, err, grants)
	}
	tree, err := NewTree(Config{Root: grants, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tree.Grant("uid-3"); err != nil {
		t.Fatalf("Grant under the delegated grants: %v", err)
	}
}

func TestDelegateNotACgroup(t *testing.T) {
	dir := t.TempDir()
	_, err := Delegate(dir, logr.Discard())
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "-cgroup-root") {
		t.Fatalf("Delegate(%s) = %v, want an error naming the path and the fix", dir, err)
	}
	if _, err := NewTree(Config{Root: dir}); err == nil {
		t.Fatalf("NewTree on a plain directory succeeded")
	}
}

// Check: a cgroup v2 directory passes; a plain directory fails naming it.
func TestCheck(t *testing.T) {
	if err := Check(testCgroup(t)); err != nil {
		t.Fatalf("Check of a cgroup v2 directory: %v", err)
	}
	plain := t.TempDir()
	if err := Check(plain); err == nil || !strings.Contains(err.Error(), plain) || !strings.Contains(err.Error(), "not a cgroup v2 directory") {
		t.Fatalf("Check of a plain directory = %v; want an error naming it", err)
	}
}

// TestPidsMaxEndsAForkBomb: a leaf with pids.max 8 holds at most 8 tasks; a
// shell in it that tries to start 40 processes gets its forks refused past
// the cap, and never has more than 8. It skips, saying so, where cgroup v2
// has no pids controller (bound to cgroup v1, as on some hosts here).
func TestPidsMaxEndsAForkBomb(t *testing.T) {
	dir := testCgroup(t)
	if !slices.Contains(readWords(t, filepath.Join(filepath.Dir(dir), "cgroup.subtree_control")), "pids") {
		t.Skipf("cgroup v2 at %s does not enable the pids controller for its children (it is bound to cgroup v1 on this host, or not delegated): pids.max cannot be tested here", filepath.Dir(dir))
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		t.Fatalf("enable pids below %s: %v", dir, err)
	}
	leaf := filepath.Join(dir, "leaf")
	if err := os.Mkdir(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := At(leaf).SetPidsMax(8); err != nil {
		t.Fatal(err)
	}
	if err := At(leaf).SetPidsMax(0); err == nil {
		t.Error("SetPidsMax(0) accepted")
	}
	f, err := At(leaf).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The shell is born in the leaf and forks 40 sleeps; a fork past the
	// cap fails (dash then exits; other shells go on and say "started").
	// The sleeps' output is not the pipe, so it ends with the shell.
	cmd := exec.Command("/bin/sh", "-c", `i=0; while [ $i -lt 40 ]; do i=$((i+1)); sleep 30 >/dev/null 2>&1 & done; echo started; sleep 30 >/dev/null`)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = At(leaf).Kill(context.Background()); _ = cmd.Wait() })
	buf := make([]byte, 64)
	_, _ = out.Read(buf) // "started", or the end of a shell that could not fork: every fork was tried
	cur, err := os.ReadFile(filepath.Join(leaf, "pids.current"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(cur))); err != nil || n > 8 {
		t.Fatalf("pids.current %q after the fork bomb, want at most pids.max 8", cur)
	}
	pe, err := os.ReadFile(filepath.Join(leaf, "pids.events"))
	if err != nil {
		t.Fatal(err)
	}
	if ev, _ := eventValue(pe, "max"); ev == "0" || ev == "" {
		t.Errorf("pids.events max %q: no fork was refused", ev)
	}
}
