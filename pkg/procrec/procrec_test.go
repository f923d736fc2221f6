package procrec

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"fiberd.io/fiberd/pkg/cgroup"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func linuxOnly(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("records are swept on Linux only")
	}
}

// started is a process the test started, in a session of its own.
type started struct {
	cmd   *exec.Cmd
	pid   int
	start uint64
	stdin interface{ Close() error }
}

// startSession starts sh -c script as the leader of a new session.
func startSession(t *testing.T, script string) *started {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start /bin/sh: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return &started{cmd: cmd, pid: cmd.Process.Pid, start: st.Start, stdin: in}
}

// members lists the live processes of session sid, waiting until there are
// at least want of them.
func members(t *testing.T, sid, want int) []int {
	t.Helper()
	for i := 0; ; i++ {
		var out []int
		for pid, st := range scanProc() {
			if st.Session == sid && !st.Zombie {
				out = append(out, pid)
			}
		}
		if len(out) >= want || i == 500 {
			return out
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// running reports whether pid runs as the process that started at start.
func running(pid int, start uint64) bool {
	st, err := ReadStat(pid)
	return err == nil && st.Start == start && !st.Zombie
}

// sweep sweeps d with no cgroup root: tests of cgroup records call
// sweepUnder.
func sweep(t *testing.T, d *Dir) Swept {
	t.Helper()
	return sweepUnder(t, d, "")
}

func sweepUnder(t *testing.T, d *Dir, cgroupRoot string) Swept {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sw, err := d.Sweep(ctx, cgroupRoot)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return sw
}

// TestSweepEndsRecordedSessions: a recorded process is killed with every
// member of its session, also when the recorded process itself is gone
// (its children live on in the session); a process outside the session,
// and one whose pid a record names with another start time, are left
// alone. The records are removed.
func TestSweepEndsRecordedSessions(t *testing.T) {
	linuxOnly(t)
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	alive := startSession(t, "sleep 60 & sleep 60 & read x")
	dead := startSession(t, "sleep 60 & sleep 60 & read x")
	other := startSession(t, "read x")
	for _, s := range []*started{alive, dead} {
		if _, err := d.AddProcess(s.pid, s.start); err != nil {
			t.Fatal(err)
		}
	}
	// A record of the same pid as other, but of an earlier process.
	if _, err := d.AddProcess(other.pid, other.start-1); err != nil {
		t.Fatal(err)
	}
	aliveMembers := members(t, alive.pid, 3)
	deadMembers := members(t, dead.pid, 3)
	// The leader of "dead" ends; its sleeping children stay in its session.
	dead.stdin.Close()
	_ = dead.cmd.Wait() // read fails at EOF: sh exits 1
	if got := members(t, dead.pid, 2); len(got) != 2 {
		t.Fatalf("session of the dead leader has %v, want its two sleeps", got)
	}

	sw := sweep(t, d)
	if sw.Records != 3 || sw.Processes != 5 {
		t.Errorf("Sweep = %+v, want 3 records and 5 processes killed (sh and two sleeps, two orphaned sleeps)", sw)
	}
	for _, pid := range append(aliveMembers, deadMembers...) {
		if st, err := ReadStat(pid); err == nil && !st.Zombie {
			t.Errorf("process %d of a recorded session still runs", pid)
		}
	}
	if !running(other.pid, other.start) {
		t.Error("a process whose pid a record names with another start time was killed")
	}
	if left, _ := os.ReadDir(d.Path()); len(left) != 0 {
		t.Errorf("records left after the sweep: %v", left)
	}
}

// TestSweepForgetsWhatIsGone: records of ended processes, malformed names
// and leftover temporary files are removed without killing anything; a nil
// Dir records and sweeps nothing.
func TestSweepForgetsWhatIsGone(t *testing.T) {
	linuxOnly(t)
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	s := startSession(t, "exit 0")
	_ = s.cmd.Wait()
	rec, err := d.AddProcess(s.pid, s.start)
	if err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"p-x-1", "p-12", ".c-g.tmp-123", "c-empty"} {
		if err := os.WriteFile(filepath.Join(d.Path(), junk), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if sw := sweep(t, d); sw.Processes != 0 || sw.Cgroups != 0 {
		t.Errorf("Sweep = %+v, want nothing killed", sw)
	}
	if left, _ := os.ReadDir(d.Path()); len(left) != 0 {
		t.Errorf("records left: %v", left)
	}
	if err := rec.Remove(); err != nil {
		t.Errorf("removing a record already swept: %v", err)
	}

	var none *Dir
	if r, err := none.AddProcess(1, 1); err != nil || r != (Record{}) {
		t.Errorf("nil Dir AddProcess = %+v, %v", r, err)
	}
	if sw, err := none.Sweep(context.Background(), "/"); err != nil || sw.Records != 0 || sw.Left != nil {
		t.Errorf("nil Dir Sweep = %+v, %v", sw, err)
	}
}

// TestRecordRemove: a removed record is not swept.
func TestRecordRemove(t *testing.T) {
	linuxOnly(t)
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	s := startSession(t, "read x")
	rec, err := d.AddProcess(s.pid, s.start)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Remove(); err != nil {
		t.Fatal(err)
	}
	sweep(t, d)
	if !running(s.pid, s.start) {
		t.Fatal("a process whose record was removed was killed")
	}
}

// TestSweepRestoreRecord: a restore record ends the session leader at its
// pid that started at or after its tick, with the members of its session,
// but never a process at that pid that started before (another process
// than the one restored) nor one that does not lead its own session.
func TestSweepRestoreRecord(t *testing.T) {
	linuxOnly(t)
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	restored := startSession(t, "sleep 60 & read x")
	earlier := startSession(t, "read x")
	notLeader := exec.Command("/bin/sleep", "60") // in the test's session
	if err := notLeader.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() { _ = notLeader.Process.Kill(); _ = notLeader.Wait() })
	nlStat, err := ReadStat(notLeader.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	members := members(t, restored.pid, 2)
	for _, r := range []struct {
		pid   int
		after uint64
	}{
		{restored.pid, restored.start},        // started at the tick: ended
		{earlier.pid, earlier.start + 1},      // started before: left alone
		{notLeader.Process.Pid, nlStat.Start}, // leads no session: left alone
	} {
		if _, err := d.AddRestoring(r.pid, r.after); err != nil {
			t.Fatal(err)
		}
	}
	sw := sweep(t, d)
	for _, pid := range members {
		if alive := func() bool { st, err := ReadStat(pid); return err == nil && !st.Zombie }(); alive {
			t.Errorf("process %d of the restored session still runs after the sweep", pid)
		}
	}
	if !running(earlier.pid, earlier.start) {
		t.Error("the sweep killed a process that started before the restore record's tick")
	}
	if !running(notLeader.Process.Pid, nlStat.Start) {
		t.Error("the sweep killed a process that leads no session of its own")
	}
	if sw.Records != 3 || sw.Processes != len(members) {
		t.Errorf("Sweep = %+v, want 3 records and %d processes", sw, len(members))
	}
	if ents, _ := os.ReadDir(d.Path()); len(ents) != 0 {
		t.Errorf("records left after the sweep: %v", ents)
	}
}

// TestSweepCgroup: a recorded cgroup is killed whole and removed. It needs
// a writable cgroup v2 hierarchy.
func TestSweepCgroup(t *testing.T) {
	linuxOnly(t)
	mount, err := cgroup.Mount()
	if err != nil {
		t.Skipf("no cgroup v2 here: %v", err)
	}
	dir := filepath.Join(mount, fmt.Sprintf("fiberd-procrec-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cgroup v2 is not writable here: %v", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	})
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a cgroup: %v", err)
	}
	defer cmd.Wait()
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddCgroup("g1", dir); err != nil {
		t.Fatal(err)
	}
	if sw := sweepUnder(t, d, mount); sw.Cgroups != 1 {
		t.Errorf("Sweep = %+v, want one cgroup", sw)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("recorded cgroup %s still exists: %v", dir, err)
	}
	if _, err := d.AddCgroup("../x", dir); err == nil {
		t.Error("AddCgroup accepted a name with a slash")
	}
}

func TestParseStat(t *testing.T) {
	line := "1234 (a b) c (d)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 100 18446744073709551615"
	st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.PPid != 1 || st.Session != 1234 || st.Start != 98765 || st.Zombie {
		t.Fatalf("ParseStat = %+v", st)
	}
	if _, err := ParseStat([]byte("1234 (x) S 1 2")); err == nil {
		t.Fatal("a short stat parsed")
	}
	z := strings.Replace(line, ") S ", ") Z ", 1)
	if st, _ := ParseStat([]byte(z)); !st.Zombie {
		t.Fatal("state Z not seen as a zombie")
	}
	self, err := ReadStat(os.Getpid())
	if err != nil || self.PPid != os.Getppid() {
		t.Fatalf("ReadStat(self) = %+v, %v; ppid %d", self, err, os.Getppid())
	}
}

// TestSweepOutrunsAForkingSession: a recorded process that keeps forking
// while the sweep runs leaves nothing behind: the sweep scans again after
// each round of kills.
func TestSweepOutrunsAForkingSession(t *testing.T) {
	linuxOnly(t)
	d, err := Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	s := startSession(t, "while :; do sleep 60 & sleep 0.002; done")
	members(t, s.pid, 5)
	if _, err := d.AddProcess(s.pid, s.start); err != nil {
		t.Fatal(err)
	}
	sweep(t, d)
	if left := members(t, s.pid, 0); len(left) != 0 {
		t.Fatalf("session of a forking process still has %v after the sweep", left)
	}
}

// TestSweepLeavesCgroupsOutsideTheRoot: a cgroup record is acted on only
// when the directory it names lies strictly under the cgroup root Sweep is
// given. Records naming a directory beside the root, one sharing its
// name's prefix, one reached with "..", one reached through a symbolic
// link under the root that leads out of it, or the root itself, are left
// alone, listed in Left and kept; so is every record when there is no
// root. A record naming a directory that is gone is removed. The
// "cgroups" are plain empty directories, which Destroy treats as empty
// cgroups (nothing to kill, then rmdir): a directory that is still there
// was not swept.
func TestSweepLeavesCgroupsOutsideTheRoot(t *testing.T) {
	linuxOnly(t)
	base := t.TempDir()
	root := filepath.Join(base, "root")
	mkdirs := func(dirs ...string) {
		t.Helper()
		for _, dir := range dirs {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	inside := filepath.Join(root, "g-in")
	beside := filepath.Join(base, "other", "g-beside")
	prefixed := filepath.Join(base, "root-evil", "g-prefixed")
	dotdot := filepath.Join(base, "other", "g-dotdot")
	linked := filepath.Join(base, "other", "g-linked")
	mkdirs(inside, beside, prefixed, dotdot, linked)
	if err := os.Symlink(linked, filepath.Join(root, "g-link")); err != nil {
		t.Fatal(err)
	}
	d, err := Open(filepath.Join(base, "procs"))
	if err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{
		"g-in":       inside,
		"g-beside":   beside,
		"g-prefixed": prefixed,
		"g-dotdot":   root + "/../other/g-dotdot",
		"g-link":     filepath.Join(root, "g-link"),
		"g-root":     root,
		"g-gone":     filepath.Join(root, "g-gone"),
	} {
		if _, err := d.AddCgroup(name, dir); err != nil {
			t.Fatal(err)
		}
	}
	left := func(sw Swept) []string {
		var names []string
		for _, l := range sw.Left {
			names = append(names, strings.TrimPrefix(filepath.Base(l.Record), "c-"))
		}
		sort.Strings(names)
		return names
	}
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }

	// No root: nothing is swept, every record of what exists is kept.
	sw := sweepUnder(t, d, "")
	if sw.Cgroups != 0 || !exists(inside) {
		t.Errorf("Sweep without a cgroup root = %+v, removed %s: want nothing swept", sw, inside)
	}
	if got, want := left(sw), []string{"g-beside", "g-dotdot", "g-in", "g-link", "g-prefixed", "g-root"}; !slices.Equal(got, want) {
		t.Errorf("Sweep without a cgroup root left %v, want %v", got, want)
	}

	sw = sweepUnder(t, d, root)
	if sw.Cgroups != 1 || exists(inside) {
		t.Errorf("Sweep = %+v, %s exists: %v; want the one cgroup under the root swept", sw, inside, exists(inside))
	}
	if got, want := left(sw), []string{"g-beside", "g-dotdot", "g-link", "g-prefixed", "g-root"}; !slices.Equal(got, want) {
		t.Errorf("Sweep left %v, want %v", got, want)
	}
	for _, dir := range []string{beside, prefixed, dotdot, linked, root} {
		if !exists(dir) {
			t.Errorf("%s, outside the cgroup root %s, was swept", dir, root)
		}
	}
	for _, l := range sw.Left {
		if _, err := os.Stat(l.Record); err != nil {
			t.Errorf("record %s of %s, left alone, was not kept: %v", l.Record, l.Cgroup, err)
		}
	}
	for _, gone := range []string{"c-g-in", "c-g-gone"} {
		if _, err := os.Stat(filepath.Join(d.Path(), gone)); !os.IsNotExist(err) {
			t.Errorf("record %s of a cgroup swept or gone was kept (stat: %v)", gone, err)
		}
	}
}

// TestUnder: what lies strictly under a cgroup root, element by element,
// as written and resolved.
func TestUnder(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	for _, dir := range []string{filepath.Join(root, "a", "b"), filepath.Join(base, "out")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(base, "out"), filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(base, "rootlink")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		root, dir string
		want      bool
	}{
		{root, filepath.Join(root, "a"), true},
		{root, filepath.Join(root, "a", "b"), true},
		{root + "/", filepath.Join(root, "a"), true},
		{root, root, false},
		{root, base, false},
		{root, filepath.Join(base, "out"), false},
		{root, root + "/a/../../out", false},
		{root, root + "/./a", false},
		{root, filepath.Join(root, "escape"), false},
		{root, filepath.Join(base, "rootlink", "a"), false}, // into the root from elsewhere
		{filepath.Join(base, "rootlink"), filepath.Join(base, "rootlink", "a"), true},
		{root, filepath.Join(root, "missing"), false},
		{"", filepath.Join(root, "a"), false},
		{"relative", filepath.Join(root, "a"), false},
		{"/", filepath.Join(root, "a"), true},
	} {
		if _, got := under(tc.root, tc.dir); got != tc.want {
			t.Errorf("under(%q, %q) = %v, want %v", tc.root, tc.dir, got, tc.want)
		}
	}
}
