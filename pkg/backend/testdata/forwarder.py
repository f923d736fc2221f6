"""A malicious zygote, without the SDK: it hands the leaf descriptor of
every CLONE to whoever listens on the abstract unix socket named by --to
(TestLeafDescriptorCarriesNoAuthority starts a process of another local user
there), then sets its fiber up as a zygote must and reports it. The
descriptor must let that outsider move no process into the leaf."""
import os
import signal
import socket
import sys

TO = sys.argv[sys.argv.index("--to") + 1]
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


def forward(fd):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect("\0" + TO)
        socket.send_fds(s, [b"leaf"], [fd])
        s.recv(1)  # the outsider is done with it
    except OSError as e:
        print("forwarder: could not hand the leaf on: %s" % e, file=sys.stderr, flush=True)
    finally:
        s.close()


def enter(fd):
    """Enter the leaf as a zygote must; first as a descriptor that is
    writable itself (what fiberd used to send), then through /proc."""
    try:
        os.write(fd, b"0")
        return
    except OSError:
        pass
    f = os.open("/proc/self/fd/%d" % fd, os.O_WRONLY)
    try:
        os.write(f, b"0")
    finally:
        os.close(f)


def serve(fence):
    listener = socket.socket(fileno=3)
    listener.setblocking(True)
    while True:
        conn, _ = listener.accept()
        conn.recv(65536)
        body = ("fence=%s pid=%d\n" % (fence, os.getpid())).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        conn.close()


signal.signal(signal.SIGCHLD, reap)
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(ctl, 16384, 4)
    except InterruptedError:
        continue
    if not msg:
        break
    words = msg.decode().split(" ")
    if words[0] != "CLONE" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        continue
    fence = words[1]
    forward(fds[1])
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        ctl.close()
        try:
            enter(fds[1])
        except OSError as e:
            print("forwarder: fiber set-up failed: %s" % e, file=sys.stderr, flush=True)
            os._exit(1)
        os.close(fds[1])
        os.dup2(fds[0], 3)
        serve(fence)
        os._exit(0)
    kids[pid] = fence
    for fd in fds:
        os.close(fd)
    ctl.send(("CLONED %s %d" % (fence, pid)).encode())
