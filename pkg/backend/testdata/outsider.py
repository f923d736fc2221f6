"""A local user's process, not a grant's: it listens on the abstract unix
socket named by --listen, takes the one descriptor it is handed, and tries
to move the process --victim into the cgroup it names, first by writing to
the descriptor, then by opening it anew through /proc/self/fd. It prints one
line per try: "<how> moved" or "<how> refused <errno name>", then "done"."""
import errno
import os
import socket
import sys

name = sys.argv[sys.argv.index("--listen") + 1]
victim = sys.argv[sys.argv.index("--victim") + 1].encode()
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + name)
srv.listen(1)
print("listening", flush=True)
conn, _ = srv.accept()
_, fds, _, _ = socket.recv_fds(conn, 16, 1)
fd = fds[0]


def attempt(how, write):
    try:
        write()
        print(how, "moved", flush=True)
    except OSError as e:
        print(how, "refused", errno.errorcode.get(e.errno, str(e.errno)), flush=True)


attempt("write", lambda: os.write(fd, victim))


def reopen():
    f = os.open("/proc/self/fd/%d" % fd, os.O_WRONLY)
    try:
        os.write(f, victim)
    finally:
        os.close(f)


attempt("reopen", reopen)
print("done", flush=True)
conn.send(b"x")
conn.close()
