package backend

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"fiberd.io/fiberd/pkg/core"
)

// Making a restored isolated fiber's mounts read-only again.
//
// criu restore binds the host's mounts back from the shelf, which are
// writable, and does not give every one its flags again (a host mount
// stacked on another, a cover). So before the fiber runs, fiberd makes
// every mount of its namespace read-only but its own scratch and /proc:
// criu runs an action script at each step of a restore, and the one
// fiberd writes (writeRelockHook) asks fiberd, at "pre-resume", over a pair
// of FIFOs in the image directory, and waits for the answer; the other
// steps it lets pass at once. fiberd (relockHook.serve) enters the
// fiber's mount namespace from a thread of its own and answers. When that
// fails it kills the fiber and answers no, so the resume fails instead of
// running a fiber with the host writable. The fiber holds no capability,
// so it cannot make them writable itself.

// Names in the image directory.
const (
	relockScript = "fiberd-relock"
	relockAsk    = "fiberd-relock.ask"
	relockAnswer = "fiberd-relock.answer"
)

// relockWait bounds the wait for criu's question when the restore's ctx has
// no deadline.
const relockWait = 2 * time.Minute

// relockHook is fiberd's end of the hook of one restore.
type relockHook struct {
	script      string
	ask, answer *os.File
	done        chan error // the outcome, once serve has returned
	served      bool       // serve was started; set before it is
	once        sync.Once
	err         error
	// mark, when not 0, is the endpoint guard's mark serve gives the
	// restored fiber's listener (descriptor 3) before the fiber runs:
	// criu cannot restore it from inside the fiber's user namespace (see
	// unmarkForDump). Set before serve starts.
	mark uint32
}

// writeRelockHook writes the action script and makes the FIFOs in the
// image directory dir, and opens fiberd's ends (read and write, so that
// neither end's open blocks and a read waits for data, not for a writer).
func writeRelockHook(shell, dir string) (*relockHook, error) {
	h := &relockHook{script: filepath.Join(dir, relockScript), done: make(chan error, 1)}
	askPath, answerPath := filepath.Join(dir, relockAsk), filepath.Join(dir, relockAnswer)
	script := fmt.Sprintf("#!%s\n# fiberd: criu's action script for the restore of an isolated fiber\n"+
		"[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-resume ] || exit 0\n"+
		"echo \"$CRTOOLS_INIT_PID\" > %s\nread a < %s\n[ \"$a\" = ok ]\n", shell, askPath, answerPath)
	if err := core.WriteFileAtomic(h.script, []byte(script), 0o700); err != nil {
		return nil, fmt.Errorf("criu's action script: %w", err)
	}
	var err error
	if h.ask, err = openFIFO(askPath); err != nil {
		return nil, err
	}
	if h.answer, err = openFIFO(answerPath); err != nil {
		h.ask.Close()
		return nil, err
	}
	return h, nil
}

// openFIFO makes a FIFO at path (anew) and opens it for reading and
// writing, non-blocking, so reads wait in the runtime's poller and take a
// deadline.
func openFIFO(path string) (*os.File, error) {
	_ = os.Remove(path)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("criu's action script: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("criu's action script: %w", err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// serve waits until deadline for the script's question (the restored
// fiber's pid), makes that fiber's mounts read-only again and answers.
// When the relock fails it kills the fiber (signal 9 to pid, which is
// criu's restored task: criu has not let it run yet). It returns when it
// answered, when the FIFOs are closed (close) or at deadline; the outcome
// is on h.done. Nothing is asked when criu fails before pre-resume. The
// caller sets h.served before it starts serve.
func (h *relockHook) serve(deadline time.Time) {
	_ = h.ask.SetReadDeadline(deadline)
	line, err := bufio.NewReader(h.ask).ReadString('\n')
	if err != nil {
		h.done <- nil // never asked: criu failed first, or the restore ended
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err == nil && pid <= 0 {
		err = fmt.Errorf("pid %d", pid)
	}
	if err == nil {
		err = relockOnThread(pid)
	}
	if err == nil && h.mark != 0 {
		err = markRestored(pid, h.mark)
	}
	answer := "ok\n"
	if err != nil {
		err = fmt.Errorf("making the restored fiber's mounts read-only again, or marking its listener: %w", err)
		if pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		answer = "no\n"
	}
	_ = h.answer.SetWriteDeadline(deadline)
	_, _ = h.answer.WriteString(answer)
	h.done <- err
}

// close closes fiberd's ends, which ends a serve still waiting, and
// returns serve's outcome; later calls return nil. A hook that was never
// served is closed at once.
func (h *relockHook) close() error {
	h.once.Do(func() {
		h.ask.Close()
		if h.served {
			h.err = <-h.done
		}
		h.answer.Close()
	})
	return h.err
}

// relockOnThread runs relockMounts(pid) on an OS thread of its own, which
// ends with it: it has entered another mount namespace.
func relockOnThread(pid int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		errc <- relockMounts(pid)
	}()
	return <-errc
}

// relockMounts enters the mount namespace of the process at pid, on the
// calling thread, and makes every mount there read-only but the ones on
// top at the scratch directories and /proc.
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
		// Not there, or no mount of its own there: it stays read-only.
		if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("%s writable: %w", d, err)
		}
	}
	return nil
}

// markRestored gives the listener (descriptor 3) of the restored fiber at
// pid, which criu has not let run yet, the endpoint guard's mark.
func markRestored(pid int, mark uint32) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, 3, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd of the listener: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
		return fmt.Errorf("SO_MARK on the listener: %w", err)
	}
	return nil
}
