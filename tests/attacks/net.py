"""The network, from inside: reach host loopback listeners by TCP, UDP and
MPTCP; listen by MPTCP where a host process connects; sniff host loopback
traffic with AF_PACKET; send to a named host unix socket from a
socketpair; hold an abstract unix name. argv: tcp_port udp_port
mptcp_listen_port unix_path abstract_name marker."""
import socket
import sys
import time
from probe import probe

tcp_port, udp_port, listen_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
unix_path, abstract_name, marker = sys.argv[4], sys.argv[5], sys.argv[6].encode()
IPPROTO_MPTCP = 262
HOST = "127.0.0.1"


def connect(proto):
    def go():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        s.settimeout(2)
        s.connect((HOST, tcp_port))
        s.sendall(b"reached " + str(proto).encode())
        s.close()
    return go


def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(5):
        s.sendto(b"reached udp", (HOST, udp_port))
        time.sleep(0.02)


def mptcp_listen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HOST, listen_port))
    s.listen(4)
    s.settimeout(1.5)
    c, _ = s.accept()  # socket.timeout (an OSError) when no host process reached it
    return c.recv(64).decode(errors="replace")


def sniff():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    s.settimeout(0.2)
    deadline = time.time() + 1.5
    while time.time() < deadline:
        try:
            if marker in s.recv(65536):
                return "saw host traffic"
        except socket.timeout:
            pass
    raise OSError(110, "no host traffic seen")


def unix_dgram():
    a, _b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"reached unix", unix_path)


def abstract():
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        # Where socket(AF_UNIX) is refused, a socketpair's end binds too.
        s, _peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.time() + 1
    while True:
        try:
            s.bind("\0" + abstract_name)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.01)
    time.sleep(1)  # held while the host tries to bind the same name


probe("tcp connect", connect(0))
probe("mptcp connect", connect(IPPROTO_MPTCP))
probe("udp send", udp)
probe("mptcp listen", mptcp_listen)
probe("packet sniff", sniff)
probe("unix dgram sendto", unix_dgram)
probe("abstract bind", abstract)
