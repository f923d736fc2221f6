package backend_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"fiberd.io/fiberd/internal/devkit"
	"fiberd.io/fiberd/internal/repotest"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/backendtest"
	"fiberd.io/fiberd/pkg/template"
)

// TestCheckpointerContract: the proc backend's Checkpointer, with the real
// CRIU, keeps the contract the fake's keeps (pkg/backend/fake's
// TestCheckpointerContract), on the C counter of examples/templates, each
// fiber dirtying 1 MiB of its own. It skips without CRIU or root, saying
// which, unless FIBERD_CRIU_REQUIRED is set.
func TestCheckpointerContract(t *testing.T) {
	criu := backendtest.CRIU(t)
	bin, err := devkit.BuildCounterC(repotest.Root(t), t.TempDir())
	if err != nil {
		t.Skipf("cannot build the C counter (it needs cc): %v", err)
	}
	quiet := funcr.New(func(string, string) {}, funcr.Options{})
	newProc := func(t *testing.T, criu string) backendtest.Checkpointing {
		t.Helper()
		p, err := backend.NewProc(backend.Config{Logger: quiet, CRIU: criu, WarmTimeout: 20 * time.Second, KillTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	backendtest.CheckpointerContract(t, backendtest.Subject{
		New:    func(t *testing.T) backendtest.Checkpointing { return newProc(t, criu) },
		Absent: func(t *testing.T) backendtest.Checkpointing { return newProc(t, "") },
		Spec:   func(*testing.T) template.Spec { return devkit.CounterCSpec(bin, true, "--dirty-mib", "1") },
		Memory: counterMemory,
	})
}

// counterMemory asks the C counter serving at the unix socket addr for /:
// it answers "fence=<f> pid=<n> count=<n> payload=<hex|-> ...", the
// payload as FIBERD_PAYLOAD handed it over at the fiber's start.
func counterMemory(t *testing.T, _ backendtest.Checkpointing, f backend.Fiber, addr string) backendtest.Memory {
	t.Helper()
	body, err := getUnix(addr, "/")
	if err != nil {
		t.Fatalf("GET / of fiber %s at %s: %v", f.Fence, addr, err)
	}
	m := backendtest.Memory{Count: -1}
	for _, kv := range strings.Fields(body) {
		switch k, v, _ := strings.Cut(kv, "="); k {
		case "count":
			m.Count, err = strconv.Atoi(v)
		case "payload":
			m.Payload = strings.TrimPrefix(v, "-")
		}
	}
	if err != nil || m.Count < 0 {
		t.Fatalf("fiber %s answered %q, without a count", f.Fence, body)
	}
	return m
}

// getUnix sends GET path on a fresh connection to the unix socket addr and
// returns the answer's body; the connection is closed before it returns
// (an open one would make a park ErrBusy).
func getUnix(addr, path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: fiber\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		return "", err
	}
	_, body, ok := bytes.Cut(b, []byte("\r\n\r\n"))
	if !ok {
		return "", fmt.Errorf("no HTTP answer: %q", b)
	}
	return string(body), nil
}
