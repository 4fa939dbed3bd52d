//! The host machine: see the [module docs](super).

use super::effect::{Effect, EffectId, EffectResult, Header, HttpMethod, HttpRequest, OpError, ProcessRun};
use super::files::{FsOp, FsReply, GrepQuery, ProjectPath};
use super::outcome::{text_block, Outcome, OutcomeKind, ToolExit};
use super::policy::ToolPolicy;
use super::{Config, Gate, MAX_READ_CHUNK, PROTOCOL_VERSION};
use crate::b64;
use crate::codec::jsonrpc::{self, ErrorCode, Id, Incoming, LineDecoder, Outgoing, RpcError};
use crate::fsproxy::bounds::{heap_verdict, HeapShare, HEAP_GROWTH};
use crate::fsproxy::PlantedBug;
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// A signal the user sent airlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserSignal {
    Int,
    Term,
    Hup,
}

impl UserSignal {
    pub fn number(self) -> i32 {
        match self {
            UserSignal::Hup => 1,
            UserSignal::Int => 2,
            UserSignal::Term => 15,
        }
    }
}

/// A signal for the tool's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    Term,
    Kill,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// Bytes read from the tool's stdout (at most [`Host::stdout_budget`]).
    ToolStdout(#[serde(with = "crate::b64")] Vec<u8>),
    ToolStdoutEof,
    /// Bytes read from the tool's stderr (the host keeps a tail).
    ToolStderr(#[serde(with = "crate::b64")] Vec<u8>),
    /// Writing the tool's stdin failed (it closed it): nothing more is sent.
    ToolStdinClosed,
    /// This many bytes of earlier [`Output::ToolStdin`] reached the tool's
    /// stdin (it took them). Unsent bytes over `max_stdin_backlog` pause
    /// the host: no stdout read, no request served, the silence clock runs.
    ToolStdinWritten(usize),
    /// The tool process was reaped.
    ToolExited(ToolExit),
    EffectDone {
        id: EffectId,
        result: EffectResult,
    },
    UserSignal(UserSignal),
    /// [`Host::poll_timeout`] is due (any input also runs due timers).
    Tick,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// Whole NDJSON lines for the tool's stdin.
    ToolStdin(#[serde(with = "crate::b64")] Vec<u8>),
    CloseStdin,
    Effect {
        id: EffectId,
        effect: Effect,
    },
    /// Stop effect `id` (kill its process group, drop its HTTP call); its
    /// result, if one still comes, is ignored.
    CancelEffect(EffectId),
    /// Signal the tool's process group.
    Signal(Signal),
    /// The end: print `line` on stdout and exit with `exit_status`. The
    /// shell has already been told to kill the tool's group.
    Finished {
        #[serde(with = "crate::b64")]
        line: Vec<u8>,
        exit_status: i32,
    },
}

/// A request waiting its turn.
#[derive(Debug)]
enum Entry {
    /// Decided already (an invalid message, a policy refusal, …): sent
    /// when its turn comes.
    Ready { id: Option<Id>, reply: Result<Value, RpcError> },
    /// Needs an effect.
    Op { id: Id, call: Call },
}

impl Entry {
    fn id(&self) -> Option<&Id> {
        match self {
            Entry::Ready { id, .. } => id.as_ref(),
            Entry::Op { id, .. } => Some(id),
        }
    }
}

/// What an effect's result becomes.
#[derive(Clone, Debug)]
enum Call {
    Fs(FsOp),
    Http(HttpRequest),
    Process(ProcessRun),
}

#[derive(Debug)]
struct InService {
    id: Id,
    /// The length of the line it came from: its id, and the key of it
    /// among the pending, are as long as that.
    line: usize,
    effect: EffectId,
    deadline: Instant,
    kind: &'static str,
}

#[derive(Debug)]
enum Phase {
    Running,
    /// The outcome is decided; the tool is being stopped.
    Finishing {
        kind: OutcomeKind,
        message: Option<String>,
    },
    Done,
}

#[derive(Debug)]
pub struct Host {
    cfg: Config,
    policy: ToolPolicy,
    decoder: LineDecoder,
    out: VecDeque<Output>,
    now: Instant,
    /// Each with the length of the line it came from (what its heap
    /// allowance is made of).
    queue: VecDeque<(Entry, usize)>,
    in_service: Option<InService>,
    /// Ids of unanswered requests (queued or in service), by key, with
    /// how many entries carry each.
    pending_ids: BTreeMap<String, usize>,
    next_effect: u64,
    phase: Phase,
    stdin_open: bool,
    /// Bytes of `ToolStdin` output the tool has not taken yet.
    stdin_unsent: usize,
    stdout_eof: bool,
    /// The end of stdout took effect (every buffered line read).
    eof_seen: bool,
    exited: Option<(ToolExit, Instant)>,
    stderr: VecDeque<u8>,
    /// The silence clock: the last line read or response written.
    last_activity: Instant,
    applies: VecDeque<String>,
    states: Vec<Value>,
    final_content: Vec<Value>,
    final_error: Option<Value>,
    term_at: Option<Instant>,
    kill_at: Option<Instant>,
    /// Effects given up on, with their request ids (for a planted bug only).
    abandoned: Vec<(EffectId, Id)>,
    /// The length of the line being read.
    line_len: usize,
    /// Bytes of the lines whose parsed messages are kept (states, the
    /// result or error): what [`Host::heap_allowance`] gives them.
    kept_line_bytes: usize,
    /// Only with `PlantedBug::ToolUncountedBuffer`.
    read_ahead: Vec<u8>,
    /// `http.*` requests the policy refused, not yet taken by the shell
    /// (at most [`MAX_NET_REFUSALS_HELD`]), and how many more were dropped.
    net_refused: Vec<NetRefusal>,
    net_refused_dropped: u64,
}

/// Refused `http.*` requests held for the shell between two inputs; past
/// it they are counted, not kept (one input refuses at most one request,
/// so a shell that drains after each input never reaches it).
pub const MAX_NET_REFUSALS_HELD: usize = 256;
/// The longest URL a refusal record keeps, in bytes.
pub const MAX_AUDITED_URL: usize = 2048;

/// An `http.*` request the policy refused before any connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NetRefusal {
    /// `http.get` or `http.post`.
    pub method: String,
    /// As the tool wrote it (cut at [`MAX_AUDITED_URL`] bytes).
    pub url: String,
    /// Normalized, when the URL could be read.
    pub host: Option<String>,
    pub port: Option<u16>,
    /// Why: the rule that refused it, in the words the tool got.
    pub rule: String,
}

impl Host {
    /// A host for a tool just spawned at `now`; the first output is `init`.
    pub fn new(now: Instant, cfg: Config, mut policy: ToolPolicy) -> Self {
        policy.set_limits(cfg.max_file, cfg.max_grep_lines);
        if cfg.planted_bug == Some(PlantedBug::ToolLexicalOnly) {
            policy.gate_mut().plant_lexical_only();
        }
        if cfg.planted_bug == Some(PlantedBug::ToolGuardSkipsRename) {
            policy.gate_mut().plant_guard_skips_rename();
        }
        if cfg.planted_bug == Some(PlantedBug::ToolReopenByPath) {
            policy.gate_mut().plant_reopen_by_path();
        }
        let mut h = Host {
            decoder: LineDecoder::new(cfg.max_line),
            applies: cfg.applies.iter().cloned().collect(),
            cfg,
            policy,
            out: VecDeque::new(),
            now,
            queue: VecDeque::new(),
            in_service: None,
            pending_ids: BTreeMap::new(),
            next_effect: 0,
            phase: Phase::Running,
            stdin_open: true,
            stdin_unsent: 0,
            stdout_eof: false,
            eof_seen: false,
            exited: None,
            stderr: VecDeque::new(),
            last_activity: now,
            states: Vec::new(),
            final_content: Vec::new(),
            final_error: None,
            term_at: None,
            kill_at: None,
            abandoned: Vec::new(),
            line_len: 0,
            kept_line_bytes: 0,
            read_ahead: Vec::new(),
            net_refused: Vec::new(),
            net_refused_dropped: 0,
        };
        let init = json!({
            "tool": {
                "name": h.cfg.name,
                "arguments": h.cfg.arguments,
                "answers": {},
                "options": {},
            },
            "protocol_version": PROTOCOL_VERSION,
        });
        h.notify("init", Some(init));
        h
    }

    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// What file system backends decide resolved paths with.
    pub fn gate(&self) -> &Gate {
        self.policy.gate()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Requests read and not yet answered (queued or in service).
    pub fn unanswered(&self) -> usize {
        self.queue.len() + usize::from(self.in_service.is_some())
    }

    /// Bytes held for the tool's stdout not yet parsed, plus bytes of
    /// output not yet drained: what a checker bounds.
    pub fn buffered_bytes(&self) -> usize {
        self.decoder.buffered() + self.stderr.len()
    }

    /// Bytes of stdout the host accepts now (0: do not read).
    pub fn stdout_budget(&self) -> usize {
        if self.stdout_eof {
            return 0;
        }
        match self.phase {
            Phase::Running => {
                if self.decoder.failed().is_some() {
                    return 0;
                }
                // A tool that exited has its pipe read out: what it left
                // is parsed at once (`drain_dead`).
                let paused = self.unanswered() >= self.max_pending() || self.stdin_stalled();
                if paused && self.exited.is_none() {
                    return 0;
                }
                (self.cfg.max_line + 1).saturating_sub(self.decoder.buffered()).min(MAX_READ_CHUNK)
            }
            // Drained and dropped, so a tool blocked writing can exit.
            Phase::Finishing { .. } => MAX_READ_CHUNK,
            Phase::Done => 0,
        }
    }

    fn max_pending(&self) -> usize {
        if self.cfg.planted_bug == Some(PlantedBug::ToolReadsPastPending) {
            return usize::MAX;
        }
        self.cfg.max_pending
    }

    fn bug(&self, b: PlantedBug) -> bool {
        self.cfg.planted_bug == Some(b)
    }

    /// The tool is not taking its stdin: answers wait, and so does reading.
    fn stdin_stalled(&self) -> bool {
        self.stdin_unsent > self.cfg.max_stdin_backlog
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The `http.*` requests the policy refused since the last call, for
    /// the shell's audit log (`--audit`): the shell drains them after each
    /// input. Not outputs: a trace's outputs are what the tool and its
    /// effects saw, and replaying one needs no audit log.
    pub fn take_net_refusals(&mut self) -> (Vec<NetRefusal>, u64) {
        (std::mem::take(&mut self.net_refused), std::mem::take(&mut self.net_refused_dropped))
    }

    pub(crate) fn note_net_refusal(&mut self, method: &str, url: &str, message: &str) {
        if self.net_refused.len() >= MAX_NET_REFUSALS_HELD {
            self.net_refused_dropped += 1;
            return;
        }
        let mut cut = url.len().min(MAX_AUDITED_URL);
        while !url.is_char_boundary(cut) {
            cut -= 1;
        }
        let checked = super::url::normalize(url).ok();
        // The reason alone: the message's "url \"…\" denied: " names the URL,
        // which the record holds.
        let reason = message.split_once(" denied: ").map_or(message, |(_, r)| r);
        self.net_refused.push(NetRefusal {
            method: method.to_owned(),
            url: url[..cut].to_owned(),
            host: checked.as_ref().map(|u| u.host.clone()),
            port: checked.as_ref().map(|u| u.port),
            rule: reason.to_owned(),
        });
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Vec<Instant> = Vec::new();
        match &self.phase {
            Phase::Done => return None,
            Phase::Running => {
                if let Some(s) = &self.in_service {
                    if !self.bug(PlantedBug::ToolNoOpTimeout) {
                        t.push(s.deadline);
                    }
                } else if (self.queue.is_empty() || self.stdin_stalled()) && self.exited.is_none() {
                    t.push(self.last_activity.saturating_add(self.cfg.timeout));
                }
            }
            Phase::Finishing { .. } => {}
        }
        t.extend(self.term_at);
        t.extend(self.kill_at);
        if let Some((_, at)) = self.exited {
            if !self.stdout_eof {
                t.push(at.saturating_add(self.cfg.kill_grace));
            }
        }
        t.into_iter().min()
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        // Time never runs backwards here, whatever the clock did.
        self.now = self.now.max(now);
        if matches!(self.phase, Phase::Done) {
            return;
        }
        self.run_timers();
        match input {
            Input::ToolStdout(bytes) => self.on_stdout(&bytes),
            Input::ToolStdoutEof => self.on_stdout_eof(),
            Input::ToolStderr(bytes) => {
                self.stderr.extend(bytes.iter().copied());
                let excess = self.stderr.len().saturating_sub(self.cfg.stderr_tail);
                self.stderr.drain(..excess);
            }
            Input::ToolStdinClosed => {
                self.stdin_open = false;
                self.stdin_unsent = 0;
            }
            Input::ToolStdinWritten(n) => {
                self.stdin_unsent = self.stdin_unsent.saturating_sub(n);
                self.last_activity = self.now;
            }
            Input::ToolExited(exit) => {
                if self.exited.is_none() {
                    self.exited = Some((exit, self.now));
                    // Nothing of the tool's outlives it.
                    self.out.push_back(Output::Signal(Signal::Kill));
                    self.term_at = None;
                    self.kill_at = None;
                }
            }
            Input::EffectDone { id, result } => self.on_effect(id, result),
            Input::UserSignal(sig) => self.on_user_signal(sig),
            Input::Tick => {}
        }
        // Serving can start an effect already due (`--op-timeout 0`):
        // whatever a timer ends, the next request is served at once.
        loop {
            self.pump();
            let due = self.in_service.as_ref().is_some_and(|s| self.now >= s.deadline)
                && !self.bug(PlantedBug::ToolNoOpTimeout);
            self.run_timers();
            if !due {
                break;
            }
        }
        self.maybe_finish();
    }

    // ---- reading ----

    fn on_stdout(&mut self, bytes: &[u8]) {
        // Once the outcome is decided, stdout is drained and dropped.
        if matches!(self.phase, Phase::Running) {
            self.decoder.push(bytes);
        }
    }

    fn on_stdout_eof(&mut self) {
        // Lines still buffered are read first, as the queue lets them
        // (`pump`); the end takes effect after the last of them.
        self.stdout_eof = true;
    }

    /// Parse buffered lines while the tool may have more unanswered
    /// requests, and serve the queue.
    fn pump(&mut self) {
        if self.exited.is_some() {
            self.drain_dead();
            return;
        }
        loop {
            self.serve();
            if !matches!(self.phase, Phase::Running) || self.unanswered() >= self.max_pending() {
                return;
            }
            match self.decoder.next_line() {
                Ok(Some(line)) => self.on_line(&line),
                Ok(None) => {
                    if self.stdout_eof && !self.eof_seen {
                        self.end_of_stdout();
                        continue;
                    }
                    return;
                }
                Err(e) => {
                    self.protocol_error(format!("tool stdout: {e}"));
                    return;
                }
            }
        }
    }

    /// The tool is gone: its requests need no answers (nothing can reach
    /// it), but a final message it wrote behind them still counts, so every
    /// line it left is read, without the pending limit.
    fn drain_dead(&mut self) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        if let Some(s) = self.in_service.take() {
            self.out.push_back(Output::CancelEffect(s.effect));
        }
        if self.stdin_open {
            self.stdin_open = false;
            self.out.push_back(Output::CloseStdin);
        }
        self.queue.clear();
        self.pending_ids.clear();
        while matches!(self.phase, Phase::Running) {
            match self.decoder.next_line() {
                Ok(Some(line)) => {
                    self.on_line(&line);
                    self.queue.clear();
                    self.pending_ids.clear();
                }
                Ok(None) if self.stdout_eof && !self.eof_seen => self.end_of_stdout(),
                Ok(None) => break,
                Err(e) => self.protocol_error(format!("tool stdout: {e}")),
            }
        }
    }

    /// Every complete line is read: a last line without its newline
    /// counts, then a live tool can send nothing more.
    fn end_of_stdout(&mut self) {
        self.eof_seen = true;
        match self.decoder.finish() {
            Ok(Some(line)) => self.on_line(&line),
            Ok(None) => {}
            Err(e) => self.protocol_error(format!("tool stdout: {e}")),
        }
        if matches!(self.phase, Phase::Running)
            && self.exited.is_none()
            && !self.bug(PlantedBug::ToolStdoutEndIgnored)
        {
            self.begin_finish(OutcomeKind::NoResult, None, self.cfg.kill_grace, false);
        }
    }

    fn on_line(&mut self, line: &[u8]) {
        self.last_activity = self.now;
        self.line_len = line.len();
        match jsonrpc::parse_bounded(line, self.cfg.max_line_values) {
            Incoming::Request { id, method, params } => {
                if self.pending_ids.contains_key(&id.key()) {
                    // Answering with the id would give the pending request
                    // a second response.
                    self.enqueue(Entry::Ready {
                        id: None,
                        reply: Err(RpcError::new(
                            ErrorCode::InvalidRequest,
                            format!("id {} is already pending", id.key()),
                        )),
                    });
                    return;
                }
                let entry = match self.prepare(&id, &method, params) {
                    Ok(Prepared::Call(call)) => Entry::Op { id, call },
                    Ok(Prepared::Reply(v)) => Entry::Ready { id: Some(id), reply: Ok(v) },
                    Err(e) => Entry::Ready { id: Some(id), reply: Err(e) },
                };
                self.enqueue(entry);
            }
            Incoming::Notification { method, params } => self.on_notification(&method, params),
            // Never answered (DESIGN 12): a tool that echoes responses
            // back costs nothing.
            Incoming::Response { .. } => {}
            Incoming::Invalid { id, reason } => {
                let id = id.filter(|i| !self.pending_ids.contains_key(&i.key()));
                self.enqueue(Entry::Ready {
                    id,
                    reply: Err(RpcError::new(ErrorCode::InvalidRequest, reason)),
                });
            }
        }
    }

    fn enqueue(&mut self, e: Entry) {
        if let Some(id) = e.id() {
            *self.pending_ids.entry(id.key()).or_default() += 1;
        }
        self.queue.push_back((e, self.line_len));
    }

    fn release_id(&mut self, id: &Id) {
        let k = id.key();
        if let Some(n) = self.pending_ids.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.pending_ids.remove(&k);
            }
        }
    }

    // ---- notifications ----

    fn on_notification(&mut self, method: &str, params: Value) {
        match method {
            "result" => match content_of(params.get("content")) {
                Some(content) => {
                    self.kept_line_bytes += self.line_len;
                    self.final_content = content;
                    self.begin_finish(OutcomeKind::Completed, None, self.cfg.kill_grace, false);
                }
                None => self.protocol_error(
                    "malformed result: params.content must be a string or an array of content blocks".into(),
                ),
            },
            "error" => match params.get("message") {
                Some(Value::String(m)) => {
                    self.kept_line_bytes += self.line_len;
                    self.final_content = vec![text_block(m.clone())];
                    self.final_error = Some(params);
                    self.begin_finish(OutcomeKind::Error, None, self.cfg.kill_grace, false);
                }
                _ => self.protocol_error("malformed error: params.message must be a string".into()),
            },
            "state" => self.on_state(params),
            "cancel" => {
                if let Some(id) = params.get("id").and_then(Id::from_value) {
                    self.cancel_request(&id);
                }
            }
            // Unknown notifications cannot be answered (no id): ignored.
            _ => {}
        }
    }

    fn on_state(&mut self, params: Value) {
        let ty = params.get("type").and_then(Value::as_str).map(str::to_owned);
        match ty.as_deref() {
            Some("running") | Some("waiting") => {
                self.kept_line_bytes += self.line_len;
                self.states.push(params);
                match self.applies.pop_front() {
                    Some(input) => self.notify("apply", Some(json!({ "input": input }))),
                    None => {
                        let msg = "the tool is waiting for input and no --apply input is left".to_string();
                        self.begin_finish(OutcomeKind::Waiting, Some(msg), self.cfg.cancel_grace, true);
                    }
                }
            }
            Some("stopped") => {
                let content = match params.get("result").or_else(|| params.get("content")) {
                    None | Some(Value::Null) => Some(Vec::new()),
                    v => content_of(v),
                };
                match content {
                    Some(c) => {
                        self.kept_line_bytes += self.line_len;
                        self.states.push(params);
                        self.final_content = c;
                        self.begin_finish(OutcomeKind::Completed, None, self.cfg.kill_grace, false);
                    }
                    None => self
                        .protocol_error("malformed state: result must be a string or content blocks".into()),
                }
            }
            _ => {
                self.protocol_error("malformed state: params.type must be running, waiting or stopped".into())
            }
        }
    }

    /// The tool's own cancel of request `id`: answered `-32005` now.
    fn cancel_request(&mut self, id: &Id) {
        if self.in_service.as_ref().is_some_and(|s| &s.id == id) {
            if let Some(s) = self.in_service.take() {
                self.out.push_back(Output::CancelEffect(s.effect));
                self.respond(Some(s.id), Err(cancelled("cancelled by the tool")));
            }
            return;
        }
        if let Some(pos) = self.queue.iter().position(|(e, _)| e.id() == Some(id)) {
            if let Some((e, _)) = self.queue.remove(pos) {
                let id = e.id().cloned();
                self.respond(id, Err(cancelled("cancelled by the tool")));
            }
        }
    }

    // ---- serving ----

    fn serve(&mut self) {
        while self.in_service.is_none() && matches!(self.phase, Phase::Running) && !self.stdin_stalled() {
            let Some((entry, line)) = self.queue.pop_front() else { return };
            match entry {
                Entry::Ready { id, reply } => self.respond(id, reply),
                Entry::Op { id, call } => {
                    if self.bug(PlantedBug::ToolUncountedBuffer)
                        && matches!(call, Call::Fs(FsOp::Read { .. }))
                        && self.read_ahead.capacity() == 0
                    {
                        self.read_ahead.reserve(self.cfg.max_file);
                    }
                    let effect_id = EffectId(self.next_effect);
                    self.next_effect += 1;
                    let (effect, kind) = match &call {
                        Call::Fs(op) => (Effect::Fs(op.clone()), "the file operation"),
                        Call::Http(r) => (Effect::Http(r.clone()), "the HTTP request"),
                        Call::Process(p) => (Effect::Process(p.clone()), "the process"),
                    };
                    self.in_service = Some(InService {
                        id,
                        line,
                        effect: effect_id,
                        deadline: self.now.saturating_add(self.cfg.op_timeout),
                        kind,
                    });
                    self.out.push_back(Output::Effect { id: effect_id, effect });
                }
            }
        }
    }

    fn on_effect(&mut self, id: EffectId, result: EffectResult) {
        let Some(s) = self.in_service.take_if(|s| s.effect == id) else {
            if self.bug(PlantedBug::ToolAnswersLateResult) {
                if let Some(pos) = self.abandoned.iter().position(|(e, _)| *e == id) {
                    let (_, rid) = self.abandoned.remove(pos);
                    let reply = self.reply_of(result);
                    self.respond(Some(rid), reply);
                }
            }
            return;
        };
        let reply = self.reply_of(result);
        self.respond(Some(s.id), reply);
    }

    fn reply_of(&self, result: EffectResult) -> Result<Value, RpcError> {
        let sc = self.policy.scrubber();
        let text_only = self.bug(PlantedBug::ToolScrubTextOnly);
        let payload = |bytes: &[u8], m: &mut Map<String, Value>, key: &str| {
            let clean = if text_only && std::str::from_utf8(bytes).is_err() {
                std::borrow::Cow::Borrowed(bytes)
            } else {
                sc.bytes(bytes)
            };
            match std::str::from_utf8(&clean) {
                Ok(t) => {
                    m.insert(key.into(), Value::from(t));
                    false
                }
                Err(_) => {
                    m.insert(key.into(), Value::from(b64::encode(&clean)));
                    true
                }
            }
        };
        match result {
            EffectResult::Fs(Err(e)) | EffectResult::Http(Err(e)) | EffectResult::Process(Err(e)) => {
                Err(RpcError::new(e.code, e.message))
            }
            EffectResult::Fs(Ok(reply)) => Ok(match reply {
                FsReply::Read(bytes) => {
                    let mut m = Map::new();
                    let b64 = payload(&bytes, &mut m, "content");
                    let size = sc.bytes(&bytes).len();
                    m.insert("size".into(), Value::from(size));
                    if b64 {
                        m.insert("encoding".into(), Value::from("base64"));
                    }
                    Value::Object(m)
                }
                FsReply::Done => json!({}),
                FsReply::Exists(b) => json!({ "exists": b }),
                FsReply::Metadata(md) => json!({ "kind": md.kind.as_str(), "size": md.size }),
                FsReply::ListDir(entries) => {
                    let entries: Vec<Value> = entries
                        .iter()
                        .map(|e| json!({ "path": sc.string(e.path.display_str()), "kind": e.kind.as_str() }))
                        .collect();
                    json!({ "entries": entries })
                }
                FsReply::Grep(g) => {
                    let mut lines_left = self.cfg.max_grep_lines;
                    let mut truncated = g.truncated;
                    let mut files = Vec::new();
                    for f in g.matches {
                        if lines_left == 0 {
                            truncated = true;
                            break;
                        }
                        let take = f.lines.len().min(lines_left);
                        truncated |= take < f.lines.len();
                        lines_left -= take;
                        let lines: Vec<Value> = f.lines[..take]
                            .iter()
                            .map(|l| {
                                json!({ "line_number": l.line_number, "content": sc.string(&l.content), "is_match": l.is_match })
                            })
                            .collect();
                        files.push(json!({ "path": sc.string(f.path.display_str()), "lines": lines }));
                    }
                    json!({ "matches": files, "truncated": truncated })
                }
            }),
            EffectResult::Http(Ok(r)) => {
                if r.body.len() > self.cfg.max_file {
                    return Err(RpcError::new(
                        ErrorCode::Internal,
                        format!("response body exceeds the limit of {} bytes", self.cfg.max_file),
                    ));
                }
                let mut m = Map::new();
                m.insert("status".into(), Value::from(r.status));
                let headers: Vec<Value> = r
                    .headers
                    .iter()
                    .map(|h| {
                        json!({ "name": sc.string(&h.name), "value": String::from_utf8_lossy(&sc.bytes(&h.value)).into_owned() })
                    })
                    .collect();
                m.insert("headers".into(), Value::Array(headers));
                if payload(&r.body, &mut m, "body") {
                    m.insert("encoding".into(), Value::from("base64"));
                }
                Ok(Value::Object(m))
            }
            EffectResult::Process(Ok(p)) => {
                for (name, s) in [("stdout", &p.stdout), ("stderr", &p.stderr)] {
                    if s.len() > self.cfg.max_file {
                        return Err(RpcError::new(
                            ErrorCode::Internal,
                            format!("process {name} exceeds the limit of {} bytes", self.cfg.max_file),
                        ));
                    }
                }
                let out = sc.bytes(&p.stdout).into_owned();
                let err = sc.bytes(&p.stderr).into_owned();
                let text = std::str::from_utf8(&out).is_ok() && std::str::from_utf8(&err).is_ok();
                let enc = |b: &[u8]| {
                    if text {
                        Value::from(String::from_utf8_lossy(b).into_owned())
                    } else {
                        Value::from(b64::encode(b))
                    }
                };
                let mut m = Map::new();
                m.insert("stdout".into(), enc(&out));
                m.insert("stderr".into(), enc(&err));
                m.insert("exit_code".into(), p.exit_code.map_or(Value::Null, Value::from));
                if let Some(s) = p.signal {
                    m.insert("signal".into(), Value::from(s));
                }
                if !text {
                    m.insert("encoding".into(), Value::from("base64"));
                }
                Ok(Value::Object(m))
            }
        }
    }

    /// Send one response (scrubbed, bounded by `--max-line`).
    fn respond(&mut self, id: Option<Id>, reply: Result<Value, RpcError>) {
        if let Some(i) = &id {
            self.release_id(i);
        }
        self.last_activity = self.now;
        let sc = self.policy.scrubber();
        let msg = match (id.clone(), reply) {
            (Some(id), Ok(result)) => Outgoing::Result { id, result },
            (id, Err(mut e)) => {
                e.message = sc.string(&e.message);
                Outgoing::Error { id, error: e }
            }
            (None, Ok(_)) => return,
        };
        let mut line = msg.to_line();
        if line.len() > self.cfg.max_line + 1 {
            let e = RpcError::new(
                ErrorCode::Internal,
                format!(
                    "the response of {} bytes exceeds the line limit of {} bytes",
                    line.len() - 1,
                    self.cfg.max_line
                ),
            );
            line = Outgoing::Error { id, error: e }.to_line();
        }
        self.send(line);
    }

    fn notify(&mut self, method: &str, params: Option<Value>) {
        let mut params = params;
        if let Some(p) = params.as_mut() {
            self.policy.scrubber().value(p);
        }
        let line = Outgoing::Notification { method: method.into(), params }.to_line();
        self.send(line);
    }

    fn send(&mut self, line: Vec<u8>) {
        if self.stdin_open {
            self.stdin_unsent = self.stdin_unsent.saturating_add(line.len());
            self.out.push_back(Output::ToolStdin(line));
        }
    }

    // ---- requests ----

    fn prepare(&mut self, id: &Id, method: &str, params: Value) -> Result<Prepared, RpcError> {
        let rpc = |e: OpError| RpcError::new(e.code, e.message);
        let p = Params { method, v: &params };
        let gate = self.policy.gate();
        let read_path = |key: &str| -> Result<ProjectPath, RpcError> {
            let path = ProjectPath::parse(p.str(key)?).map_err(rpc)?;
            gate.check(&path, false, false).map_err(rpc)?;
            Ok(path)
        };
        let write_path = |key: &str| -> Result<ProjectPath, RpcError> {
            let path = ProjectPath::parse(p.str(key)?).map_err(rpc)?;
            gate.check(&path, true, false).map_err(rpc)?;
            Ok(path)
        };
        let fs = |op: FsOp| Ok(Prepared::Call(Call::Fs(op)));
        match method {
            "fs.read" => fs(FsOp::Read { path: read_path("path")? }),
            "fs.exists" => fs(FsOp::Exists { path: read_path("path")? }),
            "fs.metadata" => fs(FsOp::Metadata { path: read_path("path")? }),
            "fs.list_dir" => fs(FsOp::ListDir { path: read_path("path")? }),
            "fs.delete" => fs(FsOp::Delete { path: write_path("path")? }),
            "fs.rename" => {
                let from = write_path("from")?;
                let to = write_path("to")?;
                fs(FsOp::Rename { from, to })
            }
            "fs.write" => {
                let path = write_path("path")?;
                let content = p.content("content", "encoding", true)?;
                if content.len() > self.cfg.max_file {
                    return Err(RpcError::new(
                        ErrorCode::Internal,
                        format!(
                            "content of {} bytes exceeds --max-file {}",
                            content.len(),
                            self.cfg.max_file
                        ),
                    ));
                }
                fs(FsOp::Write { path, content })
            }
            "fs.grep" => {
                let pattern = p.str("pattern")?.to_string();
                let paths = match p.opt("paths") {
                    None => vec![ProjectPath::ROOT],
                    Some(_) => {
                        let list = p.str_list("paths")?;
                        let mut out = Vec::new();
                        for s in list {
                            let path = ProjectPath::parse(&s).map_err(rpc)?;
                            gate.check(&path, false, false).map_err(rpc)?;
                            out.push(path);
                        }
                        out
                    }
                };
                let extensions = match p.opt("extensions") {
                    None => Vec::new(),
                    Some(_) => p
                        .str_list("extensions")?
                        .into_iter()
                        .map(|e| e.trim_start_matches('.').to_string())
                        .collect(),
                };
                let context = match p.opt("context") {
                    None => 0,
                    Some(v) => v
                        .as_u64()
                        .ok_or_else(|| p.bad("context must be a non-negative integer"))?
                        .min(self.cfg.max_grep_lines as u64) as usize,
                };
                let q = GrepQuery { pattern, paths, extensions, context, max_lines: self.cfg.max_grep_lines };
                q.regex().map_err(rpc)?;
                fs(FsOp::Grep(q))
            }
            "http.get" | "http.post" => {
                // Sent as decided: the normalized form, never the text.
                let text = p.str("url")?;
                let url = match self.policy.check_url(text) {
                    Ok(u) => u.to_string(),
                    Err(e) => {
                        if e.code == OpError::denied("").code {
                            self.note_net_refusal(method, text, &e.message);
                        }
                        return Err(rpc(e));
                    }
                };
                let mut headers = Vec::new();
                if let Some(hs) = p.opt("headers") {
                    let hs =
                        hs.as_array().ok_or_else(|| p.bad("headers must be an array of {name, value}"))?;
                    for h in hs {
                        let name = h.get("name").and_then(Value::as_str);
                        let value = h.get("value").and_then(Value::as_str);
                        let (Some(name), Some(value)) = (name, value) else {
                            return Err(p.bad("each header must be {name, value} with string values"));
                        };
                        if name.is_empty() || !name.bytes().all(is_token_byte) {
                            return Err(p.bad(&format!("header name {name:?} is not a valid token")));
                        }
                        // The server would route on it instead of the
                        // host the URL was allowed for.
                        if name.eq_ignore_ascii_case("host") {
                            return Err(RpcError::new(
                                ErrorCode::AccessDenied,
                                "a Host header is refused: the URL's host is the one sent".to_string(),
                            ));
                        }
                        let value = self.policy.substitute(value).map_err(rpc)?;
                        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                            return Err(p.bad(&format!("header {name} holds a CR, LF or NUL")));
                        }
                        headers.push(Header { name: name.to_string(), value: value.into_bytes() });
                    }
                }
                let (method, body) = if method == "http.post" {
                    let body = match p.opt("body") {
                        None => Vec::new(),
                        Some(_) => p.content("body", "encoding", true)?,
                    };
                    if body.len() > self.cfg.max_file {
                        return Err(RpcError::new(
                            ErrorCode::Internal,
                            format!("body of {} bytes exceeds --max-file {}", body.len(), self.cfg.max_file),
                        ));
                    }
                    (HttpMethod::Post, body)
                } else {
                    (HttpMethod::Get, Vec::new())
                };
                Ok(Prepared::Call(Call::Http(HttpRequest {
                    method,
                    url,
                    headers,
                    body,
                    max_body: self.cfg.max_file,
                })))
            }
            "process.run" => {
                let program = self.policy.check_program(p.str("program")?).map_err(rpc)?;
                let args = match p.opt("args") {
                    None => Vec::new(),
                    Some(_) => p.str_list("args")?,
                };
                if args.iter().any(|a| a.contains('\0')) {
                    return Err(p.bad("an argument holds a NUL byte"));
                }
                let mut env = vec![("PATH".to_string(), self.policy.path_env().to_string())];
                if p.opt("envs").is_some() {
                    for name in p.str_list("envs")? {
                        if !self.policy.env_allowed(&name) {
                            return Err(RpcError::new(
                                ErrorCode::AccessDenied,
                                format!("variable {name} is not --env-allow'ed"),
                            ));
                        }
                        if let Ok(v) = self.policy.env_value(&name) {
                            if name != "PATH" {
                                env.push((name.clone(), v.to_string()));
                            }
                        }
                    }
                }
                Ok(Prepared::Call(Call::Process(ProcessRun {
                    program,
                    args,
                    env,
                    cwd: self.policy.project().to_path_buf(),
                    max_output: self.cfg.max_file,
                })))
            }
            "cancel" => {
                // A cancel sent as a request: done now, answered `{}` in turn.
                let target = params
                    .get("id")
                    .and_then(Id::from_value)
                    .ok_or_else(|| p.bad("id must be a number or a string"))?;
                if &target != id {
                    self.cancel_request(&target);
                }
                Ok(Prepared::Reply(json!({})))
            }
            other => {
                Err(RpcError::new(ErrorCode::MethodNotFound, format!("method {other:?} does not exist")))
            }
        }
    }

    // ---- ending ----

    fn protocol_error(&mut self, message: String) {
        self.begin_finish(OutcomeKind::ProtocolError, Some(message), self.cfg.kill_grace, false);
    }

    /// Decide the outcome: pending requests are answered `-32005`, the
    /// tool told (`cancel`) if asked, stdin closed, SIGTERM after `grace`.
    fn begin_finish(&mut self, kind: OutcomeKind, message: Option<String>, grace: Duration, cancel: bool) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        self.phase = Phase::Finishing { kind, message };
        if let Some(s) = self.in_service.take() {
            self.out.push_back(Output::CancelEffect(s.effect));
            self.respond(Some(s.id), Err(cancelled("cancelled: the tool run is ending")));
        }
        // Each queued line gets its answer: one already decided (an
        // invalid line's, with `id: null` too) as it is, a request that
        // would need an effect `-32005`.
        while let Some((e, _)) = self.queue.pop_front() {
            match e {
                Entry::Ready { id, reply } => self.respond(id, reply),
                Entry::Op { id, .. } => {
                    self.respond(Some(id), Err(cancelled("cancelled: the tool run is ending")))
                }
            }
        }
        if cancel {
            self.notify("cancel", None);
        }
        if self.stdin_open {
            self.stdin_open = false;
            self.out.push_back(Output::CloseStdin);
        }
        if self.exited.is_none() {
            self.term_at = Some(self.now.saturating_add(grace));
        }
    }

    fn on_user_signal(&mut self, sig: UserSignal) {
        let kind = OutcomeKind::Cancelled(sig.number());
        let msg = format!("cancelled by signal {}", sig.number());
        self.begin_finish(kind, Some(msg), self.cfg.cancel_grace, true);
    }

    fn run_timers(&mut self) {
        let now = self.now;
        if let Some(s) = &self.in_service {
            if matches!(self.phase, Phase::Running)
                && now >= s.deadline
                && !self.bug(PlantedBug::ToolNoOpTimeout)
            {
                if let Some(s) = self.in_service.take() {
                    self.out.push_back(Output::CancelEffect(s.effect));
                    if self.bug(PlantedBug::ToolAnswersLateResult) {
                        self.abandoned.push((s.effect, s.id.clone()));
                    }
                    let e = RpcError::new(
                        ErrorCode::Timeout,
                        format!(
                            "{} timed out after {}s (--op-timeout)",
                            s.kind,
                            self.cfg.op_timeout.as_secs_f64()
                        ),
                    );
                    self.respond(Some(s.id), Err(e));
                }
            }
        }
        if matches!(self.phase, Phase::Running)
            && self.in_service.is_none()
            && (self.queue.is_empty() || self.stdin_stalled())
            && self.exited.is_none()
            && now >= self.last_activity.saturating_add(self.cfg.timeout)
        {
            let msg = format!("the tool was silent for {}s (--timeout)", self.cfg.timeout.as_secs_f64());
            self.begin_finish(OutcomeKind::Timeout, Some(msg), Duration::ZERO, false);
        }
        if self.term_at.is_some_and(|t| now >= t) {
            self.term_at = None;
            self.out.push_back(Output::Signal(Signal::Term));
            self.kill_at = Some(now.saturating_add(self.cfg.kill_grace));
        }
        if self.kill_at.is_some_and(|t| now >= t) {
            self.kill_at = None;
            if !self.bug(PlantedBug::ToolNoKill) {
                self.out.push_back(Output::Signal(Signal::Kill));
            }
        }
    }

    fn maybe_finish(&mut self) {
        let Some((exit, at)) = self.exited else { return };
        if !self.stdout_eof && self.now < at.saturating_add(self.cfg.kill_grace) {
            return;
        }
        if matches!(self.phase, Phase::Running) {
            self.drain_dead();
            if matches!(self.phase, Phase::Running) {
                self.phase = Phase::Finishing { kind: OutcomeKind::NoResult, message: None };
            }
        }
        let Phase::Finishing { kind, message } = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let mut content = std::mem::take(&mut self.final_content);
        let message = match (&kind, message) {
            (OutcomeKind::NoResult, _) => Some(self.no_result_message(exit)),
            (_, m) => m,
        };
        if let Some(m) = message {
            content = vec![text_block(m)];
        }
        let outcome = Outcome {
            kind,
            content,
            error: self.final_error.take(),
            states: std::mem::take(&mut self.states),
            tool_exit: exit,
        };
        if self.stdin_open {
            self.stdin_open = false;
            self.out.push_back(Output::CloseStdin);
        }
        self.queue.clear();
        self.pending_ids.clear();
        self.out.push_back(Output::Finished { line: outcome.to_line(), exit_status: outcome.exit_status() });
    }

    fn no_result_message(&self, exit: ToolExit) -> String {
        let status = match exit {
            ToolExit::Code(c) => format!("exit code {c}"),
            ToolExit::Signal(s) => format!("signal {s}"),
        };
        let (a, b) = self.stderr.as_slices();
        let tail = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if tail.is_empty() {
            format!("the tool ended ({status}) without a result; its stderr was empty")
        } else {
            format!("the tool ended ({status}) without a result; the end of its stderr:\n{tail}")
        }
    }
}

