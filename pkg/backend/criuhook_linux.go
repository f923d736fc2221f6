package backend

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
)

// criu restore of an isolated fiber calls fiberd's binary again from its
// action script (writeCRIUHook, with criuHookEnv set), and the
// "pre-resume" call makes the restored mounts read-only again
// before the fiber runs: criu binds the host's mounts back from the shelf,
// which are writable, and does not give every one its flags again (a host
// mount stacked on another, a cover). What the fiber had read-only (the
// host's mounts, the covers) is read-only again; its own scratch and /proc
// stay writable. The fiber has no capability, so it cannot make them
// writable itself. When that fails the hook kills the restored fiber, so
// the resume fails instead of running a fiber with the host writable.

// criuHookEnv marks criu's action script calls of fiberd's binary.
const criuHookEnv = "FIBERD_CRIU_HOOK"

// criuHookName is the action script writeCRIUHook puts in an image.
const criuHookName = "fiberd-criu-hook"

// writeCRIUHook writes into the image directory dir the action script criu
// restore runs at each of its steps: a shell line that starts fiberd's
// binary (about 30 ms) only for "pre-resume", the one step it acts on, and
// returns its path.
func writeCRIUHook(shell, dir string) (string, error) {
	path := filepath.Join(dir, criuHookName)
	script := fmt.Sprintf("#!%s\n# fiberd: criu's action script for the restore of an isolated fiber\n[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-resume ] || exit 0\nexec /proc/%d/exe\n", shell, os.Getpid())
	if err := core.WriteFileAtomic(path, []byte(script), 0o700); err != nil {
		return "", fmt.Errorf("criu's action script: %w", err)
	}
	return path, nil
}

func init() {
	action := os.Getenv("CRTOOLS_SCRIPT_ACTION")
	if os.Getenv(criuHookEnv) == "" || action == "" {
		return
	}
	runtime.LockOSThread()
	if action != "pre-resume" {
		unix.Exit(0)
	}
	pid, err := strconv.Atoi(os.Getenv("CRTOOLS_INIT_PID"))
	if err == nil && pid <= 0 {
		err = fmt.Errorf("CRTOOLS_INIT_PID %d", pid)
	}
	if err == nil {
		err = relockMounts(pid)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fiberd criu hook: making the restored fiber's mounts read-only again: %v\n", err)
		if pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		unix.Exit(1)
	}
	unix.Exit(0)
}

// relockMounts enters the mount namespace of the process at pid, on the
// calling thread, and makes every mount there read-only but the ones
// on top at the scratch directories and /proc.
func relockMounts(pid int) error {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("read-only: %w", err)
	}
	for _, d := range append(append([]string{}, scratchDirs...), "/proc") {
		err := unix.MountSetattr(unix.AT_FDCWD, d, 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY})
		if err != nil && err != unix.ENOENT {
			return fmt.Errorf("%s writable: %w", d, err)
		}
	}
	return nil
}
