"""attacker: attacker.c's twin on the Python SDK, for the isolation test.

Every fiber holds a secret (the Clone's payload) in its environment and in
/tmp/fiberd-attack-<tag>-<secret>, and answers GET /whoami, GET /planted
and GET /attack?pids=..&secrets=..&socks=..&dirs=..&tcp=..&shared=..&fill=.. exactly as
attacker.c does (see there): one line per attempt, "<attempt> <target>
blocked <why>" or "<attempt> <target> OPEN ...". Usage: attacker.py --tag TAG.
"""

import ctypes
import os
import signal
import socket
import sys
import urllib.parse

import fiberzygote

TAG = "x"
PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
LIBC = ctypes.CDLL(None, use_errno=True)


def verdict(out, what, target, err):
    if err is None:
        out.append("%s %s OPEN" % (what, target))
    else:
        out.append("%s %s blocked %s" % (what, target, err))


def holds(path, secrets):
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16).replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    for s in secrets:
        if s in data:
            return s
    return None


def scan_tmp(out, d, secrets):
    prefix = "fiberd-attack-%s-" % TAG
    try:
        names = os.listdir(d)
    except OSError as e:
        out.append("files %s blocked %s" % (d, e.strerror))
        return
    found = False
    for n in names:
        if n.startswith(prefix):
            s = holds(os.path.join(d, n), secrets)
            if s:
                out.append("files %s/%s OPEN holds %s" % (d, n, s))
                found = True
    if not found:
        out.append("files %s blocked no other fiber's file" % d)


def attempt(fn):
    try:
        fn()
        return None
    except OSError as e:
        return e.strerror or str(e)


def fill(d, want):
    path = "%s/fiberd-attack-%s-fill" % (d, TAG)
    chunk, wrote, err = b"f" * 65536, 0, "done"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as e:
        return "fill %s wrote 0 %s" % (d, e.strerror)
    try:
        while wrote < want:
            wrote += os.write(fd, chunk)
    except OSError as e:
        err = e.strerror
    finally:
        os.close(fd)
        os.unlink(path)
    return "fill %s wrote %d %s" % (d, wrote, err)


def attack(query):
    q = {k: [x for x in v[0].split(",") if x] for k, v in urllib.parse.parse_qs(query).items()}
    pids, secrets = q.get("pids", []), q.get("secrets", [])
    out = []
    others, found = 0, False
    self_pid = os.readlink("/proc/self")  # as this /proc numbers it
    for e in os.listdir("/proc"):
        if not e.isdigit() or e == self_pid:
            continue
        others += 1
        if others <= 3:
            out.append("list /proc/%s OPEN sees another process" % e)
        for k in ("environ", "cmdline"):
            s = holds("/proc/%s/%s" % (e, k), secrets)
            if s:
                out.append("list /proc/%s OPEN holds %s" % (e, s))
                found = True
    if not others and not found:
        out.append("list /proc blocked sees no other process")
    verdict(out, "signal", "-1", attempt(lambda: os.kill(-1, 0)))
    for p in pids:
        pid = int(p)
        verdict(out, "signal", p, attempt(lambda: os.kill(pid, 0)))
        verdict(out, "pidfd", p, attempt(lambda: os.close(os.pidfd_open(pid))))
        ctypes.set_errno(0)
        if LIBC.ptrace(ctypes.c_long(PTRACE_SEIZE), ctypes.c_long(pid), None, None) == 0:
            LIBC.ptrace(ctypes.c_long(PTRACE_DETACH), ctypes.c_long(pid), None, None)
            verdict(out, "ptrace", p, None)
        else:
            verdict(out, "ptrace", p, os.strerror(ctypes.get_errno()))
        verdict(out, "environ", p, attempt(lambda: os.close(os.open("/proc/%d/environ" % pid, os.O_RDONLY))))
        scan_tmp(out, "/proc/%d/root/tmp" % pid, secrets)
    scan_tmp(out, "/tmp", secrets)
    planted = "/tmp/fiberd-attack-%s-planted" % TAG
    err = attempt(lambda: os.close(os.open(planted, os.O_WRONLY | os.O_CREAT, 0o666)))
    out.append("write %s %s" % (planted, err or "done"))
    for path in q.get("socks", []):
        def conn():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
        verdict(out, "socket", path, attempt(conn))
    for d in q.get("dirs", []):
        verdict(out, "dir", d, attempt(lambda: os.close(os.open(d, os.O_RDONLY | os.O_DIRECTORY))))
    for addr in q.get("tcp", []):
        host, port = addr.rsplit(":", 1)

        def conn():
            with socket.create_connection((host, int(port)), timeout=5):
                pass
        verdict(out, "tcp", addr, attempt(conn))
    for d in q.get("shared", []):
        path = "%s/fiberd-attack-%s-shared" % (d, TAG)
        verdict(out, "shared", d, attempt(lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o666))))
    for spec in q.get("fill", []):
        d, want = spec.rsplit(":", 1)
        out.append(fill(d, int(want)))
    return "\n".join(out) + "\n"


def serve():
    secret = bytes.fromhex(os.environ.get("FIBERD_PAYLOAD", "2d")).decode()
    path = "/tmp/fiberd-attack-%s-%s" % (TAG, secret)
    with open(path, "w") as f:
        f.write(secret)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    listener = socket.socket(fileno=fiberzygote.LISTEN_FD)
    while True:
        conn, _ = listener.accept()
        with conn:
            req = b""
            while b"\r\n\r\n" not in req and len(req) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                req += chunk
            target = req.split(b" ")[1].decode() if req.count(b" ") >= 2 else "/"
            if target.startswith("/attack?"):
                body = attack(target[len("/attack?"):])
            elif target == "/planted":
                body = "planted=%s\n" % ("yes" if os.path.exists("/tmp/fiberd-attack-%s-planted" % TAG) else "no")
            else:
                body = "pid=%d secret=%s file=%s\n" % (os.getpid(), secret, "yes" if os.path.exists(path) else "no")
            b = body.encode()
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (len(b), b))
            except OSError:
                pass


def main():
    global TAG
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--tag":
        TAG = args[1]
    if fiberzygote.socket_activated():
        serve()
        return 0
    fiberzygote.serve(lambda fiber: serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
