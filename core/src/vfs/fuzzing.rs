//! The `vfs_host` fuzz target's entry point, shared with the corpus replay
//! (`core/tests/fuzz_corpus.rs`) and a proptest: bytes decide what a
//! hostile tool writes (templated requests with hostile paths, raw bytes,
//! floods, final messages), when effects complete and with what, how time
//! moves, and when the user, the tool's exit and EOFs strike.
//!
//! Checked after every step (a panic is the finding):
//! - a response's id was requested by the tool more often than it was
//!   answered (one response per request id);
//! - every file effect names only paths inside the policy, and what the
//!   backend did never touched a path outside `out/` or a denied one;
//! - nothing sent to the tool holds the secret or a denied file's marker,
//!   in plain text or inside base64;
//! - held bytes stay under `max_line + MAX_READ_CHUNK`, unanswered requests
//!   under `max_pending`;
//! - in the end, driven to completion (time, exit, EOF), the host finishes
//!   exactly once and wants no more timers.

use super::memfs::{MemFiles, MemNode};
use super::*;
use crate::codec::jsonrpc::{self, Incoming};
use crate::heapcount;
use crate::time::Instant;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub const SECRET: &str = "Zq9-secret-Zq9";
pub const MARKER: &str = "DENIED-MARKER";

pub fn policy_config() -> PolicyConfig {
    PolicyConfig {
        project: "/p".into(),
        allow: vec![".".into()],
        allow_rw: vec!["out".into()],
        deny: vec!["*.key".into(), "private/".into()],
        allow_cmd: vec![("echo".into(), "/bin/echo".into())],
        allow_url: vec!["http://127.0.0.1:9/api".into()],
        env_allow: vec![("TOKEN".into(), Some(SECRET.into()))],
        path_env: "/usr/bin".into(),
        ..Default::default()
    }
}

pub fn project() -> MemFiles {
    let mut f = MemFiles::new();
    f.put("src/main.rs", MemNode::File(b"fn main() {}\n".to_vec()));
    f.put("src/leak.txt", MemNode::File(format!("token {SECRET}\n").into_bytes()));
    f.put("src/bin.dat", MemNode::File([&[0u8, 0xff][..], SECRET.as_bytes()].concat()));
    f.put(".env", MemNode::File(format!("{MARKER} env\n").into_bytes()));
    f.put("src/.env.local", MemNode::File(format!("{MARKER} env local\n").into_bytes()));
    f.put("a.key", MemNode::File(format!("{MARKER} key\n").into_bytes()));
    f.put("private/p.txt", MemNode::File(format!("{MARKER} private\n").into_bytes()));
    f.put("out/x.txt", MemNode::File(b"x\n".to_vec()));
    f.put("ln_env", MemNode::Symlink(".env".into()));
    f.put("ln_priv", MemNode::Symlink("private".into()));
    f.put("ln_out", MemNode::Symlink("/etc".into()));
    f.put("out/ln_src", MemNode::Symlink("../src/main.rs".into()));
    f
}

const PATHS: &[&str] = &[
    "src/main.rs",
    "src/leak.txt",
    "src/bin.dat",
    ".env",
    "src/.env.local",
    "a.key",
    "private/p.txt",
    "ln_env",
    "ln_priv/p.txt",
    "ln_out/passwd",
    "out/x.txt",
    "out/new/y.txt",
    "out/ln_src",
    "/etc/passwd",
    "src/../a.key",
    ".",
    "out",
    "src",
    "",
];

struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }
    fn pick<'b, T>(&mut self, from: &'b [T]) -> Option<&'b T> {
        let b = self.byte()? as usize;
        from.get(b % from.len())
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let end = (self.pos + n).min(self.data.len());
        let s = &self.data[self.pos..end];
        self.pos = end;
        s
    }
}

