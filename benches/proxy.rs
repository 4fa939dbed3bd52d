//! The FS proxy's hot path end to end: 4 KiB reads served by the real
//! `airlock serve` over a socketpair to a pipelined client, beside the same
//! bytes moved through the same kind of socketpair in 4 KiB writes with no
//! framing at all. Reports MB/s and CPU per 4 KiB frame: the proxy
//! process's (summed over its threads, from `/proc/PID/task/*/schedstat`,
//! start-up excluded), and the baseline writer thread's own.
//!
//!   cargo bench --bench proxy         (PROXY_BENCH_MIB, default 64; best of
//!                                      PROXY_BENCH_RUNS, default 3)
//!
//! With `PROXY_BENCH_CLIENTS=1,8,64` it measures instead how airlock's
//! CPU per frame grows with concurrent clients: for each count, that many
//! connections (one plus attached ones) each read an equal share of the
//! same total at once. `PROXY_BENCH_CSV=FILE` also writes that series as
//! CSV (`benches/scale.sh` does). `PROXY_BENCH_BIN=PATH` measures another
//! airlock binary (an older build, say) with the same client and baseline.
//!
//! The client reads its answers 64 KiB at a time, as `airlock fs cat`
//! does, and checks every byte it gets against the file.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rustix::io::{fcntl_setfd, FdFlags};
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use serde::Deserialize;
use std::fs;
use std::io::{BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::Instant;

const FRAME: usize = 4096;
/// Reads in flight, as `airlock fs cat` keeps them (`client::WINDOW`).
const WINDOW: usize = 32;
const RUNS: usize = 3;

/// CPU time in ns of every thread of `pid` so far.
fn process_cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task")).expect("proc task dir").flatten() {
        if let Ok(s) = fs::read_to_string(task.path().join("schedstat")) {
            total += s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    total
}

fn thread_cpu_ns() -> u64 {
    let s = fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    s.split_whitespace().next().and_then(|n| n.parse().ok()).expect("schedstat field")
}

struct Run {
    frames: u64,
    bytes: u64,
    wall_s: f64,
    cpu_ns: u64,
}

impl Run {
    fn mb_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.wall_s
    }
    fn cpu_us_per_frame(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.frames as f64
    }
}

fn pair() -> (UnixStream, OwnedFd) {
    // Both ends inheritable at first; ours is then closed on exec, so the
    // child holds only its own end and sees EOF when we close ours.
    let (ours, theirs) =
        socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::empty(), None).expect("socketpair");
    fcntl_setfd(&ours, FdFlags::CLOEXEC).expect("cloexec");
    (UnixStream::from(ours), theirs)
}

fn send(sock: &mut UnixStream, payload: &[u8]) {
    let mut framed = Vec::with_capacity(4 + payload.len());
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    sock.write_all(&framed).expect("send frame");
}

fn recv(sock: &mut impl Read, buf: &mut Vec<u8>) {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).expect("frame header");
    buf.resize(u32::from_be_bytes(len) as usize, 0);
    sock.read_exact(buf).expect("frame payload");
}

#[derive(Deserialize)]
struct Reply {
    ok: bool,
    result: Option<ReadResult>,
}

#[derive(Deserialize)]
struct ReadResult {
    #[serde(default)]
    handle: Option<u64>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    eof: bool,
}

