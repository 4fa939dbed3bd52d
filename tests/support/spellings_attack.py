# Request spellings against a real `airlock serve`: whitespace, escapes,
# odd numbers, repeated and unknown members, bytes that are not UTF-8,
# escaped quotes at the end of kilobytes of base64. Each must get the
# answer its JSON means (or that JSON's refusal), the writes must land, and
# the server must keep serving and exit 0 at EOF. A frame shaped like a
# response is dropped only when it is JSON: one that is not gets its
# refusal like any other.
#
#   python3 spellings_attack.py AIRLOCK
import base64, json, os, shutil, socket, struct, subprocess, sys, tempfile
bin_ = sys.argv[1]
root = tempfile.mkdtemp()
open(os.path.join(root, "a.txt"), "wb").write(b"hello world")
parent, child = socket.socketpair()
p = subprocess.Popen([bin_, "serve", "--fd", str(child.fileno()), "--allow-rw", root], pass_fds=[child.fileno()])
child.close()
# A dropped frame fails the run instead of hanging it.
parent.settimeout(20)
def send(raw):
    parent.sendall(struct.pack(">I", len(raw)) + raw)
def recv():
    hdr = b""
    while len(hdr) < 4:
        hdr += parent.recv(4 - len(hdr))
    n = struct.unpack(">I", hdr)[0]
    body = b""
    while len(body) < n:
        body += parent.recv(n - len(body))
    return json.loads(body)
def ask(raw):
    send(raw if isinstance(raw, bytes) else raw.encode())
    return recv()
path = os.path.join(root, "a.txt")
r = ask('{"id":"o","op":"open","params":{"path":%s,"mode":"rw"}}' % json.dumps(path))
assert r["ok"], r
h = r["result"]["handle"]
cases = [
    # (frame, expectation: "ok", or an error code)
    ('{ "id" : "w1" ,\n "op":"read", "params" : {"h":%d,"max":4} }' % h, "ok"),
    ('{"\\u0069d":"w2","op":"read","params":{"h":%d,"max":1}}' % h, "ok"),
    ('{"id":"w3","op":"read","params":{"h":0%d,"max":1}}' % h, "E_ARG"),
    ('{"id":"w4","op":"read","params":{"h":%d,"max":1e3}}' % h, "E_ARG"),
    ('{"id":"w5","op":"read","params":{"h":%d,"max":18446744073709551616}}' % h, "E_ARG"),
    ('{"id":"w6","op":"read","params":{"h":%d,"h":999,"max":1}}' % h, "E_NOENT"),
    ('{"id":"w7","op":"write","params":{"h":%d,"data":"aGk\\u003d"}}' % h, "ok"),
    ('{"id":"w8","op":"write","params":{"h":%d,"data":"aGk=\\""}}' % h, "E_ARG"),
    ('{"id":"w9","op":"write","params":{"h":%d,"data":"a\tGk="}}' % h, "E_ARG"),
    ('{"id":"w10","op":"read","params":{"h":%d,"max":1}} x' % h, "E_ARG"),
    ('{"id":"w11","op":"read","params":{"h":%d,"max":1,"junk":%s}}' % (h, "[" * 200 + "]" * 200), "E_ARG"),
    ('{"id":"w12","op":"close","params":{"h":%d,"final":tru}}' % h, "E_ARG"),
    (b'{"id":"w13\xff","op":"read","params":{"h":%d,"max":1}}' % h, "E_ARG"),
    ('{"id":"w14","op":"write","params":{"h":%d,"data":"%s"}}' % (h, base64.b64encode(b"z" * 60000).decode()), "ok"),
    ('{"id":"w15","op":"write","params":{"h":%d,"data":"%s\\"}}' % (h, "A" * 60000), "E_ARG"),
    ('{"id":"w16","op":"read","params":{"h":%d,"max":-1}}' % h, "E_ARG"),
    # A `data` member the op ignores is still JSON: not UTF-8, a control
    # character, an escaped quote that leaves the string open.
    (b'{"id":"w17","op":"close","params":{"h":%d,"data":"V\x96VV"}}' % h, "E_ARG"),
    ('{"id":"w18","op":"read","params":{"h":%d,"max":1,"data":"a\x01b"}}' % h, "E_ARG"),
    ('{"id":"w19","op":"read","params":{"h":%d,"max":1,"data":"\\"}}' % h, "E_ARG"),
    # Response-shaped (`ok` or `result`, no `op`) but not JSON: not UTF-8,
    # a lone surrogate, a number out of range.
    (b'{"id":"w20","ok":"write","params":{"data":"Wl\xdcQ"}}', "E_ARG"),
    ('{"id":"w21","ok":true,"p":"\\ud800"}', "E_ARG"),
    ('{"id":"w22","result":{"n":1e999}}', "E_ARG"),
]
for frame, want in cases:
    r = ask(frame)
    got = "ok" if r.get("ok") else r.get("error", {}).get("code")
    frame_s = frame if isinstance(frame, str) else frame.decode("latin-1")
    print(f"{want:8} {got:8} {frame_s[:70]!r}")
    assert got == want, (frame_s[:200], r)
# A response that is JSON is dropped: the next answer is the close's.
send(b'{"id":"loop","ok":true,"result":{"data":"aGk="}}')
r = ask('{"id":"last","op":"close","params":{"h":%d}}' % h)
assert r["ok"] and r["id"] == "last", r
parent.close()
assert p.wait(timeout=10) == 0
# Read 5 ("hell", "o"), then "hi" and 60000 "z" written from there.
assert open(path, "rb").read() == b"hellohi" + b"z" * 60000
shutil.rmtree(root)
print("all answered as their JSON means; server exited 0")
