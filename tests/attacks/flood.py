"""A process flood: fork up to argv[1] children that each wait for the
flood's end, counting those that started, then report and release them.
Every fork refused is one the bound stopped."""
import json
import os
import sys
import time

want = int(sys.argv[1])
r, w = os.pipe()
started, refused = 0, None
for _ in range(want):
    try:
        pid = os.fork()
    except OSError as e:
        refused = e.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    started += 1
print(json.dumps({"started": started, "refused": refused}), flush=True)
os.close(w)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
