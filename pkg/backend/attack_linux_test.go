package backend

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// The attack test: fibers of testdata/attacker.c (C SDK, or exec) and
// testdata/attacker.py (Python SDK) hold secrets; one of them attacks the
// others, of its own grant (another session) and of another grant, and
// fiberd's state, and the other grant's cgroup. See attacker.c for what it
// tries.

var attackKinds = []struct {
	name string
	tier core.Tier
	spec func(tb testing.TB, tag string) template.Spec
}{
	{"proc-c", core.TierWarm, attackerCSpec},
	{"proc-python", core.TierWarm, func(tb testing.TB, tag string) template.Spec {
		return template.Spec{
			Command: sysPython(tb),
			Args:    []string{"-u", pyFile(tb, "pkg/backend/testdata/attacker.py"), "--tag", tag},
			Env:     map[string]string{"PYTHONPATH": pyFile(tb, "sdk/zygote/python"), "PYTHONDONTWRITEBYTECODE": "1"},
			Zygote:  true,
		}
	}},
	{"exec-c", core.TierBasic, attackerCSpec},
}

func attackerCSpec(tb testing.TB, tag string) template.Spec {
	return template.Spec{Command: attackerC(tb), Args: []string{"--tag", tag}, Zygote: true}
}

// fiberdState stands in for fiberd's state directory: 0700, owned by root,
// outside the scratch directories (so only permissions keep a fiber out),
// with fiberd's API socket and admin socket listening. It skips when there
// is no /run to make it in.
func fiberdState(tb testing.TB) (dir string, socks []string) {
	tb.Helper()
	dir, err := os.MkdirTemp("/run", "fiberd-attack-test-")
	if err != nil {
		isolationMiss(tb, "cannot make a state directory outside /tmp under /run: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "private"), 0o700); err != nil {
		tb.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "fiberd.sock"), filepath.Join(dir, "private", "admin.sock")} {
		l, err := net.Listen("unix", p)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { l.Close() })
		// Even a socket anyone may connect to stays out of reach.
		if err := os.Chmod(p, 0o666); err != nil {
			tb.Fatal(err)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		socks = append(socks, p)
	}
	return dir, socks
}

type victim struct {
	f      Fiber
	ep     endpoint
	secret string
}

func cloneVictim(t *testing.T, b Backend, uid string, seq uint64) victim {
	t.Helper()
	secret := fmt.Sprintf("s%d-%x", seq, rand.Uint64())
	ep := listen(t, seq%2 == 0)
	f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, seq), Listener: ep.file, Payload: []byte(secret)})
	if err != nil {
		t.Fatalf("Clone %s/%d: %v", uid, seq, err)
	}
	body, err := get(ep, "/whoami")
	if err != nil || fields(body)["secret"] != secret || fields(body)["file"] != "yes" {
		t.Fatalf("fiber %s: /whoami = %q, %v; want its secret and its file", f.Fence, body, err)
	}
	return victim{f: f, ep: ep, secret: secret}
}

// attack makes a attack the others and returns its verdict lines.
func attack(t *testing.T, a victim, pids []int, secrets, socks, dirs, tcp []string) []string {
	t.Helper()
	var ps []string
	for _, p := range pids {
		ps = append(ps, strconv.Itoa(p))
	}
	return attackWith(t, a, [][2]any{{"pids", ps}, {"secrets", secrets}, {"socks", socks}, {"dirs", dirs}, {"tcp", tcp}})
}

// attackWith sends a the attack query of the keys and values given, in
// order, and returns its verdict lines.
func attackWith(t *testing.T, a victim, kvs [][2]any) []string {
	t.Helper()
	// The values are paths, numbers and addresses: no character needs
	// escaping, and the attackers do not unescape.
	var q []string
	for _, kv := range kvs {
		if v := kv[1].([]string); len(v) > 0 {
			q = append(q, kv[0].(string)+"="+strings.Join(v, ","))
		}
	}
	body, err := get(a.ep, "/attack?"+strings.Join(q, "&"))
	if err != nil {
		t.Fatalf("attack: %v", err)
	}
	return strings.Split(strings.TrimSpace(body), "\n")
}

