package backend

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// sysPython is a python3 the grant's user can run: under isolation the
// template runs as a user of its own, which cannot read an interpreter
// installed under /root (a pyenv shim's). It skips when there is none.
func sysPython(tb testing.TB) string {
	tb.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o001 != 0 {
			return p
		}
	}
	isolationMiss(tb, "no python3 in /usr/bin or /usr/local/bin: an isolated Python zygote needs one every user can run")
	return ""
}

// pyFiles are the checkout's Python files the isolated tests run, by their
// path in the checkout.
var pyFiles = []string{"examples/templates/python/counter.py", "sdk/zygote/python/fiberzygote.py", "pkg/backend/testdata/attacker.py",
	"pkg/backend/testdata/forwarder.py", "pkg/backend/testdata/outsider.py"}

var (
	pyTreeOnce sync.Once
	pyTreeDir  string
	pyTreeErr  error
	pyCopy     string // the copy under /run, removed by TestMain
)

// pyFile is the path of rel (a path in the checkout) where an isolated
// grant can read it: in the checkout when it can read that, else in a copy
// of pyFiles under /run (a checkout under /root is closed to it), removed
// when the test binary ends (TestMain).
func pyFile(tb testing.TB, rel string) string {
	tb.Helper()
	pyTreeOnce.Do(func() {
		root := abs(tb, "../..")
		pyTreeDir = root
		for _, f := range pyFiles {
			if ReadableByGrants(filepath.Join(root, f)) != nil {
				pyTreeDir, pyTreeErr = copyPyFiles(root)
				return
			}
		}
	})
	if pyTreeErr != nil {
		isolationMiss(tb, "the checkout's Python files are closed to an isolated grant, and copying them failed: %v", pyTreeErr)
	}
	return filepath.Join(pyTreeDir, rel)
}

