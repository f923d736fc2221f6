package process

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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
)

// fibersPerTemplate is how many fibers of each example are cloned: 10 of
// the C counter and 10 of the Python counter.
const fibersPerTemplate = 10

func TestDevDaemon(t *testing.T) {
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
	state := t.TempDir()
	cgroupRoot := testCgroup(t)

	// First run.
	d := startFiberd(t, root, bin, state, cgroupRoot)
	st := d.waitWarm(t, "counter-c", "counter-py")
	if st.Epoch < 1 {
		t.Fatalf("epoch %d, want at least 1", st.Epoch)
	}
	firstEpoch := st.Epoch
	uids := grantUIDs(st)

	var fibers []api.CloneResponse
	for _, tmpl := range []string{"counter-c", "counter-py"} {
		for i := 0; i < fibersPerTemplate; i++ {
			var resp api.CloneResponse
			d.ctlJSON(t, &resp, "clone", "-grant-uid", uids[tmpl], "-payload", fmt.Sprintf("p%d", i))
			if resp.Kind != api.KindCreate || resp.Fence.Epoch != firstEpoch {
				t.Fatalf("clone of %s = %+v, want a created fiber of epoch %d", tmpl, resp, firstEpoch)
			}
			fibers = append(fibers, resp)
		}
	}
	// Isolated (fiberd's default as root), each fiber is PID 1 of a PID
	// namespace of its own and says so; its pid in fiberd's is found in
	// /proc.
	isolated := isolatedFibers(t, st)
	pids := map[int]string{}
	leaves := map[string]string{} // fiber id -> the cgroup it answered with
	for _, f := range fibers {
		body := get(t, f.Endpoint)
		if !strings.Contains(body, "fence="+f.FiberID+" ") {
			t.Fatalf("fiber %s at %s answered %q, not with its fence", f.FiberID, f.Endpoint, body)
		}
		m := regexp.MustCompile(`pid=(\d+)`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("fiber %s answered %q, without its pid", f.FiberID, body)
		}
		pid, _ := strconv.Atoi(m[1])
		if isolated {
			if pid != 1 {
				t.Errorf("isolated fiber %s answered pid %d, want 1 (PID 1 of its own namespace)", f.FiberID, pid)
			}
			if m := regexp.MustCompile(`cgroup=(\S+)`).FindStringSubmatch(body); m != nil {
				leaves[f.FiberID] = m[1]
			}
			continue
		}
		pids[pid] = f.FiberID
	}
	if isolated {
		checkIsolated(t, d, uids, state)
		for pid, id := range isolatedFiberPIDs(t, runProcs(uids, d.cmd.Process.Pid), leaves, cgroupRoot) {
			pids[pid] = id
		}
	}
	if len(pids) != len(fibers) {
		t.Fatalf("%d fibers answered from %d distinct processes", len(fibers), len(pids))
	}
	var status api.Status
	d.ctlJSON(t, &status, "status")
	for _, g := range status.Grants {
		if tmpl := templateName(g.Template); (tmpl == "counter-c" || tmpl == "counter-py") && g.Running != fibersPerTemplate {
			t.Errorf("grant %s runs %d fibers, want %d", g.UID, g.Running, fibersPerTemplate)
		}
	}

	// Restart: SIGTERM drains, and nothing of the run is left.
	d.stop(t)
	for pid, id := range pids {
		if alive(pid) {
			t.Errorf("fiber %s (pid %d) still runs after fiberd stopped", id, pid)
		}
	}
	assertNothingLeft(t, uids, cgroupRoot)

	d = startFiberd(t, root, bin, state, cgroupRoot)
	st = d.waitWarm(t, "counter-c", "counter-py")
	if st.Epoch != firstEpoch+1 {
		t.Fatalf("epoch after the restart is %d, want %d", st.Epoch, firstEpoch+1)
	}
	for _, g := range st.Grants {
		if g.Running != 0 {
			t.Errorf("grant %s runs %d fibers right after the restart", g.UID, g.Running)
		}
	}
	for _, f := range fibers[:3] {
		out, code := d.ctl(t, "-o", "json", "release", f.FiberID)
		var e api.Error
		if code != 1 || json.Unmarshal(out, &e) != nil || e.Code != api.CodeNotFound {
			t.Errorf("release of the old fiber %s: exit %d, %s; want exit 1 and NOT_FOUND", f.FiberID, code, out)
		}
	}
	var again api.CloneResponse
	d.ctlJSON(t, &again, "clone", "-grant-uid", uids["counter-c"])
	if again.Fence.Epoch != firstEpoch+1 {
		t.Errorf("a clone after the restart has fence %v, want epoch %d", again.Fence, firstEpoch+1)
	}
	get(t, again.Endpoint)

	d.stop(t)
	assertNothingLeft(t, uids, cgroupRoot)
}

