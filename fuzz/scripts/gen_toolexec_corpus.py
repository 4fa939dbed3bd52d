#!/usr/bin/env python3
"""Write the seed corpus of the toolexec_events fuzz target.

An input is a config byte, then events: (op, arg) pairs where op % 11 picks
the event (see core/src/fuzzing/toolexec.rs); a Head event takes one more
byte, and ToolOutput/Body events take their bytes from the input.
"""
import os
import sys

HEAD, BODY, FORM, END, SPAWN, OUT, EOF_, EXIT, TOOK, GONE, TIME = range(11)


def ev(*pairs):
    return bytes(x for p in pairs for x in p)


# Head selector bits: 0-1 auth (0 none), 2-3 proto (1, 2), 4 TE: trailers,
# 5 Content-Length, 6 POST, 7 path /exec.
v2 = bytes([HEAD, 0b11011001, 0])
v1 = bytes([HEAD, 0b11000101, 0])
v2_no_te = bytes([HEAD, 0b11001001, 0])
bad_token = bytes([HEAD, 0b11001000, 1])
no_proto = bytes([HEAD, 0b11000001, 0])
bad_path = bytes([HEAD, 0b01011001, 4])
run = ev((FORM, 0), (END, 0), (SPAWN, 2))

CASES = {
    "v2_stream": bytes([5]) + v2 + run + ev((OUT, 16)) + b"x" * 16 + ev((TOOK, 16), (OUT, 8)) + b"y" * 8
    + ev((EXIT, 3), (EOF_, 0)),
    "v1_buffered": bytes([5]) + v1 + run + ev((OUT, 40)) + b"z" * 40 + ev((EXIT, 0), (EOF_, 0)),
    "v2_without_te": bytes([5]) + v2_no_te + run + ev((OUT, 5)) + b"hello" + ev((EXIT, 0), (EOF_, 0)),
    "v1_overflow": bytes([5]) + v1 + run + (ev((OUT, 64)) + b"o" * 64) * 10 + ev((EXIT, 9)),
    "timeout_stream": bytes([0x11]) + v2 + run + ev((OUT, 4)) + b"part"
    + ev((TIME, 250), (0x80 | TIME, 40), (0x80 | TIME, 40), (EXIT, 0x8F), (EOF_, 0)),
    "timeout_silent": bytes([0x11]) + v2 + run + ev((0x80 | TIME, 100), (0x80 | TIME, 100), (EXIT, 0x89), (EOF_, 0)),
    "unauthorized": bytes([5]) + bad_token + run,
    "no_proto": bytes([5]) + no_proto + ev((FORM, 0), (END, 0)),
    "bad_path": bytes([5]) + bad_path + ev((FORM, 0), (END, 0)),
    "client_gone_running": bytes([5]) + v2 + run + ev((OUT, 3)) + b"abc" + ev((GONE, 0), (OUT, 3)) + b"def"
    + ev((EXIT, 0x89), (EOF_, 0)),
    "client_gone_body": bytes([5]) + v2 + ev((BODY, 5)) + b"tool=" + ev((GONE, 0), (END, 0), (SPAWN, 2)),
    "stalled_window": bytes([5]) + v2 + run + (ev((OUT, 64)) + b"s" * 64) * 6
    + ev((EXIT, 0), (0x80 | TIME, 100), (TOOK, 255), (OUT, 64)) + b"t" * 64,
    "not_installed": bytes([5]) + v2 + ev((FORM, 0), (END, 0), (SPAWN, 0)),
    "spawn_failed": bytes([5]) + v1 + ev((FORM, 0), (END, 0), (SPAWN, 1)),
    "big_body": bytes([5]) + v2 + ev((BODY, 47)) + b"b" * 47 + ev((BODY, 47)) + b"c" * 47 + ev((END, 0)),
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "corpus", "toolexec_events")
os.makedirs(out, exist_ok=True)
for name, data in CASES.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
