package backend

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/procrec"
)

// testTemplate is the template reference tests park under (warm's).
var testTemplate = "counter@sha256:" + strings.Repeat("0", 64)

// criuForTest returns the CRIU the tests run: $FIBERD_CRIU, else where
// hack/criu.sh installs it. It skips, naming what is missing, when there is
// none or fiberd's tests lack the privileges; with FIBERD_CRIU_REQUIRED=1
// (CI) it fails instead.
func criuForTest(tb testing.TB) string {
	tb.Helper()
	path := os.Getenv("FIBERD_CRIU")
	if path == "" {
		path = DefaultCRIUPath()
	}
	miss := func(format string, a ...any) {
		tb.Helper()
		msg := fmt.Sprintf(format, a...)
		if os.Getenv("FIBERD_CRIU_REQUIRED") != "" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	if err := isExecutable(path); err != nil {
		miss("criu not found at %q (%v): build it with hack/criu.sh (make criu), or set FIBERD_CRIU", path, err)
	}
	if os.Geteuid() != 0 {
		miss("parking needs root (CRIU dumps and restores processes)")
	}
	return path
}

// newCkpt returns a proc backend with the test CRIU, its probe done.
func newCkpt(tb testing.TB) *Proc {
	tb.Helper()
	cfg := testConfig()
	cfg.CRIU = criuForTest(tb)
	p, err := NewProc(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.CheckpointSupport(ctx); err != nil {
		tb.Fatalf("CheckpointSupport: %v", err)
	}
	return p
}

// counterOf returns the count a fiber answered with.
func counterOf(tb testing.TB, ep endpoint) int {
	tb.Helper()
	body, err := get(ep, "/")
	if err != nil {
		tb.Fatalf("GET %s: %v", ep.addr, err)
	}
	n, err := strconv.Atoi(fields(body)["count"])
	if err != nil {
		tb.Fatalf("no count in %q", body)
	}
	return n
}

func park(tb testing.TB, p *Proc, f core.Fence, dir string) Image {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	img, err := p.Park(ctx, ParkRequest{Fence: f, Dir: dir, Template: testTemplate})
	if err != nil {
		tb.Fatalf("Park: %v", err)
	}
	return img
}

func resume(tb testing.TB, p *Proc, req ResumeRequest) Resumed {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if req.Template == "" {
		req.Template = testTemplate
	}
	r, err := p.Resume(ctx, req)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(req.Image, "restore.log"))
		out, _ := exec.Command("sh", "-c", "ps -eLo pid,tid,ppid,stat,comm | awk '$2=="+strings.TrimPrefix(strings.Split(strings.Split(string(b), "Can't fork for ")[1], ":")[0], "")+"'").CombinedOutput()
		tb.Logf("restore.log tail: %s\nps: %s", lastLines(b, 15), out)
		tb.Fatalf("Resume: %v", err)
	}
	if r.Listener != nil {
		tb.Cleanup(func() { r.Listener.Close() })
	}
	return r
}

