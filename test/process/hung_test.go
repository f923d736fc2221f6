package process

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/client"
	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// TestHungTemplateDelaysNobody runs fiberd -dev beside a template whose
// zygote never says READY (it sleeps) and checks what issue 13 measured:
// the C counter's zygote, killed while the hung one is warming, is warm
// again before that warm gives up (the hung zygote is still the same
// process then), and a Clone of a grant fiberd has not seen, with
// deadlineMs 50, answers a miss (503 DEFERRED_FALLBACK, never a 500). It
// logs the recovery time and the Clone's latency.
func TestHungTemplateDelaysNobody(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("fiberd runs fibers on Linux only")
	}
	for _, tool := range []string{"go", "cc", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH: the test builds fiberd and the example templates with it", tool)
		}
	}
	root := repotest.Root(t)
	bin := t.TempDir()
	build(t, root, bin)
	state := t.TempDir()
	specs := filepath.Join(state, "specs")
	if err := os.MkdirAll(specs, 0o755); err != nil {
		t.Fatal(err)
	}
	counter, err := devkit.BuildCounterC(root, filepath.Join(state, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	py, err := devkit.PythonInterpreter()
	if err != nil {
		t.Skip(err)
	}
	// fiberd isolates grants by default: the Python example must be where a
	// grant's own user can read it, which a checkout under /tmp or /root is not.
	pySrc := root
	if shared, err := devkit.SharePythonExample(root); err == nil {
		pySrc = shared
	} else {
		t.Logf("the Python example runs from the checkout (%v)", err)
	}
	for name, s := range map[string]template.Spec{
		"counter-c":  devkit.CounterCSpec(counter, true, "--init-ms", "200"),
		"counter-py": devkit.CounterPySpec(pySrc, py, true, "--init-ms", "200"),
		"hung":       {Command: "/bin/sleep", Args: []string{"3600"}, Zygote: true},
	} {
		if _, err := devkit.WriteSpec(specs, name, s); err != nil {
			t.Fatal(err)
		}
	}
	d := startFiberd(t, root, bin, state, "none", "-templates", specs)
	st := d.waitWarm(t, "counter-c", "counter-py")
	uids := grantUIDs(st)
	hung := zygoteOf(t, uids["hung"], d.cmd.Process.Pid)
	if hung == nil {
		t.Fatal("the hung template's zygote is not running")
	}

	// A zygote killed beside the hung warm is warm again before that
	// warm gives up.
	c := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	z := zygoteOf(t, uids["counter-c"], d.cmd.Process.Pid)
	if z == nil {
		t.Fatal("the counter-c zygote is not running")
	}
	if err := syscall.Kill(z.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		// Warm with a new zygote: the killed one may linger a moment, and
		// the status say warm until its death is seen.
		if nz := zygoteOf(t, uids["counter-c"], d.cmd.Process.Pid); nz != nil && nz.pid != z.pid {
			if st, err := c.Status(ctx); err == nil && warmOf(st, uids["counter-c"]) {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatal("counter-c not warm again within 2 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("counter-c warm again %v after its zygote was killed, beside a hung template", time.Since(killed).Round(time.Millisecond))
	if !hung.alive() {
		t.Errorf("counter-c came back only after the hung template's warm gave up (its zygote %d is gone)", hung.pid)
	}

	// A Clone of a grant fiberd has not seen answers within its deadline.
	host, _ := os.Hostname()
	tok, code := d.ctl(t, "grant", "mint", "-key", filepath.Join(state, "dev", "issuer.jwk"), "-issuer", "https://fiberd.dev.invalid",
		"-audience", host, "-template", templateRef(st, uids["counter-py"]), "-uid", "fresh-1", "-max", "2")
	if code != 0 {
		t.Fatalf("fiberctl grant mint: exit %d", code)
	}
	start := time.Now()
	_, err = c.Clone(ctx, api.CloneRequest{Grant: strings.TrimSpace(string(tok)), DeadlineMs: 50})
	took := time.Since(start)
	var ae *client.Error
	if !errors.As(err, &ae) {
		t.Fatalf("clone of a new grant with deadlineMs 50 beside a hung template: %v, want a miss", err)
	}
	t.Logf("clone of a new grant with deadlineMs 50 beside a hung template: %d %s after %v", ae.Status, ae.Body.Code, took.Round(time.Millisecond))
	if ae.Status != 503 || ae.Body.Code != string(core.CodeDeferredFallback) {
		t.Errorf("clone of a new grant with deadlineMs 50: %d %s %q, want 503 DEFERRED_FALLBACK", ae.Status, ae.Body.Code, ae.Body.Message)
	}
	d.stop(t)
}

// zygoteOf is the running zygote of grant uid, a child of fiberd, or nil.
func zygoteOf(t *testing.T, uid string, fiberd int) *proc {
	t.Helper()
	for _, p := range runProcs(map[string]string{uid: uid}, fiberd) {
		if p.role == "zygote" {
			return &p
		}
	}
	return nil
}

// warmOf reports whether grant uid is warm in st.
func warmOf(st api.Status, uid string) bool {
	for _, g := range st.Grants {
		if g.UID == uid {
			return g.Warm
		}
	}
	return false
}

// templateRef is the template of grant uid in st.
func templateRef(st api.Status, uid string) string {
	for _, g := range st.Grants {
		if g.UID == uid {
			return g.Template
		}
	}
	return ""
}
