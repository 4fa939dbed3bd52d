#!/usr/bin/env python3
"""Write the seed corpus of the egress_parse fuzz target.

An input is a mode byte (even: the HTTP proxy, odd: SOCKS5), a split
byte (the client's bytes arrive 1 + b % 13 at a time), then the client's
bytes (see core/tests/support/egress_oracle.rs). The patterns the machine
runs with allow a.example, *.b.example:443 and 127.0.0.1:8080 /
localhost:8080, and deny x.b.example.
"""
import os
import sys

HTTP = {
    "connect_allowed": b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n\x16\x03\x01early",
    "connect_wildcard": b"CONNECT Deep.Sub.B.Example.:443 HTTP/1.1\r\n\r\n",
    "connect_wildcard_wrong_port": b"CONNECT s.b.example:8443 HTTP/1.1\r\n\r\n",
    "connect_denied": b"CONNECT x.b.example:443 HTTP/1.1\r\n\r\n",
    "connect_refused_name": b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n",
    "connect_hex_loopback": b"CONNECT 0x7f.1:8080 HTTP/1.1\r\n\r\n",
    "connect_decimal_loopback": b"CONNECT 2130706433:8080 HTTP/1.1\r\n\r\n",
    "connect_octal_loopback": b"CONNECT 0177.0.0.1:22 HTTP/1.1\r\n\r\n",
    "connect_mapped_v6": b"CONNECT [::ffff:127.0.0.1]:8080 HTTP/1.1\r\n\r\n",
    "connect_metadata": b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n",
    "connect_localhost": b"CONNECT localhost:8080 HTTP/1.1\r\n\r\n",
    "connect_no_port": b"CONNECT a.example HTTP/1.1\r\n\r\n",
    "connect_userinfo": b"CONNECT u@a.example:443 HTTP/1.1\r\n\r\n",
    "connect_idna": "CONNECT ｂｕｃｈ.b.example:443 HTTP/1.1\r\n\r\n".encode(),
    "forward_allowed": b"GET http://a.example/x?y=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: x\r\nConnection: keep-alive, X-Gone\r\nX-Gone: 1\r\n\r\n",
    "forward_post_body": b"POST http://a.example/up HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "forward_pipelined": b"GET http://a.example/ HTTP/1.1\r\n\r\nGET http://evil.example/ HTTP/1.1\r\n\r\n",
    "forward_userinfo_confusion": b"GET http://a.example@evil.example/ HTTP/1.1\r\n\r\n",
    "forward_https_absolute": b"GET https://a.example/ HTTP/1.1\r\n\r\n",
    "forward_origin_form": b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n",
    "forward_empty_port": b"GET http://a.example:/ HTTP/1.1\r\n\r\n",
    "forward_trailing_dot": b"GET http://A.EXAMPLE./ HTTP/1.0\r\n\r\n",
    "forward_backslash": b"GET http://a.example\\@evil.example/ HTTP/1.1\r\n\r\n",
    "forward_percent_host": b"GET http://a%2eexample/ HTTP/1.1\r\n\r\n",
    "forward_localhost_allowed": b"GET http://localhost:8080/ HTTP/1.1\r\n\r\n",
    "lf_only": b"CONNECT a.example:443 HTTP/1.1\n\n",
    "leading_blank_lines": b"\r\n\r\nCONNECT a.example:443 HTTP/1.1\r\n\r\n",
    "tls_hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    "http2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "many_headers": b"CONNECT a.example:443 HTTP/1.1\r\n" + b"X: y\r\n" * 120 + b"\r\n",
    "oversized": b"CONNECT a.example:443 HTTP/1.1\r\nX: " + b"z" * 5000 + b"\r\n\r\n",
    "partial": b"CONNECT a.example:4",
    "obs_fold": b"GET http://a.example/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
}

SOCKS = {
    "socks_domain_allowed": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x09a.example\x01\xbbearly",
    "socks_domain_refused": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x0cevil.example\x01\xbb",
    "socks_ipv4_loopback": b"\x05\x01\x00" + b"\x05\x01\x00\x01\x7f\x00\x00\x01\x1f\x90",
    "socks_ipv6_mapped": b"\x05\x01\x00" + b"\x05\x01\x00\x04" + bytes(10) + b"\xff\xff\x7f\x00\x00\x01" + b"\x1f\x90",
    "socks_domain_numeric": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x060x7f.1\x1f\x90",
    "socks_bind": b"\x05\x01\x00" + b"\x05\x02\x00\x01\x01\x02\x03\x04\x00\x50",
    "socks_udp": b"\x05\x01\x00" + b"\x05\x03\x00\x01\x01\x02\x03\x04\x00\x35",
    "socks_bad_atyp": b"\x05\x01\x00" + b"\x05\x01\x00\x09\x00",
    "socks_empty_domain": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x00\x00\x50",
    "socks_port_zero": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x09a.example\x00\x00",
    "socks_no_acceptable": b"\x05\x02\x01\x02",
    "socks_zero_methods": b"\x05\x00",
    "socks4": b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00",
    "socks_not_socks": b"GET http://a.example/ HTTP/1.1\r\n\r\n",
    "socks_reserved_set": b"\x05\x01\x00" + b"\x05\x01\x07\x03\x09a.example\x01\xbb",
    "socks_wildcard": b"\x05\x01\x00" + b"\x05\x01\x00\x03\x0bs.b.example\x01\xbb",
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "egress_parse")
    os.makedirs(out, exist_ok=True)
    for i, (name, body) in enumerate(sorted(HTTP.items())):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([0, i % 13]) + body)
    for i, (name, body) in enumerate(sorted(SOCKS.items())):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([1, i % 13]) + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
