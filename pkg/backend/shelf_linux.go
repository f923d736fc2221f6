package backend

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Parking a fiber of an isolated grant.
//
// Such a fiber has user, mount, PID, IPC and UTS namespaces of its own (its
// network and cgroup namespaces are the host's), and CRIU dumps them with
// it: the user namespace with its id maps (root mapped, see idMap), and the
// mount namespace mount by mount. Most of those mounts are the host's, seen
// through the spawner's copy of its namespace: criu dump --ext-mount-map
// auto finds each in its own namespace (on the host) and records the path
// it was bound from, and so do the covers, which are binds of
// isolationDir/empty for that reason (a tmpfs would be dumped, and a locked
// one with a locked mount on top cannot be). What is the grant's or the
// fiber's own (its /proc, its scratch tmpfs with what it wrote there) is
// dumped and made again. Files the fiber inherited from its zygote lie on
// the zygote's mounts, outside the dumped namespace; fiberd's CRIU finds
// them on the fiber's mount of the same file system (hack/criu-patches).
// Two of them cannot be found by path from inside: the grant's home, the
// zygote's working directory, and the command, which fiberd opened for
// nsinit; criu dump takes them as external files and criu restore gets
// them again from fiberd (--inherit-fd).
//
// criu restore makes the fiber's user namespace, then its mount namespace
// as a copy of its own owned by that user namespace, where the kernel locks
// every mount, and binds each external mount again from there. A mount
// that has mounts below it cannot be bound alone when they are locked
// (EINVAL), and / and /sys and /dev have some. So criu restore runs in a
// mount namespace of its own, the shelf: a copy of the host's with a
// tmpfs at isolationDir/shelf holding a bind, without what is below it, of
// each mount that has mounts below it; --root and --ext-mount-map point
// criu there (the second patch). The shelf is built once, on the thread
// that starts every restore of an isolated fiber; mounts the host makes
// later with mounts below them are not on it, and restoring a fiber that
// saw them fails.

// isolationDir is fiberd's directory on the host's /dev/shm, where a
// grant's user namespace's root (as which criu restore binds the mounts of
// a parked fiber of the grant) can reach it: the parent of empty and of the
// shelf. It is fiberd's (its owner, writable by nobody else), mode 0711:
// others may pass, not list.
const isolationDir = "/dev/shm/fiberd-isolation"

// openEmptyDir makes (or checks) isolationDir and isolationDir/empty, an
// empty directory of fiberd's, mode 0555, and opens the latter (O_PATH).
func openEmptyDir() (int, error) {
	empty := filepath.Join(isolationDir, "empty")
	if err := fiberdDir(isolationDir, 0o711); err != nil {
		return -1, err
	}
	if err := fiberdDir(empty, 0o555); err != nil {
		return -1, err
	}
	fd, err := unix.Open(empty, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", empty, err)
	}
	// fiberdDir saw it empty; nobody but fiberd can write into it.
	return fd, nil
}

// fiberdDir makes dir with mode perm, or checks the one there: a
// directory (not a link) owned by fiberd's effective uid, of mode perm,
// and empty when perm allows no write. One that fails the check was made
// by someone else (a world-writable /dev/shm lets anyone make it first): it
// is removed and made again, once.
func fiberdDir(dir string, perm fs.FileMode) error {
	for try := 0; ; try++ {
		if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("make %s: %w", dir, err)
		}
		err := checkFiberdDir(dir, perm)
		if err == nil {
			return nil
		}
		if try > 0 {
			return err
		}
		if rerr := os.RemoveAll(dir); rerr != nil {
			return fmt.Errorf("%v; removing it: %w", err, rerr)
		}
	}
}

// checkFiberdDir is fiberdDir's check. A directory fiberd made gets perm
// with a chmod (the umask may have taken bits off).
func checkFiberdDir(dir string, perm fs.FileMode) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || sys == nil || int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is not a directory of uid %d (mode %v)", dir, os.Geteuid(), st.Mode())
	}
	if st.Mode().Perm() != perm {
		if err := os.Chmod(dir, perm); err != nil {
			return fmt.Errorf("chmod %s: %w", dir, err)
		}
	}
	if perm&0o222 == 0 {
		names, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("%s is not empty", dir)
		}
	}
	return nil
}

// shelf is where criu restore of an isolated fiber finds the host's
// mounts (see the comment at the top).
type shelf struct {
	// root is the shelf's bind of the host's /, for --root.
	root string
	// maps are the --ext-mount-map pairs "MOUNTPOINT:SHELF-PATH", one per
	// mount point of the host that has mounts below it.
	maps []string
}

// args are criu restore's flags for the shelf.
func (sh *shelf) args() []string {
	out := []string{"--root", sh.root, "--ext-mount-map", "auto"}
	for _, m := range sh.maps {
		out = append(out, "--ext-mount-map", m)
	}
	return out
}

