"""fiberzygote: the template side of fiberd's zygote protocol, in Python.

A zygote is a template that initialises once and then forks one fiber per
request from fiberd. fiberd starts it with a SOCK_SEQPACKET control socket as
descriptor 3 (CONTROL_FD). The template does its expensive initialisation
(imports, loading data), then calls serve(on_fiber), which says READY and
from then on handles:

    fiberd -> zygote  "CLONE <fence> <payload-hex|->" with SCM_RIGHTS
                      [listener] or [listener, leaf], the leaf being an
                      O_PATH descriptor of the fiber's cgroup.procs
    zygote -> fiberd  "CLONED <fence> <pid>" with SCM_RIGHTS [pidfd of the
                      child], once the child is set up
                      "ERROR <fence> <reason>" when it could not be
                      "EXITED <fence> exit:<code>" or
                      "EXITED <fence> signal:<SIGNAME>" when the child ended

Before any user code runs the child, on Linux, asks for SIGKILL when its
zygote dies (prctl PR_SET_PDEATHSIG through ctypes; fiberd starts the zygote
the same way, so a fiberd killed with SIGKILL leaves no fiber running), then
starts a new session (the fiber and its
descendants form one process group), enters the leaf cgroup by opening
/proc/self/fd/<leaf> for writing (with its own credentials: the descriptor
carries none) and writing "0", moves the listener to descriptor 3
(LISTEN_FD), closes
the control socket and sets LISTEN_FDS=1, LISTEN_PID=<its pid>, FIBERD_FENCE
and FIBERD_PAYLOAD (hex; absent when there is no payload). Then it calls
on_fiber(fiber) and exits: with the int it returns, 0 for None, the code of
a SystemExit, 1 for any other exception.

With FIBERD_ISOLATION=fiber in the environment (fiberd then leaves the
zygote CAP_SYS_ADMIN in the grant's user namespace) every child is PID 1 of
a PID namespace of its own (unshare(CLONE_NEWPID) before os.fork, setns
back after), and before user code enters mount and IPC namespaces of its
own, mounts a /proc of its own and a tmpfs on /tmp, /var/tmp and /dev/shm
(each FIBERD_SCRATCH_SIZE bytes, when fiberd gives that), and drops every capability (through ctypes). Like any PID 1 it is not ended
by a signal it sends itself unless it handles it, and the processes it
starts end with it. The pid in CLONED is then the child's pid in the
zygote's namespace; the pidfd names it for fiberd.

Spares: serve says "READY spares". On "SPARE <name>" it forks a spare, a
child that does the set-up above that needs no identity (parent-death
signal, session, isolation), closes the control socket and blocks on one end
of a new SOCK_SEQPACKET pair, whose other end goes to fiberd with "SPARED
<name> <pid>" (and a pidfd). fiberd then puts the spare in its fiber's leaf
and sends "TAKE <fence> <payload-hex|->" with [listener] on it; the spare
moves the listener to descriptor 3, sets the environment as above and calls
on_fiber exactly as a cloned child does (nothing is answered). A spare whose
socket fiberd closes exits 0. The zygote reaps spares like fibers and reports
them with "EXITED <name> ...", also after they became fibers. See
docs/templates.md.

serve calls gc.freeze() before READY, so collections in fibers leave the
zygote's objects (and their pages) alone. serve reaps every child, so a
crashing fiber is reported as EXITED and the zygote keeps serving. On Linux
serve also makes the zygote a child subreaper (prctl through ctypes), so
processes a fiber started and left behind are reparented to the zygote and
reaped there, not left as zombies of fiberd; fibers do not inherit this.
When fiberd closes the control socket, serve kills its fibers' process
groups, reaps them and returns. serve raises NotAZygote, and
serves nothing, when descriptor 3 is not a unix SOCK_SEQPACKET socket.

Only the standard library is used (socket.recv_fds needs Python 3.9).
"""

import gc
import os
import select
import signal
import socket
import stat
import sys
import traceback

__all__ = ["CONTROL_FD", "LISTEN_FD", "Fiber", "NotAZygote", "serve", "socket_activated"]

CONTROL_FD = 3
"""The descriptor fiberd hands a zygote its control socket on."""

