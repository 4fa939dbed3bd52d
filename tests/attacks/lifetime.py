"""Outliving airlock. argv: mode marker.
`pdeathsig`: clear the parent-death signal, name itself MARKER, say
"ready" and sleep (the test SIGKILLs airlock).
`daemon`: double-fork a setsid daemon named MARKER with every descriptor
closed, then exit at once."""
import ctypes
import os
import sys
import time
from probe import check, libc, out

mode, marker = sys.argv[1], sys.argv[2].encode()
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15

if mode == "pdeathsig":
    check(libc.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0))
    check(libc.prctl(PR_SET_NAME, marker, 0, 0, 0))
    out("ready", "ok", os.getpid())
    time.sleep(30)
elif mode == "daemon":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            libc.prctl(PR_SET_NAME, marker, 0, 0, 0)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 1024)
            time.sleep(30)
        os._exit(0)
    os.wait()
    out("daemon started", "ok")
