package process

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// isolatedFibers reports whether the WARM tier of st isolates every fiber,
// which fiberd -dev does by default where it has the privilege. As root
// anything less is an error under FIBERD_ISOLATION_REQUIRED=1 (CI), and
// logged otherwise.
func isolatedFibers(t *testing.T, st api.Status) bool {
	t.Helper()
	for _, ti := range st.Isolation {
		if ti.Tier == core.TierWarm && ti.Level == "fiber" {
			return true
		}
	}
	if os.Geteuid() == 0 {
		msg := fmt.Sprintf("fiberd -dev runs as root and isolates less than fiber: %+v", st.Isolation)
		if os.Getenv("FIBERD_ISOLATION_REQUIRED") != "" {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
	return false
}

// checkIsolated checks what fiberd -dev says and does at its default
// isolation: one log line saying it, each grant and fiber at "fiber" in
// the status, and every zygote and fiber running as its grant's user (not
// root) in RunDir/grants/<uid>/home.
func checkIsolated(t *testing.T, d *fiberd, uids map[string]string, state string) {
	t.Helper()
	var st api.Status
	d.ctlJSON(t, &st, "status")
	// The endpoint guard needs nftables: without it fiberd says so, and
	// only CI (FIBERD_ISOLATION_REQUIRED) calls that a failure.
	apart := len(st.Isolation) > 0
	for _, ti := range st.Isolation {
		if !ti.EndpointsApart {
			apart = false
			msg := fmt.Sprintf("fiberd -dev runs as root and does not keep the %s tier's endpoints apart: %s", ti.Tier, ti.Missing)
			if os.Getenv("FIBERD_ISOLATION_REQUIRED") != "" {
				t.Error(msg)
			} else {
				t.Log(msg)
			}
		}
	}
	wantLine, wantStatus := `"Isolation" warm="fiber" basic="fiber"`, "isolation WARM fiber (network none) (endpoints apart), BASIC fiber (network none) (endpoints apart)"
	if !apart {
		wantLine, wantStatus = `"Isolation is less than asked" warm="fiber" basic="fiber"`, "isolation WARM fiber (network none), BASIC fiber (network none)"
	}
	if n := strings.Count(d.output(), `"Isolation`); n != 1 || !strings.Contains(d.output(), wantLine) {
		t.Errorf("fiberd said %d isolation lines, want one saying %s:\n%s", n, wantLine, d.output())
	}
	for _, g := range st.Grants {
		if g.Isolation != "fiber" {
			t.Errorf("grant %s (%s) has isolation %q, want fiber", g.UID, templateName(g.Template), g.Isolation)
		}
		for _, f := range g.Fibers {
			if f.Isolation != "fiber" {
				t.Errorf("fiber %s has isolation %q, want fiber", f.FiberID, f.Isolation)
			}
		}
	}
	out, _ := d.ctl(t, "status")
	if !strings.Contains(string(out), wantStatus) || !strings.Contains(string(out), "ISOLATION") {
		t.Errorf("fiberctl status does not show the isolation:\n%s", out)
	}
	procs := runProcs(uids, d.cmd.Process.Pid)
	if len(procs) == 0 {
		t.Fatal("no zygote or fiber of the run found")
	}
	for _, p := range procs {
		uid := grantOf(p.pid)
		want := filepath.Join(state, "run", "grants", uid, "home")
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p.pid)); err != nil || cwd != want {
			t.Errorf("%s %d of grant %s works in %q (%v), want %s", p.role, p.pid, uid, cwd, err, want)
		}
		if id := procUID(p.pid); id < 1<<20 {
			t.Errorf("%s %d of grant %s runs as uid %d, want one of the grant's own", p.role, p.pid, uid, id)
		}
	}
	t.Logf("isolated: %d zygotes and fibers checked, each as its grant's user in its grant's home", len(procs))
}

// grantOf is FIBERD_GRANT_UID of pid's initial environment.
func grantOf(pid int) string {
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("FIBERD_GRANT_UID=")); ok {
			return string(v)
		}
	}
	return ""
}

// procUID is the real uid of pid, -1 when unknown.
func procUID(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return -1
}

// nobody is the unprivileged user the degraded test runs fiberd as.
const nobody = 65534

