package process

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/client"
)

// crashGrace is how long the fibers of a fiberd killed with SIGKILL may
// outlive it: they end with their zygote, which ends with fiberd
// (parent-death signals), which takes the kernel a moment, not a poll.
const crashGrace = 5 * time.Second

// TestKill9LeavesNothing kills fiberd with SIGKILL at the worst moments
// (while it serves fibers, in the middle of a burst of Clones, while its
// zygotes warm, while it drains) and checks the two promises of issue 13:
// no zygote or fiber outlives fiberd by more than a moment, and once a new
// fiberd on the same state directory serves, nothing of the old run is
// alive (the processes the old fibers left behind included) and none of
// its cgroups is left. It runs with cgroups where cgroup v2 is writable,
// and always without.
func TestKill9LeavesNothing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fiberd runs fibers on Linux only")
	}
	for _, tool := range []string{"go", "cc", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the test builds fiberd and the example templates with it", tool)
		}
	}
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
			for _, moment := range []string{"serving", "mid-clone", "mid-warm", "mid-drain"} {
				t.Run(moment, func(t *testing.T) {
					crashAndRestart(t, root, bin, state, cgroupRoot, moment)
				})
			}
		})
	}
}

// crashAndRestart runs one fiberd -dev on state, kills it with SIGKILL at
// moment, checks what outlives it, restarts it and checks what outlives
// the restart.
func crashAndRestart(t *testing.T, root, bin, state, cgroupRoot, moment string) {
	d := startFiberd(t, root, bin, state, cgroupRoot)
	var (
		st       api.Status
		children []int // processes the fibers left in their sessions
	)
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch moment {
	case "mid-warm":
		// Both zygote grants listed, warm or not: the status may list the
		// BASIC grants a moment before them.
		st = d.waitServing(t, "counter-c", "counter-py")
		// Kill once a zygote runs and is not warm yet (it spends 200 ms
		// initialising).
		for deadline := time.Now().Add(time.Minute); ; {
			if zygoteStarting(runProcs(grantUIDs(st), d.cmd.Process.Pid), st) || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	default:
		st = d.waitWarm(t, "counter-c", "counter-py")
	}
	uids := grantUIDs(st)
	epoch := st.Epoch

	switch moment {
	case "serving", "mid-drain":
		tmpls := []string{"counter-c", "counter-c", "counter-py", "counter-c-cold"}
		if moment == "mid-drain" {
			// Enough fibers that the drain takes a while.
			for i := 0; i < 12; i++ {
				tmpls = append(tmpls, []string{"counter-c", "counter-py", "counter-c-cold"}[i%3])
			}
		}
		for _, tmpl := range tmpls {
			f, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids[tmpl]})
			if err != nil {
				t.Fatalf("clone of %s: %v", tmpl, err)
			}
			if strings.HasPrefix(tmpl, "counter-c") {
				children = append(children, leaveChild(t, f.Endpoint))
			}
		}
	case "mid-clone":
		var wg sync.WaitGroup
		served := make(chan struct{}, 64)
		for i := 0; i < 16; i++ {
			wg.Go(func() {
				tmpl := []string{"counter-c", "counter-py", "counter-c-cold"}[i%3]
				if _, err := c.Clone(ctx, api.CloneRequest{GrantUID: uids[tmpl]}); err == nil {
					served <- struct{}{}
				}
			})
		}
		// Kill once a few are served, with the rest in flight.
		for i := 0; i < 3; i++ {
			select {
			case <-served:
			case <-time.After(time.Minute):
				t.Fatal("no Clone served within a minute")
			}
		}
		defer wg.Wait()
	}
	before := runProcs(uids, d.cmd.Process.Pid)
	if moment == "mid-drain" {
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v", err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(d.output(), "Agent draining") && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	if err := d.cmd.Process.Kill(); err != nil {
		select {
		case <-d.exited:
			t.Logf("%s: fiberd had already exited when SIGKILL was sent", moment)
		default:
			t.Fatalf("SIGKILL: %v", err)
		}
	}
	<-d.exited
	killed := time.Now()

	// Zygotes and fibers end with fiberd, in a moment.
	var outlived []proc
	for {
		outlived = outlived[:0]
		for _, p := range before {
			if p.role != "child" && p.alive() {
				outlived = append(outlived, p)
			}
		}
		if len(outlived) == 0 || time.Since(killed) > crashGrace {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%s: %d processes of the run (zygotes, fibers and their children) when fiberd was killed; %d zygotes and fibers alive %v later",
		moment, len(before), len(outlived), time.Since(killed).Round(time.Millisecond))
	for _, p := range outlived {
		t.Errorf("%s %d (%s) outlived fiberd's SIGKILL by %v", p.role, p.pid, p.what, crashGrace)
	}
	left := len(runProcs(uids, 0))
	t.Logf("%s: %d processes of the killed run alive before the restart (children of fibers included: %d left by the test)", moment, left, len(children))

	// Once the new fiberd serves, nothing of the old run is left.
	d = startFiberd(t, root, bin, state, cgroupRoot)
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
	t.Logf("%s: %d processes of the killed run alive once the new fiberd serves", moment, len(stray))
	for _, s := range stray {
		t.Errorf("alive once the restarted fiberd serves: %s", s)
	}
	if cgroupRoot != "none" {
		old := regexp.MustCompile(`^f-(\d+)-\d+$`)
		filepath.WalkDir(cgroupRoot, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			if m := old.FindStringSubmatch(e.Name()); m != nil {
				if n, _ := strconv.ParseUint(m[1], 10, 64); n <= epoch {
					t.Errorf("cgroup %s of the killed run left once the restarted fiberd serves", p)
				}
			}
			return nil
		})
	}

	// The new run serves (its ports and sockets are free) and drains clean.
	st2 = d.waitWarm(t, "counter-c", "counter-py")
	c2 := d.client(t)
	for _, tmpl := range []string{"counter-c", "counter-py"} {
		f, err := c2.Clone(ctx, api.CloneRequest{GrantUID: grantUIDs(st2)[tmpl]})
		if err != nil {
			t.Fatalf("clone after the restart: %v", err)
		}
		get(t, f.Endpoint)
	}
	d.stop(t)
	assertNothingLeft(t, uids, cgroupRoot)
}

