package backend

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nsinit is the first program of an isolated grant: the binary that links
// this package (fiberd, or a test binary) started again as
// /proc/self/exe with argv[0] nsinitArg0 and nsinitEnv in its environment,
// inside the grant's new user, mount, PID, IPC and UTS (and network)
// namespaces, already running as the grant's user with the capabilities it
// needs there as ambient ones. It finishes what only a process inside the
// namespaces can do before any code of the template runs (see
// nsinitSetup), then replaces itself with the template (execveat of the
// descriptor fiberd opened the command on). It is entered from this
// package's init, so every binary that can start an isolated grant can
// also be its nsinit without wiring of its own; a binary started any other
// way is not affected.
//
// Its descriptors: 3 is the zygote's control socket or the exec fiber's
// listener (left alone), 4 the status pipe to fiberd, 5 the template's
// command, 6 the grant's home directory (when no workdir is given). On
// failure it writes "<step>: <error>" to 4 and exits 127; on success the
// exec closes 4, which fiberd reads as end of file.
const (
	nsinitArg0     = "fiberd-nsinit"
	nsinitEnv      = "FIBERD_NSINIT"
	nsinitStatusFD = 4
	nsinitCommand  = 5
	nsinitHomeFD   = 6
	nsinitExitCode = 127
)

// nsinitConfig is nsinit's argv[1], JSON.
type nsinitConfig struct {
	// Hostname is set in the new UTS namespace.
	Hostname string `json:"hostname,omitempty"`
	// Loopback brings lo up: the grant has a network namespace of its own.
	Loopback bool `json:"loopback,omitempty"`
	// KeepAdmin keeps CAP_SYS_ADMIN (in the grant's user namespace) as an
	// ambient capability across the exec, for a zygote that gives each
	// fiber namespaces of its own; every other capability is dropped.
	KeepAdmin bool `json:"keepAdmin,omitempty"`
	// Workdir is the directory to start in; "" is the home directory on
	// descriptor 6.
	Workdir string `json:"workdir,omitempty"`
	// ListenPID sets LISTEN_PID to nsinit's own pid, which the template
	// keeps across the exec (an exec fiber).
	ListenPID bool `json:"listenPID,omitempty"`
	// ScratchSize is the size in bytes of each tmpfs mounted on a scratch
	// directory; 0 leaves the kernel's default (half the host's memory).
	ScratchSize int64 `json:"scratchSize,omitempty"`
	// Probe is "grant" for the probe a backend runs at creation, "fiber"
	// for the child that probe starts; "" starts a template.
	Probe string `json:"probe,omitempty"`
}

func init() {
	if len(os.Args) < 2 || os.Args[0] != nsinitArg0 || os.Getenv(nsinitEnv) == "" {
		return
	}
	// Capabilities, no_new_privs and the exec are per thread: keep the
	// main goroutine on this one to the end.
	runtime.LockOSThread()
	// The exit system call itself, not os.Exit: nsinit has nothing to
	// flush, and a race-detector build's os.Exit waits a second first
	// (GORACE atexit_sleep_ms), in every isolation probe and every
	// isolated process that ends without exec'ing its command.
	unix.Exit(nsinitMain())
}

