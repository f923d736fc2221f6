package fiberd

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Defaults of Limits.
const (
	// DefaultHeaderTimeout bounds reading a request's headers.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds reading a request's body (at most
	// api.MaxRequestBody bytes) after its headers.
	DefaultBodyTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds writing an answer.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection left idle.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultWatchKeepAlive is how often an idle /v1/watch stream is sent
	// an empty line.
	DefaultWatchKeepAlive = 30 * time.Second
	// DefaultMaxConns caps the open connections of each listener.
	DefaultMaxConns = 256
	// DefaultMaxHandshakes caps the connections of the TLS listener that
	// have not finished their handshake.
	DefaultMaxHandshakes = 64
	// DefaultMaxWatches caps the /v1/watch streams each caller may hold
	// open at once.
	DefaultMaxWatches = 16
)

// Limits bound what one client may cost the agent: every listener (the
// API's TCP listener and unix socket, the admin socket) has these timeouts
// and its own connection cap, so a client that is slow to send, slow to
// read, or sends nothing holds one descriptor for a bounded time. A zero
// field takes its default; a negative one is refused by Config.Validate.
type Limits struct {
	// HeaderTimeout bounds reading a request's headers, from the first
	// byte of a new connection, or of the next request on a kept-alive
	// one. The connection is closed when it passes. Default
	// DefaultHeaderTimeout (10 s).
	HeaderTimeout time.Duration
	// BodyTimeout bounds reading a request's body, from the end of its
	// headers to its last byte: a body still incomplete is answered 408
	// and its connection closed. It also bounds the GET routes but
	// /v1/watch, which have no body (their context ends when it passes).
	// Default DefaultBodyTimeout (10 s).
	BodyTimeout time.Duration
	// WriteTimeout bounds writing an answer, from the end of the request's
	// headers; a Clone gets its deadline (Config.CloneDeadline, or the
	// request's shorter deadlineMs) on top. Each line of a /v1/watch
	// stream must be written within WriteTimeout. A client that does not
	// read its answer in time has its connection closed. Default
	// DefaultWriteTimeout (10 s).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection on which no new request
	// began for this long. Default DefaultIdleTimeout (30 s).
	IdleTimeout time.Duration
	// WatchKeepAlive is how often a /v1/watch stream with nothing new is
	// sent an empty line (which NDJSON readers skip), so a peer that went
	// away is noticed within WatchKeepAlive + WriteTimeout. Read on
	// Config.Clock. Default DefaultWatchKeepAlive (30 s).
	WatchKeepAlive time.Duration
	// MaxConns caps the connections open at once on each listener. Past
	// it the listener accepts no more until one closes: further
	// connections wait in the kernel's accept queue and cost the agent no
	// descriptor. On the TLS listener it caps the handshaken connections
	// only (those whose client certificate verified): connections still
	// in their handshake have a pool of their own, MaxHandshakes. Default
	// DefaultMaxConns (256).
	MaxConns int
	// MaxHandshakes caps the connections of the TLS listener that have
	// not finished their handshake, apart from MaxConns: a connection
	// that sends nothing, or no client certificate, never holds a place of
	// the authenticated ones. Each handshake must finish within
	// HeaderTimeout. When the pool is full a new connection closes the
	// oldest one still in its handshake, so connections that never finish
	// one cannot keep a client that does from reaching the listener.
	// Default DefaultMaxHandshakes (64).
	MaxHandshakes int
	// MaxConnsPerIP caps the connections open at once from one remote
	// address on the plaintext TCP listener, which authenticates no one
	// (an IPv6 address counts by its /64). A connection past it is
	// answered 429 SHED and closed at once, so one source cannot hold all
	// MaxConns. Default a quarter of MaxConns, at least 1 (64 with the
	// default MaxConns).
	MaxConnsPerIP int
	// MaxWatches caps the /v1/watch streams open at once of each caller:
	// the peer uid on the unix socket, the client certificate on the TLS
	// listener, the remote address on the plaintext one (callers.go). A
	// watch past it is answered 429 SHED. Default DefaultMaxWatches (16).
	MaxWatches int
}

// withDefaults returns l with its zero fields defaulted.
func (l Limits) withDefaults() Limits {
	l.HeaderTimeout = cmp.Or(l.HeaderTimeout, DefaultHeaderTimeout)
	l.BodyTimeout = cmp.Or(l.BodyTimeout, DefaultBodyTimeout)
	l.WriteTimeout = cmp.Or(l.WriteTimeout, DefaultWriteTimeout)
	l.IdleTimeout = cmp.Or(l.IdleTimeout, DefaultIdleTimeout)
	l.WatchKeepAlive = cmp.Or(l.WatchKeepAlive, DefaultWatchKeepAlive)
	l.MaxConns = cmp.Or(l.MaxConns, DefaultMaxConns)
	l.MaxHandshakes = cmp.Or(l.MaxHandshakes, DefaultMaxHandshakes)
	l.MaxConnsPerIP = cmp.Or(l.MaxConnsPerIP, max(1, l.MaxConns/4))
	l.MaxWatches = cmp.Or(l.MaxWatches, DefaultMaxWatches)
	return l
}

