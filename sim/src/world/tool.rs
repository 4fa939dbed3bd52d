//! The tool scenario: one VFS tool host (`airlock_core::vfs::Host`) and a
//! hostile simulated tool on the other end of its stdin/stdout, over an
//! in-memory project whose symlinks an attacker swaps between steps.
//!
//! The tool lies (requests for denied and escaping paths, duplicate ids,
//! responses and batches of its own, bad JSON, bytes that are not UTF-8),
//! floods (requests past the host's pending limit, lines over `--max-line`,
//! a line that never ends), exits early, hangs, closes its stdout or stdin,
//! ignores `cancel` and SIGTERM, and races its own cancel against the
//! effect it cancels. Effects complete late, out of order, fail, or hang
//! until the host gives up on them; the clock jumps; the user signals.
//!
//! Checked after every step, each against what the world itself saw:
//! - `one_response`: no id is answered more often than the tool asked with
//!   it; when the run completes on the tool's `result`/`error`, every
//!   request (and invalid line) it wrote before has exactly one answer;
//! - `policy`: every file effect names paths inside the policy (the
//!   checker's own rules), what the backend did changed nothing outside
//!   `out/`, no denied file's content reaches the tool, HTTP and processes
//!   only as allowed;
//! - `secret`: the `--env-allow` value never reaches the tool (invariant
//!   14), in plain text or inside base64, in none of its derived forms
//!   (percent, JSON escapes, hex, base64 at each alignment, UTF-16: the
//!   project's files hold every one, made by the scrubber's oracle);
//! - `reaped`: once the host closed the tool's stdin, the tool is dead
//!   within the cancel and kill graces;
//! - `liveness`: an effect is answered or given up within `--op-timeout`; a
//!   silent tool with nothing pending is stopped after `--timeout`; the
//!   host finishes within `--kill-grace` of the tool's exit and the run
//!   ends;
//! - `bounded`: unanswered requests at most `max_pending`; bytes the host
//!   holds at most one line plus one read plus the stderr tail; bytes
//!   written to the tool in one step bounded by the pending limit;
//! - `bounded_memory`: the bytes the host really holds on the heap,
//!   counted by the harness's allocator (`airlock_core::heapcount`, each
//!   block charged to the host when the host allocated it), stay within
//!   what its limits allow plus a stated constant (`Host::heap_check`).
//!   Without the counting allocator there is nothing to read and the
//!   check passes; the counts are read only here, so a seed's world is
//!   the same either way.

use super::{violation, Outcome, Violation};
use crate::swarm::{FaultKind, Swarm, PPM};
use crate::Failure;
use crate::Scenario;
use airlock_core::codec::jsonrpc::{self, Incoming};
use airlock_core::fsproxy::PlantedBug;
use airlock_core::heapcount::{self as heapcount, Tag};
use airlock_core::resolve::{Entry, Namespace, Refusal};
use airlock_core::scrub::oracle::{encode, survives, visible, Enc, ENCS};
use airlock_core::time::Instant;
use airlock_core::trace::vfs::Header as VfsHeader;
use airlock_core::vfs::files::Node;
use airlock_core::vfs::memfs::{MemFiles, MemNode};
use airlock_core::vfs::walk::{Opened, ProjectNs};
use airlock_core::vfs::ProjectPath;
use airlock_core::vfs::{
    Config, Effect, EffectId, EffectResult, FsOp, Header, Host, HttpResponse, Input, OpError, Output,
    PolicyConfig, ProcessOutput, Signal, ToolExit, ToolPolicy, UserSignal, MAX_READ_CHUNK,
};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::time::Duration;

const SECRET: &str = "Kx7-tool-secret-Kx7";
const MARKER: &str = "DENIED-CONTENT";
/// Chance, in parts per million, that the attacker changes the project
/// before each step of a file operation (at least: a swarm's symlink
/// swap rate, when higher).
const RACE_PPM: u32 = 20_000;
/// Steps allowed after the tool's work for the run to end.
const WIND_DOWN_STEPS: u64 = 20_000;

type Check = Result<(), Violation>;

/// The host's heap tag (0 is the world's own).
const HEAP: Tag = Tag::new(1);

/// An output's bytes are the world's once handed out: a pipe or a backend
/// holds them from there, as a shell's would.
fn hand_out(o: Output) -> Output {
    match &o {
        Output::ToolStdin(b) | Output::Finished { line: b, .. } => {
            heapcount::retag(b, Tag::HARNESS);
            o
        }
        Output::Effect { .. } => Tag::HARNESS.scope(|| o.clone()),
        _ => o,
    }
}

fn policy_config() -> PolicyConfig {
    PolicyConfig {
        project: "/proj".into(),
        allow: vec![".".into()],
        allow_rw: vec!["out".into()],
        deny: vec!["*.key".into(), "private/".into()],
        allow_cmd: vec![("echo".into(), "/bin/echo".into())],
        allow_url: vec!["http://127.0.0.1:9/api".into()],
        env_allow: vec![("TOKEN".into(), Some(SECRET.into())), ("UNSET".into(), None)],
        path_env: "/usr/bin:/bin".into(),
        ..Default::default()
    }
}

fn project() -> MemFiles {
    let mut f = MemFiles::new();
    f.put("src/main.rs", MemNode::File(b"fn main() {}\n// TODO\n".to_vec()));
    let mut lib = format!("const T: &str = \"{SECRET}\";\nfn f() {{}}\n").into_bytes();
    let mut blob = [&[0u8, 0xfe, 0xff][..], SECRET.as_bytes()].concat();
    // The secret in each derived form (invariant 14): text forms in the
    // source, every form among the bytes of the binary.
    for (i, enc) in ENCS.iter().enumerate() {
        let form = encode(SECRET, *enc, i as u8);
        if !matches!(enc, Enc::Utf16Le | Enc::Utf16Be) {
            lib.extend_from_slice(format!("// {enc:?}: ").as_bytes());
            lib.extend_from_slice(&form);
            lib.push(b'\n');
        }
        blob.extend_from_slice(&form);
        blob.push(0);
    }
    f.put("src/lib.rs", MemNode::File(lib));
    f.put("src/blob.bin", MemNode::File(blob));
    f.put(".env", MemNode::File(format!("{MARKER} .env\n").into_bytes()));
    f.put("src/.env.prod", MemNode::File(format!("{MARKER} .env.prod\n").into_bytes()));
    f.put("id.key", MemNode::File(format!("{MARKER} key\n").into_bytes()));
    f.put("private/notes.txt", MemNode::File(format!("{MARKER} private\n").into_bytes()));
    f.put("out/a.txt", MemNode::File(b"a\n".to_vec()));
    f.put("out/link", MemNode::Symlink("a.txt".into()));
    f.put("out/dir", MemNode::Symlink("../src".into()));
    // A directory the attacker swaps for a symlink mid-operation, with
    // names that are also in `private/` and `src/`.
    f.put("out/sub/notes.txt", MemNode::File(b"notes\n".to_vec()));
    f.put("out/sub/main.rs", MemNode::File(b"// copy\n".to_vec()));
    // Protected paths and secret files where the tool may write
    // (DESIGN.md, invariants 13 and 14).
    f.put("out/.git/config", MemNode::File(b"[core]\n".to_vec()));
    f.put("out/.git/hooks/pre-commit", MemNode::File(b"#!/bin/sh\n".to_vec()));
    f.put("out/.git/index", MemNode::File(b"index\n".to_vec()));
    f.put("out/.vscode/tasks.json", MemNode::File(b"{}\n".to_vec()));
    f.put("out/.ENV", MemNode::File(format!("{MARKER} .ENV\n").into_bytes()));
    f.put("out/#.env#", MemNode::File(format!("{MARKER} #.env#\n").into_bytes()));
    f.put("out/prod.env", MemNode::File(format!("{MARKER} prod.env\n").into_bytes()));
    f
}

