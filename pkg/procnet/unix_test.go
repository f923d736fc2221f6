package procnet

import (
	"strings"
	"testing"
)

// TestScanUnix: rows after the header, with their type, state, inode and
// path; a path keeps its own spaces and form feeds; rows without a number
// for an inode, or too short, are skipped.
func TestScanUnix(t *testing.T) {
	table := "Num RefCount Protocol Flags Type St Inode Path\n" +
		"0: 00000002 00000000 00010000 0001 01 1001 /run/f/a.sock\n" +
		"0: 00000003 00000000 00000000 0001 03 1002 /run/f/a b\f.sock\n" +
		"0: 00000003 00000000 00000000 0002 03 1003\n" +
		"0: 00000003 00000000 00000000 0001 03 x /run/f/c.sock\n" +
		"0: 3 0\n"
	var got []UnixSocket
	ScanUnix(strings.NewReader(table), func(s UnixSocket) { got = append(got, s) })
	want := []UnixSocket{
		{Type: "0001", State: "01", Inode: 1001, Path: "/run/f/a.sock"},
		{Type: "0001", State: "03", Inode: 1002, Path: "/run/f/a b\f.sock"},
		{Type: "0002", State: "03", Inode: 1003},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