// TestParkResume parks C and Python counters serving on TCP and unix
// listeners and resumes them, twice: each counts on from where it was, the
// parked fiber's Exit says Parked, the resumed one is killed like any other.
func TestParkResume(t *testing.T) {
	for _, k := range []kind{kindC, kindPython} {
		for _, unixSock := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/unix=%v", k.name, unixSock), func(t *testing.T) {
				p := newCkpt(t)
				uid := uidFor(t)
				warm(t, p, uid, k.spec(t, "--dirty-mib", "1"), "")
				ep := listen(t, unixSock)
				f := fence(uid, 1)
				fb, err := p.Clone(ctxT(t), CloneRequest{Fence: f, Listener: ep.file})
				if err != nil {
					t.Fatal(err)
				}
				counterOf(t, ep)
				if n := counterOf(t, ep); n != 2 {
					t.Fatalf("count %d before the park, want 2", n)
				}
				state := t.TempDir()
				for round := 1; round <= 2; round++ {
					dir := filepath.Join(state, fmt.Sprintf("img%d", round))
					img := park(t, p, f, dir)
					if e := nextExit(t, p); e.Fence != f || !e.Reason.Parked || e.Reason.String() != "parked" {
						t.Fatalf("Exit after park = %+v, want %s parked", e, f)
					}
					if _, _, ok := procStat(fb.PID); ok && round == 1 {
						st, _, _ := procStat(fb.PID)
						if st != 'Z' {
							t.Fatalf("parked fiber %d still exists (state %c)", fb.PID, st)
						}
					}
					if img.Bytes < 1<<20 || img.Dir != dir {
						t.Fatalf("image %+v: want at least 1 MiB in %s", img, dir)
					}
					if _, err := os.Stat(dir + partialSuffix); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("partial image left: %v", err)
					}
					wantNet := "tcp"
					if unixSock {
						wantNet = "unix"
					}
					if img.Network != wantNet || img.Addr == "" {
						t.Fatalf("image listener %s %q, want %s", img.Network, img.Addr, wantNet)
					}
					req := ResumeRequest{Fence: fence(uid, uint64(round+1)), Image: dir}
					if unixSock {
						ep = listen(t, true) // a fresh listener at a new path
						req.Listener = ep.file
					} else {
						req.Listener = ep.file // same address; Resume closes it
					}
					r := resume(t, p, req)
					if !unixSock {
						ep.file = r.Listener
					}
					f = req.Fence
					if got := counterOf(t, ep); got != 2*round+1 {
						t.Fatalf("round %d: count %d after resume, want %d (counting on)", round, got, 2*round+1)
					}
					counterOf(t, ep)
					if _, ppid, _ := procStat(r.Fiber.PID); ppid != os.Getpid() {
						t.Fatalf("resumed fiber %d has parent %d, want fiberd %d", r.Fiber.PID, ppid, os.Getpid())
					}
					fb = r.Fiber
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

// running warms a C counter (each fiber dirtying mib MiB) and clones one
// fiber that has answered twice.
func running(t *testing.T, p *Proc, unixSock bool, mib int, cg string) (uid string, f Fiber, ep endpoint) {
	t.Helper()
	uid = uidFor(t)
	warm(t, p, uid, kindC.spec(t, "--dirty-mib", strconv.Itoa(mib)), cg)
	ep = listen(t, unixSock)
	var err error
	f, err = p.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	counterOf(t, ep)
	counterOf(t, ep)
	return uid, f, ep
}

// stillServing checks a fiber a failed Park left running counts on.
func stillServing(t *testing.T, p *Proc, ep endpoint, want int) {
	t.Helper()
	if n := counterOf(t, ep); n != want {
		t.Fatalf("count %d after the failed park, want %d", n, want)
	}
	select {
	case e := <-p.Exits():
		t.Fatalf("unexpected Exit %+v after a failed park", e)
	default:
	}
}

// TestCheckpointAbsent: without a working CRIU the tier is absent and every
// call says what is missing, wrapping core.ErrTierGap.
func TestCheckpointAbsent(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "criu-old")
	if err := os.WriteFile(old, []byte("#!/bin/sh\necho 'Version: 3.17.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "criu-broken")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Version: 4.2.1'; exit 0; }\necho 'Error (criu/cr-check.c:1): vdso: Unexpected rt vDSO area bounds' >&2; exit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ criu, want string }{
		{"", "Config.CRIU is empty"},
		{filepath.Join(dir, "none"), "hack/criu.sh"},
		{old, "is 3.17.1; fiberd needs 4.2"},
	}
	if os.Geteuid() == 0 {
		cases = append(cases, struct{ criu, want string }{broken, "criu check failed"})
	}
	for _, c := range cases {
		cfg := testConfig()
		cfg.CRIU = c.criu
		p, err := NewProc(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = p.CheckpointSupport(ctxT(t))
		if !errors.Is(err, core.ErrTierGap) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CRIU %q: CheckpointSupport = %v, want ErrTierGap naming %q", c.criu, err, c.want)
		}
		if err2 := p.CheckpointSupport(ctxT(t)); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("second CheckpointSupport = %v, want the first result", err2)
		}
		_, perr := p.Park(ctxT(t), ParkRequest{Fence: fence("g", 1), Dir: filepath.Join(dir, "img"), Template: testTemplate})
		_, rerr := p.Resume(ctxT(t), ResumeRequest{Fence: fence("g", 2), Image: filepath.Join(dir, "img"), Template: testTemplate})
		if !errors.Is(perr, core.ErrTierGap) || !errors.Is(rerr, core.ErrTierGap) {
			t.Errorf("CRIU %q: Park = %v, Resume = %v, want ErrTierGap", c.criu, perr, rerr)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := (Config{CRIU: "criu"}).Validate(); err == nil {
		t.Error("Validate accepted a relative Config.CRIU")
	}
}

// TestParkRefusals: bad requests, unknown fibers, a fiber over MaxBytes and
// an existing image directory are refused and the fiber keeps running.
func TestParkRefusals(t *testing.T) {
	p := newCkpt(t)
	uid, f, ep := running(t, p, true, 4, "")
	dir := filepath.Join(t.TempDir(), "img")
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		req  ParkRequest
		want error
	}{
		{"relative dir", ParkRequest{Fence: f.Fence, Dir: "img", Template: testTemplate}, core.ErrInvalid},
		{"no template", ParkRequest{Fence: f.Fence, Dir: dir}, core.ErrInvalid},
		{"unknown fiber", ParkRequest{Fence: fence(uid, 7), Dir: dir, Template: testTemplate}, core.ErrNotFound},
		{"unknown grant", ParkRequest{Fence: fence("nope", 1), Dir: dir, Template: testTemplate}, core.ErrNotFound},
		{"too large", ParkRequest{Fence: f.Fence, Dir: dir, Template: testTemplate, MaxBytes: 2 << 20}, ErrTooLarge},
		{"dir exists", ParkRequest{Fence: f.Fence, Dir: t.TempDir(), Template: testTemplate}, core.ErrInvalid},
	} {
		if _, err := p.Park(ctx, c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: Park = %v, want %v", c.name, err, c.want)
		}
	}
	stillServing(t, p, ep, 3)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused park left %s: %v", dir, err)
	}
	// The bound is the fiber's memory: 4 MiB of its own plus what it
	// shares with its zygote.
	img, err := p.Park(ctx, ParkRequest{Fence: f.Fence, Dir: dir, Template: testTemplate, MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if img.Bytes < 4<<20 || img.Bytes > 64<<20 || img.OwnBytes < 4<<20 || img.OwnBytes > img.Bytes {
		t.Fatalf("image %+v: want 4 MiB <= OwnBytes <= Bytes <= 64 MiB", img)
	}
}

// TestParkDiskFull parks into a 1 MiB tmpfs: the dump fails, the error says
// the filesystem is full, no image or partial image is left, and the fiber
// runs on.
func TestParkDiskFull(t *testing.T) {
	p := newCkpt(t)
	_, f, ep := running(t, p, false, 8, "")
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs for the disk-full case: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	dir := filepath.Join(mnt, "img")
	_, err := p.Park(ctxT(t), ParkRequest{Fence: f.Fence, Dir: dir, Template: testTemplate})
	if err == nil || !strings.Contains(err.Error(), "no space left on device") || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Park into a full tmpfs = %v, want an error saying no space is left (ErrNoSpace)", err)
	}
	t.Logf("Park: %v", err)
	if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
		t.Fatalf("a failed park left %v in %s", ents, mnt)
	}
	stillServing(t, p, ep, 3)
	// And it can be parked once there is room.
	park(t, p, f.Fence, filepath.Join(t.TempDir(), "img"))
}

// TestParkCRIUKilled kills criu -9 in the middle of a dump (as a crash of
// fiberd would, criu dying with it): Park fails, and neither an image nor a
// partial image is left. The fiber, released by its dead tracer, either
// runs on or has died; either way its Exit is not Parked and nothing of it
// is left once it is released.
func TestParkCRIUKilled(t *testing.T) {
	p := newCkpt(t)
	uid, f, ep := running(t, p, false, 64, "")
	dir := filepath.Join(t.TempDir(), "img")
	done := make(chan error, 1)
	go func() {
		_, err := p.Park(context.Background(), ParkRequest{Fence: f.Fence, Dir: dir, Template: testTemplate})
		done <- err
	}()
	criuPid := 0
	for deadline := time.Now().Add(20 * time.Second); criuPid == 0 && time.Now().Before(deadline); {
		for _, kid := range childrenOf(os.Getpid()) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", kid)); strings.TrimSpace(string(comm)) == "criu" {
				criuPid = kid
			}
		}
	}
	if criuPid == 0 {
		t.Fatal("no criu process seen")
	}
	// Let it seize the fiber and start writing pages.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir+partialSuffix, "dump.log")); err == nil {
			break
		}
	}
	time.Sleep(20 * time.Millisecond)
	_ = syscall.Kill(criuPid, syscall.SIGKILL)
	err := <-done
	if err == nil {
		t.Skip("criu finished its dump before it was killed: the kill came too late to test what a killed dump leaves on this host")
	}
	t.Logf("Park with criu killed: %v", err)
	for _, d := range []string{dir, dir + partialSuffix} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after a failed park: %v", d, err)
		}
	}
	if body, gerr := get(ep, "/"); gerr == nil {
		t.Logf("the fiber runs on: %q", body)
		if err := p.Kill(ctxT(t), f.Fence); err != nil {
			t.Fatal(err)
		}
	}
	if e := nextExit(t, p); e.Fence != f.Fence || e.Reason.Parked {
		t.Fatalf("Exit = %+v, want %s not parked", e, f.Fence)
	}
	if err := p.Stop(ctxT(t), uid); err != nil {
		t.Fatal(err)
	}
	noStrays(t, uid)
}

