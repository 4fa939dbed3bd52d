"""airlock itself and other host processes: RLIMIT_FSIZE=0 on airlock (it
would die of SIGXFSZ writing its report); limits, priority and affinity of
another same-user host process. airlock's pid in AIRLOCK_HOST_PID; argv: other_pid."""
import ctypes
import os
import sys
from probe import check, libc, probe

airlock_pid, other = int(os.environ["AIRLOCK_HOST_PID"]), int(sys.argv[1])
RLIMIT_FSIZE, RLIMIT_NOFILE = 1, 7


class Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]


def prlimit(pid, res, cur, mx):
    new = Rlimit(cur, mx)
    check(libc.prlimit(pid, res, ctypes.byref(new), None))


probe("prlimit airlock", lambda: prlimit(airlock_pid, RLIMIT_FSIZE, 0, 0))
# Any user may lower its own processes' priority.
probe("setpriority airlock", lambda: os.setpriority(os.PRIO_PROCESS, airlock_pid, 19))


def parent():
    # Under a PID namespace the parent is the namespace's own init.
    if os.getppid() <= 1:
        raise OSError(3, "no parent in view")
    prlimit(os.getppid(), RLIMIT_FSIZE, 0, 0)


probe("prlimit parent", parent)
probe("prlimit other", lambda: prlimit(other, RLIMIT_NOFILE, 17, 17))
probe("setpriority other", lambda: os.setpriority(os.PRIO_PROCESS, other, 19))
probe("affinity other", lambda: os.sched_setaffinity(other, {0}))
# Its own limits stay its own to change.
probe("prlimit self", lambda: prlimit(0, RLIMIT_NOFILE, 64, 64))
