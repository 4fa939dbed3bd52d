"""A minimal VFS tool client for airlock's `airlock tool` integration tests.

Written from the protocol text (seed 004), not from airlock's code: NDJSON
JSON-RPC 2.0, requests on stdout, responses and notifications on stdin.
"""
import json
import os
import sys

_next_id = 0
INIT = None


def send(msg) -> None:
    """One message, one line, flushed."""
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def send_raw(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def recv():
    """The next message from the host, or None at EOF."""
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)


def init():
    """Read the `init` notification, which must come first."""
    global INIT
    INIT = recv()
    assert INIT is not None and INIT.get("method") == "init", INIT
    return INIT


def request(method, params=None, id=None):
    global _next_id
    if id is None:
        _next_id += 1
        id = _next_id
    msg = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        msg["params"] = params
    send(msg)
    return id


def call(method, params=None):
    """A request and its response (the whole response object)."""
    id = request(method, params)
    resp = recv()
    assert resp is not None, "host closed stdin while a request was pending"
    assert resp.get("id") == id, (id, resp)
    return resp


def ok(method, params=None):
    """The result of a call that must succeed."""
    resp = call(method, params)
    assert "result" in resp, resp
    return resp["result"]


def code(method, params=None):
    """The error code of a call that must fail."""
    resp = call(method, params)
    assert "error" in resp, resp
    return resp["error"]["code"]


def result(content) -> None:
    send({"jsonrpc": "2.0", "method": "result", "params": {"content": content}})


def error(message, **extra) -> None:
    params = {"message": message}
    params.update(extra)
    send({"jsonrpc": "2.0", "method": "error", "params": params})


def state(params) -> None:
    send({"jsonrpc": "2.0", "method": "state", "params": params})


def note(path, text) -> None:
    """Write `text` to `path` directly (a side channel for the test)."""
    with open(path, "w") as f:
        f.write(text)
