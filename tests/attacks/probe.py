"""Shared by the attack scripts: each attempt prints one JSON line
`[label, outcome, detail]`, where outcome is "ok" (the attempt got through)
or the errno name that stopped it. The test decides from these lines and
from what it observes on the host side."""
import ctypes
import errno
import json
import os
import platform

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# System call numbers the Python standard library has no wrapper for.
SYSCALLS = {
    "x86_64": {"add_key": 248, "request_key": 249, "keyctl": 250},
    "aarch64": {"add_key": 217, "request_key": 218, "keyctl": 219},
}[platform.machine()]


def out(label, outcome, detail=""):
    print(json.dumps([label, outcome, detail]), flush=True)


def check(r):
    """A libc return value, or the OSError its errno names."""
    if r is None or r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def probe(label, f):
    """Run one attempt; its return value (if any) is the detail."""
    try:
        detail = f()
        out(label, "ok", "" if detail is None else str(detail))
    except OSError as e:
        out(label, errno.errorcode.get(e.errno, str(e.errno)), str(e))
    except Exception as e:  # a broken attack must show, not pass
        out(label, "broken", repr(e))
