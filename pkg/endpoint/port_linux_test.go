package endpoint

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
)

// TestListenIsPlainTCP: a fiber's TCP listener is plain TCP, never
// Multipath TCP (Go's default for listeners where the kernel has it), since
// CRIU cannot park a fiber whose listener is an MPTCP socket.
func TestListenIsPlainTCP(t *testing.T) {
	a, err := NewAllocator(PortRange{First: 21500, Last: 21599})
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := a.Listen(Inet4, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rc, err := l.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var perr error
	rc.Control(func(fd uintptr) { proto, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) })
	if perr != nil {
		t.Fatal(perr)
	}
	if proto != syscall.IPPROTO_TCP {
		t.Fatalf("listener protocol %d, want IPPROTO_TCP (%d); MPTCP is %d", proto, syscall.IPPROTO_TCP, unix.IPPROTO_MPTCP)
	}
}

// TestListenAt binds a given address as plain TCP, and says when it is
// taken or not an IP address.
func TestListenAt(t *testing.T) {
	l, err := ListenAt("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var proto int
	rc, _ := l.(*net.TCPListener).SyscallConn()
	rc.Control(func(fd uintptr) { proto, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) })
	if proto != syscall.IPPROTO_TCP {
		t.Fatalf("ListenAt protocol %d, want plain TCP", proto)
	}
	if _, err := ListenAt(l.Addr().String()); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("ListenAt of a taken address = %v, want EADDRINUSE", err)
	}
	for _, bad := range []string{"localhost:80", "127.0.0.1", ""} {
		if _, err := ListenAt(bad); !errors.Is(err, core.ErrInvalid) {
			t.Errorf("ListenAt(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
