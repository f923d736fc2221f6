package fiberd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	clocktesting "k8s.io/utils/clock/testing"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/procrec"
)

// nobody is the uid the tests give what fiberd must not trust.
const nobody = 65534

// stickyAll is /tmp's mode: anyone may create, nobody remove another's.
const stickyAll = os.ModeSticky | 0o777

// needRoot skips a test that must chown files to another user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test chowns directories to another user (uid 65534) to see fiberd refuse them")
	}
}

// privateTemp is a new directory under the system's temporary directory
// (short: unix socket paths are limited to 108 bytes), removed at the end.
func privateTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fd")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestCheckPlace: the rules New judges its directories by, for fiberd as
// root and as another uid.
func TestCheckPlace(t *testing.T) {
	needRoot(t)
	const other = 4242 // fiberd's euid in the cases that say so
	tests := []struct {
		name    string
		euid    int
		make    func(t *testing.T, base string) string // returns the directory judged
		missing bool                                   // missingOK
		want    string                                 // "" to pass, else what the error says
	}{
		{name: "private directory", make: dirMode(0o700), want: ""},
		{name: "world-readable directory", make: dirMode(0o755), want: ""},
		{name: "group-writable directory", make: dirMode(0o770), want: "has mode 0770, writable by group or others: chmod go-w"},
		{name: "other-writable directory", make: dirMode(0o707), want: "has mode 0707, writable by group or others"},
		{name: "sticky world-writable directory", make: dirMode(stickyAll), want: "has mode 1777, writable by group or others"},
		{name: "directory of another uid", make: owned(dirMode(0o700), nobody), want: "(-state) is owned by uid 65534, not by fiberd's uid 0"},
		{name: "directory of fiberd's uid", euid: other, make: owned(dirMode(0o700), other), want: ""},
		{name: "root's directory for another euid", euid: other, make: dirMode(0o700), want: "(-state) is owned by uid 0, not by fiberd's uid 4242"},
		{name: "parent of another uid", make: under(ownedDir(0o755, nobody)), want: "its parent %[1]s/p is owned by uid 65534, neither root nor fiberd's uid 0"},
		{name: "parent of fiberd's uid", euid: other, make: owned(under(ownedDir(0o755, other)), other), want: ""},
		{name: "group-writable parent", make: under(ownedDir(0o775, 0)), want: "its parent %[1]s/p has mode 0775, writable by group or others without the sticky bit"},
		{name: "world-writable parent", make: under(ownedDir(0o777, 0)), want: "its parent %[1]s/p has mode 0777"},
		{name: "sticky world-writable parent of root", make: under(ownedDir(stickyAll, 0)), want: ""},
		// A grant Pod's volume under its fsGroup (root's, fiberd's group,
		// setgid, 0777: an emptyDir), for a fiberd that is not root; not
		// for root's fiberd, nor without the setgid bit the kubelet sets.
		{name: "pod volume parent", euid: other, make: owned(under(ownedDir(os.ModeSetgid|0o777, 0)), other), want: ""},
		{name: "pod volume parent, fiberd root", make: under(ownedDir(os.ModeSetgid|0o777, 0)), want: "its parent %[1]s/p has mode 2777"},
		{name: "pod volume parent without setgid", euid: other, make: owned(under(ownedDir(0o777, 0)), other), want: "its parent %[1]s/p has mode 0777"},
		{name: "pod volume itself as the state directory", euid: other, make: ownedDir(os.ModeSetgid|0o777, 0), want: "is owned by uid 0, not by fiberd's uid 4242"},
		{name: "sticky world-writable parent of another uid", make: under(ownedDir(stickyAll, nobody)), want: "its parent %[1]s/p is owned by uid 65534"},
		{name: "missing below a good parent", missing: true, make: missing(ownedDir(0o755, 0)), want: ""},
		{name: "missing below a sticky parent", missing: true, make: missing(ownedDir(stickyAll, 0)), want: ""},
		{name: "missing below a parent of another uid", missing: true, make: missing(ownedDir(0o755, nobody)), want: "its parent %[1]s/p is owned by uid 65534"},
		{name: "missing below a writable parent", missing: true, make: missing(ownedDir(0o777, 0)), want: "its parent %[1]s/p has mode 0777"},
		{name: "missing, not allowed", make: missing(ownedDir(0o755, 0)), want: "no such file or directory"},
		{name: "a file", make: func(t *testing.T, base string) string {
			f := filepath.Join(base, "f")
			must(t, os.WriteFile(f, nil, 0o600))
			return f
		}, want: "is not a directory"},
		{name: "link of root to a good directory", make: link(0, dirMode(0o700)), want: ""},
		{name: "link of another uid", make: link(nobody, dirMode(0o700)), want: "(-state) is a symbolic link owned by uid 65534"},
		{name: "link of root to a directory of another uid", make: link(0, owned(dirMode(0o700), nobody)), want: "%[1]s/d is owned by uid 65534"},
		{name: "link of root to a directory below a writable parent", make: link(0, under(ownedDir(0o777, 0))), want: "its parent %[1]s/p has mode 0777"},
		{name: "parent a link of another uid", make: func(t *testing.T, base string) string {
			d := dirMode(0o755)(t, base)
			must(t, os.Symlink(d, filepath.Join(base, "plink")))
			must(t, os.Lchown(filepath.Join(base, "plink"), nobody, nobody))
			must(t, os.Mkdir(filepath.Join(d, "s"), 0o700))
			return filepath.Join(base, "plink", "s")
		}, want: "%[1]s/plink is a symbolic link owned by uid 65534"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := privateTemp(t)
			dir := tc.make(t, base)
			err := checkPlace(place{dir, "state directory", "-state"}, tc.euid, tc.missing)
			want := tc.want
			if strings.Contains(want, "%[1]s") {
				want = fmt.Sprintf(want, base)
			}
			switch {
			case want == "" && err != nil:
				t.Fatalf("checkPlace(%s) = %v, want it to pass", dir, err)
			case want != "" && err == nil:
				t.Fatalf("checkPlace(%s) passed, want an error saying %q", dir, want)
			case want != "" && (!strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "state directory "+dir+" (-state)")):
				t.Fatalf("checkPlace(%s) = %v, want an error naming it and saying %q", dir, err, want)
			}
		})
	}
}

