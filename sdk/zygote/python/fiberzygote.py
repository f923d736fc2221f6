"""fiberzygote: the template side of fiberd's zygote protocol, in Python.

A zygote is a template that initialises once and then forks one fiber per
request from fiberd. fiberd starts it with a SOCK_SEQPACKET control socket as
descriptor 3 (CONTROL_FD). The template does its expensive initialisation
(imports, loading data), then calls serve(on_fiber), which says READY and
from then on handles:

    fiberd -> zygote  "CLONE <fence> <payload-hex|->" with SCM_RIGHTS
                      [listener] or [listener, leaf cgroup directory]
    zygote -> fiberd  "CLONED <fence> <pid>"   once the child is set up
                      "ERROR <fence> <reason>" when it could not be
                      "EXITED <fence> exit:<code>" or
                      "EXITED <fence> signal:<SIGNAME>" when the child ended

Before any user code runs the child, on Linux, asks for SIGKILL when its
zygote dies (prctl PR_SET_PDEATHSIG through ctypes; fiberd starts the zygote
the same way, so a fiberd killed with SIGKILL leaves no fiber running), then
starts a new session (the fiber and its
descendants form one process group), enters the leaf cgroup by writing "0"
to its cgroup.procs, moves the listener to descriptor 3 (LISTEN_FD), closes
the control socket and sets LISTEN_FDS=1, LISTEN_PID=<its pid>, FIBERD_FENCE
and FIBERD_PAYLOAD (hex; absent when there is no payload). Then it calls
on_fiber(fiber) and exits: with the int it returns, 0 for None, the code of
a SystemExit, 1 for any other exception.

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
    def __init__(self, ctl, on_fiber, prctl):
        self.ctl = ctl
        self.on_fiber = on_fiber
        self.prctl = prctl
        self.kids = {}  # pid -> fence

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
        sys.stdout.flush()
        sys.stderr.flush()
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:  # the fiber
            os.close(rsync)
            self._child(zygote, fence, hexpayload, payload, fds, wsync, wake)
        os.close(wsync)
        rep = b""
        while True:
            try:
                rep = os.read(rsync, 512)
                break
            except InterruptedError:
                continue
        os.close(rsync)
        if rep[:1] != b"\0":
            os.waitpid(pid, 0)
            why = rep[1:].decode(errors="replace") or "child died"
            self.send("ERROR %s fiber set-up failed (new session, cgroup entry, descriptor 3): %s" % (fence, why))
            return
        self.kids[pid] = fence
        self.send("CLONED %s %d" % (fence, pid))

    def _child(self, zygote, fence, hexpayload, payload, fds, wsync, wake):
        try:
            if self.prctl is not None:
                # End with the zygote. It may have died before the prctl:
                # then the parent is another process already (0 is a parent
                # outside this pid namespace: nothing to compare with).
                self.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() not in (zygote, 0):
                    os._exit(127)
            os.setsid()
            if len(fds) > 1:
                f = os.open("cgroup.procs", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fds[1])
                os.write(f, b"0")
                os.close(f)
                os.close(fds[1])
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in wake:
                os.close(fd)
            ctl_fd = self.ctl.detach()
            if ctl_fd != LISTEN_FD:
                os.close(ctl_fd)
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
            os.write(wsync, b"\0")
            os.close(wsync)
        except OSError as e:
            try:
                os.write(wsync, b"\1" + str(e).encode()[:400])
            finally:
                os._exit(127)
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


def serve(on_fiber, control_fd=CONTROL_FD):
    """Run the zygote loop on control_fd until fiberd closes it.

    In every forked child on_fiber(fiber) runs and the child then exits; it
    never returns to the caller there. Raises NotAZygote, before saying
    READY, when control_fd is not fiberd's control socket. Must be called
    from the main thread (it handles SIGCHLD)."""
    ctl = _control_socket(control_fd)
    os.set_inheritable(control_fd, False)
    prctl = _prctl()
    _become_subreaper(prctl)
    z = _Zygote(ctl, on_fiber, prctl)
    rwake, wwake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    old_handler = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    old_wakeup = signal.set_wakeup_fd(wwake)
    # Move everything the template built into the permanent generation, so
    # a fiber's collections never walk (and copy-on-write) the zygote's heap.
    gc.freeze()
    try:
        z.send("READY")
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
