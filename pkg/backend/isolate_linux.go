package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"

	"fiberd.io/fiberd/pkg/core"
	"fiberd.io/fiberd/pkg/template"
)

// Isolating a grant.
//
// Every isolated process (a zygote, an exec fiber, the probe) is started
// from one dedicated OS thread of the backend, the spawner, which sits in a
// mount namespace of its own built once when the backend is created (see
// buildIsolationMounts): every mount of the host is read-only there (so
// no world-writable place of the host, such as /run/lock, passes anything
// between grants or sessions), /proc there is a second procfs instance with
// hidepid=invisible over the host's, and /tmp, /var/tmp and /dev/shm are
// empty read-only tmpfs mounts. Mounts the host makes later reach the
// spawner's namespace (it is the host's slave, so that it pins nothing the
// host unmounts) writable; the spawner makes every mount read-only again
// before it starts a process. The spawner also has no_new_privs, which
// every process it starts inherits. It starts nsinit (this binary again,
// see nsinit_linux.go) with clone flags for new user, mount, PID, IPC and
// UTS namespaces (and network for "network": "none"), the grant's uid and
// gid mapped to themselves and set, no supplementary group, and
// CAP_SYS_ADMIN (and CAP_NET_ADMIN) as ambient capabilities of the new user
// namespace. The new mount namespace is a copy of the spawner's owned by a
// less privileged user namespace, so the kernel locks every mount in it:
// not even a process with CAP_SYS_ADMIN in the grant's user namespace can
// unmount them. nsinit mounts a /proc of the grant's PID namespace and a
// tmpfs on each scratch directory on top (sized to the grant's wBudget, or
// Config.ScratchSize), drops what the template must
// not keep, and execs the template. Removing nsinit's mounts (which a
// zygote of IsolationFiber, keeping CAP_SYS_ADMIN there for its fibers'
// namespaces, could do) reveals only the locked ones: a /proc that shows
// the processes the grant's user could trace anyway, and empty read-only
// scratch directories.
//
// The template runs as a uid that owns nothing else on the host (a /proc
// of the host's, or fiberd's state directory, are closed to it by plain
// permissions), in PID namespaces where no other grant's process has a
// pid, so it can neither name nor reach another grant's processes.

// spawnerMounts are the mounts buildIsolationMounts makes over the host's:
// a procfs showing each process only those it may trace, and empty
// read-only scratch directories.
const hiddenProcOptions = "hidepid=invisible"

// sandbox isolates the grants of one backend. With Config.Isolation none it
// has no spawner and support is IsolationNone.
type sandbox struct {
	log     logr.Logger
	ids     *IDPool
	support IsolationSupport
	// cgroups is the spawner's descriptor of cgroupView as the host has
	// it, from before it was covered, or -1: whence a grant's own cgroup
	// is bound over the cover (see start).
	cgroups int
	// noPark says why fibers of isolated grants cannot be parked
	// (CheckpointIsolated), when the spawner could not make its covers
	// binds of isolationDir/empty; set before the spawner serves.
	noPark error
	// guard keeps the grants' TCP endpoints apart (guard_linux.go); nil
	// when the level is none or the host has no nftables
	// (support.EndpointsApart false then).
	guard *guard

	reqs chan func()   // run on the spawner thread
	quit chan struct{} // closed by close
	done chan struct{} // closed when the spawner has ended
	once sync.Once
}

