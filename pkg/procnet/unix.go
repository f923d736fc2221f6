// Package procnet reads the socket tables of /proc/net: fiberd's own
// network namespace's, or a process's (/proc/<pid>/net/...). A table's
// paths are chosen by whoever bound the sockets, a fiber among them, so a
// table is read as untrusted input: bounded, and split only where the
// kernel separates fields.
package procnet

import (
	"bufio"
	"bytes"
	"io"
	"strconv"
)

// MaxLines bounds the lines read of one table.
const MaxLines = 1 << 20

// UnixSocket is one row of a /proc/net/unix table ("Num RefCount Protocol
// Flags Type St Inode Path").
type UnixSocket struct {
	// Type is the socket type as the table writes it: "0001" for a stream
	// socket.
	Type string
	// State is the St column: "01" unconnected (a listener), "03"
	// connected.
	State string
	// Inode is the socket's inode.
	Inode uint64
	// Path is the address it is bound to, or that its listener is bound
	// to for a socket a listener accepted; "" for none.
	Path string
}

// ScanUnix calls fn for each row of the /proc/net/unix table r, after its
// header, up to MaxLines lines: a row with fewer than seven fields or an
// inode that is not a number is skipped. A line over 64 KiB ends the scan.
func ScanUnix(r io.Reader, fn func(UnixSocket)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for n := 0; sc.Scan() && n < MaxLines; n++ {
		line := sc.Bytes()
		f := bytes.FieldsFunc(line, isFieldSep)
		if n == 0 || len(f) < 7 {
			continue
		}
		ino, err := strconv.ParseUint(string(f[6]), 10, 64)
		if err != nil {
			continue
		}
		s := UnixSocket{Type: string(f[4]), State: string(f[5]), Inode: ino}
		if len(f) > 7 {
			// A path never holds the fields before it, but may hold
			// spaces of its own.
			s.Path = string(afterFields(line, 7))
		}
		fn(s)
	}
}

// isFieldSep reports whether r separates the fields of a /proc/net line:
// a space or a tab, never another byte a path may hold.
func isFieldSep(r rune) bool { return r == ' ' || r == '\t' }

// afterFields is line after its first n fields (separated as isFieldSep
// says) and the separators that follow them.
func afterFields(line []byte, n int) []byte {
	for i := 0; i < n; i++ {
		line = bytes.TrimLeft(line, " \t")
		j := bytes.IndexAny(line, " \t")
		if j < 0 {
			return nil
		}
		line = line[j:]
	}
	return bytes.TrimLeft(line, " \t")
}
