//! The egress tunnel (issue 42) against a direct connection, in the same
//! run. A server in this process, on the host's 127.0.0.1, answers a line
//! `N` with N bytes. The same client (a Python driver) runs twice: on the
//! host, connecting directly, and as the child of one `airlock run
//! --allow-host 127.0.0.1:PORT`, connecting through the HTTP proxy in its
//! network namespace with `CONNECT`. Each driver times its own work with
//! `time.perf_counter` and answers the bench over its stdout, so
//! airlock's start-up is outside every figure (`iter_custom`).
//!
//! - `bulk`: one connection that fetches 100 MiB (1 MiB when the bench
//!   runs as a test), read through a 256 KiB buffer;
//! - `first_byte`: a new connection (through the tunnel: the proxy's
//!   connect and its `200` answer first) until the first byte of the
//!   answer to a one-byte request.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

/// The driver: `OP N` on each line of its stdin, one JSON answer a line.
/// argv: `proxy` or `direct`, then the server's host and port.
const DRIVER: &str = r#"
import json, os, socket, sys, time
via, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
proxy = None
if via == "proxy":
    ph, pp = os.environ["HTTP_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
    proxy = (ph, int(pp))
buf = bytearray(256 * 1024)
def connect():
    if proxy is None:
        return socket.create_connection((host, port))
    s = socket.create_connection(proxy)
    s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(4096)
        if not got:
            raise RuntimeError("the proxy closed: %r" % head)
        head += got
    if head.split(b" ", 2)[1] != b"200" or not head.endswith(b"\r\n\r\n"):
        raise RuntimeError("the proxy answered %r" % head)
    return s
def fetch(s, size):
    s.sendall(b"%d\n" % size)
    got = 0
    while got < size:
        n = s.recv_into(buf)
        if not n:
            break
        got += n
    return got
def bulk(n):
    size = n
    t = time.perf_counter()
    s = connect()
    got = fetch(s, size)
    secs = time.perf_counter() - t
    s.close()
    if got != size:
        raise RuntimeError("got %d of %d bytes" % (got, size))
    return secs
def first_byte(n):
    total = 0.0
    for _ in range(n):
        t = time.perf_counter()
        s = connect()
        s.sendall(b"1\n")
        if len(s.recv(1)) != 1:
            raise RuntimeError("no first byte")
        total += time.perf_counter() - t
        s.close()
    return total
ops = {"bulk": bulk, "first_byte": first_byte}
print(json.dumps({"ready": via}), flush=True)
for line in sys.stdin:
    op, n = line.split()
    try:
        print(json.dumps({"secs": ops[op](int(n))}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"#;

/// Whether criterion measures (`cargo bench`) rather than runs each
/// routine once as a test.
fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

/// A server on 127.0.0.1 answering a line `N` with N bytes, a thread a
/// connection; it lives as long as the bench process.
fn serve() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a local port");
    let port = l.local_addr().expect("bound").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = BufReader::new(s);
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    return;
                }
                let Ok(mut left) = line.trim().parse::<usize>() else { return };
                let mut s = r.into_inner();
                let chunk = vec![0x5au8; 1 << 20];
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    left -= n;
                }
                // Until the client closes, so the close is its.
                let _ = s.read(&mut [0u8; 1]);
            });
        }
    });
    port
}

#[path = "support/driver.rs"]
mod driver;
use driver::Driver;

fn ready(cmd: Command) -> Driver {
    let (d, ready) = Driver::start(cmd);
    assert!(ready.get("ready").is_some(), "{ready}");
    d
}

/// The bench's two drivers: the host's own, and `airlock run`'s child.
mod side {
    use super::*;

    pub fn direct(port: u16) -> Driver {
        let mut cmd = Command::new("/usr/bin/python3");
        cmd.args(["-c", DRIVER, "direct", "127.0.0.1", &port.to_string()]);
        for v in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
            cmd.env_remove(v);
        }
        ready(cmd)
    }

    pub fn tunnel(port: u16) -> Driver {
        let dir = std::env::temp_dir();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
        cmd.current_dir(dir)
            .arg("run")
            .args(["--allow-host", &format!("127.0.0.1:{port}")])
            // The bench moves more than the session's default budget.
            .args(["--max-egress-bytes", &(1u64 << 50).to_string()])
            // The session's default CPU bound (every CPU but one: one of
            // this machine's two) is not the tunnel's cost; the direct
            // client has none.
            .args(["--max-cpu", "200"])
            .args(["--", "/usr/bin/python3", "-c", DRIVER, "proxy", "127.0.0.1", &port.to_string()]);
        ready(cmd)
    }

    pub fn time(d: &mut Driver, op: &str, n: u64) -> Duration {
        let a = d.ask(&format!("{op} {n}"));
        Duration::from_secs_f64(a["secs"].as_f64().unwrap_or_else(|| panic!("{op}: {a}")))
    }
}

fn egress(c: &mut Criterion) {
    let size: u64 = if measuring() { 100 << 20 } else { 1 << 20 };
    let port = serve();
    let mut drivers = [("direct", side::direct(port)), ("tunnel", side::tunnel(port))];
    let mut g = c.benchmark_group(format!("egress_bulk_{}MiB", size >> 20));
    g.sample_size(10);
    g.throughput(Throughput::Bytes(size));
    for (name, d) in drivers.iter_mut() {
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| side::time(d, "bulk", size)).sum::<Duration>())
        });
    }
    g.finish();
    let mut g = c.benchmark_group("egress_first_byte");
    g.sample_size(20);
    for (name, d) in drivers.iter_mut() {
        g.bench_function(*name, |b| b.iter_custom(|iters| side::time(d, "first_byte", iters)));
    }
    g.finish();
}

criterion_group!(benches, egress);
criterion_main!(benches);
