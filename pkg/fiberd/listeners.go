package fiberd

import (
	"bytes"
	"container/list"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/core"
)

// The TCP listener's shares (issue 24: connections that have not
// authenticated never hold the places of those that have). On the TLS
// listener connections still in their handshake have a pool of their own
// (tlsGate); on the plaintext listener, which authenticates no one, each
// remote address has a share of the connection cap (ipLimiter). The unix
// socket and the admin socket have the one cap of limitConns.

// tcpListener wraps ln, the API's bound TCP listener, in the limits of its
// kind: TLS with config tc (nil for plaintext).
func (a *Agent) tcpListener(ln net.Listener, tc *tls.Config) net.Listener {
	lim := a.cfg.Limits
	if tc != nil {
		return newTLSGate(ln, tc, lim, a.log)
	}
	return &ipLimiter{Listener: limitConns(ln, lim.MaxConns), max: lim.MaxConnsPerIP, refuse: a.refuseConn}
}

// ipLimiter caps at max the connections open at once from each remote
// address (ipCaller) among those its listener, a connLimiter, accepts. A
// connection past it is answered 429 SHED and closed at once, freeing its
// place of the listener's cap: one source holds at most max of them.
type ipLimiter struct {
	net.Listener
	max    int
	refuse func(net.Conn, string)

	mu   sync.Mutex
	open map[string]int // by caller.key; no entry at zero
}

func (l *ipLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, ok := c.RemoteAddr().(*net.TCPAddr)
		if !ok {
			return c, nil
		}
		who := ipCaller(addr)
		key := who.key()
		l.mu.Lock()
		if l.open[key] >= l.max {
			l.mu.Unlock()
			l.refuse(c, fmt.Sprintf("too many connections from %s: %d are open, the most one address may hold on a listener that does not authenticate (Limits.MaxConnsPerIP); close one or reuse it (keep-alive), then retry", who, l.max))
			continue
		}
		if l.open == nil {
			l.open = make(map[string]int)
		}
		l.open[key]++
		l.mu.Unlock()
		return &releaseConn{Conn: c, release: func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.open[key]--; l.open[key] <= 0 {
				delete(l.open, key)
			}
		}}, nil
	}
}

// refuseWrite bounds writing a refusal to a connection just accepted,
// whose send buffer is empty: it never waits in practice.
const refuseWrite = 100 * time.Millisecond

// refuseConn answers c, a connection just accepted and not read from,
// 429 SHED saying why, and closes it. The answer is best effort: a
// client that already sent a request may see the connection reset.
func (a *Agent) refuseConn(c net.Conn, why string) {
	secs := max(1, int(math.Ceil(a.cfg.RetryAfter.Seconds())))
	body, _ := json.Marshal(api.Error{Code: string(core.CodeShed), Message: why, Issuer: a.cfg.Issuer, RetryAfterSeconds: secs})
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n", secs, len(body)+1, body)
	_ = c.SetWriteDeadline(wallDeadline(refuseWrite))
	_, _ = c.Write(b.Bytes())
	_ = closeWrite(c)
	_ = c.Close()
}

// releaseConn runs its release once, when it is first closed. A nil
// release is none.
type releaseConn struct {
	net.Conn
	mu      sync.Mutex
	release func() // nil once run
}

func (c *releaseConn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	fn := c.release
	c.release = nil
	c.mu.Unlock()
	if fn != nil {
		fn()
	}
	return err
}

// hold sets fn as the connection's release, run by its Close.
func (c *releaseConn) hold(fn func()) {
	c.mu.Lock()
	c.release = fn
	c.mu.Unlock()
}

// CloseWrite half-closes the connection when it can, as limitedConn's.
func (c *releaseConn) CloseWrite() error { return closeWrite(c.Conn) }

// NetConn is the connection wrapped, for connCaller.
func (c *releaseConn) NetConn() net.Conn { return c.Conn }

// tlsGate is the TLS listener. It accepts every connection its TCP
// listener has, does each one's handshake itself, within HeaderTimeout,
// and hands net/http (Accept) only those handshaken, as *tls.Conn with the
// client certificate verified: at most MaxConns open at once (places).
// Connections in their handshake are a pool of their own, of
// MaxHandshakes: when it is full, a new connection closes the oldest still
// in its handshake. A connection that never finishes one thus holds a
// descriptor for at most HeaderTimeout, or until MaxHandshakes newer ones
// came, and never a place of those that did: a client with a certificate
// is kept from the listener only by MaxHandshakes connections arriving
// within the few milliseconds of its handshake.
//
// A handshaken connection waits for a place while MaxConns are open; it
// stays in the pool meanwhile (not to be closed by newer ones), and while
// the whole pool waits so, the gate accepts no more: further connections
// wait in the kernel's accept queue as on the other listeners.
type tlsGate struct {
	ln        net.Listener
	config    *tls.Config
	timeout   time.Duration
	maxPool   int
	log       logr.Logger
	places    chan struct{}   // one element per handshaken connection open
	ready     chan net.Conn   // handshaken connections for Accept
	errs      chan error      // the TCP listener's errors for Accept
	room      chan struct{}   // poked when the pool shrinks
	done      chan struct{}   // closed by Close
	ctx       context.Context // ends with done: ends the handshakes
	cancel    context.CancelFunc
	goroutine sync.WaitGroup // the accept loop and the handshakes

	mu          sync.Mutex
	closed      bool
	started     bool
	pool        int       // connections in the pool: in their handshake, or handshaken and waiting for a place
	handshaking list.List // of *pending in their handshake, the oldest first
}