fn request_line(b: &mut Bytes) -> Option<String> {
    let id = json!(b.byte()? % 8);
    let path = *b.pick(PATHS)?;
    let path2 = *b.pick(PATHS)?;
    let (method, params) = match b.byte()? % 12 {
        0 => ("fs.read", json!({ "path": path })),
        1 => ("fs.write", json!({ "path": path, "content": format!("w {SECRET}") })),
        2 => ("fs.exists", json!({ "path": path })),
        3 => ("fs.metadata", json!({ "path": path })),
        4 => ("fs.list_dir", json!({ "path": path })),
        5 => ("fs.delete", json!({ "path": path })),
        6 => ("fs.rename", json!({ "from": path, "to": path2 })),
        7 => ("fs.grep", json!({ "pattern": "token|fn|MARKER", "paths": [path], "context": 1 })),
        8 => (
            "http.get",
            json!({ "url": "http://127.0.0.1:9/api/x", "headers": [{"name": "A", "value": "${TOKEN}"}] }),
        ),
        9 => ("process.run", json!({ "program": "echo", "args": ["a"], "envs": ["TOKEN"] })),
        10 => ("fs.write", json!({ "path": path, "content": "AP8=", "encoding": "base64" })),
        _ => ("nope", json!({})),
    };
    Some(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string())
}

/// The host's heap tag (0 is the harness's).
const HOST: heapcount::Tag = heapcount::Tag::new(1);

/// The checking harness around one host.
struct Harness {
    host: Host,
    /// What the host's heap tag held before the host was built.
    heap_base: u64,
    files: MemFiles,
    now: Instant,
    /// Tool stdout bytes not yet accepted (the budget holds them back).
    unsent: Vec<u8>,
    /// The checker's own line split of what the tool wrote.
    tool_partial: Vec<u8>,
    requested: BTreeMap<String, u64>,
    answered: BTreeMap<String, u64>,
    held: Vec<(EffectId, Effect)>,
    initial: MemFiles,
    /// Bytes written for the tool it has not read; a deaf tool reads none.
    unread: usize,
    deaf: bool,
    finished: u32,
    max_line: usize,
    max_pending: usize,
}

impl Harness {
    fn write_tool(&mut self, bytes: &[u8]) {
        self.unsent.extend_from_slice(bytes);
        self.flush();
    }

    fn flush(&mut self) {
        loop {
            let budget = self.host.stdout_budget();
            if budget == 0 || self.unsent.is_empty() {
                return;
            }
            let n = budget.min(self.unsent.len());
            let chunk: Vec<u8> = self.unsent.drain(..n).collect();
            self.note_tool_bytes(&chunk);
            self.handle(Input::ToolStdout(chunk));
        }
    }