// copyPyFiles copies pyFiles of the checkout root into a new directory
// under /run that others may read.
func copyPyFiles(root string) (string, error) {
	dir, err := os.MkdirTemp("/run", "fiberd-backend-py-")
	if err != nil {
		return "", err
	}
	pyCopy = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	for _, f := range pyFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// isolationMiss skips a test of isolation, saying what is missing; with
// FIBERD_ISOLATION_REQUIRED=1 (CI, as root) it fails instead, so the
// attack test cannot be skipped there unnoticed.
func isolationMiss(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("FIBERD_ISOLATION_REQUIRED") != "" {
		tb.Fatal(msg + " (FIBERD_ISOLATION_REQUIRED is set)")
	}
	tb.Skip(msg)
}

// kindPythonSys is kindPython on sysPython.
var kindPythonSys = kind{"python", func(tb testing.TB, args ...string) template.Spec {
	return template.Spec{
		Command: sysPython(tb),
		Args:    append([]string{"-u", pyFile(tb, "examples/templates/python/counter.py")}, args...),
		Env:     map[string]string{"PYTHONPATH": pyFile(tb, "sdk/zygote/python"), "PYTHONDONTWRITEBYTECODE": "1"},
		Zygote:  true,
	}
}}

var isoImpls = []impl{
	{"proc-c", core.TierWarm, kindC},
	{"proc-python", core.TierWarm, kindPythonSys},
	{"exec-c", core.TierBasic, kindC},
	{"exec-python", core.TierBasic, kindPythonSys},
}

// isoBackend returns a backend asked for IsolationFiber, and skips, saying
// what is missing, when the host gives less (not root, no user
// namespaces).
func isoBackend(tb testing.TB, tier core.Tier, mods ...func(*Config)) Backend {
	tb.Helper()
	cfg := testConfig()
	cfg.Isolation = IsolationFiber
	for _, m := range mods {
		m(&cfg)
	}
	var (
		b   Backend
		err error
	)
	if tier == core.TierWarm {
		b, err = NewProc(cfg)
	} else {
		b, err = NewExec(cfg)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	if s := b.Isolation(); !s.Level.AtLeast(cfg.Isolation) || !s.NetworkNone {
		isolationMiss(tb, "this host isolates less than asked (%+v): the isolation tests need root and user namespaces", s)
	}
	return b
}

// procStatus reads /proc/<pid>/status into a map.
func procStatus(tb testing.TB, pid int) map[string]string {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func nsOf(tb testing.TB, pid int, kind string) uint64 {
	tb.Helper()
	ino, err := nsInode(pid, kind)
	if err != nil {
		tb.Fatal(err)
	}
	return ino
}

// firstID is the real uid of pid.
func firstID(tb testing.TB, pid int, key string) int {
	tb.Helper()
	f := strings.Fields(procStatus(tb, pid)[key])
	if len(f) == 0 {
		tb.Fatalf("pid %d has no %s line", pid, key)
	}
	id, err := strconv.Atoi(f[0])
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

const capSysAdminOnly = "0000000000200000"

// TestIsolationSupport: a backend gives what Config.Isolation asks where it
// can, and nothing without being asked.
func TestIsolationSupport(t *testing.T) {
	for _, want := range []Isolation{IsolationNone, IsolationGrant, IsolationFiber} {
		for _, tier := range []core.Tier{core.TierWarm, core.TierBasic} {
			t.Run(string(want)+"/"+string(tier), func(t *testing.T) {
				cfg := testConfig()
				cfg.Isolation = want
				var b Backend
				var err error
				if tier == core.TierWarm {
					b, err = NewProc(cfg)
				} else {
					b, err = NewExec(cfg)
				}
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				s := b.Isolation()
				if want == IsolationNone {
					if s != (IsolationSupport{Level: IsolationNone}) {
						t.Fatalf("Isolation() = %+v, want level none and nothing missing", s)
					}
					return
				}
				if os.Geteuid() != 0 {
					t.Skip("not root: the probe cannot give a grant a user of its own")
				}
				wantLevel := want
				if tier == core.TierBasic {
					wantLevel = IsolationFiber // every exec fiber is isolated on its own
				}
				if s.Level != wantLevel || !s.NetworkNone || s.Missing != "" {
					t.Fatalf("Isolation() = %+v, want level %s with network none and nothing missing (running as root)", s, wantLevel)
				}
			})
		}
	}
}

// TestIsolatedFibers: an isolated grant's zygote (or exec fiber) runs as a
// user of its own, with no_new_privs, in namespaces of its own; each
// fiber is PID 1 of a PID namespace of its own (pid=1 in the counter's
// answer), in its leaf before its code runs, without any capability, and
// Fiber.PID is its pid in fiberd's namespace. Kill and Stop end them and
// nothing is left.
func TestIsolatedFibers(t *testing.T) {
	for _, im := range isoImpls {
		for _, w := range []int{0, 4} {
			if w > 0 && im.tier != core.TierWarm {
				continue
			}
			t.Run(fmt.Sprintf("%s/W=%d", im.name, w), func(t *testing.T) { testIsolatedFibers(t, im, w) })
		}
	}
}

// testIsolatedFibers is TestIsolatedFibers for one backend, with w spares
// (proc only): a fiber handed over from a spare is isolated as a forked one.
func testIsolatedFibers(t *testing.T, im impl, w int) {
	b := isoBackend(t, im.tier)
	tree, mount := cgroupRoot(t)
	uid := uidFor(t)
	g, err := tree.Grant(uid)
	if err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir()
	warmIn(t, b, uid, im.kind.spec(t), g.Dir.Path(), runDir)
	if got := b.GrantIsolation(uid); got != IsolationFiber {
		t.Fatalf("GrantIsolation = %q, want fiber", got)
	}
	var spares []int
	if w > 0 {
		b.(*Proc).SetSpares(uid, w, 8)
		spares = readySpares(t, b.(*Proc), uid, w)
	}
	var zpid int
	if im.tier == core.TierWarm {
		zpid = checkIsolatedZygote(t, uid)
	}
	ctx := ctxT(t)
	var fibers []Fiber
	var eps []endpoint
	gid := -1
	for i := uint64(1); i <= 3; i++ {
		leaf, err := g.Fiber(1, i)
		if err != nil {
			t.Fatal(err)
		}
		ep := listen(t, i%2 == 0)
		f, err := b.Clone(ctx, CloneRequest{Fence: fence(uid, i), Listener: ep.file, Leaf: leaf.Path(), Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatalf("Clone %d: %v", i, err)
		}
		if f.Isolation != IsolationFiber {
			t.Errorf("fiber %d: Isolation %q, want fiber", i, f.Isolation)
		}
		if w > 0 && !slices.Contains(spares, f.PID) {
			t.Errorf("fiber %d: pid %d is none of the spares %v", i, f.PID, spares)
		}
		body, err := get(ep, "/")
		if err != nil {
			t.Fatalf("fiber %d: %v", i, err)
		}
		m := fields(body)
		wantCg := strings.TrimPrefix(leaf.Path(), mount)
		if m["pid"] != "1" || m["fence"] != f.Fence.String() || m["cgroup"] != wantCg {
			t.Errorf("fiber %d answered %q, want pid=1, its fence and cgroup=%s", i, body, wantCg)
		}
		u := checkIsolatedFiber(t, i, f, leaf.Path(), zpid, tree.Root())
		if gid >= 0 && u != gid {
			t.Errorf("fibers of one grant run as %d and %d", gid, u)
		}
		gid = u
		for _, o := range fibers {
			if nsOf(t, o.PID, "pid") == nsOf(t, f.PID, "pid") {
				t.Errorf("fibers %s and %s share a PID namespace", o.Fence, f.Fence)
			}
		}
		fibers = append(fibers, f)
		eps = append(eps, ep)
	}
	var home unix.Stat_t
	if err := unix.Stat(filepath.Join(runDir, "home"), &home); err != nil || int(home.Uid) != gid || home.Mode&0o777 != 0o700 {
		t.Errorf("home directory: %v, uid %d mode %o, want the grant's uid and 0700", err, home.Uid, home.Mode&0o777)
	}

	if err := b.Kill(ctx, fibers[0].Fence); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if e := nextExit(t, b); e.Fence != fibers[0].Fence || !e.Reason.Killed {
		t.Fatalf("exit after Kill = %+v", e)
	}
	waitGone(t, fibers[0].PID)
	_, _ = get(eps[1], "/exit/7")
	if e := nextExit(t, b); e.Fence != fibers[1].Fence || e.Reason != (ExitReason{Code: 7}) {
		t.Fatalf("exit of the exiting fiber = %+v, want exit:7", e)
	}
	if err := b.Stop(ctx, uid); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if e := nextExit(t, b); e.Fence != fibers[2].Fence || !e.Reason.Killed {
		t.Fatalf("exit after Stop = %+v", e)
	}
	if b.GrantIsolation(uid) != "" {
		t.Fatal("GrantIsolation of a stopped grant is not empty")
	}
	noStrays(t, uid)
}

// checkIsolatedZygote checks that grant uid's isolated zygote has
// no_new_privs and CAP_SYS_ADMIN alone, namespaces of its own but the
// network's (network none is not asked), and returns its pid.
func checkIsolatedZygote(t *testing.T, uid string) int {
	self := os.Getpid()
	zpid := zygotePID(t, uid)
	st := procStatus(t, zpid)
	if st["NoNewPrivs"] != "1" || st["CapEff"] != capSysAdminOnly || st["CapAmb"] != capSysAdminOnly {
		t.Errorf("zygote: NoNewPrivs %s CapEff %s CapAmb %s, want 1 and CAP_SYS_ADMIN alone", st["NoNewPrivs"], st["CapEff"], st["CapAmb"])
	}
	for _, ns := range []string{"user", "pid", "mnt", "ipc", "uts"} {
		if nsOf(t, zpid, ns) == nsOf(t, self, ns) {
			t.Errorf("zygote shares fiberd's %s namespace", ns)
		}
	}
	if nsOf(t, zpid, "net") != nsOf(t, self, "net") {
		t.Error("zygote without network none has a network namespace of its own")
	}
	return zpid
}

// checkIsolatedFiber checks isolated fiber i (f, in leaf; its zygote zpid,
// 0 for exec; the cgroup tree at treeRoot): no capability and
// no_new_privs, one id of the default range as uid and gid, no
// supplementary group, its zygote's user but not its pid, mount and IPC
// namespaces, and its grant's cgroup alone at /sys/fs/cgroup. It returns
// the fiber's uid.
func checkIsolatedFiber(t *testing.T, i uint64, f Fiber, leaf string, zpid int, treeRoot string) int {
	st := procStatus(t, f.PID)
	if st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" || st["CapAmb"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Errorf("fiber %d: CapEff %s CapPrm %s CapAmb %s NoNewPrivs %s, want no capability and no_new_privs", i, st["CapEff"], st["CapPrm"], st["CapAmb"], st["NoNewPrivs"])
	}
	u, gg := firstID(t, f.PID, "Uid"), firstID(t, f.PID, "Gid")
	if u == 0 || u != gg || uint32(u) < DefaultIDFirst || uint32(u) >= DefaultIDFirst+DefaultIDCount {
		t.Errorf("fiber %d runs as uid %d gid %d, want one id of the default range", i, u, gg)
	}
	if st["Groups"] != "" {
		t.Errorf("fiber %d has supplementary groups %q", i, st["Groups"])
	}
	if zpid != 0 {
		if firstID(t, zpid, "Uid") != u {
			t.Errorf("fiber %d and its zygote run as different users", i)
		}
		for _, ns := range []string{"pid", "mnt", "ipc"} {
			if nsOf(t, f.PID, ns) == nsOf(t, zpid, ns) {
				t.Errorf("fiber %d shares its zygote's %s namespace", i, ns)
			}
		}
	}
	// It sees its grant's cgroup alone at /sys/fs/cgroup.
	view, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/sys/fs/cgroup", f.PID))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range view {
		names[e.Name()] = true
	}
	if !names[filepath.Base(leaf)] || !names["cgroup.procs"] || names["unified"] || names[filepath.Base(treeRoot)] {
		t.Errorf("fiber %d sees at /sys/fs/cgroup %v, want its grant's cgroup alone", i, names)
	}
	return u
}

// warmIn is warm with a run directory of the caller's.
func warmIn(tb testing.TB, b Backend, uid string, spec template.Spec, cgroupDir, runDir string) {
	tb.Helper()
	err := b.Warm(ctxT(tb.(*testing.T)), WarmRequest{
		Grant: core.Grant{UID: uid, Template: "counter@sha256:" + strings.Repeat("0", 64)}, Spec: spec, Cgroup: cgroupDir, RunDir: runDir,
	})
	if err != nil {
		tb.Fatalf("Warm: %v", err)
	}
}

// TestIsolationShared: "isolation": "shared" leaves the fibers of a grant
// in their zygote's namespaces (the zygote keeps no capability), still
// apart from fiberd's.
func TestIsolationShared(t *testing.T) {
	b := isoBackend(t, core.TierWarm)
	uid := uidFor(t)
	spec := kindC.spec(t)
	spec.Isolation = template.IsolationShared
	warm(t, b, uid, spec, "")
	if got := b.GrantIsolation(uid); got != IsolationGrant {
		t.Fatalf("GrantIsolation = %q, want grant", got)
	}
	zpid := zygotePID(t, uid)
	if st := procStatus(t, zpid); st["CapEff"] != "0000000000000000" || st["CapAmb"] != "0000000000000000" {
		t.Errorf("shared zygote keeps capabilities: CapEff %s CapAmb %s", st["CapEff"], st["CapAmb"])
	}
	ep := listen(t, true)
	f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	if f.Isolation != IsolationGrant {
		t.Errorf("fiber Isolation %q, want grant", f.Isolation)
	}
	body, err := get(ep, "/")
	if err != nil {
		t.Fatal(err)
	}
	if m := fields(body); m["pid"] == "1" || m["pid"] == strconv.Itoa(f.PID) {
		t.Errorf("fiber answered %q: want its pid in the zygote's namespace (neither 1 nor %d)", body, f.PID)
	}
	if nsOf(t, f.PID, "pid") != nsOf(t, zpid, "pid") || nsOf(t, zpid, "pid") == nsOf(t, os.Getpid(), "pid") {
		t.Error("a shared fiber should be in its zygote's PID namespace, which is not fiberd's")
	}
}

// TestIsolationRefusals: Warm refuses with ErrTierGap a grant that needs
// more isolation than the backend gives, and "network": "none" where there
// is no isolation.
func TestIsolationRefusals(t *testing.T) {
	for _, tier := range []core.Tier{core.TierWarm, core.TierBasic} {
		b := newBackend(t, tier) // Config.Isolation none
		uid := uidFor(t) + strings.ToLower(string(tier))
		err := b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: kindC.spec(t), RunDir: t.TempDir(), MinIsolation: IsolationGrant})
		if !errors.Is(err, core.ErrTierGap) {
			t.Errorf("%s: Warm needing isolation grant: %v, want ErrTierGap", tier, err)
		}
		spec := kindC.spec(t)
		spec.Network = template.NetworkNone
		err = b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: spec, RunDir: t.TempDir()})
		if !errors.Is(err, core.ErrTierGap) {
			t.Errorf("%s: Warm of network none without isolation: %v, want ErrTierGap", tier, err)
		}
		if b.Warmed(uid) {
			t.Errorf("%s: refused grant is warm", tier)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	b := isoBackend(t, core.TierWarm, func(c *Config) { c.Isolation = IsolationGrant })
	uid := uidFor(t)
	err := b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: kindC.spec(t), RunDir: t.TempDir(), MinIsolation: IsolationFiber})
	if !errors.Is(err, core.ErrTierGap) {
		t.Errorf("Warm needing fiber isolation from a backend giving grant: %v, want ErrTierGap", err)
	}
	spec := kindC.spec(t)
	spec.Isolation = template.IsolationShared
	if err := b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: spec, RunDir: t.TempDir(), MinIsolation: IsolationGrant}); err != nil {
		t.Errorf("Warm of a shared template needing grant isolation: %v", err)
	}
}

