//! The `toolexec` scenario: one ToolExec server's [`Exchange`]s and its
//! connection [`Gate`], driven by simulated clients and simulated tools.
//!
//! The world plays the shell: it accepts connections only under the gate,
//! feeds heads and (split) bodies, spawns tools, moves bytes from each tool's
//! bounded pipe when the machine grants a read, hands streamed bytes to
//! clients that read fast, slowly or not at all for a while, delivers
//! signals to whole process groups and reaps. Clients speak v1, v2 with and
//! without `TE: trailers`, send bad tokens, protocols, paths, methods, tools
//! and bodies, and leave at every stage. Tools flood, hang (silent or after
//! output), ignore SIGTERM, leave a grandchild holding the pipe, or die by
//! a signal. Connections arrive in floods; the clock jumps.
//!
//! After every step the checkers below compare what clients received with
//! what tools wrote, and what the machine did with what the spec demands.
//! `bounded_memory` checks the bytes the server's exchanges really hold on
//! the heap, counted by the harness's allocator
//! (`airlock_core::heapcount`, each block charged to the server when an
//! exchange allocated it), against what their limits allow plus a stated
//! constant (`Gate::heap_check`); without the counting allocator it
//! passes, and the counts are read only there, so a seed's world is the
//! same either way.

use crate::swarm::FaultKind;
use crate::Failure;
use airlock_core::heapcount::{self as heapcount, Tag};
use airlock_core::time::Instant;
use airlock_core::toolexec::{
    validate_token, Config, Exchange, ExitStatus, Gate, Input, Mode, Output, RequestHead, Response, Signal,
    SpawnError, EXIT_CODE_TIMEOUT, STREAM_WINDOW,
};
use airlock_core::trace::toolexec as trace;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Bytes a tool's pipe holds before its writes block (Linux's default).
pub const PIPE_CAPACITY: usize = 64 * 1024;
/// Largest step of simulated time, in microseconds.
const MAX_STEP_US: u64 = 20_000;
/// Steps after the last arrival before the world must have drained.
const WIND_DOWN_STEPS: u64 = 200_000;
const TOKEN: &[u8] = b"sim-token-0123456789";
const WORKDIR: &[u8] = b"/work";

/// A deliberate defect between the machine and the world, so each checker
/// is shown to catch its class of bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolexecBug {
    /// The second streamed chunk of an exchange is lost.
    DropChunk,
    /// A whole answer is sent twice.
    DoubleRespond,
    /// A 403 spawns the tool anyway.
    SpawnOnReject,
    /// A bad token is reported after the tool check (403 instead of 401).
    AuthLate,
    /// SIGTERM is never sent.
    NoTerm,
    /// SIGKILL is never sent after SIGTERM.
    NoKill,
    /// Read credit ignores the stream window.
    OverCredit,
    /// The gate lets every connection in.
    NoCap,
    /// A buffered answer reserves its whole `max_buffered` at the tool's
    /// first output, while only the bytes read are counted.
    UncountedBuffer,
}

/// The server's heap tag (0 is the world's own).
const HEAP: Tag = Tag::new(1);

