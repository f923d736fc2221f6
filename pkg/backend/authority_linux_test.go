package backend

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/logtest"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// The zygote protocol carries no authority (docs/security.md): what fiberd
// hands a template lets it do nothing beyond its own grant, and what a
// template reports makes fiberd act on nothing else.

// nobody is the uid and gid of the local user the tests play.
const nobody = 65534

// rootVictim starts a process of root's for an attack to aim at, in the test's
// own cgroup, and returns it; it is killed when the test ends.
func rootVictim(t *testing.T) *exec.Cmd {
	t.Helper()
	v := exec.Command("sleep", "300")
	if err := v.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Process.Kill(); _ = v.Wait() })
	return v
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z'
}

// TestLeafDescriptorCarriesNoAuthority: an isolated zygote hands the leaf
// descriptor of its Clone to a process of another local user (the issue's
// attack: root's descriptor let it move any process of the host into the
// leaf, and the release then killed it). That process can move nothing in,
// neither through the descriptor nor by opening it anew, while the fiber
// itself enters its leaf; the release ends the fiber and only it.
func TestLeafDescriptorCarriesNoAuthority(t *testing.T) {
	b := isoBackend(t, core.TierWarm)
	tree, mount := cgroupRoot(t)
	py := sysPython(t)
	uid := uidFor(t)
	g, err := tree.Grant(uid)
	if err != nil {
		t.Fatal(err)
	}
	v := rootVictim(t)
	name, next := startOutsider(t, py, v.Process.Pid)
	if l := next(); l != "listening" {
		t.Fatalf("outsider: %q, want listening", l)
	}

	warmIn(t, b, uid, template.Spec{Command: py, Args: []string{"-u", pyFile(t, "pkg/backend/testdata/forwarder.py"), "--to", name}, Zygote: true},
		g.Dir.Path(), t.TempDir())
	leaf, err := g.Fiber(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	ep := listen(t, false)
	ctx := ctxT(t)
	f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, 1), Listener: ep.file, Leaf: leaf.Path()})
	if err != nil {
		t.Fatalf("Clone: %v", err)
	}
	if _, err := get(ep, "/"); err != nil {
		t.Fatalf("the fiber does not answer: %v", err)
	}
	if got, want := ownCgroup(t, f.PID), strings.TrimPrefix(leaf.Path(), mount); got != want {
		t.Fatalf("the fiber is in %s, want its leaf %s: it must still enter it itself", got, want)
	}
	for _, how := range []string{"write", "reopen"} {
		l := next()
		if !strings.HasPrefix(l, how+" refused ") {
			t.Errorf("outsider, %s through the leaf descriptor: %q, want refused", how, l)
		}
	}
	if l := next(); l != "done" {
		t.Fatalf("outsider: %q, want done", l)
	}
	procs, err := cgroup.At(leaf.Path()).Procs()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p == v.Process.Pid {
			t.Fatalf("root's process %d was moved into the fiber's leaf", p)
		}
	}
	if err := b.Kill(ctx, f.Fence); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if !alive(v.Process.Pid) {
		t.Fatal("releasing the fiber killed root's process")
	}
	// The grant's user owns its cgroup.procs files, and nothing more.
	for _, dir := range []string{g.Dir.Path(), leaf.Path()} {
		st, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
		if err == nil && st.Sys().(*syscall.Stat_t).Uid == 0 {
			t.Errorf("%s/cgroup.procs is root's: the grant's user cannot enter its own leaf", dir)
		}
	}
	if st, err := os.Stat(g.Dir.Path()); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the grant's cgroup directory itself must stay root's: %v", err)
	}
}