// open returns the lines of an attack that reached their target.
func open(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, " OPEN") {
			out = append(out, l)
		}
	}
	return out
}

// TestIsolationAttack: from inside a fiber, list, signal (kill 0, also
// kill -1), pidfd_open and ptrace another session's fiber of the same
// grant, another grant's fiber, both zygotes and fiberd; read their
// /proc/<pid>/environ, their scratch files (its own /tmp, and theirs
// through /proc/<pid>/root), write where they read (/tmp), and reach
// fiberd's sockets and state directory, and write in the host's
// world-writable places (/run/lock, /var/lock and one the test makes).
// Every attempt must fail, the victims must not see what the attacker
// wrote, and must still serve. A grant with "network": "none" must not
// reach a TCP listener of the host.
func TestIsolationAttack(t *testing.T) {
	state, socks := fiberdState(t)
	shared := sharedDirs(t)
	tag := strconv.Itoa(os.Getpid())
	hostTCP, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostTCP.Close()
	for _, k := range attackKinds {
		t.Run(k.name, func(t *testing.T) {
			b := isoBackend(t, k.tier)
			tree, _ := cgroupRoot(t)
			uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
			runA, runB := filepath.Join(state, "grants", uidA), filepath.Join(state, "grants", uidB)
			spec := k.spec(t, tag)
			var cgB string
			for _, g := range []struct{ uid, run string }{{uidA, runA}, {uidB, runB}} {
				cg, err := tree.Grant(g.uid)
				if err != nil {
					t.Fatal(err)
				}
				cgB = cg.Dir.Path()
				warmIn(t, b, g.uid, spec, cgB, g.run)
			}
			a1 := cloneVictim(t, b, uidA, 1) // another session of the attacker's grant
			b1 := cloneVictim(t, b, uidB, 1) // another grant's
			att := cloneVictim(t, b, uidA, 2)
			pids := []int{a1.f.PID, b1.f.PID, os.Getpid()}
			if k.tier == core.TierWarm {
				pids = append(pids, zygotePID(t, uidA), zygotePID(t, uidB))
			}
			var ps []string
			for _, p := range pids {
				ps = append(ps, strconv.Itoa(p))
			}
			lines := attackWith(t, att, [][2]any{{"pids", ps}, {"secrets", []string{a1.secret, b1.secret}}, {"socks", socks},
				{"dirs", []string{state, filepath.Join(state, "private"), runA, runB, cgB, tree.Root()}}, {"shared", shared}})
			for _, d := range shared {
				if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "shared "+d+" ") }) {
					t.Errorf("the attacker did not try to write in %s:\n%s", d, strings.Join(lines, "\n"))
				}
				if p := filepath.Join(d, "fiberd-attack-"+tag+"-shared"); exists(p) {
					t.Errorf("an isolated fiber wrote %s on the host", p)
				}
			}
			if len(lines) < 6*len(pids) {
				t.Fatalf("the attacker tried too little (%d lines):\n%s", len(lines), strings.Join(lines, "\n"))
			}
			if o := open(lines); len(o) > 0 {
				t.Errorf("attacks that reached their target:\n%s\n(all attempts:\n%s)", strings.Join(o, "\n"), strings.Join(lines, "\n"))
			}
			for _, v := range []victim{a1, b1} {
				if body, err := get(v.ep, "/planted"); err != nil || fields(body)["planted"] != "no" {
					t.Errorf("victim %s after the attack: %q, %v; want planted=no", v.f.Fence, body, err)
				}
			}

			// Loopback only: the host's TCP listener is out of reach.
			uidN := uidFor(t) + "n"
			specN := spec
			specN.Network = template.NetworkNone
			warmIn(t, b, uidN, specN, "", filepath.Join(state, "grants", uidN))
			n := cloneVictim(t, b, uidN, 1)
			lines = attack(t, n, nil, nil, nil, nil, []string{hostTCP.Addr().String()})
			if o := open(lines); len(o) > 0 {
				t.Errorf("a fiber of network none reached the host:\n%s", strings.Join(o, "\n"))
			}
		})
	}
}