// TestIsolationDegraded runs fiberd -dev as the unprivileged user nobody,
// asked (by default) to isolate every fiber: it starts anyway, says once
// what is missing, serves its grants unisolated and shows "none" in the
// status; restarted with -min-isolation grant, it refuses the grants with
// TIER_GAP.
func TestIsolationDegraded(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fiberd runs fibers on Linux only")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: the test starts fiberd as the user nobody")
	}
	for _, tool := range []string{"go", "cc", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the test builds fiberd and the example templates with it", tool)
		}
	}
	root := repotest.Root(t)
	// Everything nobody runs or reads must be open to it: the binaries, a
	// copy of the checkout's examples (the checkout may lie under /root),
	// and a state directory of its own.
	work := t.TempDir()
	for _, d := range []string{filepath.Dir(work), work} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(work, "bin")
	build(t, root, bin)
	checkout := filepath.Join(work, "checkout")
	for _, f := range []string{
		"examples/templates/c/counter.c", "examples/templates/python/counter.py",
		"sdk/zygote/c/build.sh", "sdk/zygote/c/fiberzygote.c", "sdk/zygote/c/fiberzygote.h", "sdk/zygote/python/fiberzygote.py",
	} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(checkout, f)), 0o755))
		must(t, os.WriteFile(filepath.Join(checkout, f), b, 0o644))
	}
	state := filepath.Join(work, "state")
	must(t, os.Mkdir(state, 0o700))
	must(t, os.Chown(state, nobody, nobody))
	asNobody := func(c *exec.Cmd) {
		c.Dir = checkout
		c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + state, "TMPDIR=" + state}
		c.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}
	}

	d := startFiberdWith(t, checkout, bin, state, "none", asNobody)
	st := d.waitWarm(t, "counter-c", "counter-py")
	lines := isolationLines(d.output())
	if len(lines) != 1 || !strings.Contains(lines[0], "Isolation is less than asked") || !strings.Contains(lines[0], "CAP_SYS_ADMIN") {
		t.Errorf("fiberd said %d isolation lines, want one saying what is missing (CAP_SYS_ADMIN): %q", len(lines), lines)
	}
	if len(st.Isolation) != 2 {
		t.Fatalf("status isolation %+v, want WARM and BASIC", st.Isolation)
	}
	for _, ti := range st.Isolation {
		if ti.Level != "none" || ti.NetworkNone || !strings.Contains(ti.Missing, "CAP_SYS_ADMIN") {
			t.Errorf("status isolation of %s: %+v, want none, no network none, CAP_SYS_ADMIN missing", ti.Tier, ti)
		}
	}
	for _, g := range st.Grants {
		if g.Warm && g.Isolation != "none" {
			t.Errorf("grant %s: isolation %q, want none", g.UID, g.Isolation)
		}
	}
	out, _ := d.ctl(t, "status")
	if !strings.Contains(string(out), "isolation WARM none, BASIC none") || !strings.Contains(string(out), "less than asked: fiberd runs without CAP_SYS_ADMIN") {
		t.Errorf("fiberctl status does not show the degraded isolation:\n%s", out)
	}
	uids := grantUIDs(st)
	var f api.CloneResponse
	d.ctlJSON(t, &f, "clone", "-grant-uid", uids["counter-c"])
	if body := get(t, f.Endpoint); !strings.Contains(body, "fence="+f.FiberID+" ") {
		t.Errorf("the unisolated fiber answered %q", body)
	}
	d.stop(t)

	// A node that must isolate refuses what it cannot isolate.
	d = startFiberdWith(t, checkout, bin, state, "none", asNobody, "-min-isolation", "grant")
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, code, _ := d.ctlQuiet(t, "status"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fiberd -min-isolation grant did not answer within 2 minutes:\n%s", d.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lines := isolationLines(d.output()); len(lines) != 1 || !strings.Contains(lines[0], `refusedTiers="WARM,BASIC"`) {
		t.Errorf("with -min-isolation grant, fiberd said %q, want one line naming the refused tiers", lines)
	}
	out, code, _ := d.ctlQuiet(t, "-o", "json", "clone", "-grant", filepath.Join(state, "grants", "counter-c.jwt"))
	var e api.Error
	if code == 0 || json.Unmarshal(out, &e) != nil || e.Code != api.CodeTierGap || !strings.Contains(e.Message, "-min-isolation") {
		t.Errorf("clone of a grant on a node that must isolate it, without the privilege: exit %d, %s; want TIER_GAP naming -min-isolation", code, out)
	}
	d.ctlJSON(t, &st, "status")
	if st.MinIsolation != "grant" {
		t.Errorf("status minIsolation %q, want grant", st.MinIsolation)
	}
	for _, g := range st.Grants {
		t.Errorf("grant %s admitted on a node that cannot isolate it", g.UID)
	}
	d.stop(t)
}

// isolationLines are the lines of fiberd's output about isolation.
func isolationLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"Isolation`) {
			lines = append(lines, l)
		}
	}
	return lines
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
