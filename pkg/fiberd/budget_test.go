package fiberd

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/endpoint"
	homefake "fiberd.io/fiberd/pkg/home/fake"
)

func TestParseSmapsField(t *testing.T) {
	rollup := []byte(`55d1c0a4e000-7ffd4b3f9000 ---p 00000000 00:00 0                          [rollup]
Rss:                5120 kB
Pss:                1210 kB
Private_Clean:       100 kB
Private_Dirty:      1084 kB
Swap:                  0 kB
`)
	if n, err := parseSmapsField(rollup, "Private_Dirty"); err != nil || n != 1084<<10 {
		t.Fatalf("Private_Dirty = %d, %v; want %d", n, err, 1084<<10)
	}
	if n, err := parseSmapsField(nil, "Private_Dirty"); err != nil || n != 0 {
		t.Fatalf("empty file = %d, %v; want 0 (a zombie's)", n, err)
	}
	for _, bad := range []string{"Rss: 1 kB\n", "Private_Dirty: lots kB\n", "Private_Dirty: 12 MB\n", "Private_Dirty: -1 kB\n"} {
		if _, err := parseSmapsField([]byte(bad), "Private_Dirty"); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// fiberGet asks the fiber at a unix or tcp endpoint for path.
func fiberGet(t *testing.T, ep, path string) string {
	t.Helper()
	network, addr, err := endpoint.Parse(ep)
	must(t, err)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}, DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://fiber" + path)
	must(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

// TestWBudgetMeasured runs the C counter on the real proc backend, here
// where no memory controller enforces a budget (none is configured): a
// fiber that dirties more than its grant's wBudget is ended by the agent's
// measurement, and says so in the grant's status, its exit reason and the
// metrics; a fiber within its budget runs on.
func TestWBudgetMeasured(t *testing.T) {
	root := repotest.Root(t)
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		t.Skipf("no /proc/<pid>/smaps_rollup here (Linux 4.14 and later): %v", err)
	}
	bin, err := devkit.BuildCounterC(root, t.TempDir())
	if err != nil {
		t.Skipf("cannot build the C counter: %v", err)
	}
	proc, err := backend.NewProc(backend.Config{Logger: testr.New(t)})
	must(t, err)
	var ref string
	e := newEnv(t, func(e *env) {
		_ = e.warm.Close()
		e.warm = nil
		e.cfg.Warm = proc
		ref = writeTemplate(t, e.cfg.Templates, "counter", `{"command":"`+bin+`","zygote":true}`)
	})
	const budget = 8 << 20
	tok := e.mint("g1", templ(ref), func(g *core.Grant) { g.WBudget = budget })
	big := e.cloneReq(e.unix, api.CloneRequest{Grant: tok}).clone(t)
	small := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1"}).clone(t)
	if got := fiberGet(t, big.Endpoint, "/dirty/24"); !strings.Contains(got, "dirty=24") {
		t.Fatalf("GET /dirty/24 answered %q", got)
	}
	if got := fiberGet(t, small.Endpoint, "/dirty/2"); !strings.Contains(got, "dirty=2") {
		t.Fatalf("GET /dirty/2 answered %q", got)
	}
	var g api.GrantStatus
	e.eventuallyStepping("the fiber over its budget ended", DefaultBudgetInterval, func() bool {
		g = e.status().Grants[0]
		return g.OverBudget == 1 && g.Running == 1
	})
	if g.WBudget != budget || g.WBudgetBy != "measured" {
		t.Errorf("status wBudget %d by %q, want %d measured", g.WBudget, g.WBudgetBy, budget)
	}
	if len(g.Exits) != 1 || g.Exits[0].FiberID != big.FiberID || !strings.HasPrefix(g.Exits[0].Reason, "over wBudget: dirtied 2") {
		t.Errorf("status exits %+v, want %s ended over its wBudget", g.Exits, big.FiberID)
	}
	if len(g.Fibers) != 1 || g.Fibers[0].FiberID != small.FiberID {
		t.Errorf("running %+v, want only %s, within its budget", g.Fibers, small.FiberID)
	}
	m := e.do(e.tcp, http.MethodGet, "/metrics", nil)
	if !regexp.MustCompile(`fiberd_fiber_exits_total\{reason="over_wbudget"\} 1\n`).Match(m.body) {
		t.Errorf("metrics lack one over_wbudget exit:\n%s", m.body)
	}
	if got := fiberGet(t, small.Endpoint, "/"); !strings.Contains(got, "fence="+small.FiberID) {
		t.Errorf("the fiber within its budget answered %q", got)
	}
}

// TestWBudgetCgroup: where the grant's cgroup has the memory controller,
// each fiber's leaf gets memory.max = wBudget and memory.high below it, the
// agent does not measure the fiber, and a fiber the kernel ended at its
// memory.max reads "over wBudget" in the status. The cgroupfs is laid out
// in a temporary directory (regular files stand in for the kernel's).
func TestWBudgetCgroup(t *testing.T) {
	root := t.TempDir()
	lay := func(dir string, files map[string]string) {
		must(t, os.MkdirAll(dir, 0o755))
		for name, content := range files {
			must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
		}
	}
	cg := map[string]string{"cgroup.procs": "", "cgroup.controllers": "memory", "cgroup.subtree_control": "memory"}
	lay(root, cg)
	lay(filepath.Join(root, "g1"), cg)
	lay(filepath.Join(root, "g1", "zygote"), nil)
	leaf := filepath.Join(root, "g1", "f-1-1")
	lay(leaf, map[string]string{"cgroup.procs": "", "memory.max": "", "memory.high": "", "memory.oom.group": ""})

	var measured atomic.Int32
	e := newEnv(t, withHome(func(c *homefake.Config) { c.CgroupRoot = root }), func(e *env) {
		e.measure = func(pids []int) (int64, error) { measured.Add(1); return 1 << 40, nil }
	})
	const budget = 16 << 20
	c := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1", func(g *core.Grant) { g.WBudget = budget })}).clone(t)
	if c.Fence.Epoch != 1 || c.Fence.Seq != 1 {
		t.Fatalf("fiber %s, want g1/1/1 (the leaf laid out)", c.FiberID)
	}
	for name, want := range map[string]string{"memory.max": "16777216", "memory.high": "14680064", "memory.oom.group": "1"} {
		b, err := os.ReadFile(filepath.Join(leaf, name))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", name, b, err, want)
		}
	}
	for i := 0; i < 5; i++ {
		e.clk.Step(DefaultBudgetInterval)
	}
	time.Sleep(50 * time.Millisecond)
	if g := e.status().Grants[0]; g.Running != 1 || g.WBudgetBy != "cgroup" {
		t.Fatalf("status %+v: want the fiber running, its budget enforced by its cgroup", g)
	}
	if !e.warm.End(c.Fence, backend.ExitReason{Signal: "SIGKILL", MemoryMax: true}) {
		t.Fatal("fake: fiber not running")
	}
	var g api.GrantStatus
	e.eventually("the fiber's end recorded", func() bool { g = e.status().Grants[0]; return g.OverBudget == 1 })
	if len(g.Exits) != 1 || !strings.Contains(g.Exits[0].Reason, "memory.max") {
		t.Errorf("status exits %+v, want one over wBudget at memory.max", g.Exits)
	}
	if n := measured.Load(); n != 0 {
		t.Errorf("a fiber whose leaf enforces its budget was measured %d times", n)
	}
}

// TestWBudgetMeasuredCountsScratch: where the agent measures, what a fiber
// of isolation fiber holds in its own scratch file systems counts against
// its wBudget with what it dirtied, and its exit says how much; a fiber of
// isolation grant (whose scratch is its grant's, shared) is not charged
// for it.
func TestWBudgetMeasuredCountsScratch(t *testing.T) {
	var charged sync.Map // pid -> true
	e := newEnv(t, withIsolation(fullIsolation, backend.IsolationSupport{}), func(e *env) {
		e.measure = func([]int) (int64, error) { return 1 << 20, nil }
		e.scratch = func(pid int) int64 { charged.Store(pid, true); return 8 << 20 }
	})
	shared := writeTemplate(t, filepath.Join(e.stateDir, "templates"), "shared", `{"command":"/bin/true","zygote":true,"isolation":"shared"}`)
	const budget = 4 << 20
	own := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1", func(g *core.Grant) { g.WBudget = budget })}).clone(t)
	grant := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g2", templ(shared), func(g *core.Grant) { g.WBudget = budget })}).clone(t)
	var g1 api.GrantStatus
	e.eventuallyStepping("the fiber holding scratch over its budget ended", DefaultBudgetInterval, func() bool {
		g1 = e.grantStatus("g1")
		return g1.OverBudget == 1
	})
	if len(g1.Exits) != 1 || g1.Exits[0].FiberID != own.FiberID ||
		!strings.Contains(g1.Exits[0].Reason, "dirtied 1.0 MiB of memory and holds 8.0 MiB in its scratch directories, the grant allows 4.0 MiB") {
		t.Errorf("g1 exits %+v, want %s over its wBudget for its scratch", g1.Exits, own.FiberID)
	}
	for range 3 {
		e.clk.Step(DefaultBudgetInterval)
	}
	if g2 := e.grantStatus("g2"); g2.Isolation != "grant" || g2.OverBudget != 0 || len(g2.Fibers) != 1 || g2.Fibers[0].FiberID != grant.FiberID {
		t.Errorf("g2 %+v: want its fiber of isolation grant running, not charged for the grant's scratch", g2)
	}
	n := 0
	charged.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("scratch read for %d pids, want only the fiber of isolation fiber's", n)
	}
}

