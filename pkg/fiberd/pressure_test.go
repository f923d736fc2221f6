package fiberd

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
	homefake "fiberd.io/fiberd/pkg/home/fake"
)

// fakePSI is a cgroup root faked in a temp dir: <dir>/<uid>/memory.pressure
// and cpu.pressure are written by hand. A temp dir is no cgroup (New would
// refuse it as the home's CgroupRoot), so it is read through the agent's
// readPressure seam with cgroup.At, which parses the files as the kernel's.
type fakePSI struct {
	t     *testing.T
	dir   string
	reads atomic.Int32
}

func newFakePSI(t *testing.T) *fakePSI {
	return &fakePSI{t: t, dir: t.TempDir()}
}

// set writes grant uid's pressure file name ("memory.pressure" or
// "cpu.pressure") with "some avg10" and "full avg10" at the figures given.
func (f *fakePSI) set(uid, name string, some, full float64) {
	f.t.Helper()
	body := "some avg10=" + strconv.FormatFloat(some, 'f', 2, 64) + " avg60=3.10 avg300=1.02 total=81234567\n" +
		"full avg10=" + strconv.FormatFloat(full, 'f', 2, 64) + " avg60=1.40 avg300=0.51 total=40123456\n"
	f.write(uid, name, body)
}

func (f *fakePSI) write(uid, name, body string) {
	f.t.Helper()
	d := filepath.Join(f.dir, uid)
	must(f.t, os.MkdirAll(d, 0o755))
	must(f.t, os.WriteFile(filepath.Join(d, name), []byte(body), 0o644))
}

// read is the pressureReader: one count per read of a grant's files.
func (f *fakePSI) read(uid string, _ *cgroup.Grant) (cgroup.Pressure, bool, error) {
	f.reads.Add(1)
	p, err := cgroup.At(filepath.Join(f.dir, uid)).Pressure()
	return p, true, err
}

func withPSI(f *fakePSI) envOption {
	return func(e *env) { e.pressure = f.read }
}

// TestPressureSheds: a Clone of a grant whose memory pressure is above the
// threshold is 429 SHED with Retry-After = Config.RetryAfter even while the
// lane is healthy; at or below it, with the check off, without
// memory.pressure, with CPU pressure alone or with an unreadable file the
// Clone is served.
func TestPressureSheds(t *testing.T) {
	cases := []struct {
		name      string
		threshold float64
		files     func(f *fakePSI)
		stale     bool // lane unhealthy
		shed      bool
		noReads   bool
	}{
		{name: "above sheds while healthy", threshold: 60, shed: true,
			files: func(f *fakePSI) { f.set("g1", "memory.pressure", 72, 40) }},
		{name: "above sheds while stale", threshold: 60, stale: true, shed: true,
			files: func(f *fakePSI) { f.set("g1", "memory.pressure", 72, 40) }},
		{name: "below serves", threshold: 60,
			files: func(f *fakePSI) { f.set("g1", "memory.pressure", 12.5, 3) }},
		{name: "at the threshold serves", threshold: 60,
			files: func(f *fakePSI) { f.set("g1", "memory.pressure", 60, 60) }},
		{name: "full above but some below serves", threshold: 60,
			files: func(f *fakePSI) {
				f.write("g1", "memory.pressure", "some avg10=10.00 avg60=0 avg300=0 total=1\nfull avg10=90.00 avg60=0 avg300=0 total=1\n")
			}},
		{name: "threshold 0 never sheds", threshold: 0, noReads: true,
			files: func(f *fakePSI) { f.set("g1", "memory.pressure", 100, 100) }},
		{name: "no memory.pressure serves", threshold: 60,
			files: func(f *fakePSI) { must(f.t, os.MkdirAll(filepath.Join(f.dir, "g1"), 0o755)) }},
		{name: "cpu pressure never sheds", threshold: 60,
			files: func(f *fakePSI) {
				f.set("g1", "memory.pressure", 1, 0)
				f.set("g1", "cpu.pressure", 99, 80)
			}},
		{name: "unreadable file serves", threshold: 60,
			files: func(f *fakePSI) { f.write("g1", "memory.pressure", "some avg10=lots\n") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			psi := newFakePSI(t)
			tc.files(psi)
			e := newEnv(t, withPSI(psi), withConfig(func(c *Config) {
				c.PressureThreshold = tc.threshold
				c.RetryAfter = 3 * time.Second
			}))
			uid := e.deliver(e.mint("g1"))
			if tc.stale {
				e.home.SetIssuerReachable(false)
			}
			r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
			if !tc.shed {
				if r.status != http.StatusOK {
					t.Fatalf("clone: %d %s, want 200", r.status, r.body)
				}
			} else {
				body := r.apiError(t)
				if r.status != http.StatusTooManyRequests || body.Code != string(core.CodeShed) {
					t.Fatalf("clone: %d %s, want 429 SHED", r.status, r.body)
				}
				if got := r.header.Get("Retry-After"); got != "3" || body.RetryAfterSeconds != 3 {
					t.Errorf("Retry-After %q, body %d; want 3 (Config.RetryAfter)", got, body.RetryAfterSeconds)
				}
				if body.Issuer != testIssuer || !strings.Contains(body.Message, "memory pressure") {
					t.Errorf("miss body %s: want the issuer and the memory pressure named", r.body)
				}
				if n := len(e.warm.Running(uid)); n != 0 {
					t.Errorf("a shed Clone left %d fibers running", n)
				}
			}
			if n := psi.reads.Load(); tc.noReads != (n == 0) {
				t.Errorf("pressure read %d times (check off: %v)", n, tc.noReads)
			}
		})
	}
}

