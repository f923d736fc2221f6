package fiberd

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"

	"fiberd.io/fiberd/pkg/procnet"
)

// This file reads the kernel's socket tables (/proc/net) for the pressure
// park, which leaves alone a fiber with a connection open to its endpoint.
// A unix socket's path is a fiber's choice: nothing in a line is trusted
// beyond its fields' positions, and every read is bounded.

// openConns is what readOpenConns found: the local TCP ports with a
// connection open, and the unix socket paths with one.
type openConns struct {
	ports map[int]bool
	paths map[string]bool
}

// readOpenConns reads /proc/net/tcp, tcp6 and unix (fiberd's network
// namespace, the fibers' endpoints'). What cannot be read counts nothing.
func readOpenConns() *openConns {
	c := &openConns{ports: map[int]bool{}, paths: map[string]bool{}}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if f, err := os.Open(name); err == nil {
			parseTCPConns(f, c.ports)
			f.Close()
		}
	}
	if f, err := os.Open("/proc/net/unix"); err == nil {
		parseUnixConns(f, c.paths)
		f.Close()
	}
	return c
}

// maxProcNetLines bounds the lines read of one /proc/net file.
const maxProcNetLines = procnet.MaxLines

// TCP states of /proc/net/tcp that are no open connection: LISTEN (0A),
// TIME_WAIT (06) and CLOSE (07).
var tcpNotOpen = map[string]bool{"0A": true, "06": true, "07": true}

// parseTCPConns adds to ports the local port of every connection of a
// /proc/net/tcp or tcp6 table ("sl local_address rem_address st ...",
// addresses as HEXIP:HEXPORT) that is open.
func parseTCPConns(r io.Reader, ports map[int]bool) {
	sc := bufio.NewScanner(r)
	for n := 0; sc.Scan() && n < maxProcNetLines; n++ {
		f := strings.Fields(sc.Text())
		if n == 0 || len(f) < 4 || tcpNotOpen[f[3]] {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		if port, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil {
			ports[int(port)] = true
		}
	}
}

// parseUnixConns adds to paths the path of every connected stream socket
// of a /proc/net/unix table: a socket a listener accepted shows the
// listener's path.
func parseUnixConns(r io.Reader, paths map[string]bool) {
	procnet.ScanUnix(r, func(s procnet.UnixSocket) {
		// St 03 is SS_CONNECTED.
		if s.State == "03" && s.Path != "" {
			paths[s.Path] = true
		}
	})
}
