"""Raw-socket client for attacking `airlock toolexec serve`.

Imported by the scripts tests/toolexec_attacks.rs runs; PORT and TOKEN come
from the environment. Everything is done by hand on a socket so that a test
controls every byte and every stall.
"""
import os
import socket
import time
import urllib.parse

PORT = int(os.environ["PORT"])
TOKEN = os.environ["TOKEN"]


def connect():
    return socket.create_connection(("127.0.0.1", PORT), timeout=60)


def form(tool, *args, cwd=None):
    pairs = [("tool", tool)] + [("arg", a) for a in args]
    if cwd is not None:
        pairs.append(("cwd", cwd))
    return urllib.parse.urlencode(pairs).encode()


def request(body, proto="2", te=True, token=None, extra=b"", length=None):
    token = TOKEN if token is None else token
    head = b"POST /exec HTTP/1.1\r\nHost: localhost\r\n"
    if token != "":
        head += b"Authorization: Bearer " + token.encode() + b"\r\n"
    head += b"X-Aifo-Proto: " + proto.encode() + b"\r\n"
    if te:
        head += b"TE: trailers\r\n"
    head += b"Content-Type: application/x-www-form-urlencoded\r\n"
    head += b"Content-Length: %d\r\n" % (len(body) if length is None else length)
    return head + extra + b"\r\n" + body


def read_all(s, timeout=60):
    s.settimeout(timeout)
    data = bytearray()
    while True:
        try:
            b = s.recv(1 << 20)
        except ConnectionResetError:
            return bytes(data)
        if not b:
            return bytes(data)
        data += b


def parse(raw):
    """(status, headers as [(name, value)], body bytes, trailers as dict)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = [tuple(l.decode().split(": ", 1)) for l in lines[1:]]
    names = {n.lower(): v for n, v in headers}
    trailers = {}
    if names.get("transfer-encoding") == "chunked":
        body = bytearray()
        at = 0
        while True:
            eol = rest.index(b"\r\n", at)
            size = int(rest[at:eol].split(b";")[0], 16)
            at = eol + 2
            if size == 0:
                tail = rest[at:].partition(b"\r\n\r\n")[0]
                for l in tail.split(b"\r\n"):
                    if l:
                        n, v = l.decode().split(": ", 1)
                        trailers[n] = v
                break
            body += rest[at:at + size]
            at += size + 2
        body = bytes(body)
    else:
        body = rest
    return status, headers, body, trailers


def exchange(payload, timeout=60):
    s = connect()
    s.sendall(payload)
    raw = read_all(s, timeout)
    s.close()
    return parse(raw)


def header(headers, name):
    for n, v in headers:
        if n == name:
            return v
    return None


def pid_alive(pid):
    """True while the process exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid, within):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return not pid_alive(pid)