// TestScratchUsed reads what a real process's own tmpfs mounts on /tmp,
// /var/tmp and /dev/shm hold, through /proc/<pid>/root: each once, and
// nothing of a scratch directory that is not a tmpfs of its own.
func TestScratchUsed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: a mount namespace with tmpfs mounts of its own needs CAP_SYS_ADMIN")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("no unshare(1) (util-linux) to start a process with mounts of its own: %v", err)
	}
	// /var/tmp is a bind of /tmp's tmpfs: counted once.
	script := `mount -t tmpfs -o size=8m tmpfs /tmp && mount --bind /tmp /var/tmp &&
mount -t tmpfs -o size=8m tmpfs /dev/shm &&
head -c 2097152 /dev/zero > /tmp/a && head -c 1048576 /dev/zero > /dev/shm/b && echo ready && exec sleep 60`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	out, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the process with its own scratch did not start: %q, %v", line, err)
	}
	if got, want := scratchUsed(cmd.Process.Pid), int64(3<<20); got != want {
		t.Errorf("scratchUsed = %d, want %d (2 MiB in /tmp and /var/tmp, one tmpfs, and 1 MiB in /dev/shm)", got, want)
	}
	if got := scratchUsed(1 << 30); got != 0 {
		t.Errorf("scratchUsed of no process = %d, want 0", got)
	}
}