// dirMode makes base/d with mode (chmod: the umask does not apply).
func dirMode(mode os.FileMode) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		d := filepath.Join(base, "d")
		must(t, os.Mkdir(d, 0o700))
		must(t, os.Chmod(d, mode))
		return d
	}
}

// ownedDir makes base/p with mode, owned by uid.
func ownedDir(mode os.FileMode, uid int) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		d := filepath.Join(base, "p")
		must(t, os.Mkdir(d, 0o700))
		must(t, os.Chmod(d, mode))
		must(t, os.Chown(d, uid, uid))
		return d
	}
}

// owned chowns what mk made to uid.
func owned(mk func(*testing.T, string) string, uid int) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		d := mk(t, base)
		must(t, os.Chown(d, uid, uid))
		return d
	}
}

// under makes a private directory of root's below what parent made.
func under(parent func(*testing.T, string) string) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		d := filepath.Join(parent(t, base), "s")
		must(t, os.Mkdir(d, 0o700))
		return d
	}
}

// missing names a directory that does not exist below what parent made.
func missing(parent func(*testing.T, string) string) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		return filepath.Join(parent(t, base), "new", "state")
	}
}

// link makes base/link, owned by uid, to what target made.
func link(uid int, target func(*testing.T, string) string) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		l := filepath.Join(base, "link")
		must(t, os.Symlink(target(t, base), l))
		must(t, os.Lchown(l, uid, uid))
		return l
	}
}

// bareConfig is a Config on fakes for an agent on state, its templates
// elsewhere, listening on the unix socket only.
func bareConfig(t *testing.T, state string) Config {
	t.Helper()
	clk := clocktesting.NewFakeClock(testStart)
	return Config{
		Home: newTestHome(clk), Issuer: testIssuer, NodeID: testNode, Keys: &switchKeys{},
		Templates: t.TempDir(), Warm: fake.New(core.TierWarm, fake.Hooks{}), Basic: fake.New(core.TierBasic, fake.Hooks{}),
		StateDir: state, Clock: clk, Logger: testr.NewWithInterface(t, testr.Options{Verbosity: 1}),
	}
}

// sleeper is a sleep the test started in a session of its own, and a
// record of it in state, as a crashed agent on state would have left.
type sleeper struct {
	cmd   *exec.Cmd
	start uint64
}

func plantSleeper(t *testing.T, state string) *sleeper {
	t.Helper()
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start /bin/sleep: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	st, err := procrec.ReadStat(cmd.Process.Pid)
	must(t, err)
	recs, err := procrec.Open(filepath.Join(state, "private", "procs"))
	must(t, err)
	_, err = recs.AddProcess(cmd.Process.Pid, st.Start)
	must(t, err)
	return &sleeper{cmd: cmd, start: st.Start}
}

// alive reports whether the sleep still runs (not killed by a sweep).
func (s *sleeper) alive() bool {
	st, err := procrec.ReadStat(s.cmd.Process.Pid)
	return err == nil && st.Start == s.start && !st.Zombie
}

