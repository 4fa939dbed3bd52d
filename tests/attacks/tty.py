"""The terminal airlock was started from: push a command into its input
with TIOCSTI through descriptors 0, 1 and 2 (and with the request's high
bits set, which the kernel's tty code ignores), through a freshly opened
/dev/tty, and from a grandchild in a new process group; TIOCLINUX (a
console's paste) on fd 0. argv: the text to push (a command line)."""
import ctypes
import os
import sys
from probe import check, libc, out, probe

text = sys.argv[1].encode() + b"\n"
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
SYS_ioctl = {"x86_64": 16, "aarch64": 29}[os.uname().machine]


def push(fd, request=TIOCSTI):
    for b in text:
        c = ctypes.c_char(b)
        check(libc.syscall(SYS_ioctl, fd, ctypes.c_ulong(request), ctypes.byref(c)))


probe("fd 0 is a terminal", lambda: os.isatty(0) or (_ for _ in ()).throw(OSError(25, "not a tty")))
for fd in (0, 1, 2):
    probe(f"tiocsti fd {fd}", lambda fd=fd: push(fd))
probe("tiocsti high bits", lambda: push(0, TIOCSTI | (1 << 32)))


def dev_tty():
    fd = os.open("/dev/tty", os.O_RDWR)
    try:
        push(fd)
    finally:
        os.close(fd)


probe("tiocsti /dev/tty", dev_tty)


def tioclinux():
    # TIOCL_PASTESEL: paste the console's selection as input.
    sub = ctypes.c_char(3)
    check(libc.syscall(SYS_ioctl, 0, ctypes.c_ulong(TIOCLINUX), ctypes.byref(sub)))


probe("tioclinux", tioclinux)

# A grandchild in a process group of its own (as a job-control shell
# would put it) tries again through its inherited fd 0.
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    try:
        push(0)
        out("tiocsti grandchild", "ok")
    except OSError as e:
        import errno
        out("tiocsti grandchild", errno.errorcode.get(e.errno, str(e.errno)), str(e))
    os._exit(0)
os.waitpid(pid, 0)
