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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// Issue 24: no caller can spend another's budget. These tests use only
// loopback: a second remote address is 127.0.0.2, which Linux routes to
// the loopback device like 127.0.0.1.

// otherIP is the second loopback address the tests call from.
const otherIP = "127.0.0.2"

// tcpFrom is an HTTP client of the agent's TCP listener whose connections
// come from local address ip, giving up after patience. The test is
// skipped when ip cannot be bound.
func (e *env) tcpFrom(ip string) *http.Client {
	e.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: patience}
	c, err := d.Dial("tcp", e.agent.Addr().String())
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		e.t.Skipf("cannot call from %s: %v", ip, err)
	}
	must(e.t, err)
	c.Close()
	tr := &http.Transport{DialContext: d.DialContext}
	e.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// eachConn runs f on every connection of conns at once and waits for all.
func eachConn(conns []net.Conn, f func(net.Conn)) {
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { f(c) })
	}
	wg.Wait()
}

// TestThrashBudgetIsPerCaller: Clones naming a grant that does not exist,
// from one address on the plaintext listener, spend that address's thrash
// budget and no one else's: the unix socket's caller (its peer uid) has
// all of its own and is served, another address has its own, and Clones
// carrying a grant's token spend the grant's.
func TestThrashBudgetIsPerCaller(t *testing.T) {
	const burst = 5
	e := newEnv(t, withConfig(func(c *Config) { c.ThrashRate, c.ThrashBurst = 0.001, burst }))
	uid := e.deliver(e.mint("g1"))
	bogus := api.CloneRequest{GrantUID: "no-such-grant"}
	shed := func(r reply, whose string) {
		t.Helper()
		body := r.apiError(t)
		if r.status != http.StatusTooManyRequests || body.Code != string(core.CodeShed) || r.header.Get("Retry-After") == "" {
			t.Fatalf("got %d %s, want 429 SHED with Retry-After", r.status, r.body)
		}
		if !strings.Contains(body.Message, "thrash budget") || !strings.Contains(body.Message, whose) {
			t.Errorf("SHED %q does not say it is the thrash budget of %s", body.Message, whose)
		}
	}

	for i := range burst {
		if r := e.cloneReq(e.tcp, bogus); r.status != http.StatusServiceUnavailable {
			t.Fatalf("bogus Clone %d from 127.0.0.1: %d %s, want 503 DEFERRED_FALLBACK", i, r.status, r.body)
		}
	}
	shed(e.cloneReq(e.tcp, bogus), "remote address 127.0.0.1")

	served := 0
	for i := range burst {
		r := e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"})
		if r.status == http.StatusOK {
			served++
		} else {
			t.Errorf("unix socket Clone %d after 127.0.0.1 spent its budget: %d %s, want 200", i, r.status, r.body)
		}
	}
	t.Logf("%d of %d Clones on the unix socket served", served, burst)
	shed(e.cloneReq(e.unix, api.CloneRequest{GrantUID: uid, Session: "s"}), "unix socket peer uid "+strconv.Itoa(os.Getuid()))

	if r := e.cloneReq(e.tcpFrom(otherIP), bogus); r.status != http.StatusServiceUnavailable {
		t.Errorf("bogus Clone from %s: %d %s, want 503: its budget is its own", otherIP, r.status, r.body)
	}

	// A token that verifies: the grant pays, whichever connection it came
	// by (127.0.0.1's budget is spent).
	tok := e.mint("g1")
	for i := range burst {
		if r := e.cloneReq(e.tcp, api.CloneRequest{Grant: tok, Session: "s"}); r.status != http.StatusOK {
			t.Errorf("Clone %d with g1's token from 127.0.0.1: %d %s, want 200 on the grant's budget", i, r.status, r.body)
		}
	}
	shed(e.cloneReq(e.tcp, api.CloneRequest{Grant: tok, Session: "s"}), `grant "g1"`)
}

// TestTLSHandshakesHaveTheirOwnShare: 1,000 connections that never begin
// a TLS handshake (no client certificate) keep neither a client with a
// certificate from being served nor, past the handshake deadline
// (HeaderTimeout) or the arrival of newer ones, a descriptor of the agent;
// they hold at most MaxHandshakes beside the MaxConns of the handshaken.
func TestTLSHandshakesHaveTheirOwnShare(t *testing.T) {
	const conns, maxConns, slack = 1000, 20, 10
	opt, client := tlsSetup(t)
	e := newEnv(t, opt, withLimits(Limits{MaxConns: maxConns, HeaderTimeout: time.Second}))
	authed := client(true)
	authed.Timeout = patience
	url := "https://" + e.agent.Addr().String()
	get := func(what string) {
		t.Helper()
		resp, err := authed.Get(url + "/v1/status")
		if err != nil {
			t.Fatalf("%s: a client with a certificate not served within %v: %v", what, patience, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(b), `"redacted":true`) {
			t.Fatalf("%s: %d %s, want 200 and the whole status", what, resp.StatusCode, b)
		}
	}
	get("before")
	authed.Transport.(*http.Transport).CloseIdleConnections()
	time.Sleep(100 * time.Millisecond) // the agent closes its side
	base := openFDs(t)

	idle := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
		must(t, err)
		idle = append(idle, c)
	}
	get("with 1,000 idle connections open")
	worst := 0
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		worst = max(worst, openFDs(t)-base-len(idle))
	}
	if bound := DefaultMaxHandshakes + maxConns + slack; worst > bound {
		t.Errorf("with %d idle connections the agent held %d more descriptors, want at most MaxHandshakes + MaxConns (%d)", conns, worst, bound)
	}

	// Every idle connection is closed by the agent: by newer ones, or at
	// the handshake deadline.
	var open atomic.Int32
	eachConn(idle, func(c net.Conn) {
		if err := closedByPeer(c, bufio.NewReader(c)); err != nil {
			open.Add(1)
		}
	})
	if open := open.Load(); open > 0 {
		t.Errorf("%d of %d idle connections still open after %v", open, conns, patience)
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil

	// One idle connection alone: the handshake deadline closes it.
	c, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
	must(t, err)
	defer c.Close()
	if err := closedByPeer(c, bufio.NewReader(c)); err != nil {
		t.Errorf("a connection that never began its handshake: %v", err)
	}
	get("after")
}

