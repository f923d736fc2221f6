package backend

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
)

// isoCkpt returns a proc backend that isolates every fiber (IsolationFiber)
// and parks with the test CRIU, skipping (failing under
// FIBERD_ISOLATION_REQUIRED or FIBERD_CRIU_REQUIRED) where the host has
// neither.
func isoCkpt(t *testing.T) *Proc {
	t.Helper()
	criu := criuForTest(t)
	p := isoBackend(t, core.TierWarm, func(c *Config) { c.CRIU = criu }).(*Proc)
	if err := p.CheckpointSupport(ctxT(t)); err != nil {
		t.Fatalf("CheckpointSupport: %v", err)
	}
	if err := p.CheckpointIsolated(IsolationFiber); err != nil {
		if os.Getenv("FIBERD_CRIU_REQUIRED") != "" {
			t.Fatalf("CheckpointIsolated: %v", err)
		}
		t.Skipf("isolated fibers cannot be parked here: %v", err)
	}
	return p
}

// TestParkResumeIsolated parks fibers of an isolated grant (C and Python
// counters, TCP and unix listeners; the C counter's command lies under
// /tmp, which the grant sees covered, so criu gets it from fiberd) and
// resumes them, twice: each counts on, keeps what it wrote in its own /tmp,
// and is isolated as before: its own user, PID, mount and IPC namespaces,
// pid 1 of its PID namespace, the grant's uid, no capability, and every
// mount read-only but its own scratch and /proc.
func TestParkResumeIsolated(t *testing.T) {
	for _, k := range []kind{kindC, kindPythonSys} {
		for _, unixSock := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/unix=%v", k.name, unixSock), func(t *testing.T) {
				p := isoCkpt(t)
				uid := uidFor(t)
				warm(t, p, uid, k.spec(t, "--dirty-mib", "1"), "")
				ep := listen(t, unixSock)
				f := fence(uid, 1)
				fb, err := p.Clone(ctxT(t), CloneRequest{Fence: f, Listener: ep.file})
				if err != nil {
					t.Fatal(err)
				}
				counterOf(t, ep)
				before := checkResumedIsolation(t, fb.PID, 0)
				writeAs(t, before, fmt.Sprintf("/proc/%d/root/tmp/session-state", fb.PID), "kept")
				state := t.TempDir()
				for round := 1; round <= 2; round++ {
					dir := filepath.Join(state, fmt.Sprintf("img%d", round))
					park(t, p, f, dir)
					if e := nextExit(t, p); e.Fence != f || !e.Reason.Parked {
						t.Fatalf("Exit after park = %+v, want %s parked", e, f)
					}
					req := ResumeRequest{Fence: fence(uid, uint64(round+1)), Image: dir}
					if unixSock {
						ep = listen(t, true)
						req.Listener = ep.file
					} else {
						req.Listener = ep.file
					}
					r := resume(t, p, req)
					if !unixSock {
						ep.file = r.Listener
					}
					f, fb = req.Fence, r.Fiber
					if got := counterOf(t, ep); got != round+1 {
						t.Fatalf("round %d: count %d after resume, want %d (counting on)", round, got, round+1)
					}
					checkResumedIsolation(t, fb.PID, before)
					b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/tmp/session-state", fb.PID))
					if err != nil || string(b) != "kept" {
						t.Fatalf("round %d: the fiber's /tmp lost what it held: %q, %v", round, b, err)
					}
					if err := RemoveImage(dir); err != nil {
						t.Fatal(err)
					}
				}
				if err := p.Kill(ctxT(t), f); err != nil {
					t.Fatal(err)
				}
				if e := nextExit(t, p); e.Fence != f || !e.Reason.Killed {
					t.Fatalf("Exit after Kill = %+v, want %s killed", e, f)
				}
				waitGone(t, fb.PID)
				if err := p.Stop(ctxT(t), uid); err != nil {
					t.Fatal(err)
				}
				noStrays(t, uid)
			})
		}
	}
}

// checkResumedIsolation checks that the fiber at pid is isolated as a
// fiber of an isolated grant is: namespaces of its own but the network's,
// pid 1 in its PID namespace, no capability, no_new_privs, a uid of the
// pool (the same as want's, when want is not 0), and every mount of its
// namespace read-only but those at the scratch directories and /proc,
// where the one on top (its own) is writable. It returns the uid.
func checkResumedIsolation(t *testing.T, pid, want int) int {
	t.Helper()
	self := os.Getpid()
	for _, ns := range []string{"user", "pid", "mnt", "ipc", "uts"} {
		if nsOf(t, pid, ns) == nsOf(t, self, ns) {
			t.Errorf("fiber %d shares fiberd's %s namespace", pid, ns)
		}
	}
	st := procStatus(t, pid)
	if nspid := strings.Fields(st["NSpid"]); len(nspid) < 2 || nspid[len(nspid)-1] != "1" {
		t.Errorf("fiber %d: NSpid %q, want pid 1 of its own PID namespace", pid, st["NSpid"])
	}
	if st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Errorf("fiber %d: CapEff %s CapPrm %s NoNewPrivs %s, want none and 1", pid, st["CapEff"], st["CapPrm"], st["NoNewPrivs"])
	}
	u := firstID(t, pid, "Uid")
	if uint32(u) < DefaultIDFirst || uint32(u) >= DefaultIDFirst+DefaultIDCount || (want != 0 && u != want) {
		t.Errorf("fiber %d runs as uid %d, want %d of the pool", pid, u, want)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	top := map[string]int{} // mount point -> the last line there (the one on top)
	for i, line := range lines {
		top[strings.Fields(line)[4]] = i
	}
	for i, line := range lines {
		f := strings.Fields(line)
		point, opts := f[4], strings.Split(f[5], ",")
		writable := opts[0] == "rw"
		own := point == "/proc" || contains(scratchDirs, point)
		switch {
		case writable && !own:
			t.Errorf("fiber %d: %s is writable (%s), want read-only", pid, point, f[5])
		case own && top[point] == i && !writable:
			t.Errorf("fiber %d: its own %s is read-only", pid, point)
		}
	}
	return u
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writeAs writes data to path with uid as the file system user and group
// (root is not mapped in an isolated fiber's tmpfs: EOVERFLOW), from a
// thread of its own.
func writeAs(t *testing.T, uid int, path, data string) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with its odd credentials
		_ = unix.Setfsgid(uid)
		_ = unix.Setfsuid(uid)
		errc <- os.WriteFile(path, []byte(data), 0o600)
	}()
	if err := <-errc; err != nil {
		t.Fatalf("write %s as %d: %v", path, uid, err)
	}
}

