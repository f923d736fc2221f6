package fiberd

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/endpoint"
)

// serveFD3 is a socket-activated HTTP server: it answers every connection
// on the listener it inherits as descriptor 3.
const serveFD3 = `import socket
s = socket.socket(fileno=3)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    c.close()
`

// TestExecBackendEndToEnd clones a socket-activated template on the real
// exec backend through the HTTP handler, dials the fiber's endpoint, and
// releases it.
func TestExecBackendEndToEnd(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: the end-to-end template needs it")
	}
	out, err := exec.Command(py, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Skipf("python3 does not run: %v", err)
	}
	py = strings.TrimSpace(string(out))
	real, err := backend.NewExec(backend.Config{Logger: testr.New(t)})
	if err != nil {
		t.Skipf("exec backend unavailable: %v", err)
	}
	spec, err := json.Marshal(map[string]any{"command": py, "args": []string{"-c", serveFD3}, "zygote": false})
	must(t, err)
	var ref string
	e := newEnv(t, noWarm(), func(e *env) {
		_ = e.basic.Close()
		e.basic = nil
		e.cfg.Basic = real
		e.cfg.Clock = clock.RealClock{}
		e.clk.SetTime(time.Now())
		ref = writeTemplate(t, e.cfg.Templates, "hello", string(spec))
	})
	r := e.cloneReq(e.tcp, api.CloneRequest{Grant: e.mint("g1", templ(ref))})
	if r.status != 200 {
		t.Fatalf("clone: %d %s", r.status, r.body)
	}
	c := r.clone(t)
	network, addr, err := endpoint.Parse(c.Endpoint)
	must(t, err)
	if network != "unix" || filepath.Dir(addr) != filepath.Join(e.stateDir, "run", "fibers") {
		t.Fatalf("endpoint %s", c.Endpoint)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}, DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://fiber/")
	must(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" {
		t.Fatalf("fiber answered %q", b)
	}
	if st := e.status(); st.Grants[0].Tier != "BASIC" || st.Grants[0].Running != 1 {
		t.Fatalf("status %+v", st.Grants)
	}
	if r := e.post(e.unix, "/v1/release", api.FiberRequest{FiberID: c.FiberID}); r.status != 200 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	if conn, err := net.DialTimeout(network, addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("released fiber's endpoint still answers")
	}
}