// childrenOf lists pid's children.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// copyImage copies an image directory (for damaging a copy).
func copyImage(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return to
}

// imageFile returns the path of the first file of dir whose name starts
// with prefix.
func imageFile(t *testing.T, dir, prefix string) string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			return filepath.Join(dir, e.Name())
		}
	}
	t.Fatalf("no %s* in %s", prefix, dir)
	return ""
}

// TestResumeRefusals: an image is resumed only by its grant, epoch and
// template, whole; the refusals leave it usable, and a cold grant is a
// transient refusal.
func TestResumeRefusals(t *testing.T) {
	p := newCkpt(t)
	uid, f, _ := running(t, p, true, 1, "")
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f.Fence, dir)
	nextExit(t, p)
	ep := listen(t, true)
	tcp := listen(t, false)
	ctx := ctxT(t)

	truncated := copyImage(t, dir)
	if err := os.Truncate(imageFile(t, truncated, "pages-"), 4096); err != nil {
		t.Fatal(err)
	}
	noManifest := copyImage(t, dir)
	os.Remove(filepath.Join(noManifest, manifestName))
	badManifest := copyImage(t, dir)
	os.WriteFile(filepath.Join(badManifest, manifestName), []byte(`{"version":1,"grantUID":"x","unknown":1}`), 0o600)

	next := fence(uid, 2)
	for _, c := range []struct {
		name string
		req  ResumeRequest
		want error
	}{
		{"other template", ResumeRequest{Fence: next, Image: dir, Template: "counter@sha256:" + strings.Repeat("1", 64), Listener: ep.file}, ErrImageUnusable},
		{"other grant", ResumeRequest{Fence: fence("other-grant", 2), Image: dir, Listener: ep.file}, ErrImageUnusable},
		{"newer epoch", ResumeRequest{Fence: core.Fence{GrantUID: uid, Epoch: 2, Seq: 1}, Image: dir, Listener: ep.file}, ErrImageUnusable},
		{"fence not newer", ResumeRequest{Fence: f.Fence, Image: dir, Listener: ep.file}, core.ErrInvalid},
		{"no listener", ResumeRequest{Fence: next, Image: dir}, core.ErrInvalid},
		{"tcp listener for a unix image", ResumeRequest{Fence: next, Image: dir, Listener: tcp.file}, core.ErrInvalid},
		{"truncated pages", ResumeRequest{Fence: next, Image: truncated, Listener: ep.file}, ErrImageUnusable},
		{"no manifest", ResumeRequest{Fence: next, Image: noManifest, Listener: ep.file}, ErrImageUnusable},
		{"bad manifest", ResumeRequest{Fence: next, Image: badManifest, Listener: ep.file}, ErrImageUnusable},
		{"missing image", ResumeRequest{Fence: next, Image: filepath.Join(t.TempDir(), "none"), Listener: ep.file}, ErrImageUnusable},
	} {
		if c.req.Template == "" {
			c.req.Template = testTemplate
		}
		if _, err := p.Resume(ctx, c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: Resume = %v, want %v", c.name, err, c.want)
		}
	}
	onlyZygote(t, uid)

	spare := copyImage(t, dir)
	r := resume(t, p, ResumeRequest{Fence: next, Image: dir, Listener: ep.file})
	if n := counterOf(t, ep); n != 3 {
		t.Fatalf("count %d after the refusals and a resume, want 3", n)
	}
	if _, err := p.Resume(ctx, ResumeRequest{Fence: next, Image: spare, Template: testTemplate, Listener: listen(t, true).file}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("Resume of a running fence = %v, want ErrInvalid", err)
	}
	if err := p.Stop(ctx, uid); err != nil {
		t.Fatal(err)
	}
	if e := nextExit(t, p); e.Fence != r.Fiber.Fence || !e.Reason.Killed {
		t.Fatalf("Exit after Stop = %+v, want %s killed", e, r.Fiber.Fence)
	}
	if _, err := p.Resume(ctx, ResumeRequest{Fence: fence(uid, 3), Image: spare, Template: testTemplate, Listener: ep.file}); !errors.Is(err, ErrCold) {
		t.Fatalf("Resume on a cold grant = %v, want ErrCold", err)
	}
	warm(t, p, uid, kindC.spec(t, "--dirty-mib", "2"), "")
	if _, err := p.Resume(ctx, ResumeRequest{Fence: fence(uid, 3), Image: spare, Template: testTemplate, Listener: ep.file}); !errors.Is(err, ErrImageUnusable) {
		t.Fatalf("Resume under a changed spec = %v, want ErrImageUnusable", err)
	}
	onlyZygote(t, uid)
}

