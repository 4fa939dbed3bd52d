//! Pipelined reads through the real binary: the reads a client queues on
//! one handle are served by fewer host reads (`--max-read-batch`), and
//! every byte a pipelining client gets is the file's, in order, exactly as
//! with one host read per request.

mod common;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::*;
use rustix::io::{fcntl_setfd, FdFlags};
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
use serde_json::Value;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};

/// Reads a client keeps in flight (as `airlock fs cat` does).
const WINDOW: usize = 32;
/// The `max` of successive reads: mostly 4 KiB, some odd sizes between.
const MAXES: [u32; 6] = [4096, 4096, 1000, 4096, 7, 4096];

fn content(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn send(sock: &mut UnixStream, payload: &[u8]) {
    let mut framed = (payload.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(payload);
    sock.write_all(&framed).expect("send a frame");
}

fn recv(sock: &mut UnixStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).expect("a frame header");
    let mut buf = vec![0; u32::from_be_bytes(len) as usize];
    sock.read_exact(&mut buf).expect("a frame payload");
    buf
}

/// Read the whole file through `sock` with `WINDOW` reads in flight,
/// checking every answer against `expected`; returns the answers' frames.
fn read_all(sock: &mut UnixStream, dir: &Path, expected: &[u8]) -> Vec<Vec<u8>> {
    let open = format!(r#"{{"id":"o","op":"open","params":{{"path":{:?},"mode":"r"}}}}"#, dir.join("data"));
    send(sock, open.as_bytes());
    let opened: Value = serde_json::from_slice(&recv(sock)).expect("open answer");
    let h = opened["result"]["handle"].as_u64().unwrap_or_else(|| panic!("open: {opened}"));
    let mut frames = Vec::new();
    let mut in_flight = VecDeque::new();
    let (mut sent, mut off, mut ended) = (0usize, 0usize, false);
    loop {
        while !ended && in_flight.len() < WINDOW {
            let max = MAXES[sent % MAXES.len()];
            let read = format!(r#"{{"id":"r{sent}","op":"read","params":{{"h":{h},"max":{max}}}}}"#);
            send(sock, read.as_bytes());
            in_flight.push_back((sent, max));
            sent += 1;
        }
        let Some((n, max)) = in_flight.pop_front() else { break };
        let frame = recv(sock);
        let answer: Value = serde_json::from_slice(&frame).expect("read answer");
        assert_eq!(answer["id"], format!("r{n}"), "answers in order");
        let data = STANDARD.decode(answer["result"]["data"].as_str().expect("data")).expect("base64");
        let eof = answer["result"]["eof"].as_bool().expect("eof");
        assert!(data.len() <= max as usize, "r{n}: {} bytes for max {max}", data.len());
        assert_eq!(eof, data.is_empty(), "r{n}");
        assert_eq!(&data[..], &expected[off..off + data.len()], "r{n}: bytes at {off}");
        off += data.len();
        if eof {
            assert_eq!(off, expected.len(), "eof only at the end");
            ended = true;
        }
        frames.push(frame);
    }
    assert_eq!(off, expected.len(), "the whole file");
    frames
}

/// `airlock serve --allow DIR ARGS` over a socketpair: the read answers,
/// and the largest `max` of the read effects in its trace.
fn serve(dir: &Path, expected: &[u8], args: &[&str]) -> (Vec<Vec<u8>>, u64) {
    let (ours, theirs) =
        socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::empty(), None).expect("socketpair");
    fcntl_setfd(&ours, FdFlags::CLOEXEC).expect("cloexec");
    let trace = dir.join(format!("trace{}.jsonl", args.join("")));
    let mut child = Command::new(airlock())
        .args(["serve", "--fd", &theirs.as_raw_fd().to_string(), "--allow"])
        .arg(dir)
        .arg("--record")
        .arg(&trace)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .expect("airlock serve");
    drop(theirs);
    let mut sock = UnixStream::from(ours);
    let frames = read_all(&mut sock, dir, expected);
    drop(sock);
    assert!(child.wait().expect("airlock exits").success());
    let trace = std::fs::read_to_string(&trace).expect("trace");
    let largest = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.pointer("/output/effect/effect") == Some(&Value::from("read")))
        .filter_map(|v| v.pointer("/output/effect/max").and_then(Value::as_u64))
        .max()
        .unwrap_or(0);
    (frames, largest)
}

#[test]
fn pipelined_reads_through_serve_get_every_byte_with_fewer_host_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let expected = content((1 << 20) + 1234);
    std::fs::write(dir.path().join("data"), &expected).expect("write data");
    let (batched, largest) = serve(dir.path(), &expected, &[]);
    assert!(largest > 4096, "reads were batched: largest host read {largest}");
    assert!(largest <= 64 << 10, "within --max-read-batch: {largest}");
    let (one_by_one, largest) = serve(dir.path(), &expected, &["--max-read-batch", "0"]);
    assert!(largest <= 4096, "--max-read-batch 0: one host read per read, largest {largest}");
    assert!(batched == one_by_one, "the same answers, byte for byte");
    let (small, largest) = serve(dir.path(), &expected, &["--max-read-batch", "10000"]);
    assert!(largest <= 10000, "capped: {largest}");
    assert!(small == one_by_one, "the same answers, byte for byte");
}

#[test]
fn pipelined_reads_through_run_get_every_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let expected = content((1 << 20) + 777);
    std::fs::write(dir.path().join("data"), &expected).expect("write data");
    let path = dir.path().join("data").display().to_string();
    let script = format!(
        r#"
import hashlib
from collections import deque
h = call("open", path={path:?}, mode="r")["result"]["handle"]
maxes = [4096, 4096, 1000, 4096, 7, 4096]
flight, sent, total, ended, answers = deque(), 0, 0, False, 0
digest = hashlib.sha256()
while True:
    while not ended and len(flight) < 32:
        m = maxes[sent % len(maxes)]
        send({{"id": "r%d" % sent, "op": "read", "params": {{"h": h, "max": m}}}})
        flight.append(("r%d" % sent, m))
        sent += 1
    if not flight:
        break
    rid, m = flight.popleft()
    r = recv()
    assert r["id"] == rid and r["ok"], (r, rid)
    data = base64.b64decode(r["result"]["data"])
    assert len(data) <= m and r["result"]["eof"] == (len(data) == 0), (rid, len(data), r["result"]["eof"])
    digest.update(data)
    total += len(data)
    answers += 1
    ended = ended or r["result"]["eof"]
out([total, digest.hexdigest(), answers == sent])
"#
    );
    let run = run_in(dir.path(), &["--allow", &path], &python(&script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let digest = Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(&path)
        .output()
        .expect("python3");
    let want = String::from_utf8_lossy(&digest.stdout).trim().to_owned();
    assert_eq!(want.len(), 64, "a sha256: {want:?}");
    assert_eq!(run.lines(), vec![serde_json::json!([expected.len(), want, true])]);
    run.assert_no_leaks();
}
