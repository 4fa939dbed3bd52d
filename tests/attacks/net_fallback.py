"""The network without `connect()` or `bind()`, which Landlock refuses:
TCP Fast Open (`sendto` with MSG_FASTOPEN connects and sends in one call)
to a host listener, and `listen()` without `bind()`, which binds 0.0.0.0
on a port of the kernel's choosing (the test then connects to it from the
host, and the child reports whether it accepted). Then a socket of each
internet family and type. argv: host_tcp_port marker."""
import socket
import sys
from probe import out, probe

port, marker = int(sys.argv[1]), sys.argv[2].encode()
MSG_FASTOPEN = 0x20000000


def fastopen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Blocking: the call connects, then sends.
    s.sendto(marker, MSG_FASTOPEN, ("127.0.0.1", port))
    s.close()


probe("fastopen", fastopen)

try:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.listen()
    out("listen", "ok", str(ls.getsockname()[1]))
    ls.settimeout(5)
    probe("accepted", lambda: ls.accept()[0].close())
except OSError as e:
    import errno
    out("listen", errno.errorcode.get(e.errno, str(e.errno)), str(e))

for label, fam, ty, proto in [
    ("inet stream", socket.AF_INET, socket.SOCK_STREAM, 0),
    ("inet6 stream", socket.AF_INET6, socket.SOCK_STREAM, 0),
    ("inet dgram", socket.AF_INET, socket.SOCK_DGRAM, 0),
    ("inet6 dgram", socket.AF_INET6, socket.SOCK_DGRAM, 0),
    ("inet seqpacket", socket.AF_INET, socket.SOCK_SEQPACKET, 132),
]:
    probe(label, lambda f=fam, t=ty, p=proto: socket.socket(f, t, p).close())
out("done", "ok")