// TestResumeFailures: a restore CRIU fails (a damaged image of the right
// size, a TCP address in use, the fiber's pid taken) leaves nothing
// running, is not ErrImageUnusable, and the intact image still resumes.
func TestResumeFailures(t *testing.T) {
	x := newParkedFixture(t)
	p, uid, f, ep, dir := x.p, x.uid, x.f, x.ep, x.dir
	ctx := ctxT(t)
	next := fence(uid, 2)

	// A damaged core image of the right size.
	damaged := copyImage(t, dir)
	core1 := imageFile(t, damaged, "core-")
	st, _ := os.Stat(core1)
	os.WriteFile(core1, make([]byte, st.Size()), 0o600)
	leaf := x.newLeaf(t, 2)
	_, err := p.Resume(ctx, ResumeRequest{Fence: next, Image: damaged, Template: testTemplate, Leaf: leaf})
	if err == nil || errors.Is(err, ErrImageUnusable) {
		t.Fatalf("Resume of a damaged image = %v, want a CRIU failure", err)
	}
	t.Logf("damaged: %v", err)
	x.checkNothingLeft(t, leaf, "damaged image")

	// The address is still bound (our copy of the listener is open).
	_, err = p.Resume(ctx, ResumeRequest{Fence: next, Image: dir, Template: testTemplate, Leaf: leaf})
	if err == nil || errors.Is(err, ErrImageUnusable) || !strings.Contains(err.Error(), "Address already in use") {
		t.Fatalf("Resume with the address bound = %v, want a CRIU failure naming the address in use", err)
	}
	x.checkNothingLeft(t, leaf, "address in use")

	// The fiber's pid taken by another process.
	if occ := occupyPID(t, f.PID); occ != nil {
		_, err = p.Resume(ctx, ResumeRequest{Fence: next, Image: dir, Template: testTemplate, Listener: ep.file, Leaf: leaf})
		if err == nil || errors.Is(err, ErrImageUnusable) || !strings.Contains(err.Error(), "is taken by another process") {
			t.Fatalf("Resume with the pid taken = %v, want a failure saying so", err)
		}
		t.Logf("pid taken: %v", err)
		occ.Process.Kill()
		occ.Wait()
		x.checkNothingLeft(t, leaf, "pid taken")
		ep = listen(t, false) // Resume closed the old copy; the address is free
		ep.file.Close()
	} else {
		t.Logf("could not take pid %d for the pid-taken case; skipped it", f.PID)
		ep.file.Close()
	}

	r := resume(t, p, ResumeRequest{Fence: next, Image: dir, Leaf: leaf})
	if r.Listener == nil {
		t.Fatal("Resume of a TCP image returned no listener")
	}
	ep = endpoint{file: r.Listener, network: "tcp", addr: strings.TrimPrefix(mustAddr(t, r.Listener), "tcp:")}
	if n := counterOf(t, ep); n != 3 {
		t.Fatalf("count %d after the failures and a resume, want 3", n)
	}
	if leaf != "" {
		if got, want := ownCgroup(t, r.Fiber.PID), strings.TrimPrefix(leaf, mustMount(t)); got != want {
			t.Fatalf("resumed fiber runs in cgroup %q, want its leaf %q", got, want)
		}
	}
	if err := p.Kill(ctx, next); err != nil {
		t.Fatal(err)
	}
	nextExit(t, p)
	if leaf != "" && !gone(leaf) {
		t.Fatalf("leaf %s of a released resumed fiber still exists", leaf)
	}
	x.checkNothingLeft(t, leaf, "after release")
}

// parkedFixture is a TCP fiber of a warm grant, parked (its Exit taken),
// with the grant's cgroup when the host has cgroup v2 and
// FIBERD_NO_CGROUP is unset.
type parkedFixture struct {
	p     *Proc
	uid   string
	f     Fiber
	ep    endpoint // the fiber's listener, still bound
	dir   string   // its image
	tree  *cgroup.Tree
	grant cgroup.Grant
}

// newParkedFixture runs a TCP fiber on a new checkpointing Proc and parks
// it.
func newParkedFixture(t *testing.T) *parkedFixture {
	x := &parkedFixture{p: newCkpt(t)}
	if os.Getenv("FIBERD_NO_CGROUP") == "" {
		if mount, err := cgroup.Mount(); err == nil {
			if _, err := os.Stat(filepath.Join(mount, "cgroup.procs")); err == nil {
				x.tree, _ = cgroupRoot(t)
			}
		}
	}
	x.uid, x.f, x.ep = running(t, x.p, false, 1, "")
	if x.tree != nil {
		var err error
		if x.grant, err = x.tree.Grant(x.uid); err != nil {
			t.Fatal(err)
		}
	}
	x.dir = filepath.Join(t.TempDir(), "img")
	park(t, x.p, x.f.Fence, x.dir)
	nextExit(t, x.p)
	return x
}

// newLeaf makes the leaf of fiber seq of epoch 1 in the grant's cgroup, or
// returns "" without a cgroup.
func (x *parkedFixture) newLeaf(t *testing.T, seq uint64) string {
	if x.tree == nil {
		return ""
	}
	l, err := x.grant.Fiber(1, seq)
	if err != nil {
		t.Fatal(err)
	}
	return l.Path()
}

