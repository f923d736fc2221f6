package backend

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if pyCopy != "" {
		os.RemoveAll(pyCopy)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// counterC builds examples/templates/c/counter.c (and testdata/attacker.c)
// with the C SDK, once per test binary, and returns the counter, or skips
// when cc is missing.
func counterC(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		tb.Skip("cc not found: the C zygote SDK and the C counter cannot be built")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "fiberd-backend-test-")
		if buildErr != nil {
			return
		}
		out, err := exec.Command("../../sdk/zygote/c/build.sh", buildDir, "../../examples/templates/c/counter.c", "testdata/attacker.c", "testdata/failingspare.c").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build.sh: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "counter")
}

// failingSpareC is testdata/failingspare.c built with the C SDK (see
// counterC).
func failingSpareC(tb testing.TB) string {
	return filepath.Join(filepath.Dir(counterC(tb)), "failingspare")
}

// attackerC is testdata/attacker.c built with the C SDK (see counterC).
func attackerC(tb testing.TB) string {
	return filepath.Join(filepath.Dir(counterC(tb)), "attacker")
}

var (
	pyOnce sync.Once
	pyPath string
)

// python returns the real python3 interpreter (not a shim), or skips.
func python(tb testing.TB) string {
	tb.Helper()
	pyOnce.Do(func() {
		out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
		if err == nil {
			pyPath = strings.TrimSpace(string(out))
		}
	})
	if pyPath == "" {
		tb.Skip("python3 not found: the Python zygote SDK cannot be tested")
	}
	return pyPath
}

func abs(tb testing.TB, rel string) string {
	p, err := filepath.Abs(rel)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// kind is one template flavour under test.
type kind struct {
	name string
	spec func(tb testing.TB, args ...string) template.Spec
}

var (
	kindC = kind{"c", func(tb testing.TB, args ...string) template.Spec {
		return template.Spec{Command: counterC(tb), Args: args, Zygote: true}
	}}
	kindPython = kind{"python", func(tb testing.TB, args ...string) template.Spec {
		return template.Spec{
			Command: python(tb),
			Args:    append([]string{"-u", abs(tb, "../../examples/templates/python/counter.py")}, args...),
			Env:     map[string]string{"PYTHONPATH": abs(tb, "../../sdk/zygote/python"), "PYTHONDONTWRITEBYTECODE": "1"},
			Zygote:  true,
		}
	}}
)

// quiet drops log lines. logr.Discard() has a nil sink, which Config reads
// as "unset" and replaces with klog, so tests use a sink that does nothing.
var quiet = funcr.New(func(prefix, args string) {}, funcr.Options{})

func testConfig() Config {
	return Config{Logger: quiet, WarmTimeout: 20 * time.Second, KillTimeout: 10 * time.Second}
}

func newBackend(tb testing.TB, tier core.Tier) Backend {
	tb.Helper()
	var (
		b   Backend
		err error
	)
	if tier == core.TierWarm {
		b, err = NewProc(testConfig())
	} else {
		b, err = NewExec(testConfig())
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return b
}

// uidFor makes a DNS-label grant uid unique to the test.
func uidFor(tb testing.TB) string {
	s := strings.ToLower(tb.Name())
	var b strings.Builder
	for _, r := range s {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	u := strings.Trim(b.String(), "-")
	if len(u) > 40 {
		u = u[len(u)-40:]
	}
	return strings.Trim(u, "-") + "-" + strconv.Itoa(os.Getpid()%100000)
}

func warm(tb testing.TB, b Backend, uid string, spec template.Spec, cgroupDir string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := b.Warm(ctx, WarmRequest{
		Grant:   core.Grant{UID: uid, Template: "counter@sha256:" + strings.Repeat("0", 64)},
		Spec:    spec,
		Cgroup:  cgroupDir,
		Devices: core.DeviceChannel{Kind: "static", Devices: []string{"/dev/null"}, Claims: []string{"claim-a"}},
		RunDir:  tb.TempDir(),
	})
	if err != nil {
		tb.Fatalf("Warm: %v", err)
	}
}

// endpoint is a bound listener: the file handed to Clone and how to dial it.
type endpoint struct {
	file    *os.File
	network string
	addr    string
}

func listen(tb testing.TB, unix bool) endpoint {
	tb.Helper()
	var (
		l   net.Listener
		err error
	)
	if unix {
		dir, derr := os.MkdirTemp("", "fz")
		if derr != nil {
			tb.Fatal(derr)
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
		l, err = net.Listen("unix", filepath.Join(dir, "s"))
	} else {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false) // as pkg/endpoint binds them: CRIU cannot park MPTCP
		l, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	}
	if err != nil {
		tb.Fatal(err)
	}
	var f *os.File
	switch l := l.(type) {
	case *net.UnixListener:
		l.SetUnlinkOnClose(false)
		f, err = l.File()
	case *net.TCPListener:
		f, err = l.File()
	}
	if err != nil {
		tb.Fatal(err)
	}
	ep := endpoint{file: f, network: l.Addr().Network(), addr: l.Addr().String()}
	l.Close() // the file keeps the socket bound and listening
	tb.Cleanup(func() { f.Close() })
	return ep
}

// get sends GET path and returns the body ("" and the error when the fiber
// closed the connection without answering).
func get(ep endpoint, path string) (string, error) {
	c, err := net.DialTimeout(ep.network, ep.addr, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: fiber\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		return "", err
	}
	_, body, ok := bytes.Cut(b, []byte("\r\n\r\n"))
	if !ok || !bytes.HasPrefix(b, []byte("HTTP/1.")) {
		return "", fmt.Errorf("no HTTP answer: %q", b)
	}
	return string(body), nil
}

// fields parses "k=v k=v" bodies.
func fields(body string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Fields(body) {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// nextExit waits for an exit.
func nextExit(tb testing.TB, b Backend) Exit {
	tb.Helper()
	select {
	case e, ok := <-b.Exits():
		if !ok {
			tb.Fatal("Exits closed")
		}
		return e
	case <-time.After(30 * time.Second):
		tb.Fatal("no Exit within 30s")
	}
	return Exit{}
}

// procStat returns the state letter and parent of pid, ok false when gone.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid, true
}

// waitGone waits until pid no longer exists; a zombie counts as still
// there. Orphans of a killed zygote are reaped by PID 1, which may take a
// few seconds.
func waitGone(tb testing.TB, pid int) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, ok := procStat(pid); !ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, ppid, _ := procStat(pid)
	tb.Fatalf("process %d still exists (state %c, parent %d)", pid, st, ppid)
}

// strays lists live processes carrying FIBERD_GRANT_UID=uid, and zombies
// whose parent is this test process.
func strays(uid string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	want := []byte("FIBERD_GRANT_UID=" + uid + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ppid, ok := procStat(pid)
		if !ok {
			continue
		}
		if st == 'Z' && ppid == self {
			out = append(out, fmt.Sprintf("zombie %d", pid))
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && bytes.Contains(env, want) {
			out = append(out, fmt.Sprintf("process %d (state %c)", pid, st))
		}
	}
	return out
}

// noStrays waits until no process of the grant is left.
func noStrays(tb testing.TB, uid string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var left []string
	for time.Now().Before(deadline) {
		if left = strays(uid); len(left) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("processes of grant %s remain: %v", uid, left)
}

func fence(uid string, seq uint64) core.Fence { return core.Fence{GrantUID: uid, Epoch: 1, Seq: seq} }
