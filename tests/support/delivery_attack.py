"""Requests delivered every awkward way a client's socket allows, against
the real `airlock serve`: every request must be answered exactly once, and
the server must exit 0 at EOF. Usage: delivery_attack.py AIRLOCK DIR

- a flood: 2000 reads in one write, no answer read until all are sent
  (past the queue bound: the excess is refused, still answered);
- a frame split around a passed descriptor, then one more frame;
- an out-of-band byte between two frames (a Unix socket's read stops
  short of its mark with the next frame already queued);
- a frame trickled a byte at a time.
"""
import array
import json
import os
import socket
import struct
import subprocess
import sys
import time

airlock, root = sys.argv[1], sys.argv[2]
with open(os.path.join(root, "f.txt"), "w") as f:
    f.write("delivered\n")
ours, theirs = socket.socketpair()
# Its output not on ours: a server left hanging must not hold our caller's
# pipes open after we fail.
server = subprocess.Popen([airlock, "serve", "--fd", str(theirs.fileno()), "--allow", root],
                          pass_fds=[theirs.fileno()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
theirs.close()
ours.settimeout(20)


def frame(obj):
    payload = json.dumps(obj).encode()
    return struct.pack(">I", len(payload)) + payload


def exact(n):
    buf = b""
    while len(buf) < n:
        chunk = ours.recv(n - len(buf))
        if not chunk:
            raise EOFError("server closed the connection")
        buf += chunk
    return buf


def answer():
    (n,) = struct.unpack(">I", exact(4))
    return json.loads(exact(n))


def answers(ids):
    """Answers to exactly `ids`, each once, in whatever order."""
    got = {}
    while len(got) < len(ids):
        a = answer()
        assert a["id"] in ids and a["id"] not in got, a
        got[a["id"]] = a
    return got


def attack():
    ours.sendall(frame({"id": "o", "op": "open", "params": {"path": os.path.join(root, "f.txt"), "mode": "r"}}))
    h = answer()["result"]["handle"]

    def read(rid):
        return frame({"id": rid, "op": "read", "params": {"h": h, "max": 4}})

    ids = [f"a{i}" for i in range(2000)]
    ours.sendall(b"".join(read(i) for i in ids))
    got = answers(set(ids))
    refused = [a for a in got.values() if not a["ok"]]
    assert refused and all(a["error"]["code"] == "E_RANGE" for a in refused), refused[:3]
    print(f"flood: 2000 answered, {len(refused)} refused as over the queue bound")

    r, w = os.pipe()
    f = read("b1")
    ours.sendall(f[:3])
    time.sleep(0.01)
    ours.sendmsg([f[3:9]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
    ours.sendall(f[9:] + read("b2"))
    assert all(a["ok"] for a in answers({"b1", "b2"}).values())
    print("descriptor mid-frame: both answered")

    ours.sendall(read("c1"))
    ours.send(b"!", socket.MSG_OOB)
    ours.sendall(read("c2"))
    assert all(a["ok"] for a in answers({"c1", "c2"}).values())
    print("out-of-band byte: both answered")

    for byte in read("d1"):
        ours.send(bytes([byte]))
    assert answers({"d1"})["d1"]["ok"]
    print("trickled: answered")


try:
    attack()
except BaseException:
    server.kill()
    raise
ours.close()
print(f"server exited {server.wait(timeout=20)}")
