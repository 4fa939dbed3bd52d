import os, signal, struct, json, base64
fd = 3
def call(req):
    p = json.dumps(req).encode()
    os.write(fd, struct.pack(">I", len(p)) + p)
    n = struct.unpack(">I", os.read(fd, 4))[0]
    return json.loads(os.read(fd, n))
h = call({"id": "1", "op": "open", "params": {"path": "k.txt", "mode": "w"}})["result"]["handle"]
call({"id": "2", "op": "open", "params": {"path": "k2.txt", "mode": "a"}})
call({"id": "3", "op": "write", "params": {"h": h, "data": base64.b64encode(b"kept\n").decode()}})
os.kill(os.getpid(), signal.SIGKILL)