/// What the host holds on the heap whatever the tool does: its tables,
/// the policy's compiled rules, the line decoder's kept capacity, the
/// scratch of one step. The constant a heap check adds to
/// [`Host::heap_allowance`].
#[doc(hidden)]
pub const HEAP_SLACK: u64 = 256 << 10;
/// A line's parsed form (its JSON value, or the request prepared from
/// it) takes at most this many times the line's bytes: the worst is an
/// array of one-entry objects, each 7 bytes of text and a map node of
/// its own (`heap_tests` measures it).
#[doc(hidden)]
pub const HEAP_PER_LINE_BYTE: u64 = 128;
/// Held per unanswered request beyond its line's share: its queue entry,
/// its pending id, the record of an effect in flight.
#[doc(hidden)]
pub const HEAP_PER_REQUEST: u64 = 1 << 10;

impl Host {
    /// What each limit lets the host hold on the heap now, for the
    /// harnesses that count what it really holds (the simulator's and the
    /// fuzz targets' `bounded_memory` check), outputs drained:
    /// - `max_line`: the decoder's buffer, a partial line under
    ///   `max_line` with up to as many consumed bytes before it, grown by
    ///   doubling;
    /// - `max_pending`: each unanswered request, its line's parsed form
    ///   (one in service keeps its id, as long as its line);
    /// - `max_line` (kept messages): the states and final message the
    ///   outcome is made of, their lines' parsed forms;
    /// - `stderr_tail`: the tail, and one read beside it before the drain;
    /// - output not yet drained, as written.
    #[doc(hidden)]
    pub fn heap_allowance(&self) -> Vec<HeapShare> {
        let c = &self.cfg;
        let growth = HEAP_GROWTH;
        let line = |n: usize| (n as u64).saturating_mul(HEAP_PER_LINE_BYTE);
        let mut shares = Vec::new();
        if self.decoder.buffered() > 0 {
            let span = (c.max_line as u64).saturating_add(1 + MAX_READ_CHUNK as u64);
            shares.push(HeapShare { limit: "max_line", bytes: 2 * growth * span, per_byte: true });
        }
        let in_service = self.in_service.as_ref().map_or(0, |s| s.line);
        let queued = self.queue.iter().fold(line(in_service), |a, (_, n)| a.saturating_add(line(*n)));
        let requests = self.unanswered().min(self.cfg.max_pending.saturating_add(1)) as u64;
        shares.push(HeapShare {
            limit: "max_pending",
            bytes: queued.saturating_add(requests.saturating_mul(HEAP_PER_REQUEST)),
            per_byte: true,
        });
        shares.push(HeapShare {
            limit: "max_line (states and result kept)",
            bytes: line(self.kept_line_bytes),
            per_byte: true,
        });
        if !self.stderr.is_empty() {
            let tail = (c.stderr_tail as u64).saturating_add(MAX_READ_CHUNK as u64);
            shares.push(HeapShare { limit: "stderr_tail", bytes: growth * tail, per_byte: true });
        }
        let undrained: u64 = self
            .out
            .iter()
            .map(|o| match o {
                Output::ToolStdin(b) | Output::Finished { line: b, .. } => b.len() as u64,
                _ => 64,
            })
            .sum();
        shares.push(HeapShare { limit: "max_stdin_backlog", bytes: growth * undrained, per_byte: true });
        shares
    }