// TestPressureReadOncePerInterval: a burst of Clones costs one read of the
// grant's pressure; the reading holds for a second on the agent's clock,
// so relief is seen only after it; every pressure shed is counted as
// outcome="shed".
func TestPressureReadOncePerInterval(t *testing.T) {
	psi := newFakePSI(t)
	psi.set("g1", "memory.pressure", 85, 50)
	e := newEnv(t, withPSI(psi), withConfig(func(c *Config) { c.PressureThreshold = 60 }))
	uid := e.deliver(e.mint("g1"))

	const burst = 20
	var wg sync.WaitGroup
	var shed atomic.Int32
	for i := 0; i < burst; i++ {
		wg.Go(func() {
			r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid})
			if r.status == http.StatusTooManyRequests {
				shed.Add(1)
			} else {
				t.Errorf("clone: %d %s, want 429", r.status, r.body)
			}
		})
	}
	wg.Wait()
	if n := psi.reads.Load(); n != 1 {
		t.Fatalf("a burst of %d Clones read the pressure %d times, want 1", burst, n)
	}

	psi.set("g1", "memory.pressure", 5, 0)
	e.clk.Step(pressureInterval / 2)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusTooManyRequests {
		t.Fatalf("clone within the interval: %d %s, want the cached reading's 429", r.status, r.body)
	}
	if n := psi.reads.Load(); n != 1 {
		t.Fatalf("pressure read %d times within one interval, want 1", n)
	}
	e.clk.Step(pressureInterval / 2)
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
		t.Fatalf("clone after the interval, pressure relieved: %d %s, want 200", r.status, r.body)
	}
	if n := psi.reads.Load(); n != 2 {
		t.Fatalf("pressure read %d times over two intervals, want 2", n)
	}

	m := e.do(e.tcp, http.MethodGet, "/metrics", nil)
	for _, want := range []string{
		`fiberd_clones_total{kind="none",outcome="shed"} ` + strconv.Itoa(burst+1),
		`fiberd_clones_total{kind="create",outcome="served"} 1`,
	} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("metrics lack %q:\n%s", want, m.body)
		}
	}
}

