"""A client for airlock's protocol: files and the LLM broker.

For programs running under `airlock run` (the connection comes from
`AIRLOCK_FD`) and for programs that start `airlock serve` themselves (the
connection is a socket they hold). Standard library only; copy this file
next to your program or put its directory on `PYTHONPATH`.

    from airlock_client import Client, AirlockError

    with Client.from_env() as c:           # under `airlock run`
        c.write_file("notes.txt", b"hello\\n")
        print(c.read_file("notes.txt"))
        print(c.quota())                    # needs a [broker] section
        print(c.ask("Say hi")["messages"][-1]["content"])

Each frame is a 4-byte big-endian length and a JSON object. Answers are
matched by id: an LLMCMD's answer may come after answers to requests sent
later, so a call waiting for its own answer keeps the others it reads for
the calls that want them.
"""

import base64
import itertools
import json
import os
import socket
import struct

__all__ = ["Client", "AirlockError", "ProtocolError"]

# The proxy's own bounds (its defaults): a read asks for at most this.
MAX_READ = 4096
# Largest answer frame this client accepts; the proxy's frames are smaller.
MAX_FRAME = 64 * 1024 * 1024


class AirlockError(Exception):
    """An `ok: false` answer: `code` is the protocol's (`E_PERM`,
    `E_UNSUPPORTED`, `queue_full`, …), `message` airlock's text."""

    def __init__(self, code, message, op=None, path=None):
        self.code = code
        self.message = message
        self.op = op
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{code}: {message}")


class ProtocolError(Exception):
    """The connection broke or carried something that is not an answer."""


class Client:
    """One connection to airlock. Not thread-safe: one caller at a time."""

    def __init__(self, sock):
        self._sock = sock
        self._ids = itertools.count(1)
        self._early = {}

    # -- connecting ------------------------------------------------------

    @classmethod
    def from_env(cls):
        """Under `airlock run`: a connection of this process's own, attached
        over the shared descriptor `AIRLOCK_FD` (default 3), so several
        processes of the child's tree can talk at once."""
        fd_text = os.environ.get("AIRLOCK_FD", "3")
        try:
            fd = int(fd_text)
        except ValueError:
            raise ProtocolError(f"AIRLOCK_FD={fd_text!r} is not a descriptor") from None
        ours, theirs = socket.socketpair()
        try:
            shared = socket.socket(fileno=os.dup(fd))
        except OSError as e:
            ours.close()
            theirs.close()
            raise ProtocolError(f"no airlock on descriptor {fd}: {e}") from None
        try:
            req = json.dumps({"id": "attach", "op": "attach"}).encode()
            socket.send_fds(shared, [struct.pack(">I", len(req)) + req], [theirs.fileno()])
        finally:
            theirs.close()
            shared.close()
        client = cls(ours)
        answer = client._recv()
        if not answer.get("ok"):
            ours.close()
            err = answer.get("error") or {}
            raise AirlockError(err.get("code", "?"), err.get("message", ""), op="attach")
        return client

    def close(self):
        """Close the connection: airlock closes every handle it left open."""
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the wire --------------------------------------------------------

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ProtocolError("airlock closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv(self):
        (n,) = struct.unpack(">I", self._read_exact(4))
        if n > MAX_FRAME:
            raise ProtocolError(f"answer frame of {n} bytes exceeds {MAX_FRAME}")
        try:
            answer = json.loads(self._read_exact(n))
        except ValueError as e:
            raise ProtocolError(f"answer is not JSON: {e}") from None
        if not isinstance(answer, dict) or "id" not in answer:
            raise ProtocolError(f"not an answer: {answer!r}")
        return answer

    def send(self, op, params=None):
        """Send one request; returns its id (see `wait`)."""
        rid = str(next(self._ids))
        req = {"id": rid, "op": op, "params": params or {}}
        payload = json.dumps(req).encode()
        self._sock.sendall(struct.pack(">I", len(payload)) + payload)
        return rid

    def wait(self, rid, path=None, op=None):
        """The result of request `rid`; raises AirlockError for `ok: false`.
        Answers to other requests read meanwhile are kept for them."""
        while rid not in self._early:
            answer = self._recv()
            self._early[str(answer["id"])] = answer
        answer = self._early.pop(rid)
        if answer.get("ok"):
            return answer.get("result")
        err = answer.get("error") or {}
        raise AirlockError(err.get("code", "?"), err.get("message", ""), op=op, path=path)

    def call(self, op, params=None, path=None):
        return self.wait(self.send(op, params), path=path, op=op)

    # -- files -----------------------------------------------------------

    def open(self, path, mode="r"):
        """A handle for `path` in mode `r`, `w`, `a` or `rw`."""
        return self.call("open", {"path": path, "mode": mode}, path=path)["handle"]

    def read(self, handle, max=MAX_READ):
        """Up to `max` bytes; b"" at the end of the file."""
        result = self.call("read", {"h": handle, "max": max})
        return base64.b64decode(result["data"])

    def write(self, handle, data):
        """Write all of `data` (bytes); returns the count written."""
        written = 0
        for at in range(0, len(data), MAX_READ):
            chunk = data[at : at + MAX_READ]
            written += self.call("write", {"h": handle, "data": base64.b64encode(chunk).decode()})["written"]
        return written

    def close_handle(self, handle):
        self.call("close", {"h": handle})

    def read_file(self, path):
        """The whole content of `path`."""
        h = self.open(path, "r")
        try:
            parts = []
            while True:
                chunk = self.read(h)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        finally:
            self.close_handle(h)

    def write_file(self, path, data, append=False):
        """Create or truncate `path` (append with `append=True`) with `data`."""
        h = self.open(path, "a" if append else "w")
        try:
            return self.write(h, data)
        finally:
            self.close_handle(h)

    # -- the LLM broker --------------------------------------------------

    def llm(self, params):
        """LLMCMD with `params` (a dict: `messages`, `model`, `max_tokens`,
        `cancel_token`, …); returns the result (`messages`, `usage`,
        `model`, `metadata`)."""
        return self.call("LLMCMD", params)

    def ask(self, prompt, system=None, **params):
        """LLMCMD of one user message (after a system one if given)."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return self.llm(dict(params, messages=messages))

    def quota(self, model=None):
        """QUOTA: what remains of the session's budget, and the prices."""
        return self.call("QUOTA", {"model": model} if model else {})

    def cancel(self, token):
        """CANCEL the call carrying `token`: {"cancelled", "state"}."""
        return self.call("CANCEL", {"cancel_token": token})
