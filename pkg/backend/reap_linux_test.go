package backend

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// subreaperEnv names the test a re-executed test binary runs as a child
// subreaper (see inSubreaper).
const subreaperEnv = "FIBERD_BACKEND_TEST_SUBREAPER"

// inSubreaper runs the calling top-level test again in a child process of
// the test binary that has marked itself a child subreaper, as fiberd does
// at start-up, so the setting does not leak into the other tests of this
// binary. It returns true in that child, where the caller runs its body,
// and false in the parent once the child has passed (it fails t with the
// child's output otherwise).
func inSubreaper(t *testing.T) bool {
	t.Helper()
	if os.Getenv(subreaperEnv) == t.Name() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			t.Fatalf("prctl(PR_SET_CHILD_SUBREAPER): %v", err)
		}
		return true
	}
	counterC(t) // skip here, not in the child, when cc is missing
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), subreaperEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s as a child subreaper: %v\n%s", t.Name(), err, out)
	}
	var summary []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "--- ") {
			summary = append(summary, strings.TrimSpace(l))
		}
	}
	t.Logf("as a child subreaper: %s", strings.Join(summary, "; "))
	return false
}

// zombieChildren lists this process's children that are zombies.
func zombieChildren() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ppid, ok := procStat(pid); ok && st == 'Z' && ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// TestOrphanedFibersReaped runs as a child subreaper, which is what fiberd
// is in a grant Pod (PID 1) and on a host (it marks itself one): fibers of
// a zygote that ends are reparented to it. It checks that the proc backend
// reaps them before it reports their Exits, so none is left a zombie, both
// when the zygote dies and when the grant is stopped; and that meanwhile
// the exec backend's fibers, plain children of this process, still report
// their own exit status (the reaping steals none).
func TestOrphanedFibersReaped(t *testing.T) {
	if !inSubreaper(t) {
		return
	}
	for _, tt := range []struct {
		name   string
		stop   bool // Stop the grant rather than kill the zygote
		leaves bool // fibers in leaf cgroups, killed through cgroup.kill
	}{
		{name: "zygote killed"},
		{name: "grant stopped", stop: true},
		{name: "zygote killed, fibers in leaves", leaves: true},
	} {
		t.Run(tt.name, func(t *testing.T) { orphansReaped(t, tt.stop, tt.leaves) })
	}
	t.Run("exec statuses", execStatusesWhileReaping)
}

// orphansReaped clones fibers of a proc zygote (in leaves when leaves),
// then kills the zygote (or Stops the grant when stop), and checks that
// every fiber's Exit says so and comes once the fiber is gone, and that no
// zombie or stray is left.
func orphansReaped(t *testing.T, stop, leaves bool) {
	b := newBackend(t, core.TierWarm)
	uid := uidFor(t)
	var g *cgroup.Grant
	if leaves {
		tree, _ := cgroupRoot(t)
		cg, err := tree.Grant(uid)
		if err != nil {
			t.Fatal(err)
		}
		g = &cg
		warm(t, b, uid, kindC.spec(t), g.Dir.Path())
	} else {
		warm(t, b, uid, kindC.spec(t), "")
	}
	ctx := ctxT(t)
	zpid := zygotePID(t, uid)
	const n = 8
	var fibers []Fiber
	for i := uint64(1); i <= n; i++ {
		ep := listen(t, i%2 == 0)
		req := CloneRequest{Fence: fence(uid, i), Listener: ep.file}
		if g != nil {
			leaf, err := g.Fiber(1, i)
			if err != nil {
				t.Fatal(err)
			}
			req.Leaf = leaf.Path()
		}
		f, err := b.Clone(ctx, req)
		if err != nil {
			t.Fatalf("Clone %d: %v", i, err)
		}
		if _, err := get(ep, "/"); err != nil {
			t.Fatalf("fiber %d: %v", i, err)
		}
		if _, ppid, _ := procStat(f.PID); ppid != zpid {
			t.Fatalf("fiber %d (pid %d) has parent %d, want the zygote %d", i, f.PID, ppid, zpid)
		}
		fibers = append(fibers, f)
	}

	if !stop {
		if err := syscall.Kill(zpid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	} else if err := b.Stop(ctx, uid); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for range fibers {
		e := nextExit(t, b)
		if e.Template || !(e.Reason.TemplateDied || e.Reason.Killed) {
			t.Fatalf("fiber exit = %+v, want TemplateDied or Killed", e)
		}
	}
	// An Exit is queued once the fiber is gone: no wait needed.
	for _, f := range fibers {
		if st, ppid, ok := procStat(f.PID); ok {
			t.Errorf("fiber %s (pid %d) still exists after its Exit: state %c, parent %d (this process is %d)", f.Fence, f.PID, st, ppid, os.Getpid())
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	zs := zombieChildren()
	for len(zs) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		zs = zombieChildren()
	}
	if len(zs) > 0 {
		t.Errorf("zombie children of this process remain: %v", zs)
	}
	noStrays(t, uid)
}

// execStatusesWhileReaping: exec fibers exit with codes of their own while
// a zygote's orphans are being reaped; each must report its own status.
func execStatusesWhileReaping(t *testing.T) {
	pb := newBackend(t, core.TierWarm)
	eb := newBackend(t, core.TierBasic)
	puid, euid := uidFor(t)+"p", uidFor(t)+"e"
	warm(t, pb, puid, kindC.spec(t), "")
	warm(t, eb, euid, kindC.spec(t), "")
	ctx := ctxT(t)
	for i := uint64(1); i <= 8; i++ {
		ep := listen(t, true)
		if _, err := pb.Clone(ctx, CloneRequest{Fence: fence(puid, i), Listener: ep.file}); err != nil {
			t.Fatalf("proc Clone %d: %v", i, err)
		}
	}
	const m = 6
	eps := make([]endpoint, m)
	for i := range m {
		eps[i] = listen(t, false)
		if _, err := eb.Clone(ctx, CloneRequest{Fence: fence(euid, uint64(i+1)), Listener: eps[i].file}); err != nil {
			t.Fatalf("exec Clone %d: %v", i+1, err)
		}
	}

	if err := syscall.Kill(zygotePID(t, puid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range m {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = get(eps[i], fmt.Sprintf("/exit/%d", 10+i)) }()
	}
	wg.Wait()
	for range m {
		e := nextExit(t, eb)
		want := ExitReason{Code: 10 + int(e.Fence.Seq) - 1}
		if e.Reason != want {
			t.Errorf("exec fiber %s: exit %+v, want %+v", e.Fence, e.Reason, want)
		}
	}
	for range 8 {
		if e := nextExit(t, pb); !e.Reason.TemplateDied {
			t.Errorf("proc fiber exit %+v, want TemplateDied", e)
		}
	}
	if e := nextExit(t, pb); !e.Template {
		t.Errorf("exit %+v, want the template's", e)
	}
	noStrays(t, puid)
}