// TestPressureUnadmittedGrantNotRead: a Clone of a grant the agent has not
// admitted reads no pressure (nothing is cached for arbitrary UIDs) and
// misses as before.
func TestPressureUnadmittedGrantNotRead(t *testing.T) {
	psi := newFakePSI(t)
	psi.set("nobody", "memory.pressure", 99, 99)
	e := newEnv(t, withPSI(psi), withConfig(func(c *Config) { c.PressureThreshold = 60 }))
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "nobody"})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("clone of an unknown grant: %d %s, want 503 DEFERRED_FALLBACK", r.status, r.body)
	}
	if n := psi.reads.Load(); n != 0 {
		t.Fatalf("pressure read %d times for a grant not admitted", n)
	}
}

// TestPressureWithoutCgroupRoot: the agent's own reader has nothing to read
// for a grant without a cgroup (a home with no cgroup root), so the Clone
// is served whatever the threshold.
func TestPressureWithoutCgroupRoot(t *testing.T) {
	if p, ok, err := cgroupPressure("g1", nil); ok || err != nil || p != (cgroup.Pressure{}) {
		t.Fatalf("cgroupPressure(nil) = %+v, %v, %v; want nothing to read", p, ok, err)
	}
	e := newEnv(t, withConfig(func(c *Config) { c.PressureThreshold = 0.01 }))
	uid := e.deliver(e.mint("g1"))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
		t.Fatalf("clone: %d %s, want 200", r.status, r.body)
	}
}

// realCgroup makes an empty cgroup v2 directory for this test beside this
// process's cgroup, removed in t.Cleanup (registered before the agent's,
// so it runs after the agent has stopped). It skips without a writable
// cgroup v2.
func realCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := cgroup.Mount()
	if err != nil {
		t.Skipf("needs a cgroup v2 mount: %v", err)
	}
	self, err := cgroup.Self()
	if err != nil {
		t.Skipf("needs this process in a cgroup v2 hierarchy: %v", err)
	}
	base := mnt
	if self != mnt {
		base = filepath.Dir(self)
	}
	dir := filepath.Join(base, "fiberd-test-"+strconv.Itoa(os.Getpid())+"-"+strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("needs a writable cgroup v2 directory (root with cgroup v2 delegated): mkdir %s: %v", dir, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l := cgroup.At(dir)
		if err := l.Kill(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := l.WaitEmpty(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := l.Remove(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return dir
}

// TestPressureRealCgroup: with the home's cgroup root a real cgroup v2
// directory, the agent reads the grant cgroup's own pressure files (an
// idle grant's memory pressure is low) and serves.
func TestPressureRealCgroup(t *testing.T) {
	root := realCgroup(t)
	type reading struct {
		dir string
		p   cgroup.Pressure
		ok  bool
		err error
	}
	var mu sync.Mutex
	var got []reading
	spy := func(uid string, cg *cgroup.Grant) (cgroup.Pressure, bool, error) {
		p, ok, err := cgroupPressure(uid, cg)
		r := reading{p: p, ok: ok, err: err}
		if cg != nil {
			r.dir = cg.Dir.Path()
		}
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return p, ok, err
	}
	e := newEnv(t, withHome(func(c *homefake.Config) { c.CgroupRoot = root }),
		withConfig(func(c *Config) { c.PressureThreshold = DefaultPressureThreshold }),
		func(e *env) { e.pressure = spy })
	uid := e.deliver(e.mint("g1"))
	if r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid}); r.status != http.StatusOK {
		t.Fatalf("clone: %d %s, want 200", r.status, r.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("pressure read %d times, want 1", len(got))
	}
	r := got[0]
	if !r.ok || r.err != nil || r.dir != filepath.Join(root, uid) {
		t.Fatalf("reading %+v: want one of %s without error", r, filepath.Join(root, uid))
	}
	t.Logf("grant cgroup %s: %+v", r.dir, r.p)
	if !r.p.HasMemory {
		t.Skipf("this kernel offers no memory.pressure in %s (no PSI, or the memory controller not enabled there): the cgroup was read, but an idle grant's pressure cannot be checked here", r.dir)
	}
	if r.p.Memory > DefaultPressureThreshold {
		t.Errorf("an idle grant's memory pressure is %.2f%%, want below %v", r.p.Memory, DefaultPressureThreshold)
	}
}
