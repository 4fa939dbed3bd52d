//! One HTTP request to `/exec`, from head to last byte: see the module
//! documentation of [`super`] for the sequence.

use super::auth::{token_from_authorization, token_matches};
use super::config::*;
use super::form::{decode_form, resolve_cwd};
use super::gate::HEAP_PER_EXCHANGE;
use crate::fsproxy::bounds::{HeapShare, HEAP_GROWTH};
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// A request head as hyper parsed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestHead {
    pub method: String,
    /// The URI path, without the query.
    pub path: String,
    /// Every header in arrival order; names lowercase.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The request is HTTP/1.1: only then can the answer be chunked and
    /// carry a trailer (HTTP/1.0 has neither, and its body would lose
    /// the exit code).
    pub http11: bool,
}

impl RequestHead {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }
}

/// Whether one `TE` value accepts trailers, read exactly as the HTTP layer
/// (hyper) reads it when it decides whether to send a response's trailers:
/// a value of visible ASCII (and spaces and tabs) whose comma-separated
/// list holds the bare token `trailers`. Reading it more widely (another
/// byte elsewhere in the value, a `;` parameter, which RFC 9110 gives
/// `trailers` none of) would answer in streaming mode with the exit code in
/// a trailer the HTTP layer then drops.
pub(crate) fn te_has_trailers(value: &[u8]) -> bool {
    value.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        && value.split(|&b| b == b',').any(|token| token.trim_ascii().eq_ignore_ascii_case(b"trailers"))
}

/// How the tool ended, as `waitpid` reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// The `X-Exit-Code` it maps to: the code, or 128+N for signal N.
    pub fn exit_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(n) => 128i32.saturating_add(n),
        }
    }
}

/// Why the shell could not start the tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnError {
    /// The program is not there: 409.
    NotInstalled,
    /// `cwd` does not exist, is not a directory, or leaves the working
    /// directory through a symlink: 400.
    BadCwd(String),
    /// Anything else: 500.
    Other(String),
}

/// Signals to the tool's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    Term,
    Kill,
}

/// What the shell must start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpawnRequest {
    /// The name the client asked for.
    pub tool: String,
    pub program: ToolProgram,
    /// Arguments after the program name, as given; no shell.
    pub args: Vec<Vec<u8>>,
    /// Absolute and lexically inside the working directory.
    pub cwd: Vec<u8>,
}

/// A whole HTTP answer (or, in [`Output::SendHead`], its head only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Response {
    pub status: u16,
    /// Title-case names, in the order to send.
    pub headers: Vec<(&'static str, String)>,
    #[serde(serialize_with = "crate::b64::serialize")]
    pub body: Vec<u8>,
}

/// How the answer is shaped, decided from the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// v1, and v2 without `TE: trailers`: one answer after exit.
    Buffered,
    /// v2 with `TE: trailers`: chunked, exit code in the trailer.
    Streaming,
}