// nsinitMain runs nsinit and returns its exit code when it did not exec.
func nsinitMain() int {
	fail := func(step string, err error) int {
		report(fmt.Sprintf("%s: %v", step, err))
		return nsinitExitCode
	}
	var cfg nsinitConfig
	if err := json.Unmarshal([]byte(os.Args[1]), &cfg); err != nil {
		return fail("nsinit configuration", err)
	}
	if cfg.Probe == "fiber" {
		return nsinitProbeFiber()
	}
	if !nsinitParentAlive() {
		// fiberd died before the runtime set the parent-death signal: nothing
		// would end this process, and no record of it was made.
		return nsinitExitCode
	}
	if err := nsinitSetup(cfg); err != nil {
		return fail("isolation set-up", err)
	}
	if cfg.Probe == "grant" {
		// Report what a zygote here could do for its fibers.
		if err := nsinitTryFiber(); err != nil {
			report("ok grant: a zygote cannot give each fiber namespaces of its own: " + err.Error())
		} else {
			report("ok fiber")
		}
		return 0
	}
	if cfg.Workdir != "" {
		if err := unix.Chdir(cfg.Workdir); err != nil {
			return fail("workdir "+cfg.Workdir, err)
		}
	} else if err := unix.Fchdir(nsinitHomeFD); err != nil {
		return fail("home directory", err)
	}
	_ = unix.Close(nsinitHomeFD)
	if err := nsinitCaps(cfg.KeepAdmin); err != nil {
		return fail("capabilities", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail("no_new_privs", err)
	}
	if _, err := unix.FcntlInt(nsinitStatusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fail("status descriptor", err)
	}
	// A script is run by its interpreter through /dev/fd/5, which must
	// stay open across the exec; a binary needs no descriptor.
	cloexec := unix.FD_CLOEXEC
	var head [2]byte
	if n, _ := unix.Pread(nsinitCommand, head[:], 0); n == 2 && string(head[:]) == "#!" {
		cloexec = 0
	}
	if _, err := unix.FcntlInt(nsinitCommand, unix.F_SETFD, cloexec); err != nil {
		return fail("command descriptor", err)
	}
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, nsinitEnv+"=") {
			env = append(env, kv)
		}
	}
	if cfg.ListenPID {
		env = append(env, "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	}
	err := execveat(nsinitCommand, os.Args[2:], env)
	return fail("exec "+os.Args[2], err)
}

// report writes msg to the status descriptor (not wrapped in an os.File,
// whose finalizer would close it).
// nsinitParentAlive reports whether the fiberd that started nsinit still
// reads its status pipe. The parent-death signal the runtime sets in the
// child only covers a parent that dies after it is set, and the runtime's
// own check of the parent after setting it (getppid against the pid it
// forked from) cannot see the parent from the first process of a new PID
// namespace, which reads 0 either way; so nsinit, which starts after the
// signal is set, looks instead at the read end of its status pipe, which
// only fiberd holds: a write end whose pipe has no reader left polls as an
// error. fiberd keeps reading until nsinit execs or fails, so a live fiberd
// always holds it here.
func nsinitParentAlive() bool {
	fds := []unix.PollFd{{Fd: nsinitStatusFD}}
	for {
		_, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		return fds[0].Revents&(unix.POLLERR|unix.POLLNVAL) == 0
	}
}

func report(msg string) {
	_, _ = unix.Write(nsinitStatusFD, []byte(msg))
}

// nsinitSetup does, inside the new namespaces, what needs a process there:
// a /proc of the new PID namespace over the hidepid one of the isolation
// mount namespace (see buildIsolationMounts), a fresh tmpfs of
// cfg.ScratchSize on /tmp, /var/tmp and /dev/shm (each over the empty
// read-only one there), the
// message queues of the new IPC namespace on /dev/mqueue, the host name,
// and loopback.
func nsinitSetup(cfg nsinitConfig) error {
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := mountScratch(cfg.ScratchSize); err != nil {
		return err
	}
	if st, err := os.Stat("/dev/mqueue"); err == nil && st.IsDir() {
		if err := unix.Mount("mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount /dev/mqueue: %w", err)
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("host name: %w", err)
		}
	}
	if cfg.Loopback {
		if err := loopbackUp(); err != nil {
			return fmt.Errorf("loopback: %w", err)
		}
	}
	return nil
}

// mountScratch mounts a tmpfs of size bytes (0: the kernel's default) on
// each scratch directory there is.
func mountScratch(size int64) error {
	opts := "mode=1777"
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	for _, d := range scratchDirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", d, err)
		}
	}
	return nil
}

// loopbackUp sets IFF_UP on lo.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// nsinitCaps leaves this thread with CAP_SYS_ADMIN alone, ambient (keep),
// or with no capability at all. The uid is not 0 in the grant's user
// namespace, so the exec keeps exactly the ambient set.
func nsinitCaps(keep bool) error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient: %w", err)
	}
	var set uint32
	if keep {
		set = 1 << unix.CAP_SYS_ADMIN
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: set, Permitted: set, Inheritable: set}}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if keep {
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_SYS_ADMIN, 0, 0); err != nil {
			return fmt.Errorf("ambient CAP_SYS_ADMIN: %w", err)
		}
	}
	return nil
}

// execveat replaces the process with the file open on fd.
func execveat(fd int, argv, env []string) error {
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return err
	}
	empty, err := syscall.BytePtrFromString("")
	if err != nil {
		return err
	}
	_, _, errno := unix.RawSyscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return errno
}

// nsinitTryFiber starts the "fiber" probe: nsinit again, in PID, mount and
// IPC namespaces of its own, as a zygote's fiber would be.
func nsinitTryFiber() error {
	cfg, _ := json.Marshal(nsinitConfig{Probe: "fiber"})
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{nsinitArg0, string(cfg)}
	cmd.Env = []string{nsinitEnv + "=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// probeScratchSize is the size of the probe's scratch mounts.
const probeScratchSize = 1 << 20

// nsinitProbeFiber is what a zygote's SDK does in a fiber at
// IsolationFiber: a /proc and scratch directories of its own, then no
// capability left. It also checks the fiber cannot undo its mounts.
func nsinitProbeFiber() int {
	steps := []struct {
		name string
		do   func() error
	}{
		{"private mounts", func() error { return unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "") }},
		{"mount /proc", func() error {
			return unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		}},
		{"scratch", func() error { return mountScratch(probeScratchSize) }},
		{"drop capabilities", func() error { return nsinitCaps(false) }},
		{"umount must fail", func() error {
			if err := unix.Unmount("/tmp", unix.MNT_DETACH); !errors.Is(err, unix.EPERM) {
				return fmt.Errorf("umount /tmp without capabilities: %v, want EPERM", err)
			}
			return nil
		}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v", s.name, err)
			return 1
		}
	}
	return 0
}
