"""A CONNECT proxy for tests: prints its port, then one line per CONNECT
("CONNECT host:port"); refuses (403) hosts ending in .invalid, tunnels the
rest. Serves until stdin closes."""
import socket
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(conn):
    header = b""
    while b"\r\n\r\n" not in header:
        chunk = conn.recv(1)
        if not chunk:
            conn.close()
            return
        header += chunk
    first = header.split(b"\r\n")[0].decode()
    method, target, _ = first.split(" ", 2)
    auth = [l for l in header.decode().split("\r\n") if l.lower().startswith("proxy-authorization:")]
    print(f"{method} {target}" + (f" {auth[0].split(':', 1)[1].strip()}" if auth else ""), flush=True)
    host, port = target.rsplit(":", 1)
    if method != "CONNECT" or host.endswith(".invalid"):
        conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        conn.close()
        return
    upstream = socket.create_connection((host, int(port)))
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)


def accept():
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


threading.Thread(target=accept, daemon=True).start()
sys.stdin.read()