LISTEN_FD = 3
"""The descriptor a fiber finds its listening socket on."""

_MSG_MAX = 16384  # a CLONE carries at most 4096 payload bytes as hex
_MAX_FDS = 4
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_MNT_DETACH = 2  # umount2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # a fiber's own tmpfs each


class NotAZygote(RuntimeError):
    """The control socket is missing: the process was not started by fiberd."""


class Fiber:
    """What a fiber is told about itself.

    fence: "uid/epoch/seq" (also FIBERD_FENCE); payload: the decoded payload
    bytes (b"" when none); listen_fd: always LISTEN_FD.
    """

    __slots__ = ("fence", "payload", "listen_fd")

    def __init__(self, fence, payload):
        self.fence = fence
        self.payload = payload
        self.listen_fd = LISTEN_FD

    def listener(self):
        """Return the listener as a socket.socket (family and type detected)."""
        return socket.socket(fileno=self.listen_fd)


def socket_activated():
    """Whether a listener was handed over on descriptor 3 by the exec backend
    (or any systemd-style activator): LISTEN_FDS=1 and LISTEN_PID is our pid.
    A template that runs both ways checks it first and then serves directly."""
    return os.environ.get("LISTEN_FDS") == "1" and os.environ.get("LISTEN_PID") == str(os.getpid())