/// An output's bytes are the world's once handed out, as a shell's write
/// buffers would be.
fn hand_out(o: Output) -> Output {
    match &o {
        Output::SendChunk(b) => {
            heapcount::retag(b, Tag::HARNESS);
            o
        }
        Output::Respond(_) | Output::SendHead(_) | Output::Spawn(_) => Tag::HARNESS.scope(|| o.clone()),
        _ => o,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Defect {
    Path,
    Method,
    NoAuth,
    BadToken,
    TwoAuth,
    NoProto,
    BadProto,
    BigLength,
    BigChunked,
    NoTool,
    TwoTools,
    BadCwd,
    Nul,
    NotAllowed,
    Missing,
}

impl Defect {
    /// The status the first defect (in the check order) earns.
    fn status(self) -> u16 {
        match self {
            Defect::Path => 404,
            Defect::Method => 405,
            Defect::NoAuth | Defect::BadToken | Defect::TwoAuth => 401,
            Defect::NoProto | Defect::BadProto => 426,
            Defect::BigLength | Defect::BigChunked => 413,
            Defect::NoTool | Defect::TwoTools | Defect::BadCwd | Defect::Nul => 400,
            Defect::NotAllowed => 403,
            Defect::Missing => 409,
        }
    }
    fn auth(self) -> bool {
        matches!(self, Defect::NoAuth | Defect::BadToken | Defect::TwoAuth)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToolKind {
    /// Writes some chunks, exits with a code.
    Talk,
    /// Writes far more than a pipe and a stream window hold.
    Flood,
    HangSilent,
    HangAfterOutput,
    IgnoresTerm,
    /// Exits, leaving a grandchild that holds the pipe until the group dies.
    Grandchild,
    DiesBySignal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    Fast,
    Slow,
    /// Takes nothing for this long after the head arrives, then everything.
    Stalled {
        for_us: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    Never,
    BeforeHead,
    AfterHead,
    MidBody,
    /// At this time after the tool started.
    Running(u64),
    /// After receiving this many bytes.
    AfterBytes(u64),
}

struct Plan {
    proto: u8,
    te: bool,
    defects: Vec<Defect>,
    head: RequestHead,
    body: Vec<u8>,
    reader: Reader,
    leave: Leave,
    tool: ToolKind,
    /// Chunks the tool writes, in order.
    script: Vec<usize>,
    exit: ExitStatus,
}

impl Plan {
    fn expected_status(&self) -> Option<u16> {
        self.defects.iter().map(|d| (d.status(), *d)).min_by_key(|(_, d)| order(*d)).map(|(s, _)| s)
    }
}

fn order(d: Defect) -> u8 {
    match d.status() {
        404 => 0,
        405 => 1,
        401 => 2,
        426 => 3,
        413 => 4,
        400 => 5,
        403 => 6,
        _ => 7,
    }
}

struct Tool {
    kind: ToolKind,
    script: VecDeque<usize>,
    next_write_at: u64,
    /// Every byte the tool wrote, in order.
    written: Vec<u8>,
    /// Written, not yet read by the machine.
    pipe: VecDeque<u8>,
    alive: bool,
    grandchild: bool,
    status: Option<ExitStatus>,
    reaped: bool,
    exit: ExitStatus,
}

impl Tool {
    fn writers(&self) -> bool {
        self.alive || self.grandchild
    }
}

#[derive(Default)]
struct Seen {
    status: Option<u16>,
    answers: u32,
    body: Vec<u8>,
    trailer: Option<i32>,
    head_sent: bool,
    head_at: Option<u64>,
    /// Streamed bytes the client has not read yet.
    unread: u64,
    done: bool,
    spawn_requested: bool,
    term_at: Option<u64>,
    kill_at: Option<u64>,
}

struct Conn {
    plan: Plan,
    arrive_at: u64,
    accepted: bool,
    ex: Option<Exchange>,
    head_fed: bool,
    head_fed_at: u64,
    body_sent: usize,
    body_allowed: bool,
    body_end_fed: bool,
    read_max: Option<usize>,
    tool: Option<Tool>,
    spawned_at: Option<u64>,
    /// `jumped` when the tool started.
    jumped_at_spawn: u64,
    gone: bool,
    closed: bool,
    chunks_seen: u32,
    seen: Seen,
    /// An over-limit buffered answer (507) ends the run like a timeout.
    must_stop_at: Option<u64>,
    /// Time the client held a full stream window: the server may not read
    /// the tool's pipe then (no byte is dropped and there is no write
    /// timeout), so the answer's deadline moves by it.
    held_us: u64,
    /// Only with `ToolexecBug::UncountedBuffer`: the server's, counted
    /// nowhere.
    read_ahead: Vec<u8>,
}

pub struct ToolexecWorld {
    rng: ChaCha8Rng,
    now: u64,
    step: u64,
    config: Arc<Config>,
    gate: Gate,
    cap: usize,
    conns: Vec<Conn>,
    bug: Option<ToolexecBug>,
    faults: BTreeMap<FaultKind, u64>,
    clock_jumps: bool,
    backward: bool,
    trace: Option<String>,
    last_arrival: u64,
    /// Simulated time skipped by clock jumps so far: time in which nothing
    /// could have reacted, so the liveness bound stretches by it.
    jumped: u64,
    /// What the server's heap tag held before its first exchange.
    heap_base: u64,
}

pub struct ToolexecOutcome {
    pub steps: u64,
    pub now: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub failure: Option<Failure>,
    pub trace: Option<Vec<u8>>,
}

fn fail(invariant: &str, step: u64, conn: Option<usize>, message: String) -> Failure {
    Failure { invariant: invariant.to_owned(), step, message, level: None, client: conn.map(|c| c as u64) }
}

const TOOLS: [&str; 4] = ["make", "cargo", "py", "missing"];

impl ToolexecWorld {
    pub fn new(seed: u64, bug: Option<ToolexecBug>, record: bool) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7001_e8ec);
        let mut config = Config::new(validate_token(TOKEN).expect("a valid token"), WORKDIR.to_vec());
        for t in TOOLS {
            config.add_tool_spec(t).expect("a valid tool name");
        }
        config.timeout = Duration::from_millis(rng.gen_range(200..3_000));
        config.kill_grace = Duration::from_millis(rng.gen_range(50..1_000));
        config.max_body = rng.gen_range(256..4096);
        config.max_buffered = *[16 * 1024, 200 * 1024, 4 << 20].choose(&mut rng).unwrap_or(&(4 << 20));
        let cap = rng.gen_range(1..=8);
        let clients = rng.gen_range(4..40);
        let flood = rng.gen_bool(0.3);
        let clock_jumps = rng.gen_bool(0.3);
        let backward = rng.gen_bool(0.3);
        let config = Arc::new(config);
        let trace = record.then(|| {
            let mut header = trace::Header::new(&config);
            header.seed = Some(seed);
            let mut meta = serde_json::json!({ "scenario": "toolexec" });
            // The bug is the world's, not the machine's: it is named in the
            // meta so a rerun of the trace plants it again.
            if let Some(bug) = bug {
                meta["planted"] = serde_json::json!(bug);
            }
            header.meta = Some(meta);
            trace::header_line(&header)
        });
        let mut world = ToolexecWorld {
            rng,
            now: 0,
            step: 0,
            gate: Gate::new(cap),
            cap,
            conns: Vec::new(),
            bug,
            faults: BTreeMap::new(),
            clock_jumps,
            backward,
            trace,
            last_arrival: 0,
            jumped: 0,
            config,
            heap_base: heapcount::live(HEAP).unwrap_or(0),
        };
        let mut t = 0;
        for _ in 0..clients {
            // A flood arrives all at once; otherwise clients trickle in.
            if !flood {
                t += world.rng.gen_range(0..400_000);
            }
            let plan = world.plan();
            world.conns.push(Conn {
                plan,
                arrive_at: t,
                accepted: false,
                ex: None,
                head_fed: false,
                head_fed_at: 0,
                body_sent: 0,
                body_allowed: false,
                body_end_fed: false,
                read_max: None,
                tool: None,
                spawned_at: None,
                jumped_at_spawn: 0,
                gone: false,
                closed: false,
                chunks_seen: 0,
                seen: Seen::default(),
                must_stop_at: None,
                held_us: 0,
                read_ahead: Vec::new(),
            });
        }
        world.last_arrival = t;
        let c = world.config.clone();
        world.log(format_args!(
            "world cap={cap} clients={clients} timeout={:?} grace={:?} max_body={} max_buffered={}",
            c.timeout, c.kill_grace, c.max_body, c.max_buffered
        ));
        world
    }

    /// A note for a person reading the trace (replay skips it).
    fn log(&mut self, args: std::fmt::Arguments<'_>) {
        if let Some(t) = &mut self.trace {
            t.push_str(&trace::note_line(&format!("{} {} {}", self.step, self.now, args)));
        }
    }

    /// What the exchange of connection `conn` was handed, as replay feeds it.
    fn record_input(&mut self, now: Instant, input: &trace::ServerInput) {
        if let Some(t) = &mut self.trace {
            t.push_str(&trace::input_line(now, input));
        }
    }

    fn fault(&mut self, kind: FaultKind) {
        *self.faults.entry(kind).or_default() += 1;
    }

    fn plan(&mut self) -> Plan {
        let rng = &mut self.rng;
        let proto = if rng.gen_bool(0.5) { 2 } else { 1 };
        let te = proto == 2 && rng.gen_bool(0.8);
        let mut defects = Vec::new();
        if rng.gen_bool(0.35) {
            let all = [
                Defect::Path,
                Defect::Method,
                Defect::NoAuth,
                Defect::BadToken,
                Defect::TwoAuth,
                Defect::NoProto,
                Defect::BadProto,
                Defect::BigLength,
                Defect::BigChunked,
                Defect::NoTool,
                Defect::TwoTools,
                Defect::BadCwd,
                Defect::Nul,
                Defect::NotAllowed,
                Defect::Missing,
            ];
            for _ in 0..rng.gen_range(1..=3) {
                if let Some(d) = all.choose(rng) {
                    if !defects.contains(d) {
                        defects.push(*d);
                    }
                }
            }
        }
        let has = |d: Defect| defects.contains(&d);
        let tool_name: &[u8] = if has(Defect::NotAllowed) {
            b"rm"
        } else if has(Defect::Missing) {
            b"missing"
        } else {
            [&b"make"[..], b"cargo", b"py"][rng.gen_range(0..3)]
        };
        let mut form = form_urlencoded::Serializer::new(String::new());
        if !has(Defect::NoTool) {
            form.append_pair("tool", &String::from_utf8_lossy(tool_name));
        }
        if has(Defect::TwoTools) {
            form.append_pair("tool", "make");
            if has(Defect::NoTool) {
                form.append_pair("tool", "make");
            }
        }
        if has(Defect::BadCwd) {
            form.append_pair("cwd", "/etc");
        } else if rng.gen_bool(0.3) {
            form.append_pair("cwd", "/work/sub");
        }
        for i in 0..rng.gen_range(0..4) {
            form.append_pair("arg", &format!("a{i} =&%"));
        }
        let mut body = form.finish().into_bytes();
        if has(Defect::Nul) {
            body.extend_from_slice(b"&arg=x%00y");
        }
        if has(Defect::BigChunked) {
            body.extend(std::iter::repeat_n(b'z', self.config.max_body as usize + 1).collect::<Vec<u8>>());
            body.splice(0..0, b"junk=".iter().copied());
        }
        let rng = &mut self.rng;
        let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
        let token = [&b"Bearer "[..], TOKEN].concat();
        if has(Defect::BadToken) {
            headers.push(("authorization".into(), b"Bearer not-the-token".to_vec()));
        } else if has(Defect::TwoAuth) {
            headers.push(("authorization".into(), token.clone()));
            headers.push(("authorization".into(), token));
        } else if !has(Defect::NoAuth) {
            let v = match rng.gen_range(0..3) {
                0 => token,
                1 => [&b"Token x="[..], TOKEN].concat(),
                _ => TOKEN.to_vec(),
            };
            headers.push(("authorization".into(), v));
        }
        if has(Defect::BadProto) {
            headers.push(("x-aifo-proto".into(), b"3".to_vec()));
        } else if !has(Defect::NoProto) {
            headers.push(("x-aifo-proto".into(), vec![b'0' + proto]));
        }
        if te {
            headers.push(("te".into(), b"trailers".to_vec()));
        }
        if has(Defect::BigLength) {
            headers.push(("content-length".into(), (self.config.max_body + 1).to_string().into_bytes()));
        } else if !has(Defect::BigChunked) {
            headers.push(("content-length".into(), body.len().to_string().into_bytes()));
        }
        let head = RequestHead {
            method: if has(Defect::Method) { "GET".into() } else { "POST".into() },
            path: if has(Defect::Path) { "/execute".into() } else { "/exec".into() },
            headers,
            http11: true,
        };
        let tool = match rng.gen_range(0..10) {
            0..=2 => ToolKind::Talk,
            3 => ToolKind::Flood,
            4 => ToolKind::HangSilent,
            5 => ToolKind::HangAfterOutput,
            6 => ToolKind::IgnoresTerm,
            7 | 8 => ToolKind::Grandchild,
            _ => ToolKind::DiesBySignal,
        };
        let script: Vec<usize> = match tool {
            ToolKind::Flood => (0..rng.gen_range(10..40)).map(|_| rng.gen_range(1..100_000)).collect(),
            ToolKind::HangSilent => Vec::new(),
            _ => (0..rng.gen_range(1..6)).map(|_| rng.gen_range(1..20_000)).collect(),
        };
        let exit = match tool {
            ToolKind::DiesBySignal => ExitStatus::Signal(*[9, 11, 15, 6].choose(rng).unwrap_or(&9)),
            _ => ExitStatus::Code(rng.gen_range(0..=255)),
        };
        let reader = match rng.gen_range(0..4) {
            0 | 1 => Reader::Fast,
            2 => Reader::Slow,
            _ => Reader::Stalled { for_us: rng.gen_range(0..4_000_000) },
        };
        let leave = if rng.gen_bool(0.25) {
            match rng.gen_range(0..5) {
                0 => Leave::BeforeHead,
                1 => Leave::AfterHead,
                2 => Leave::MidBody,
                3 => Leave::Running(rng.gen_range(0..3_000_000)),
                _ => Leave::AfterBytes(rng.gen_range(0..300_000)),
            }
        } else {
            Leave::Never
        };
        Plan { proto, te, defects, head, body, reader, leave, tool, script, exit }
    }

    pub fn run(mut self) -> ToolexecOutcome {
        let mut failure = None;
        loop {
            self.step += 1;
            if let Err(f) = self.step_once() {
                failure = Some(f);
                break;
            }
            if let Err(f) = self.check() {
                failure = Some(f);
                break;
            }
            if self.conns.iter().all(|c| c.closed) {
                if let Err(f) = self.check_end() {
                    failure = Some(f);
                }
                break;
            }
            if self.step > WIND_DOWN_STEPS {
                let open: Vec<usize> = (0..self.conns.len()).filter(|&i| !self.conns[i].closed).collect();
                failure = Some(fail(
                    "liveness",
                    self.step,
                    open.first().copied(),
                    format!("connections {open:?} never ended"),
                ));
                break;
            }
        }
        if let Some(f) = &failure {
            self.log(format_args!("FAILED {f}"));
        }
        ToolexecOutcome {
            steps: self.step,
            now: self.now,
            faults: self.faults,
            failure,
            trace: self.trace.map(String::into_bytes),
        }
    }

    fn at(&self) -> Instant {
        Instant::from_micros(self.now)
    }

    /// The time fed with an input: now, or (clock skew) a bit before it.
    fn fed_time(&mut self) -> Instant {
        if self.backward && self.rng.gen_bool(0.1) {
            Instant::from_micros(self.now.saturating_sub(self.rng.gen_range(0..50_000)))
        } else {
            self.at()
        }
    }

    fn step_once(&mut self) -> Result<(), Failure> {
        let dt = if self.clock_jumps && self.rng.gen_bool(0.01) {
            self.fault(FaultKind::ClockJump);
            let dt = self.rng.gen_range(100_000..5_000_000);
            self.jumped += dt;
            dt
        } else {
            self.rng.gen_range(1..MAX_STEP_US)
        };
        for c in &mut self.conns {
            if !c.gone && !c.closed && c.seen.unread >= STREAM_WINDOW {
                c.held_us += dt;
            }
        }
        self.now += dt;
        // Accept while the gate allows, oldest first (the backlog).
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            if c.accepted || c.arrive_at > self.now {
                continue;
            }
            let may = match self.bug {
                Some(ToolexecBug::NoCap) => true,
                _ => self.gate.try_take(),
            };
            if !may {
                break;
            }
            let config = self.config.clone();
            let now = self.at();
            let ex = HEAP.scope(|| Exchange::new(config, now));
            self.record_input(self.at(), &trace::ServerInput::Accept { conn: i });
            let c = &mut self.conns[i];
            c.accepted = true;
            c.ex = Some(ex);
            self.log(format_args!("accept {i}"));
        }
        let order: Vec<usize> = {
            let mut v: Vec<usize> =
                (0..self.conns.len()).filter(|&i| self.conns[i].accepted && !self.conns[i].closed).collect();
            v.shuffle(&mut self.rng);
            v
        };
        for i in order {
            self.drive(i)?;
        }
        Ok(())
    }

    fn feed(&mut self, i: usize, input: Input) -> Result<(), Failure> {
        let now = self.fed_time();
        let desc = describe(&input);
        self.log(format_args!("in {i} {desc}"));
        if self.trace.is_some() {
            self.record_input(now, &trace::ServerInput::Input { conn: i, input: input.clone() });
        }
        let output = matches!(input, Input::ToolOutput(_));
        if let Some(ex) = self.conns[i].ex.as_mut() {
            HEAP.scope(|| ex.handle(now, input));
        }
        let c = &mut self.conns[i];
        if self.bug == Some(ToolexecBug::UncountedBuffer)
            && output
            && c.read_ahead.capacity() == 0
            && c.ex.as_ref().is_some_and(|e| e.mode() == Mode::Buffered && e.buffered_bytes() > 0)
        {
            let max = usize::try_from(self.config.max_buffered).unwrap_or(usize::MAX);
            HEAP.scope(|| c.read_ahead.reserve(max));
        }
        self.drain(i)
    }

    fn drive(&mut self, i: usize) -> Result<(), Failure> {
        // Timers.
        let due = self.conns[i].ex.as_ref().and_then(Exchange::poll_timeout).is_some_and(|t| t <= self.at());
        if due {
            let now = self.at();
            self.record_input(now, &trace::ServerInput::Timeout { conn: i });
            if let Some(ex) = self.conns[i].ex.as_mut() {
                HEAP.scope(|| ex.handle_timeout(now));
            }
            self.drain(i)?;
        }
        // The client's side.
        let leave = self.conns[i].plan.leave;
        if !self.conns[i].gone {
            let c = &self.conns[i];
            let leaving = match leave {
                Leave::Never => false,
                Leave::BeforeHead => !c.head_fed,
                Leave::AfterHead => c.head_fed && c.body_sent == 0,
                Leave::MidBody => c.head_fed && (c.body_sent > 0 || c.plan.body.is_empty()),
                Leave::Running(after) => c.spawned_at.is_some_and(|t| self.now >= t + after),
                Leave::AfterBytes(n) => c.seen.body.len() as u64 >= n && c.seen.head_sent,
            };
            if leaving && !c.seen.done {
                self.conns[i].gone = true;
                self.fault(FaultKind::Eof);
                self.feed(i, Input::ClientGone)?;
            }
        }
        if !self.conns[i].head_fed && !self.conns[i].gone {
            self.conns[i].head_fed = true;
            self.conns[i].head_fed_at = self.now;
            let head = self.conns[i].plan.head.clone();
            self.feed(i, Input::Head(head))?;
        }
        let c = &self.conns[i];
        if c.body_allowed && !c.body_end_fed && !c.gone && !c.seen.done {
            let left = c.plan.body.len() - c.body_sent;
            if left > 0 {
                let n = if self.rng.gen_bool(0.5) { left } else { self.rng.gen_range(1..=left) };
                if n < left {
                    self.fault(FaultKind::SplitDelivery);
                }
                let start = self.conns[i].body_sent;
                let chunk = self.conns[i].plan.body[start..start + n].to_vec();
                self.conns[i].body_sent += n;
                self.feed(i, Input::Body(chunk))?;
            } else if leave != Leave::MidBody || self.conns[i].gone {
                self.conns[i].body_end_fed = true;
                self.feed(i, Input::BodyEnd)?;
            }
        }
        // The client reads what was streamed to it.
        let c = &self.conns[i];
        if !c.gone && c.seen.unread > 0 {
            let take = match c.plan.reader {
                Reader::Fast => c.seen.unread,
                Reader::Slow => self.rng.gen_range(1..=c.seen.unread.min(8192)),
                Reader::Stalled { for_us } if c.seen.head_at.is_some_and(|h| self.now >= h + for_us) => {
                    c.seen.unread
                }
                Reader::Stalled { .. } => 0,
            };
            if take > 0 {
                self.conns[i].seen.unread -= take;
                self.feed(i, Input::ClientTook(take))?;
            }
        }
        // The tool.
        self.run_tool(i)?;
        Ok(())
    }

    fn run_tool(&mut self, i: usize) -> Result<(), Failure> {
        let now = self.now;
        let Some(tool) = self.conns[i].tool.as_mut() else { return Ok(()) };
        // Writes: as much of the next chunk as the pipe takes.
        if tool.alive && now >= tool.next_write_at {
            if let Some(&next) = tool.script.front() {
                let room = PIPE_CAPACITY - tool.pipe.len();
                let n = next.min(room);
                if n > 0 {
                    let base = tool.written.len();
                    for k in 0..n {
                        let b =
                            ((base + k) as u64).wrapping_mul(2_654_435_761).wrapping_add(i as u64 * 97) >> 13;
                        tool.written.push(b as u8);
                        tool.pipe.push_back(b as u8);
                    }
                    if n == next {
                        tool.script.pop_front();
                        tool.next_write_at = now + self.rng.gen_range(0..200_000);
                    } else if let Some(f) = tool.script.front_mut() {
                        *f -= n;
                    }
                }
            } else {
                match tool.kind {
                    ToolKind::HangSilent | ToolKind::HangAfterOutput | ToolKind::IgnoresTerm => {}
                    ToolKind::Grandchild => {
                        tool.alive = false;
                        tool.status = Some(tool.exit);
                    }
                    ToolKind::Talk | ToolKind::Flood | ToolKind::DiesBySignal => {
                        tool.alive = false;
                        tool.status = Some(tool.exit);
                        if matches!(tool.exit, ExitStatus::Signal(_)) {
                            self.fault(FaultKind::ProcessDeath);
                        }
                    }
                }
            }
        }
        // Reads the machine asked for.
        let read_max = self.conns[i].read_max;
        let tool = self.conns[i].tool.as_mut().expect("checked above");
        if let Some(max) = read_max {
            if !tool.pipe.is_empty() {
                let n = max.min(tool.pipe.len());
                let n = if self.rng.gen_bool(0.3) { self.rng.gen_range(1..=n) } else { n };
                let bytes: Vec<u8> = tool.pipe.drain(..n).collect();
                self.conns[i].read_max = None;
                self.feed(i, Input::ToolOutput(bytes))?;
            } else if !tool.writers() {
                self.conns[i].read_max = None;
                self.feed(i, Input::ToolEof)?;
            }
        }
        // Reaping.
        let tool = self.conns[i].tool.as_mut().expect("checked above");
        if let (Some(status), false) = (tool.status, tool.reaped) {
            tool.reaped = true;
            self.feed(i, Input::ToolExited(status))?;
        }
        Ok(())
    }

    fn signal(&mut self, i: usize, sig: Signal) {
        let now = self.now;
        let c = &mut self.conns[i];
        match sig {
            Signal::Term => {
                c.seen.term_at.get_or_insert(now);
            }
            Signal::Kill => {
                c.seen.kill_at.get_or_insert(now);
            }
        }
        let Some(tool) = c.tool.as_mut() else { return };
        let dies = sig == Signal::Kill || tool.kind != ToolKind::IgnoresTerm;
        if tool.alive && dies {
            tool.alive = false;
            tool.status = Some(ExitStatus::Signal(if sig == Signal::Kill { 9 } else { 15 }));
        }
        // The grandchild is in the group and does not ignore TERM.
        tool.grandchild = false;
    }

    fn drain(&mut self, i: usize) -> Result<(), Failure> {
        loop {
            let Some(out) = HEAP.scope(|| self.conns[i].ex.as_mut().and_then(Exchange::poll_output)) else {
                return Ok(());
            };
            let out = hand_out(out);
            // As the machine yielded it, before a planted bug touches it.
            if let Some(t) = &mut self.trace {
                t.push_str(&trace::output_line(i, &out));
            }
            let outs = self.mutate(i, out);
            for out in outs {
                self.effect(i, out)?;
            }
        }
    }

    /// Plant the configured bug between the machine and the world.
    fn mutate(&mut self, i: usize, out: Output) -> Vec<Output> {
        let bad_token = self.conns[i].plan.defects.iter().any(|d| d.auth());
        match (self.bug, out) {
            (Some(ToolexecBug::DropChunk), Output::SendChunk(b)) => {
                self.conns[i].chunks_seen += 1;
                if self.conns[i].chunks_seen == 2 {
                    vec![]
                } else {
                    vec![Output::SendChunk(b)]
                }
            }
            (Some(ToolexecBug::DoubleRespond), Output::Respond(r)) => {
                vec![Output::Respond(r.clone()), Output::Respond(r)]
            }
            (Some(ToolexecBug::SpawnOnReject), Output::Respond(r)) if r.status == 403 => {
                vec![Output::Spawn(airlock_core::toolexec::SpawnRequest {
                    tool: "rm".into(),
                    program: airlock_core::toolexec::ToolProgram::OnPath,
                    args: vec![],
                    cwd: WORKDIR.to_vec(),
                })]
            }
            (Some(ToolexecBug::AuthLate), Output::Respond(mut r))
                if r.status == 401
                    && bad_token
                    && self.conns[i].plan.defects.contains(&Defect::NotAllowed) =>
            {
                r.status = 403;
                vec![Output::Respond(r)]
            }
            (Some(ToolexecBug::NoTerm), Output::Signal(Signal::Term)) => vec![],
            (Some(ToolexecBug::NoKill), Output::Signal(Signal::Kill)) => vec![],
            (Some(ToolexecBug::OverCredit), Output::ReadOutput { max }) => {
                vec![Output::ReadOutput { max: max.saturating_mul(8).max(STREAM_WINDOW as usize * 2) }]
            }
            (_, out) => vec![out],
        }
    }

    fn effect(&mut self, i: usize, out: Output) -> Result<(), Failure> {
        let desc = match &out {
            Output::SendChunk(b) => format!("SendChunk({})", b.len()),
            Output::Respond(r) => format!("Respond({} {} bytes)", r.status, r.body.len()),
            other => format!("{other:?}"),
        };
        self.log(format_args!("out {i} {desc}"));
        let step = self.step;
        match out {
            Output::ReadBody => self.conns[i].body_allowed = true,
            Output::Respond(r) => self.answer(i, r),
            Output::Spawn(req) => {
                self.conns[i].seen.spawn_requested = true;
                if let Some(d) = self.conns[i].plan.defects.iter().find(|d| **d != Defect::Missing) {
                    return Err(fail(
                        "no_spawn_on_rejection",
                        step,
                        Some(i),
                        format!("spawned {:?} despite {d:?}", req.tool),
                    ));
                }
                if req.tool == "missing" {
                    return self.feed(i, Input::Spawned(Err(SpawnError::NotInstalled)));
                }
                let plan = &self.conns[i].plan;
                let tool = Tool {
                    kind: plan.tool,
                    script: plan.script.iter().copied().collect(),
                    next_write_at: self.now,
                    written: Vec::new(),
                    pipe: VecDeque::new(),
                    alive: true,
                    grandchild: plan.tool == ToolKind::Grandchild,
                    status: None,
                    reaped: false,
                    exit: plan.exit,
                };
                self.conns[i].tool = Some(tool);
                self.conns[i].spawned_at = Some(self.now);
                self.conns[i].jumped_at_spawn = self.jumped;
                self.feed(i, Input::Spawned(Ok(())))?;
            }
            Output::ReadOutput { max } => {
                if self.conns[i].read_max.is_some() {
                    return Err(fail(
                        "one_read",
                        step,
                        Some(i),
                        "a second read before the first completed".into(),
                    ));
                }
                self.conns[i].read_max = Some(max);
            }
            Output::ReadNow { max } => {
                // Replaces the waiting read: what the pipe holds now, at once.
                self.conns[i].read_max = None;
                let Some(tool) = self.conns[i].tool.as_mut() else {
                    return Err(fail("one_read", step, Some(i), "a read before the spawn".into()));
                };
                let n = max.min(tool.pipe.len());
                let input =
                    if n == 0 { Input::ToolEof } else { Input::ToolOutput(tool.pipe.drain(..n).collect()) };
                self.feed(i, input)?;
            }
            Output::SendHead(r) => {
                let now = self.now;
                let s = &mut self.conns[i].seen;
                s.answers += 1;
                s.status = Some(r.status);
                s.head_sent = true;
                s.head_at = Some(now);
            }
            Output::SendChunk(b) => {
                let gone = self.conns[i].gone;
                let s = &mut self.conns[i].seen;
                if !gone {
                    s.unread += b.len() as u64;
                    s.body.extend_from_slice(&b);
                }
            }
            Output::Finish { exit_code } => self.conns[i].seen.trailer = Some(exit_code),
            Output::Signal(sig) => self.signal(i, sig),
            Output::Done => {
                let c = &mut self.conns[i];
                c.seen.done = true;
                c.closed = true;
                c.read_ahead = Vec::new();
                if self.bug != Some(ToolexecBug::NoCap) {
                    self.gate.release();
                }
            }
        }
        Ok(())
    }

    fn answer(&mut self, i: usize, r: Response) {
        let now = self.now;
        let c = &mut self.conns[i];
        c.seen.answers += 1;
        c.seen.status = Some(r.status);
        c.seen.body = r.body;
        c.seen.trailer =
            r.headers.iter().find(|(k, _)| *k == "X-Exit-Code").and_then(|(_, v)| v.parse().ok());
        if r.status == 507 {
            c.must_stop_at = Some(now);
        }
    }

    fn check(&self) -> Result<(), Failure> {
        let step = self.step;
        if let Some(live) = heapcount::live(HEAP) {
            self.gate
                .heap_check(
                    self.conns.iter().filter_map(|c| c.ex.as_ref()),
                    live.wrapping_sub(self.heap_base),
                )
                .map_err(|m| fail("bounded_memory", step, None, format!("the server {m}")))?;
        }
        let live = self.conns.iter().filter(|c| c.accepted && !c.closed).count();
        if live > self.cap {
            return Err(fail(
                "connections_cap",
                step,
                None,
                format!("{live} connections open, cap {}", self.cap),
            ));
        }
        let timeout = self.config.timeout.as_micros() as u64;
        let grace = self.config.kill_grace.as_micros() as u64;
        for (i, c) in self.conns.iter().enumerate() {
            let s = &c.seen;
            if s.answers > 1 {
                return Err(fail("one_response", step, Some(i), format!("{} answers", s.answers)));
            }
            let expected = c.plan.expected_status();
            // A body still incomplete `header_timeout` after its head (a clock
            // jump can do that) is 408, whatever else is wrong with it.
            let body_late =
                c.head_fed && self.now >= c.head_fed_at + self.config.header_timeout.as_micros() as u64;
            if s.status == Some(408) {
                if !body_late {
                    return Err(fail("status", step, Some(i), "408 for a body that came in time".into()));
                }
                continue;
            }
            if let (Some(got), Some(want)) = (s.status, expected) {
                let bad_token = c.plan.defects.iter().any(|d| d.auth());
                let ahead = c.plan.defects.iter().any(|d| matches!(d, Defect::Path | Defect::Method));
                if bad_token && !ahead && got != 401 {
                    return Err(fail(
                        "auth_first",
                        step,
                        Some(i),
                        format!("bad token answered {got}, not 401"),
                    ));
                }
                if got != want {
                    return Err(fail(
                        "status",
                        step,
                        Some(i),
                        format!("answered {got}, want {want} for {:?}", c.plan.defects),
                    ));
                }
            }
            if let (Some(got), None) = (s.status, expected) {
                if !matches!(got, 200 | 504 | 507) {
                    return Err(fail("status", step, Some(i), format!("a good request answered {got}")));
                }
                // v2 streams only when the client can receive trailers.
                let want = if c.plan.proto == 2 && c.plan.te { Mode::Streaming } else { Mode::Buffered };
                if ex_mode(c) != Some(want) {
                    return Err(fail(
                        "mode",
                        step,
                        Some(i),
                        format!("v{} te={} answered {:?}", c.plan.proto, c.plan.te, ex_mode(c)),
                    ));
                }
            }
            if let Some(ex) = &c.ex {
                // The timeout line is the one thing sent past the window.
                let line =
                    format!("toolexec: timed out after {} s\n", self.config.timeout.as_secs()).len() as u64;
                if ex.waiting_bytes() > STREAM_WINDOW || s.unread > STREAM_WINDOW + line {
                    return Err(fail(
                        "stream_window",
                        step,
                        Some(i),
                        format!(
                            "{} bytes wait for the client (window {STREAM_WINDOW})",
                            ex.waiting_bytes().max(s.unread)
                        ),
                    ));
                }
                if ex.buffered_bytes() > self.config.max_buffered {
                    return Err(fail(
                        "stream_window",
                        step,
                        Some(i),
                        format!("{} bytes buffered", ex.buffered_bytes()),
                    ));
                }
            }
            let Some(tool) = &c.tool else { continue };
            // Bytes: a prefix of what the tool wrote, plus only the timeout line.
            if !c.gone {
                let line = format!("toolexec: timed out after {} s\n", self.config.timeout.as_secs());
                // A tool may exit 124 itself; only a real timeout (the one
                // reason for SIGTERM while the client stays and no 507) adds
                // the line.
                let timed_out = s.term_at.is_some();
                let body: &[u8] = if timed_out
                    && s.trailer == Some(EXIT_CODE_TIMEOUT)
                    && ex_mode(c) == Some(Mode::Streaming)
                {
                    match s.body.strip_suffix(line.as_bytes()) {
                        Some(b) => b,
                        None if s.head_sent => {
                            return Err(fail(
                                "bytes",
                                step,
                                Some(i),
                                "a timed-out stream lacks its timeout line".into(),
                            ))
                        }
                        None => &s.body,
                    }
                } else {
                    &s.body
                };
                let ok_status = matches!(s.status, Some(200) | Some(504));
                if ok_status && !tool.written.starts_with(body) {
                    let at = body
                        .iter()
                        .zip(&tool.written)
                        .position(|(a, b)| a != b)
                        .unwrap_or(body.len().min(tool.written.len()));
                    return Err(fail(
                        "bytes",
                        step,
                        Some(i),
                        format!(
                            "received {} bytes, differing from the tool's {} at {at}",
                            body.len(),
                            tool.written.len()
                        ),
                    ));
                }
                let complete = s.done && ok_status && !timed_out && s.trailer.is_some();
                if complete && body.len() != tool.written.len() {
                    return Err(fail(
                        "bytes",
                        step,
                        Some(i),
                        format!(
                            "the answer ended after {} of the tool's {} bytes",
                            body.len(),
                            tool.written.len()
                        ),
                    ));
                }
            }
            // The exit code is the tool's unless we stopped it.
            if s.done && !c.gone && s.status == Some(200) && s.term_at.is_none() {
                let want = tool.exit.exit_code();
                if let Some(got) = s.trailer.filter(|t| *t != EXIT_CODE_TIMEOUT) {
                    if got != want {
                        return Err(fail(
                            "exit_code",
                            step,
                            Some(i),
                            format!("X-Exit-Code {got}, the tool's {want}"),
                        ));
                    }
                }
            }
            // Signals: TERM at once, KILL by the grace.
            let Some(spawned) = c.spawned_at else { continue };
            let stop_from = [
                (self.now >= spawned + timeout).then_some(spawned + timeout),
                c.gone.then_some(spawned),
                c.must_stop_at,
            ]
            .into_iter()
            .flatten()
            .min();
            let running = tool.alive || tool.grandchild;
            if let Some(from) = stop_from {
                if running && s.term_at.is_none() && s.kill_at.is_none() && tool.status.is_none() {
                    return Err(fail(
                        "term_at_once",
                        step,
                        Some(i),
                        format!("tool still unsignalled {} µs after it had to stop", self.now - from),
                    ));
                }
            }
            if let Some(t) = s.term_at {
                if running && self.now >= t + grace && s.kill_at.is_none() {
                    return Err(fail(
                        "kill_by_grace",
                        step,
                        Some(i),
                        format!("no SIGKILL {} µs after SIGTERM", self.now - t),
                    ));
                }
            }
            // Answers within timeout + grace (+ one drain grace for a reader
            // that stalls, + a step), plus the time the client held the
            // stream window full.
            let stalled = matches!(c.plan.reader, Reader::Stalled { .. } | Reader::Slow);
            let skipped = self.jumped - c.jumped_at_spawn;
            let bound = spawned
                + timeout
                + grace
                + if stalled { grace } else { 0 }
                + 2 * MAX_STEP_US
                + skipped
                + c.held_us;
            if !c.closed && self.now > bound {
                return Err(fail(
                    "answer_deadline",
                    step,
                    Some(i),
                    format!(
                        "no end {} µs after spawn (timeout {timeout}, grace {grace})",
                        self.now - spawned
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_end(&self) -> Result<(), Failure> {
        for (i, c) in self.conns.iter().enumerate() {
            if !c.gone && c.seen.answers != 1 {
                return Err(fail(
                    "one_response",
                    self.step,
                    Some(i),
                    format!("{} answers at the end", c.seen.answers),
                ));
            }
            if let Some(t) = &c.tool {
                if t.alive || t.grandchild || !t.reaped {
                    return Err(fail(
                        "reaped",
                        self.step,
                        Some(i),
                        format!("tool alive={} grandchild={} reaped={}", t.alive, t.grandchild, t.reaped),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn ex_mode(c: &Conn) -> Option<Mode> {
    c.ex.as_ref().map(Exchange::mode)
}

fn describe(input: &Input) -> String {
    match input {
        Input::Head(h) => format!("Head({} {})", h.method, h.path),
        Input::Body(b) => format!("Body({})", b.len()),
        Input::ToolOutput(b) => format!("ToolOutput({})", b.len()),
        other => format!("{other:?}"),
    }
}

/// Run one seed of the scenario.
pub fn run(seed: u64, bug: Option<ToolexecBug>, record: bool) -> ToolexecOutcome {
    ToolexecWorld::new(seed, bug, record).run()
}
