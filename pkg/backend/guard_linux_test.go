package backend

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/core"
)

// guardBackend is isoBackend with the endpoint guard, or without it
// (NoEndpointGuard) for a control. It skips (fails under
// FIBERD_ISOLATION_REQUIRED) where the guard cannot be had.
func guardBackend(t *testing.T, tier core.Tier, on bool, mods ...func(*Config)) Backend {
	t.Helper()
	b := isoBackend(t, tier, append(mods, func(c *Config) { c.NoEndpointGuard = !on })...)
	if s := b.Isolation(); s.EndpointsApart != on {
		if on {
			isolationMiss(t, "the endpoint guard is off on this host: %s", s.Missing)
		}
		t.Fatalf("Isolation() = %+v with NoEndpointGuard, want EndpointsApart false", s)
	}
	return b
}

// cloneTCP clones a fiber of uid on a TCP listener of its own.
func cloneTCP(t *testing.T, b Backend, uid string, seq uint64, payload string) (Fiber, endpoint) {
	t.Helper()
	ep := listen(t, false)
	f, err := b.Clone(ctxT(t), CloneRequest{Fence: fence(uid, seq), Listener: ep.file, Payload: []byte(payload)})
	if err != nil {
		t.Fatalf("Clone %s/%d: %v", uid, seq, err)
	}
	return f, ep
}

// tcpVerdicts has fiber att connect to each address and returns, for each,
// whether it got through ("OPEN") or the attacker's words for the failure.
func tcpVerdicts(t *testing.T, att endpoint, addrs ...string) map[string]string {
	t.Helper()
	start := time.Now()
	lines := attackWith(t, victim{ep: att}, [][2]any{{"tcp", addrs}})
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the connects took %v: a refused connection must end within the attacker's 3 s", d)
	}
	got := map[string]string{}
	for _, l := range lines {
		f := strings.SplitN(l, " ", 3)
		if len(f) == 3 && f[0] == "tcp" {
			got[f[1]] = f[2]
		}
	}
	for _, a := range addrs {
		if _, ok := got[a]; !ok {
			t.Fatalf("the attacker said nothing of %s:\n%s", a, strings.Join(lines, "\n"))
		}
	}
	return got
}

// TestEndpointsApart: with two isolated grants on one host, a fiber of
// grant A (testdata/attacker.c) cannot connect to the TCP endpoint of a
// fiber of grant B (the C counter), is refused at once, and still connects
// to a fiber of its own grant; B's fiber reaches A's the same way round
// (refused); the caller (this process) reaches every fiber. Without the
// guard (NoEndpointGuard) the same connection goes through: the test can
// fail. Proc and Exec; the parked-then-resumed case is
// TestEndpointsApartResumed.
func TestEndpointsApart(t *testing.T) {
	for _, k := range []struct {
		name string
		tier core.Tier
	}{{"proc", core.TierWarm}, {"exec", core.TierBasic}} {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/guard=%v", k.name, on), func(t *testing.T) {
				b := guardBackend(t, k.tier, on)
				tag := strconv.Itoa(os.Getpid())
				uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
				warm(t, b, uidA, attackerCSpec(t, tag), "")
				warm(t, b, uidB, attackerCSpec(t, tag), "")
				_, a1 := cloneTCP(t, b, uidA, 1, "a1")
				_, att := cloneTCP(t, b, uidA, 2, "att")
				_, b1 := cloneTCP(t, b, uidB, 1, "b1")
				_, batt := cloneTCP(t, b, uidB, 2, "batt")

				got := tcpVerdicts(t, att, a1.addr, b1.addr)
				if got[a1.addr] != "OPEN" {
					t.Errorf("a fiber of grant A could not reach another fiber of A (%s): %s", a1.addr, got[a1.addr])
				}
				back := tcpVerdicts(t, batt, a1.addr, b1.addr)
				if back[b1.addr] != "OPEN" {
					t.Errorf("a fiber of grant B could not reach another fiber of B (%s): %s", b1.addr, back[b1.addr])
				}
				if on {
					if got[b1.addr] == "OPEN" || back[a1.addr] == "OPEN" {
						t.Errorf("with the guard, a fiber reached another grant's endpoint: A->B %s, B->A %s", got[b1.addr], back[a1.addr])
					}
					if !strings.Contains(got[b1.addr], "refused") {
						t.Errorf("A->B: %q, want the connection refused (a reset, at once)", got[b1.addr])
					}
				} else if got[b1.addr] != "OPEN" || back[a1.addr] != "OPEN" {
					t.Errorf("without the guard, A->B %s, B->A %s: want both OPEN, or the test proves nothing", got[b1.addr], back[a1.addr])
				}
				// The caller reaches every fiber.
				for _, ep := range []endpoint{a1, att, b1, batt} {
					if _, err := get(ep, "/whoami"); err != nil {
						t.Errorf("the caller could not reach %s: %v", ep.addr, err)
					}
				}
			})
		}
	}
}

