//go:build linux

package fiberd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileUID is the owner of the file fi describes.
func fileUID(fi fs.FileInfo) (uid int, known bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// fileGID is the group of the file fi describes.
func fileGID(fi fs.FileInfo) (gid int, known bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Gid), true
}

// lockState takes the lock of the state directory dir for the agent's
// life: an exclusive flock(2) of dir/private/lock (created 0600), into
// which it writes fiberd's pid once it holds it. The lock goes with the
// returned file's close, and with the process: a fiberd that crashed holds
// nothing. The descriptor is close-on-exec, so no process fiberd starts
// keeps it. When another process holds the lock, the error wraps
// ErrStateInUse and names that process.
func lockState(dir string) (*os.File, error) {
	path := filepath.Join(dir, "private", lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fiberd: state directory lock %s: %w", path, err)
	}
	if err := flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, inUse(dir, f)
		}
		return nil, fmt.Errorf("fiberd: state directory lock %s: %w", path, err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fiberd: state directory lock %s: %w", path, err)
	}
	return f, nil
}

// probeState fails with ErrStateInUse when a process holds the lock of the
// state directory dir. It takes the lock shared, without blocking, and
// lets it go at once; a dir without a lock file is free.
func probeState(dir string) error {
	path := filepath.Join(dir, "private", lockFile)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fiberd: state directory lock %s: %w", path, err)
	}
	defer f.Close()
	if err := flock(f, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return inUse(dir, f)
		}
		return fmt.Errorf("fiberd: state directory lock %s: %w", path, err)
	}
	return nil
}

// flock applies how to f's descriptor, again when a signal interrupts it.
func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if ferr = unix.Flock(int(fd), how); !errors.Is(ferr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}
