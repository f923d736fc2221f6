package conformance

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/backendtest"
	backendfake "fiberd.io/fiberd/pkg/backend/fake"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/home"
	homefake "fiberd.io/fiberd/pkg/home/fake"
	"fiberd.io/fiberd/pkg/home/standalone"
	"fiberd.io/fiberd/pkg/procrec"
	"fiberd.io/fiberd/pkg/template"
)

// quiet drops log lines (a nil sink would mean klog's).
var quiet = funcr.New(func(string, string) {}, funcr.Options{})

// ------------------------------------------------------------------ homes

var fakeHome = Home{Name: "fake", New: func(t *testing.T, dir string, devices []string) (home.Home, Control) {
	h := homefake.New(homefake.Config{Devices: devices})
	return h, fakeControl{h}
}}

type fakeControl struct{ h *homefake.Home }

func (c fakeControl) Deliver(_ *testing.T, uid string, token []byte) { c.h.Deliver(uid, token) }
func (c fakeControl) Remove(_ *testing.T, uid string)                { c.h.Remove(uid) }
func (c fakeControl) LoseScope(t *testing.T) bool {
	return c.h.LoseScope(context.Background(), "the test said so")
}

// standaloneHome is the standalone home with its file lane, without
// cgroups (the process test covers them).
var standaloneHome = Home{Name: "standalone", New: func(t *testing.T, dir string, devices []string) (home.Home, Control) {
	grants := filepath.Join(dir, "grants")
	h, err := standalone.New(standalone.Config{GrantsDir: grants, GrantsPoll: 50 * time.Millisecond, NoCgroups: true, Devices: devices, Logger: quiet})
	must(t, err)
	return h, fileLane{dir: grants}
}}

// fileLane is a home fed by a directory of grant files.
type fileLane struct{ dir string }

func (l fileLane) Deliver(t *testing.T, uid string, token []byte) {
	t.Helper()
	must(t, core.WriteFileAtomic(filepath.Join(l.dir, uid+".jwt"), token, 0o600))
}

func (l fileLane) Remove(t *testing.T, uid string) {
	t.Helper()
	must(t, os.Remove(filepath.Join(l.dir, uid+".jwt")))
}

func (l fileLane) LoseScope(*testing.T) bool { return false }

// --------------------------------------------------------------- backends

var fakeBackend = Backend{
	Name: "fake", Tier: core.TierWarm,
	New: func(t *testing.T) backend.Backend { return backendfake.New(core.TierWarm, backendfake.Hooks{}) },
	Spec: func(*testing.T) template.Spec {
		return template.Spec{Command: "/bin/true", Zygote: true}
	},
	Running: func(_ *testing.T, b backend.Backend, f api.CloneResponse) bool {
		return slices.Contains(b.(*backendfake.Backend).Running(f.Fence.GrantUID), f.Fence)
	},
	OverBudget: func(t *testing.T, b backend.Backend, f api.CloneResponse) {
		if !b.(*backendfake.Backend).End(f.Fence, backend.ExitReason{Signal: "SIGKILL", MemoryMax: true}) {
			t.Fatalf("fake: fiber %s not running", f.FiberID)
		}
	},
	Devices: func(t *testing.T, b backend.Backend, f api.CloneResponse) []string {
		r, _ := b.(*backendfake.Backend).WarmRequest(f.Fence.GrantUID)
		return r.Devices.Devices
	},
	KillZygote: func(t *testing.T, b backend.Backend, uid string) {
		if !b.(*backendfake.Backend).DieTemplate(uid) {
			t.Fatalf("fake: grant %s not warm", uid)
		}
	},
	Parking: func(t *testing.T) backend.Backend {
		b := backendfake.New(core.TierWarm, backendfake.Hooks{})
		b.EnableCheckpoint(1 << 20)
		return b
	},
	Remembers: func(t *testing.T, b backend.Backend, f api.CloneResponse) string {
		t.Helper()
		r, ok := b.(*backendfake.Backend).Request(f.Fence)
		if !ok {
			t.Fatalf("fake: fiber %s not running", f.FiberID)
		}
		return hex.EncodeToString(r.Payload)
	},
}