// TestIsolatedUnreadable: an isolated Python template whose script lies
// where its user cannot read it (a test's temporary directory under /tmp)
// does not warm, and the error says why a stranger to the host may fail.
func TestIsolatedUnreadable(t *testing.T) {
	b := isoBackend(t, core.TierWarm)
	script := filepath.Join(t.TempDir(), "counter.py")
	src, err := os.ReadFile(abs(t, "../../examples/templates/python/counter.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, src, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := kindPythonSys.spec(t)
	spec.Args[1] = script
	err = b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uidFor(t)}, Spec: spec, RunDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "stranger to the host") || !strings.Contains(err.Error(), "/tmp") {
		t.Fatalf("Warm of a script under /tmp: %v, want a failure saying the isolated user must read its files outside /tmp", err)
	}
}

// TestNetworkNone: a grant of "network": "none" runs in a network
// namespace of its own with loopback alone (up), and its fibers serve on
// the TCP and unix listeners fiberd bound in its own namespace.
func TestNetworkNone(t *testing.T) {
	for _, im := range []impl{isoImpls[0], isoImpls[2]} {
		t.Run(im.name, func(t *testing.T) {
			b := isoBackend(t, im.tier)
			uid := uidFor(t)
			spec := im.kind.spec(t)
			spec.Network = template.NetworkNone
			warm(t, b, uid, spec, "")
			for i, unixSock := range []bool{false, true} {
				ep := listen(t, unixSock)
				f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, uint64(i+1)), Listener: ep.file})
				if err != nil {
					t.Fatal(err)
				}
				for n := 1; n <= 2; n++ {
					if body, err := get(ep, "/"); err != nil || fields(body)["count"] != strconv.Itoa(n) {
						t.Fatalf("fiber on a %s listener: %q, %v", ep.network, body, err)
					}
				}
				if nsOf(t, f.PID, "net") == nsOf(t, os.Getpid(), "net") {
					t.Fatal("fiber of network none is in fiberd's network namespace")
				}
				dev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", f.PID))
				if err != nil {
					t.Fatal(err)
				}
				var ifaces []string
				for _, line := range strings.Split(string(dev), "\n")[2:] {
					if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
						ifaces = append(ifaces, name)
					}
				}
				if strings.Join(ifaces, ",") != "lo" {
					t.Fatalf("fiber's network namespace has interfaces %v, want lo alone", ifaces)
				}
			}
		})
	}
}

