"""A minimal, independent FS proxy client for airlock's integration tests.

Written from the protocol text (seed 000), not from airlock's code, so the
tests check the wire and not merely agreement with ourselves.
"""
import base64
import json
import os
import struct
import sys

FD = int(os.environ.get("AIRLOCK_FD", "3"))


def send_raw(payload: bytes, fd: int = FD) -> None:
    os.write(fd, struct.pack(">I", len(payload)) + payload)


def send(req: dict, fd: int = FD) -> None:
    send_raw(json.dumps(req).encode(), fd)


def _read_exact(n: int, fd: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("proxy closed the connection")
        buf += chunk
    return buf


def recv(fd: int = FD) -> dict:
    (n,) = struct.unpack(">I", _read_exact(4, fd))
    return json.loads(_read_exact(n, fd))


def call(op: str, fd: int = FD, id: str = "x", **params) -> dict:
    send({"id": id, "op": op, "params": params}, fd)
    resp = recv(fd)
    assert resp["id"] == id, (resp, id)
    return resp


def code(resp: dict):
    return None if resp["ok"] else resp["error"]["code"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def out(*values) -> None:
    """One JSON line per observation, for the Rust test to assert on."""
    print(json.dumps(values[0] if len(values) == 1 else list(values)), flush=True)


def fail(msg: str) -> None:
    print(msg, file=sys.stderr)
    sys.exit(99)


def attach(fd: int = FD):
    """A connection of this process's own: pass a fresh socket over the
    shared one with an `attach` request; the answer comes on the new one."""
    import socket

    ours, theirs = socket.socketpair()
    shared = socket.socket(fileno=os.dup(fd))
    req = json.dumps({"id": "a", "op": "attach"}).encode()
    socket.send_fds(shared, [struct.pack(">I", len(req)) + req], [theirs.fileno()])
    theirs.close()
    shared.close()
    new = ours.detach()
    return new, recv(new)


# --- broker helpers -------------------------------------------------------


def llm(content: str, fd: int = FD, id: str = "x", **params) -> dict:
    """An LLMCMD with one user message."""
    return call("LLMCMD", fd=fd, id=id, messages=[{"role": "user", "content": content}], **params)


def recv_ids(ids, fd: int = FD) -> dict:
    """Read responses until every id in `ids` has been answered; by id."""
    got = {}
    while len(got) < len(ids):
        resp = recv(fd)
        assert resp["id"] in ids and resp["id"] not in got, (resp, ids, got)
        got[resp["id"]] = resp
    return got


def workers(script: str, n: int):
    """Start n python3 processes running `script` with argv[1] = 0..n-1,
    each inheriting the proxy descriptor (to `attach` a connection of its
    own); returns their exit codes once all have ended."""
    import subprocess

    # "python3" by PATH, not sys.executable: under the sandbox the first
    # python3 on PATH (a version manager's shim under $HOME, say) may be
    # out of reach, and only a PATH search moves on to the next.
    procs = [subprocess.Popen(["python3", "-c", script, str(i)], pass_fds=(FD,)) for i in range(n)]
    return [p.wait(timeout=60) for p in procs]


# --- path operations --------------------------------------------------------


def list_all(path: str, fd: int = FD, max=None) -> list:
    """Every entry of directory `path`, following the pages' `next`."""
    entries, after = [], None
    while True:
        params = {"path": path}
        if after is not None:
            params["after"] = after
        if max is not None:
            params["max"] = max
        resp = call("list", fd=fd, **params)
        if not resp["ok"]:
            return resp
        entries += resp["result"]["entries"]
        after = resp["result"].get("next")
        if after is None:
            return entries