// TestIsolationAttackControl runs the attacker without isolation, where
// every attempt it makes should succeed: the attack test can fail.
func TestIsolationAttackControl(t *testing.T) {
	if os.Geteuid() != 0 {
		isolationMiss(t, "not root: without isolation the attacker runs as this user and proves less")
	}
	state, socks := fiberdState(t)
	shared := sharedDirs(t)
	tag := "control" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		for _, d := range append([]string{"/tmp"}, shared...) {
			m, _ := filepath.Glob(filepath.Join(d, "fiberd-attack-"+tag+"-*"))
			for _, p := range m {
				os.Remove(p)
			}
		}
	})
	b := newBackend(t, core.TierWarm)
	uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
	warm(t, b, uidA, attackerCSpec(t, tag), "")
	warm(t, b, uidB, attackerCSpec(t, tag), "")
	a1, b1, att := cloneVictim(t, b, uidA, 1), cloneVictim(t, b, uidB, 1), cloneVictim(t, b, uidA, 2)
	lines := attackWith(t, att, [][2]any{{"pids", []string{strconv.Itoa(a1.f.PID), strconv.Itoa(b1.f.PID)}},
		{"secrets", []string{a1.secret, b1.secret}}, {"socks", socks}, {"dirs", []string{state}}, {"shared", shared}})
	got := strings.Join(open(lines), "\n")
	for _, d := range shared {
		if p := filepath.Join(d, "fiberd-attack-"+tag+"-shared"); !exists(p) {
			t.Errorf("without isolation, the attacker did not write %s: it proves nothing", p)
		}
	}
	for _, want := range []string{"shared " + shared[0],
		"list /proc/", "signal -1", "signal " + strconv.Itoa(a1.f.PID), "pidfd " + strconv.Itoa(b1.f.PID),
		"ptrace " + strconv.Itoa(b1.f.PID), "environ " + strconv.Itoa(a1.f.PID),
		"files /tmp/fiberd-attack-" + tag + "-" + b1.secret, "socket " + socks[0], "dir " + state,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("without isolation, %q did not reach its target; the attacker proves nothing:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if body, _ := get(b1.ep, "/planted"); fields(body)["planted"] != "yes" {
		t.Errorf("without isolation, the victim did not see the planted file: %q", body)
	}
}