// TestIsolatedZygoteDies: the zygote is PID 1 of the grant's namespace;
// when it dies the kernel ends its fibers, which are reported TemplateDied,
// nothing is left, and the grant warms again under the same user.
func TestIsolatedZygoteDies(t *testing.T) {
	for _, k := range []kind{kindC, kindPythonSys} {
		t.Run(k.name, func(t *testing.T) {
			b := isoBackend(t, core.TierWarm)
			uid := uidFor(t)
			spec := k.spec(t)
			warm(t, b, uid, spec, "")
			zpid := zygotePID(t, uid)
			user := firstID(t, zpid, "Uid")
			var fibers []Fiber
			for i := uint64(1); i <= 2; i++ {
				ep := listen(t, i%2 == 0)
				f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, i), Listener: ep.file})
				if err != nil {
					t.Fatal(err)
				}
				fibers = append(fibers, f)
			}
			if err := unix.Kill(zpid, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for range fibers {
				if e := nextExit(t, b); !e.Reason.TemplateDied {
					t.Fatalf("fiber exit = %+v, want TemplateDied", e)
				}
			}
			if e := nextExit(t, b); !e.Template || e.Reason.Signal != "SIGKILL" {
				t.Fatalf("template exit = %+v", e)
			}
			for _, f := range fibers {
				waitGone(t, f.PID)
			}
			noStrays(t, uid)
			warm(t, b, uid, spec, "")
			if got := firstID(t, zygotePID(t, uid), "Uid"); got != user {
				t.Fatalf("re-warmed zygote runs as %d, before as %d", got, user)
			}
		})
	}
}

