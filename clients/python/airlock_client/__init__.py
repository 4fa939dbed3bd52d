"""A client for airlock's protocol: files, the pager and the LLM broker.

For programs running under `airlock run` and for programs that start
`airlock serve` themselves (the connection is then a socket they hold).
Standard library only. Install it with `pip install clients/python`, or put
`clients/python` on `PYTHONPATH`.

    from airlock_client import Client, AirlockError

    with Client.from_env() as c:           # under `airlock run`
        c.write_file("notes.txt", b"hello\\n")
        print(c.read_file("notes.txt"))
        print(c.quota())                    # needs a [broker] section
        print(c.ask("Say hi")["messages"][-1]["content"])

`Client.from_env()` finds the session as the `airlock` CLI does: over the
inherited descriptor `AIRLOCK_FD` (default 3) when it is open, else through
the session socket `AIRLOCK_SOCKET`, proved with the secret
`AIRLOCK_TOKEN` (a parent that closed the descriptor, as Python's
`subprocess` does by default, leaves the environment alone).

Each frame is a 4-byte big-endian length and a JSON object. Answers are
matched by id: an LLMCMD's answer may come after answers to requests sent
later, so a call waiting for its own answer keeps the others it reads for
the calls that want them.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import stat
import struct
from typing import Any, Dict, Iterator, List, Optional, Tuple

__all__ = [
    "Client",
    "AirlockError",
    "AirlockNotFound",
    "AirlockRefused",
    "ProtocolError",
    "MAX_READ",
    "MAX_FRAME",
]

#: The proxy's own bound (its default): a read asks for at most this.
MAX_READ = 4096
#: Largest answer frame this client accepts; the proxy's frames are smaller.
MAX_FRAME = 64 * 1024 * 1024
#: The id of the first answer on a connection through the session socket.
SOCKET_GREETING_ID = "session"

JsonObject = Dict[str, Any]


class AirlockError(Exception):
    """An `ok: false` answer: `code` is the protocol's (`E_PERM`,
    `E_UNSUPPORTED`, `queue_full`, …), `message` airlock's text."""

    def __init__(self, code: str, message: str, op: Optional[str] = None, path: Optional[str] = None):
        self.code = code
        self.message = message
        self.op = op
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{code}: {message}")


class AirlockNotFound(AirlockError, FileNotFoundError):
    """`E_NOENT`: nothing is there (and the policy would let you see it)."""


class AirlockRefused(AirlockError, PermissionError):
    """`E_PERM`: the policy (or the file system) refuses; whether anything
    is there is not told."""


def _error(code: str, message: str, op: Optional[str], path: Optional[str]) -> AirlockError:
    cls = {"E_NOENT": AirlockNotFound, "E_PERM": AirlockRefused}.get(code, AirlockError)
    return cls(code, message, op=op, path=path)


class ProtocolError(Exception):
    """No airlock to talk to, or the connection broke or carried something
    that is not an answer."""


def _is_socket(fd: int) -> bool:
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