/// The checker's own reading of the guard, kept apart from the core's:
/// a path (project-relative) the tool may never reach, or never change.
fn secret_by_name(s: &str) -> bool {
    s.split('/').any(|c| {
        let c = c.to_ascii_lowercase();
        let c = c.trim_start_matches('#').trim_end_matches(['#', '~']);
        c == ".env" || c.starts_with(".env.") || c.ends_with(".env")
    })
}

fn protected_by_name(s: &str) -> bool {
    let c: Vec<String> = s.split('/').map(str::to_ascii_lowercase).collect();
    c.iter().enumerate().any(|(i, n)| {
        let next = c.get(i + 1).map(String::as_str);
        n == ".vscode" || (n == ".git" && (next.is_none() || next == Some("config") || next == Some("hooks")))
    })
}

/// What the attacker points the swapped links at.
const LINK_TARGETS: &[&str] = &[
    "a.txt",
    "../src/main.rs",
    "../.env",
    "../src/.env.prod",
    "../id.key",
    "../private",
    "../private/notes.txt",
    "/etc/passwd",
    "/proj/src",
    "../../outside",
    "link",
    "missing",
    ".git/config",
    ".git/hooks",
    ".git",
    ".ENV",
];

const PATHS: &[&str] = &[
    "src/main.rs",
    "src/lib.rs",
    "src/blob.bin",
    "src",
    ".",
    "out",
    "out/a.txt",
    "out/link",
    "out/dir",
    "out/dir/main.rs",
    "out/new/deep/f.txt",
    "out/b.txt",
    "out/sub",
    "out/sub/notes.txt",
    "out/sub/main.rs",
    "out/sub/new.rs",
    ".env",
    "src/.env.prod",
    "id.key",
    "private/notes.txt",
    "/etc/passwd",
    "../outside",
    "src/../id.key",
    "",
    "nope.txt",
    "out/.git/config",
    "out/.git/hooks/pre-commit",
    "out/.git/hooks/new",
    "out/.git/index",
    "out/.git",
    "out/sub/.git",
    "out/.vscode/tasks.json",
    "out/.ENV",
    "out/#.env#",
    "out/prod.env",
    "out/link/config",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Persona {
    /// Asks, waits for answers, ends with a result and exits on EOF.
    Polite,
    /// Ignores `cancel` and stdin EOF: must be signalled.
    Stubborn,
    /// Ignores SIGTERM too: must be killed.
    Immortal,
    /// Never waits for answers: floods the host.
    Flooder,
    /// Stateful: sends states, consumes `apply`s.
    Stateful,
}

#[derive(Debug)]
struct HeldEffect {
    id: EffectId,
    effect: Effect,
    at: Instant,
    due: Option<Instant>,
}

/// The simulated tool process and its pipes.
#[derive(Debug)]
struct Tool {
    persona: Persona,
    alive: bool,
    exit_at: Option<Instant>,
    /// When the host was told of the exit: a real shell learns of it on
    /// reaping, which a jump of the clock may put long after `exit_at`.
    exit_reported: Option<Instant>,
    /// Bytes written to stdout, not yet handed to the host.
    pipe: VecDeque<u8>,
    stdout_closed: bool,
    /// When the host was told stdout ended.
    eof_reported: Option<Instant>,
    stdin_closed_by_tool: bool,
    stdin_eof: bool,
    got_cancel: bool,
    /// Bytes the host wrote to the tool's stdin that it has not read.
    unread: usize,
    /// The tool stops reading its stdin until then.
    deaf_until: Option<Instant>,
    /// Lines written that want an answer.
    asked: u64,
    ops_left: usize,
    sent_final: bool,
    /// A well-formed final message is in its stdout.
    wrote_final: bool,
    applies_seen: usize,
    /// Lines the tool wrote, in order, with whether each expects an answer
    /// (a request or an invalid line) and whether it is a final message.
    lines: VecDeque<(Vec<u8>, bool, bool)>,
    next_id: u64,
}

struct ToolWorld {
    swarm: Swarm,
    rng: ChaCha8Rng,
    now: Instant,
    step: u64,
    host: Host,
    /// What the host's heap tag held before the host was built.
    heap_base: u64,
    files: MemFiles,
    initial: MemFiles,
    /// The attacker racing file operations: its own randomness (the
    /// world's stream is the same whether or not it acts), the
    /// directories it moved away, and every change it made.
    race_rng: ChaCha8Rng,
    stashed: BTreeMap<ProjectPath, ProjectPath>,
    swaps: Vec<Value>,
    tool: Tool,
    held: Vec<HeldEffect>,
    cfg: Config,
    faults: BTreeMap<FaultKind, u64>,
    /// The checker's own line split of what the host received.
    partial: Vec<u8>,
    requested: BTreeMap<String, u64>,
    answered: BTreeMap<String, u64>,
    answers_total: u64,
    /// Lines expecting an answer delivered before the first final one.
    expected_before_final: Option<u64>,
    expected_so_far: u64,
    closed_at: Option<Instant>,
    term_sent_at: Option<Instant>,
    /// The host closed stdin while the tool was alive (as it knew).
    closed_before_exit: bool,
    finished: Option<(Value, i32)>,
    last_activity: Instant,
    user_signalled: bool,
    trace: Option<Vec<u8>>,
    wind_down_from: Option<u64>,
}

/// `record`: keep a trace, whose header notes `failure` when given.
pub(super) fn run(
    seed: u64,
    swarm: Swarm,
    bug: Option<PlantedBug>,
    record: Option<Option<Value>>,
) -> Outcome {
    let mut w = ToolWorld::new(seed, swarm, bug, record);
    let mut failure: Option<Violation> = None;
    while w.finished.is_none() {
        w.step += 1;
        let r = w.step_once().and_then(|()| w.check());
        if let Err(v) = r {
            failure = Some(v);
            break;
        }
    }
    if failure.is_none() {
        if let Err(v) = w.check_end() {
            failure = Some(v);
        }
    }
    Outcome {
        steps: w.step,
        now: w.now.as_micros(),
        faults: w.faults,
        failure: failure.map(|v| Failure {
            invariant: v.invariant.to_owned(),
            step: w.step,
            message: v.message,
            level: None,
            client: None,
        }),
        trace: w.trace,
    }
}

impl ToolWorld {
    fn new(seed: u64, swarm: Swarm, bug: Option<PlantedBug>, record: Option<Option<Value>>) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x746f_6f6c_0000_0000);
        let mut cfg = Config::new("sim-tool");
        cfg.arguments = json!({ "note": format!("args carry {SECRET}") });
        cfg.max_pending = swarm.max_queued_requests.clamp(1, 64);
        cfg.max_line = if swarm.max_frame < 64 * 1024 { 2048 } else { 64 * 1024 };
        cfg.max_grep_lines = [3, 50, 10_000][rng.gen_range(0..3)];
        cfg.stderr_tail = 4096;
        cfg.max_stdin_backlog =
            [1024, 16 * 1024, airlock_core::vfs::DEFAULT_MAX_STDIN_BACKLOG][rng.gen_range(0..3)];
        cfg.applies = (0..rng.gen_range(0..4)).map(|i| format!("apply-{i}")).collect();
        cfg.planted_bug = bug;
        let persona =
            [Persona::Polite, Persona::Stubborn, Persona::Immortal, Persona::Flooder, Persona::Stateful]
                [rng.gen_range(0..5)];
        let policy = match ToolPolicy::new(&policy_config()) {
            Ok(p) => p,
            Err(e) => panic!("the world's policy is valid: {e}"),
        };
        let files = project();
        let heap_base = heapcount::live(HEAP).unwrap_or(0);
        let host = HEAP.scope(|| Host::new(Instant::ZERO, cfg.clone(), policy));
        let tool = Tool {
            persona,
            alive: true,
            exit_at: None,
            exit_reported: None,
            pipe: VecDeque::new(),
            stdout_closed: false,
            eof_reported: None,
            stdin_closed_by_tool: false,
            stdin_eof: false,
            got_cancel: false,
            unread: 0,
            deaf_until: None,
            asked: 0,
            ops_left: swarm.ops_per_client.min(400),
            sent_final: false,
            wrote_final: false,
            applies_seen: 0,
            lines: VecDeque::new(),
            next_id: 1,
        };
        let mut w = ToolWorld {
            rng,
            now: Instant::ZERO,
            step: 0,
            host,
            heap_base,
            initial: files.clone(),
            race_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7261_6365_0000_0000),
            stashed: BTreeMap::new(),
            swaps: Vec::new(),
            files,
            tool,
            held: Vec::new(),
            cfg,
            faults: BTreeMap::new(),
            partial: Vec::new(),
            requested: BTreeMap::new(),
            answered: BTreeMap::new(),
            answers_total: 0,
            expected_before_final: None,
            expected_so_far: 0,
            closed_at: None,
            term_sent_at: None,
            closed_before_exit: false,
            finished: None,
            last_activity: Instant::ZERO,
            user_signalled: false,
            trace: record.is_some().then(Vec::new),
            wind_down_from: None,
            swarm,
        };
        if let Some(failure) = record {
            // The header rebuilds the host for `airlock replay`; `meta` the
            // world, for a rerun of its seed.
            let mut header = VfsHeader::new(w.cfg.clone(), &policy_config(), Instant::ZERO);
            header.seed = Some(seed);
            header.meta = Some(json!({
                "scenario": Scenario::Tool.to_string(),
                "swarm": &w.swarm,
                "persona": format!("{persona:?}"),
                "failure": failure,
            }));
            match serde_json::to_value(&header) {
                Ok(h) => w.log(&h),
                Err(e) => panic!("a trace header serializes: {e}"),
            }
        }
        // `init` comes out at once.
        if let Err(v) = w.drain() {
            panic!("init: {}", v.message);
        }
        w
    }

    fn log(&mut self, v: &Value) {
        if let Some(t) = &mut self.trace {
            t.extend_from_slice(v.to_string().as_bytes());
            t.push(b'\n');
        }
    }

    fn fires(&mut self, kind: FaultKind) -> bool {
        let rate = if self.winding_down() { 0 } else { self.swarm.rate(kind) };
        let hit = rate > 0 && self.rng.gen_range(0..PPM) < rate;
        if hit {
            *self.faults.entry(kind).or_default() += 1;
        }
        hit
    }

    fn chance(&mut self, ppm: u32) -> bool {
        !self.winding_down() && self.rng.gen_range(0..PPM) < ppm
    }

    fn winding_down(&self) -> bool {
        self.wind_down_from.is_some()
    }

    fn handle(&mut self, input: Input) -> Check {
        self.log(&json!({ "now": self.now.as_micros(), "input": input }));
        HEAP.scope(|| self.host.handle(self.now, input));
        self.drain()
    }

    fn step_once(&mut self) -> Check {
        if self.wind_down_from.is_none()
            && (self.step > self.swarm.max_steps as u64 || self.tool.ops_left == 0)
        {
            self.wind_down_from = Some(self.step);
        }
        if let Some(from) = self.wind_down_from {
            if self.step > from + WIND_DOWN_STEPS {
                return Err(violation(
                    "liveness",
                    format!("the run did not end {WIND_DOWN_STEPS} steps after winding down"),
                ));
            }
        }
        // The attacker swaps a link between two requests.
        if self.fires(FaultKind::SymlinkSwap) || self.chance(20_000) {
            let name = if self.rng.gen_bool(0.5) { "out/link" } else { "out/dir" };
            let target = LINK_TARGETS[self.rng.gen_range(0..LINK_TARGETS.len())];
            self.files.put(name, MemNode::Symlink(target.into()));
            self.log(&json!({ "note": { "swap": name, "to": target } }));
        }
        // Time.
        let dt = if self.winding_down() {
            Duration::from_millis(self.rng.gen_range(100..1500))
        } else if self.fires(FaultKind::ClockJump) {
            Duration::from_secs(self.rng.gen_range(1..120))
        } else {
            Duration::from_millis(self.rng.gen_range(0..200))
        };
        self.now = self.now.saturating_add(dt);
        self.tool_acts()?;
        self.deliver()?;
        self.complete_effects()?;
        if !self.user_signalled && self.chance(300) {
            self.user_signalled = true;
            let sig = [UserSignal::Int, UserSignal::Term, UserSignal::Hup][self.rng.gen_range(0..3)];
            // The host decides to end the run here, whether or not it can
            // still close the tool's stdin to show it.
            self.closed_at.get_or_insert(self.now);
            self.handle(Input::UserSignal(sig))?;
        }
        self.tool_reads()?;
        self.process_events()?;
        // As the production shell does: a tick only when the host asked.
        if self.host.poll_timeout().is_some_and(|t| t <= self.now) {
            self.handle(Input::Tick)?;
        }
        Ok(())
    }

    // ---- the tool ----

    fn write_line(&mut self, line: Vec<u8>, is_final: bool) {
        let expects = matches!(jsonrpc::parse(&line), Incoming::Request { .. } | Incoming::Invalid { .. })
            && !line.iter().all(|b| b.is_ascii_whitespace());
        if expects {
            self.tool.asked += 1;
        }
        self.tool.wrote_final |= is_final;
        let mut bytes = line.clone();
        bytes.push(b'\n');
        self.tool.pipe.extend(bytes);
        self.tool.lines.push_back((line, expects, is_final));
    }

    fn request(&mut self) -> Vec<u8> {
        let id: Value = if self.rng.gen_bool(0.1) {
            // A reused id, maybe one still pending.
            json!(self.rng.gen_range(0..self.tool.next_id.max(1)))
        } else if self.rng.gen_bool(0.05) {
            json!(format!("s{}", self.tool.next_id))
        } else {
            json!(self.tool.next_id)
        };
        self.tool.next_id += 1;
        let p = PATHS[self.rng.gen_range(0..PATHS.len())];
        let q = PATHS[self.rng.gen_range(0..PATHS.len())];
        let (method, params) = match self.rng.gen_range(0..14) {
            0..=2 => ("fs.read", json!({ "path": p })),
            3 => ("fs.write", json!({ "path": p, "content": format!("written {}", self.step) })),
            4 => ("fs.write", json!({ "path": p, "content": "AAH/", "encoding": "base64" })),
            5 => ("fs.exists", json!({ "path": p })),
            6 => ("fs.metadata", json!({ "path": p })),
            7 => ("fs.list_dir", json!({ "path": p })),
            8 => ("fs.delete", json!({ "path": p })),
            9 => ("fs.rename", json!({ "from": p, "to": q })),
            10 => (
                "fs.grep",
                json!({ "pattern": "fn|TODO|DENIED|Kx7", "paths": [p, q], "context": self.rng.gen_range(0..3) }),
            ),
            11 => {
                let urls = [
                    "http://127.0.0.1:9/api/v",
                    "http://127.0.0.1:9/apix",
                    "http://evil/",
                    "http://u@127.0.0.1:9/api",
                    "http://127.0.0.1:9/api/%2e%2e/apix",
                    "http://127.0.0.1:9/api/..%2fapix",
                    "http://127.0.0.1:9/api/../apix",
                    "http://127.0.0.1:9/api/a/../%76",
                ];
                let url = urls[self.rng.gen_range(0..urls.len())];
                let values = ["Bearer ${TOKEN}", "${HOME}", "${UNSET}"];
                let value = values[self.rng.gen_range(0..values.len())];
                ("http.get", json!({ "url": url, "headers": [{ "name": "Authorization", "value": value }] }))
            }
            12 => {
                let programs = ["echo", "sh", "/bin/echo"];
                let program = programs[self.rng.gen_range(0..programs.len())];
                let env = if self.rng.gen_bool(0.5) { "TOKEN" } else { "HOME" };
                ("process.run", json!({ "program": program, "args": ["x"], "envs": [env] }))
            }
            _ => ("fs.nope", json!({})),
        };
        json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string().into_bytes()
    }

    fn garbage(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..8) {
            0 => b"{not json".to_vec(),
            1 => vec![0xff, 0xfe, b'{', b'}'],
            2 => br#"[{"jsonrpc":"2.0","id":1,"method":"fs.read","params":{"path":"src"}}]"#.to_vec(),
            3 => br#"{"jsonrpc":"1.0","id":9,"method":"fs.read"}"#.to_vec(),
            4 => br#"{"jsonrpc":"2.0","id":null,"method":"fs.read"}"#.to_vec(),
            5 => br#"{"jsonrpc":"2.0","id":3,"result":{"echo":true}}"#.to_vec(),
            6 => br#"{"jsonrpc":"2.0","method":"whatever"}"#.to_vec(),
            _ => b"   ".to_vec(),
        }
    }

    fn final_line(&mut self) -> Vec<u8> {
        let lines: [&str; 4] = [
            r#"{"jsonrpc":"2.0","method":"result","params":{"content":"all done"}}"#,
            r#"{"jsonrpc":"2.0","method":"result","params":{"content":[{"type":"text","text":"done"}]}}"#,
            r#"{"jsonrpc":"2.0","method":"error","params":{"message":"it failed","transient":true}}"#,
            r#"{"jsonrpc":"2.0","method":"state","params":{"type":"stopped","result":"stopped"}}"#,
        ];
        lines[self.rng.gen_range(0..lines.len())].as_bytes().to_vec()
    }

    fn tool_acts(&mut self) -> Check {
        let t = &self.tool;
        if !t.alive || t.stdout_closed {
            return Ok(());
        }
        // Cooperative tools leave once told to, or at their stdin's end.
        if (t.got_cancel || t.stdin_eof) && t.persona == Persona::Polite
            || t.persona == Persona::Stateful && t.stdin_eof
        {
            if self.tool.exit_at.is_none() {
                let d = Duration::from_millis(self.rng.gen_range(0..3000));
                self.tool.exit_at = Some(self.now.saturating_add(d));
            }
            return Ok(());
        }
        if self.tool.sent_final {
            if self.tool.exit_at.is_none()
                && matches!(self.tool.persona, Persona::Polite | Persona::Flooder | Persona::Stateful)
            {
                // Some write their final message and exit at once, with
                // requests still unanswered.
                let d = if self.rng.gen_bool(0.3) { 0 } else { self.rng.gen_range(0..2000) };
                self.tool.exit_at = Some(self.now.saturating_add(Duration::from_millis(d)));
            }
            return Ok(());
        }
        // Early deaths and closes.
        if self.fires(FaultKind::ProcessDeath) {
            self.tool.exit_at = Some(self.now);
            return Ok(());
        }
        if self.fires(FaultKind::Eof) {
            self.tool.stdout_closed = true;
            return Ok(());
        }
        if self.chance(300) {
            self.tool.stdin_closed_by_tool = true;
        }
        // A tool that hangs: says nothing for a while.
        if self.chance(2_000) {
            self.now = self.now.saturating_add(Duration::from_secs(self.rng.gen_range(10..90)));
        }
        if self.fires(FaultKind::OversizedFrame) {
            let n = self.cfg.max_line + self.rng.gen_range(1..64);
            let mut l = vec![b'z'; n];
            if self.rng.gen_bool(0.5) {
                l[0] = b'{';
            }
            self.write_line(l, false);
            return Ok(());
        }
        if self.fires(FaultKind::PartialFlood) {
            // A line that never ends.
            let n = self.rng.gen_range(1..self.cfg.max_line);
            self.tool.pipe.extend(std::iter::repeat_n(b'p', n));
            self.tool.stdout_closed = self.rng.gen_bool(0.5);
            self.tool.sent_final = true;
            return Ok(());
        }
        if self.fires(FaultKind::CorruptFrame)
            || self.fires(FaultKind::NonUtf8Frame)
            || self.fires(FaultKind::SelfLoop)
        {
            let g = self.garbage();
            self.write_line(g, false);
        }
        if self.chance(10_000) {
            let n = self.rng.gen_range(1..20_000);
            self.handle(Input::ToolStderr(vec![b'e'; n]))?;
        }
        let waiting = self.tool.asked.saturating_sub(self.answers_total);
        let may_ask = match self.tool.persona {
            Persona::Flooder => true,
            _ => waiting < self.swarm.pipeline as u64,
        };
        if self.tool.ops_left > 0 && may_ask && self.rng.gen_bool(0.6) {
            let burst = if self.tool.persona == Persona::Flooder { self.rng.gen_range(1..20) } else { 1 };
            for _ in 0..burst.min(self.tool.ops_left) {
                self.tool.ops_left -= 1;
                let l = self.request();
                self.write_line(l, false);
                // Races its own cancel right behind it.
                if self.chance(30_000) {
                    let id = self.tool.next_id - 1;
                    self.write_line(
                        json!({"jsonrpc":"2.0","method":"cancel","params":{"id":id}})
                            .to_string()
                            .into_bytes(),
                        false,
                    );
                }
            }
        } else if self.chance(20_000) && waiting > 0 {
            let id = self.tool.next_id.saturating_sub(self.rng.gen_range(1..4));
            self.write_line(
                json!({"jsonrpc":"2.0","method":"cancel","params":{"id":id}}).to_string().into_bytes(),
                false,
            );
        }
        if self.tool.persona == Persona::Stateful
            && self.tool.ops_left.is_multiple_of(17)
            && self.rng.gen_bool(0.3)
        {
            let ty = if self.rng.gen_bool(0.5) { "running" } else { "waiting" };
            let l =
                json!({"jsonrpc":"2.0","method":"state","params":{"type":ty,"content":"step"}}).to_string();
            let is_final = self.tool.applies_seen >= self.cfg.applies.len();
            self.write_line(l.into_bytes(), false);
            if is_final {
                // No apply will come: the host cancels.
                self.tool.sent_final = true;
            }
        }
        if self.tool.ops_left == 0 && !self.tool.sent_final {
            let l = self.final_line();
            self.tool.sent_final = true;
            self.write_line(l, true);
        }
        Ok(())
    }

    /// Hand the tool's stdout to the host, within its budget.
    fn deliver(&mut self) -> Check {
        loop {
            let budget = self.host.stdout_budget();
            if budget == 0 || self.tool.pipe.is_empty() {
                break;
            }
            let mut n = budget.min(self.tool.pipe.len());
            if self.fires(FaultKind::SplitDelivery) {
                n = self.rng.gen_range(1..=n);
            } else if !self.fires(FaultKind::CoalescedDelivery) {
                // One line at a time, as a line-buffered writer would.
                if let Some(i) = self.tool.pipe.iter().position(|&b| b == b'\n') {
                    n = n.min(i + 1);
                }
            }
            let chunk: Vec<u8> = self.tool.pipe.drain(..n).collect();
            self.note_delivered(&chunk);
            self.handle(Input::ToolStdout(chunk))?;
            if !self.fires(FaultKind::CoalescedDelivery) {
                break;
            }
        }
        Ok(())
    }

    fn note_delivered(&mut self, chunk: &[u8]) {
        self.partial.extend_from_slice(chunk);
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            self.last_activity = self.now;
            let (_, expects, is_final) = self.tool.lines.pop_front().unwrap_or_default();
            match jsonrpc::parse(&line[..line.len() - 1]) {
                // An invalid line with a readable id is answered with it.
                Incoming::Request { id, .. } | Incoming::Invalid { id: Some(id), .. } => {
                    *self.requested.entry(id.key()).or_default() += 1;
                }
                _ => {}
            }
            if self.expected_before_final.is_none() {
                if is_final {
                    self.expected_before_final = Some(self.expected_so_far);
                } else if expects {
                    self.expected_so_far += 1;
                }
            }
        }
        if self.partial.len() > self.cfg.max_line + MAX_READ_CHUNK {
            // Over the limit: the host gave up on framing, so does the checker.
            self.partial.clear();
            self.tool.lines.clear();
        }
    }

    fn complete_effects(&mut self) -> Check {
        if self.held.is_empty() {
            return Ok(());
        }
        let reorder = self.fires(FaultKind::EffectReorder);
        let i = if reorder { self.rng.gen_range(0..self.held.len()) } else { 0 };
        if self.held[i].due.is_some_and(|d| self.now >= d)
            || self.winding_down() && self.held[i].due.is_some()
        {
            let h = self.held.remove(i);
            let result = self.run_effect(&h.effect)?;
            self.last_activity = self.now;
            self.handle(Input::EffectDone { id: h.id, result: result.clone() })?;
            // A result delivered twice must change nothing.
            if self.rng.gen_bool(0.02) {
                self.handle(Input::EffectDone { id: h.id, result })?;
            }
        }
        Ok(())
    }

    fn run_effect(&mut self, effect: &Effect) -> Result<EffectResult, Violation> {
        let leak = format!("output with {SECRET}").into_bytes();
        if self.fires(FaultKind::FsError) {
            let e = OpError::io(format!("simulated failure ({SECRET})"));
            return Ok(match effect {
                Effect::Fs(_) => EffectResult::Fs(Err(e)),
                Effect::Http(_) => EffectResult::Http(Err(e)),
                Effect::Process(_) => EffectResult::Process(Err(e)),
            });
        }
        Ok(match effect {
            Effect::Fs(op) => {
                let ppm = if self.winding_down() {
                    0
                } else {
                    self.swarm.rate(FaultKind::SymlinkSwap).max(RACE_PPM)
                };
                let before = self.swaps.len();
                let mut racing = Racing {
                    files: &mut self.files,
                    rng: &mut self.race_rng,
                    ppm,
                    held: Vec::new(),
                    stashed: &mut self.stashed,
                    swaps: &mut self.swaps,
                };
                let r = op.run(&mut racing, self.host.gate());
                // Copied out: logging borrows the world.
                let made: Vec<Value> = self.swaps[before..].to_vec();
                for swap in made {
                    self.log(&json!({ "note": { "race": swap } }));
                }
                self.check_files(op)?;
                EffectResult::Fs(r)
            }
            Effect::Http(_) => EffectResult::Http(Ok(HttpResponse {
                status: 200,
                headers: vec![Header { name: "x-echo".into(), value: leak.clone() }],
                body: if self.rng.gen_bool(0.5) { leak } else { [&[0xffu8, 0][..], &leak].concat() },
            })),
            Effect::Process(_) => EffectResult::Process(Ok(ProcessOutput {
                stdout: leak.clone(),
                stderr: [&[0xffu8][..], &leak].concat(),
                exit_code: Some(0),
                signal: None,
            })),
        })
    }

    /// The tool takes what the host wrote to its stdin, unless it went
    /// deaf for a while (then the host must stop and, in time, give up).
    fn tool_reads(&mut self) -> Check {
        if self.tool.deaf_until.is_none() && self.tool.alive && self.chance(3_000) {
            let d = Duration::from_secs(self.rng.gen_range(5..120));
            self.tool.deaf_until = Some(self.now.saturating_add(d));
        }
        if self.tool.deaf_until.is_some_and(|t| self.now < t) || !self.tool.alive {
            return Ok(());
        }
        self.tool.deaf_until = None;
        if self.tool.unread > 0 && !self.tool.stdin_closed_by_tool {
            let n = std::mem::take(&mut self.tool.unread);
            self.last_activity = self.now;
            self.handle(Input::ToolStdinWritten(n))?;
        }
        Ok(())
    }

    /// The tool process: reaping and the pipes' ends.
    fn process_events(&mut self) -> Check {
        if self.tool.alive && self.tool.exit_at.is_some_and(|t| self.now >= t) {
            self.tool.alive = false;
            self.tool.stdout_closed = true;
        }
        if !self.tool.alive && self.tool.exit_reported.is_none() {
            self.tool.exit_reported = Some(self.now);
            self.handle(Input::ToolExited(ToolExit::Code(0)))?;
        }
        if self.tool.stdout_closed && self.tool.pipe.is_empty() && self.tool.eof_reported.is_none() {
            self.tool.eof_reported = Some(self.now);
            self.handle(Input::ToolStdoutEof)?;
        }
        Ok(())
    }

    fn kill(&mut self, sig: Signal) {
        if !self.tool.alive {
            return;
        }
        let dies = match sig {
            Signal::Kill => true,
            Signal::Term => self.tool.persona != Persona::Immortal,
        };
        if dies {
            self.tool.alive = false;
            self.tool.stdout_closed = true;
            self.tool.exit_at = Some(self.now);
        }
    }

    // ---- the host's outputs ----

    fn drain(&mut self) -> Check {
        // What the host yields on learning its tool closed stdin is drained
        // at once, so a trace has every output after the input that caused
        // it and before the next.
        while self.drain_once()? {}
        Ok(())
    }

    /// Take the host's outputs; true if that told it the tool closed stdin.
    fn drain_once(&mut self) -> Result<bool, Violation> {
        let mut to_tool = 0usize;
        // All of them are logged before any is judged, so a trace that
        // ends at a violation still has every output its last input caused.
        let outputs: Vec<Output> =
            std::iter::from_fn(|| HEAP.scope(|| self.host.poll_output())).map(hand_out).collect();
        for o in &outputs {
            self.log(&json!({ "output": o }));
        }
        for o in outputs {
            match o {
                Output::ToolStdin(bytes) => {
                    to_tool += bytes.len();
                    self.tool.unread += bytes.len();
                    self.on_tool_stdin(&bytes)?;
                }
                Output::CloseStdin => {
                    self.closed_before_exit |= self.tool.exit_reported.is_none();
                    self.tool.stdin_eof = true;
                    self.closed_at.get_or_insert(self.now);
                }
                Output::Effect { id, effect } => {
                    self.check_effect(&effect)?;
                    let due = if self.rng.gen_bool(0.05) && !self.winding_down() {
                        None
                    } else {
                        Some(self.now.saturating_add(Duration::from_millis(self.rng.gen_range(0..2000))))
                    };
                    self.held.push(HeldEffect { id, effect, at: self.now, due });
                }
                Output::CancelEffect(id) => {
                    // A request ends here even if its answer cannot reach
                    // the tool: the silence clock starts over.
                    self.last_activity = self.now;
                    self.held.retain(|h| h.id != id)
                }
                Output::Signal(sig) => {
                    if sig == Signal::Term {
                        self.term_sent_at.get_or_insert(self.now);
                    }
                    // The host has decided (its stdin may be closed by the tool already).
                    self.closed_at.get_or_insert(self.now);
                    self.kill(sig)
                }
                Output::Finished { line, exit_status } => {
                    let v: Value = serde_json::from_slice(&line)
                        .map_err(|e| violation("outcome", format!("the outcome line is not JSON: {e}")))?;
                    if self.finished.is_some() {
                        return Err(violation("outcome", "finished twice".into()));
                    }
                    self.finished = Some((v, exit_status));
                }
            }
        }
        let bound = (self.cfg.max_pending + 4) * (self.cfg.max_line + 1);
        if to_tool > bound {
            return Err(violation(
                "bounded",
                format!("{to_tool} bytes to the tool in one step (bound {bound})"),
            ));
        }
        let stdin_closed = self.tool.stdin_closed_by_tool && to_tool > 0;
        if stdin_closed {
            self.log(&json!({ "now": self.now.as_micros(), "input": "tool_stdin_closed" }));
            self.tool.unread = 0;
            HEAP.scope(|| self.host.handle(self.now, Input::ToolStdinClosed));
        }
        let backlog = self.cfg.max_stdin_backlog + bound;
        if self.tool.unread > backlog {
            return Err(violation(
                "bounded",
                format!("{} bytes wait unread for the tool (bound {backlog})", self.tool.unread),
            ));
        }
        Ok(stdin_closed)
    }

    fn on_tool_stdin(&mut self, bytes: &[u8]) -> Check {
        if !bytes.ends_with(b"\n") {
            return Err(violation("one_response", "a partial line to the tool".into()));
        }
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line).map_err(|e| {
                violation("one_response", format!("the host wrote a line that is not JSON: {e}"))
            })?;
            check_clean(&v)?;
            if v.get("result").is_some() || v.get("error").is_some() {
                self.answers_total += 1;
                self.last_activity = self.now;
                if let Some(id) = v.get("id").filter(|i| !i.is_null()) {
                    let key = id.to_string();
                    let n = self.answered.entry(key.clone()).or_default();
                    *n += 1;
                    let asked = self.requested.get(&key).copied().unwrap_or(0);
                    if *n > asked {
                        return Err(violation(
                            "one_response",
                            format!("id {key} answered {n} times, asked {asked} times"),
                        ));
                    }
                }
            }
            match v.get("method").and_then(Value::as_str) {
                Some("cancel") => self.tool.got_cancel = true,
                Some("apply") => self.tool.applies_seen += 1,
                _ => {}
            }
        }
        Ok(())
    }

    // ---- checkers ----

    fn check_effect(&self, effect: &Effect) -> Check {
        match effect {
            Effect::Fs(op) => {
                for (p, write) in op.paths() {
                    let s = p.as_str();
                    let bad = s.starts_with('/')
                        || s.split('/').any(|c| c == "..")
                        || secret_by_name(s)
                        || write && protected_by_name(s)
                        || s.ends_with(".key")
                        || s == "private"
                        || s.starts_with("private/")
                        || write && !(s == "out" || s.starts_with("out/"));
                    if bad {
                        return Err(violation("policy", format!("a file effect on {s:?} (write {write})")));
                    }
                }
                Ok(())
            }
            Effect::Http(r) => {
                // Read as a server that decodes the whole path, then
                // removes dot segments, would.
                let ok = r
                    .url
                    .strip_prefix("http://127.0.0.1:9")
                    .map(server_path)
                    .is_some_and(|p| p == "/api" || p.starts_with("/api/"));
                if ok {
                    Ok(())
                } else {
                    Err(violation("policy", format!("an HTTP effect to {}", r.url)))
                }
            }
            Effect::Process(p) => {
                if p.program.as_os_str() == "/bin/echo"
                    && p.env.iter().all(|(k, _)| k == "PATH" || k == "TOKEN")
                {
                    Ok(())
                } else {
                    Err(violation("policy", format!("a process effect {p:?}")))
                }
            }
        }
    }

    /// What a backend did: nothing outside `out/` changed, and no
    /// protected path (invariant 13) anywhere.
    fn check_files(&self, op: &FsOp) -> Check {
        for (k, v) in self.initial.nodes() {
            let s = k.as_str();
            if self.files.nodes().get(k) != Some(v) {
                if protected_by_name(s) {
                    return Err(violation("protected_paths", format!("{k} changed under {op:?}")));
                }
                if !(s == "out" || s.starts_with("out/")) {
                    return Err(violation("policy", format!("{k} changed under {op:?}")));
                }
            }
        }
        for k in self.files.nodes().keys() {
            let s = k.as_str();
            if self.initial.nodes().contains_key(k) {
                continue;
            }
            if protected_by_name(s) {
                return Err(violation("protected_paths", format!("{s} appeared under {op:?}")));
            }
            if !(s == "out" || s.starts_with("out/")) {
                return Err(violation("policy", format!("{s} appeared under {op:?}")));
            }
        }
        Ok(())
    }

    fn check(&self) -> Check {
        let unanswered = self.host.unanswered();
        if unanswered > self.cfg.max_pending {
            return Err(violation(
                "bounded",
                format!("{unanswered} unanswered requests (max {})", self.cfg.max_pending),
            ));
        }
        let held = self.host.buffered_bytes();
        let bound = self.cfg.max_line + 1 + MAX_READ_CHUNK + self.cfg.stderr_tail;
        if held > bound {
            return Err(violation("bounded", format!("the host holds {held} bytes (bound {bound})")));
        }
        if let Some(live) = heapcount::live(HEAP) {
            self.host
                .heap_check(live.wrapping_sub(self.heap_base))
                .map_err(|m| violation("bounded_memory", format!("the host {m}")))?;
        }
        if self.finished.is_some() {
            return Ok(());
        }
        if unanswered > 0 && self.held.is_empty() && self.host.poll_timeout().is_none() {
            return Err(violation(
                "liveness",
                format!("{unanswered} requests wait with no effect and no timer"),
            ));
        }
        for h in &self.held {
            if self.now >= h.at.saturating_add(self.cfg.op_timeout) {
                return Err(violation(
                    "liveness",
                    format!("effect {} outstanding since {}us, past --op-timeout", h.id.0, h.at.as_micros()),
                ));
            }
        }
        // Nothing pending, or the host paused on a tool that does not read.
        // Once stdout has ended with everything answered, the tool can say
        // nothing more: the host ends the run by that, not by its silence
        // (below).
        let stalled = self.tool.unread > self.cfg.max_stdin_backlog;
        let idle = unanswered == 0 || stalled;
        if self.closed_at.is_none()
            && (self.tool.eof_reported.is_none() || stalled)
            && idle
            && self.held.is_empty()
            && self.tool.alive
            && self.now > self.last_activity.saturating_add(self.cfg.timeout)
        {
            return Err(violation("liveness", "a silent tool was not stopped after --timeout".into()));
        }
        // A handle ran at `now` (every step ends with one), so every timer
        // due by `now` has fired.
        if let Some(c) = self.closed_at {
            let grace = self.cfg.cancel_grace.max(self.cfg.kill_grace);
            if self.tool.alive && self.term_sent_at.is_none() && self.now >= c.saturating_add(grace) {
                return Err(violation(
                    "reaped",
                    format!("no SIGTERM {grace:?} after stdin closed at {}us", c.as_micros()),
                ));
            }
        }
        // Its stdout ended, the host reads and answers what is left, then
        // gives the tool its grace before SIGTERM; with the tool's stdin
        // already closed by the tool, nothing shows that decision before
        // the signal. Every event that lets the host read on moves
        // `last_activity`, so the grace runs from the later of the two.
        if let Some(e) = self.tool.eof_reported {
            let grace = self.cfg.cancel_grace.max(self.cfg.kill_grace);
            let by = e.max(self.last_activity).saturating_add(grace);
            let done = unanswered == 0 && !stalled && self.held.is_empty();
            if done && self.tool.alive && self.term_sent_at.is_none() && self.now >= by {
                return Err(violation(
                    "reaped",
                    format!("no SIGTERM by {}us, its stdout ended at {}us", by.as_micros(), e.as_micros()),
                ));
            }
        }
        if let Some(t) = self.term_sent_at {
            if self.tool.alive && self.now >= t.saturating_add(self.cfg.kill_grace) {
                return Err(violation(
                    "reaped",
                    format!("the tool outlived SIGTERM at {}us by --kill-grace", t.as_micros()),
                ));
            }
        }
        // From when the host heard of the exit: it cannot act before.
        if let Some(t) = self.tool.exit_reported {
            if self.now > t.saturating_add(self.cfg.kill_grace + Duration::from_secs(3)) {
                return Err(violation("liveness", "the host did not finish after the tool's exit".into()));
            }
        }
        Ok(())
    }

    fn check_end(&self) -> Check {
        let Some((v, code)) = &self.finished else { return Ok(()) };
        let outcome = v["outcome"].as_str().unwrap_or("");
        let want = match outcome {
            "completed" => 0,
            "error" => 1,
            "no_result" => 3,
            "protocol_error" => 4,
            "waiting" => 5,
            "timeout" => 124,
            "cancelled" => *code,
            other => return Err(violation("outcome", format!("unknown outcome {other:?}"))),
        };
        if *code != want {
            return Err(violation("outcome", format!("{outcome} exits {code}")));
        }
        // A final message the tool wrote is never lost, whatever came after
        // it (an exit with requests pending, stdout's end).
        if self.expected_before_final.is_some() && outcome == "no_result" {
            return Err(violation(
                "outcome",
                "the tool's final message was delivered, yet the outcome is no_result".into(),
            ));
        }
        // (A tool that exits before the host decided needs no answers.)
        if matches!(outcome, "completed" | "error")
            && !self.tool.stdin_closed_by_tool
            && self.closed_before_exit
        {
            if let Some(expected) = self.expected_before_final {
                if self.answers_total != expected {
                    return Err(violation(
                        "one_response",
                        format!(
                            "{expected} lines wanted an answer before the final message, {} answers",
                            self.answers_total
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `text` shows the secret in any form: plain, hex, base64, UTF-16
/// (the oracle's literal forms), or one of the encodings planted whole.
fn secret_in(text: &[u8]) -> Option<String> {
    let mark = airlock_core::vfs::scrub::REDACTED.as_bytes();
    if let Some(form) = visible(text, SECRET.as_bytes(), mark) {
        return Some(form);
    }
    ENCS.iter().enumerate().find_map(|(i, enc)| {
        let form = encode(SECRET, *enc, i as u8);
        survives(text, &form, false, mark).then(|| format!("{enc:?}"))
    })
}

fn check_clean(v: &Value) -> Check {
    match v {
        Value::String(s) => {
            if let Some(form) = secret_in(s.as_bytes()) {
                return Err(violation("secret", format!("the secret reached the tool ({form}): {s}")));
            }
            if s.contains(MARKER) {
                return Err(violation("policy", format!("a denied file's content reached the tool: {s}")));
            }
            if let Ok(raw) = STANDARD.decode(s) {
                let text = String::from_utf8_lossy(&raw);
                if let Some(form) = secret_in(&raw) {
                    return Err(violation(
                        "secret",
                        format!("the secret reached the tool in base64 ({form}): {s}"),
                    ));
                }
                if text.contains(MARKER) {
                    return Err(violation(
                        "policy",
                        format!("a denied file's content reached the tool in base64: {s}"),
                    ));
                }
            }
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(check_clean),
        Value::Object(o) => o.values().try_for_each(check_clean),
        _ => Ok(()),
    }
}

/// A URL path as an ordinary web server resolves it: wholly
/// percent-decoded (`%2f` included), then its dot segments removed.
fn server_path(url_rest: &str) -> String {
    let path = url_rest.split('?').next().unwrap_or("");
    let b = path.as_bytes();
    let mut dec = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = |x: Option<&u8>| x.and_then(|&x| (x as char).to_digit(16));
        match (b[i], hex(b.get(i + 1)), hex(b.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                dec.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                dec.push(c);
                i += 1;
            }
        }
    }
    let dec = String::from_utf8_lossy(&dec).into_owned();
    let mut out: Vec<&str> = Vec::new();
    for seg in dec.split(['/', '\\']) {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// The project as the host's file operations meet it, with an attacker
/// (the tool, writing `out/` from outside the host) that changes it
/// between any two of an operation's steps, at the points the kernel
/// would let it: it moves a directory under `out/` away and leaves a
/// symlink in its place (or moves it back), or turns a file into a
/// directory. A held directory is a descriptor: it follows its
/// directory wherever that is moved, as an open `O_PATH` descriptor does.
struct Racing<'a> {
    files: &'a mut MemFiles,
    rng: &'a mut ChaCha8Rng,
    /// Chance of a change before each step, in parts per million.
    ppm: u32,
    /// Held directories, by handle: where each is now.
    held: Vec<ProjectPath>,
    /// Directories moved away, by the symlink left in their place.
    stashed: &'a mut BTreeMap<ProjectPath, ProjectPath>,
    /// Every change made so far in the run.
    swaps: &'a mut Vec<Value>,
}

/// Where the attacker points a symlink left in a directory's place.
const RACE_TARGETS: &[&str] = &["../private", "/proj/private", "../src", "/proj/src", "."];

impl Racing<'_> {
    fn hold(&mut self, p: ProjectPath) -> usize {
        self.held.push(p);
        self.held.len() - 1
    }

    fn dir(&self, d: usize) -> Result<&ProjectPath, Refusal> {
        self.held.get(d).ok_or_else(|| Refusal::Fs("unknown descriptor".into()))
    }

    fn moved(&mut self, from: &ProjectPath, to: &ProjectPath) {
        let prefix = format!("{}/", from.as_str());
        for h in &mut self.held {
            if h == from || h.as_str().starts_with(&prefix) {
                let rest = h.as_str()[from.as_str().len()..].trim_start_matches('/').to_string();
                *h = ProjectPath::from_parts([to.as_str(), rest.as_str()]);
            }
        }
    }

    /// Maybe change the project before the next step.
    fn race(&mut self) {
        if self.ppm == 0 || self.rng.gen_range(0..PPM) >= self.ppm {
            return;
        }
        let under_out: Vec<(ProjectPath, MemNode)> = self
            .files
            .nodes()
            .iter()
            // Protected paths are the tool's to leave alone, not the
            // attacker's: only what the tool does to them is checked.
            .filter(|(k, _)| {
                k.as_str().starts_with("out/")
                    && !k.as_str().contains(".moved")
                    && !protected_by_name(k.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if under_out.is_empty() {
            return;
        }
        let (victim, node) = under_out[self.rng.gen_range(0..under_out.len())].clone();
        match node {
            MemNode::Dir => {
                let stash =
                    ProjectPath::from_parts([
                        format!("{}.moved{}", victim.as_str(), self.swaps.len()).as_str()
                    ]);
                if self.files.move_tree(&victim, &stash) {
                    self.moved(&victim, &stash);
                    let target = RACE_TARGETS[self.rng.gen_range(0..RACE_TARGETS.len())];
                    self.files.put(victim.as_str(), MemNode::Symlink(target.into()));
                    self.swaps.push(json!({ "dir": victim.as_str(), "to": target }));
                    self.stashed.insert(victim, stash);
                }
            }
            MemNode::Symlink(_) => {
                if let Some(stash) = self.stashed.remove(&victim) {
                    let doomed =
                        ProjectPath::from_parts([
                            format!("{}.gone{}", victim.as_str(), self.swaps.len()).as_str()
                        ]);
                    // The link is moved aside, then the directory back.
                    if self.files.move_tree(&victim, &doomed) && self.files.move_tree(&stash, &victim) {
                        self.moved(&stash, &victim);
                        self.swaps.push(json!({ "dir_back": victim.as_str() }));
                    }
                }
            }
            MemNode::File(_) => {
                self.files.put(victim.as_str(), MemNode::Dir);
                self.swaps.push(json!({ "file_to_dir": victim.as_str() }));
            }
            MemNode::Other => {}
        }
    }
}

impl Namespace for Racing<'_> {
    type Dir = usize;

    fn anchor(&mut self, index: usize) -> Result<usize, Refusal> {
        self.race();
        let root = self.files.anchor(index)?;
        Ok(self.hold(root))
    }

    fn lookup(&mut self, dir: &usize, name: &OsStr) -> Result<Entry<usize>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        Ok(match self.files.lookup(&d, name)? {
            Entry::Dir(p) => Entry::Dir(self.hold(p)),
            Entry::Symlink(t) => Entry::Symlink(t),
            Entry::NotDir => Entry::NotDir,
            Entry::Missing => Entry::Missing,
        })
    }
}

impl ProjectNs for Racing<'_> {
    fn stat(&mut self, dir: &usize, name: &OsStr) -> Result<Node, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        self.files.stat(&d, name)
    }

    fn read(&mut self, dir: &usize, name: &OsStr, max: usize) -> Result<Opened<Vec<u8>>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        ProjectNs::read(self.files, &d, name, max)
    }

    fn write(&mut self, dir: &usize, name: &OsStr, content: &[u8]) -> Result<Opened<()>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        ProjectNs::write(self.files, &d, name, content)
    }

    fn open_dir(&mut self, dir: &usize, name: &OsStr) -> Result<Opened<usize>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        Ok(match self.files.open_dir(&d, name)? {
            Opened::Done(p) => Opened::Done(self.hold(p)),
            Opened::TooLarge(n) => Opened::TooLarge(n),
            Opened::Changed => Opened::Changed,
        })
    }

    fn list(&mut self, dir: &usize) -> Result<Vec<(String, Node)>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        self.files.list(&d)
    }

    fn mkdir(&mut self, dir: &usize, name: &OsStr) -> Result<(), Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        self.files.mkdir(&d, name)
    }

    fn unlink(&mut self, dir: &usize, name: &OsStr) -> Result<Opened<()>, Refusal> {
        self.race();
        let d = self.dir(*dir)?.clone();
        self.files.unlink(&d, name)
    }

    fn rename(
        &mut self,
        from_dir: &usize,
        from: &OsStr,
        to_dir: &usize,
        to: &OsStr,
    ) -> Result<Opened<bool>, Refusal> {
        self.race();
        let (f, t) = (self.dir(*from_dir)?.clone(), self.dir(*to_dir)?.clone());
        ProjectNs::rename(self.files, &f, from, &t, to)
    }
}
