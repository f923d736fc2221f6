package endpoint

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
