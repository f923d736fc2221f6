"""A malicious zygote, without the SDK: it reports the process --victim
(another grant's zygote, in TestForeignProcessReportedAsFiber) as the fiber
of every CLONE and as every spare, with a pidfd of it. fiberd must refuse
both and act on no process the zygote did not fork."""
import os
import socket
import sys

victim = int(sys.argv[sys.argv.index("--victim") + 1])
ctl = socket.socket(fileno=3)
ctl.send(b"READY spares")
held = []  # the spares' hand-over sockets, kept open as a real spare would
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(ctl, 16384, 4)
    except InterruptedError:
        continue
    if not msg:
        break
    for fd in fds:
        os.close(fd)
    words = msg.decode().split(" ")
    pidfd = os.pidfd_open(victim)
    if words[0] == "CLONE":
        socket.send_fds(ctl, [("CLONED %s %d" % (words[1], victim)).encode()], [pidfd])
    elif words[0] == "SPARE":
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(ctl, [("SPARED %s %d" % (words[1], victim)).encode()], [theirs.fileno(), pidfd])
        theirs.close()
        held.append(mine)
    os.close(pidfd)