// TestChildByNSpid: fiberd finds a fiber of an isolated zygote that sent
// no pidfd (a zygote without the SDK's support) by its pid in the zygote's
// namespace.
func TestChildByNSpid(t *testing.T) {
	b := isoBackend(t, core.TierWarm)
	uid := uidFor(t)
	warm(t, b, uid, kindC.spec(t), "")
	ep := listen(t, false)
	f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	nspid := strings.Fields(procStatus(t, f.PID)["NSpid"])
	if len(nspid) != 3 || nspid[2] != "1" {
		t.Fatalf("fiber's NSpid %v: want fiberd's, the zygote's and 1 in its own", nspid)
	}
	inZygote, _ := strconv.Atoi(nspid[1])
	zpid := zygotePID(t, uid)
	if got, err := childByNSpid(zpid, inZygote); err != nil || got != f.PID {
		t.Fatalf("childByNSpid(%d, %d) = %d, %v; want %d", zpid, inZygote, got, err, f.PID)
	}
	if _, err := childByNSpid(zpid, inZygote+1000); err == nil {
		t.Fatal("childByNSpid found a pid the zygote has no child at")
	}
}

// degradedEnv marks the child process of TestIsolationDegraded.
const degradedEnv = "FIBERD_TEST_DEGRADED"

