package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
)

// criuFor returns the criu fiberd parks with here: $FIBERD_CRIU, else where
// hack/criu.sh installs it (fiberd's default -criu). It skips, saying what
// is missing, when there is none or the test is not root; with
// FIBERD_CRIU_REQUIRED=1 (.ci/run) it fails instead.
func criuFor(t *testing.T) string {
	t.Helper()
	miss := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("FIBERD_CRIU_REQUIRED") != "" {
			t.Fatalf(format, a...)
		}
		t.Skipf(format, a...)
	}
	path := os.Getenv("FIBERD_CRIU")
	if path == "" {
		home, _ := os.UserHomeDir()
		path = filepath.Join(home, ".cache", "fiberd", "criu", "bin", "criu")
	}
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		miss("criu not found at %q (%v): build it with hack/criu.sh (make criu), or set FIBERD_CRIU", path, err)
	}
	if os.Geteuid() != 0 {
		miss("parking needs root (CRIU dumps and restores processes)")
	}
	return path
}

// TestKill9MidParkLeavesNothing kills fiberd with SIGKILL while criu dumps
// a fiber (mid-park) and while criu restores one (mid-resume), with
// cgroups where cgroup v2 is writable and always without, and checks the
// promise of issue 18: once a restarted fiberd serves, no fiber, no image
// and no process of the killed run is left (the half-restored fiber, the
// fiber criu was dumping and the child it started included), and none of
// its cgroups.
func TestKill9MidParkLeavesNothing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fiberd runs fibers on Linux only")
	}
	for _, tool := range []string{"go", "cc", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the test builds fiberd and the example templates with it", tool)
		}
	}
	criu := criuFor(t)
	root := repotest.Root(t)
	bin := t.TempDir()
	build(t, root, bin)
	modes := []string{"none"}
	if cgroupWritable() {
		modes = append([]string{"cgroup"}, modes...)
	} else {
		t.Log("cgroup v2 is not writable here: only the run without cgroups is tested")
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			cgroupRoot := "none"
			if mode == "cgroup" {
				cgroupRoot = testCgroup(t)
			}
			state := t.TempDir()
			for _, iso := range []string{"none", "fiber"} {
				for _, moment := range []string{"mid-park", "mid-resume"} {
					t.Run(iso+"/"+moment, func(t *testing.T) {
						killMidCheckpoint(t, root, bin, state, cgroupRoot, criu, iso, moment)
					})
				}
			}
		})
	}
}

// parkDirtyMiB is the memory the parked fiber writes of its own, so its
// dump and restore take long enough to be killed in the middle of.
const parkDirtyMiB = 64