// buildShelf moves the calling thread, locked to its goroutine for good,
// into a mount namespace of its own (the host's slave) and builds the
// shelf there. Its mount table is read from /proc/thread-self.
func buildShelf() (*shelf, error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("make / a slave: %w", err)
	}
	dir := filepath.Join(isolationDir, "shelf")
	if err := fiberdDir(isolationDir, 0o711); err != nil {
		return nil, err
	}
	if err := fiberdDir(dir, 0o711); err != nil {
		return nil, err
	}
	if err := unix.Mount("fiberd-shelf", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=64k"); err != nil {
		return nil, fmt.Errorf("mount the shelf on %s: %w", dir, err)
	}
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	points, err := parentMountPoints(f, dir)
	f.Close()
	if err != nil {
		return nil, err
	}
	sh := &shelf{}
	for i, mp := range points {
		at := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(at, 0o711); err != nil {
			return nil, err
		}
		if err := unix.Mount(mp, at, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("shelve %s: %w", mp, err)
		}
		if mp == "/" {
			sh.root = at
			continue
		}
		sh.maps = append(sh.maps, mp+":"+at)
	}
	if sh.root == "" {
		return nil, errors.New("the mount table has no / with mounts below it")
	}
	return sh, nil
}

// maxMountinfoLine bounds one line of a mount table.
const maxMountinfoLine = 64 << 10

// mountEntry is one line of a mount table (/proc/<pid>/mountinfo).
type mountEntry struct {
	id, parent string
	point      string // unescaped
}

// readMounts reads a mount table, each line at most maxMountinfoLine long.
func readMounts(r io.Reader) ([]mountEntry, error) {
	var all []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxMountinfoLine)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			return nil, fmt.Errorf("mountinfo: short line %q", sc.Text())
		}
		all = append(all, mountEntry{id: f[0], parent: f[1], point: unescapeMountPoint(f[4])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return all, nil
}

// parentMountPoints reads a mount table and returns, in the table's order
// and each once, the mount points of the mounts that have mounts below
// them, but those at or under skip.
func parentMountPoints(r io.Reader, skip string) ([]string, error) {
	all, err := readMounts(r)
	if err != nil {
		return nil, err
	}
	// The shelf's own tmpfs counts: it lies below a mount of the host
	// (/dev/shm) in every copy of this namespace.
	hasChild := map[string]bool{}
	for _, m := range all {
		hasChild[m.parent] = true
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range all {
		if !hasChild[m.id] || seen[m.point] || under(m.point, skip) {
			continue
		}
		seen[m.point] = true
		out = append(out, m.point)
	}
	return out, nil
}

// under reports whether path is dir or lies below it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// hiddenMounts returns the mount points, in the mount table of the fiber
// at pid, that the fiber cannot reach: below a directory its grant sees
// covered (a scratch directory, /sys/fs/cgroup), or below a directory
// that a stranger to the host may not search, or that is not there, as
// the fiber sees it. criu dump leaves them out (--skip-mnt): criu restore
// would have to make their mount points as the fiber's user namespace's
// root, a stranger too, and fail; the fiber sees the same without them.
func hiddenMounts(pid int) ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	all, err := readMounts(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	covered := append(append([]string{}, scratchDirs...), coveredDirs...)
	searchable := map[string]bool{"/": true}
	var canSearch func(dir string) bool
	canSearch = func(dir string) bool {
		if ok, seen := searchable[dir]; seen {
			return ok
		}
		ok := canSearch(filepath.Dir(dir))
		if ok {
			st, err := os.Stat(root + dir)
			ok = err == nil && st.IsDir() && st.Mode().Perm()&0o001 != 0
		}
		searchable[dir] = ok
		return ok
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range all {
		if m.point == "/" || seen[m.point] {
			continue
		}
		hidden := !canSearch(filepath.Dir(m.point))
		for _, c := range covered {
			hidden = hidden || (m.point != c && under(m.point, c))
		}
		if hidden {
			seen[m.point] = true
			out = append(out, m.point)
		}
	}
	return out, nil
}

// unescapeMountPoint undoes the kernel's octal escapes (\040 for a space,
// \011, \012, \134) in a mount point of /proc/<pid>/mountinfo.
func unescapeMountPoint(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// externalOf names f, opened at path, for criu (externalFile.Key): the
// mount it was opened on and its inode, as criu reads them from the
// fiber's descriptors (/proc/<pid>/fdinfo), which is where the fiber got
// it (a working directory or an executable, inherited).
func externalOf(f *os.File, path string) (externalFile, error) {
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MNT_ID, &stx); err != nil {
		return externalFile{}, fmt.Errorf("statx %s: %w", path, err)
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return externalFile{}, fmt.Errorf("statx %s: the kernel gives no mount id (Linux 5.8 or later)", path)
	}
	return externalFile{Path: path, Key: fmt.Sprintf("file[%x:%x]", stx.Mnt_id, stx.Ino)}, nil
}

// openExternal opens ext's path again for criu restore and checks that it
// is the file the fiber had; another one (the home made anew, the command
// replaced) makes the image unusable.
func openExternal(ext externalFile) (*os.File, error) {
	f, err := os.Open(ext.Path)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, ErrImageUnusable)
	}
	now, err := externalOf(f, ext.Path)
	if err != nil || now.Key != ext.Key {
		f.Close()
		return nil, fmt.Errorf("%s is not the file the fiber had (%s, now %s): %w", ext.Path, ext.Key, now.Key, ErrImageUnusable)
	}
	return f, nil
}
