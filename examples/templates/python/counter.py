"""counter: an HTTP counter template for fiberd, in Python.

Every fiber answers each HTTP request on its listener (descriptor 3) with
"fence=<fence> pid=<pid> count=<n> payload=<hex|-> cgroup=<path>", n counting
the requests that fiber has served and path the cgroup it found itself in
when it started. GET /crash makes the fiber abort (SIGABRT) and
GET /exit/<code> makes it exit with <code>, for tests. GET /orphan forks a
child that sleeps 60 s, answers "orphan=<child pid>" and exits 0, leaving the
child behind (for testing that the zygote reaps such orphans); GET
/orphan/pgrp does the same with the child in a process group of its own, out
of reach of the kill of the fiber's group.

Options:
  --init-ms N    spend N milliseconds initialising before serving (default 0),
                 the cost a warm zygote pays once and a cold exec pays per fiber
  --hold-mib N   allocate and touch N MiB during init, kept for life (default 0)
  --dirty-mib N  each fiber writes N MiB of its own before serving (default 0)

Started by the proc backend (descriptor 3 is the control socket) it is a
zygote and forks fibers through fiberzygote.serve; started by the exec
backend (LISTEN_FDS=1, LISTEN_PID=its pid) it serves as the one fiber.
The SDK is found on PYTHONPATH or, failing that, in the source tree.
"""

import argparse
import os
import socket
import struct
import sys
import time

try:
    import fiberzygote
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "sdk", "zygote", "python"))
    import fiberzygote

HELD = None
DIRTY_MIB = 0


class Fiber:
    """One fiber's HTTP server: a plain accept loop on the inherited
    listener, one request per connection. Any socket-activated server
    (http.server, an ASGI server given fd 3) would do; this one is small so
    a fiber's first byte costs little beyond the fork."""

    def __init__(self, fence):
        self.fence = fence
        self.count = 0
        self.cgroup = own_cgroup()  # first thing: proves the leaf was entered before user code
        self.payload = os.environ.get("FIBERD_PAYLOAD", "-")

    def answer(self, conn):
        req = b""
        while b"\r\n\r\n" not in req and len(req) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                return
            req += chunk
        path = req.split(b" ", 2)[1] if req.count(b" ") >= 2 else b"/"
        if path == b"/crash":
            os.abort()
        if path.startswith(b"/exit/"):
            os._exit(int(path[len(b"/exit/"):]))
        if path in (b"/orphan", b"/orphan/pgrp"):
            orphan(conn, path == b"/orphan/pgrp")
        self.count += 1
        body = ("fence=%s pid=%d count=%d payload=%s cgroup=%s\n" % (
            self.fence, os.getpid(), self.count, self.payload, self.cgroup)).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))


def orphan(conn, own_group):
    """Leave a sleeping child behind: answer with its pid on conn and exit 0."""
    pid = os.fork()
    if pid == 0:
        try:
            conn.close()
            os.close(fiberzygote.LISTEN_FD)
            if own_group:
                os.setpgid(0, 0)
            time.sleep(60)
        finally:
            os._exit(0)
    if own_group:
        os.setpgid(pid, pid)  # also here, so it is done before this fiber exits
    body = b"orphan=%d\n" % pid
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n%s" % (len(body), body))
    conn.close()
    os._exit(0)


def own_cgroup():
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "-"


def rehearse():
    """Run in every spare before it waits (fiberzygote's on_spare): serve
    one request as a fiber would, through the same calls (a socket object
    on a listening descriptor, accept, answer), on a listener of its own
    that only this process connects to, so the pages a first request
    touches are copied before the Clone, not after it.

    The listener is a unix socket on an abstract address the kernel picks
    (nothing on disk); a connection that is not this process's (another
    process of the network namespace may find the address) is closed
    unanswered, and after three such the rehearsal gives up: it must
    return."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with srv, cli:
        srv.bind("")  # autobind: an abstract address
        srv.listen(4)
        cli.connect(srv.getsockname())
        cli.sendall(b"GET / HTTP/1.1\r\nHost: rehearsal\r\n\r\n")
        listener = socket.socket(fileno=os.dup(srv.fileno()))
        with listener:
            for _ in range(3):
                conn, _ = listener.accept()
                with conn:
                    pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
                    if pid != os.getpid():
                        continue
                    Fiber("-").answer(conn)
                    cli.recv(65536)
                    return


def serve(fence):
    f = Fiber(fence)
    mine = bytearray(b"\1") * (DIRTY_MIB << 20) if DIRTY_MIB else None
    listener = socket.socket(fileno=fiberzygote.LISTEN_FD)
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                f.answer(conn)
            except OSError:
                pass  # the client went away
    del mine


def main():
    global HELD, DIRTY_MIB
    p = argparse.ArgumentParser()
    p.add_argument("--init-ms", type=int, default=0)
    p.add_argument("--hold-mib", type=int, default=0)
    p.add_argument("--dirty-mib", type=int, default=0)
    a = p.parse_args()
    start = time.monotonic()
    if a.hold_mib:
        HELD = bytearray(b"\1") * (a.hold_mib << 20)
    DIRTY_MIB = a.dirty_mib
    while (time.monotonic() - start) * 1000 < a.init_ms:
        sum(i * i for i in range(1000))  # stand-in for imports and loading
    if fiberzygote.socket_activated():
        serve(os.environ.get("FIBERD_FENCE", "-"))
        return 0
    try:
        fiberzygote.serve(lambda fiber: serve(fiber.fence), on_spare=rehearse)
    except fiberzygote.NotAZygote as e:
        sys.stderr.write("counter: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