// parkAndResume parks victim v of p (into a directory under dir) and
// resumes it under the next fence, with a new listener when it served on a
// unix socket; the victim it returns is the resumed fiber, its secret kept.
func parkAndResume(t *testing.T, p *Proc, v victim, dir string) victim {
	t.Helper()
	img := filepath.Join(dir, fmt.Sprintf("%s-%d", v.f.Fence.GrantUID, v.f.Fence.Seq))
	park(t, p, v.f.Fence, img)
	req := ResumeRequest{Fence: v.f.Fence, Image: img, Listener: v.ep.file}
	req.Fence.Seq += 100
	if v.ep.network == "unix" {
		v.ep = listen(t, true)
		req.Listener = v.ep.file
	}
	r := resume(t, p, req)
	if v.ep.network != "unix" {
		v.ep.file = r.Listener
	}
	v.f = r.Fiber
	body, err := get(v.ep, "/whoami")
	if err != nil || fields(body)["secret"] != v.secret {
		t.Fatalf("resumed fiber %s: /whoami = %q, %v; want its secret", v.f.Fence, body, err)
	}
	return v
}

// TestIsolationAttackResumed is TestIsolationAttack with fibers that were
// parked and resumed: a resumed attacker against a resumed session of its
// own grant, another grant's fiber, both zygotes, fiberd and the host's
// world-writable places, then a fresh attacker against a resumed fiber.
// Every attempt must fail, and the victims serve on, unplanted.
func TestIsolationAttackResumed(t *testing.T) {
	state, socks := fiberdState(t)
	shared := sharedDirs(t)
	p := isoCkpt(t)
	tag := strconv.Itoa(os.Getpid())
	tree, _ := cgroupRoot(t)
	uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
	runA, runB := filepath.Join(state, "grants", uidA), filepath.Join(state, "grants", uidB)
	var cgB string
	for _, g := range []struct{ uid, run string }{{uidA, runA}, {uidB, runB}} {
		cg, err := tree.Grant(g.uid)
		if err != nil {
			t.Fatal(err)
		}
		cgB = cg.Dir.Path()
		warmIn(t, p, g.uid, attackerCSpec(t, tag), cgB, g.run)
	}
	images := t.TempDir()
	a1 := cloneVictim(t, p, uidA, 1)
	b1 := cloneVictim(t, p, uidB, 1)
	att := cloneVictim(t, p, uidA, 2)
	a1 = parkAndResume(t, p, a1, images)
	att = parkAndResume(t, p, att, images)
	fresh := cloneVictim(t, p, uidA, 3)
	dirs := []string{state, filepath.Join(state, "private"), runA, runB, cgB, tree.Root()}
	for _, round := range []struct {
		name     string
		attacker victim
		victims  []victim
	}{
		{"resumed attacker", att, []victim{a1, b1}},
		{"fresh attacker against a resumed fiber", fresh, []victim{a1, b1}},
	} {
		pids := []int{os.Getpid(), zygotePID(t, uidA), zygotePID(t, uidB)}
		var secrets []string
		for _, v := range round.victims {
			pids = append(pids, v.f.PID)
			secrets = append(secrets, v.secret)
		}
		var ps []string
		for _, pid := range pids {
			ps = append(ps, strconv.Itoa(pid))
		}
		lines := attackWith(t, round.attacker, [][2]any{{"pids", ps}, {"secrets", secrets}, {"socks", socks}, {"dirs", dirs}, {"shared", shared}})
		for _, d := range shared {
			if p := filepath.Join(d, "fiberd-attack-"+tag+"-shared"); exists(p) {
				t.Errorf("%s: an isolated fiber wrote %s on the host", round.name, p)
			}
		}
		if len(lines) < 6*len(pids) {
			t.Fatalf("%s: the attacker tried too little (%d lines):\n%s", round.name, len(lines), strings.Join(lines, "\n"))
		}
		if o := open(lines); len(o) > 0 {
			t.Errorf("%s: attacks that reached their target:\n%s\n(all attempts:\n%s)", round.name, strings.Join(o, "\n"), strings.Join(lines, "\n"))
		}
		for _, v := range round.victims {
			if body, err := get(v.ep, "/planted"); err != nil || fields(body)["planted"] != "no" {
				t.Errorf("%s: victim %s after the attack: %q, %v; want planted=no", round.name, v.f.Fence, body, err)
			}
		}
	}
}