// TestPlaintextConnectionsPerAddress: on the plaintext listener one
// address holds at most MaxConnsPerIP (a quarter of MaxConns by default)
// of its connections; those past it are answered 429 SHED and closed, and
// another address, and the unix socket, are served while they are open.
func TestPlaintextConnectionsPerAddress(t *testing.T) {
	const conns, maxConns = 100, 20
	const perIP = maxConns / 4 // the default MaxConnsPerIP
	e := newEnv(t, withLimits(Limits{MaxConns: maxConns, HeaderTimeout: time.Minute}))
	other := e.tcpFrom(otherIP)

	idle := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
		must(t, err)
		idle = append(idle, c)
	}
	for name, c := range map[string]*http.Client{otherIP: other, "the unix socket": e.unix} {
		if r := e.do(c, http.MethodGet, "/healthz", nil); r.status != 200 {
			t.Errorf("%s with %d idle connections from 127.0.0.1 open: %d %s", name, conns, r.status, r.body)
		}
	}

	// Past the first perIP, each idle connection is answered 429 and
	// closed; perIP stay open (until the test closes them).
	var refused atomic.Int32
	refusal := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(patience))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return false // still open, closed by the test
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(string(b), `"code":"SHED"`) || !strings.Contains(string(b), "remote address 127.0.0.1") ||
			!strings.Contains(string(b), "MaxConnsPerIP") {
			t.Errorf("a connection past the cap: %d %s, want 429 SHED naming the address and the cap", resp.StatusCode, b)
		}
		if err := closedByPeer(c, br); err != nil {
			t.Errorf("a connection past the cap: %v", err)
		}
		return true
	}
	var readers sync.WaitGroup
	for _, c := range idle {
		readers.Go(func() {
			if refusal(c) {
				refused.Add(1)
			}
		})
	}
	e.eventually(fmt.Sprintf("%d of the connections from 127.0.0.1 refused", conns-perIP), func() bool { return refused.Load() >= conns-perIP })
	c, err := net.DialTimeout("tcp", e.agent.Addr().String(), patience)
	must(t, err)
	defer c.Close()
	if !refusal(c) {
		t.Errorf("one more connection from 127.0.0.1 not refused")
	}
	for _, c := range idle {
		c.Close()
	}
	readers.Wait()
	if n := int(refused.Load()); n != conns-perIP {
		t.Errorf("of %d connections from 127.0.0.1, %d refused; want all but %d", conns, n, perIP)
	}
	e.eventually("127.0.0.1 served once its connections closed", func() bool {
		resp, err := e.tcp.Get(e.tcpBase + "/healthz") // a refusal may reach it as a reset
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// TestWatchesPerCaller: a caller holds at most MaxWatches watch streams;
// one more is 429 SHED, saying why, while other callers (another address,
// the unix socket) still watch, and the caller watches again once it
// closed one.
func TestWatchesPerCaller(t *testing.T) {
	const bound = 40 // more than the cap
	e := newEnv(t)
	watch := func(c *http.Client) (*http.Response, func()) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		base := e.tcpBase
		if c == e.unix {
			base = "http://fiberd"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/watch", nil)
		must(t, err)
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("watch: %v", err)
		}
		stop := func() { resp.Body.Close(); cancel() }
		t.Cleanup(stop)
		if resp.StatusCode == 200 {
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "{") {
				t.Fatalf("watch's first line %q: %v", line, err)
			}
		}
		return resp, stop
	}

	var (
		streams []func()
		refused *http.Response
	)
	for len(streams) < bound {
		resp, stop := watch(e.tcp)
		if resp.StatusCode != 200 {
			refused = resp
			break
		}
		streams = append(streams, stop)
	}
	if refused == nil {
		t.Fatalf("%d watch streams from 127.0.0.1 all served, want a refusal past the cap of each caller", bound)
	}
	b, _ := io.ReadAll(refused.Body)
	if refused.StatusCode != http.StatusTooManyRequests || refused.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(b), `"code":"SHED"`) || !strings.Contains(string(b), "remote address 127.0.0.1") ||
		!strings.Contains(string(b), "MaxWatches") {
		t.Errorf("watch %d from 127.0.0.1: %d %s, want 429 SHED naming the caller and the cap", len(streams)+1, refused.StatusCode, b)
	}
	t.Logf("127.0.0.1 holds %d watch streams", len(streams))

	for name, c := range map[string]*http.Client{otherIP: e.tcpFrom(otherIP), "the unix socket": e.unix} {
		if resp, _ := watch(c); resp.StatusCode != 200 {
			t.Errorf("watch from %s while 127.0.0.1 holds its cap: %d", name, resp.StatusCode)
		}
	}

	streams[0]()
	e.eventually("127.0.0.1 watching again after closing a stream", func() bool {
		resp, stop := watch(e.tcp)
		defer func() {
			if resp.StatusCode != 200 {
				stop()
			}
		}()
		return resp.StatusCode == 200
	})
}
