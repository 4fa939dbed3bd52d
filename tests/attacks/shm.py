"""SysV shared memory of a host process (0600, same user): list it, attach
it by key and by id, read it, overwrite it. argv: key shmid."""
import ctypes
import sys
from probe import check, libc, probe

key, shmid = int(sys.argv[1]), int(sys.argv[2])
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]


def listed():
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    if not any(int(r[0]) == key for r in rows if r):
        raise OSError(2, "not listed")


def steal(sid):
    addr = libc.shmat(sid, None, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        check(-1)
    data = ctypes.string_at(addr, 64).split(b"\0")[0].decode(errors="replace")
    ctypes.memmove(addr, b"pwned\0", 6)
    libc.shmdt(addr)
    return data


probe("list", listed)
probe("attach by key", lambda: steal(check(libc.shmget(key, 0, 0))))
probe("attach by id", lambda: steal(shmid))
