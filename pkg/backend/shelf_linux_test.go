package backend

import (
	"slices"
	"strings"
	"testing"
)

// sampleMountinfo is a mount table of the kind parentMountPoints and
// hiddenMounts read: / with children, /dev/shm stacked twice, a mount
// point with a space, and the shelf's own tmpfs below /dev/shm.
const sampleMountinfo = `26 1 254:0 / / rw,relatime - ext4 /dev/vda rw
21 26 0:20 / /proc rw,relatime - proc proc rw
23 26 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw
24 23 0:22 / /dev/shm rw,relatime - tmpfs tmpfs rw
29 24 0:26 / /dev/shm rw,relatime - tmpfs tmpfs rw
50 29 0:50 / /dev/shm/fiberd-isolation/shelf rw - tmpfs fiberd-shelf rw
51 26 0:51 / /mnt/a\040b rw - tmpfs x rw
52 51 0:52 / /mnt/a\040b/c rw - tmpfs y rw
`

// TestParentMountPoints: the shelf holds each mount point that has mounts
// below it, once, in table order, and never the shelf itself; a mount that
// has only the shelf below it counts.
func TestParentMountPoints(t *testing.T) {
	got, err := parentMountPoints(strings.NewReader(sampleMountinfo), "/dev/shm/fiberd-isolation/shelf")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/", "/dev", "/dev/shm", "/mnt/a b"}
	if !slices.Equal(got, want) {
		t.Errorf("parentMountPoints = %q, want %q", got, want)
	}
	if _, err := parentMountPoints(strings.NewReader("1 2 3\n"), "/x"); err == nil {
		t.Error("a short line was read without an error")
	}
}

func TestUnescapeMountPoint(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:         "/plain",
		`/a\040b`:        "/a b",
		`/tab\011x\012y`: "/tab\tx\ny",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/not\999octal`:  `/not\999octal`,
		`/end\`:          `/end\`,
	} {
		if got := unescapeMountPoint(in); got != want {
			t.Errorf("unescapeMountPoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzReadMounts: a mount table a fiber's zygote shaped (it may mount in
// its own namespace, and names its mount points) never panics the reader,
// and what it returns comes from the lines it read.
func FuzzReadMounts(f *testing.F) {
	f.Add(sampleMountinfo)
	f.Add("1 0 0:1 / / rw - x x rw\n")
	f.Add(`1 0 0:1 / /a\0 rw` + "\n")
	f.Fuzz(func(t *testing.T, table string) {
		all, err := readMounts(strings.NewReader(table))
		if err != nil {
			return
		}
		if n := strings.Count(table, "\n") + 1; len(all) > n {
			t.Fatalf("%d mounts from %d lines", len(all), n)
		}
		for _, m := range all {
			if len(m.point) > len(table) {
				t.Fatalf("mount point %q longer than the table", m.point)
			}
		}
		_, _ = parentMountPoints(strings.NewReader(table), "/skip")
	})
}