// zygoteStarting reports whether procs holds a zygote while st shows some
// zygote grant not warm.
func zygoteStarting(procs []proc, st api.Status) bool {
	cold := false
	for _, g := range st.Grants {
		if !g.Warm && !strings.HasSuffix(templateName(g.Template), "-cold") {
			cold = true
		}
	}
	for _, p := range procs {
		if p.role == "zygote" && cold {
			return true
		}
	}
	return false
}

// client is a pkg/client on this fiberd's socket.
func (d *fiberd) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Addr: "unix://" + d.socket})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitServing waits until the API answers a status with the -dev grants
// listed, warm or not: some grant, or every one of templates.
func (d *fiberd) waitServing(t *testing.T, templates ...string) api.Status {
	t.Helper()
	c := d.client(t)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-d.exited:
			t.Fatalf("fiberd exited early: %v", d.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Status(ctx)
		cancel()
		if err == nil && len(st.Grants) > 0 && hasAll(grantUIDs(st), templates) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("fiberd did not serve its grants within 2 minutes: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leaveChild asks the C counter fiber at endpoint to fork a sleeping child
// in its session and returns the child's pid.
func leaveChild(t *testing.T, endpoint string) int {
	t.Helper()
	body := getPath(t, endpoint, "/child")
	m := regexp.MustCompile(`child=(\d+)`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET /child answered %q", body)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// proc is a process of a run, identified by pid and start time.
type proc struct {
	pid   int
	start uint64 // clock ticks after boot (/proc/<pid>/stat field 22)
	role  string // zygote, fiber or child
	what  string // its command line
}

// alive reports whether the process still runs as the same process.
func (p proc) alive() bool {
	start, ok := startTime(p.pid)
	return ok && start == p.start && alive(p.pid)
}

// runProcs lists the live processes whose environment names one of uids
// (FIBERD_GRANT_UID: every zygote and fiber has it, and what they start
// inherits it): zygotes (children of fiberd, pid fiberd, without
// LISTEN_FDS in their initial environment), fibers (leading their own
// session) and what fibers started (in a fiber's session). A forked fiber's
// /proc/<pid>/environ is its zygote's: the SDKs set FIBERD_FENCE after the
// fork, which that file does not show.
func runProcs(uids map[string]string, fiberd int) []proc {
	want := map[string]bool{}
	for _, u := range uids {
		want[u] = true
	}
	var out []proc
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !alive(pid) {
			continue
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		var uid string
		listenFDs := false
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("FIBERD_GRANT_UID=")); ok {
				uid = string(v)
			}
			if bytes.HasPrefix(kv, []byte("LISTEN_FDS=")) {
				listenFDs = true
			}
		}
		if !want[uid] {
			continue
		}
		start, ok := startTime(pid)
		if !ok {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		p := proc{pid: pid, start: start, what: string(bytes.TrimSpace(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))}
		switch {
		case parentOf(pid) == fiberd && !listenFDs:
			p.role = "zygote"
		case sessionOf(pid) == pid:
			p.role = "fiber"
		default:
			p.role = "child"
		}
		out = append(out, p)
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// startTime is field 22 of /proc/<pid>/stat.
func startTime(pid int) (uint64, bool) {
	f := statFields(pid)
	if len(f) < 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(f[19], 10, 64)
	return n, err == nil
}

// parentOf is field 4 of /proc/<pid>/stat.
func parentOf(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// sessionOf is field 6 of /proc/<pid>/stat.
func sessionOf(pid int) int {
	f := statFields(pid)
	if len(f) < 4 {
		return 0
	}
	n, _ := strconv.Atoi(f[3])
	return n
}

// cgroupWritable reports whether a test cgroup can be made here.
func cgroupWritable() bool {
	mount, err := cgroup.Mount()
	if err != nil {
		return false
	}
	dir, err := os.MkdirTemp(mount, "fiberd-probe-")
	if err != nil {
		return false
	}
	return os.Remove(dir) == nil
}

// hasAll reports whether uids names a grant of every one of templates.
func hasAll(uids map[string]string, templates []string) bool {
	for _, tmpl := range templates {
		if uids[tmpl] == "" {
			return false
		}
	}
	return true
}