// checkNothingLeft fails the test (naming what) unless only the grant's
// zygote runs, leaf ("": none) is empty, and fiberd has no zombie child.
func (x *parkedFixture) checkNothingLeft(t *testing.T, leaf, what string) {
	t.Helper()
	onlyZygote(t, x.uid)
	if leaf != "" {
		if procs, _ := cgroup.At(leaf).Procs(); len(procs) != 0 {
			t.Fatalf("%s: leaf %s holds %v", what, leaf, procs)
		}
	}
	for _, kid := range childrenOf(os.Getpid()) {
		if st, _, _ := procStat(kid); st == 'Z' {
			t.Fatalf("%s: zombie child %d left", what, kid)
		}
	}
}

func mustMount(t *testing.T) string {
	m, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustAddr(t *testing.T, f *os.File) string {
	n, a, _ := fileListener(f)
	if n == "" {
		t.Fatalf("%s is not a listener", f.Name())
	}
	return a
}

// occupyPID starts a sleeping process with pid want (through
// /proc/sys/kernel/ns_last_pid), or returns nil when the machine's other
// processes keep taking it first.
func occupyPID(t *testing.T, want int) *exec.Cmd {
	t.Helper()
	for try := 0; try < 50; try++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(want-1)), 0); err != nil {
			return nil
		}
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == want {
			return cmd
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
	return nil
}

// TestResumedFiberEnds: a resumed fiber is fiberd's child, not the
// zygote's; it is reaped and reported like any fiber when it exits, crashes,
// is stopped, or its zygote dies, and Close ends it.
func TestResumedFiberEnds(t *testing.T) {
	resumed := func(t *testing.T, p *Proc) (string, Resumed, endpoint) {
		uid, f, _ := running(t, p, true, 1, "")
		dir := filepath.Join(t.TempDir(), "img")
		park(t, p, f.Fence, dir)
		nextExit(t, p)
		ep := listen(t, true)
		r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file})
		counterOf(t, ep)
		return uid, r, ep
	}
	t.Run("exit", func(t *testing.T) {
		p := newCkpt(t)
		_, r, ep := resumed(t, p)
		get(ep, "/exit/7")
		if e := nextExit(t, p); e.Fence != r.Fiber.Fence || e.Reason.Code != 7 || e.Reason.Killed {
			t.Fatalf("Exit = %+v, want %s exit:7", e, r.Fiber.Fence)
		}
		waitGone(t, r.Fiber.PID)
	})
	t.Run("crash", func(t *testing.T) {
		p := newCkpt(t)
		_, r, ep := resumed(t, p)
		get(ep, "/crash")
		if e := nextExit(t, p); e.Fence != r.Fiber.Fence || e.Reason.Signal != "SIGABRT" {
			t.Fatalf("Exit = %+v, want %s signal:SIGABRT", e, r.Fiber.Fence)
		}
		waitGone(t, r.Fiber.PID)
	})
	t.Run("zygote dies", func(t *testing.T) {
		p := newCkpt(t)
		uid, r, _ := resumed(t, p)
		if err := syscall.Kill(zygotePID(t, uid), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if e := nextExit(t, p); e.Fence != r.Fiber.Fence || !e.Reason.TemplateDied {
			t.Fatalf("Exit = %+v, want %s template died", e, r.Fiber.Fence)
		}
		if e := nextExit(t, p); !e.Template {
			t.Fatalf("Exit = %+v, want the template's", e)
		}
		waitGone(t, r.Fiber.PID)
		noStrays(t, uid)
	})
	t.Run("stop", func(t *testing.T) {
		p := newCkpt(t)
		uid, r, _ := resumed(t, p)
		if err := p.Stop(ctxT(t), uid); err != nil {
			t.Fatal(err)
		}
		if e := nextExit(t, p); e.Fence != r.Fiber.Fence || !e.Reason.Killed {
			t.Fatalf("Exit = %+v, want %s killed", e, r.Fiber.Fence)
		}
		waitGone(t, r.Fiber.PID)
		noStrays(t, uid)
	})
	t.Run("close", func(t *testing.T) {
		cfg := testConfig()
		cfg.CRIU = criuForTest(t)
		p, err := NewProc(cfg)
		if err != nil {
			t.Fatal(err)
		}
		uid, r, _ := resumed(t, p)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		waitGone(t, r.Fiber.PID)
		noStrays(t, uid)
	})
}

// onlyZygote checks that the grant's zygote is its only process left.
func onlyZygote(t *testing.T, uid string) {
	t.Helper()
	z := fmt.Sprintf("process %d ", zygotePID(t, uid))
	for _, s := range strays(uid) {
		if !strings.HasPrefix(s, z) {
			t.Fatalf("processes of grant %s remain besides its zygote: %v", uid, strays(uid))
		}
	}
}