// startOutsider starts testdata/outsider.py as nobody, listening on the
// abstract socket it returns the name of for the leaf descriptor a fiber
// forwards it, with victim the root process it tries to move; next returns
// its next line of output, failing the test when it ends or is silent for
// 20 s.
func startOutsider(t *testing.T, py string, victim int) (name string, next func() string) {
	name = fmt.Sprintf("fiberd-test-outsider-%d", os.Getpid())
	out := exec.Command(py, "-u", pyFile(t, "pkg/backend/testdata/outsider.py"), "--listen", name, "--victim", strconv.Itoa(victim))
	out.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out.Stderr = os.Stderr
	stdout, err := out.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = out.Process.Kill(); _ = out.Wait() })
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next = func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the outsider ended early")
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatal("the outsider said nothing for 20s")
		}
		return ""
	}
	return name, next
}

// TestForeignProcessReportedAsFiber: a zygote reports another grant's
// zygote (a child of fiberd, as every zygote is) as the fiber of a Clone and
// as its spares, with a pidfd of it. fiberd refuses each, and the other
// zygote lives on, in its own cgroup, serving.
func TestForeignProcessReportedAsFiber(t *testing.T) {
	p := newBackend(t, core.TierWarm).(*Proc)
	tree, mount := cgroupRoot(t)
	py := python(t)
	vuid, luid := uidFor(t)+"-v", uidFor(t)+"-l"
	vg, err := tree.Grant(vuid)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := tree.Grant(luid)
	if err != nil {
		t.Fatal(err)
	}
	warm(t, p, vuid, template.Spec{Command: counterC(t), Zygote: true}, vg.Dir.Path())
	vpid := zygotePID(t, vuid)
	vcg := ownCgroup(t, vpid)
	warm(t, p, luid, template.Spec{Command: py, Args: []string{"-u", abs(t, "testdata/liar.py"), "--victim", strconv.Itoa(vpid)}, Zygote: true}, lg.Dir.Path())

	ctx := ctxT(t)
	clone := func(seq uint64, withLeaf bool) error {
		t.Helper()
		req := CloneRequest{Fence: fence(luid, seq), Listener: listen(t, false).file}
		if withLeaf {
			leaf, err := lg.Fiber(1, seq)
			if err != nil {
				t.Fatal(err)
			}
			req.Leaf = leaf.Path()
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		f, err := p.Clone(cctx, req)
		if err == nil {
			// What a caller would do next with the fiber it got.
			_ = p.Kill(ctx, f.Fence)
		}
		return err
	}
	victimFine := func(what string) {
		t.Helper()
		if !alive(vpid) {
			t.Fatalf("%s: the other grant's zygote %d is dead", what, vpid)
		}
		if got := ownCgroup(t, vpid); got != vcg {
			t.Fatalf("%s: the other grant's zygote moved from %s to %s", what, vcg, got)
		}
	}
	if err := clone(1, true); err == nil {
		t.Error("a Clone whose zygote reported another grant's zygote as the fiber succeeded")
	}
	victimFine("CLONED with a leaf")
	if err := clone(2, false); err == nil {
		t.Error("a Clone without a leaf whose zygote reported another grant's zygote succeeded")
	}
	victimFine("CLONED without a leaf")

	p.SetSpares(luid, 2, 2)
	deadline := time.Now().Add(10 * time.Second)
	for !p.Spares(luid).Failed && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !p.Spares(luid).Failed {
		t.Error("the spares the zygote did not fork never counted as failed")
	}
	if n := len(p.SparePIDs(luid)); n != 0 {
		t.Errorf("%d spares kept that the zygote did not fork", n)
	}
	if err := clone(3, true); err == nil {
		t.Error("a Clone of a grant whose zygote reports another grant's zygote as its spares succeeded")
	}
	victimFine("SPARED")

	// And the other grant still serves.
	vleaf, err := vg.Fiber(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	ep := listen(t, false)
	f, err := p.Clone(ctx, CloneRequest{Fence: fence(vuid, 1), Listener: ep.file, Leaf: vleaf.Path()})
	if err != nil {
		t.Fatalf("the other grant cannot clone any more: %v", err)
	}
	if _, err := get(ep, "/"); err != nil {
		t.Fatalf("the other grant's fiber does not answer: %v", err)
	}
	if got := ownCgroup(t, f.PID); got != strings.TrimPrefix(vleaf.Path(), mount) {
		t.Errorf("the other grant's fiber is in %s", got)
	}
}

// TestZygoteGarbageIsRateLimited: a zygote that floods its control socket
// with garbage costs fiberd's log a few lines, not one per message (the
// issue saw 16,671 lines in a second), and a line says how many it stands
// for.
func TestZygoteGarbageIsRateLimited(t *testing.T) {
	logs := logtest.Recorder{}
	cfg := testConfig()
	cfg.Logger = logs.Logger()
	p, err := NewProc(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	uid := uidFor(t)
	const n = 20000
	flood := fmt.Sprintf(`import socket
s = socket.socket(fileno=3)
s.send(b"READY")
for i in range(%d):
    s.send(b"GARBAGE %%d" %% i)
`, n)
	warm(t, p, uid, template.Spec{Command: python(t), Args: []string{"-c", flood}, Zygote: true}, "")
	// The zygote exits after the flood: its Exit comes once fiberd has
	// read every message.
	if e := nextExit(t, p); !e.Template {
		t.Fatalf("Exit %+v, want the template's", e)
	}
	lines := logs.Matching("malformed")
	if len(lines) == 0 || len(lines) > complaintsFirst+1 {
		t.Fatalf("%d log lines for %d malformed messages, want 1 to %d:\n%s", len(lines), n, complaintsFirst+1, strings.Join(lines, "\n"))
	}
	if !strings.Contains(lines[0], `"dropped"=1`) {
		t.Errorf("the first line %q does not say it stands for one message", lines[0])
	}
}

// TestKillOfAFiberItsZygoteNeverReports: a zygote that never reports a
// fiber's end (EXITED) cannot hold a release: Kill ends the fiber and,
// once its process is gone, finishes it itself, with Unreported; the
// issue saw Release wait over 200s.
func TestKillOfAFiberItsZygoteNeverReports(t *testing.T) {
	for _, withLeaf := range []bool{true, false} {
		t.Run(fmt.Sprintf("leaf=%v", withLeaf), func(t *testing.T) {
			p := newBackend(t, core.TierWarm).(*Proc)
			uid := uidFor(t)
			var g cgroup.Grant
			if withLeaf {
				tree, _ := cgroupRoot(t)
				var err error
				if g, err = tree.Grant(uid); err != nil {
					t.Fatal(err)
				}
			}
			warm(t, p, uid, template.Spec{Command: python(t), Args: []string{"-u", abs(t, "testdata/plainzygote.py"), "--mute"}, Zygote: true}, g.Dir.Path())
			ep := listen(t, false)
			req := CloneRequest{Fence: fence(uid, 1), Listener: ep.file}
			if withLeaf {
				leaf, err := g.Fiber(1, 1)
				if err != nil {
					t.Fatal(err)
				}
				req.Leaf = leaf.Path()
			}
			ctx := ctxT(t)
			f, err := p.Clone(ctx, req)
			if err != nil {
				t.Fatalf("Clone: %v", err)
			}
			if _, err := get(ep, "/"); err != nil {
				t.Fatalf("the fiber does not answer: %v", err)
			}
			kctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if err := p.Kill(kctx, f.Fence); err != nil {
				t.Fatalf("Kill of a fiber whose zygote never reports its end: %v", err)
			}
			e := nextExit(t, p)
			if e.Fence != f.Fence || !e.Reason.Unreported || !e.Reason.Killed {
				t.Fatalf("Exit %+v, want fiber %s killed and unreported", e, f.Fence)
			}
			if alive(f.PID) {
				t.Fatalf("the fiber's process %d still runs", f.PID)
			}
			if withLeaf && !gone(req.Leaf) {
				t.Fatalf("the fiber's leaf %s is still there", req.Leaf)
			}
			// The grant still serves.
			ep2 := listen(t, false)
			if _, err := p.Clone(ctx, CloneRequest{Fence: fence(uid, 2), Listener: ep2.file}); err != nil {
				t.Fatalf("Clone after: %v", err)
			}
		})
	}
}