// TestIsolationDegraded runs TestIsolationDegradedChild as the unprivileged
// user nobody: asked for isolation, the backends start anyway, report
// IsolationNone with what is missing, log it once, and serve fibers.
func TestIsolationDegraded(t *testing.T) {
	if os.Getenv(degradedEnv) != "" {
		t.Skip("already the child")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot start the test as another user")
	}
	bin := counterC(t)
	// The child, another user, must reach the counter it runs.
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/proc/self/exe", "-test.run=^TestIsolationDegradedChild$", "-test.v", "-test.count=1")
	cmd.Env = []string{degradedEnv + "=" + bin, "PATH=" + DefaultPath, "TMPDIR=/tmp", "HOME=/tmp"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestIsolationDegradedChild") {
		t.Fatalf("the degraded child failed: %v\n%s", err, out)
	}
}

func TestIsolationDegradedChild(t *testing.T) {
	bin := os.Getenv(degradedEnv)
	if bin == "" {
		t.Skip("run by TestIsolationDegraded")
	}
	if os.Geteuid() == 0 {
		t.Fatal("the degraded child runs as root")
	}
	for _, tier := range []core.Tier{core.TierWarm, core.TierBasic} {
		var lines []string
		var mu sync.Mutex
		cfg := testConfig()
		cfg.Isolation = IsolationFiber
		// The backend says it at V(1); the agent says it once at Info.
		cfg.Logger = funcr.New(func(prefix, args string) {
			mu.Lock()
			lines = append(lines, prefix+" "+args)
			mu.Unlock()
		}, funcr.Options{Verbosity: 1})
		var b Backend
		var err error
		if tier == core.TierWarm {
			b, err = NewProc(cfg)
		} else {
			b, err = NewExec(cfg)
		}
		if err != nil {
			t.Fatalf("%s: the backend does not start without the privilege: %v", tier, err)
		}
		s := b.Isolation()
		if s.Level != IsolationNone || s.NetworkNone || !strings.Contains(s.Missing, "CAP_SYS_ADMIN") {
			t.Errorf("%s: Isolation() = %+v, want none, no network none, and CAP_SYS_ADMIN named as missing", tier, s)
		}
		mu.Lock()
		said := 0
		for _, l := range lines {
			if strings.Contains(l, "Isolation is less than asked") && strings.Contains(l, "CAP_SYS_ADMIN") {
				said++
			}
		}
		mu.Unlock()
		if said != 1 {
			t.Errorf("%s: %d log lines say what is missing, want 1: %q", tier, said, lines)
		}
		uid := uidFor(t) + strings.ToLower(string(tier))
		spec := template.Spec{Command: bin, Zygote: true}
		if err := b.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid}, Spec: spec, RunDir: t.TempDir(), MinIsolation: IsolationGrant}); !errors.Is(err, core.ErrTierGap) {
			t.Errorf("%s: Warm needing isolation: %v, want ErrTierGap", tier, err)
		}
		warm(t, b, uid, spec, "")
		if got := b.GrantIsolation(uid); got != IsolationNone {
			t.Errorf("%s: GrantIsolation = %q, want none", tier, got)
		}
		ep := listen(t, true)
		f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
		if err != nil {
			t.Fatalf("%s: Clone: %v", tier, err)
		}
		if body, err := get(ep, "/"); err != nil || fields(body)["pid"] != strconv.Itoa(f.PID) || f.Isolation != IsolationNone {
			t.Errorf("%s: fiber %+v answered %q, %v", tier, f, body, err)
		}
		if err := b.Close(); err != nil {
			t.Errorf("%s: Close: %v", tier, err)
		}
	}
}