// TestParkPIDNamespace parks and resumes a fiber that is the init of its
// own pid namespace (as a zygote that forks each fiber into a new pid
// namespace would make it): CRIU dumps the namespace with it and restores
// it into a new one, under a new outer pid, the fiber still pid 1 inside.
// The fiber is started here, as fiberd's child, and handed to the backend
// as a resumed fiber would be (white box: the SDKs do not make pid
// namespaces yet).
func TestParkPIDNamespace(t *testing.T) {
	p := newCkpt(t)
	uid := uidFor(t)
	warm(t, p, uid, kindC.spec(t), "")
	z, _ := p.findFiber(fence(uid, 0))
	logW, err := z.out.writer()
	if err != nil {
		t.Fatal(err)
	}
	defer logW.Close()
	ep := listen(t, true)
	f1 := fence(uid, 1)
	cmd := &exec.Cmd{
		Path:        counterC(t),
		Args:        []string{"counter", "--dirty-mib", "1"},
		Env:         []string{"LISTEN_FDS=1", "LISTEN_PID=1", "FIBERD_FENCE=" + f1.String(), "FIBERD_GRANT_UID=" + uid},
		ExtraFiles:  []*os.File{ep.file},
		Stdout:      logW,
		Stderr:      logW,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWPID},
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a process in a new pid namespace: %v", err)
	}
	pid := cmd.Process.Pid // never Waited: the backend's watcher reaps it
	pidfd, _, err := fiberPidfd(pid, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	fb := newFiber(f1, pid, "")
	fb.pidfd = pidfd
	fb.ck.resumed = true
	z.mu.Lock()
	z.fibers[f1.String()] = fb
	z.mu.Unlock()
	p.watch(fb, z)

	counterOf(t, ep)
	if n := counterOf(t, ep); n != 2 {
		t.Fatalf("count %d, want 2", n)
	}
	if ns, _ := nsPIDs(pid); len(ns) < 2 || ns[len(ns)-1] != 1 {
		t.Fatalf("fiber %d has NSpid %v, want pid 1 of its own namespace", pid, ns)
	}
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f1, dir)
	if e := nextExit(t, p); e.Fence != f1 || !e.Reason.Parked {
		t.Fatalf("Exit = %+v, want %s parked", e, f1)
	}
	ep = listen(t, true)
	r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file})
	if n := counterOf(t, ep); n != 3 {
		t.Fatalf("count %d after resume, want 3", n)
	}
	ns, _ := nsPIDs(r.Fiber.PID)
	if len(ns) < 2 || ns[len(ns)-1] != 1 {
		t.Fatalf("resumed fiber %d has NSpid %v, want pid 1 of a new namespace", r.Fiber.PID, ns)
	}
	t.Logf("outer pid %d -> %d, NSpid %v", pid, r.Fiber.PID, ns)
	if err := p.Kill(ctxT(t), r.Fiber.Fence); err != nil {
		t.Fatal(err)
	}
	if e := nextExit(t, p); e.Fence != r.Fiber.Fence || !e.Reason.Killed {
		t.Fatalf("Exit = %+v, want killed", e)
	}
	waitGone(t, r.Fiber.PID)
	onlyZygote(t, uid)
}

// TestParkOpenConnections: a TCP fiber parks with a connection open (the
// connection is closed: its client reads EOF) and resumes; a unix fiber
// with a connection open cannot be parked (CRIU cannot dump one end of a
// unix connection): Park says so and the fiber runs on, and parks once the
// connection is gone.
func TestParkOpenConnections(t *testing.T) {
	for _, unixSock := range []bool{false, true} {
		t.Run(fmt.Sprintf("unix=%v", unixSock), func(t *testing.T) {
			p := newCkpt(t)
			uid, f, ep := running(t, p, unixSock, 1, "")
			c, err := net.Dial(ep.network, ep.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "GET / HTTP/1.1\r\n") // half a request: the fiber waits for the rest
			time.Sleep(50 * time.Millisecond)
			dir := filepath.Join(t.TempDir(), "img")
			_, err = p.Park(ctxT(t), ParkRequest{Fence: f.Fence, Dir: dir, Template: testTemplate})
			if unixSock {
				if err == nil || !strings.Contains(err.Error(), "unix listener is open or waiting") || !errors.Is(err, ErrBusy) {
					t.Fatalf("Park with a unix connection open = %v, want a refusal saying so", err)
				}
				io.WriteString(c, "\r\n")
				if b, err := io.ReadAll(c); err != nil || !strings.Contains(string(b), "count=3") {
					t.Fatalf("the fiber did not run on: %q, %v", b, err)
				}
				c.Close()
				park(t, p, f.Fence, dir)
				return
			}
			if err != nil {
				t.Fatalf("Park with a TCP connection open: %v", err)
			}
			nextExit(t, p)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
				t.Fatalf("the open connection after the park read %q, %v; want EOF", b, err)
			}
			r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file})
			ep.file = r.Listener
			counterOf(t, ep)
		})
	}
}

// TestResumedFiberOrphans runs as a child subreaper, as fiberd does: a
// resumed fiber is fiberd's child, so a process it leaves behind is
// reparented to fiberd, not to the zygote. With a leaf, the backend kills
// and reaps it when the fiber ends: no zombie is left.
func TestResumedFiberOrphans(t *testing.T) {
	criuForTest(t)
	if !inSubreaper(t) {
		return
	}
	p := newCkpt(t)
	tree, mount := cgroupRoot(t)
	uid, f, _ := running(t, p, true, 1, "")
	g, err := tree.Grant(uid)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f.Fence, dir)
	nextExit(t, p)
	leaf, err := g.Fiber(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	ep := listen(t, true)
	r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file, Leaf: leaf.Path()})
	if got := ownCgroup(t, r.Fiber.PID); got != strings.TrimPrefix(leaf.Path(), mount) {
		t.Fatalf("resumed fiber in cgroup %q, want %q", got, leaf.Path())
	}
	body, err := get(ep, "/orphan")
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(body, "orphan=")))
	if err != nil {
		t.Fatalf("GET /orphan: %q", body)
	}
	if e := nextExit(t, p); e.Fence != r.Fiber.Fence || e.Reason.Code != 0 || e.Reason.Killed {
		t.Fatalf("Exit = %+v, want %s exit:0", e, r.Fiber.Fence)
	}
	waitGone(t, orphan)
	waitGone(t, r.Fiber.PID)
	if z := zombieChildren(); len(z) != 0 {
		t.Fatalf("zombie children left: %v", z)
	}
	if !gone(leaf.Path()) {
		t.Fatalf("leaf %s still exists", leaf)
	}
}

// TestResumedFiberOrphansWithoutLeaf: without a leaf, what a resumed
// fiber left behind in its session (reparented to fiberd, the subreaper)
// is killed and reaped when the fiber ends, one in another process group
// of the session too: no zombie of fiberd is left.
func TestResumedFiberOrphansWithoutLeaf(t *testing.T) {
	criuForTest(t)
	if !inSubreaper(t) {
		return
	}
	p := newCkpt(t)
	uid, f, _ := running(t, p, true, 1, "")
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f.Fence, dir)
	nextExit(t, p)
	ep := listen(t, true)
	r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file})
	body, err := get(ep, "/orphan/pgrp")
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(body, "orphan=")))
	if err != nil {
		t.Fatalf("GET /orphan/pgrp: %q", body)
	}
	if e := nextExit(t, p); e.Fence != r.Fiber.Fence || e.Reason.Code != 0 {
		t.Fatalf("Exit = %+v, want %s exit:0", e, r.Fiber.Fence)
	}
	waitGone(t, orphan)
	waitGone(t, r.Fiber.PID)
	for deadline := time.Now().Add(10 * time.Second); len(zombieChildren()) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if z := zombieChildren(); len(z) != 0 {
		t.Fatalf("zombie children left: %v", z)
	}
}