// newSandbox finds what the host allows, up to cfg.Isolation, and starts
// the spawner when anything is. It logs one line at V(1) saying what it
// found, and what is missing when the host allows less than
// cfg.Isolation. perFiber says every
// process the backend starts is a fiber isolated on its own (exec): any
// isolation at all is then IsolationFiber.
func newSandbox(cfg Config, log logr.Logger, perFiber bool) *sandbox {
	s := &sandbox{log: log, ids: cfg.IDs, support: IsolationSupport{Level: IsolationNone}, cgroups: -1}
	want := cfg.Isolation
	if want == IsolationNone {
		return s
	}
	if missing := privilegeMissing(); missing != "" {
		s.support.Missing = missing
	} else if err := s.startSpawner(); err != nil {
		s.support.Missing = "the isolation mount namespace cannot be built: " + err.Error()
	} else {
		s.support = s.probe(cfg.Clock, cfg.WarmTimeout, want, perFiber)
		if s.support.Level == IsolationNone {
			s.close()
		} else if cfg.GrantNetworks {
			s.support.EndpointsApart = true // no other grant shares the network
		} else if cfg.NoEndpointGuard {
			s.support.addMissing("endpoints of different grants are not kept apart (the endpoint guard is off: Config.NoEndpointGuard)")
		} else if g, err := newGuard(cfg.Clock, log); err != nil {
			s.support.addMissing("endpoints of different grants are not kept apart: " + err.Error())
		} else {
			s.guard = g
			s.support.EndpointsApart = true
		}
	}
	// The agent says in one line at start what each backend gives (and
	// a library caller reads Isolation); the backend's own line is V(1).
	if !s.support.Level.AtLeast(want) || !s.support.NetworkNone || !s.support.EndpointsApart {
		log.V(1).Info("Isolation is less than asked", "asked", want.String(), "level", s.support.Level.String(),
			"networkNone", s.support.NetworkNone, "endpointsApart", s.support.EndpointsApart, "missing", s.support.Missing)
	} else {
		log.V(1).Info("Isolation", "level", s.support.Level.String(), "networkNone", true, "endpointsApart", true)
	}
	return s
}

// privilegeMissing says what keeps this process from isolating grants, or
// "" when nothing visible does (the probe has the last word).
func privilegeMissing() string {
	eff, err := effectiveCaps()
	if err != nil {
		return "cannot read fiberd's capabilities: " + err.Error()
	}
	var lack []string
	for _, c := range []struct {
		bit  uint
		name string
	}{{unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {unix.CAP_SETUID, "CAP_SETUID"}, {unix.CAP_SETGID, "CAP_SETGID"}, {unix.CAP_CHOWN, "CAP_CHOWN"}} {
		if eff&(1<<c.bit) == 0 {
			lack = append(lack, c.name)
		}
	}
	if len(lack) > 0 {
		return "fiberd runs without " + strings.Join(lack, ", ") + " (not as root): run it as root, or grant those capabilities, to give each grant a user and namespaces of its own"
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0): raise it (sysctl user.max_user_namespaces)"
	}
	return ""
}

// startSpawner starts the spawner goroutine, locked to its OS thread for
// good, and waits until its mount namespace is built.
func (s *sandbox) startSpawner() error {
	s.reqs = make(chan func())
	s.quit = make(chan struct{})
	s.done = make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		defer close(s.done)
		// Never unlocked: the thread holds the isolation mount namespace
		// and no_new_privs, and the runtime ends it with this goroutine.
		// The parent-death signal of every process started here fires
		// then, so close runs only once they are all gone.
		runtime.LockOSThread()
		var err error
		if s.cgroups, s.noPark, err = buildIsolationMounts(); err != nil {
			ready <- err
			return
		}
		defer func() {
			if s.cgroups >= 0 {
				_ = unix.Close(s.cgroups)
			}
		}()
		ready <- nil
		for {
			select {
			case f := <-s.reqs:
				f()
			case <-s.quit:
				return
			}
		}
	}()
	return <-ready
}

