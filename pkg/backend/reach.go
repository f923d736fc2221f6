package backend

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// What an isolated grant sees of the host's file system.

// scratchDirs get a tmpfs of their own per grant, and per fiber at
// IsolationFiber. The SDKs mount the same list for a fiber.
var scratchDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// cgroupView is where a grant sees cgroups: its own cgroup, or nothing.
const cgroupView = "/sys/fs/cgroup"

// coveredDirs are covered in the isolation mount namespace besides the
// scratch directories: the host's cgroup tree (which names every grant and
// fiber) and its POSIX message queues.
var coveredDirs = []string{cgroupView, "/dev/mqueue"}

// ReadableByGrants reports why the user of an isolated grant could not
// read path, or nil when it can. That user is a stranger to the host: it
// owns no file and belongs to no group of the host's, so every directory
// on the way to path must be searchable by others, path itself readable
// by others (and searchable, for a directory), and path must not lie
// under a directory an isolated grant sees empty (/tmp, /var/tmp,
// /dev/shm, /dev/mqueue, /sys/fs/cgroup). Symbolic links are followed and
// where they lead is checked; ACLs are not read. It does not say whether
// a grant may write there.
//
// Who calls it: whoever places a template's files for an isolated grant
// (fiberd -dev and the bench place the example templates with it); Warm
// does not, since the command itself is opened by fiberd.
func ReadableByGrants(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if err := outsideHidden(abs); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	if err := outsideHidden(real); err != nil {
		return err
	}
	return readableByOthers(real)
}

// outsideHidden fails when abs lies in a directory an isolated grant sees
// empty.
func outsideHidden(abs string) error {
	for _, d := range append(append([]string{}, scratchDirs...), coveredDirs...) {
		if abs == d || strings.HasPrefix(abs, d+"/") {
			return fmt.Errorf("%s lies under %s, which an isolated grant sees empty: put it elsewhere", abs, d)
		}
	}
	return nil
}

// readableByOthers checks the mode bits of "others" along the absolute,
// resolved path p: every directory above it searchable, p readable (and
// searchable when a directory).
func readableByOthers(p string) error {
	dirs := []string{"/"}
	for dir := filepath.Dir(p); dir != "/"; dir = filepath.Dir(dir) {
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		st, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s: directory %s (mode %#o) is not searchable by others, so an isolated grant cannot reach it", p, dir, st.Mode().Perm())
		}
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	want := fs.FileMode(0o004)
	if st.IsDir() {
		want = 0o005
	}
	if st.Mode().Perm()&want != want {
		return fmt.Errorf("%s (mode %#o) is not readable by others, so an isolated grant cannot read it", p, st.Mode().Perm())
	}
	return nil
}

// isolatedHint is added to the error of an isolated template that ended
// before it was ready: the usual cause is a file its user cannot read.
func isolatedHint(id uint32) string {
	return fmt.Sprintf("; it ran isolated as uid %d, a stranger to the host: its interpreter, scripts and libraries must be readable by others and lie outside %s",
		id, strings.Join(scratchDirs, ", "))
}
