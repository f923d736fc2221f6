package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"fiberd.io/fiberd/pkg/core"
)

// ErrExhausted is what Acquire and Listen return when every port of the
// range is held or in use. The agent treats it as a capacity problem of the
// node, not a bad request. Match it with errors.Is.
var ErrExhausted = errors.New("port range exhausted")

// PortRange is an inclusive range of TCP ports, First to Last. The zero
// value is empty and fails Validate.
type PortRange struct {
	// First is the lowest port of the range, 1-65535.
	First int
	// Last is the highest port of the range, First-65535.
	Last int
}

// ParsePortRange reads "FIRST-LAST" (such as "20000-20999") or a single
// port "FIRST". Ports are decimal 1-65535 and FIRST must not exceed LAST.
// A malformed range is an error wrapping core.ErrInvalid that quotes it.
// cmd/fiberd calls it on its port-range flag.
func ParsePortRange(s string) (PortRange, error) {
	firstStr, lastStr, isRange := strings.Cut(s, "-")
	if !isRange {
		lastStr = firstStr
	}
	first, err := parsePort(firstStr)
	if err != nil {
		return PortRange{}, fmt.Errorf("port range %q: %v: %w", s, err, core.ErrInvalid)
	}
	last, err := parsePort(lastStr)
	if err != nil {
		return PortRange{}, fmt.Errorf("port range %q: %v: %w", s, err, core.ErrInvalid)
	}
	r := PortRange{First: first, Last: last}
	if err := r.Validate(); err != nil {
		return PortRange{}, fmt.Errorf("port range %q: %w", s, err)
	}
	return r, nil
}

// Validate reports a range whose ports are outside 1-65535 or whose First
// exceeds Last, wrapping core.ErrInvalid.
func (r PortRange) Validate() error {
	switch {
	case r.First < 1 || r.First > 65535:
		return fmt.Errorf("First %d: want a port 1-65535: %w", r.First, core.ErrInvalid)
	case r.Last < 1 || r.Last > 65535:
		return fmt.Errorf("Last %d: want a port 1-65535: %w", r.Last, core.ErrInvalid)
	case r.First > r.Last:
		return fmt.Errorf("First %d exceeds Last %d: swap them: %w", r.First, r.Last, core.ErrInvalid)
	}
	return nil
}

// Size is the number of ports in the range, 0 for an invalid one.
func (r PortRange) Size() int {
	if r.Validate() != nil {
		return 0
	}
	return r.Last - r.First + 1
}

// Contains reports whether port lies in the range.
func (r PortRange) Contains(port int) bool {
	return port >= r.First && port <= r.Last
}

// String is "FIRST-LAST", the form ParsePortRange reads.
func (r PortRange) String() string {
	return strconv.Itoa(r.First) + "-" + strconv.Itoa(r.Last)
}

// Allocator hands out the ports of a range, each to one holder at a time.
// It is safe for concurrent use. It turns round the range, so a released
// port is handed out again only after the others have had their turn, which
// keeps a just-closed port out of use while the kernel may still hold it.
// The agent builds one for the endpoint host and the runtime acquires a
// port per fiber, releasing it when the fiber is released or exits.
type Allocator struct {
	r    PortRange
	mu   sync.Mutex
	held map[int]struct{}
	next int // the port the next Acquire tries first
}

// NewAllocator returns an allocator over r, with every port free. An
// invalid range is an error wrapping core.ErrInvalid.
func NewAllocator(r PortRange) (*Allocator, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("port range %s: %w", r, err)
	}
	return &Allocator{r: r, held: make(map[int]struct{}), next: r.First}, nil
}

// Range is the range the allocator hands out.
func (a *Allocator) Range() PortRange { return a.r }

// Held is the number of ports held now.
func (a *Allocator) Held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