class Client:
    """One connection to airlock. Not thread-safe: one caller at a time."""

    def __init__(self, sock: socket.socket):
        """A client over `sock`, a connected stream socket (one end of the
        socketpair given to `airlock serve --fd N`, say)."""
        self._sock = sock
        self._ids = itertools.count(1)
        self._early: Dict[str, JsonObject] = {}
        # The secret of the scope this connection was narrowed to, if any.
        self._secret: Optional[str] = None

    # -- connecting ------------------------------------------------------

    @classmethod
    def from_env(cls) -> "Client":
        """Under `airlock run`: a connection of this process's own.

        Attached over the shared descriptor `AIRLOCK_FD` (default 3) when it
        is open, so several processes of the child's tree can talk at once;
        through the session socket (`AIRLOCK_SOCKET`, `AIRLOCK_TOKEN`) when a
        parent closed it. Raises `ProtocolError` when neither leads to
        airlock, `AirlockError` when airlock refuses the connection (it
        serves `--max-clients` at most)."""
        fd_text = os.environ.get("AIRLOCK_FD")
        try:
            fd = int(fd_text if fd_text is not None else "3")
        except ValueError:
            raise ProtocolError(f"AIRLOCK_FD={fd_text!r} is not a descriptor") from None
        if _is_socket(fd):
            return cls.attach(fd)
        path = os.environ.get("AIRLOCK_SOCKET")
        if path:
            try:
                return cls.from_socket(path, os.environ.get("AIRLOCK_TOKEN", ""))
            except OSError as e:
                raise ProtocolError(
                    f"no airlock on descriptor {fd}: it is not open (a parent process closed it; "
                    f"pass_fds=[{fd}] keeps it), and the session socket {path} failed: {e}"
                ) from None
        if fd_text is None:
            raise ProtocolError(
                "no airlock on descriptor 3: neither AIRLOCK_FD nor AIRLOCK_SOCKET is set "
                "(is this process running under `airlock run`?)"
            )
        raise ProtocolError(
            f"no airlock on descriptor {fd}: it is not open (a parent process closed it: Python's "
            f"subprocess does unless given pass_fds=[{fd}], so does `exec {fd}>&-` in a shell), "
            "and no session socket is named (AIRLOCK_SOCKET is not set)"
        )

    @classmethod
    def attach(cls, fd: int) -> "Client":
        """A connection of this process's own, attached over `fd`, a
        connection to airlock shared with other processes."""
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
        return cls._greeted(ours, "attach")

    @classmethod
    def from_socket(cls, path: str, token: str) -> "Client":
        """A connection through the session socket at `path`, proved with
        the session's secret `token`. A wrong secret gets the connection
        closed (`ProtocolError`)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            sock.sendall(token.encode())
        except OSError:
            sock.close()
            raise
        try:
            return cls._greeted(sock, "connect")
        except (ProtocolError, ConnectionError) as e:
            raise ProtocolError(
                f"the session socket {path} closed the connection (a wrong AIRLOCK_TOKEN, "
                f"or the session is ending): {e}"
            ) from None

    @classmethod
    def _greeted(cls, sock: socket.socket, op: str) -> "Client":
        client = cls(sock)
        try:
            answer = client._recv()
        except BaseException:
            sock.close()
            raise
        if not answer.get("ok"):
            sock.close()
            err = answer.get("error") or {}
            raise AirlockError(err.get("code", "?"), err.get("message", ""), op=op)
        return client

    def close(self) -> None:
        """Close the connection: airlock closes every handle it left open."""
        self._sock.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        """The connection's descriptor (to pass to a child: see `narrowed`)."""
        return self._sock.fileno()

    # -- narrowing -------------------------------------------------------

    def narrow(self, rules: List[JsonObject]) -> str:
        """Narrow this connection, for good, to what `rules` also allow
        (`[{"path": "/abs", "access": "r" | "rw" | "none"}, ...]`); a second
        narrow only narrows further. Returns the narrowed scope's secret:
        the session socket admits it under this scope and nothing wider."""
        result = self.call("narrow", {"rules": rules})
        secret = result.get("secret") if isinstance(result, dict) else None
        if not isinstance(secret, str):
            raise ProtocolError(f"a narrow answered without a secret: {result!r}")
        self._secret = secret
        return secret

    def narrowed(self, rules: List[JsonObject]) -> "Client":
        """A new connection of its own, narrowed to `rules`, for a process
        this one starts and trusts less: start it with the connection's
        descriptor and `child_env()`, e.g.

            with c.narrowed([{"path": os.getcwd(), "access": "r"}]) as sub:
                subprocess.run(cmd, pass_fds=[sub.fileno()], env=sub.child_env())

        This connection stays as it was."""
        sub = Client.attach(self.fileno())
        try:
            sub.narrow(rules)
        except BaseException:
            sub.close()
            raise
        return sub

    def child_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The environment for a process started on this connection (a copy
        of `base`, default `os.environ`): `AIRLOCK_FD` names the connection
        and, once it was narrowed, `AIRLOCK_TOKEN` is the narrowed scope's
        secret, never the session's, so a child that loses the descriptor
        and reconnects through `AIRLOCK_SOCKET` is just as narrow."""
        env = dict(os.environ if base is None else base)
        env["AIRLOCK_FD"] = str(self.fileno())
        if self._secret is not None:
            env["AIRLOCK_TOKEN"] = self._secret
        return env

    # -- the wire --------------------------------------------------------

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ProtocolError("airlock closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv(self) -> JsonObject:
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

    def send(self, op: str, params: Optional[JsonObject] = None) -> str:
        """Send one request; returns its id (see `wait`)."""
        rid = str(next(self._ids))
        req = {"id": rid, "op": op, "params": params or {}}
        payload = json.dumps(req).encode()
        self._sock.sendall(struct.pack(">I", len(payload)) + payload)
        return rid

    def wait(self, rid: str, path: Optional[str] = None, op: Optional[str] = None) -> Any:
        """The result of request `rid`; raises AirlockError for `ok: false`.
        Answers to other requests read meanwhile are kept for them."""
        while rid not in self._early:
            answer = self._recv()
            self._early[str(answer["id"])] = answer
        answer = self._early.pop(rid)
        if answer.get("ok"):
            return answer.get("result")
        err = answer.get("error") or {}
        raise _error(err.get("code", "?"), err.get("message", ""), op, path)

    def call(self, op: str, params: Optional[JsonObject] = None, path: Optional[str] = None) -> Any:
        """Send one request and wait for its result."""
        return self.wait(self.send(op, params), path=path, op=op)

    # -- files -----------------------------------------------------------

    def open(self, path: str, mode: str = "r") -> int:
        """A handle for `path` in mode `r`, `w`, `a` or `rw`."""
        return self.call("open", {"path": path, "mode": mode}, path=path)["handle"]

    def read(self, handle: int, max: int = MAX_READ) -> bytes:
        """Up to `max` bytes; b"" at the end of the file."""
        result = self.call("read", {"h": handle, "max": max})
        return base64.b64decode(result["data"])

    def write(self, handle: int, data: bytes) -> int:
        """Write all of `data`; returns the count written."""
        written = 0
        for at in range(0, len(data), MAX_READ):
            chunk = data[at : at + MAX_READ]
            written += self.call("write", {"h": handle, "data": base64.b64encode(chunk).decode()})["written"]
        return written

    def close_handle(self, handle: int) -> None:
        """Close a handle from `open`."""
        self.call("close", {"h": handle})

    def read_file(self, path: str) -> bytes:
        """The whole content of `path`."""
        h = self.open(path, "r")
        try:
            parts: List[bytes] = []
            while True:
                chunk = self.read(h)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        finally:
            self.close_handle(h)

    def write_file(self, path: str, data: bytes, append: bool = False, parents: bool = False) -> int:
        """Create or truncate `path` (append with `append=True`) with `data`;
        returns the count written. `parents`: make its directories first."""
        if parents and "/" in path.rstrip("/"):
            head = path.rstrip("/").rsplit("/", 1)[0]
            if head:
                self.makedirs(head)
        h = self.open(path, "a" if append else "w")
        try:
            return self.write(h, data)
        finally:
            self.close_handle(h)

    # -- paths -----------------------------------------------------------

    def stat(self, path: str, follow: bool = True) -> JsonObject:
        """`{kind, size, mode, mtime_ns}` of `path`; `kind` is `file`, `dir`,
        `symlink` (with `follow=False`) or `other`."""
        return self.call("stat", {"path": path, "follow": follow}, path=path)

    def scandir(self, path: str = ".", page: Optional[int] = None) -> Iterator[JsonObject]:
        """Each entry of directory `path` (`{name, kind, size}`, names in
        byte order), fetched a page at a time (`page` entries at most)."""
        after: Optional[str] = None
        while True:
            params: JsonObject = {"path": path}
            if after is not None:
                params["after"] = after
            if page is not None:
                params["max"] = page
            result = self.call("list", params, path=path)
            yield from result["entries"]
            nxt = result.get("next")
            if nxt is None:
                return
            if after is not None and nxt <= after:
                raise ProtocolError(f"listing of {path} does not move on past {after!r}")
            after = nxt

    def listdir(self, path: str = ".") -> List[str]:
        """The names in directory `path`, as `os.listdir` gives them."""
        return [e["name"] for e in self.scandir(path)]

    def walk(self, top: str = ".") -> Iterator[Tuple[str, List[str], List[str]]]:
        """`os.walk` top-down: `(dirpath, dirnames, filenames)`; symlinks
        are listed with the files and never followed. Pruning `dirnames`
        in place prunes the walk."""
        dirs: List[str] = []
        files: List[str] = []
        for e in self.scandir(top):
            (dirs if e["kind"] == "dir" else files).append(e["name"])
        yield top, dirs, files
        for d in dirs:
            yield from self.walk(d if top in (".", "") else f"{top.rstrip('/')}/{d}")

    def exists(self, path: str) -> bool:
        """Whether `path` is there; refused is not "missing" (it raises)."""
        try:
            self.stat(path)
            return True
        except AirlockNotFound:
            return False

    def isdir(self, path: str) -> bool:
        return self.exists(path) and self.stat(path)["kind"] == "dir"

    def mkdir(self, path: str, parents: bool = False) -> None:
        """Make directory `path`; `parents`: its missing directories too,
        and one already there is fine (`mkdir -p`)."""
        self.call("mkdir", {"path": path, "parents": parents}, path=path)

    def makedirs(self, path: str, exist_ok: bool = True) -> None:
        """`os.makedirs`."""
        if not exist_ok and self.exists(path):
            raise AirlockError("E_ARG", f"{path} already exists", op="mkdir", path=path)
        self.mkdir(path, parents=True)

    def remove(self, path: str) -> None:
        """Remove a file, a symlink (not what it leads to) or an empty
        directory."""
        self.call("remove", {"path": path}, path=path)

    def rmtree(self, path: str) -> None:
        """Remove `path` and everything beneath it, bottom up (symlinks are
        removed, never followed)."""
        if self.stat(path, follow=False)["kind"] == "dir":
            for e in list(self.scandir(path)):
                child = f"{path.rstrip('/')}/{e['name']}"
                if e["kind"] == "dir":
                    self.rmtree(child)
                else:
                    self.remove(child)
        self.remove(path)

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        """Move `src` to `dst`, replacing what is there (as `os.replace`)
        unless `replace=False`."""
        self.call("rename", {"from": src, "to": dst, "noreplace": not replace}, path=src)

    # -- the pager -------------------------------------------------------

    def fd_wrap(self, data: Optional[bytes] = None, path: Optional[str] = None, **params: Any) -> JsonObject:
        """FD_WRAP: keep `data` (or the file at `path`) as a paged `fd:N`;
        the result names it (`fd`) and holds its first page. Other params
        (`stream`, `more`, `offset`, `source`) pass through."""
        if data is not None:
            params["data"] = base64.b64encode(data).decode()
        if path is not None:
            params["path"] = path
        return self.call("FD_WRAP", params, path=path)

    def fd_read(self, fd: str, **params: Any) -> JsonObject:
        """FD_READ of `fd` (`fd:N`): a `page`, a line range (`start_line`,
        `end_line`), `all`, `preview` or a `cursor`."""
        return self.call("FD_READ", dict(params, fd=fd))

    def fd_search(self, fd: str, query: str, ignore_case: bool = False, **params: Any) -> JsonObject:
        """FD_SEARCH: lines of `fd` matching `query`."""
        return self.call("FD_SEARCH", dict(params, fd=fd, query=query, ignore_case=ignore_case))

    def fd_to_file(self, fd: str, path: str, **params: Any) -> JsonObject:
        """FD_TO_FILE: write `fd` (or a `page`, or lines) to `path`, under
        the session's policy; `mode` is `write`, `append` or `insert`."""
        return self.call("FD_TO_FILE", dict(params, fd=fd, path=path), path=path)

    # -- the LLM broker --------------------------------------------------

    def llm(self, params: JsonObject) -> JsonObject:
        """LLMCMD with `params` (a dict: `messages`, `model`, `max_tokens`,
        `cancel_token`, …); returns the result (`messages`, `usage`,
        `model`, `metadata`)."""
        return self.call("LLMCMD", params)

    def ask(self, prompt: str, system: Optional[str] = None, **params: Any) -> JsonObject:
        """LLMCMD of one user message (after a system one if given)."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return self.llm(dict(params, messages=messages))

    def quota(self, model: Optional[str] = None) -> JsonObject:
        """QUOTA: what remains of the session's budget, and the prices."""
        return self.call("QUOTA", {"model": model} if model else {})

    def cancel(self, token: str) -> JsonObject:
        """CANCEL the call carrying `token`: {"cancelled", "state"}."""
        return self.call("CANCEL", {"cancel_token": token})
