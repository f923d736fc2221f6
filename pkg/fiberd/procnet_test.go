package fiberd

import (
	"bytes"
	"strings"
	"testing"
)

// TestOpenConnsParsers reads /proc/net tables as the kernel writes them.
func TestOpenConnsParsers(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:4E20 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:4E21 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:4E22 0100007F:A1B3 06 00000000:00000000 03:00000E2C 00000000     0        0 0 3 0000000000000000
   3: 0100007F:4E23 0100007F:A1B4 08 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 20 4 30 10 -1
`
	ports := map[int]bool{}
	parseTCPConns(strings.NewReader(tcp), ports)
	if len(ports) != 2 || !ports[0x4E21] || !ports[0x4E23] {
		t.Errorf("open TCP ports %v, want 20001 (established) and 20003 (close wait)", ports)
	}
	unix := `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 1001 /run/f/a.sock
0000000000000000: 00000003 00000000 00000000 0001 03 1002 /run/f/a.sock
0000000000000000: 00000003 00000000 00000000 0001 03 1003 /run/f/with  spaces.sock
0000000000000000: 00000003 00000000 00000000 0001 03 1004
0000000000000000: 00000002 00000000 00010000 0001 01 1005 /run/f/b.sock
`
	paths := map[string]bool{}
	parseUnixConns(strings.NewReader(unix), paths)
	if len(paths) != 2 || !paths["/run/f/a.sock"] || !paths["/run/f/with  spaces.sock"] {
		t.Errorf("connected unix paths %v, want a.sock and the one with spaces", paths)
	}
}

// FuzzParseUnixConns: a line of /proc/net/unix ends in a path a fiber
// chose. Whatever the table holds, the parser stays within its lines and
// every path it reports is the end of one connected line, without the
// spaces before it.
func FuzzParseUnixConns(f *testing.F) {
	f.Add([]byte("Num RefCount Protocol Flags Type St Inode Path\n0: 00000003 00000000 00000000 0001 03 1002 /run/f/a.sock\n"))
	f.Add([]byte("h\n0: 3 0 0 1 03 7 a  b\n0: 3 0 0 1 03 8\n\t0:\t3 0 0 1 03 9 \t/p\n"))
	f.Fuzz(func(t *testing.T, table []byte) {
		paths := map[string]bool{}
		parseUnixConns(bytes.NewReader(table), paths)
		for p := range paths {
			if p == "" {
				t.Fatalf("an empty path: a connected line without one is no connection to an endpoint")
			}
			if strings.TrimLeft(p, " \t") != p {
				t.Fatalf("path %q keeps the spaces before it", p)
			}
			if !bytes.Contains(table, []byte(p)) {
				t.Fatalf("path %q is not in the table", p)
			}
		}
	})
}