// TestIsolationZygoteUnmounts: a zygote of IsolationFiber holds
// CAP_SYS_ADMIN in its user namespace and can unmount what nsinit mounted.
// What that reveals (the backend's locked covers: a hidepid /proc, empty
// read-only scratch directories) must show nothing of another grant, of
// fiberd or of the host's scratch directories, and the host's
// world-writable places stay read-only; its cgroup view cannot be
// unmounted at all.
func TestIsolationZygoteUnmounts(t *testing.T) {
	b := isoBackend(t, core.TierWarm)
	tree, _ := cgroupRoot(t)
	state, socks := fiberdState(t)
	shared := sharedDirs(t)
	tag := strconv.Itoa(os.Getpid())
	uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
	cgA, err := tree.Grant(uidA)
	if err != nil {
		t.Fatal(err)
	}
	cgB, err := tree.Grant(uidB)
	if err != nil {
		t.Fatal(err)
	}
	warmIn(t, b, uidB, attackerCSpec(t, tag), cgB.Dir.Path(), filepath.Join(state, "grants", uidB))
	b1 := cloneVictim(t, b, uidB, 1)
	query := fmt.Sprintf("pids=%d,%d,%d&secrets=%s&socks=%s&dirs=%s,%s,%s&shared=%s",
		b1.f.PID, zygotePID(t, uidB), os.Getpid(), b1.secret, strings.Join(socks, ","), cgB.Dir.Path(), tree.Root(), state,
		strings.Join(shared, ","))
	spec := attackerCSpec(t, tag)
	spec.Args = append(spec.Args, "--unmount", query)
	warmIn(t, b, uidA, spec, cgA.Dir.Path(), filepath.Join(state, "grants", uidA))
	a1 := cloneVictim(t, b, uidA, 1)
	body, err := get(a1.ep, "/zygote")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(body), "\n")
	// /sys/fs/cgroup was bound before the copy: locked, it cannot go.
	for _, want := range []string{"umount /proc done", "umount /tmp done", "umount /dev/shm done", "umount /sys/fs/cgroup Invalid argument"} {
		if !strings.Contains(body, want) {
			t.Errorf("the zygote could not %q, so this proves nothing:\n%s", want, body)
		}
	}
	if o := open(lines); len(o) > 0 {
		t.Errorf("after unmounting, the zygote reached:\n%s\n(all:\n%s)", strings.Join(o, "\n"), body)
	}
	if len(lines) < 15 {
		t.Errorf("the zygote tried too little:\n%s", body)
	}
	for _, d := range shared {
		if !strings.Contains(body, "shared "+d+" ") {
			t.Errorf("the zygote did not try to write in %s:\n%s", d, body)
		}
		if p := filepath.Join(d, "fiberd-attack-"+tag+"-shared"); exists(p) {
			t.Errorf("a zygote that unmounted its covers wrote %s on the host", p)
		}
	}
}

// sharedDirs returns the host's world-writable places an isolated fiber
// must not write in: /run/lock and /var/lock where they are directories,
// and one the test makes under /run (mode 1777, as /run/lock is), removed
// at cleanup. The one it makes comes first.
func sharedDirs(tb testing.TB) []string {
	tb.Helper()
	dir, err := os.MkdirTemp("/run", "fiberd-attack-shared-")
	if err != nil {
		isolationMiss(tb, "cannot make a world-writable directory under /run: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		tb.Fatal(err)
	}
	dirs := []string{dir}
	for _, d := range []string{"/run/lock", "/var/lock"} {
		if st, err := os.Stat(d); err == nil && st.IsDir() && st.Mode().Perm()&0o002 != 0 {
			dirs = append(dirs, d)
		}
	}
	// What an attacker wrote where it should not have (the failure this
	// looks for) does not outlive the test.
	tb.Cleanup(func() {
		for _, d := range dirs[1:] {
			m, _ := filepath.Glob(filepath.Join(d, "fiberd-attack-*-shared"))
			for _, p := range m {
				os.Remove(p)
			}
		}
	})
	return dirs
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestScratchIsSized: an isolated fiber that writes files into its scratch
// directories (/tmp, /var/tmp, /dev/shm) stops at their size: its grant's
// wBudget, or Config.ScratchSize when the grant has none, for each kind of
// template (the C and Python SDKs mount them per fiber, nsinit per exec
// fiber, and per grant for "isolation": "shared"), and keeps serving.
func TestScratchIsSized(t *testing.T) {
	const (
		defaultSize = 1 << 20
		budget      = 3 << 20
		try         = 16 << 20
	)
	kinds := append([]struct {
		name string
		tier core.Tier
		spec func(tb testing.TB, tag string) template.Spec
	}{}, attackKinds...)
	kinds = append(kinds, struct {
		name string
		tier core.Tier
		spec func(tb testing.TB, tag string) template.Spec
	}{"proc-c-shared", core.TierWarm, func(tb testing.TB, tag string) template.Spec {
		s := attackerCSpec(tb, tag)
		s.Isolation = template.IsolationShared
		return s
	}})
	state, _ := fiberdState(t)
	tag := strconv.Itoa(os.Getpid())
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			b := isoBackend(t, k.tier, func(c *Config) { c.ScratchSize = defaultSize })
			for i, g := range []struct {
				wBudget, size int64
			}{{0, defaultSize}, {budget, budget}} {
				uid := fmt.Sprintf("%s%d", uidFor(t), i)
				err := b.Warm(ctxT(t), WarmRequest{
					Grant: core.Grant{UID: uid, Template: "counter@sha256:" + strings.Repeat("0", 64), WBudget: g.wBudget},
					Spec:  k.spec(t, tag), RunDir: filepath.Join(state, "grants", uid),
				})
				if err != nil {
					t.Fatalf("Warm: %v", err)
				}
				v := cloneVictim(t, b, uid, 1)
				var fills []string
				for _, d := range scratchDirs {
					if exists(d) {
						fills = append(fills, fmt.Sprintf("%s:%d", d, try))
					}
				}
				lines := attackWith(t, v, [][2]any{{"fill", fills}})
				for _, d := range scratchDirs {
					if !exists(d) {
						continue
					}
					i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "fill "+d+" ") })
					if i < 0 {
						t.Errorf("no fill of %s:\n%s", d, strings.Join(lines, "\n"))
						continue
					}
					var wrote int64
					var how string
					if _, err := fmt.Sscanf(strings.TrimPrefix(lines[i], "fill "+d+" "), "wrote %d %s", &wrote, &how); err != nil {
						t.Fatalf("%q: %v", lines[i], err)
					}
					// A tmpfs of size bytes takes size bytes of file data
					// at most; 64 KiB writes leave less than one unused.
					if wrote > g.size || wrote < g.size-64<<10 || !strings.Contains(lines[i], "No space left on device") {
						t.Errorf("wBudget %d: %s; want %d bytes written, then ENOSPC", g.wBudget, lines[i], g.size)
					}
				}
				if body, err := get(v.ep, "/whoami"); err != nil || fields(body)["secret"] != v.secret {
					t.Errorf("after filling its scratch, the fiber answers %q, %v", body, err)
				}
			}
		})
	}
}