// TestUnreportedEndsCounted: a fiber whose zygote never reported its end
// (the backend saw the process gone itself after killing it) is counted in
// fiberd_fiber_ends_unreported_total, and its exit reason says so.
func TestUnreportedEndsCounted(t *testing.T) {
	e := newEnv(t)
	c := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}).clone(t)
	if !e.warm.End(c.Fence, backend.ExitReason{Signal: "SIGKILL", Killed: true, Unreported: true}) {
		t.Fatal("fake: fiber not running")
	}
	e.eventually("the end counted", func() bool {
		m := e.do(e.tcp, http.MethodGet, "/metrics", nil)
		return regexp.MustCompile(`fiberd_fiber_ends_unreported_total 1\n`).Match(m.body)
	})
	if g := e.status().Grants[0]; len(g.Exits) != 1 || !strings.Contains(g.Exits[0].Reason, "did not report") {
		t.Errorf("status exits %+v, want one saying its zygote did not report the end", g.Exits)
	}
}

// TestLimitsWhereTheControllersAre: where the cgroup root offers the pids
// and cpu controllers, each fiber leaf gets pids.max (-fiber-pids-max) and
// each grant cgroup cpu.weight (-grant-cpu-weight); where it does not,
// neither is written, and the start-up line and the status name the
// missing controllers. The cgroupfs is laid out in a temporary directory.
func TestLimitsWhereTheControllersAre(t *testing.T) {
	for _, tc := range []struct {
		name        string
		controllers string
		pidsMax     int64
		wantPids    string // the leaf's pids.max after a Clone; "" = not written
		wantWeight  string
		wantLimits  api.Limits
		wantLog     string
	}{
		{"all there", "memory pids cpu", 0, "4096", "100",
			api.Limits{Cgroups: true, FiberPidsMax: 4096, GrantCPUWeight: 100, WBudgetByCgroup: true}, "every cgroup controller fiberd uses is there"},
		{"pids max set", "memory pids cpu", 64, "64", "100",
			api.Limits{Cgroups: true, FiberPidsMax: 64, GrantCPUWeight: 100, WBudgetByCgroup: true}, "every cgroup controller"},
		{"pids off", "memory pids cpu", -1, "", "100",
			api.Limits{Cgroups: true, GrantCPUWeight: 100, WBudgetByCgroup: true}, "every cgroup controller"},
		{"memory only", "memory", 0, "", "",
			api.Limits{Cgroups: true, WBudgetByCgroup: true, Missing: []string{"pids", "cpu"}}, "does not offer pids, cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			lay := func(dir string, files map[string]string) {
				must(t, os.MkdirAll(dir, 0o755))
				for name, content := range files {
					must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
				}
			}
			cg := map[string]string{"cgroup.procs": "", "cgroup.controllers": tc.controllers, "cgroup.subtree_control": tc.controllers}
			lay(root, cg)
			lay(filepath.Join(root, "g1"), cg)
			must(t, os.WriteFile(filepath.Join(root, "g1", "cpu.weight"), nil, 0o644))
			lay(filepath.Join(root, "g1", "zygote"), nil)
			leaf := filepath.Join(root, "g1", "f-1-1")
			lay(leaf, map[string]string{"cgroup.procs": "", "pids.max": ""})
			var mu sync.Mutex
			var lines []string
			logger := funcr.New(func(_, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})
			e := newEnv(t, withHome(func(c *homefake.Config) { c.CgroupRoot = root }),
				withConfig(func(c *Config) { c.FiberPidsMax, c.Logger = tc.pidsMax, logger }))
			e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1")}).clone(t)
			for file, want := range map[string]string{filepath.Join(leaf, "pids.max"): tc.wantPids, filepath.Join(root, "g1", "cpu.weight"): tc.wantWeight} {
				if b, err := os.ReadFile(file); err != nil || string(b) != want {
					t.Errorf("%s = %q, %v; want %q", file, b, err, want)
				}
			}
			st := e.status()
			if st.Limits == nil || !reflect.DeepEqual(*st.Limits, tc.wantLimits) {
				t.Errorf("status limits %+v, want %+v", st.Limits, tc.wantLimits)
			}
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, l := range lines {
				if strings.Contains(l, "Limits:") {
					n++
					if !strings.Contains(l, tc.wantLog) {
						t.Errorf("start-up line %s does not say %q", l, tc.wantLog)
					}
				}
			}
			if n != 1 {
				t.Errorf("%d start-up lines about limits, want 1", n)
			}
		})
	}
}
