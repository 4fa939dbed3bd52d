"""The user's kernel keyring: search it for a key the host added, read the
secret. argv: description."""
import ctypes
import sys
from probe import SYSCALLS, check, libc, probe

desc = sys.argv[1].encode()
KEY_SPEC_USER_KEYRING = -4
KEYCTL_SEARCH, KEYCTL_READ = 10, 11


def keyctl(*args):
    return check(libc.syscall(SYSCALLS["keyctl"], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args]))


def read(key):
    buf = ctypes.create_string_buffer(256)
    n = keyctl(KEYCTL_READ, key, buf, 256)
    return buf.raw[:n].decode(errors="replace")


probe("search", lambda: read(keyctl(KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", desc, 0)))
probe("request_key", lambda: read(check(libc.syscall(SYSCALLS["request_key"], b"user", desc, None, ctypes.c_long(0)))))