/// Events the shell reports. (Serialized for traces; bytes as base64.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    Head(RequestHead),
    Body(#[serde(with = "crate::b64")] Vec<u8>),
    BodyEnd,
    Spawned(Result<(), SpawnError>),
    /// Bytes read from the tool's pipe (stdout and stderr share it), after
    /// an [`Output::ReadOutput`] or [`Output::ReadNow`]; never more than its
    /// `max`.
    ToolOutput(#[serde(with = "crate::b64")] Vec<u8>),
    /// The pipe is at EOF; after a [`Output::ReadNow`], also that it held
    /// nothing then.
    ToolEof,
    ToolExited(ExitStatus),
    /// The client's side took this many streamed bytes.
    ClientTook(u64),
    /// EOF from the client, or a failed write.
    ClientGone,
    /// The server is stopping: the tool is stopped as on a timeout (TERM,
    /// KILL after the grace) and its answer ends normally, with the exit
    /// code its death gives.
    Shutdown,
}

/// Effects for the shell, in order. (Serialized for traces, compared as
/// JSON there: a response's header names are `'static`.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// The head passed every check: read the body.
    ReadBody,
    /// Send this whole answer (error, v1, 504, 507), then close.
    Respond(Response),
    Spawn(SpawnRequest),
    /// Read once from the tool's pipe, at most `max` bytes.
    ReadOutput {
        max: usize,
    },
    /// The drain grace after the tool's exit has run out: give up the
    /// waiting read, and read at most `max` bytes of what the pipe holds
    /// now without waiting; report [`Input::ToolEof`] if it holds nothing.
    ReadNow {
        max: usize,
    },
    /// Send the streaming head (200, chunked, `Trailer: X-Exit-Code`).
    SendHead(Response),
    SendChunk(#[serde(serialize_with = "crate::b64::serialize")] Vec<u8>),
    /// End the stream: last chunk with trailer `X-Exit-Code: exit_code`.
    Finish {
        exit_code: i32,
    },
    /// Signal the tool's process group.
    Signal(Signal),
    /// The exchange is over: close the pipe and the connection.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Body,
    Spawning,
    Running,
    Over,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    None,
    Termed { kill_at: Instant },
    Killed,
}

/// The machine for one request.
#[derive(Debug)]
pub struct Exchange {
    config: std::sync::Arc<Config>,
    phase: Phase,
    now: Instant,
    mode: Mode,
    body: Vec<u8>,
    buffered: Vec<u8>,
    /// Streamed bytes handed to the shell the client has not taken yet.
    waiting: u64,
    head_sent: bool,
    responded: bool,
    read_outstanding: bool,
    eof: bool,
    exited: Option<ExitStatus>,
    deadline: Option<Instant>,
    drain_deadline: Option<Instant>,
    /// What is left of the drain grace while the pipe is not being read
    /// because the client has not taken what it was sent: the tool's own
    /// last bytes may still be in the pipe, and a slow reader must not
    /// lose them (the clock runs only while airlock waits on the pipe).
    drain_paused: Option<Duration>,
    /// Bytes the final drain may still read, once the drain grace has run
    /// out: what the pipe holds is the tool's output and is read without
    /// waiting for more.
    final_drain: Option<u64>,
    /// The body must be complete by then (a slow body holds a connection
    /// permit like a slow head).
    body_deadline: Option<Instant>,
    kill: Kill,
    timed_out: bool,
    client_gone: bool,
    shutting_down: bool,
    out: VecDeque<Output>,
}

fn text_headers(exit_code: i32) -> Vec<(&'static str, String)> {
    vec![
        ("Content-Type", "text/plain; charset=utf-8".to_owned()),
        ("X-Exit-Code", exit_code.to_string()),
        ("Connection", "close".to_owned()),
    ]
}

fn error_response(status: u16, body: String) -> Response {
    Response { status, headers: text_headers(EXIT_CODE_ERROR), body: body.into_bytes() }
}

/// Bytes a peer chose, safe on one line of an answer or a log.
fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

impl Exchange {
    pub fn new(config: std::sync::Arc<Config>, now: Instant) -> Self {
        Exchange {
            config,
            phase: Phase::Head,
            now,
            mode: Mode::Buffered,
            body: Vec::new(),
            buffered: Vec::new(),
            waiting: 0,
            head_sent: false,
            responded: false,
            read_outstanding: false,
            eof: false,
            exited: None,
            deadline: None,
            drain_deadline: None,
            drain_paused: None,
            final_drain: None,
            body_deadline: None,
            kill: Kill::None,
            timed_out: false,
            client_gone: false,
            shutting_down: false,
            out: VecDeque::new(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Streamed bytes not yet taken by the client.
    pub fn waiting_bytes(&self) -> u64 {
        self.waiting
    }

    /// Bytes held for a buffered answer.
    pub fn buffered_bytes(&self) -> u64 {
        self.buffered.len() as u64
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Over && self.out.is_empty()
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.phase == Phase::Body {
            return self.body_deadline;
        }
        if self.phase != Phase::Running {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if self.exited.is_none() {
            if !self.timed_out {
                consider(self.deadline);
            }
            if let Kill::Termed { kill_at } = self.kill {
                consider(Some(kill_at));
            }
        } else if !self.eof {
            consider(self.drain_deadline);
        }
        next
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.timers(now, true);
    }

    /// `drain`: whether the drain grace may end here. It may not just
    /// before a read's result is applied: that read has completed, and
    /// withdrawing it would make two reads outstanding.
    fn timers(&mut self, now: Instant, drain: bool) {
        self.advance(now);
        if self.phase == Phase::Body && self.body_deadline.is_some_and(|d| d <= self.now) {
            let secs = self.config.header_timeout.as_secs();
            return self.reject(error_response(
                408,
                format!("toolexec: request body not complete within {secs} s (--header-timeout)\n"),
            ));
        }
        if self.phase != Phase::Running {
            return;
        }
        let now = self.now;
        if self.exited.is_none() {
            if !self.timed_out && self.deadline.is_some_and(|d| d <= now) {
                self.timed_out = true;
                self.begin_kill();
            }
            if let Kill::Termed { kill_at } = self.kill {
                if kill_at <= now {
                    self.kill = Kill::Killed;
                    self.out.push_back(Output::Signal(Signal::Kill));
                }
            }
        } else if drain && !self.eof && self.drain_deadline.is_some_and(|d| d <= now) {
            // An escaped grandchild holds the pipe: stop waiting for it. What
            // the pipe already holds is the tool's and is read out now (a
            // late timer, after a stall of this process, must not cut it).
            self.drain_deadline = None;
            self.final_drain = Some(self.config.final_drain);
            self.read_outstanding = false;
            self.try_read();
        }
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        let read_result = matches!(input, Input::ToolOutput(_) | Input::ToolEof);
        self.timers(now, !read_result);
        match input {
            Input::Head(head) => self.on_head(&head),
            Input::Body(bytes) => self.on_body(&bytes),
            Input::BodyEnd => self.on_body_end(),
            Input::Spawned(result) => self.on_spawned(result),
            Input::ToolOutput(bytes) => self.on_output(bytes),
            Input::ToolEof => {
                if self.phase == Phase::Running {
                    self.read_outstanding = false;
                    self.eof = true;
                    self.maybe_finish();
                }
            }
            Input::ToolExited(status) => self.on_exited(status),
            Input::ClientTook(n) => {
                self.waiting = self.waiting.saturating_sub(n);
                self.maybe_read();
            }
            Input::ClientGone => self.on_client_gone(),
            Input::Shutdown => self.on_shutdown(),
        }
        if read_result {
            self.timers(self.now, true);
        }
    }

    fn reject(&mut self, response: Response) {
        self.out.push_back(Output::Respond(response));
        self.responded = true;
        self.phase = Phase::Over;
        self.out.push_back(Output::Done);
    }

    fn on_head(&mut self, head: &RequestHead) {
        if self.phase != Phase::Head {
            return;
        }
        if head.path != EXEC_PATH {
            return self.reject(error_response(
                404,
                format!("toolexec: not found: {} (only {EXEC_PATH} is served)\n", show(head.path.as_bytes())),
            ));
        }
        if head.method != "POST" {
            let mut r = error_response(
                405,
                format!("toolexec: method not allowed: {} (use POST)\n", show(head.method.as_bytes())),
            );
            r.headers.push(("Allow", "POST".to_owned()));
            return self.reject(r);
        }
        let mut auth = head.values("authorization");
        let authorized = match (auth.next(), auth.next()) {
            (Some(value), None) => {
                token_from_authorization(value).is_some_and(|t| token_matches(&self.config.token, t))
            }
            _ => false,
        };
        if !authorized {
            let mut r = error_response(401, "toolexec: unauthorized: missing or invalid token\n".to_owned());
            r.headers.push(("WWW-Authenticate", "Bearer".to_owned()));
            return self.reject(r);
        }
        let mut proto = head.values("x-aifo-proto");
        let version = match (proto.next(), proto.next()) {
            (Some(b"1"), None) => 1,
            (Some(b"2"), None) => 2,
            _ => {
                let r = Response {
                    status: 426,
                    headers: text_headers(EXIT_CODE_ERROR),
                    body: UNSUPPORTED_PROTO_BODY.as_bytes().to_vec(),
                };
                return self.reject(r);
            }
        };
        let te_trailers = head.values("te").any(te_has_trailers);
        self.mode = if version == 2 && te_trailers && head.http11 { Mode::Streaming } else { Mode::Buffered };
        let mut lengths = head.values("content-length");
        if let Some(len) = lengths.next() {
            let parsed = std::str::from_utf8(len).ok().and_then(|s| s.trim().parse::<u64>().ok());
            match parsed {
                Some(n) if n > self.config.max_body => return self.reject_too_large(),
                Some(_) => {}
                None => {
                    return self.reject(error_response(
                        400,
                        "toolexec: bad request: bad Content-Length\n".to_owned(),
                    ))
                }
            }
        }
        self.phase = Phase::Body;
        self.body_deadline = Some(self.now.saturating_add(self.config.header_timeout));
        self.out.push_back(Output::ReadBody);
    }

    fn reject_too_large(&mut self) {
        let limit = self.config.max_body;
        self.reject(error_response(
            413,
            format!("toolexec: request body too large: limit {limit} bytes (--max-body)\n"),
        ));
    }

    fn on_body(&mut self, bytes: &[u8]) {
        if self.phase != Phase::Body {
            return;
        }
        if (self.body.len() as u64).saturating_add(bytes.len() as u64) > self.config.max_body {
            self.body = Vec::new();
            return self.reject_too_large();
        }
        self.body.extend_from_slice(bytes);
    }

    fn on_body_end(&mut self) {
        if self.phase != Phase::Body {
            return;
        }
        let body = std::mem::take(&mut self.body);
        let form = match decode_form(&body) {
            Ok(f) => f,
            Err(e) => return self.reject(error_response(400, format!("toolexec: bad request: {e}\n"))),
        };
        let cwd = match resolve_cwd(&self.config.workdir, form.cwd.as_deref()) {
            Ok(c) => c,
            Err(why) => return self.reject(error_response(400, format!("toolexec: bad request: {why}\n"))),
        };
        let program = std::str::from_utf8(&form.tool)
            .ok()
            .and_then(|name| self.config.tools.get(name).map(|p| (name, p)));
        let Some((name, program)) = program else {
            return self
                .reject(error_response(403, format!("toolexec: tool not allowed: {}\n", show(&form.tool))));
        };
        self.phase = Phase::Spawning;
        self.out.push_back(Output::Spawn(SpawnRequest {
            tool: name.to_owned(),
            program: program.clone(),
            args: form.args,
            cwd,
        }));
    }

    fn on_spawned(&mut self, result: Result<(), SpawnError>) {
        if self.phase != Phase::Spawning {
            return;
        }
        match result {
            Err(e) => {
                if self.client_gone {
                    self.phase = Phase::Over;
                    self.out.push_back(Output::Done);
                    return;
                }
                let r = match e {
                    SpawnError::NotInstalled => {
                        error_response(409, "toolexec: tool not installed: program not found\n".to_owned())
                    }
                    SpawnError::BadCwd(why) => {
                        error_response(400, format!("toolexec: bad request: cwd: {}\n", show(why.as_bytes())))
                    }
                    SpawnError::Other(why) => {
                        error_response(500, format!("toolexec: spawn failed: {}\n", show(why.as_bytes())))
                    }
                };
                self.reject(r);
            }
            Ok(()) => {
                self.phase = Phase::Running;
                self.deadline = Some(self.now.saturating_add(self.config.timeout));
                if self.client_gone || self.shutting_down {
                    self.begin_kill();
                }
                self.maybe_read();
            }
        }
    }

    fn begin_kill(&mut self) {
        if self.kill == Kill::None && self.exited.is_none() {
            self.kill = Kill::Termed { kill_at: self.now.saturating_add(self.config.kill_grace) };
            self.out.push_back(Output::Signal(Signal::Term));
        }
    }

    fn maybe_read(&mut self) {
        self.try_read();
        self.drain_clock();
    }

    /// After the tool's exit, the drain grace runs only while a read of
    /// the pipe is outstanding; while reading is held back for the
    /// client's window it is paused, and resumes with what was left.
    /// (After the EOF the grace is never read: `poll_timeout`, `timers`.)
    fn drain_clock(&mut self) {
        if self.exited.is_none() {
            return;
        }
        if self.read_outstanding {
            if let Some(left) = self.drain_paused.take() {
                self.drain_deadline = Some(self.now.saturating_add(left));
            }
        } else if let Some(d) = self.drain_deadline.take() {
            self.drain_paused = Some(d.saturating_duration_since(self.now));
        }
    }

    fn try_read(&mut self) {
        if self.phase != Phase::Running || self.read_outstanding || self.eof {
            return;
        }
        let chunk = self.config.read_chunk.max(1);
        let max = if self.client_gone || self.responded || self.mode == Mode::Buffered {
            chunk
        } else {
            let room = self.config.stream_window.saturating_sub(self.waiting);
            usize::try_from(room).unwrap_or(usize::MAX).min(chunk)
        };
        let Some(left) = self.final_drain else {
            if max > 0 {
                self.read_outstanding = true;
                self.out.push_back(Output::ReadOutput { max });
            }
            return;
        };
        if left == 0 {
            self.eof = true;
            return self.maybe_finish();
        }
        let max = usize::try_from(left).unwrap_or(usize::MAX).min(max);
        if max > 0 {
            self.read_outstanding = true;
            self.out.push_back(Output::ReadNow { max });
        }
    }

    fn on_output(&mut self, bytes: Vec<u8>) {
        if self.phase != Phase::Running {
            return;
        }
        self.read_outstanding = false;
        if bytes.is_empty() {
            self.eof = true;
            return self.maybe_finish();
        }
        if let Some(left) = self.final_drain.as_mut() {
            *left = left.saturating_sub(bytes.len() as u64);
        }
        if self.client_gone || self.responded {
            // Drained so the tool never blocks on a full pipe; nobody reads it.
        } else if self.mode == Mode::Streaming {
            if !self.head_sent {
                self.send_head();
            }
            self.waiting = self.waiting.saturating_add(bytes.len() as u64);
            self.out.push_back(Output::SendChunk(bytes));
        } else if (self.buffered.len() as u64).saturating_add(bytes.len() as u64) > self.config.max_buffered {
            let limit = self.config.max_buffered;
            self.buffered = Vec::new();
            self.begin_kill();
            self.out.push_back(Output::Respond(error_response(
                507,
                format!(
                    "toolexec: output exceeds {limit} bytes (--max-buffered); use protocol 2 to stream\n"
                ),
            )));
            self.responded = true;
        } else {
            self.buffered.extend_from_slice(&bytes);
        }
        self.maybe_read();
    }

    fn send_head(&mut self) {
        self.head_sent = true;
        self.out.push_back(Output::SendHead(Response {
            status: 200,
            headers: vec![
                ("Content-Type", "text/plain; charset=utf-8".to_owned()),
                ("Trailer", "X-Exit-Code".to_owned()),
                ("Connection", "close".to_owned()),
            ],
            body: Vec::new(),
        }));
    }

    fn on_exited(&mut self, status: ExitStatus) {
        if self.phase != Phase::Running || self.exited.is_some() {
            return;
        }
        self.exited = Some(status);
        // Whatever the tool left behind in its group dies with it, so the
        // pipe reaches EOF.
        self.kill = Kill::Killed;
        self.out.push_back(Output::Signal(Signal::Kill));
        // Output still in the pipe is read meanwhile: a tool killed with a
        // full pipe loses nothing.
        self.drain_deadline = Some(self.now.saturating_add(self.config.kill_grace));
        self.drain_clock();
        self.maybe_finish();
    }

    fn on_shutdown(&mut self) {
        match self.phase {
            Phase::Head | Phase::Body => {
                self.reject(error_response(503, "toolexec: server shutting down\n".to_owned()));
            }
            Phase::Running => self.begin_kill(),
            Phase::Spawning => self.shutting_down = true,
            Phase::Over => {}
        }
    }

    fn on_client_gone(&mut self) {
        if self.client_gone {
            return;
        }
        self.client_gone = true;
        self.waiting = 0;
        match self.phase {
            Phase::Head | Phase::Body => {
                self.phase = Phase::Over;
                self.out.push_back(Output::Done);
            }
            Phase::Spawning | Phase::Over => {}
            Phase::Running => {
                self.begin_kill();
                self.maybe_read();
                self.maybe_finish();
            }
        }
    }

    fn maybe_finish(&mut self) {
        if self.phase != Phase::Running || !self.eof {
            return;
        }
        let Some(status) = self.exited else { return };
        self.phase = Phase::Over;
        let code = if self.timed_out { EXIT_CODE_TIMEOUT } else { status.exit_code() };
        if self.client_gone || self.responded {
        } else if self.mode == Mode::Streaming && self.head_sent {
            if self.timed_out {
                let line = format!("toolexec: timed out after {} s\n", self.config.timeout.as_secs());
                self.out.push_back(Output::SendChunk(line.into_bytes()));
            }
            self.out.push_back(Output::Finish { exit_code: code });
        } else if self.timed_out {
            let body = std::mem::take(&mut self.buffered);
            self.out.push_back(Output::Respond(Response {
                status: 504,
                headers: text_headers(EXIT_CODE_TIMEOUT),
                body,
            }));
        } else if self.mode == Mode::Streaming {
            self.send_head();
            self.out.push_back(Output::Finish { exit_code: code });
        } else {
            let body = std::mem::take(&mut self.buffered);
            self.out.push_back(Output::Respond(Response { status: 200, headers: text_headers(code), body }));
        }
        self.responded = true;
        self.out.push_back(Output::Done);
    }

    /// What each limit lets this exchange hold on the heap now, for the
    /// harnesses that count what it really holds (the simulator's
    /// `bounded_memory` check): the body received so far (under
    /// `max_body`) and a buffered answer's output (under `max_buffered`),
    /// each grown by doubling; output not yet drained, as handed out; and
    /// [`HEAP_PER_EXCHANGE`] for the exchange itself.
    #[doc(hidden)]
    pub fn heap_allowance(&self) -> Vec<HeapShare> {
        let c = &self.config;
        let bytes = |limit: &'static str, counted: u64, max: u64| HeapShare {
            limit,
            bytes: HEAP_GROWTH.saturating_mul(counted.min(max)),
            per_byte: true,
        };
        let undrained: u64 = self
            .out
            .iter()
            .map(|o| match o {
                Output::Respond(r) | Output::SendHead(r) => r.body.len() as u64 + 256,
                Output::SendChunk(b) => b.len() as u64,
                Output::Spawn(s) => s.args.iter().map(|a| a.len() as u64 + 24).sum::<u64>() + 256,
                _ => 0,
            })
            .sum();
        vec![
            bytes("max_body", self.body.len() as u64, c.max_body),
            bytes("max_buffered", self.buffered.len() as u64, c.max_buffered),
            HeapShare {
                limit: "stream_window",
                bytes: HEAP_GROWTH.saturating_mul(undrained),
                per_byte: true,
            },
            HeapShare { limit: "max_connections", bytes: HEAP_PER_EXCHANGE, per_byte: false },
        ]
    }

    /// The configured timeout, for the shell's log line.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }
}