// killedEnv makes a re-executed test binary play fiberd in killedMid.
const killedEnv = "FIBERD_BACKEND_TEST_KILLED"

// TestFiberdKilledMidPark kills -9 a process playing fiberd (this test
// binary, re-executed) while criu dumps one of its fibers: criu dies with
// it (Pdeathsig), and no image is left that looks complete; at most a
// partial directory, which RemoveImage removes.
func TestFiberdKilledMidPark(t *testing.T) { killedMid(t, "park") }

// TestFiberdKilledMidResume kills -9 the process playing fiberd while criu
// restores an image into a leaf: criu dies with it, and nothing of the
// half-restored fiber outlives the kill of its leaf.
func TestFiberdKilledMidResume(t *testing.T) { killedMid(t, "resume") }

func killedMid(t *testing.T, what string) {
	if v := os.Getenv(killedEnv); v != "" {
		killedHelper(t, v)
		return
	}
	criuForTest(t)
	counterC(t)
	var tree *cgroup.Tree
	if what == "resume" {
		tree, _ = cgroupRoot(t)
	}
	dir := t.TempDir()
	h := startKilledHelper(t, what, dir, tree)
	uid, leaf := h.awaitGo(t, what)
	criuPid := h.awaitCriu(t)
	// Into the dump's page writing, or the restore's forking of the fiber.
	delay := 30 * time.Millisecond
	if what == "resume" {
		delay = 200 * time.Millisecond
	}
	time.Sleep(delay)
	h.cmd.Process.Kill()
	go func() {
		for l := range h.lines {
			h.log.WriteString(l + "\n")
		}
	}()
	h.cmd.Wait()
	waitGone(t, criuPid)

	img := filepath.Join(dir, "img")
	switch what {
	case "park":
		checkKilledPark(t, img)
	case "resume":
		// The half-restored fiber, if any, is in the leaf: killing the
		// leaf (what the agent does with a previous epoch's leaves)
		// ends it.
		procs, _ := cgroup.At(leaf).Procs()
		t.Logf("left in the leaf after the kill: %v", procs)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cgroup.At(leaf).Destroy(ctx); err != nil {
			t.Fatalf("leaf %s: %v", leaf, err)
		}
	}
	// The fiber parked or being parked was the zygote's child; the zygote
	// died with the helper (Pdeathsig). Whether the fiber outlives it
	// depends on the SDK (a PR_SET_PDEATHSIG in the fiber): end it here.
	for _, s := range strays(uid) {
		var pid int
		if _, err := fmt.Sscanf(s, "process %d", &pid); err == nil {
			t.Logf("left after the kill: %s (%s)", s, strings.TrimSpace(readComm(pid)))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	noStrays(t, uid)
}

// killedProc is the test binary run again as the process playing fiberd
// in killedMid: its output, line by line, and all of it so far.
type killedProc struct {
	cmd   *exec.Cmd
	lines chan string
	log   strings.Builder
}

// startKilledHelper starts this test again as the helper that will park
// or resume (what) in dir, in tree's cgroup when given, and reads its
// output into lines.
func startKilledHelper(t *testing.T, what, dir string, tree *cgroup.Tree) *killedProc {
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	tmp := filepath.Join(dir, "tmp") // the helper's own temporary directories, never cleaned by it
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), killedEnv+"="+what+" "+dir, "TMPDIR="+tmp)
	if tree != nil {
		cmd.Env = append(cmd.Env, killedEnv+"_CGROUP="+tree.Root())
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &killedProc{cmd: cmd, lines: make(chan string)}
	go func() {
		defer close(h.lines)
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := out.Read(buf)
			acc += string(buf[:n])
			for {
				i := strings.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				h.lines <- acc[:i]
				acc = acc[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	return h
}

// awaitGo reads the helper's output up to its "GO <uid> <leaf>" line, said
// as it starts the park or resume (what), and returns the grant and leaf;
// the test fails if the helper ends first.
func (h *killedProc) awaitGo(t *testing.T, what string) (uid, leaf string) {
	for l := range h.lines {
		h.log.WriteString(l + "\n")
		if rest, ok := strings.CutPrefix(l, "GO "); ok {
			uid, leaf, _ = strings.Cut(rest, " ")
			break
		}
	}
	if uid == "" {
		h.cmd.Wait()
		t.Fatalf("the helper did not get to the %s:\n%s", what, h.log.String())
	}
	return uid, leaf
}

// awaitCriu returns the pid of the criu the helper runs, looked for during
// 20 s; the test fails (the helper killed) if none is seen.
func (h *killedProc) awaitCriu(t *testing.T) int {
	criuPid := 0
	for deadline := time.Now().Add(20 * time.Second); criuPid == 0 && time.Now().Before(deadline); {
		for _, kid := range childrenOf(h.cmd.Process.Pid) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", kid)); strings.TrimSpace(string(comm)) == "criu" {
				criuPid = kid
			}
		}
	}
	if criuPid == 0 {
		h.cmd.Process.Kill()
		h.cmd.Wait()
		t.Fatalf("no criu seen under the helper:\n%s", h.log.String())
	}
	return criuPid
}

// checkKilledPark checks what a park killed midway left at img: a
// complete image or none (a partial one is documented), and that
// RemoveImage removes the partial directory.
func checkKilledPark(t *testing.T, img string) {
	if _, err := os.Stat(img); err == nil {
		if _, err := os.Stat(filepath.Join(img, manifestName)); err != nil {
			t.Fatalf("%s exists without its manifest: a torn image", img)
		}
		t.Logf("the park completed before the kill: %s is a complete image", img)
	} else if _, err := os.Stat(img + partialSuffix); err == nil {
		t.Logf("a partial image is left, as documented")
	}
	if err := RemoveImage(img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img + partialSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("RemoveImage left %s", img+partialSuffix)
	}
}

func readComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return string(b)
}

// killedHelper is the process killedMid kills: it parks a fiber with 64
// MiB of its own (or parks it and then resumes it into a leaf) and says GO
// just before.
func killedHelper(t *testing.T, v string) {
	what, dir, _ := strings.Cut(v, " ")
	p := newCkpt(t)
	uid, f, ep := running(t, p, true, 64, "")
	img := filepath.Join(dir, "img")
	switch what {
	case "park":
		fmt.Printf("GO %s -\n", uid)
		p.Park(context.Background(), ParkRequest{Fence: f.Fence, Dir: img, Template: testTemplate})
	case "resume":
		park(t, p, f.Fence, img)
		tree, err := cgroup.NewTree(cgroup.Config{Root: os.Getenv(killedEnv + "_CGROUP"), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		g, err := tree.Grant(uid)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := g.Fiber(1, 2)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("GO %s %s\n", uid, leaf.Path())
		p.Resume(context.Background(), ResumeRequest{Fence: fence(uid, 2), Image: img, Template: testTemplate, Listener: ep.file, Leaf: leaf.Path()})
	}
	time.Sleep(time.Minute) // killed before this ends
}

// TestResumedFiberRecorded: a fiber resumed without a leaf is recorded in
// the grant's process records like a cloned one (so the sweep after a crash
// of fiberd ends its session), the restore's own record is gone once
// Resume returns, and the fiber's record is removed when it ends.
func TestResumedFiberRecorded(t *testing.T) {
	p := newCkpt(t)
	recs, err := procrec.Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	uid := uidFor(t)
	if err := p.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid, Template: testTemplate}, Spec: kindC.spec(t), RunDir: t.TempDir(), Records: recs}); err != nil {
		t.Fatal(err)
	}
	records := func() []string {
		ents, _ := os.ReadDir(recs.Path())
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	has := func(pid int) bool {
		for _, n := range records() {
			if strings.HasPrefix(n, fmt.Sprintf("p-%d-", pid)) {
				return true
			}
		}
		return false
	}
	ep := listen(t, false)
	f, err := p.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	counterOf(t, ep)
	if !has(f.PID) {
		t.Fatalf("the cloned fiber %d is not recorded: %v", f.PID, records())
	}
	dir := filepath.Join(t.TempDir(), "img")
	park(t, p, f.Fence, dir)
	nextExit(t, p)
	if has(f.PID) {
		t.Fatalf("the parked fiber's record is left: %v", records())
	}
	r := resume(t, p, ResumeRequest{Fence: fence(uid, 2), Image: dir, Listener: ep.file})
	ep.file = r.Listener
	if n := counterOf(t, ep); n != 2 {
		t.Fatalf("resumed fiber counted %d, want 2", n)
	}
	if !has(r.Fiber.PID) {
		t.Fatalf("the resumed fiber %d is not recorded: %v", r.Fiber.PID, records())
	}
	for _, n := range records() {
		if strings.HasPrefix(n, "r-") {
			t.Fatalf("the restore's record %s outlived Resume", n)
		}
	}
	if err := p.Kill(ctxT(t), r.Fiber.Fence); err != nil {
		t.Fatal(err)
	}
	nextExit(t, p)
	if has(r.Fiber.PID) {
		t.Fatalf("the ended resumed fiber's record is left: %v", records())
	}
}

// TestParkRecordsCRIU: the criu of a park leads a session of its own and is
// recorded in the grant's process records while it dumps, so the sweep after
// a crash of fiberd ends what criu forked (which no parent-death signal
// covers); the record is gone once the park returns.
func TestParkRecordsCRIU(t *testing.T) {
	real := criuForTest(t)
	counterC(t)
	// A criu that says where it is, then waits a little before it dumps.
	dir := t.TempDir()
	seen := filepath.Join(dir, "criu-pid")
	wrapper := filepath.Join(dir, "criu")
	script := "#!/bin/sh\nif [ \"$1\" = dump ]; then echo $$ > " + seen + "; /bin/sleep 1; fi\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.CRIU = wrapper
	p, err := NewProc(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if err := p.CheckpointSupport(ctxT(t)); err != nil {
		t.Fatalf("CheckpointSupport: %v", err)
	}
	recs, err := procrec.Open(filepath.Join(t.TempDir(), "procs"))
	if err != nil {
		t.Fatal(err)
	}
	uid := uidFor(t)
	if err := p.Warm(ctxT(t), WarmRequest{Grant: core.Grant{UID: uid, Template: testTemplate}, Spec: kindC.spec(t), RunDir: t.TempDir(), Records: recs}); err != nil {
		t.Fatal(err)
	}
	ep := listen(t, false)
	f, err := p.Clone(ctxT(t), CloneRequest{Fence: fence(uid, 1), Listener: ep.file})
	if err != nil {
		t.Fatal(err)
	}
	counterOf(t, ep)
	parked := make(chan error, 1)
	go func() {
		_, err := p.Park(ctxT(t), ParkRequest{Fence: f.Fence, Dir: filepath.Join(t.TempDir(), "img"), Template: testTemplate})
		parked <- err
	}()
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(seen); err == nil && len(b) > 0 && b[len(b)-1] == '\n' {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	if pid == 0 {
		select {
		case err := <-parked:
			t.Fatalf("the park ran no criu dump: %v", err)
		default:
			t.Fatal("the park ran no criu dump")
		}
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("criu %d is in session %d (%v), want a session of its own", pid, sid, err)
	}
	ents, _ := os.ReadDir(recs.Path())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, fmt.Sprintf("p-%d-", pid)) }) {
		t.Errorf("criu %d is not recorded while it dumps: %v", pid, names)
	}
	if err := <-parked; err != nil {
		t.Fatal(err)
	}
	ents, _ = os.ReadDir(recs.Path())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("p-%d-", pid)) {
			t.Errorf("criu's record %s outlived the park", e.Name())
		}
	}
}