var procBackend = Backend{
	Name: "proc", Tier: core.TierWarm,
	New: func(t *testing.T) backend.Backend {
		b, err := backend.NewProc(backend.Config{Logger: quiet})
		must(t, err)
		return b
	},
	Spec:       func(t *testing.T) template.Spec { return devkit.CounterCSpec(counterC(t), true) },
	Running:    fiberRuns,
	OverBudget: dirty24,
	Devices:    fiberDevices,
	KillZygote: killZygote,
	Parking: func(t *testing.T) backend.Backend {
		b, err := backend.NewProc(backend.Config{Logger: quiet, CRIU: backendtest.CRIU(t)})
		must(t, err)
		return b
	},
	Remembers: counterRemembers,
}

var execBackend = Backend{
	Name: "exec", Tier: core.TierBasic,
	New: func(t *testing.T) backend.Backend {
		b, err := backend.NewExec(backend.Config{Logger: quiet})
		must(t, err)
		return b
	},
	Spec:       func(t *testing.T) template.Spec { return devkit.CounterCSpec(counterC(t), false) },
	Running:    fiberRuns,
	OverBudget: dirty24,
	Devices:    fiberDevices,
}

// procSpares is proc with grants of fibers.warm 2: the C counter's zygote
// hands spares over, so Clones take them instead of forking.
var procSpares = func() Backend {
	b := procBackend
	b.Name, b.Warm = "proc-spares", 2
	return b
}()

// procIsolated and execIsolated are proc and exec asked for
// backend.IsolationFiber, fiberd's default on a standalone host: the
// promises hold for isolated grants too. They skip, saying why, where the
// host does not isolate (not root, no user namespaces), and fail instead
// with FIBERD_ISOLATION_REQUIRED=1 (CI). An isolated fiber is PID 1 of its
// own namespace, so its devices are read from its grant's processes.
var procIsolated = Backend{
	Name: "proc-isolated", Tier: core.TierWarm,
	New: func(t *testing.T) backend.Backend {
		b, err := backend.NewProc(backend.Config{Logger: quiet, Isolation: backend.IsolationFiber})
		must(t, err)
		requireIsolation(t, b)
		return b
	},
	Spec:       func(t *testing.T) template.Spec { return devkit.CounterCSpec(counterC(t), true) },
	Running:    fiberRuns,
	OverBudget: dirty24,
	Devices:    grantDevices,
	KillZygote: killZygote,
	Parking: func(t *testing.T) backend.Backend {
		b, err := backend.NewProc(backend.Config{Logger: quiet, Isolation: backend.IsolationFiber, CRIU: backendtest.CRIU(t)})
		must(t, err)
		requireIsolation(t, b)
		return b
	},
	Remembers: counterRemembers,
}

var execIsolated = Backend{
	Name: "exec-isolated", Tier: core.TierBasic,
	New: func(t *testing.T) backend.Backend {
		b, err := backend.NewExec(backend.Config{Logger: quiet, Isolation: backend.IsolationFiber})
		must(t, err)
		requireIsolation(t, b)
		return b
	},
	Spec:       func(t *testing.T) template.Spec { return devkit.CounterCSpec(counterC(t), false) },
	Running:    fiberRuns,
	OverBudget: dirty24,
	Devices:    grantDevices,
}

// requireIsolation skips (or, with FIBERD_ISOLATION_REQUIRED, fails) the
// test when b does not isolate fibers on this host. It closes b then.
func requireIsolation(t *testing.T, b backend.Backend) {
	t.Helper()
	s := b.Isolation()
	if s.Level == backend.IsolationFiber {
		return
	}
	b.Close()
	msg := fmt.Sprintf("this host does not isolate fibers (%s): the isolated backends need root and user namespaces", s.Missing)
	if os.Getenv("FIBERD_ISOLATION_REQUIRED") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// grantDevices reads FIBERD_DEVICES from the environment of a process of
// fiber f's grant (every process of a grant has its template's).
func grantDevices(t *testing.T, _ backend.Backend, f api.CloneResponse) []string {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, []byte("FIBERD_GRANT_UID="+f.Fence.GrantUID+"\x00")) {
			continue
		}
		return envDevices(env)
	}
	t.Fatalf("no process of grant %s found", f.Fence.GrantUID)
	return nil
}

