#!/usr/bin/env python3
"""Write the seed corpus of the toolexec_http fuzz target.

An input is the raw bytes one client sends on one connection to the
ToolExec service (tests/support/toolexec_http_check.rs holds the server's
token, tools and working directory these requests are written against).
"""
import os
import sys

TOKEN = "fuzz-token-7Qx"


def request(body=b"tool=echo&arg=hello&arg=world", auth="Bearer " + TOKEN, proto="1", te=None,
            method="POST", path="/exec", length=None, extra=(), version="1.1"):
    head = [f"{method} {path} HTTP/{version}", "Host: localhost"]
    if auth is not None:
        head.append(f"Authorization: {auth}")
    if proto is not None:
        head.append(f"X-Aifo-Proto: {proto}")
    if te is not None:
        head.append(f"TE: {te}")
    head.append("Content-Type: application/x-www-form-urlencoded")
    head.append(f"Content-Length: {len(body) if length is None else length}")
    head.extend(extra)
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


CASES = {
    "v1_valid": request(),
    "v2_trailers": request(proto="2", te="trailers", body=b"tool=cat&arg=a%20b&cwd=%2Fwork%2Fdir"),
    "v2_without_te": request(proto="2", body=b"tool=echo"),
    "bad_token": request(auth="Bearer wrong"),
    "no_authorization": request(auth=None),
    "wrong_path": request(path="/nope"),
    "get": request(method="GET", body=b""),
    "bad_proto": request(proto="7"),
    "oversized_content_length": request(length=50_000_000, body=b"tool=echo"),
    "malformed_form": request(body=b"tool=echo&arg=%zz"),
    "tool_not_allowed": request(body=b"tool=rm&arg=-rf"),
    "tool_missing": request(proto="2", te="trailers", body=b"tool=missing"),
    "tool_broken": request(body=b"tool=broken"),
    "cwd_escape": request(body=b"tool=echo&cwd=%2Fetc"),
    "pipelined_two": request() + request(proto="2", te="trailers"),
    "truncated_head": request()[:40],
    "truncated_body": request(body=b"tool=echo&arg=xyz", length=200),
    "chunked_body": request(body=b"", extra=("Transfer-Encoding: chunked",))
    .replace(b"Content-Length: 0\r\n", b"") + b"9\r\ntool=echo\r\n0\r\n\r\n",
    "token_form": request(auth="Token=" + TOKEN),
    "empty": b"",
    # HTTP/1.0 has no trailers: answered as v1, exit code in a header.
    "v2_trailers_http10": request(proto="2", te="trailers", version="1.0"),
    # hyper sends a response's trailers only for a TE value of visible ASCII
    # whose list holds the bare token; any other is answered buffered, with
    # X-Exit-Code as a header (a fuzz finding: non-ASCII after the token).
    "v2_trailers_non_ascii_te": request(proto="2", te="trailers,\u01f5"),
    "v2_trailers_with_parameter": request(proto="2", te="trailers;q=1"),
    # Not HTTP at all: hyper's own 400, which the service never sees.
    "nul_in_header_value": request(extra=("X-Junk: a\x00b",)),
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "corpus", "toolexec_http")
os.makedirs(out, exist_ok=True)
for name, data in CASES.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
