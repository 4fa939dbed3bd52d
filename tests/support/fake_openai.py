"""A tiny OpenAI-compatible provider for tests: answers every
POST .../chat/completions with the last message's content echoed back,
after `delay=MS` when the content holds that word. Prints its port, then
serves until stdin closes."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        content = body["messages"][-1]["content"]
        for word in content.split():
            if word.startswith("delay="):
                time.sleep(int(word[6:]) / 1000)
        reply = {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model", "?"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "echo: " + content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
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
server.shutdown()
