package fiberd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/backend"
	"fiberd.io/fiberd/pkg/backend/fake"
)

// patience is how long these tests wait, in real time, for what the limits
// promise within a fraction of a second: generous, for a loaded machine.
const patience = 10 * time.Second

// withLimits sets the agent's Limits.
func withLimits(l Limits) envOption {
	return withConfig(func(c *Config) { c.Limits = l })
}

// dialRaw opens a plain socket to the agent's TCP listener ("tcp") or unix
// socket ("unix"), closed when the test ends.
func (e *env) dialRaw(network string) net.Conn {
	e.t.Helper()
	addr := e.agent.SocketPath()
	if network == "tcp" {
		addr = e.agent.Addr().String()
	}
	c, err := net.DialTimeout(network, addr, patience)
	must(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	return c
}

// hostOf is the Host a client of the listener sends: its address on TCP,
// anything on the unix socket.
func (e *env) hostOf(network string) string {
	if network == "tcp" {
		return e.agent.Addr().String()
	}
	return "fiberd"
}

// readResponse reads one HTTP response from c within patience.
func readResponse(t testing.TB, c net.Conn, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	must(t, c.SetReadDeadline(time.Now().Add(patience)))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", patience, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// closedByPeer reports whether the agent closes c within patience.
func closedByPeer(c net.Conn, br *bufio.Reader) error {
	_ = c.SetReadDeadline(time.Now().Add(patience))
	_, err := br.ReadByte()
	switch {
	case err == nil:
		return errors.New("the agent sent more bytes instead of closing")
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("still open after %v", patience)
	}
	return nil // EOF or reset: closed
}

// TestSlowBodyIsCut: a request that declares Content-Length: 1000 and sends
// one byte is answered 408 once BodyTimeout passes and its connection
// closed, on the TCP listener and the unix socket alike.
func TestSlowBodyIsCut(t *testing.T) {
	e := newEnv(t, withLimits(Limits{BodyTimeout: 300 * time.Millisecond}))
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c := e.dialRaw(network)
			fmt.Fprintf(c, "POST /v1/clone HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", e.hostOf(network))
			br := bufio.NewReader(c)
			resp, body := readResponse(t, c, br)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, api.CodeInvalid) {
				t.Errorf("slow body answered %d %s, want 408 INVALID", resp.StatusCode, body)
			}
			if err := closedByPeer(c, br); err != nil {
				t.Errorf("slow body's connection: %v", err)
			}
		})
	}
}

// TestIdleKeepAliveIsClosed: a kept-alive connection with no new request
// is closed after IdleTimeout; one that never sends a byte after
// HeaderTimeout.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	e := newEnv(t, withLimits(Limits{IdleTimeout: 300 * time.Millisecond, HeaderTimeout: 300 * time.Millisecond}))
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c := e.dialRaw(network)
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", e.hostOf(network))
			br := bufio.NewReader(c)
			if resp, body := readResponse(t, c, br); resp.StatusCode != 200 || resp.Close {
				t.Fatalf("healthz: %d close=%v %s, want 200 kept alive", resp.StatusCode, resp.Close, body)
			}
			if err := closedByPeer(c, br); err != nil {
				t.Errorf("idle keep-alive connection: %v", err)
			}
			silent := e.dialRaw(network)
			if err := closedByPeer(silent, bufio.NewReader(silent)); err != nil {
				t.Errorf("connection that never sent a byte: %v", err)
			}
		})
	}
}