    fn note_tool_bytes(&mut self, chunk: &[u8]) {
        self.tool_partial.extend_from_slice(chunk);
        while let Some(i) = self.tool_partial.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self.tool_partial.drain(..=i).collect();
            if let Incoming::Request { id, .. } = jsonrpc::parse(&line[..line.len() - 1]) {
                *self.requested.entry(id.key()).or_default() += 1;
            }
        }
        if self.tool_partial.len() > self.max_line + 1 {
            self.tool_partial.clear();
        }
    }

    /// At the end of the tool's stdout the host reads a last line without
    /// its newline too (`end_of_stdout`), so the checker counts it: a
    /// request there may be answered. Counting a line the host refuses
    /// (too long, say) is harmless: the check is that nothing is answered
    /// more often than it was asked.
    fn note_tool_eof(&mut self) {
        let line = std::mem::take(&mut self.tool_partial);
        if let Incoming::Request { id, .. } = jsonrpc::parse(&line) {
            *self.requested.entry(id.key()).or_default() += 1;
        }
    }

    fn handle(&mut self, input: Input) {
        if matches!(input, Input::ToolStdoutEof) {
            self.note_tool_eof();
        }
        HOST.scope(|| self.host.handle(self.now, input));
        self.drain();
        self.check_bounds();
        if !self.deaf && self.unread > 0 {
            let n = std::mem::take(&mut self.unread);
            HOST.scope(|| self.host.handle(self.now, Input::ToolStdinWritten(n)));
            self.drain();
            self.check_bounds();
        }
    }

    fn drain(&mut self) {
        while let Some(o) = HOST.scope(|| self.host.poll_output()) {
            // Handed out: the harness's from here (an effect is held until
            // it completes, as a shell's backend would hold it).
            let o = match o {
                Output::ToolStdin(ref b) | Output::Finished { line: ref b, .. } => {
                    heapcount::retag(b, heapcount::Tag::HARNESS);
                    o
                }
                Output::Effect { .. } => heapcount::Tag::HARNESS.scope(|| o.clone()),
                o => o,
            };
            match o {
                Output::ToolStdin(bytes) => {
                    self.unread += bytes.len();
                    self.check_to_tool(&bytes)
                }
                Output::Effect { id, effect } => {
                    if let Effect::Fs(op) = &effect {
                        check_fs_effect(op);
                    }
                    self.held.push((id, effect));
                }
                Output::CancelEffect(id) => self.held.retain(|(i, _)| *i != id),
                Output::Finished { line, exit_status } => {
                    self.finished += 1;
                    let v: Value = serde_json::from_slice(&line).expect("outcome is JSON");
                    assert!(v["outcome"].is_string() && v["tool_exit"].is_object(), "{v}");
                    assert!([0, 1, 3, 4, 5, 124, 129, 130, 143].contains(&exit_status), "{exit_status}");
                }
                Output::CloseStdin | Output::Signal(_) => {}
            }
        }
    }

    fn check_to_tool(&mut self, bytes: &[u8]) {
        assert!(bytes.ends_with(b"\n"), "whole lines only");
        for line in bytes.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            assert!(line.len() <= self.max_line, "a line of {} bytes to the tool", line.len());
            let v: Value = serde_json::from_slice(line).expect("host lines are JSON");
            assert_clean(&v);
            if let Some(id) = v.get("id").filter(|i| !i.is_null()) {
                let key = id.to_string();
                let n = self.answered.entry(key.clone()).or_default();
                *n += 1;
                let asked = self.requested.get(&key).copied().unwrap_or(0);
                assert!(*n <= asked, "id {key} answered {n} times, requested {asked} times");
            }
        }
    }

    fn check_bounds(&self) {
        // What the host holds on the heap stays within what its limits
        // allow (`Host::heap_check`), when the counting allocator is the
        // global one (the fuzz target and the corpus replay install it).
        if let Some(live) = heapcount::live(HOST) {
            if let Err(m) = self.host.heap_check(live.wrapping_sub(self.heap_base)) {
                panic!("bounded_memory: the host {m}");
            }
        }
        assert!(self.host.unanswered() <= self.max_pending, "{} unanswered", self.host.unanswered());
        let held = self.host.buffered_bytes();
        let bound = self.max_line + 1 + MAX_READ_CHUNK + self.host.config().stderr_tail;
        assert!(held <= bound, "{held} bytes held");
        let cfg = self.host.config();
        let backlog = cfg.max_stdin_backlog + (cfg.max_pending + 4) * (cfg.max_line + 1);
        assert!(self.unread <= backlog, "{} bytes unread by the tool", self.unread);
        let fs_ok = self.files.nodes().keys().all(|k| {
            let s = k.as_str();
            self.initial.nodes().contains_key(k) || s.starts_with("out/") || s == "out"
        });
        assert!(fs_ok, "a node appeared outside out/: {:?}", self.files.nodes().keys().collect::<Vec<_>>());
        for (k, v) in self.initial.nodes() {
            if !k.as_str().starts_with("out") {
                assert_eq!(self.files.nodes().get(k), Some(v), "{k} changed");
            }
        }
    }

    fn complete(&mut self, b: &mut Bytes) {
        if self.held.is_empty() {
            return;
        }
        let i = b.byte().unwrap_or(0) as usize % self.held.len();
        let (id, effect) = self.held.remove(i);
        let leak = format!("echo {SECRET}").into_bytes();
        let result = match effect {
            Effect::Fs(op) => EffectResult::Fs(op.run(&mut self.files, self.host.gate())),
            Effect::Http(_) => match b.byte().unwrap_or(0) % 3 {
                0 => EffectResult::Http(Err(OpError::io(format!("connect failed {SECRET}")))),
                1 => EffectResult::Http(Ok(HttpResponse {
                    status: 200,
                    headers: vec![Header { name: "x".into(), value: leak.clone() }],
                    body: leak,
                })),
                _ => {
                    EffectResult::Http(Ok(HttpResponse { status: 500, headers: vec![], body: vec![0xff, 0] }))
                }
            },
            Effect::Process(_) => EffectResult::Process(Ok(ProcessOutput {
                stdout: leak.clone(),
                stderr: [&[0xffu8][..], &leak].concat(),
                exit_code: Some(0),
                signal: None,
            })),
        };
        // Sometimes the result comes twice, or for a made-up id.
        let twice = b.byte().unwrap_or(0).is_multiple_of(8);
        self.handle(Input::EffectDone { id, result: result.clone() });
        if twice {
            self.handle(Input::EffectDone { id, result: result.clone() });
            self.handle(Input::EffectDone { id: EffectId(id.0 + 1000), result });
        }
    }
}