// TestEndpointsApartResumed: a fiber of grant B parked and resumed (CRIU
// binds its listener anew) is still out of grant A's reach, and the
// caller still reaches it.
func TestEndpointsApartResumed(t *testing.T) {
	p := isoCkpt(t)
	if s := p.Isolation(); !s.EndpointsApart {
		isolationMiss(t, "the endpoint guard is off on this host: %s", s.Missing)
	}
	tag := strconv.Itoa(os.Getpid())
	uidA, uidB := uidFor(t)+"a", uidFor(t)+"b"
	warm(t, p, uidA, attackerCSpec(t, tag), "")
	warm(t, p, uidB, kindC.spec(t), "")
	_, a1 := cloneTCP(t, p, uidA, 1, "a1")
	_, att := cloneTCP(t, p, uidA, 2, "att")
	f := fence(uidB, 1)
	_, b1 := cloneTCP(t, p, uidB, 1, "")
	counterOf(t, b1)
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f, dir)
	if e := nextExit(t, p); e.Fence != f || !e.Reason.Parked {
		t.Fatalf("Exit after park = %+v, want %s parked", e, f)
	}
	req := ResumeRequest{Fence: fence(uidB, 2), Image: dir, Listener: b1.file, Template: testTemplate}
	r, err := p.Resume(ctxT(t), req)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "restore.log"))
		t.Fatalf("Resume: %v\nrestore.log tail:\n%s", err, lastLines(log, 15))
	}
	t.Cleanup(func() { r.Listener.Close() })
	b1.file = r.Listener
	if got := counterOf(t, b1); got != 2 {
		t.Fatalf("count %d after resume, want 2", got)
	}
	got := tcpVerdicts(t, att, a1.addr, b1.addr)
	if got[a1.addr] != "OPEN" {
		t.Errorf("a fiber of grant A could not reach another fiber of A: %s", got[a1.addr])
	}
	if !strings.Contains(got[b1.addr], "refused") {
		t.Errorf("a fiber of grant A -> grant B's resumed fiber: %q, want refused", got[b1.addr])
	}
	if got := counterOf(t, b1); got != 3 {
		t.Errorf("the caller: count %d, want 3", got)
	}
	if err := RemoveImage(dir); err != nil {
		t.Fatal(err)
	}
}