/// One client's pipelined read of the first `share` bytes of the file
/// (already open as handle `h` on `sock`), every byte checked. Returns the
/// frames answered.
fn read_share(sock: &mut UnixStream, h: u64, expected: &[u8], share: usize) -> u64 {
    // Answers read 64 KiB at a time, as `airlock fs cat` reads them (and as
    // the baseline's reader reads its bytes), not a system call or two each.
    let mut answers = BufReader::with_capacity(64 << 10, sock.try_clone().expect("clone socket"));
    let mut buf = Vec::new();
    // The `max` of each read in flight, oldest first (answers come in order).
    let mut asked_for = std::collections::VecDeque::with_capacity(WINDOW);
    let (mut sent, mut answered, mut asked, mut off) = (0u64, 0u64, 0usize, 0usize);
    loop {
        while asked_for.len() < WINDOW && asked < share {
            let max = FRAME.min(share - asked);
            let read = format!(r#"{{"id":"r{sent}","op":"read","params":{{"h":{h},"max":{max}}}}}"#);
            send(sock, read.as_bytes());
            sent += 1;
            asked += max;
            asked_for.push_back(max);
        }
        let Some(max) = asked_for.pop_front() else { break };
        recv(&mut answers, &mut buf);
        answered += 1;
        let reply: Reply = serde_json::from_slice(&buf).expect("read reply");
        assert!(reply.ok, "read failed: {}", String::from_utf8_lossy(&buf));
        let r = reply.result.expect("read result");
        let data = STANDARD.decode(r.data.unwrap_or_default()).expect("base64");
        assert!(data.len() <= max, "read answered {} bytes for max {max}", data.len());
        assert_eq!(&expected[off..off + data.len()], &data[..], "bytes at {off} differ");
        off += data.len();
        if r.eof || data.is_empty() {
            // Nothing more to ask for; the answers in flight are drained.
            asked = share;
        } else {
            // A short read leaves the rest of its bytes to be asked again.
            asked -= max - data.len();
        }
    }
    assert_eq!(off, share, "the proxied bytes are the client's whole share");
    answered
}

fn open_data(sock: &mut UnixStream, dir: &Path) -> u64 {
    let mut buf = Vec::new();
    let open = format!(r#"{{"id":"o","op":"open","params":{{"path":{:?},"mode":"r"}}}}"#, dir.join("data"));
    send(sock, open.as_bytes());
    recv(sock, &mut buf);
    let reply: Reply = serde_json::from_slice(&buf).expect("open reply");
    reply.result.and_then(|r| r.handle).expect("a handle")
}

/// `clients` connections to one `airlock serve`, each reading an equal
/// share of the file at once: the first over the socket airlock was
/// started with, the others attached through it (`attach`, as `airlock fs`
/// does), so the total frames are the same whatever the count and the CPU
/// per frame shows what concurrency itself costs.
fn proxied(dir: &Path, expected: &[u8], clients: usize) -> Run {
    let (sock, theirs) = pair();
    let airlock = std::env::var_os("PROXY_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_airlock").into());
    let mut child = Command::new(airlock)
        .args(["serve", "--fd", &theirs.as_raw_fd().to_string(), "--allow"])
        .arg(dir)
        .stdin(Stdio::null())
        .spawn()
        .expect("airlock serve");
    drop(theirs);
    let pid = child.id();
    let mut conns = Vec::with_capacity(clients);
    for _ in 1..clients {
        let attached = airlock::client::Client::attach_via(sock.as_fd()).expect("attach");
        conns.push(UnixStream::from(OwnedFd::from(attached.into_file())));
    }
    let share = expected.len() / clients;
    // Every client set up (connected, file open) before the clock starts,
    // then all released at once.
    let ready = Barrier::new(clients + 1);
    let go = Barrier::new(clients + 1);
    let (frames, wall_s, cpu_ns) = std::thread::scope(|scope| {
        let (ready, go) = (&ready, &go);
        let mut threads = Vec::with_capacity(clients);
        for mut conn in conns.drain(..).chain(std::iter::once(sock.try_clone().expect("clone socket"))) {
            threads.push(scope.spawn(move || {
                let h = open_data(&mut conn, dir);
                ready.wait();
                go.wait();
                read_share(&mut conn, h, expected, share)
            }));
        }
        ready.wait();
        let cpu0 = process_cpu_ns(pid);
        let t0 = Instant::now();
        go.wait();
        let frames: u64 = threads.into_iter().map(|t| t.join().expect("client thread")).sum();
        (frames, t0.elapsed().as_secs_f64(), process_cpu_ns(pid) - cpu0)
    });
    // Our last copy of the first socket: its EOF ends airlock and every
    // connection attached through it.
    drop(sock);
    let status = child.wait().expect("wait");
    assert!(status.success(), "airlock serve exited {status}");
    Run { frames, bytes: (share * clients) as u64, wall_s, cpu_ns }
}

/// The same bytes through the same kind of socketpair, in 4 KiB writes of
/// file reads, no framing: a writer thread and the reading main thread.
fn raw(file: &Path, len: usize) -> Run {
    let (mut rx, theirs) = pair();
    let mut tx = UnixStream::from(theirs);
    let path = file.to_path_buf();
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let cpu0 = thread_cpu_ns();
        let mut f = fs::File::open(path).expect("open");
        let mut chunk = [0u8; FRAME];
        let mut frames = 0u64;
        loop {
            let n = f.read(&mut chunk).expect("read");
            if n == 0 {
                break;
            }
            tx.write_all(&chunk[..n]).expect("write");
            frames += 1;
        }
        (frames, thread_cpu_ns() - cpu0)
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = rx.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        got += n;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let (frames, cpu_ns) = writer.join().expect("writer");
    assert_eq!(got, len);
    Run { frames, bytes: got as u64, wall_s, cpu_ns }
}

fn best(runs: impl Iterator<Item = Run>) -> Run {
    runs.min_by(|a, b| a.cpu_ns.cmp(&b.cpu_ns)).expect("at least one run")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // and runs it once, small, as a smoke test.
    let benching = std::env::args().any(|a| a == "--bench");
    let mib: usize = std::env::var("PROXY_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let runs: usize =
        std::env::var("PROXY_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(RUNS).max(1);
    let (mib, runs) = if benching { (mib, runs) } else { (1, 1) };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("data");
    // Incompressible, deterministic bytes.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let content: Vec<u8> = (0..mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(&file, &content).expect("write data");

    if let Some(counts) = client_counts() {
        clients_series(dir.path(), &content, mib, runs, &counts);
        return;
    }
    let p = best((0..runs).map(|_| proxied(dir.path(), &content, 1)));
    let r = best((0..runs).map(|_| raw(&file, content.len())));
    println!("proxy: {mib} MiB in 4 KiB reads, {WINDOW} in flight, best of {runs} by CPU");
    println!("| path | frames | MB/s | CPU per 4 KiB frame |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| `airlock serve`, framed JSON + base64 | {} | {:.0} | {:.2} µs |",
        p.frames,
        p.mb_s(),
        p.cpu_us_per_frame()
    );
    println!(
        "| same socketpair, raw 4 KiB writes | {} | {:.0} | {:.2} µs |",
        r.frames,
        r.mb_s(),
        r.cpu_us_per_frame()
    );
    println!("| ratio (CPU per frame) | | | {:.1}× |", p.cpu_us_per_frame() / r.cpu_us_per_frame());
    if !benching {
        // The smoke test runs the concurrent-clients path too.
        clients_series(dir.path(), &content, mib, runs, &[1, 4]);
    }
}

/// The client counts asked for by `PROXY_BENCH_CLIENTS`, if any.
fn client_counts() -> Option<Vec<usize>> {
    let list = std::env::var("PROXY_BENCH_CLIENTS").ok()?;
    let counts: Vec<usize> = list
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .expect("PROXY_BENCH_CLIENTS: counts above 0, comma-separated")
        })
        .collect();
    Some(counts)
}

fn clients_series(dir: &Path, content: &[u8], mib: usize, runs: usize, counts: &[usize]) {
    let mut csv = String::from("clients,frames,bytes,wall_s,cpu_ns,cpu_us_per_frame,mb_s\n");
    println!(
        "proxy: {mib} MiB in 4 KiB reads shared by N clients, {WINDOW} in flight each, best of {runs} by CPU"
    );
    println!("| clients | frames | MB/s | airlock CPU per 4 KiB frame |");
    println!("| --- | --- | --- | --- |");
    for &n in counts {
        let p = best((0..runs).map(|_| proxied(dir, content, n)));
        println!("| {n} | {} | {:.0} | {:.2} µs |", p.frames, p.mb_s(), p.cpu_us_per_frame());
        csv.push_str(&format!(
            "{n},{},{},{:.6},{},{:.3},{:.1}\n",
            p.frames,
            p.bytes,
            p.wall_s,
            p.cpu_ns,
            p.cpu_us_per_frame(),
            p.mb_s()
        ));
    }
    if let Ok(path) = std::env::var("PROXY_BENCH_CSV") {
        fs::write(&path, csv).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}