// buildIsolationMounts makes the calling thread's mount namespace the base
// every isolated grant's is copied from (see the comment at the top). It
// returns a descriptor of cgroupView from before it was covered, or -1,
// and, when the covers had to be tmpfs mounts (no isolationDir), why the
// fibers of isolated grants cannot be parked.
func buildIsolationMounts() (cgroups int, noPark, err error) {
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return -1, nil, fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return -1, nil, fmt.Errorf("make / a slave: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, hiddenProcOptions); err != nil {
		return -1, nil, fmt.Errorf("mount /proc with %s: %w", hiddenProcOptions, err)
	}
	cgroups = -1
	if fd, err := unix.Open(cgroupView, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		cgroups = fd
	}
	fail := func(err error) (int, error, error) {
		if cgroups >= 0 {
			_ = unix.Close(cgroups)
		}
		return -1, nil, err
	}
	empty, emptyErr := openEmptyDir()
	if emptyErr == nil {
		defer unix.Close(empty)
	} else {
		noPark = fmt.Errorf("the covers of an isolated grant's scratch directories are tmpfs mounts, which CRIU cannot dump: %w", emptyErr)
	}
	for _, d := range append(append([]string{}, scratchDirs...), coveredDirs...) {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		if emptyErr == nil {
			err = cover(d, empty)
		} else {
			err = unix.Mount("fiberd-empty", d, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=4k")
		}
		if err != nil {
			return fail(fmt.Errorf("cover %s: %w", d, err))
		}
	}
	if err := readOnlyHost(); err != nil {
		return fail(err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail(fmt.Errorf("no_new_privs: %w", err))
	}
	return cgroups, noPark, nil
}

// cover binds the empty directory open on empty over dir, read-only. A
// bind of a host directory rather than an empty tmpfs: CRIU finds it again
// on the host when it parks a fiber (an external mount), where a tmpfs
// would be dumped, which it cannot do for a locked mount with a locked one
// on top (see shelf_linux.go).
func cover(dir string, empty int) error {
	src := "/proc/self/fd/" + strconv.Itoa(empty)
	if err := unix.Mount(src, dir, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// readOnlyHost makes every mount of the calling thread's mount namespace
// read-only, but the /proc on top, where the spawner writes the user and
// group id maps of the processes it starts. Device nodes, sockets and
// pipes stay usable (the kernel asks a read-only mount only about files
// and directories), so /dev/null still takes writes. It needs Linux 5.12
// (mount_setattr) and costs about a microsecond for twenty mounts.
func readOnlyHost() error {
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("make the host's mounts read-only (mount_setattr, Linux 5.12 or later): %w", err)
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/proc", 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("leave /proc writable for the id maps: %w", err)
	}
	return nil
}

// showCgroup binds the grant's cgroup directory, read-only, over the
// covered cgroupView of the spawner's mount namespace, so the grant's copy
// of it shows (locked) that cgroup alone; hideCgroup removes the bind
// again once the process has its copy. Both run on the spawner thread. A
// cgroup outside cgroupView is not shown.
func (s *sandbox) showCgroup(dir string) (bool, error) {
	rel, ok := strings.CutPrefix(filepath.Clean(dir), cgroupView+"/")
	if dir == "" || !ok || s.cgroups < 0 {
		return false, nil
	}
	src := "/proc/self/fd/" + strconv.Itoa(s.cgroups) + "/" + rel
	if err := unix.Mount(src, cgroupView, "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("show the grant's cgroup %s: %w", dir, err)
	}
	if err := unix.Mount("", cgroupView, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		_ = unix.Unmount(cgroupView, unix.MNT_DETACH)
		return false, fmt.Errorf("show the grant's cgroup %s read-only: %w", dir, err)
	}
	return true, nil
}

func hideCgroup() { _ = unix.Unmount(cgroupView, unix.MNT_DETACH) }

// start runs cmd.Start on the spawner thread, with the grant's cgroup
// directory (or "") shown at cgroupView.
func (s *sandbox) start(cmd *exec.Cmd, cgroupDir string) error {
	errc := make(chan error, 1)
	run := func() {
		// Whatever the host mounted since the last start arrived
		// writable.
		if err := readOnlyHost(); err != nil {
			errc <- err
			return
		}
		shown, err := s.showCgroup(cgroupDir)
		if err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
		if shown {
			hideCgroup()
		}
	}
	select {
	case s.reqs <- run:
	case <-s.done:
		return errClosed
	}
	return <-errc
}

// close ends the spawner. The backend calls it from Close, once every
// process it started is gone.
func (s *sandbox) close() {
	if s.guard != nil {
		s.guard.close()
	}
	if s.quit == nil {
		return
	}
	s.once.Do(func() { close(s.quit) })
	<-s.done
}

// probe starts nsinit as a grant would be started, in probe mode, and
// returns what it found: first with a network namespace, and, should that
// fail, without one.
func (s *sandbox) probe(clk clock.WithDelayedExecution, timeout time.Duration, want Isolation, perFiber bool) IsolationSupport {
	try := func(network bool) (level Isolation, why string) {
		msg, err := s.runProbe(clk, timeout, network)
		switch {
		case err != nil:
			return IsolationNone, err.Error()
		case msg == "ok fiber":
			return IsolationFiber, ""
		case strings.HasPrefix(msg, "ok grant"):
			return IsolationGrant, strings.TrimPrefix(strings.TrimPrefix(msg, "ok grant"), ": ")
		}
		return IsolationNone, "the isolation probe failed: " + msg
	}
	level, why := try(true)
	network, netWhy := level != IsolationNone, ""
	if !network {
		netWhy = "a network namespace of its own cannot be made, so \"network\": \"none\" is refused (" + why + ")"
		level, why = try(false)
	}
	if perFiber && level == IsolationGrant {
		level, why = IsolationFiber, ""
	}
	sup := IsolationSupport{Level: least(level, want), NetworkNone: network}
	if perFiber && sup.Level == IsolationGrant {
		sup.Level = IsolationFiber
	}
	var missing []string
	if !sup.Level.AtLeast(want) && why != "" {
		missing = append(missing, why)
	}
	if netWhy != "" {
		missing = append(missing, netWhy)
	}
	sup.Missing = strings.Join(missing, "; ")
	return sup
}

// runProbe starts nsinit in probe mode and returns what it reported.
func (s *sandbox) runProbe(clk clock.WithDelayedExecution, timeout time.Duration, network bool) (string, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return "", err
	}
	defer devnull.Close()
	cfg := nsinitConfig{Probe: "grant", Hostname: "fiberd-probe", Loopback: network, ScratchSize: probeScratchSize}
	st, err := s.prepare(isoStart{id: s.ids.first, network: network, keepAdmin: true, cfg: cfg, fd3: devnull, cgroupFD: -1})
	if err != nil {
		return "", err
	}
	defer st.closeParent()
	var out strings.Builder
	st.cmd.Stderr = &out
	if err := s.start(st.cmd, ""); err != nil {
		st.closeChild()
		return "", err
	}
	st.closeChild()
	ctx, cancel := core.WithTimeout(context.Background(), clk, timeout)
	stop := context.AfterFunc(ctx, func() { _ = st.status.SetReadDeadline(past) })
	msg, rerr := readStatus(st.status)
	stop()
	cancel()
	if rerr != nil {
		_ = st.cmd.Process.Kill()
	}
	err = st.cmd.Wait()
	if msg == "" && err != nil {
		msg = fmt.Sprintf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	if err != nil && !strings.HasPrefix(msg, "ok") {
		return "", errors.New(msg)
	}
	return msg, nil
}

// isoStart is one isolated process to start.
type isoStart struct {
	id        uint32 // the grant's uid and gid
	network   bool   // a network namespace of its own
	keepAdmin bool   // CAP_SYS_ADMIN stays with the template (IsolationFiber zygote)
	cfg       nsinitConfig
	fd3       *os.File // the control socket or listener
	command   *os.File // the template, opened by fiberd; nil for the probe
	home      *os.File // its home directory; nil for the probe or with a workdir
	argv      []string // the template's argv
	env       []string // the template's environment
	out       *os.File // stdout and stderr
	cgroupFD  int      // -1 for none
}

// started is an isoStart with its command built and the status pipe open.
type started struct {
	cmd    *exec.Cmd
	status *os.File // fiberd's end
	child  *os.File // nsinit's end, closed once started
}

func (st *started) closeChild() {
	if st.child != nil {
		_ = st.child.Close()
		st.child = nil
	}
}

func (st *started) closeParent() { _ = st.status.Close() }

// prepare builds the command that starts nsinit for st.
func (s *sandbox) prepare(st isoStart) (*started, error) {
	cfg, err := json.Marshal(st.cfg)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("status pipe: %w", err)
	}
	flags := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	caps := []uintptr{unix.CAP_SYS_ADMIN}
	if st.network {
		flags |= unix.CLONE_NEWNET
		caps = append(caps, unix.CAP_NET_ADMIN)
	}
	attr := &syscall.SysProcAttr{
		Setsid:                     true,
		Pdeathsig:                  syscall.SIGKILL,
		Cloneflags:                 flags,
		UidMappings:                idMap(st.id),
		GidMappings:                idMap(st.id),
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: st.id, Gid: st.id, Groups: []uint32{}},
		AmbientCaps:                caps,
	}
	if st.cgroupFD >= 0 {
		attr.UseCgroupFD = true
		attr.CgroupFD = st.cgroupFD
	}
	extra := []*os.File{st.fd3, w}
	if st.command != nil {
		extra = append(extra, st.command)
		if st.home != nil {
			extra = append(extra, st.home)
		}
	}
	env := append(append([]string{}, st.env...), nsinitEnv+"=1")
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        append([]string{nsinitArg0, string(cfg)}, st.argv...),
		Env:         env,
		ExtraFiles:  extra,
		SysProcAttr: attr,
	}
	if st.out != nil {
		cmd.Stdout, cmd.Stderr = st.out, st.out
	}
	return &started{cmd: cmd, status: r, child: w}, nil
}