// TestGuardTables: each backend has a table of its own, holding its warm
// isolated grants' elements; a Stop in one leaves the other's, and Close
// deletes the table; a table named by a dead process is swept at the next
// start.
func TestGuardTables(t *testing.T) {
	b1 := guardBackend(t, core.TierBasic, true).(*Exec)
	nft := b1.iso.guard.nft
	// A leftover of a process that is gone: pid 2^22+1 is above the
	// kernel's pid_max limit, so no process has it.
	stale := fmt.Sprintf("%s%d_%d_0", guardTablePrefix, b1.iso.guard.pidNS, 1<<22+1)
	if out, err := exec.Command(nft, "add", "table", "inet", stale).CombinedOutput(); err != nil {
		t.Fatalf("nft add table: %v: %s", err, out)
	}
	b2 := guardBackend(t, core.TierBasic, true).(*Exec)
	if hasTable(t, nft, stale) {
		t.Errorf("the leftover table %s of a dead process is still there after a start", stale)
	}
	t1, t2 := b1.iso.guard.table, b2.iso.guard.table
	if t1 == t2 || !hasTable(t, nft, t1) || !hasTable(t, nft, t2) {
		t.Fatalf("tables %q and %q: want two, both there", t1, t2)
	}
	uid := uidFor(t)
	spec := kindC.spec(t)
	warm(t, b1, uid, spec, "")
	warm(t, b2, uid, spec, "")
	id := b1.grants[uid].id
	mark := fmt.Sprintf("0x%08x", GuardMark(id))
	for _, tb := range []string{t1, t2} {
		if l := listTable(t, nft, tb); !strings.Contains(l, strconv.FormatUint(uint64(id), 10)+" : "+mark) {
			t.Errorf("table %s after Warm lacks %d : %s:\n%s", tb, id, mark, l)
		}
	}
	if err := b1.Stop(ctxT(t), uid); err != nil {
		t.Fatal(err)
	}
	if l := listTable(t, nft, t1); strings.Contains(l, mark) {
		t.Errorf("table %s after Stop still holds %s:\n%s", t1, mark, l)
	}
	if l := listTable(t, nft, t2); !strings.Contains(l, mark) {
		t.Errorf("the other backend's table %s lost %s when the first stopped the grant:\n%s", t2, mark, l)
	}
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	if hasTable(t, nft, t2) {
		t.Errorf("table %s is still there after Close", t2)
	}
}

func hasTable(t *testing.T, nft, name string) bool {
	t.Helper()
	out, err := exec.Command(nft, "list", "tables", "inet").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) == "table inet "+name {
			return true
		}
	}
	return false
}

func listTable(t *testing.T, nft, name string) string {
	t.Helper()
	out, err := exec.Command(nft, "list", "table", "inet", name).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table %s: %v: %s", name, err, out)
	}
	return string(out)
}

func TestStaleGuardTables(t *testing.T) {
	list := "table inet filter\ntable inet fiberd_7_10_0\ntable inet fiberd_7_11_2\ntable ip fiberd_7_12_0\n" +
		"table inet fiberd_7_x_0\ntable inet fiberd_7_13\ntable inet fiberd_7_14_0\ntable inet fiberd_8_15_0\n" +
		"table inet fiberd_16_0\n"
	got := staleGuardTables(list, 7, func(pid int) bool { return pid == 11 })
	want := []string{"fiberd_7_10_0", "fiberd_7_14_0"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("staleGuardTables = %v, want %v", got, want)
	}
}

func TestGuardMark(t *testing.T) {
	seen := map[uint32]uint32{}
	for id := DefaultIDFirst; id < DefaultIDFirst+DefaultIDCount; id += 2 {
		m := GuardMark(id)
		if m&GuardMarkMask != GuardMarkBase || m&0x8000 != 0 {
			t.Fatalf("GuardMark(%#x) = %#x: outside the range", id, m)
		}
		if o, dup := seen[m]; dup {
			t.Fatalf("GuardMark(%#x) = GuardMark(%#x) = %#x", id, o, m)
		}
		seen[m] = id
	}
}

// TestGuardWithoutNft: without nft the backend still starts and isolates,
// and says the endpoints are not kept apart and how to fix it; where every
// grant has a network of its own (GrantNetworks: a grant Pod) nothing is
// missing.
func TestGuardWithoutNft(t *testing.T) {
	saved := nftPath
	nftPath = func() (string, error) { return "", errors.New("the nft command is not installed") }
	t.Cleanup(func() { nftPath = saved })
	for _, tier := range []core.Tier{core.TierWarm, core.TierBasic} {
		s := isoBackend(t, tier).Isolation()
		if s.Level != IsolationFiber || s.EndpointsApart || !strings.Contains(s.Missing, "not kept apart") || !strings.Contains(s.Missing, "install nftables") {
			t.Errorf("%s without nft: %+v, want level fiber, EndpointsApart false, and Missing saying so and how to fix it", tier, s)
		}
		// A grant Pod: every grant's network is its own, no guard needed.
		s = isoBackend(t, tier, func(c *Config) { c.GrantNetworks = true }).Isolation()
		if s.Level != IsolationFiber || !s.EndpointsApart || s.Missing != "" {
			t.Errorf("%s without nft, GrantNetworks: %+v, want level fiber, EndpointsApart, nothing missing", tier, s)
		}
	}
}
