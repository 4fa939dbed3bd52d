"""The session socket's directory and setuid bits: write into the
socket's directory (past the 64 MiB bound of the private /tmp), make a
subdirectory 0500 there, make the directory itself 0500 (so an airlock
that does not repair modes cannot remove it), plant a setuid copy of `id`
there; set the setuid or setgid bit on a file in a directory the child may
write (`--sandbox-rw`) by every call that takes a mode; report the mount
options of that directory and of the socket (when /proc is readable);
reach the session through the socket with fd 3 closed. Then hold until
the test creates RW/release. argv: rw_dir."""
import ctypes
import os
import shutil
import subprocess
import sys
from probe import check, libc, out, probe

rw = sys.argv[1]
sock = os.environ["AIRLOCK_SOCKET"]
d = os.path.dirname(sock)
out("socket", "ok", sock)


def write_big():
    chunk = b"x" * (1 << 20)
    with open(os.path.join(d, "big"), "wb") as f:
        for _ in range(65):
            f.write(chunk)


probe("write in the socket dir", write_big)


def subdir():
    os.mkdir(os.path.join(d, "sub"))
    os.chmod(os.path.join(d, "sub"), 0o500)


probe("0500 subdir in the socket dir", subdir)


def plant():
    shutil.copy("/usr/bin/id", os.path.join(d, "id"))
    os.chmod(os.path.join(d, "id"), 0o4755)


probe("setuid id in the socket dir", plant)
probe("chmod the socket", lambda: os.chmod(sock, 0o777))
probe("chmod the socket dir", lambda: os.chmod(d, 0o500))

# setuid and setgid bits where the child may write.
target = os.path.join(rw, "plain")
with open(target, "w") as f:
    f.write("#!/bin/sh\nid\n")
SYS = {"x86_64": {"chmod": 90, "fchmodat2": 452, "mknod": 133}, "aarch64": {"fchmodat2": 452}}[os.uname().machine]
AT_FDCWD = -100
for bits, name in [(0o4755, "setuid"), (0o2755, "setgid")]:
    probe(f"{name} chmod", lambda b=bits: os.chmod(target, b))
    probe(f"{name} fchmod", lambda b=bits: os.fchmod(os.open(target, os.O_RDONLY), b))
    if "chmod" in SYS:
        probe(f"{name} chmod(2)", lambda b=bits: check(libc.syscall(SYS["chmod"], target.encode(), b)))
    probe(
        f"{name} fchmodat2",
        lambda b=bits: check(libc.syscall(SYS["fchmodat2"], AT_FDCWD, target.encode(), b, 0)),
    )
    probe(
        f"{name} open O_CREAT",
        lambda b=bits, n=name: os.close(os.open(os.path.join(rw, n + "-open"), os.O_CREAT | os.O_WRONLY, b)),
    )
    probe(f"{name} mknod", lambda b=bits, n=name: os.mknod(os.path.join(rw, n + "-mknod"), 0o100000 | b))
    probe(
        f"{name} O_TMPFILE",
        lambda b=bits: os.close(os.open(rw, os.O_TMPFILE | os.O_WRONLY, b)),
    )
probe("mode of plain", lambda: oct(os.stat(target).st_mode & 0o7777))


def mounts():
    opts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            opts[fields[4]] = fields[5]
    return "%s|%s" % (opts.get(rw, "-"), opts.get(sock, "-"))


probe("mount options", mounts)


def through_socket():
    r = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, close_fds=True)
    if r.returncode != 0:
        raise OSError(13, r.stderr.decode(errors="replace").strip())
    return r.stdout.decode().strip()


probe("session through the socket", through_socket)
out("hold", "ok")
import time

for _ in range(3000):
    if os.path.exists(os.path.join(rw, "release")):
        break
    time.sleep(0.01)
out("done", "ok")