// TestNewRefusesAStateDirOfAnotherUser: a state directory another user
// owns, or one below a directory another user owns, makes New fail naming
// it, before anything in it is swept (the process its record names still
// runs) or bound there (no socket).
func TestNewRefusesAStateDirOfAnotherUser(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name  string
		chown func(base string) string // returns the state directory
		want  string
	}{
		{"owned by another uid", func(base string) string {
			must(t, os.Chown(base, nobody, nobody))
			return base
		}, "(-state) is owned by uid 65534, not by fiberd's uid 0"},
		{"below a directory of another uid", func(base string) string {
			state := filepath.Join(base, "s")
			must(t, os.Mkdir(state, 0o700))
			must(t, os.Chown(base, nobody, nobody))
			return state
		}, "its parent %s is owned by uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := privateTemp(t)
			state := tc.chown(base)
			s := plantSleeper(t, state)
			cfg := bareConfig(t, state)
			a, err := New(context.Background(), cfg)
			if !s.alive() {
				t.Error("New swept a process recorded in a state directory of another user")
			}
			for _, sock := range []string{"fiberd.sock", "private/admin.sock"} {
				if _, err := os.Lstat(filepath.Join(state, sock)); !os.IsNotExist(err) {
					t.Errorf("%s bound in a state directory of another user (stat: %v)", sock, err)
				}
			}
			if err == nil {
				a.Close()
				t.Fatalf("New adopted state directory %s owned by uid %d", state, nobody)
			}
			t.Logf("New: %v", err)
			want := tc.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, base)
			}
			if !strings.Contains(err.Error(), state) || !strings.Contains(err.Error(), want) {
				t.Errorf("New: %v, want an error naming %s and saying %q", err, state, want)
			}
			if n := cfg.Home.(*homefake.Home).Closes(); n != 1 {
				t.Errorf("home closed %d times by a failed New, want 1", n)
			}
		})
	}
}

// TestNewRefusesAWritableStateDir: a state directory its group or others
// may write in is refused, naming it, with nothing swept; one below a
// sticky world-writable directory of root's (as /tmp), made by New or
// there before, is fiberd's.
func TestNewRefusesAWritableStateDir(t *testing.T) {
	for _, mode := range []os.FileMode{0o770, 0o707, 0o777} {
		t.Run(fmt.Sprintf("%04o", mode), func(t *testing.T) {
			state := privateTemp(t)
			s := plantSleeper(t, state)
			must(t, os.Chmod(state, mode))
			a, err := New(context.Background(), bareConfig(t, state))
			if !s.alive() {
				t.Error("New swept a process recorded in a writable state directory")
			}
			if err == nil {
				a.Close()
				t.Fatalf("New adopted state directory %s of mode %04o", state, mode)
			}
			if want := "writable by group or others"; !strings.Contains(err.Error(), state) || !strings.Contains(err.Error(), want) {
				t.Errorf("New: %v, want an error naming %s and saying %q", err, state, want)
			}
		})
	}
	for _, pre := range []bool{false, true} {
		t.Run(fmt.Sprintf("below a sticky directory, there before: %v", pre), func(t *testing.T) {
			sticky := privateTemp(t)
			must(t, os.Chmod(sticky, stickyAll))
			state := filepath.Join(sticky, "s")
			if pre {
				must(t, os.Mkdir(state, 0o700))
			}
			a, err := New(context.Background(), bareConfig(t, state))
			if err != nil {
				t.Fatalf("New below a sticky world-writable directory of root's: %v", err)
			}
			a.Close()
			fi, err := os.Stat(state)
			must(t, err)
			if fi.Mode().Perm() != 0o700 {
				t.Errorf("state directory %s has mode %v, want 0700", state, fi.Mode().Perm())
			}
		})
	}
}

// TestSecondAgentOnTheSameStateDir: while an agent runs, a second New on
// its state directory fails with ErrStateInUse naming the first's pid,
// sweeps nothing (a process recorded there still runs) and takes nothing
// (the first's socket still answers, its fiber still runs); once the first
// has stopped, New on the directory succeeds.
func TestSecondAgentOnTheSameStateDir(t *testing.T) {
	e := newEnv(t)
	uid := e.deliver(e.mint("g1"))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	s := plantSleeper(t, e.stateDir)

	cfg := bareConfig(t, e.stateDir)
	cfg.Templates = e.cfg.Templates
	a, err := New(context.Background(), cfg)
	if !s.alive() {
		t.Error("the second New swept a process recorded in the first agent's state directory")
	}
	if err == nil {
		t.Error("a second New on the state directory of a running agent succeeded")
		// Its sockets replaced the first's; closed, they leave no file
		// behind, and the status below cannot reach the first agent.
		a.Close()
	} else {
		t.Logf("second New: %v", err)
		want := fmt.Sprintf("fiberd: state directory %s is in use by process %d (", e.stateDir, os.Getpid())
		if !errors.Is(err, ErrStateInUse) || !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), "); stop it or choose another -state") {
			t.Errorf("second New: %v, want ErrStateInUse saying %q...", err, want)
		}
	}
	// A new connection to the socket's path, not one kept alive from
	// before: the path must still lead to the first agent.
	fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", e.agent.SocketPath())
		}}}
	var st api.Status
	if resp, err := fresh.Get("http://fiberd/v1/status"); err != nil {
		t.Errorf("the first agent's socket after the second New: %v", err)
	} else {
		err := json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || len(st.Grants) != 1 || st.Grants[0].Running != 1 {
			t.Errorf("first agent's status after the second New: %+v (%v), want its grant with one fiber running", st.Grants, err)
		}
	}

	e.stop()
	cfg = bareConfig(t, e.stateDir)
	cfg.Templates = e.cfg.Templates
	a, err = New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New once the first agent stopped: %v", err)
	}
	a.Close()
	// Close let the lock go too.
	cfg = bareConfig(t, e.stateDir)
	cfg.Templates = e.cfg.Templates
	a, err = New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	a.Close()
}
