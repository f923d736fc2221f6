"""counter: an HTTP counter template for fiberd, in Python.

Every fiber answers each HTTP request on its listener (descriptor 3) with
"fence=<fence> pid=<pid> count=<n> payload=<hex|-> cgroup=<path>", n counting
the requests that fiber has served and path the cgroup it found itself in
when it started. GET /crash makes the fiber abort (SIGABRT) and
GET /exit/<code> makes it exit with <code>, for tests.

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
import http.server
import os
import socket
import sys
import time

try:
    import fiberzygote
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "sdk", "zygote", "python"))
    import fiberzygote

HELD = None
DIRTY_MIB = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    count = 0
    fence = "-"
    cgroup = "-"

    def do_GET(self):
        if self.path == "/crash":
            os.abort()
        if self.path.startswith("/exit/"):
            os._exit(int(self.path[len("/exit/"):]))
        Handler.count += 1
        body = ("fence=%s pid=%d count=%d payload=%s cgroup=%s\n" % (
            Handler.fence, os.getpid(), Handler.count, os.environ.get("FIBERD_PAYLOAD", "-"), Handler.cgroup)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, fmt, *args):
        pass  # unix-socket clients have no address to log


def own_cgroup():
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "-"


def serve(fence):
    Handler.cgroup = own_cgroup()  # first thing: proves the leaf was entered before user code
    mine = bytearray(b"\1") * (DIRTY_MIB << 20) if DIRTY_MIB else None
    Handler.fence = fence
    srv = http.server.HTTPServer(("", 0), Handler, bind_and_activate=False)
    srv.socket.close()
    srv.socket = socket.socket(fileno=fiberzygote.LISTEN_FD)
    srv.serve_forever(poll_interval=3600)
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
        fiberzygote.serve(lambda fiber: serve(fiber.fence))
    except fiberzygote.NotAZygote as e:
        sys.stderr.write("counter: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
