#!/usr/bin/env python3
"""Write the seed corpora of the vfs_url and vfs_scrub fuzz targets.

vfs_url: an input is one URL's text, checked against the prefixes in
core/tests/support/url_oracle.rs. vfs_scrub: a count byte (1 + b % 4
secrets), each secret as a length byte (b % 24) and its bytes, then the
content, where 0xFF j stands for secret j (see scrubber in
core/src/vfs/fuzzing.rs).
"""
import os
import sys

URLS = {
    "allowed_plain": "http://h.example/pub/file.txt",
    "allowed_case_and_default_port": "HTTP://H.Example:80/pub/a/../file.txt?x=1",
    "allowed_unreserved_escapes": "http://h.example/pub/%66ile%7e%2a.txt",
    "allowed_query_escapes": "http://h.example/api/v1?path=..%2f..%2fetc",
    "allowed_ipv6": "http://[::1]/x/y/./z",
    "allowed_port": "https://h.example:8443/a/b/c/../d",
    "encoded_dots_and_slash": "http://h.example/pub/%2e%2e%2fprivate.txt",
    "dots_and_encoded_slash": "http://h.example/pub/..%2fprivate.txt",
    "encoded_dot_segment": "http://h.example/pub/%2e%2e/private.txt",
    "half_encoded_dot_segment": "http://h.example/pub/.%2E/private.txt",
    "encoded_backslash": "http://h.example/pub/..%5cprivate.txt",
    "backslash": "http://h.example/pub/..\\private.txt",
    "double_encoded": "http://h.example/pub/%252e%252e%252fprivate.txt",
    "dot_segments_out": "http://h.example/pub/../private.txt",
    "prefix_sibling": "http://h.example/apix",
    "userinfo": "http://u:p@h.example/pub/",
    "numeric_host": "http://2130706433:8080/",
    "hex_host": "http://0x7f.0.0.1:8080/",
    "short_ipv4": "http://127.1:8080/",
    "ipv6_not_canonical": "http://[0:0::1]/x/",
    "port_leading_zero": "http://h.example:080/pub/",
    "empty_port": "http://h.example:/pub/",
    "trailing_dot_host": "http://h.example./pub/",
    "fragment": "http://h.example/pub/x#../../private",
    "bad_escape": "http://h.example/pub/%zz",
    "non_ascii": "http://h.example/pub/\u00e9",
}

PEM = (b"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq\n-----END")[:23]


def secret(b: bytes) -> bytes:
    return bytes([len(b)]) + b


SCRUB = {
    "one_secret_plain": bytes([0]) + secret(b"tok-123456") + b"token=" + bytes([0xFF, 0]) + b" end",
    "multi_line_secret": bytes([0]) + secret(PEM) + b"# key\n" + bytes([0xFF, 0]) + b"\nEOF\n",
    "overlapping_secrets": bytes([2]) + secret(b"abcd") + secret(b"abcdefgh") + secret(b"cdef")
    + b"--" + bytes([0xFF, 1, 0xFF, 0, 0xFF, 2]) + b"abcdef",
    "short_secret_ignored": bytes([1]) + secret(b"ab") + secret(b"wxyz") + b"ab ab " + bytes([0xFF, 1]),
    "secret_like_marker": bytes([1]) + secret(b"ACTED]x") + secret(b"s3cr") + bytes([0xFF, 1]) + b"x "
    + bytes([0xFF, 0]),
    "binary_secret": bytes([0]) + secret(b"\x00\xff.*\n") + b"a" + bytes([0xFF, 0, 0xFF, 0]) + b"\xff",
    "no_secret_in_content": bytes([3]) + secret(b"never-here") + secret(b"nor-this") + secret(b"x")
    + secret(b"") + b"plain content\nwith lines\n",
}


def write(target, cases):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", target)
    os.makedirs(root, exist_ok=True)
    for name, data in cases.items():
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)


def main():
    write("vfs_url", URLS)
    write("vfs_scrub", SCRUB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
