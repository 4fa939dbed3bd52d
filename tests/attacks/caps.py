"""Root's capabilities inside, asked of the kernel (capget, prctl), not of
/proc: effective, permitted, inheritable, bounding and ambient sets and
no_new_privs; then the kernel log under dmesg_restrict=1 and the host's
host and domain names. argv: name."""
import ctypes
import sys
from probe import check, libc, out, probe

name = sys.argv[1].encode()
PR_CAPBSET_READ, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, PR_GET_NO_NEW_PRIVS = 23, 47, 1, 39
CAP_LAST = 63


class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


header, data = Header(0x20080522, 0), (Data * 2)()
check(libc.capget(ctypes.byref(header), data))
for field in ("effective", "permitted", "inheritable"):
    value = getattr(data[0], field) | getattr(data[1], field) << 32
    out(field, "%016x" % value)
bounding = ambient = 0
for cap in range(CAP_LAST + 1):
    if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
        bounding |= 1 << cap
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap, 0, 0) == 1:
        ambient |= 1 << cap
out("bounding", "%016x" % bounding)
out("ambient", "%016x" % ambient)
out("no_new_privs", str(libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)))


def dmesg():
    buf = ctypes.create_string_buffer(4096)
    n = check(libc.klogctl(3, buf, 4096))  # SYSLOG_ACTION_READ_ALL
    return "%d bytes" % n


probe("dmesg", dmesg)
probe("sethostname", lambda: check(libc.sethostname(name, len(name))))
probe("setdomainname", lambda: check(libc.setdomainname(name, len(name))))
