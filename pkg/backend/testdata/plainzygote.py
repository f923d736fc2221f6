"""A zygote written from docs/templates.md without the SDK. Bare, it says
READY and forks one fiber per CLONE (TestNoHandOver); with --spares it says
READY spares and also forks spares on SPARE, handed over on TAKE
(TestDocSpares). Each fiber answers HTTP with "fence=<fence> pid=<pid>
payload=<hex|->". No isolation, no pidfds: the least the protocol needs.
With --mute it never reports a fiber's end (TestKillOfAFiberItsZygoteNeverReports)."""
import os
import signal
import socket
import sys

SPARES = "--spares" in sys.argv
MUTE = "--mute" in sys.argv
ctl = socket.socket(fileno=3)
ctl.send(b"READY spares" if SPARES else b"READY")
kids = {}


def reap(*_):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        name = kids.pop(pid, None)
        if name and not MUTE:
            code = os.waitstatus_to_exitcode(status)
            word = "exit:%d" % code if code >= 0 else "signal:%s" % signal.Signals(-code).name
            ctl.send(("EXITED %s %s" % (name, word)).encode())


def become(fence, payload, fds):
    """The set-up that needs the fiber's identity, then serve forever."""
    if len(fds) > 1:
        with open("/proc/self/fd/%d" % fds[1], "w") as f:
            f.write("0")
        os.close(fds[1])
    if fds[0] != 3:
        os.dup2(fds[0], 3)
        os.close(fds[0])
    else:
        os.set_inheritable(3, True)
    os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), FIBERD_FENCE=fence)
    return fence, payload


def serve(fence, payload):
    listener = socket.socket(fileno=3)
    listener.setblocking(True)
    while True:
        conn, _ = listener.accept()
        conn.recv(65536)
        body = ("fence=%s pid=%d payload=%s\n" % (fence, os.getpid(), payload)).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        conn.close()


def child_prepare():
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()


signal.signal(signal.SIGCHLD, reap)
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(ctl, 16384, 4)
    except InterruptedError:
        continue
    if not msg:
        break
    words = msg.decode().split(" ")
    if words[0] == "SPARE" and len(words) == 2 and SPARES:
        name = words[1]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            child_prepare()
            mine.close()
            ctl.close()
            msg, fds, _, _ = socket.recv_fds(theirs, 16384, 4)
            if not msg:
                os._exit(0)
            take = msg.decode().split(" ")
            theirs.close()
            serve(*become(take[1], take[2], fds))
        theirs.close()
        kids[pid] = name
        socket.send_fds(ctl, [("SPARED %s %d" % (name, pid)).encode()], [mine.fileno()])
        mine.close()
        continue
    if words[0] != "CLONE" or len(words) != 3 or not fds:
        for fd in fds:
            os.close(fd)
        continue
    fence, payload = words[1], words[2]
    pid = os.fork()
    if pid == 0:
        child_prepare()
        serve(*become(fence, payload, fds))
    kids[pid] = fence
    for fd in fds:
        os.close(fd)
    ctl.send(("CLONED %s %d" % (fence, pid)).encode())