fn check_fs_effect(op: &FsOp) {
    for (p, write) in op.paths() {
        let s = p.as_str();
        assert!(!s.starts_with('/') && !s.split('/').any(|c| c == ".."), "effect on {s}");
        assert!(!s.split('/').any(|c| c == ".env" || c.starts_with(".env.")), "effect on {s}");
        assert!(!s.ends_with(".key") && !s.starts_with("private"), "effect on {s}");
        if write {
            assert!(s == "out" || s.starts_with("out/"), "write effect on {s}");
        }
    }
}

fn assert_clean(v: &Value) {
    match v {
        Value::String(s) => {
            assert!(!s.contains(SECRET) && !s.contains(MARKER), "leak to the tool: {s}");
            if let Ok(raw) = STANDARD.decode(s) {
                let text = String::from_utf8_lossy(&raw);
                assert!(!text.contains(SECRET) && !text.contains(MARKER), "leak in base64: {s}");
            }
        }
        Value::Array(a) => a.iter().for_each(assert_clean),
        Value::Object(o) => o.iter().for_each(|(k, v)| {
            assert!(!k.contains(SECRET));
            assert_clean(v)
        }),
        _ => {}
    }
}

/// One fuzz input through the machine.
pub fn host_session(data: &[u8]) {
    let mut b = Bytes { data, pos: 0 };
    let knobs = b.byte().unwrap_or(0);
    let mut cfg = Config::new("fuzz");
    cfg.arguments = json!({ "leak": SECRET });
    cfg.applies = (0..knobs % 4).map(|i| format!("apply {i}")).collect();
    cfg.max_line = if knobs & 0x10 != 0 { 256 } else { 4096 };
    cfg.max_pending = if knobs & 0x20 != 0 { 3 } else { 64 };
    cfg.max_grep_lines = 5;
    if knobs & 0x40 != 0 {
        cfg.max_stdin_backlog = 512;
    }
    let policy = ToolPolicy::new(&policy_config()).expect("policy");
    let heap_base = heapcount::live(HOST).unwrap_or(0);
    let mut h = Harness {
        max_line: cfg.max_line,
        max_pending: cfg.max_pending,
        heap_base,
        host: HOST.scope(|| Host::new(Instant::ZERO, cfg, policy)),
        files: project(),
        now: Instant::ZERO,
        unsent: Vec::new(),
        tool_partial: Vec::new(),
        requested: BTreeMap::new(),
        answered: BTreeMap::new(),
        held: Vec::new(),
        initial: project(),
        unread: 0,
        deaf: false,
        finished: 0,
    };
    h.drain();
    let mut exited = false;
    let mut eof = false;
    while let Some(op) = b.byte() {
        match op % 16 {
            0..=4 => {
                if let Some(l) = request_line(&mut b) {
                    h.write_tool(format!("{l}\n").as_bytes());
                }
            }
            5 => {
                let n = b.byte().unwrap_or(0) as usize;
                let raw = b.take(n).to_vec();
                h.write_tool(&raw);
            }
            6 | 7 => h.complete(&mut b),
            8 => {
                let secs = match b.byte().unwrap_or(0) {
                    x @ 0..=200 => u64::from(x % 40),
                    x => u64::from(x) * 1000,
                };
                h.now = h.now.saturating_add(std::time::Duration::from_secs(secs));
                h.handle(Input::Tick);
                h.flush();
            }
            9 => {
                let id = b.byte().unwrap_or(0) % 8;
                h.write_tool(
                    json!({"jsonrpc":"2.0","method":"cancel","params":{"id":id}}).to_string().as_bytes(),
                );
                h.write_tool(b"\n");
            }
            10 => {
                let sig = *b
                    .pick(&[UserSignal::Int, UserSignal::Term, UserSignal::Hup])
                    .unwrap_or(&UserSignal::Int);
                h.handle(Input::UserSignal(sig));
            }
            11 => {
                let finals = [
                    r#"{"jsonrpc":"2.0","method":"result","params":{"content":"done"}}"#,
                    r#"{"jsonrpc":"2.0","method":"error","params":{"message":"failed"}}"#,
                    r#"{"jsonrpc":"2.0","method":"state","params":{"type":"running","content":"c"}}"#,
                    r#"{"jsonrpc":"2.0","method":"state","params":{"type":"stopped","result":"r"}}"#,
                    r#"{"jsonrpc":"2.0","method":"result","params":{}}"#,
                    r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
                    r#"[{"jsonrpc":"2.0","id":1,"method":"fs.read","params":{"path":"src/main.rs"}}]"#,
                ];
                if let Some(l) = b.pick(&finals) {
                    h.write_tool(format!("{l}\n").as_bytes());
                }
            }
            12 if !eof => {
                eof = true;
                h.flush();
                h.unsent.clear();
                h.handle(Input::ToolStdoutEof);
            }
            13 if !exited => {
                exited = true;
                h.handle(Input::ToolExited(ToolExit::Code(i32::from(b.byte().unwrap_or(0)))));
            }
            14 => {
                let n = b.byte().unwrap_or(0) as usize * 64;
                h.handle(Input::ToolStderr(vec![b'e'; n]));
            }
            _ if b.byte().unwrap_or(0).is_multiple_of(2) => h.deaf = !h.deaf,
            _ => {
                h.unread = 0;
                h.handle(Input::ToolStdinClosed)
            }
        }
    }
    // Drive to the end: whatever happened, the host must finish.
    for _ in 0..8 {
        h.now = h.now.saturating_add(std::time::Duration::from_secs(1000));
        h.handle(Input::Tick);
        if !h.held.is_empty() {
            h.complete(&mut Bytes { data: &[0, 1], pos: 0 });
        }
    }
    if !exited {
        h.handle(Input::ToolExited(ToolExit::Signal(9)));
    }
    if !eof {
        h.handle(Input::ToolStdoutEof);
    }
    h.now = h.now.saturating_add(std::time::Duration::from_secs(1000));
    h.handle(Input::Tick);
    assert_eq!(h.finished, 1, "finished {} times", h.finished);
    assert!(h.host.is_finished() && h.host.poll_timeout().is_none());
}

