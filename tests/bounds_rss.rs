//! Bounds measured on the real binary, not on the model: airlock's peak
//! resident memory (`VmHWM` in /proc/<airlock>/status) while a child wraps
//! and searches content near `max_total_bytes`, and its open descriptors
//! (/proc/<airlock>/fd) while a child floods it with attaches, handles and
//! fds, against `--max-descriptors`.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// What airlock may hold at its peak beyond what it held when the child
/// started: the fds' content and indexes (`max_total_bytes`) three times,
/// because a wrap's content and index are each one contiguous buffer that
/// grows by copying, and the allocator keeps the blocks it frees resident
/// for a while (doubling: the blocks freed on the way sum to about the
/// final size, and old and new are both held while one copies); and a constant
/// for frames in flight, the pager's render buffers and the allocator's
/// own keeping.
const PEAK_OVER_LIMIT: u64 = 3;
const PEAK_SLACK: u64 = 24 * MIB;

/// An ignore-case search may add no more than this to what airlock held
/// before it: its fold is made a bounded chunk at a time.
const SEARCH_SLACK: u64 = 8 * MIB;

fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} for {pid}: {status}"))
}

/// A running `airlock run ARGS -- CMD`, its stdout read line by line.
struct Live {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Live {
    fn start(dir: &Path, args: &[&str], cmd: &[String]) -> Live {
        let mut child = Command::new(airlock())
            .current_dir(dir)
            .arg("run")
            .arg("--sandbox-ro")
            .arg(support(""))
            .args(args)
            .arg("--")
            .args(cmd)
            .env_remove("AIRLOCK_FD")
            .env("PYTHONPATH", support(""))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("airlock runs");
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Live { child, lines }
    }

    /// Lines up to and including one that starts with `marker`.
    fn until(&mut self, marker: &str) -> String {
        let mut all = String::new();
        loop {
            let mut l = String::new();
            self.lines.read_line(&mut l).expect("a line");
            assert!(!l.is_empty(), "the child ended before {marker:?}: {all}");
            all.push_str(&l);
            if l.starts_with(marker) {
                return all;
            }
        }
    }