// Acquire holds and returns the next free port of the range. It does not
// bind it: a port something outside the allocator holds is still handed
// out (Listen skips those). It returns an error wrapping ErrExhausted when
// every port is held.
func (a *Allocator) Acquire() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	size := a.r.Size()
	for i := 0; i < size; i++ {
		p := a.next
		a.next++
		if a.next > a.r.Last {
			a.next = a.r.First
		}
		if _, ok := a.held[p]; !ok {
			a.held[p] = struct{}{}
			return p, nil
		}
	}
	return 0, fmt.Errorf("port range %s: all %d ports held: %w", a.r, size, ErrExhausted)
}

// Release frees port for another holder. Releasing a port that is not
// held, or outside the range, does nothing.
func (a *Allocator) Release(port int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.held, port)
}

// Listen acquires a port, binds a TCP listener on host at that port and
// returns it with its endpoint URL (TCPURL). host is an IP literal of the
// family, Inet4 or Inet6; empty means the family's loopback (127.0.0.1 or
// ::1). A port something else on the host already binds (EADDRINUSE) is
// released and the next one tried, at most once per port of the range;
// running out is an error wrapping ErrExhausted. The Unix family, a host of
// the wrong family and any other bind error fail at once, with the port
// released.
//
// The port stays held after Listen returns, also once the listener is
// closed, because the fiber keeps serving on its own copy of the
// descriptor: the runtime calls Release when the fiber is released or
// exits.
func (a *Allocator) Listen(family Family, host string) (net.Listener, string, error) {
	network, host, err := bindHost(family, host)
	if err != nil {
		return nil, "", err
	}
	for range a.r.Size() {
		port, err := a.Acquire()
		if err != nil {
			return nil, "", err
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		l, err := fiberListenConfig.Listen(context.Background(), network, addr)
		if err == nil {
			return l, TCPURL(host, port), nil
		}
		a.Release(port)
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, "", fmt.Errorf("listen on %s: %w", addr, err)
		}
	}
	return nil, "", fmt.Errorf("port range %s on %s: every port is held or in use: %w", a.r, host, ErrExhausted)
}

// ListenAt binds a TCP listener at addr (host:port, an IP literal host),
// as Listen binds fibers' listeners (plain TCP, never Multipath), without
// the allocator: the agent binds a parked fiber's address again to resume
// it, its port still held. It fails with the bind's error
// (syscall.EADDRINUSE when something else has taken the address).
func ListenAt(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %q: %v: %w", addr, err, core.ErrInvalid)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return nil, fmt.Errorf("listen on %q: host is not an IP: %w", addr, core.ErrInvalid)
	}
	network := "tcp6"
	if ip.Is4() || ip.Is4In6() {
		network = "tcp4"
	}
	l, err := fiberListenConfig.Listen(context.Background(), network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return l, nil
}

// fiberListenConfig binds fibers' TCP listeners as plain TCP. Go listens
// with Multipath TCP by default where the kernel has it, and CRIU cannot
// dump an MPTCP socket ("Unsupported proto 262"), so such a fiber could
// never be parked; a fiber's listener gains nothing from MPTCP.
var fiberListenConfig = func() net.ListenConfig {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc
}()

// bindHost checks host against family and returns the network to listen
// on and the host to bind.
func bindHost(family Family, host string) (network, bound string, err error) {
	switch family {
	case Inet4:
		if host == "" {
			return "tcp4", "127.0.0.1", nil
		}
		if a, err := netip.ParseAddr(host); err != nil || !a.Is4() {
			return "", "", fmt.Errorf("endpoint host %q: want an IPv4 address for family inet4: %w", host, core.ErrInvalid)
		}
		return "tcp4", host, nil
	case Inet6:
		if host == "" {
			return "tcp6", "::1", nil
		}
		if a, err := netip.ParseAddr(host); err != nil || !a.Is6() || a.Is4In6() {
			return "", "", fmt.Errorf("endpoint host %q: want an IPv6 address for family inet6: %w", host, core.ErrInvalid)
		}
		return "tcp6", host, nil
	}
	return "", "", fmt.Errorf("family %s: Listen binds TCP only, use ListenUnix: %w", family, core.ErrInvalid)
}
