//! The host's heap allowance against what it really holds, counted by the
//! counting allocator (the crate's unit tests install it).

use super::machine::{HEAP_PER_LINE_BYTE, HEAP_SLACK};
use super::tests::policy_cfg;
use super::*;
use crate::fsproxy::PlantedBug;
use crate::heapcount::{live, retag, Tag};
use crate::time::Instant;
use serde_json::{json, Value};

/// Each test thread has its own counters; one tag is the host's.
const HOST: Tag = Tag::new(1);

fn held(base: u64) -> u64 {
    live(HOST).expect("the counting allocator is installed") - base
}

/// Lines shaped to make their parsed form as large as possible for their
/// bytes.
fn hostile_lines(n: usize) -> Vec<(&'static str, Vec<u8>)> {
    let arr = |item: &str| {
        let mut s = String::from("[");
        while s.len() + item.len() + 1 < n {
            s.push_str(item);
            s.push(',');
        }
        s.push_str(item);
        s.push(']');
        s.into_bytes()
    };
    vec![
        ("one-entry objects", arr(r#"{"":0}"#)),
        ("empty arrays", arr("[]")),
        ("empty strings", arr(r#""""#)),
        ("numbers", arr("0")),
        ("one-byte strings", arr(r#""a""#)),
        ("nested one-entry arrays", arr("[0]")),
        ("objects of one-entry objects", arr(r#"{"":{"":0}}"#)),
        ("three deep", arr(r#"{"":{"":{"":0}}}"#)),
    ]
}

#[test]
fn a_parsed_line_takes_at_most_heap_per_line_byte_times_its_bytes() {
    for (name, line) in hostile_lines(64 * 1024) {
        let base = live(HOST).unwrap();
        let v: Value = HOST.scope(|| serde_json::from_slice(&line).unwrap());
        let per_byte = held(base) as f64 / line.len() as f64;
        assert!(
            per_byte <= HEAP_PER_LINE_BYTE as f64,
            "{name}: {per_byte:.1} bytes a byte of text, over {HEAP_PER_LINE_BYTE}"
        );
        drop(v);
    }
}

/// A host built and driven under its own tag, its outputs dropped as a
/// shell would once written (charged back to the host until then).
struct Driven {
    host: Host,
    base: u64,
    /// The most it held after any input.
    peak: u64,
}

impl Driven {
    fn new(cfg: Config) -> Self {
        let base = live(HOST).unwrap();
        let policy = ToolPolicy::new(&policy_cfg()).unwrap();
        let host = HOST.scope(|| Host::new(Instant::ZERO, cfg, policy));
        let mut d = Driven { host, base, peak: 0 };
        d.drain();
        d
    }

    fn drain(&mut self) {
        while let Some(out) = HOST.scope(|| self.host.poll_output()) {
            if let Output::ToolStdin(b) = &out {
                retag(b, Tag::HARNESS);
            }
        }
    }

    fn held(&self) -> u64 {
        held(self.base)
    }

    fn handle(&mut self, input: Input) -> Result<(), String> {
        HOST.scope(|| self.host.handle(Instant::ZERO, input));
        self.drain();
        self.peak = self.peak.max(self.held());
        self.host.heap_check(self.held())
    }

    /// `text` as the tool's stdout, as fast as the host reads it.
    fn write(&mut self, text: &[u8]) -> Result<(), String> {
        let mut rest = text;
        while !rest.is_empty() {
            let n = self.host.stdout_budget().min(rest.len());
            if n == 0 {
                break;
            }
            self.handle(Input::ToolStdout(rest[..n].to_vec()))?;
            rest = &rest[n..];
        }
        Ok(())
    }
}

fn line(v: Value) -> Vec<u8> {
    let mut l = serde_json::to_vec(&v).unwrap();
    l.push(b'\n');
    l
}

/// A tool that keeps every kind of parsed line the host keeps as large as
/// its limits allow: states of one-entry objects (kept for the outcome),
/// requests queued behind one in service, with path lists as long as a
/// line holds. After every input the host holds no more than its
/// allowance, and it does hold most of it.
#[test]
fn a_host_full_of_hostile_lines_stays_within_its_allowance() {
    let mut cfg = Config::new("t");
    cfg.max_line = 64 * 1024;
    cfg.max_pending = 8;
    cfg.applies = (0..4).map(|i| format!("a{i}")).collect();
    let mut d = Driven::new(cfg);
    let objects: Vec<Value> = (0..cfg_room(64 * 1024, 7)).map(|_| json!({ "": 0 })).collect();
    for _ in 0..4 {
        let state = line(
            json!({ "jsonrpc": "2.0", "method": "state", "params": { "type": "running", "x": objects } }),
        );
        d.write(&state).unwrap();
    }
    // One request in service (its effect never completes), the rest
    // queued behind it.
    d.write(&line(json!({ "jsonrpc": "2.0", "id": 0, "method": "fs.read", "params": { "path": "a" } })))
        .unwrap();
    let paths: Vec<Value> = (0..cfg_room(64 * 1024, 4)).map(|_| json!("a")).collect();
    for id in 1..8 {
        let grep = line(
            json!({ "jsonrpc": "2.0", "id": id, "method": "fs.grep", "params": { "pattern": "x", "paths": paths } }),
        );
        d.write(&grep).unwrap();
    }
    assert_eq!(d.host.unanswered(), 8);
    assert!(d.peak > 16 * HEAP_SLACK, "the host held only {} bytes at most", d.peak);
    // The shell tells the host it is gone: everything is given back but
    // what the run ends with.
    d.handle(Input::UserSignal(UserSignal::Term)).unwrap();
}

/// Items of `each` bytes of text (a comma included) that fit a line of
/// `max` with room for the message around them.
fn cfg_room(max: usize, each: usize) -> usize {
    (max - 200) / each
}

/// The check can fail: a buffer the host holds and counts nowhere is
/// caught on the input that makes it, and the report names a limit.
#[test]
fn a_buffer_the_host_does_not_count_fails_its_heap_check() {
    let mut cfg = Config::new("t");
    cfg.planted_bug = Some(PlantedBug::ToolUncountedBuffer);
    let mut d = Driven::new(cfg);
    let read = line(json!({ "jsonrpc": "2.0", "id": 1, "method": "fs.read", "params": { "path": "a" } }));
    let err = d.write(&read).expect_err("an uncounted --max-file buffer passes the heap check");
    assert!(err.contains("breaks max_pending"), "{err}");
    assert!(d.held() >= DEFAULT_MAX_FILE as u64, "{err}");
}

/// Without the planted bug, the same input passes.
#[test]
fn a_host_without_the_buffer_passes_the_same_input() {
    let mut d = Driven::new(Config::new("t"));
    let read = line(json!({ "jsonrpc": "2.0", "id": 1, "method": "fs.read", "params": { "path": "a" } }));
    d.write(&read).unwrap();
    assert_eq!(d.host.unanswered(), 1);
}

/// The scrub fuzz target's peak bound holds where the output grows most: a
/// text made of the shortest secret, each 4 bytes becoming a 10-byte
/// marker.
#[test]
fn scrubbing_a_text_of_secrets_stays_within_its_peak_bound() {
    let mut input = vec![0u8, 4];
    input.extend_from_slice(b"abcd");
    for _ in 0..50_000 {
        input.extend_from_slice(&[0xFF, 0]);
    }
    fuzzing::scrubber(&input);
    // The bound is met by what is measured, not by a count of nothing.
    let text = b"abcd".repeat(50_000);
    let (out, cost) =
        crate::heapcount::cost(HOST, || scrub::Scrubber::new([b"abcd"], 4).bytes(&text).into_owned());
    let cost = cost.expect("the counting allocator is installed");
    assert_eq!(out.len(), 10 * 50_000);
    assert!(cost.peak >= out.len() as u64, "{cost:?}");
    assert!(
        cost.peak <= fuzzing::SCRUB_PEAK_PER_BYTE * text.len() as u64 + fuzzing::SCRUB_PEAK_SLACK,
        "{cost:?}"
    );
}

/// A request in service with an id as long as a line allows keeps that id
/// twice (in service and among the pending ids): its line's share covers
/// it.
#[test]
fn a_request_in_service_with_a_long_id_stays_within_its_allowance() {
    let mut cfg = Config::new("t");
    cfg.max_line = 1 << 20;
    let mut d = Driven::new(cfg);
    let id = "i".repeat((1 << 20) - 200);
    d.write(&line(json!({ "jsonrpc": "2.0", "id": id, "method": "fs.read", "params": { "path": "a" } })))
        .unwrap();
    assert_eq!(d.host.unanswered(), 1);
    assert!(d.held() > 2 * (1 << 20), "the host holds only {} bytes", d.held());
}