    /// `held` bytes on the heap against [`Host::heap_allowance`] plus
    /// [`HEAP_SLACK`]; over it, what the check reports, naming the limit
    /// broken.
    #[doc(hidden)]
    pub fn heap_check(&self, held: u64) -> Result<(), String> {
        if held <= HEAP_SLACK {
            return Ok(());
        }
        heap_verdict(held, HEAP_SLACK, &self.heap_allowance())
    }
}

impl ToolPolicy {
    pub(crate) fn set_limits(&mut self, max_file: usize, max_grep_lines: usize) {
        self.gate_mut().set_limits(max_file, max_grep_lines);
    }
}

enum Prepared {
    Call(Call),
    Reply(Value),
}

fn cancelled(m: &str) -> RpcError {
    RpcError::new(ErrorCode::Cancelled, m)
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `params.content` of a `result`: a string becomes one text block; an
/// array must hold objects with a string `type`.
fn content_of(v: Option<&Value>) -> Option<Vec<Value>> {
    match v? {
        Value::String(s) => Some(vec![text_block(s.clone())]),
        Value::Array(a) if a.iter().all(|b| b.get("type").is_some_and(Value::is_string)) => Some(a.clone()),
        _ => None,
    }
}

/// Reading a request's params, with `-32602` messages that say which
/// field and why.
struct Params<'a> {
    method: &'a str,
    v: &'a Value,
}

