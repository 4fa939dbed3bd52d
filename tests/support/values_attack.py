"""A VFS tool that sends airlock one line of JSON cheap as text and dear
once parsed (`[{"a":0},...]`, about 100 bytes of heap per byte), writes
`ready`, waits until the project holds `go` (the test reads airlock's
peak memory in between), and returns airlock's answer to that line as its result."""
import json, sys, time

def send(msg):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **msg}) + "\n")
    sys.stdout.flush()

json.loads(sys.stdin.readline())
n = int(sys.argv[1])
junk = "[" + '{"a":0},' * n + "0]"
sys.stdout.write('{"jsonrpc":"2.0","id":1,"method":"fs.exists","params":{"path":"x","junk":%s}}\n' % junk)
sys.stdout.flush()
reply = sys.stdin.readline()
send({"id": 2, "method": "fs.write", "params": {"path": "ready", "content": "1"}})
sys.stdin.readline()
i = 3
while True:
    send({"id": i, "method": "fs.exists", "params": {"path": "go"}})
    r = json.loads(sys.stdin.readline())
    i += 1
    res = r.get("result")
    if res is True or (isinstance(res, dict) and res.get("exists")):
        break
    time.sleep(0.05)
send({"method": "result", "params": {"content": reply}})
