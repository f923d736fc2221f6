package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/core"
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