// TestHomeDir: a grant's home is made 0700 and its id's; a home its grant
// already owns, 0700, is left as it is (a restarted fiberd, which in a
// grant Pod could not open it otherwise); one of another mode or owner is
// taken back and given again. The descriptor is O_PATH, which nsinit
// changes into.
func TestHomeDir(t *testing.T) {
	if os.Geteuid() != 0 {
		isolationMiss(t, "not root: a home directory is given to the grant's id with chown")
	}
	run := t.TempDir()
	const id = DefaultIDFirst + 40
	check := func(what string) unix.Stat_t {
		t.Helper()
		f, err := homeDir(run, id)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(run, "home"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != id || st.Gid != id || st.Mode&0o7777 != 0o700 {
			t.Fatalf("%s: home is %d:%d mode %o, want %d:%d 0700", what, st.Uid, st.Gid, st.Mode&0o7777, id, id)
		}
		if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil || fl&unix.O_PATH == 0 {
			t.Errorf("%s: the home's descriptor is not O_PATH (flags %#x, %v)", what, fl, err)
		}
		return st
	}
	first := check("a new home")
	time.Sleep(10 * time.Millisecond)
	again := check("the grant's own home")
	if again.Ctim != first.Ctim {
		t.Error("a home its grant owned, 0700, was changed again")
	}
	home := filepath.Join(run, "home")
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	check("a home of another mode")
	if err := os.Chown(home, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	check("a home of another owner")
}