// idMap is the user (and group) id map of the user namespace of a grant
// running as id: id to itself, and root to rootID(id), as which nothing
// runs (the grant's processes start as id with no_new_privs, and no file
// of the host is owned by rootID); CRIU needs root mapped to dump the
// namespace and to restore it.
func idMap(id uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{
		{ContainerID: 0, HostID: int(rootID(id)), Size: 1},
		{ContainerID: int(id), HostID: int(id), Size: 1},
	}
}

// past is a read deadline that has passed: setting it wakes a blocked read.
var past = time.Unix(1, 0)

// readStatus reads nsinit's status pipe until it ends: "" when nsinit
// exec'd the template, else what it reported. A read deadline set on r
// (by whoever bounds the wait) ends it with an error.
func readStatus(r *os.File) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, 4096))
	if err != nil {
		return strings.TrimSpace(string(b)), fmt.Errorf("isolation set-up did not finish: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// grantLevel is the level a grant gets on this backend for spec, and
// whether it may be warmed at all (MinIsolation, network: none).
func (s *sandbox) grantLevel(req WarmRequest) (Isolation, error) {
	level := s.support.Level
	if req.Spec.Isolation == template.IsolationShared && level == IsolationFiber {
		level = IsolationGrant
	}
	if !level.AtLeast(req.MinIsolation) {
		why := s.support.Missing
		if why == "" {
			why = "the backend is configured for less"
		}
		return "", fmt.Errorf("grant %q: needs isolation %s, this backend gives %s (%s): %w", req.Grant.UID, req.MinIsolation, level, why, core.ErrTierGap)
	}
	if req.Spec.Network == template.NetworkNone && (level == IsolationNone || !s.support.NetworkNone) {
		why := s.support.Missing
		if why == "" {
			why = "isolation is off"
		}
		return "", fmt.Errorf("grant %q: template asks for \"network\": \"none\", which this backend cannot give (%s): %w", req.Grant.UID, why, core.ErrTierGap)
	}
	return level, nil
}

// homeDir makes RunDir/home owned by the grant's id (0700) and opens it
// (O_PATH: nsinit changes into it, and fiberd reads nothing in it). RunDir
// itself is fiberd's (0700), so the template cannot reach anything else in
// it, and nothing it does inside home misleads fiberd. A home its grant
// already owns, 0700 (fiberd restarted), is taken as it is; any other is
// made 0700 while it is fiberd's and then given away, which needs only
// CAP_CHOWN of a fiberd that is not root (a grant Pod): not CAP_FOWNER,
// nor CAP_DAC_READ_SEARCH to open a home that is no longer fiberd's.
func homeDir(runDir string, id uint32) (*os.File, error) {
	home := filepath.Join(runDir, "home")
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("home directory: %w", err)
	}
	fd, err := unix.Open(home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("home directory %s: %w", home, err)
	}
	f := os.NewFile(uintptr(fd), home)
	if err := giveHome(fd, id); err != nil {
		f.Close()
		return nil, fmt.Errorf("home directory %s: %w", home, err)
	}
	return f, nil
}

// giveHome makes the directory open on fd (O_PATH) the grant's: mode 0700,
// owned by id. A chmod through an O_PATH descriptor goes by its
// /proc/self/fd link.
func giveHome(fd int, id uint32) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Uid == id && st.Gid == id && st.Mode&0o7777 == 0o700 {
		return nil
	}
	if int(st.Uid) != os.Geteuid() {
		// Another's (a home given away with another mode): take it back.
		if err := unix.Fchownat(fd, "", os.Geteuid(), os.Getegid(), unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("chown to fiberd: %w", err)
		}
	}
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o700); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := unix.Fchownat(fd, "", int(id), int(id), unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	return nil
}

