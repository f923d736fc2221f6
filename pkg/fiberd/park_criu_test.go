package fiberd

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/endpoint"
	"fiberd.io/fiberd/pkg/template"
)

// criuForTest returns the CRIU the park tests run with: $FIBERD_CRIU, else
// where hack/criu.sh installs it. It skips, naming what is missing, when
// there is none or the test is not root; with FIBERD_CRIU_REQUIRED=1 (as
// .ci/run sets it) it fails instead.
func criuForTest(t *testing.T) string {
	t.Helper()
	miss := func(format string, a ...any) {
		t.Helper()
		if os.Getenv("FIBERD_CRIU_REQUIRED") != "" {
			t.Fatalf(format, a...)
		}
		t.Skipf(format, a...)
	}
	if runtime.GOOS != "linux" {
		miss("parking runs on Linux only")
	}
	path := os.Getenv("FIBERD_CRIU")
	if path == "" {
		path = backend.DefaultCRIUPath()
	}
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		miss("criu not found at %q (%v): build it with hack/criu.sh (make criu), or set FIBERD_CRIU", path, err)
	}
	if os.Geteuid() != 0 {
		miss("parking needs root (CRIU dumps and restores processes)")
	}
	return path
}

// criuEnv is an agent on the real proc backend with CRIU, serving a
// template of the example counters (kind "c" or "python") at family.
func criuEnv(t *testing.T, kind string, family endpoint.Family) (*env, string) {
	t.Helper()
	criu := criuForTest(t)
	root := repotest.Root(t)
	var spec template.Spec
	switch kind {
	case "c":
		bin, err := devkit.BuildCounterC(root, t.TempDir())
		if err != nil {
			t.Skipf("cannot build the C counter: %v", err)
		}
		spec = devkit.CounterCSpec(bin, true, "--dirty-mib", "1")
	case "python":
		py, err := devkit.PythonInterpreter()
		if err != nil {
			t.Skipf("no python3: %v", err)
		}
		spec = devkit.CounterPySpec(root, py, true)
	}
	proc, err := backend.NewProc(backend.Config{Logger: testr.New(t), CRIU: criu})
	must(t, err)
	var ref string
	e := newEnv(t, func(e *env) {
		_ = e.warm.Close()
		e.warm = nil
		e.cfg.Warm = proc
		e.cfg.EndpointFamily = family
		if family != endpoint.Unix {
			e.cfg.PortRange = endpoint.PortRange{First: 23300, Last: 23399}
		}
		b, err := devkit.WriteSpec(e.cfg.Templates, "counter-"+kind, spec)
		must(t, err)
		ref = "counter-" + kind + "@sha256:" + template.Digest(b)
	})
	return e, ref
}

var answerRE = regexp.MustCompile(`pid=(\d+) count=(\d+)`)

// answer asks the fiber at ep for / and returns the count and the pid it
// answered with (the pid in its own namespace: without isolation, fiberd's).
func answer(t *testing.T, ep string) (count, pid int) {
	t.Helper()
	body := fiberGet(t, ep, "/")
	m := answerRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("the fiber at %s answered %q, without a pid and a count", ep, body)
	}
	fmt.Sscan(m[1], &pid)
	fmt.Sscan(m[2], &count)
	return count, pid
}