// openFDs counts this process's open descriptors: the agent's and the
// test's own.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// TestThousandIdleConnections: 1,000 connections that send nothing cost
// the agent at most MaxConns descriptors (the rest wait in the kernel's
// accept queue), each for at most HeaderTimeout; once they are gone the
// agent's descriptors are back where they were and it serves again. The
// agent runs in this process, so its descriptors are this process's minus
// the test's own 1,000. MaxConnsPerIP is MaxConns here, so that the
// connections, all from 127.0.0.1, meet the listener's cap
// (TestPlaintextConnectionsPerAddress has the address's).
func TestThousandIdleConnections(t *testing.T) {
	const conns, maxConns, slack = 1000, 50, 10
	e := newEnv(t, withLimits(Limits{MaxConns: maxConns, MaxConnsPerIP: maxConns, HeaderTimeout: 2 * time.Second}))
	if r := e.do(e.tcp, http.MethodGet, "/healthz", nil); r.status != 200 {
		t.Fatalf("healthz: %d", r.status)
	}
	e.tcp.Transport.(*http.Transport).CloseIdleConnections()
	time.Sleep(100 * time.Millisecond) // the agent closes its side
	base := openFDs(t)

	clients := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
		must(t, err)
		clients = append(clients, c)
	}
	// Let the agent accept all it will; sample its descriptors a while.
	worst := 0
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		worst = max(worst, openFDs(t)-base-len(clients))
	}
	if worst > maxConns+slack {
		t.Errorf("with %d idle connections the agent held %d more descriptors, want at most MaxConns %d (+%d)", conns, worst, maxConns, slack)
	}

	// Bounded time: the connections the agent accepted are closed after
	// HeaderTimeout.
	closed := map[int]bool{}
	for end := time.Now().Add(patience); len(closed) < maxConns && time.Now().Before(end); {
		for i, c := range clients {
			if closed[i] {
				continue
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				closed[i] = true
			}
		}
	}
	if len(closed) < maxConns {
		t.Errorf("%d of the idle connections closed by the agent within %v, want at least MaxConns %d", len(closed), patience, maxConns)
	}

	for _, c := range clients {
		c.Close()
	}
	clients = nil
	e.eventually("the agent's descriptors back to their count", func() bool { return openFDs(t) <= base+slack })
	if r := e.do(e.tcp, http.MethodGet, "/healthz", nil); r.status != 200 {
		t.Errorf("healthz after the flood: %d", r.status)
	}
}

// TestWatchOutlivesRequestTimeouts: a watch stream stays open past the
// body, write and idle timeouts, still carries changes, and sends an empty
// line every WatchKeepAlive (on the agent's clock) while nothing changes.
func TestWatchOutlivesRequestTimeouts(t *testing.T) {
	short := 200 * time.Millisecond
	e := newEnv(t, withLimits(Limits{BodyTimeout: short, WriteTimeout: short, IdleTimeout: short, WatchKeepAlive: time.Minute}))
	req, err := http.NewRequest(http.MethodGet, e.tcpBase+"/v1/watch", nil)
	must(t, err)
	resp, err := e.tcp.Do(req)
	must(t, err)
	defer resp.Body.Close()
	lines := watchLines(resp.Body)
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("watch ended waiting for %s", what)
			}
			return l
		case <-time.After(patience):
			t.Fatalf("no watch line for %s", what)
		}
		return ""
	}
	if l := next("the first status"); !strings.HasPrefix(l, "{") {
		t.Fatalf("first line %q", l)
	}
	time.Sleep(5 * short)
	e.deliver(e.mint("g1"))
	for l := next("the grant"); !strings.Contains(l, `"uid":"g1"`); l = next("the grant") {
	}
	e.clk.Step(time.Minute)
	for l := next("a keep-alive"); l != ""; l = next("a keep-alive") {
	}
}

// TestLongCloneOutlivesBodyTimeout: a Clone that takes longer than
// BodyTimeout and WriteTimeout (but not its own deadline) is served: the
// read deadline ends with the body, and the write deadline counts the
// Clone's.
func TestLongCloneOutlivesBodyTimeout(t *testing.T) {
	short := 200 * time.Millisecond
	e := newEnv(t, withLimits(Limits{BodyTimeout: short, WriteTimeout: short}), withHooks(fake.Hooks{
		Clone: func(ctx context.Context, _ backend.CloneRequest) error {
			select {
			case <-time.After(5 * short):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	}))
	uid := e.deliver(e.mint("g1"))
	if r := e.cloneReq(e.tcp, api.CloneRequest{GrantUID: uid}); r.status != 200 {
		t.Fatalf("a Clone of %v: %d %s, want 200", 5*short, r.status, r.body)
	}
}
