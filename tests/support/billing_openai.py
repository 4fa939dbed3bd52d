"""An OpenAI-compatible provider that bills what it generates, as real
ones do: a request is billed its prompt (one token per byte of its
messages as compact JSON: airlock's own bound, the most an honest
provider may count) and every completion token generated until the reply
is sent or the client hangs up, at `RATE` tokens per ms up to
`max_tokens`. A request whose last message holds `slow` generates for
`SLOW_MS` before answering; others answer at once with all of
`max_tokens`. Prints its port, serves until stdin closes, then prints
the ledger as one JSON line: `{"requests", "billed_prompt",
"billed_completion", "dropped"}`."""
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RATE = 1
SLOW_MS = 5000
ledger = {"requests": 0, "billed_prompt": 0, "billed_completion": 0, "dropped": 0}
lock = threading.Lock()


def bill(prompt, completion, dropped):
    with lock:
        ledger["requests"] += 1
        ledger["billed_prompt"] += prompt
        ledger["billed_completion"] += completion
        ledger["dropped"] += int(dropped)


def hung_up(conn):
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        prompt = len(json.dumps(body["messages"], separators=(",", ":")))
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 4096
        content = body["messages"][-1].get("content")
        slow = isinstance(content, str) and "slow" in content
        start = time.monotonic()
        if slow:
            while (time.monotonic() - start) * 1000 < SLOW_MS:
                select.select([self.connection], [], [], 0.005)
                if hung_up(self.connection):
                    generated = min(max_tokens, int((time.monotonic() - start) * 1000 * RATE))
                    bill(prompt, generated, True)
                    return
        generated = max_tokens
        bill(prompt, generated, False)
        reply = {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model", "?"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
sys.stdin.read()
# Let handlers of requests just dropped finish their bills.
time.sleep(0.3)
with lock:
    print(json.dumps(ledger), flush=True)
server.shutdown()