// envDevices is FIBERD_DEVICES of an environ file, split.
func envDevices(env []byte) []string {
	for _, kv := range bytes.Split(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("FIBERD_DEVICES=")); ok {
			if len(v) == 0 {
				return nil
			}
			return strings.Split(string(v), ",")
		}
	}
	return nil
}

var (
	buildOnce sync.Once
	buildDir  string
	built     string
	buildErr  error
)

// counterC builds the C counter once per test binary.
func counterC(t *testing.T) string {
	t.Helper()
	root := repotest.Root(t)
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "fiberd-conformance-"); buildErr != nil {
			return
		}
		built, buildErr = devkit.BuildCounterC(root, buildDir)
	})
	if buildErr != nil {
		t.Skipf("cannot build the C counter (it needs cc): %v", buildErr)
	}
	return built
}

// fiberRuns reports whether the counter fiber f answers with its fence.
func fiberRuns(t *testing.T, _ backend.Backend, f api.CloneResponse) bool {
	body, err := fiberGet(t, f, "/")
	return err == nil && strings.Contains(body, "fence="+f.FiberID+" ")
}

// dirty24 makes counter fiber f write 24 MiB of its own memory. The
// agent may end the fiber before it answers: then the request fails.
func dirty24(t *testing.T, _ backend.Backend, f api.CloneResponse) {
	t.Helper()
	if body, err := fiberGet(t, f, "/dirty/24"); err == nil && !strings.Contains(body, "dirty=24") {
		t.Fatalf("GET /dirty/24 of %s: %q", f.FiberID, body)
	}
}

// counterRemembers is what counter fiber f read at its start, as it
// answers it: its fence and payload (FIBERD_FENCE, FIBERD_PAYLOAD).
func counterRemembers(t *testing.T, _ backend.Backend, f api.CloneResponse) string {
	t.Helper()
	body, err := fiberGet(t, f, "/")
	if err != nil {
		t.Fatalf("GET / of %s: %v", f.FiberID, err)
	}
	var kept []string
	for _, kv := range strings.Fields(body) {
		if strings.HasPrefix(kv, "fence=") || strings.HasPrefix(kv, "payload=") {
			kept = append(kept, kv)
		}
	}
	if len(kept) != 2 {
		t.Fatalf("GET / of %s answered %q, without a fence and a payload", f.FiberID, body)
	}
	return strings.Join(kept, " ")
}

var pidField = regexp.MustCompile(`pid=(\d+)`)

// fiberDevices reads FIBERD_DEVICES from the environment counter fiber f
// started with (a forked fiber's is its zygote's).
func fiberDevices(t *testing.T, _ backend.Backend, f api.CloneResponse) []string {
	t.Helper()
	body, err := fiberGet(t, f, "/")
	m := pidField.FindStringSubmatch(body)
	if err != nil || m == nil {
		t.Fatalf("GET / of %s: %q, %v", f.FiberID, body, err)
	}
	env, err := os.ReadFile("/proc/" + m[1] + "/environ")
	must(t, err)
	return envDevices(env)
}

// killZygote kills grant uid's zygote, a child of this process (the
// agent runs in the test) started without LISTEN_FDS, with SIGKILL.
func killZygote(t *testing.T, _ backend.Backend, uid string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procrec.ReadStat(pid)
		if err != nil || st.PPid != os.Getpid() || st.Zombie {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !bytes.Contains(env, []byte("FIBERD_GRANT_UID="+uid+"\x00")) || bytes.Contains(env, []byte("LISTEN_FDS=")) {
			continue
		}
		must(t, syscall.Kill(pid, syscall.SIGKILL))
		return
	}
	t.Fatalf("no zygote of grant %s found", uid)
}

// -------------------------------------------------------------------- runs

func TestFakeHome(t *testing.T) {
	for _, b := range []Backend{fakeBackend, procBackend, procSpares, execBackend, procIsolated, execIsolated} {
		t.Run(b.Name, func(t *testing.T) { Run(t, fakeHome, b) })
	}
}

func TestStandaloneHome(t *testing.T) {
	for _, b := range []Backend{fakeBackend, procBackend, execBackend} {
		t.Run(b.Name, func(t *testing.T) { Run(t, standaloneHome, b) })
	}
}