impl<'a> Params<'a> {
    fn bad(&self, why: &str) -> RpcError {
        RpcError::new(ErrorCode::InvalidParams, format!("{}: {why}", self.method))
    }

    fn opt(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    fn str(&self, key: &str) -> Result<&'a str, RpcError> {
        match self.v.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(self.bad(&format!("{key} must be a string"))),
            None => Err(self.bad(&format!("{key} is missing"))),
        }
    }

    fn str_list(&self, key: &str) -> Result<Vec<String>, RpcError> {
        let bad = || self.bad(&format!("{key} must be an array of strings"));
        self.opt(key)
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .iter()
            .map(|x| x.as_str().map(str::to_owned).ok_or_else(bad))
            .collect()
    }

    /// A string payload, base64-decoded when `enc_key` says `base64`.
    fn content(&self, key: &str, enc_key: &str, required: bool) -> Result<Vec<u8>, RpcError> {
        let text = match self.v.get(key) {
            Some(Value::String(s)) => s.as_str(),
            None if !required => "",
            _ => return Err(self.bad(&format!("{key} must be a string"))),
        };
        match self.opt(enc_key) {
            None => Ok(text.as_bytes().to_vec()),
            Some(Value::String(e)) if e == "base64" => {
                b64::decode(text).map_err(|e| self.bad(&format!("{key} is not valid base64 ({e})")))
            }
            Some(Value::String(e)) if e == "utf-8" || e == "utf8" => Ok(text.as_bytes().to_vec()),
            Some(other) => Err(self.bad(&format!("{enc_key} {other} is not \"base64\""))),
        }
    }
}