// pending is a connection in the gate's pool.
type pending struct {
	conn    *releaseConn
	el      *list.Element // in handshaking, while it is
	evicted bool          // closed by a newer connection; guarded by the gate's mu
}

func newTLSGate(ln net.Listener, tc *tls.Config, lim Limits, log logr.Logger) *tlsGate {
	ctx, cancel := context.WithCancel(context.Background())
	return &tlsGate{
		ln: ln, config: tc, timeout: lim.HeaderTimeout, maxPool: lim.MaxHandshakes, log: log,
		places: make(chan struct{}, lim.MaxConns), ready: make(chan net.Conn), errs: make(chan error),
		room: make(chan struct{}, 1), done: make(chan struct{}), ctx: ctx, cancel: cancel,
	}
}

func (g *tlsGate) Addr() net.Addr { return g.ln.Addr() }

// Accept hands over the next handshaken connection. The first call starts
// the accept loop.
func (g *tlsGate) Accept() (net.Conn, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, net.ErrClosed
	}
	if !g.started {
		g.started = true
		g.goroutine.Add(1)
		go g.loop()
	}
	g.mu.Unlock()
	select {
	case c := <-g.ready:
		return c, nil
	case err := <-g.errs:
		return nil, err
	case <-g.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, ends the handshakes and closes the connections
// not handed over yet, and returns once the gate's goroutines have ended.
// Connections handed over are net/http's to close.
func (g *tlsGate) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	close(g.done)
	g.cancel()
	err := g.ln.Close()
	g.goroutine.Wait()
	return err
}

// loop accepts connections into the pool until the gate closes. The TCP
// listener's errors go to Accept, whose caller (net/http) backs off from
// a temporary one and gives up on another.
func (g *tlsGate) loop() {
	defer g.goroutine.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case g.errs <- err:
				continue
			case <-g.done:
				return
			}
		}
		if !g.admit(c) {
			_ = c.Close()
			return
		}
	}
}

// admit puts c in the pool, making room by closing the oldest connection
// in its handshake, or waiting for room when every one in the pool is
// handshaken; then starts its handshake. False when the gate closed.
func (g *tlsGate) admit(c net.Conn) bool {
	p := &pending{conn: &releaseConn{Conn: c}}
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return false
		}
		if g.pool < g.maxPool {
			break // still locked
		}
		if oldest := g.handshaking.Front(); oldest != nil {
			old := oldest.Value.(*pending)
			g.handshaking.Remove(oldest)
			old.evicted = true
			g.pool--
			g.mu.Unlock()
			_ = old.conn.Close()
			continue
		}
		g.mu.Unlock()
		select {
		case <-g.room:
		case <-g.done:
			return false
		}
	}
	g.pool++
	p.el = g.handshaking.PushBack(p)
	g.goroutine.Add(1)
	g.mu.Unlock()
	go g.handshake(p)
	return true
}

// leave takes one connection out of the pool.
func (g *tlsGate) leave() {
	g.mu.Lock()
	g.pool--
	g.mu.Unlock()
	select {
	case g.room <- struct{}{}:
	default:
	}
}

// handshake does p's handshake within the timeout, waits for a place and
// hands the connection to Accept. A connection whose handshake fails is
// closed (logged at V(1), as net/http did); one a newer connection
// evicted was closed by it, and has left the pool.
func (g *tlsGate) handshake(p *pending) {
	defer g.goroutine.Done()
	tc := tls.Server(p.conn, g.config)
	_ = p.conn.SetDeadline(wallDeadline(g.timeout))
	err := tc.HandshakeContext(g.ctx)
	g.mu.Lock()
	evicted := p.evicted
	if !evicted {
		g.handshaking.Remove(p.el)
	}
	g.mu.Unlock()
	if evicted {
		return
	}
	if err != nil {
		why := answerPlainHTTP(err)
		if g.ctx.Err() == nil {
			g.log.V(1).Info("TLS handshake failed", "remote", p.conn.RemoteAddr().String(), "err", why)
		}
		_ = p.conn.Close()
		g.leave()
		return
	}
	_ = p.conn.SetDeadline(time.Time{})
	select {
	case g.places <- struct{}{}:
	case <-g.done:
		_ = p.conn.Close()
		g.leave()
		return
	}
	p.conn.hold(func() { <-g.places })
	g.leave()
	select {
	case g.ready <- tc:
	case <-g.done:
		_ = p.conn.Close() // frees the place
	}
}

// answerPlainHTTP tells a client that sent plain HTTP to the TLS listener
// so, in plain HTTP, as net/http does, when err (a failed handshake) says
// it did; it returns why the handshake failed, for the log.
func answerPlainHTTP(err error) string {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && rh.Conn != nil && looksLikeHTTP(rh.RecordHeader) {
		_, _ = io.WriteString(rh.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
		return "client sent an HTTP request to an HTTPS server"
	}
	return err.Error()
}

// looksLikeHTTP reports whether a TLS record header is the start of an
// HTTP/1 request line.
func looksLikeHTTP(h [5]byte) bool {
	switch string(h[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH":
		return true
	}
	return false
}