// killMidCheckpoint runs fiberd at -isolation iso ("none", or "fiber":
// the fibers' namespaces are dumped and restored with them).
func killMidCheckpoint(t *testing.T, root, bin, state, cgroupRoot, criu, iso, moment string) {
	d := startFiberd(t, root, bin, state, cgroupRoot, "-criu", criu, "-isolation", iso)
	st := d.waitWarm(t, "counter-c", "counter-py")
	if !st.Checkpoint.Available {
		t.Fatalf("fiberd cannot park: %s", st.Checkpoint.Reason)
	}
	uids := grantUIDs(st)
	epoch := st.Epoch
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids["counter-c"], Session: "s"})
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	getPath(t, f.Endpoint, fmt.Sprintf("/dirty/%d", parkDirtyMiB))
	child := leaveChild(t, f.Endpoint)
	fiberPID := pidIn(t, get(t, f.Endpoint))
	testStart, _ := startTime(os.Getpid())

	done := make(chan error, 1)
	switch moment {
	case "mid-park":
		go func() { _, err := c.Park(ctx, f.FiberID); done <- err }()
	case "mid-resume":
		if _, err := c.Park(ctx, f.FiberID); err != nil {
			t.Fatalf("park: %v", err)
		}
		go func() {
			_, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids["counter-c"], Session: "s"})
			done <- err
		}()
	}
	criuPID := 0
	for deadline := time.Now().Add(30 * time.Second); criuPID == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		criuPID = childNamed(d.cmd.Process.Pid, "criu")
	}
	if criuPID == 0 {
		t.Fatalf("no criu under fiberd within 30 s (%v)", <-done)
	}
	time.Sleep(20 * time.Millisecond) // into the dump's pages, or the restore's forks
	before := runProcs(uids, d.cmd.Process.Pid)
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-d.exited
	select {
	case err := <-done:
		t.Logf("%s: the call fiberd was killed in returned %v", moment, err)
	case <-time.After(10 * time.Second):
		t.Errorf("%s: the call fiberd was killed in did not return", moment)
	}
	for _, pid := range []int{fiberPID, child} {
		if start, ok := startTime(pid); ok && alive(pid) && start >= testStart {
			t.Logf("%s: before the restart, pid %d runs as %s (state %s)", moment, pid, commOf(pid), statFields(pid)[0])
		}
	}
	images, _ := os.ReadDir(filepath.Join(state, "private", "parked"))
	t.Logf("%s: %d processes of the run when fiberd was killed; parked images directory before the restart: %d grants", moment, len(before), len(images))

	d = startFiberd(t, root, bin, state, cgroupRoot, "-criu", criu, "-isolation", iso)
	restarted, _ := startTime(d.cmd.Process.Pid)
	st2 := d.waitServing(t)
	if st2.Epoch <= epoch {
		t.Fatalf("epoch after the restart is %d, want more than %d", st2.Epoch, epoch)
	}
	var stray []string
	for _, p := range before {
		if p.alive() {
			stray = append(stray, fmt.Sprintf("%s %d (%s)", p.role, p.pid, p.what))
		}
	}
	for _, p := range runProcs(uids, d.cmd.Process.Pid) {
		if p.start < restarted {
			stray = append(stray, fmt.Sprintf("%s %d (%s), started before the restart", p.role, p.pid, p.what))
		}
	}
	// A half-restored process may not show its environment yet: the fiber
	// and its child come back at the pids they had, named counter (or
	// still criu).
	for _, pid := range []int{fiberPID, child, criuPID} {
		start, ok := startTime(pid)
		if ok && alive(pid) && start >= testStart && start < restarted {
			if comm := commOf(pid); comm == "counter" || comm == "criu" {
				stray = append(stray, fmt.Sprintf("process %d (%s), started during the test, before the restart", pid, comm))
			}
		}
	}
	for _, s := range stray {
		t.Errorf("%s: alive once the restarted fiberd serves: %s", moment, s)
	}
	if ents, err := os.ReadDir(filepath.Join(state, "private", "parked")); err != nil || len(ents) != 0 {
		t.Errorf("%s: parked images left once the restarted fiberd serves: %v (%v)", moment, ents, err)
	}
	if recs, _ := os.ReadDir(filepath.Join(state, "private", "procs")); len(recs) > 0 {
		for _, r := range recs {
			if strings.HasPrefix(r.Name(), "r-") {
				t.Errorf("%s: restore record %s left once the restarted fiberd serves", moment, r.Name())
			}
		}
	}
	if cgroupRoot != "none" {
		filepath.WalkDir(cgroupRoot, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			var ep, seq uint64
			if n, _ := fmt.Sscanf(e.Name(), "f-%d-%d", &ep, &seq); n == 2 && ep <= epoch {
				t.Errorf("%s: cgroup %s of the killed run left once the restarted fiberd serves", moment, p)
			}
			return nil
		})
	}
	for _, g := range st2.Grants {
		if g.Parked != 0 || g.Running != 0 {
			t.Errorf("%s: grant %s has %d parked and %d running after the restart", moment, g.UID, g.Parked, g.Running)
		}
	}
	// The session starts afresh in the new run.
	st2 = d.waitWarm(t, "counter-c")
	n, err := d.client(t).Clone(ctx, api.CloneRequest{GrantUID: grantUIDs(st2)["counter-c"], Session: "s"})
	if err != nil || n.Kind != api.KindCreate {
		t.Fatalf("%s: clone of the session after the restart = %+v, %v; want a create", moment, n, err)
	}
	d.stop(t)
	assertNothingLeft(t, uids, cgroupRoot)
}

