"""Burn CPU in argv[1] processes (threads would share the GIL) for argv[2]
seconds of wall time; report the CPU time they took, in seconds."""
import json
import os
import sys
import time

n, secs = int(sys.argv[1]), float(sys.argv[2])
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + secs
        while time.monotonic() < end:
            pass
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
t = os.times()
print(json.dumps({"cpu": t.children_user + t.children_system, "wall": secs}), flush=True)