// TestParkResumeWithCRIU parks the example counters (C on a unix socket and
// on TCP, Python on a unix socket) through the API with the real CRIU, and
// resumes each by a Clone of its session, twice: the fiber answers with its
// memory as it was (the count goes on), its process is gone while parked,
// the status shows it parked, and nothing is left once it is released.
func TestParkResumeWithCRIU(t *testing.T) {
	for _, c := range []struct {
		kind   string
		family endpoint.Family
	}{{"c", endpoint.Unix}, {"c", endpoint.Inet4}, {"python", endpoint.Unix}} {
		t.Run(c.kind+"-"+c.family.String(), func(t *testing.T) {
			e, ref := criuEnv(t, c.kind, c.family)
			if st := e.status(); !st.Checkpoint.Available {
				t.Fatalf("checkpoint tier absent: %s", st.Checkpoint.Reason)
			}
			f := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1", templ(ref)), Session: "s"}).clone(t)
			if g := e.grantStatus("g1"); g.Tier != "CHECKPOINT" {
				t.Fatalf("grant tier %s, want CHECKPOINT", g.Tier)
			}
			answer(t, f.Endpoint)
			n, pid := answer(t, f.Endpoint)
			if n != 2 {
				t.Fatalf("count %d, want 2", n)
			}
			want := 2
			for round := 1; round <= 2; round++ {
				p := e.parked(f.FiberID)
				if p.ImageBytes <= 0 || p.OwnBytes <= 0 || p.ImageBytes < p.OwnBytes {
					t.Fatalf("park answered %+v", p)
				}
				waitNoProcess(t, pid)
				if g := e.grantStatus("g1"); g.Running != 0 || g.Parked != 1 {
					t.Fatalf("status after park %d: running %d parked %d", round, g.Running, g.Parked)
				}
				r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1", Session: "s"})
				if r.status != 200 {
					t.Fatalf("resume %d: %d %s", round, r.status, r.body)
				}
				res := r.clone(t)
				if res.Kind != api.KindResume || res.Fence.Seq <= f.Fence.Seq {
					t.Fatalf("resume %d = %+v, want kind resume with a newer fence than %s", round, res, f.FiberID)
				}
				if c.family != endpoint.Unix && res.Endpoint != f.Endpoint {
					t.Errorf("TCP fiber resumed at %s, parked at %s", res.Endpoint, f.Endpoint)
				}
				want++
				n, rpid := answer(t, res.Endpoint)
				if n != want {
					t.Fatalf("resumed fiber counted %d, want %d: its memory was not kept", n, want)
				}
				e.eventually("the spent image deleted", func() bool { return len(e.images()) == 0 })
				f, pid = res, rpid
			}
			if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: f.FiberID}); r.status != 200 {
				t.Fatalf("release: %d %s", r.status, r.body)
			}
			waitNoProcess(t, pid)
		})
	}
}

// TestResumeOfADamagedImage: an image whose pages were cut short cannot be
// resumed: the Clone of its session is a miss that says so, the image is
// deleted, and the next Clone of the session starts it afresh.
func TestResumeOfADamagedImage(t *testing.T) {
	e, ref := criuEnv(t, "c", endpoint.Unix)
	f := e.cloneReq(e.unix, api.CloneRequest{Grant: e.mint("g1", templ(ref)), Session: "s"}).clone(t)
	answer(t, f.Endpoint)
	e.parked(f.FiberID)
	imgs := e.images()
	if len(imgs) != 1 {
		t.Fatalf("images %v", imgs)
	}
	dir := filepath.Join(e.stateDir, "private", "parked", imgs[0])
	pages, _ := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if len(pages) == 0 {
		t.Fatalf("no pages file in %s", dir)
	}
	must(t, os.Truncate(pages[0], 4096))
	r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1", Session: "s"})
	if r.status != 503 || !strings.Contains(r.apiError(t).Message, "deleted") {
		t.Fatalf("clone of a damaged parked session: %d %s, want a miss saying the image is deleted", r.status, r.body)
	}
	if imgs := e.images(); len(imgs) != 0 {
		t.Fatalf("the damaged image was kept: %v", imgs)
	}
	n := e.cloneReq(e.unix, api.CloneRequest{GrantUID: "g1", Session: "s"}).clone(t)
	if c, _ := answer(t, n.Endpoint); n.Kind != api.KindCreate || c != 1 {
		t.Fatalf("clone after the damaged image = %+v, want a new fiber counting from 1", n)
	}
}

// waitNoProcess waits until pid is gone (or a zombie).
func waitNoProcess(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			return
		}
	}
	t.Fatalf("process %d still runs", pid)
}
