"""A zygote on the Python SDK whose spares all fail their rehearsal
(on_spare raises): fiberd must give up on spares after a few and fork every
Clone. Each fiber answers HTTP with "fence=<fence>". For TestSparesGiveUp."""
import socket

import fiberzygote


def serve(fiber):
    listener = socket.socket(fileno=fiberzygote.LISTEN_FD)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            body = ("fence=%s\n" % fiber.fence).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


def rehearse():
    raise RuntimeError("this template's rehearsal always fails")


fiberzygote.serve(serve, on_spare=rehearse)