def _signame(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return "SIG%d" % n


def _prctl():
    """Return a function calling Linux prctl(option, arg) through ctypes, or
    None off Linux or without ctypes. Loaded once, in the zygote, so a fiber
    calls it without importing anything."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)

        def prctl(option, arg):
            if libc.prctl(option, ctypes.c_ulong(arg), zero, zero, zero) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return prctl
    except (ImportError, AttributeError, OSError):
        return None


def _become_subreaper(prctl):
    """Mark this process a child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER),
    so orphans of fibers come to the zygote, whose reap() ends them. Fails
    soft: a note on stderr, and orphans go to fiberd as before."""
    if not sys.platform.startswith("linux"):
        return
    try:
        if prctl is None:
            raise OSError("prctl is not reachable through ctypes")
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError as e:
        sys.stderr.write("fiberzygote: cannot become a child subreaper (%s); orphans of fibers go to fiberd\n" % e)


class _Isolation:
    """Gives each fiber a PID, mount and IPC namespace of its own, when the
    zygote runs with FIBERD_ISOLATION=fiber (fiberd then leaves it
    CAP_SYS_ADMIN in its user namespace for this): unshare(CLONE_NEWPID)
    before the fork makes the child PID 1 of a new namespace, setns back
    afterwards keeps the next child out of it; the child mounts a /proc of
    its own and a tmpfs on each scratch directory and drops every
    capability before user code runs.

    Everything the child calls is looked up and built here, in the zygote:
    the libc functions with their argument types, every argument, the list
    of scratch directories. A ctypes function's first call creates objects
    and a call without argtypes converts each argument, and in a fiber each
    of those writes is a copy-on-write fault of a page shared with the
    zygote; on a 2-core VM whose faults cost 12 us each, this took the
    set-up from 2.1 ms and 100 faults to 0.7 ms and 35 (docs/design.md,
    decision 75)."""

    def __init__(self):
        import ctypes as ct
        libc = ct.CDLL(None, use_errno=True)
        ulong, vp, cp = ct.c_ulong, ct.c_void_p, ct.c_char_p

        def fn(name, *argtypes):
            f = getattr(libc, name)
            f.argtypes, f.restype = argtypes, ct.c_int
            return f

        self._get_errno = ct.get_errno
        self._unshare = fn("unshare", ct.c_int)
        self._setns = fn("setns", ct.c_int, ct.c_int)
        mount = fn("mount", cp, cp, cp, ulong, vp)
        umount2 = fn("umount2", cp, ct.c_int)
        prctl = fn("prctl", ct.c_int, ulong, ulong, ulong, ulong)
        capset = fn("capset", vp, vp)
        hdr = (ct.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (ct.c_uint32 * 6)()
        scratch = tuple(d.encode() for d in _SCRATCH if os.path.isdir(d))
        tmpfs = b"mode=1777"
        size = os.environ.get("FIBERD_SCRATCH_SIZE", "")
        if size.isdigit() and int(size) > 0:
            tmpfs += b",size=" + size.encode()
        # (what, function, arguments) in order; the first failure ends the set-up.
        self._steps = (
            ("unshare(CLONE_NEWNS|CLONE_NEWIPC)", self._unshare, (_CLONE_NEWNS | _CLONE_NEWIPC,)),
            ("private mounts", mount, (None, b"/", None, _MS_REC | _MS_PRIVATE, None)),
            ("mount /proc", mount, (b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)),
        ) + tuple(
            step
            for d in scratch
            for step in (
                # The grant's scratch goes first, so that a parked fiber's
                # image holds one tmpfs per directory, not two (each costs
                # criu a tar run); a failure (nothing mounted there) is no
                # matter: the fiber's own goes on top either way.
                (None, umount2, (d, _MNT_DETACH)),
                ("mount tmpfs on " + d.decode(), mount, (b"tmpfs", d, b"tmpfs", _MS_NOSUID | _MS_NODEV, tmpfs)),
            )
        ) + (
            ("clear ambient capabilities", prctl, (_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)),
            ("capset", capset, (hdr, data)),
        )
        self.pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def _check(self, what, ret):
        if ret != 0:
            e = self._get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    def before_fork(self):
        self._check("unshare(CLONE_NEWPID)", self._unshare(_CLONE_NEWPID))

    def after_fork(self):
        self._check("setns to the zygote's PID namespace", self._setns(self.pidns, _CLONE_NEWPID))

    def in_fiber(self):
        os.close(self.pidns)
        for what, f, args in self._steps:
            if f(*args) != 0 and what is not None:
                self._check(what, -1)


def _control_socket(fd):
    try:
        st = os.fstat(fd)
    except OSError as e:
        raise NotAZygote("descriptor %d is not open (%s): start this template from fiberd, "
                         "or with LISTEN_FDS for a cold start" % (fd, e.strerror)) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise NotAZygote("descriptor %d is not a socket: start this template from fiberd, "
                         "or with LISTEN_FDS for a cold start" % fd)
    s = socket.socket(fileno=fd)
    if s.family != socket.AF_UNIX or s.type != socket.SOCK_SEQPACKET:
        s.detach()
        raise NotAZygote("descriptor %d is not fiberd's control socket (a unix SOCK_SEQPACKET socket)" % fd)
    return s


class _Zygote:
    def __init__(self, ctl, on_fiber, prctl, on_spare=None):
        self.ctl = ctl
        self.on_fiber = on_fiber
        self.on_spare = on_spare
        self.prctl = prctl
        self.kids = {}  # pid -> fence
        self.iso = None
        if os.environ.get("FIBERD_ISOLATION") == "fiber" and sys.platform.startswith("linux"):
            try:
                self.iso = _Isolation()
            except (ImportError, AttributeError, OSError) as e:
                sys.stderr.write("fiberzygote: isolation: %s; fibers share the zygote's namespaces\n" % e)

    def send_fd(self, text, fd):
        """Send text with fd attached (SCM_RIGHTS)."""
        socket.send_fds(self.ctl, [text.encode()], [fd])

    def send(self, text):
        self.ctl.send(text.encode())

    def reap(self, block=False):
        # Children that are not fibers (orphans of fibers, reparented to
        # this subreaper) are reaped and ignored.
        while self.kids or not block:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fence = self.kids.pop(pid, None)
            if fence is None or self.ctl is None:
                continue
            if os.WIFSIGNALED(status):
                how = "signal:" + _signame(os.WTERMSIG(status))
            else:
                how = "exit:%d" % os.waitstatus_to_exitcode(status)
            self.send("EXITED %s %s" % (fence, how))

    def _fork(self):
        """Fork a child, with isolation into a PID namespace of its own;
        return its pid (0 in the child). Raises OSError when it cannot. A
        zygote that cannot return to its own PID namespace afterwards
        exits 70: every later child would land in this one's."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = -1
        try:
            if self.iso is not None:
                self.iso.before_fork()
            pid = os.fork()
        finally:
            if self.iso is not None and pid != 0:
                try:
                    self.iso.after_fork()
                except OSError as e:
                    sys.stderr.write("fiberzygote: %s; exiting\n" % e)
                    os._exit(70)
        return pid

    def clone(self, text, fds, wake):
        parts = text.split(" ")
        if len(parts) < 2 or not parts[1]:
            sys.stderr.write("fiberzygote: CLONE without a fence; ignored\n")
            return
        fence = parts[1]
        if len(parts) != 3:
            self.send("ERROR %s malformed CLONE: want CLONE <fence> <payload-hex|->" % fence)
            return
        if not 1 <= len(fds) <= 2:
            self.send("ERROR %s CLONE must carry the listener and at most a leaf cgroup descriptor" % fence)
            return
        hexpayload = parts[2]
        try:
            payload = b"" if hexpayload == "-" else bytes.fromhex(hexpayload)
        except ValueError:
            self.send("ERROR %s payload is not hex" % fence)
            return
        rsync, wsync = os.pipe2(os.O_CLOEXEC)
        zygote = os.getpid()
        try:
            pid = self._fork()
        except OSError as e:
            os.close(rsync)
            os.close(wsync)
            self.send("ERROR %s fork: %s" % (fence, e))
            return
        if pid == 0:  # the fiber
            os.close(rsync)
            self._child(zygote, fence, hexpayload, payload, fds, wsync, wake)
        os.close(wsync)
        why = _set_up(rsync, pid)
        if why is not None:
            self.send("ERROR %s fiber set-up failed (new session, cgroup entry, isolation, descriptor 3): %s" % (fence, why))
            return
        self.kids[pid] = fence
        # A pidfd lets fiberd find the fiber whatever PID namespace the
        # zygote is in; without one (an old kernel) the pid must do.
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        if pidfd is None:
            self.send("CLONED %s %d" % (fence, pid))
        else:
            try:
                self.send_fd("CLONED %s %d" % (fence, pid), pidfd)
            finally:
                os.close(pidfd)

    def _child(self, zygote, fence, hexpayload, payload, fds, wsync, wake):
        try:
            self._prepare(zygote, wake)
            self._finish(fence, hexpayload, fds)
            os.write(wsync, b"\0")
            os.close(wsync)
        except OSError as e:
            try:
                os.write(wsync, b"\1" + str(e).encode()[:400])
            finally:
                os._exit(127)
        self._run(fence, payload)

    def _prepare(self, zygote, wake):
        """In a child, the set-up before user code that needs no identity:
        the parent-death signal, a new session, the fiber's isolation, the
        zygote's signal handling undone and its descriptors closed (the
        control socket stays at 3 only to be replaced by the listener)."""
        if self.prctl is not None:
            # End with the zygote. It may have died before the prctl:
            # then the parent is another process already (0 is a parent
            # outside this pid namespace: nothing to compare with).
            self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() not in (zygote, 0):
                os._exit(127)
        os.setsid()
        if self.iso is not None:
            self.iso.in_fiber()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        ctl_fd = self.ctl.detach()
        self.ctl = None
        if ctl_fd != LISTEN_FD:
            os.close(ctl_fd)
        return ctl_fd

    def _finish(self, fence, hexpayload, fds):
        """In a child, the rest: the leaf, the listener on descriptor 3,
        the fiber's environment."""
        if len(fds) > 1:
            _enter_leaf(fds[1])
            os.close(fds[1])
        if fds[0] != LISTEN_FD:
            os.dup2(fds[0], LISTEN_FD)  # replaces the control socket when it is 3
            os.close(fds[0])
        else:
            os.set_inheritable(LISTEN_FD, True)
        os.set_blocking(LISTEN_FD, True)  # servers expect a blocking accept
        os.environ["LISTEN_FDS"] = "1"
        os.environ["LISTEN_PID"] = str(os.getpid())
        os.environ["FIBERD_FENCE"] = fence
        if hexpayload == "-":
            os.environ.pop("FIBERD_PAYLOAD", None)
        else:
            os.environ["FIBERD_PAYLOAD"] = hexpayload

    def _run(self, fence, payload):
        """In a set-up fiber: run on_fiber and exit with what it returns."""
        code = 1
        try:
            ret = self.on_fiber(Fiber(fence, payload))
            code = 0 if ret is None else int(ret)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code & 0xFF)

    def spare(self, text, wake):
        """SPARE <name>: fork a spare, set up as a fiber is but for its
        identity, blocked on a hand-over socket whose other end goes to
        fiberd with SPARED <name> <pid> [+ pidfd]."""
        parts = text.split(" ")
        if len(parts) < 2 or not parts[1]:
            sys.stderr.write("fiberzygote: SPARE without a name; ignored\n")
            return
        name = parts[1]
        if len(parts) != 2:
            self.send("ERROR %s malformed SPARE: want SPARE <name>" % name)
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rsync, wsync = os.pipe2(os.O_CLOEXEC)
        zygote = os.getpid()
        try:
            pid = self._fork()
        except OSError as e:
            for fd in (rsync, wsync):
                os.close(fd)
            ours.close()
            theirs.close()
            self.send("ERROR %s fork: %s" % (name, e))
            return
        if pid == 0:  # the spare
            try:
                os.close(rsync)
                ours.close()
                ctl_fd = self._prepare(zygote, wake)
                if ctl_fd == LISTEN_FD:
                    os.close(ctl_fd)  # a spare keeps nothing of the zygote's
                self._rehearse()
                os.write(wsync, b"\0")
                os.close(wsync)
            except OSError as e:
                try:
                    os.write(wsync, b"\1" + str(e).encode()[:400])
                finally:
                    os._exit(127)
            if self.on_spare is not None:
                try:
                    self.on_spare()
                except BaseException:
                    traceback.print_exc()
                    os._exit(127)
            self._wait_take(theirs)
        theirs.close()
        os.close(wsync)
        why = _set_up(rsync, pid)
        if why is not None:
            ours.close()
            self.send("ERROR %s spare set-up failed (new session, isolation): %s" % (name, why))
            return
        self.kids[pid] = name
        send = [ours.fileno()]
        try:
            pidfd = os.pidfd_open(pid)
            send.append(pidfd)
        except (AttributeError, OSError):
            pidfd = None
        try:
            socket.send_fds(self.ctl, [("SPARED %s %d" % (name, pid)).encode()], send)
        finally:
            ours.close()
            if pidfd is not None:
                os.close(pidfd)

    def _rehearse(self):
        """In a spare, before it waits: do what _finish will do, on a socket
        of its own, and set the environment it will have but for the fence
        and payload, so the pages that touches (the interpreter's objects
        and the environment, shared with the zygote until written) are
        copied now rather than on the Clone's path. Measured on a busy
        2-core machine, _finish took 0.4 ms after a take with this and 1.9
        ms without. No user code runs."""
        a, b = socket.socketpair()
        try:
            fd = os.dup(a.fileno())
            os.set_inheritable(fd, True)
            os.set_blocking(fd, True)
            os.close(fd)
        finally:
            a.close()
            b.close()
        os.environ["LISTEN_FDS"] = "1"
        os.environ["LISTEN_PID"] = str(os.getpid())
        os.environ["FIBERD_FENCE"] = "-"
        os.environ.pop("FIBERD_PAYLOAD", None)
        bytes.fromhex("00")

    def _wait_take(self, hs):
        """In a spare: wait for TAKE <fence> <payload-hex|-> with [listener]
        (fiberd has put the spare in its leaf; a leaf sent too is entered),
        finish the set-up and become the fiber. Nothing is answered: a spare
        that cannot become the fiber says why on stderr and exits 127. Exits
        0 when fiberd closes the socket first."""
        try:
            while True:
                try:
                    msg, fds, flags, _ = socket.recv_fds(hs, _MSG_MAX, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
                    break
                except InterruptedError:
                    continue
        except OSError:
            os._exit(0)
        hs.close()  # nothing more comes, and nothing is answered
        if not msg:
            os._exit(0)  # not wanted any more
        parts = msg.decode(errors="replace").split(" ")
        fence = parts[1] if len(parts) > 1 and parts[1] else "-"
        try:
            if parts[0] != "TAKE" or len(parts) != 3 or not 1 <= len(fds) <= 2 or flags & socket.MSG_TRUNC:
                raise ValueError("malformed TAKE: want TAKE <fence> <payload-hex|-> with [listener] or [listener, leaf]")
            hexpayload = parts[2]
            payload = b"" if hexpayload == "-" else bytes.fromhex(hexpayload)
            self._finish(fence, hexpayload, fds)
        except (OSError, ValueError) as e:
            try:
                sys.stderr.write("fiberzygote: spare for %s: fiber set-up failed: %s; exiting\n" % (fence, e))
                sys.stderr.flush()
            finally:
                os._exit(127)
        self._run(fence, payload)


def _set_up(rsync, pid):
    """In the zygote: wait for child pid's set-up report on rsync, which it
    closes. Returns None when the child is set up, else why not (the child,
    which exits then, reaped)."""
    rep = b""
    while True:
        try:
            rep = os.read(rsync, 512)
            break
        except InterruptedError:
            continue
    os.close(rsync)
    if rep[:1] == b"\0":
        return None
    os.waitpid(pid, 0)
    return rep[1:].decode(errors="replace") or "child died"


def _enter_leaf(fd):
    """Move this process into the fiber's cgroup leaf: fd names the leaf's
    cgroup.procs (fiberd sends an O_PATH descriptor, which carries no right
    of fiberd's), opened anew through /proc/self/fd with this process's own
    credentials."""
    f = os.open("/proc/self/fd/%d" % fd, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(f, b"0")
    finally:
        os.close(f)


def serve(on_fiber, control_fd=CONTROL_FD, on_spare=None):
    """Run the zygote loop on control_fd until fiberd closes it.

    In every forked child on_fiber(fiber) runs and the child then exits; it
    never returns to the caller there. on_spare, when given, is called with
    no argument in every spare once it is set up, before it waits to be
    taken: a template rehearses there what its fibers do first, without
    effects outside the process (a request answered over a socketpair, say),
    so the pages that touches are copied before a Clone rather than on its
    path. It must return; a spare whose on_spare raises prints the exception
    and exits 127 (fiberd forks another, and gives up after five in a row). Raises NotAZygote, before saying
    READY, when control_fd is not fiberd's control socket. Must be called
    from the main thread (it handles SIGCHLD)."""
    ctl = _control_socket(control_fd)
    os.set_inheritable(control_fd, False)
    prctl = _prctl()
    _become_subreaper(prctl)
    z = _Zygote(ctl, on_fiber, prctl, on_spare)
    rwake, wwake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_handler = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    old_wakeup = signal.set_wakeup_fd(wwake)
    # Move everything the template built into the permanent generation, so
    # a fiber's collections never walk (and copy-on-write) the zygote's heap.
    gc.freeze()
    try:
        z.send("READY spares")
        while True:
            ready, _, _ = select.select([ctl, rwake], [], [])
            if rwake in ready:
                try:
                    while os.read(rwake, 512):
                        pass
                except BlockingIOError:
                    pass
                z.reap()
            if ctl not in ready:
                continue
            try:
                msg, fds, flags, _ = socket.recv_fds(ctl, _MSG_MAX, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            except (ConnectionResetError, BrokenPipeError):
                break
            if not msg:
                break  # fiberd closed the control socket
            if flags & socket.MSG_TRUNC or flags & socket.MSG_CTRUNC:
                sys.stderr.write("fiberzygote: control message truncated; ignored\n")
                for fd in fds:
                    os.close(fd)
                continue
            text = msg.decode(errors="replace")
            if text.startswith("CLONE "):
                try:
                    z.clone(text, fds, (rwake, wwake))
                finally:
                    for fd in fds:
                        os.close(fd)
            elif text.startswith("SPARE "):
                for fd in fds:
                    os.close(fd)
                z.spare(text, (rwake, wwake))
            else:
                sys.stderr.write("fiberzygote: unknown control message %r; ignored\n" % text[:32])
                for fd in fds:
                    os.close(fd)
    except BrokenPipeError:
        pass
    finally:
        ctl.close()
        z.ctl = None
        for pid in list(z.kids):
            for target in (-pid, pid):
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        z.reap(block=True)
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGCHLD, old_handler)
        os.close(rwake)
        os.close(wwake)