// TestIsolationLaterHostMountsReadOnly: a world-writable file system the
// host mounts after the backend started (propagated into the spawner's
// mount namespace, which is the host's slave) is read-only to a grant
// warmed afterwards, as the host's mounts at start are.
func TestIsolationLaterHostMountsReadOnly(t *testing.T) {
	state, _ := fiberdState(t)
	base, err := os.MkdirTemp("/run", "fiberd-attack-late-")
	if err != nil {
		isolationMiss(t, "cannot make a directory under /run: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(base, 0o755))
	// A shared mount of the host's, as / is on a systemd host, so that
	// what is mounted below it later reaches the spawner.
	must(unix.Mount(base, base, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) })
	must(unix.Mount("", base, "", unix.MS_SHARED, ""))
	b := isoBackend(t, core.TierWarm)
	late := filepath.Join(base, "late")
	must(os.Mkdir(late, 0o755))
	must(unix.Mount("fiberd-late", late, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=1m"))
	t.Cleanup(func() { _ = unix.Unmount(late, unix.MNT_DETACH) })
	tag := strconv.Itoa(os.Getpid())
	uid := uidFor(t)
	warmIn(t, b, uid, attackerCSpec(t, tag), "", filepath.Join(state, "grants", uid))
	v := cloneVictim(t, b, uid, 1)
	lines := attackWith(t, v, [][2]any{{"shared", []string{late}}})
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "shared "+late+" ") }); i < 0 || !strings.HasPrefix(lines[i], "shared "+late+" blocked") {
		t.Errorf("a fiber writing into a world-writable tmpfs the host mounted after the backend started: %q, want blocked", lines)
	}
	if p := filepath.Join(late, "fiberd-attack-"+tag+"-shared"); exists(p) {
		t.Errorf("an isolated fiber wrote %s on the host", p)
	}
}