// validate names the first negative field of l.
func (l Limits) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeaderTimeout", l.HeaderTimeout}, {"BodyTimeout", l.BodyTimeout}, {"WriteTimeout", l.WriteTimeout},
		{"IdleTimeout", l.IdleTimeout}, {"WatchKeepAlive", l.WatchKeepAlive},
	} {
		if d.v < 0 {
			return fmt.Errorf("Limits.%s %v is negative: use 0 for the default", d.name, d.v)
		}
	}
	for _, n := range []struct {
		name string
		v    int
		def  string
	}{
		{"MaxConns", l.MaxConns, fmt.Sprint(DefaultMaxConns)}, {"MaxHandshakes", l.MaxHandshakes, fmt.Sprint(DefaultMaxHandshakes)},
		{"MaxConnsPerIP", l.MaxConnsPerIP, "of a quarter of MaxConns"}, {"MaxWatches", l.MaxWatches, fmt.Sprint(DefaultMaxWatches)},
	} {
		if n.v < 0 {
			return fmt.Errorf("Limits.%s %d is negative: use 0 for the default %s", n.name, n.v, n.def)
		}
	}
	return nil
}

// server builds the http.Server of listener ln serving h: h wrapped in the
// browser guard of ln's kind (guard) and in the per-route deadlines
// (deadlines), the header and idle timeouts of Config.Limits, and
// authenticated and the connection's caller (connCaller, read once per
// connection) recorded in every request's context (authKey, callerKey).
// Run's serve calls it once per listener.
func (a *Agent) server(ln net.Listener, h http.Handler, authenticated bool) *http.Server {
	lim := a.cfg.Limits
	return &http.Server{
		Handler:           a.deadlines(a.guard(h, ln, authenticated)),
		ReadHeaderTimeout: lim.HeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		ErrorLog:          log.New(logWriter{a.log}, "", 0),
		ConnContext: func(c context.Context, nc net.Conn) context.Context {
			c = context.WithValue(c, authKey{}, authenticated)
			return context.WithValue(c, callerKey{}, connCaller(nc))
		},
	}
}

// deadlines sets the connection's deadlines for one request, at its start
// (its headers read), before any routing or guard: the body must be read
// within BodyTimeout, and the answer written within WriteTimeout, plus the
// Clone deadline for /v1/clone. /v1/watch lifts both and sets a write
// deadline per line.
//
// Without a read deadline after the headers net/http waits for a declared
// body forever, also to discard the body of a request a handler refused.
// Once a body is read whole, net/http's background read lifts the read
// deadline, so it does not end a long Clone; a GET has no body and keeps it,
// which bounds the routes but /v1/watch.
func (a *Agent) deadlines(h http.Handler) http.Handler {
	lim := a.cfg.Limits
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		write := lim.WriteTimeout
		switch r.URL.Path {
		case "/v1/clone":
			write += a.cfg.CloneDeadline
		case "/v1/park":
			write += a.cfg.Park.Timeout
		}
		_ = rc.SetReadDeadline(wallDeadline(lim.BodyTimeout))
		_ = rc.SetWriteDeadline(wallDeadline(write))
		h.ServeHTTP(w, r)
	})
}

// wallDeadline is d from now on the wall clock. Socket deadlines are
// absolute times on the clock the runtime's poller reads, so they are the
// one place the agent reads time.Now instead of Config.Clock (a fake clock
// would set them years away).
func wallDeadline(d time.Duration) time.Time {
	return time.Now().Add(d)
}

// limitConns caps the connections open at once on ln at max: Accept waits
// for a place before it accepts, and a connection's Close frees its place.
// Connections past the cap wait in the kernel's accept queue. Closing the
// returned listener ends a waiting Accept.
func limitConns(ln net.Listener, max int) net.Listener {
	return &connLimiter{Listener: ln, places: make(chan struct{}, max), done: make(chan struct{})}
}

type connLimiter struct {
	net.Listener
	places chan struct{} // one element per open connection
	done   chan struct{} // closed by Close
	once   sync.Once
}

func (l *connLimiter) Accept() (net.Conn, error) {
	select {
	case l.places <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.places
		return nil, err
	}
	return &limitedConn{Conn: c, free: l.places}, nil
}

func (l *connLimiter) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn frees its listener place on its first Close.
type limitedConn struct {
	net.Conn
	free chan struct{}
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.free })
	return err
}

// CloseWrite half-closes the connection when the accepted one can (TCP,
// unix), so net/http can still end a refused upload gracefully.
func (c *limitedConn) CloseWrite() error {
	return closeWrite(c.Conn)
}

// NetConn is the connection accepted, for connCaller.
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// closeWrite half-closes c when it can.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