// childNamed returns a child of pid named comm, 0 when none.
func childNamed(pid int, comm string) int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if kid, err := strconv.Atoi(f); err == nil && commOf(kid) == comm {
				return kid
			}
		}
	}
	return 0
}

func commOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// pidIn reads "pid=N" from a counter's answer.
func pidIn(t *testing.T, body string) int {
	t.Helper()
	for _, f := range strings.Fields(body) {
		if v, ok := strings.CutPrefix(f, "pid="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	t.Fatalf("no pid in %q", body)
	return 0
}

// TestDevParksIsolated runs fiberd -dev as root at its default isolation
// (each fiber in namespaces of its own) with CRIU, and parks and resumes a
// fiber of each example zygote: the grants are served at CHECKPOINT, a
// Clone of the parked session resumes it (kind resume), and the fiber
// counts on from where it was, still PID 1 of a PID namespace of its own.
func TestDevParksIsolated(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fiberd runs fibers on Linux only")
	}
	for _, tool := range []string{"go", "cc", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the test builds fiberd and the example templates with it", tool)
		}
	}
	criu := criuFor(t)
	root := repotest.Root(t)
	bin := t.TempDir()
	build(t, root, bin)
	cgroupRoot := "none"
	if cgroupWritable() {
		cgroupRoot = testCgroup(t)
	}
	d := startFiberd(t, root, bin, t.TempDir(), cgroupRoot, "-criu", criu)
	st := d.waitWarm(t, "counter-c", "counter-py")
	if !isolatedFibers(t, st) {
		t.Skip("fiberd -dev does not isolate here (not root): nothing isolated to park")
	}
	if !st.Checkpoint.Available || st.Checkpoint.Isolated != "" {
		t.Fatalf("fiberd -dev isolated cannot park its fibers: %+v", st.Checkpoint)
	}
	uids := grantUIDs(st)
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tmpl := range []string{"counter-c", "counter-py"} {
		for _, g := range st.Grants {
			if g.UID == uids[tmpl] && g.Tier != "CHECKPOINT" {
				t.Errorf("grant %s (%s) served at %s, want CHECKPOINT", g.UID, tmpl, g.Tier)
			}
		}
		f, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids[tmpl], Session: "s"})
		if err != nil {
			t.Fatalf("clone of %s: %v", tmpl, err)
		}
		get(t, f.Endpoint)
		if body := get(t, f.Endpoint); !strings.Contains(body, "count=2 ") || !strings.Contains(body, "pid=1 ") {
			t.Fatalf("%s answered %q before the park, want count=2 from pid 1", tmpl, body)
		}
		p, err := c.Park(ctx, f.FiberID)
		if err != nil {
			t.Fatalf("park of the isolated %s fiber: %v", tmpl, err)
		}
		if p.ImageBytes <= 0 {
			t.Errorf("park of %s answered %+v", tmpl, p)
		}
		r, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids[tmpl], Session: "s"})
		if err != nil {
			t.Fatalf("clone of the parked %s session: %v", tmpl, err)
		}
		if r.Kind != api.KindResume {
			t.Fatalf("clone of the parked %s session: kind %s, want resume", tmpl, r.Kind)
		}
		if body := get(t, r.Endpoint); !strings.Contains(body, "count=3 ") || !strings.Contains(body, "pid=1 ") {
			t.Errorf("the resumed %s fiber answered %q, want count=3 (counting on) from pid 1", tmpl, body)
		}
		if err := c.Release(ctx, r.FiberID); err != nil {
			t.Errorf("release of the resumed %s fiber: %v", tmpl, err)
		}
	}
}
