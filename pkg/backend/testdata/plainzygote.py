"""A zygote written from docs/templates.md without the SDK and without
spares: it says a bare READY and forks one fiber per CLONE. Each fiber
answers HTTP with "fence=<fence> payload=<hex|->". For TestNoHandOver."""
import array
import os
import signal
import socket

ctl = socket.socket(fileno=3)
ctl.send(b"READY")
kids = {}


def reap(*_):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fence = kids.pop(pid, None)
        if fence:
            code = os.waitstatus_to_exitcode(status)
            word = "exit:%d" % code if code >= 0 else "signal:%s" % signal.Signals(-code).name
            ctl.send(("EXITED %s %s" % (fence, word)).encode())


signal.signal(signal.SIGCHLD, reap)
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(ctl, 16384, 4)
    except InterruptedError:
        continue
    if not msg:
        break
    words = msg.decode().split(" ")
    if words[0] != "CLONE" or len(words) != 3 or not fds:
        for fd in fds:
            os.close(fd)
        continue
    fence, payload = words[1], words[2]
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if len(fds) > 1:
            with open("/proc/self/fd/%d/cgroup.procs" % fds[1], "w") as f:
                f.write("0")
        os.dup2(fds[0], 3)
        listener = socket.socket(fileno=3)
        listener.setblocking(True)
        while True:
            conn, _ = listener.accept()
            conn.recv(65536)
            body = ("fence=%s payload=%s\n" % (fence, payload)).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            conn.close()
    kids[pid] = fence
    for fd in fds:
        os.close(fd)
    ctl.send(("CLONED %s %d" % (fence, pid)).encode())
