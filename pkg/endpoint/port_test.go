package endpoint

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"

	"fiberd.io/fiberd/pkg/core"
)

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in       string
		want     PortRange
		wantFail bool
	}{
		{in: "20000-20999", want: PortRange{20000, 20999}},
		{in: "8080", want: PortRange{8080, 8080}},
		{in: "1-65535", want: PortRange{1, 65535}},
		{in: "20999-20000", wantFail: true},
		{in: "0-10", wantFail: true},
		{in: "1-65536", wantFail: true},
		{in: "", wantFail: true},
		{in: "-", wantFail: true},
		{in: "10-", wantFail: true},
		{in: "a-b", wantFail: true},
		{in: "1-2-3", wantFail: true},
		{in: " 1-2", wantFail: true},
	}
	for _, tt := range tests {
		got, err := ParsePortRange(tt.in)
		if tt.wantFail {
			if err == nil || !errors.Is(err, core.ErrInvalid) {
				t.Errorf("ParsePortRange(%q) = %v, %v; want an error wrapping core.ErrInvalid", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if back, err := ParsePortRange(got.String()); err != nil || back != got {
			t.Errorf("ParsePortRange(%q.String()) = %v, %v", tt.in, back, err)
		}
	}
}

func TestAllocatorAcquireRelease(t *testing.T) {
	a, err := NewAllocator(PortRange{First: 100, Last: 102})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 3 {
		p, err := a.Acquire()
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if seen[p] || p < 100 || p > 102 {
			t.Fatalf("Acquire = %d, already held or out of range (held %v)", p, seen)
		}
		seen[p] = true
	}
	if _, err := a.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Acquire on a full range = %v, want ErrExhausted", err)
	}
	a.Release(101)
	a.Release(101) // twice is harmless
	a.Release(7)   // outside the range is harmless
	if p, err := a.Acquire(); err != nil || p != 101 {
		t.Fatalf("Acquire after Release(101) = %d, %v; want 101", p, err)
	}
	if a.Held() != 3 {
		t.Fatalf("Held = %d, want 3", a.Held())
	}
}

func TestAllocatorTurnsRound(t *testing.T) {
	a, err := NewAllocator(PortRange{First: 100, Last: 102})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := a.Acquire()
	a.Release(p)
	q, _ := a.Acquire()
	if q == p {
		t.Fatalf("a released port %d came back at once; want the next one first", p)
	}
}

func TestNewAllocatorInvalid(t *testing.T) {
	if _, err := NewAllocator(PortRange{}); !errors.Is(err, core.ErrInvalid) {
		t.Fatalf("NewAllocator(zero) = %v, want core.ErrInvalid", err)
	}
}

func TestAllocatorConcurrent(t *testing.T) {
	const size = 64
	a, err := NewAllocator(PortRange{First: 30000, Last: 30000 + size - 1})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		got  = map[int]int{}
		wg   sync.WaitGroup
		errs = make(chan error, 2*size)
	)
	for range 2 * size {
		wg.Go(func() {
			p, err := a.Acquire()
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			got[p]++
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	if len(got) != size {
		t.Fatalf("%d distinct ports handed out, want %d", len(got), size)
	}
	for p, n := range got {
		if n != 1 {
			t.Errorf("port %d handed out %d times", p, n)
		}
	}
	n := 0
	for err := range errs {
		if !errors.Is(err, ErrExhausted) {
			t.Errorf("Acquire: %v, want ErrExhausted", err)
		}
		n++
	}
	if n != size {
		t.Errorf("%d Acquire calls failed, want %d", n, size)
	}
}

// freePortPair finds two consecutive ports free on 127.0.0.1.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p >= 65535 {
			continue
		}
		l2, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(p+1))
		if err != nil {
			continue
		}
		l2.Close()
		return p
	}
	t.Skip("no two consecutive free ports on 127.0.0.1")
	return 0
}

func TestListenSkipsPortInUse(t *testing.T) {
	p := freePortPair(t)
	busy, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		t.Skipf("port %d taken meanwhile: %v", p, err)
	}
	defer busy.Close()

	a, err := NewAllocator(PortRange{First: p, Last: p + 1})
	if err != nil {
		t.Fatal(err)
	}
	l, url, err := a.Listen(Inet4, "127.0.0.1")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	if want := TCPURL("127.0.0.1", p+1); url != want {
		t.Fatalf("Listen url = %q, want %q (port %d is in use)", url, want, p)
	}
	if a.Held() != 1 {
		t.Fatalf("Held = %d after skipping a busy port, want 1", a.Held())
	}
	// The endpoint answers.
	network, address, err := Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial(network, address)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.Close()

	// Both ports are now taken: one by the allocator, one by busy.
	if _, _, err := a.Listen(Inet4, "127.0.0.1"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Listen on a spent range = %v, want ErrExhausted", err)
	}
	if a.Held() != 1 {
		t.Fatalf("Held = %d after a failed Listen, want 1", a.Held())
	}
}

func TestListenDefaultsAndRefusals(t *testing.T) {
	p := freePortPair(t)
	a, err := NewAllocator(PortRange{First: p, Last: p + 1})
	if err != nil {
		t.Fatal(err)
	}
	l, url, err := a.Listen(Inet4, "")
	if err != nil {
		t.Fatalf("Listen(Inet4, \"\"): %v", err)
	}
	l.Close()
	if want := TCPURL("127.0.0.1", p); url != want {
		t.Errorf("Listen(Inet4, \"\") url = %q, want %q", url, want)
	}
	for _, tt := range []struct {
		family Family
		host   string
	}{
		{Unix, ""},
		{Inet4, "::1"},
		{Inet4, "localhost"},
		{Inet6, "127.0.0.1"},
		{Inet6, "::ffff:127.0.0.1"},
	} {
		if _, _, err := a.Listen(tt.family, tt.host); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("Listen(%s, %q) = %v, want core.ErrInvalid", tt.family, tt.host, err)
		}
	}
	if a.Held() != 1 {
		t.Errorf("Held = %d, want 1: refused Listens must not hold a port", a.Held())
	}
}

func TestListenInet6(t *testing.T) {
	probe, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	p := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	a, err := NewAllocator(PortRange{First: p, Last: p})
	if err != nil {
		t.Fatal(err)
	}
	l, url, err := a.Listen(Inet6, "::1")
	if err != nil {
		t.Skipf("port %d taken meanwhile: %v", p, err)
	}
	defer l.Close()
	if want := "tcp://[::1]:" + strconv.Itoa(p); url != want {
		t.Fatalf("url = %q, want %q", url, want)
	}
}