// openCommand opens the template's command for nsinit to exec: the file
// fiberd resolved, so its path need not be reachable by the grant's user.
// The grant's user still needs execute permission on the file itself.
func openCommand(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	return f, nil
}

// isolationEnv is FIBERD_ISOLATION, which tells a zygote (the SDKs) what
// to do per fiber, and a fiber what it got; an isolated one also gets
// FIBERD_SCRATCH_SIZE, the size in bytes of each scratch tmpfs the SDKs
// mount for a fiber at IsolationFiber.
func isolationEnv(level Isolation, scratch int64) []string {
	env := []string{"FIBERD_ISOLATION=" + level.String()}
	if level != IsolationNone {
		env = append(env, "FIBERD_SCRATCH_SIZE="+strconv.FormatInt(scratch, 10))
	}
	return env
}

// nsInode is the inode of a process's namespace of kind ("pid", "mnt").
func nsInode(pid int, kind string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/"+kind, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// fiberLevel is the level a fiber of a zygote at grantLevel actually got:
// IsolationFiber only when it is in PID and mount namespaces other than its
// zygote's.
func fiberLevel(grantLevel Isolation, fiberPID, zygotePID int) Isolation {
	if grantLevel != IsolationFiber {
		return grantLevel
	}
	for _, kind := range []string{"pid", "mnt"} {
		a, err1 := nsInode(fiberPID, kind)
		b, err2 := nsInode(zygotePID, kind)
		if err1 != nil || err2 != nil || a == b {
			return IsolationGrant
		}
	}
	return IsolationFiber
}

// waitStatus reads st's status pipe until nsinit exec'd the template or
// reported a failure, bounded by ctx. On failure it kills the process; the
// caller still waits for it.
func waitStatus(ctx context.Context, st *started) error {
	stop := context.AfterFunc(ctx, func() { _ = st.status.SetReadDeadline(past) })
	defer stop()
	msg, err := readStatus(st.status)
	if err == nil && msg == "" {
		return nil
	}
	_ = st.cmd.Process.Kill()
	if msg == "" {
		return err
	}
	return fmt.Errorf("isolation: %s", msg)
}