    fn finish(mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(Instant::now() < deadline, "airlock did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `script` (sh) running in a session under `max_total_bytes = limit`,
/// once it has started, and airlock's resident bytes then.
fn started(limit: u64, script: &str) -> (tempfile::TempDir, Live, u64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("airlock.toml");
    std::fs::write(&cfg, format!("[file_descriptor]\nmax_total_bytes = {limit}\n")).unwrap();
    let cfg = cfg.display().to_string();
    let cmd = sh(&format!("echo started; {script}"));
    let mut live = Live::start(dir.path(), &["--config", &cfg, "--allow-rw", "."], &cmd);
    live.until("started");
    let start = status_kib(live.child.id(), "VmRSS") * 1024;
    (dir, live, start)
}

/// Run `script` (sh) under `max_total_bytes = limit`; returns airlock's
/// peak resident bytes over what it held when the child started, and the
/// child's output. The script ends each step with `echo rc=$?`; it is
/// measured once the line `done` comes, while the child still sleeps.
fn peak_over_start(limit: u64, script: &str) -> (u64, String) {
    let (_dir, mut live, start) = started(limit, &format!("{script}; echo done; sleep 1"));
    let pid = live.child.id();
    let out = live.until("done");
    let peak = status_kib(pid, "VmHWM") * 1024;
    assert_eq!(live.finish(), Some(0), "{out}");
    (peak.saturating_sub(start), out)
}

fn assert_within(limit: u64, over: u64, what: &str, out: &str) {
    let bound = PEAK_OVER_LIMIT * limit + PEAK_SLACK;
    eprintln!(
        "{what}: peak {} MiB over start, limit {} MiB, bound {} MiB",
        over / MIB,
        limit / MIB,
        bound / MIB
    );
    assert!(
        over <= bound,
        "{what}: airlock's peak grew by {} MiB under max_total_bytes = {} MiB (bound {} MiB)\n{out}",
        over / MIB,
        limit / MIB,
        bound / MIB
    );
}

/// `N` bytes of `unit` (a shell word) with no newline between them.
fn stream_of(unit: &str, n: u64) -> String {
    format!("yes '{unit}' | tr -d '\\n' | head -c {n}")
}

#[test]
fn one_long_line_just_under_the_limit_keeps_the_peak_bounded() {
    let limit = 32 * MIB;
    let n = limit - MIB;
    let (over, out) = peak_over_start(
        limit,
        &format!("{} | \"$AIRLOCK\" fd wrap > /dev/null; echo rc=$?", stream_of("x", n)),
    );
    assert!(out.contains("rc=0"), "stored: {out}");
    assert_within(limit, over, "a long line", &out);
}

#[test]
fn many_short_lines_past_the_limit_are_refused_within_the_bound() {
    // One byte a line and a 4-byte index entry each: the index passes the
    // limit long before the bytes do, and is refused before it is grown.
    let limit = 32 * MIB;
    let script = format!(
        "head -c {} /dev/zero | tr '\\0' '\\n' | \"$AIRLOCK\" fd wrap | head -c 300; echo; echo rc=$?",
        limit
    );
    let (over, out) = peak_over_start(limit, &script);
    assert!(out.contains("max_total_bytes"), "refused naming the limit: {out}");
    assert_within(limit, over, "one-byte lines", &out);
}

#[test]
fn wrapping_just_under_a_hundred_mib_keeps_the_peak_bounded() {
    let limit = 100 * MIB;
    // Lines of 64 bytes: 1/16 of the content again in index entries;
    // content and index together take 15/16 of the limit.
    let n = limit / 17 * 15;
    let script = format!(
        "yes 'abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk' | head -c {n} | \"$AIRLOCK\" fd wrap > /dev/null; echo rc=$?"
    );
    let (over, out) = peak_over_start(limit, &script);
    assert!(out.contains("rc=0"), "stored: {out}");
    assert_within(limit, over, "64-byte lines", &out);
}

#[test]
fn an_ignore_case_search_whose_fold_grows_the_text_adds_a_bounded_buffer() {
    // `Ⱥ` is 2 bytes and folds to the 3-byte `ⱥ`: folding the whole line
    // at once would take 1.5 times the content again.
    let limit = 32 * MIB;
    let wrap = format!("{} | \"$AIRLOCK\" fd wrap > /dev/null; echo rc=$?", stream_of("Ⱥ", limit - 2 * MIB));
    let search = "\"$AIRLOCK\" fd search fd:1 'ⱥB' --ignore-case; echo rc=$?";
    let (whole, by_search, out) = peak_of_a_step(limit, &wrap, search);
    assert!(out.contains("rc=0"), "stored: {out}");
    assert!(out.contains("matches=\"0\""), "searched: {out}");
    assert_within(limit, whole, "an ignore-case search", &out);
    eprintln!("the search itself: {} KiB past what airlock held after the wrap", by_search / 1024);
    assert!(
        by_search <= SEARCH_SLACK,
        "the search took airlock {} KiB past what it held after the wrap\n{out}",
        by_search / 1024
    );
}

/// Run `first`, then `step`, as [`peak_over_start`] does; returns the
/// whole run's peak over the start, and `step`'s own: its peak over what
/// airlock held once `first` was done. Between the two the peak is reset
/// (`5` to /proc/<airlock>/clear_refs), so the wrap's peak, which varies
/// from run to run with how the pipe's chunks arrive, is not compared
/// with another run's.
fn peak_of_a_step(limit: u64, first: &str, step: &str) -> (u64, u64, String) {
    let (_dir, mut live, start) =
        started(limit, &format!("{first}; echo between; sleep 2; {step}; echo done; sleep 1"));
    let pid = live.child.id();
    let mut out = live.until("between");
    let first_peak = status_kib(pid, "VmHWM") * 1024;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("the peak resets");
    let before = status_kib(pid, "VmRSS") * 1024;
    out.push_str(&live.until("done"));
    let step_peak = status_kib(pid, "VmHWM") * 1024;
    assert_eq!(live.finish(), Some(0), "{out}");
    (first_peak.max(step_peak).saturating_sub(start), step_peak.saturating_sub(before), out)
}

/// A flood of attached connections, open host files and stored fds,
/// held at once: airlock's descriptors stay within `--max-descriptors` of
/// what it used at start, the refusals name the bound, and a file can
/// still be opened after the connections are dropped.
#[test]
fn a_descriptor_flood_stays_within_max_descriptors() {
    let max = 96u64;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("host")).unwrap();
    for i in 0..200 {
        std::fs::write(dir.path().join(format!("host/f{i}")), "x").unwrap();
    }
    let script = r#"
import os, socket, struct, json, subprocess, time
out("started")
# Stored fds first: `airlock fd` attaches a connection of its own, which
# the flood below leaves no room for.
wraps = 0
for i in range(50):
    p = subprocess.run([os.environ["AIRLOCK"], "fd", "wrap"], input=b"y\n" * 9000, capture_output=True, pass_fds=(3,))
    wraps += p.returncode == 0
shared = socket.socket(fileno=os.dup(3))
kept, refused = [], {}
def note(r):
    m = r["error"]["message"]
    k = "--max-descriptors" if "--max-descriptors" in m else "--max-clients" if "--max-clients" in m else m
    refused[k] = refused.get(k, 0) + 1
for i in range(150):
    ours, theirs = socket.socketpair()
    req = json.dumps({"id": "a%d" % i, "op": "attach"}).encode()
    socket.send_fds(shared, [struct.pack(">I", len(req)) + req], [theirs.fileno()])
    theirs.close()
    try:
        assert recv(ours.fileno())["ok"]
        kept.append(ours)
    except EOFError:
        note(recv(3))
        ours.close()
handles = []
for i in range(200):
    r = call("open", path="host/f%d" % i, mode="r")
    if r["ok"]:
        handles.append(r["result"]["handle"])
    else:
        note(r)
# Every stored fd still answers on the session's own connection.
def fd_read(n):
    send({"id": "r", "op": "FD_READ", "params": {"fd": "fd:%d" % n}})
    return recv()["ok"]
reads = sum(fd_read(i + 1) for i in range(wraps))
out({"reads": reads, "attached": len(kept), "handles": len(handles), "wraps": wraps, "refused": refused})
out("flooded")
time.sleep(1)
for h in handles:
    call("close", h=h)
for s in kept:
    s.close()
time.sleep(0.5)
r = call("open", path="host/f0", mode="r")
out({"after": r["ok"]})
"#;
    let max_s = max.to_string();
    std::fs::write(dir.path().join("airlock.toml"), "[file_descriptor]\n").unwrap();
    let mut live = Live::start(
        dir.path(),
        &[
            "--config",
            "airlock.toml",
            "--allow-rw",
            "host",
            "--max-descriptors",
            &max_s,
            "--max-clients",
            "1000",
        ],
        &python(script),
    );
    live.until("\"started\"");
    let pid = live.child.id();
    let at_start = descriptors(pid);
    let out = live.until("\"flooded\"");
    let held = descriptors(pid);
    assert!(
        held <= at_start + max,
        "airlock holds {held} descriptors, {at_start} at start, --max-descriptors {max}\n{out}"
    );
    let counts: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(counts["refused"]["--max-descriptors"].as_u64().unwrap_or(0) > 0, "the bound was reached: {out}");
    assert!(counts["attached"].as_u64().unwrap() > 0, "{out}");
    assert!(counts["handles"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(counts["wraps"], 50, "{out}");
    assert_eq!(counts["reads"], 50, "stored fds take no descriptor: {out}");
    let after = live.until("{\"after\"");
    assert!(after.contains("true"), "{after}");
    assert_eq!(live.finish(), Some(0));
}

/// One line of `[{"a":0},…]` just under `--max-line` costs about a
/// hundred times its size once parsed (over a gigabyte for 15 MiB, as
/// measured with the limit lifted). `airlock tool` counts a line's JSON
/// values before it parses it and refuses one past `--max-line-values`:
/// the tool is told so, and airlock's peak stays near the line's own
/// bytes.
#[test]
fn a_tool_line_dear_once_parsed_is_refused_within_a_bounded_peak() {
    let dir = tempfile::tempdir().unwrap();
    let max_line: u64 = 16 * MIB;
    let child = Command::new(airlock())
        .current_dir(dir.path())
        .args(["tool", "--allow-rw", ".", "--sandbox-ro"])
        .arg(support(""))
        .args(["--max-line", &max_line.to_string(), "--", "python3"])
        .arg(support("values_attack.py"))
        .arg("1900000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlock tool starts");
    let pid = child.id();
    // The tool writes `ready` once it has airlock's answer to the line.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !dir.path().join("ready").exists() {
        assert!(Instant::now() < deadline, "the tool never had its answer");
        std::thread::sleep(Duration::from_millis(100));
    }
    let peak = status_kib(pid, "VmHWM") * 1024;
    std::fs::write(dir.path().join("go"), "1").expect("go");
    let out = child.wait_with_output().expect("airlock tool ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    let bound = 4 * max_line + PEAK_SLACK;
    assert!(peak <= bound, "airlock tool peaked at {} MiB, over {} MiB", peak / MIB, bound / MIB);
    assert!(stdout.contains("--max-line-values") && stdout.contains("-32600"), "{stdout}");
}

/// A request frame of `[{"a":0},…]` just under `--max-frame` took
/// airlock from 25 to 110 MiB for as long as it parsed it. Counted first,
/// one past `--max-frame-values` is refused `E_RANGE` naming the flag.
#[test]
fn a_frame_dear_once_parsed_is_refused_within_a_bounded_peak() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import time
from fsclient import send_raw, recv
print("started", flush=True)
time.sleep(0.5)
junk = "[" + '{"a":0},' * 130000 + "0]"
for i in range(3):
    send_raw(('{"id":"x%d","op":"stat","params":{"path":"x","junk":%s}}' % (i, junk)).encode())
    r = recv()
print(r, flush=True)
print("done", flush=True)
time.sleep(1)
"#;
    let mut live = Live::start(dir.path(), &[], &python(script));
    live.until("started");
    let pid = live.child.id();
    let start = status_kib(pid, "VmRSS") * 1024;
    let out = live.until("done");
    let over = (status_kib(pid, "VmHWM") * 1024).saturating_sub(start);
    assert_eq!(live.finish(), Some(0), "{out}");
    let bound = 16 * MIB;
    assert!(over <= bound, "airlock peaked {} MiB over its start, past {} MiB", over / MIB, bound / MIB);
    assert!(out.contains("E_RANGE") && out.contains("--max-frame-values"), "{out}");
}