/// The tag a pure call's allocations are charged to while it is measured.
const PURE_CALL: heapcount::Tag = heapcount::Tag::new(heapcount::MAX_TAGS - 1);
/// Scrubbing holds at most this many times the text at once: its result,
/// up to 2.5 times the text (a 4-byte secret becomes the 10-byte marker),
/// in a buffer up to twice that as it doubles, and the spans found…
pub const SCRUB_PEAK_PER_BYTE: u64 = 8;
/// …plus this: the compiled secrets (at most four of 23 bytes here, in
/// each of their forms) and the decoding pass's ring.
pub const SCRUB_PEAK_SLACK: u64 = 256 << 10;

/// The `vfs_scrub` fuzz target's entry point (and its corpus replay): the
/// scrubber against an oracle of its own (`scrub::oracle`), on secrets
/// and content the input spells. The input: a count of secrets (1 to 4),
/// each as a length byte (0 to 23, so some fall under
/// [`MIN_SECRET_LEN`]) and its bytes; then the content, where `0xFF j`
/// stands for secret `j` as it is and `0xFE j e p` for secret `j` in
/// encoding `e` (percent, JSON escapes, hex, base64 at an alignment and
/// with padding `p`, UTF-16: `scrub::oracle::ENCS`).
///
/// Checked: the output is the content with spans replaced by
/// `[REDACTED]`; no secret can be read in it, plain or in a literal form
/// (hex, base64 cores, UTF-16), except overlapping a marker; no planted
/// encoding survives whole; content without `%`, `\` or any literal form
/// comes back unchanged; `finds` says whether anything was replaced; a
/// string is scrubbed as its bytes are; memory stays within a multiple of
/// the text.
pub fn scrubber(data: &[u8]) {
    use crate::scrub::oracle::{encode, survives, visible, ENCS};
    let mut it = data.iter().copied();
    let k = 1 + usize::from(it.next().unwrap_or(0) % 4);
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    for _ in 0..k {
        let len = usize::from(it.next().unwrap_or(0) % 24);
        secrets.push(it.by_ref().take(len).collect());
    }
    let rest: Vec<u8> = it.collect();
    let mut content = Vec::new();
    let mut planted: Vec<Vec<u8>> = Vec::new();
    let mut at = 0;
    while at < rest.len() {
        match (rest[at], rest.get(at + 1)) {
            (0xFF, Some(&j)) => {
                content.extend_from_slice(&secrets[usize::from(j) % k]);
                at += 2;
            }
            (0xFE, Some(&j)) => {
                let secret = &secrets[usize::from(j) % k];
                let enc = ENCS[usize::from(rest.get(at + 2).copied().unwrap_or(0)) % ENCS.len()];
                let pad = rest.get(at + 3).copied().unwrap_or(0);
                // Text encodings need text; bytes that are not UTF-8 go in
                // as they are.
                let piece = match std::str::from_utf8(secret) {
                    Ok(text) => encode(text, enc, pad),
                    Err(_) => secret.clone(),
                };
                if secret.len() >= MIN_SECRET_LEN {
                    planted.push(piece.clone());
                }
                content.extend_from_slice(&piece);
                at += 4;
            }
            (b, _) => {
                content.push(b);
                at += 1;
            }
        }
    }
    let scrub = super::scrub::Scrubber::new(&secrets, MIN_SECRET_LEN);
    let live: Vec<&Vec<u8>> = secrets.iter().filter(|s| s.len() >= MIN_SECRET_LEN).collect();
    let marker = super::scrub::REDACTED.as_bytes();
    let got = scrub.bytes(&content);

    // The output is the content, some spans of it replaced by the marker:
    // what lies between markers is the content's, in order.
    let mut rebuilt_at = 0;
    let (mut kept, mut from, mut i) = (Vec::new(), 0, 0);
    while i + marker.len() <= got.len() {
        if &got[i..i + marker.len()] == marker {
            kept.push(&got[from..i]);
            i += marker.len();
            from = i;
        } else {
            i += 1;
        }
    }
    kept.push(&got[from..]);
    for piece in kept.iter().filter(|p| !p.is_empty()) {
        let found = content[rebuilt_at..].windows(piece.len()).position(|w| w == *piece);
        match found {
            Some(i) => rebuilt_at += i + piece.len(),
            None => panic!("output piece {piece:?} is not the content's, in order: {content:?} -> {got:?}"),
        }
    }
    for s in &live {
        if let Some(form) = visible(&got, s, marker) {
            panic!("secret {s:?} survives ({form}) in {got:?}");
        }
    }
    for p in &planted {
        assert!(!survives(&got, p, false, marker), "planted {p:?} survives in {got:?}");
    }
    let replaced = !matches!(got, std::borrow::Cow::Borrowed(_));
    assert_eq!(scrub.finds(&content), replaced, "finds disagrees with the scrub of {content:?}");
    // A literal form is the secret by design wherever it stands, a base64
    // core inside unrelated base64-looking text included.
    let holds = |form: &[u8], any_case: bool| {
        content.windows(form.len().max(1)).any(|w| {
            if any_case {
                w.eq_ignore_ascii_case(form)
            } else {
                w == form
            }
        })
    };
    let literal = live.iter().any(|s| {
        let f = crate::scrub::forms::forms(s);
        visible(&content, s, b"\0no-marker\0").is_some()
            || f.exact.iter().any(|x| holds(x, false))
            || f.any_case.iter().any(|x| holds(x, true))
    });
    if !literal && !content.iter().any(|b| *b == b'%' || *b == b'\\') {
        assert!(!replaced, "content without a secret changed: {content:?} -> {got:?}");
    }
    // Scrubbing keeps nothing but its result, and needs at most a stated
    // multiple of the text plus the compiled secrets at once. Measured on
    // a second scrubber, once the first has set up whatever a thread keeps
    // for good.
    let (owned, cost) = heapcount::cost(PURE_CALL, || {
        super::scrub::Scrubber::new(&secrets, MIN_SECRET_LEN).bytes(&content).into_owned()
    });
    if let Some(c) = cost {
        let result = owned.capacity() as u64;
        assert_eq!(
            c.kept,
            result,
            "scrubbing {} bytes kept {} bytes beside its result",
            content.len(),
            c.kept - result.min(c.kept)
        );
        let bound = SCRUB_PEAK_PER_BYTE * content.len() as u64 + SCRUB_PEAK_SLACK;
        assert!(c.peak <= bound, "bounded_memory: scrubbing {} bytes peaked at {} bytes, over {bound} (SCRUB_PEAK_PER_BYTE, SCRUB_PEAK_SLACK)", content.len(), c.peak);
    }
    assert_eq!(owned, &*got);
    drop(owned);
    if let Ok(text) = std::str::from_utf8(&content) {
        assert_eq!(scrub.string(text).as_bytes(), String::from_utf8_lossy(&got).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        #[test]
        fn hostile_sessions_hold_every_invariant(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            host_session(&data);
        }
    }
}