// isolatedFiberPIDs finds the process of each isolated fiber, which
// answers pid=1 (the init of a PID namespace of its own), by the cgroup
// leaf it answered with (leaves: fiber id -> cgroup): the one session
// leader of procs in that leaf. The grants' spares (fiberd -dev keeps
// fibers.warm spares) wait in their zygote's leaf and are no fiber's.
// Without cgroups the fibers cannot be told from the spares: it returns
// every session leader of procs.
func isolatedFiberPIDs(t *testing.T, procs []proc, leaves map[string]string, cgroupRoot string) map[int]string {
	t.Helper()
	out := map[int]string{}
	byLeaf := map[string][]int{}
	for _, p := range procs {
		if p.role != "fiber" {
			continue
		}
		if cgroupRoot == "none" {
			out[p.pid] = p.what
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid))
		if err != nil {
			continue
		}
		if cg, err := cgroup.ParseProcCgroup(bytes.NewReader(b)); err == nil {
			byLeaf[cg] = append(byLeaf[cg], p.pid)
		}
	}
	if cgroupRoot == "none" {
		t.Logf("without cgroups the %d session leaders found count the spares too", len(out))
		return out
	}
	for id, leaf := range leaves {
		switch ps := byLeaf[leaf]; len(ps) {
		case 1:
			out[ps[0]] = id
		default:
			t.Errorf("fiber %s answered cgroup %s, which holds %d session leaders (%v), want 1", id, leaf, len(ps), ps)
		}
	}
	return out
}

// fiberd is one running fiberd -dev.
type fiberd struct {
	cmd    *exec.Cmd
	bin    string
	socket string
	logs   *bytes.Buffer
	exited chan struct{}
	err    error
}

func startFiberd(t *testing.T, root, bin, state, cgroupRoot string, extra ...string) *fiberd {
	t.Helper()
	return startFiberdWith(t, root, bin, state, cgroupRoot, nil, extra...)
}

// startFiberdWith is startFiberd with mod applied to the command before it
// starts (nil: none).
func startFiberdWith(t *testing.T, root, bin, state, cgroupRoot string, mod func(*exec.Cmd), extra ...string) *fiberd {
	t.Helper()
	d := &fiberd{bin: bin, socket: filepath.Join(state, "fiberd.sock"), logs: &bytes.Buffer{}, exited: make(chan struct{})}
	args := append([]string{"-dev", "-state", state, "-listen", "127.0.0.1:0", "-cgroup-root", cgroupRoot}, extra...)
	d.cmd = exec.Command(filepath.Join(bin, "fiberd"), args...)
	d.cmd.Dir = root
	d.cmd.Stdout = &lockedWriter{w: d.logs}
	d.cmd.Stderr = d.cmd.Stdout
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if mod != nil {
		mod(d.cmd)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting fiberd: %v", err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("fiberd output:\n%s", d.output())
		}
	})
	return d
}

func (d *fiberd) output() string {
	lw := d.cmd.Stdout.(*lockedWriter)
	return lw.String()
}

// stop sends SIGTERM and expects exit status 0.
func (d *fiberd) stop(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("fiberd did not exit within 60s of SIGTERM")
	}
	if d.err != nil {
		t.Fatalf("fiberd exited with %v after SIGTERM, want status 0", d.err)
	}
}

