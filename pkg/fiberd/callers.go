package fiberd

import (
	"container/list"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"fiberd.io/fiberd/pkg/core"
)

// Budgets are per caller (issue 24: no caller can spend another's). A
// caller is who a request's cost is charged to:
//
//   - a Clone carrying a token of a grant that verifies: the grant (its
//     UID), whichever connection it came by;
//   - else the connection's caller (connCaller), read once per connection:
//     on the unix socket the peer's uid (SO_PEERCRED); on the TLS listener
//     the client certificate (the SHA-256 of its DER: a certificate, not a
//     subject, so two clients the CA named alike still pay apart); on the
//     plaintext listener the remote IP address, an IPv6 one by its /64
//     (what one host is commonly given).
//
// Each caller has a thrash budget of Config.ThrashRate Clones per second,
// bursts of ThrashBurst (budgets), and at most Limits.MaxWatches watch
// streams open (watchers). On the plaintext listener each address also
// has at most Limits.MaxConnsPerIP connections (listeners.go).

// Kinds of caller.
const (
	callerUID     = "uid"   // a unix socket peer's uid
	callerIP      = "ip"    // a remote address (an IPv6 /64)
	callerCert    = "cert"  // a verified client certificate's SHA-256
	callerGrant   = "grant" // a grant whose token verified
	callerUnknown = "unknown"
)

// caller is who a request's cost is charged to.
type caller struct {
	kind string
	id   string
}

// key is c as a map key.
func (c caller) key() string { return c.kind + ":" + c.id }

// String is c for a message or a log line.
func (c caller) String() string {
	switch c.kind {
	case callerUID:
		return "unix socket peer uid " + c.id
	case callerIP:
		return "remote address " + c.id
	case callerCert:
		return "client certificate sha256:" + c.id[:min(16, len(c.id))] + "..."
	case callerGrant:
		return "grant " + strconv.Quote(c.id)
	}
	return "a caller fiberd could not identify"
}

// callerKey marks a request's context with its connection's caller.
type callerKey struct{}

// callerOf is the caller of r's connection, recorded by the server's
// ConnContext.
func callerOf(r *http.Request) caller {
	if c, ok := r.Context().Value(callerKey{}).(caller); ok {
		return c
	}
	return caller{kind: callerUnknown}
}

// connCaller is the caller of connection nc: the client certificate of a
// handshaken TLS connection, the remote address of a TCP one, the peer's
// uid on a unix socket. The TLS listener hands net/http its connections
// handshaken (listeners.go), so the certificate is known here.
func connCaller(nc net.Conn) caller {
	if tc, ok := nc.(*tls.Conn); ok {
		if st := tc.ConnectionState(); st.HandshakeComplete && len(st.PeerCertificates) > 0 {
			sum := sha256.Sum256(st.PeerCertificates[0].Raw)
			return caller{kind: callerCert, id: hex.EncodeToString(sum[:])}
		}
	}
	if addr, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return ipCaller(addr)
	}
	if uid, err := peerUID(nc); err == nil {
		return caller{kind: callerUID, id: strconv.FormatUint(uint64(uid), 10)}
	}
	return caller{kind: callerUnknown}
}

// ipCaller is the caller of remote address addr: its IP, or for an IPv6
// address that is not loopback its /64.
func ipCaller(addr *net.TCPAddr) caller {
	ip, ok := netip.AddrFromSlice(addr.IP)
	if !ok {
		return caller{kind: callerIP, id: addr.IP.String()}
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() && !ip.IsLoopback() {
		if p, err := ip.Prefix(64); err == nil {
			return caller{kind: callerIP, id: p.String()}
		}
	}
	return caller{kind: callerIP, id: ip.String()}
}

// peerUID reads the uid of the process at the other end of unix socket
// nc (SO_PEERCRED: the uid it had when it connected), unwrapping the
// listeners' wrappers (NetConn).
func peerUID(nc net.Conn) (uint32, error) {
	for {
		switch c := nc.(type) {
		case syscall.Conn:
			raw, err := c.SyscallConn()
			if err != nil {
				return 0, err
			}
			var (
				cred *syscall.Ucred
				gerr error
			)
			if err := raw.Control(func(fd uintptr) {
				cred, gerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
			}); err != nil {
				return 0, err
			}
			if gerr != nil {
				return 0, gerr
			}
			return cred.Uid, nil
		case interface{ NetConn() net.Conn }:
			nc = c.NetConn()
		default:
			return 0, errors.New("not a socket")
		}
	}
}

// maxBudgets bounds the callers whose thrash budget is remembered.
const maxBudgets = 4096

// budgets is the thrash budget of each caller: a token bucket of
// Config.ThrashRate Clones per second holding ThrashBurst, as the one
// budget of the whole node was before. It remembers at most max callers,
// forgetting the one that cloned least recently when a new one comes:
// the bucket forgotten is the one that had longest to fill again (most
// often full, which forgetting does not change), and a caller forgotten
// starts over with a full one. A flood of distinct callers therefore
// costs a bounded table, and only ever hands a caller a fresh budget.
type budgets struct {
	limit rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	lru   list.List                // of *budget, the most recently charged first
	byKey map[string]*list.Element // of lru, by caller.key
}

type budget struct {
	key string
	lim *rate.Limiter
}

func newBudgets(perSecond float64, burst, max int) *budgets {
	return &budgets{limit: rate.Limit(perSecond), burst: burst, max: max, byKey: make(map[string]*list.Element)}
}

// allow charges one Clone at now to c's budget: false when it is spent.
func (b *budgets) allow(c caller, now time.Time) bool {
	key := c.key()
	b.mu.Lock()
	defer b.mu.Unlock()
	el, ok := b.byKey[key]
	if ok {
		b.lru.MoveToFront(el)
	} else {
		if b.lru.Len() >= b.max {
			oldest := b.lru.Back()
			b.lru.Remove(oldest)
			delete(b.byKey, oldest.Value.(*budget).key)
		}
		el = b.lru.PushFront(&budget{key: key, lim: rate.NewLimiter(b.limit, b.burst)})
		b.byKey[key] = el
	}
	return el.Value.(*budget).lim.AllowN(now, 1)
}

// len is how many callers b remembers.
func (b *budgets) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lru.Len()
}

// errSpent is the thrash budget of caller c spent: a SHED miss, which
// says whose budget it was and that it is that caller's alone.
func (a *apiServer) errSpent(c caller) error {
	return core.Shed(fmt.Sprintf("thrash budget exhausted: %s made more Clones than its budget allows (%v per second, bursts of %d; each caller has its own); retry after Retry-After", c, a.cfg.ThrashRate, a.cfg.ThrashBurst), a.cfg.Issuer, a.cfg.RetryAfter)
}

// watchers counts the watch streams open of each caller.
type watchers struct {
	mu   sync.Mutex
	open map[string]int // by caller.key; no entry at zero
}

// add opens a watch stream of c unless c has max open already: the
// function that closes it, or false.
func (w *watchers) add(c caller, max int) (func(), bool) {
	key := c.key()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open[key] >= max {
		return nil, false
	}
	if w.open == nil {
		w.open = make(map[string]int)
	}
	w.open[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.open[key]--; w.open[key] <= 0 {
				delete(w.open, key)
			}
		})
	}, true
}

// errTooManyWatches is a watch refused because its caller c has max open.
func (a *apiServer) errTooManyWatches(c caller, max int) error {
	return core.Shed(fmt.Sprintf("%s has %d watch streams open, the most each caller may (Limits.MaxWatches): close one (one stream carries every change), then retry", c, max), a.cfg.Issuer, a.cfg.RetryAfter)
}