// waitWarm waits until the grants of the named templates are warm and
// returns the status then.
func (d *fiberd) waitWarm(t *testing.T, templates ...string) api.Status {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case <-d.exited:
			t.Fatalf("fiberd exited early: %v", d.err)
		default:
		}
		var st api.Status
		out, code, stderr := d.ctlQuiet(t, "-o", "json", "status")
		if code == 0 && json.Unmarshal(out, &st) == nil {
			warm := 0
			for _, g := range st.Grants {
				for _, tmpl := range templates {
					if templateName(g.Template) == tmpl && g.Warm {
						warm++
					}
				}
			}
			if warm == len(templates) {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the templates %v were not warm within 2 minutes; last status: %s%s", templates, out, stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ctl runs fiberctl against this fiberd's socket and returns its stdout
// and exit status; a failure's stderr goes to the test log.
func (d *fiberd) ctl(t *testing.T, args ...string) ([]byte, int) {
	t.Helper()
	out, code, stderr := d.ctlQuiet(t, args...)
	if code != 0 {
		t.Logf("fiberctl %v: exit %d: %s", args, code, stderr)
	}
	return out, code
}

// ctlQuiet is ctl that returns a failure's stderr instead of logging it.
func (d *fiberd) ctlQuiet(t *testing.T, args ...string) ([]byte, int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "fiberctl"), append([]string{"-addr", "unix://" + d.socket}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out, 0, nil
	case errors.As(err, &ee):
		return out, ee.ExitCode(), bytes.TrimSpace(stderr.Bytes())
	}
	t.Fatalf("fiberctl %v: %v", args, err)
	return nil, -1, nil
}

// ctlJSON runs fiberctl -o json, expects success and decodes its output.
func (d *fiberd) ctlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, code := d.ctl(t, append([]string{"-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("fiberctl %v: exit %d: %s", args, code, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("fiberctl %v printed %q: %v", args, out, err)
	}
}

// get asks the fiber at endpoint (tcp://host:port) for / and returns the
// body.
func get(t *testing.T, endpoint string) string {
	t.Helper()
	return getPath(t, endpoint, "/")
}

// getPath asks the fiber at endpoint (tcp://host:port) for path and returns
// the body.
func getPath(t *testing.T, endpoint, path string) string {
	t.Helper()
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		t.Fatalf("endpoint %q is not tcp:// (fiberd -dev serves inet4)", endpoint)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", endpoint, resp.Status, b)
	}
	return string(b)
}

// grantUIDs maps template names to the UIDs of their grants.
func grantUIDs(st api.Status) map[string]string {
	m := map[string]string{}
	for _, g := range st.Grants {
		m[templateName(g.Template)] = g.UID
	}
	return m
}

func templateName(ref string) string {
	name, _, _ := strings.Cut(ref, "@")
	return name
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command in parentheses, which may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// assertNothingLeft scans /proc for a live process of the run: one whose
// environment names one of its grants (FIBERD_GRANT_UID, set for every
// zygote and fiber), or whose cgroup lies under the test's cgroup root.
func assertNothingLeft(t *testing.T, uids map[string]string, cgroupRoot string) {
	t.Helper()
	self := os.Getpid()
	var stray []string
	// Fibers end asynchronously to the kernel's bookkeeping: allow a
	// short grace period for the last exits to be reaped.
	deadline := time.Now().Add(5 * time.Second)
	for {
		stray = stray[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self || !alive(pid) {
				continue
			}
			if why := ofRun(pid, uids, cgroupRoot); why != "" {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				stray = append(stray, fmt.Sprintf("pid %d (%s): %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), why))
			}
		}
		if len(stray) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range stray {
		t.Errorf("stray process: %s", s)
	}
	if cgroupRoot != "none" {
		entries, _ := os.ReadDir(cgroupRoot)
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("cgroup %s left under the cgroup root", filepath.Join(cgroupRoot, e.Name()))
			}
		}
	}
}

// ofRun says why pid belongs to the run, or "".
func ofRun(pid int, uids map[string]string, cgroupRoot string) string {
	if environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
		for _, kv := range bytes.Split(environ, []byte{0}) {
			v, ok := bytes.CutPrefix(kv, []byte("FIBERD_GRANT_UID="))
			if !ok {
				continue
			}
			for _, uid := range uids {
				if string(v) == uid {
					return "its environment names grant " + uid
				}
			}
		}
	}
	if cgroupRoot != "none" {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil {
			if p, err := cgroup.ParseProcCgroup(bytes.NewReader(b)); err == nil {
				if mount, err := cgroup.Mount(); err == nil {
					dir := filepath.Join(mount, p)
					if dir == cgroupRoot || strings.HasPrefix(dir, cgroupRoot+"/") {
						return "it runs in cgroup " + dir
					}
				}
			}
		}
	}
	return ""
}

// testCgroup makes a cgroup v2 directory for the test's fibers, named after
// the test and removed when it ends, or returns "none" when cgroup v2 is not
// writable here.
func testCgroup(t *testing.T) string {
	mount, err := cgroup.Mount()
	if err != nil {
		t.Logf("running without cgroups: %v", err)
		return "none"
	}
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	dir := filepath.Join(mount, fmt.Sprintf("fiberd-test-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Logf("running without cgroups: %v", err)
		return "none"
	}
	t.Cleanup(func() { removeCgroup(t, dir) })
	return dir
}

// removeCgroup removes dir and every cgroup under it, deepest first,
// killing what still runs there.
func removeCgroup(t *testing.T, dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; try < 50; try++ {
			if err := os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("cannot remove the test cgroup %s", dir)
	}
}

// build compiles fiberd and fiberctl into bin.
func build(t *testing.T, root, bin string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", bin+"/", "./cmd/fiberd", "./cmd/fiberctl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

// lockedWriter collects a process's output; the exec package writes it
// from its own goroutine while the test reads it on failure.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// TestStrayScanFindsAProcessOfTheRun checks the scan the daemon test
// relies on: a process carrying a grant of the run in its environment is
// found, one carrying another grant is not.
func TestStrayScanFindsAProcessOfTheRun(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the scan reads /proc")
	}
	start := func(uid string) int {
		cmd := exec.Command("sleep", "30")
		cmd.Env = append(os.Environ(), "FIBERD_GRANT_UID="+uid)
		if err := cmd.Start(); err != nil {
			t.Skipf("cannot start sleep: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	ours, theirs := start("dev-counter-c-0000aaaa"), start("dev-counter-c-ffffffff")
	uids := map[string]string{"counter-c": "dev-counter-c-0000aaaa"}
	if why := ofRun(ours, uids, "none"); why == "" {
		t.Error("a process of the run was not found")
	}
	if why := ofRun(theirs, uids, "none"); why != "" {
		t.Errorf("a process of another run was counted: %s", why)
	}
}
