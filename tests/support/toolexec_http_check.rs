//! Raw bytes through hyper into the ToolExec [`Service`], with a fake
//! runner, and the checks on what comes back. Shared, source for source, by
//! the `toolexec_http` fuzz target and `tests/toolexec_http_corpus.rs`
//! (each includes this file with `#[path]`), so a corpus input is judged
//! the same way in both.
//!
//! One input is one client connection: its bytes are written to one end of
//! an in-memory duplex stream and the server's bytes are read back until
//! EOF. The service takes a client's EOF for its departure (hyper's
//! `half_close(false)`), so the write side is shut down only once the
//! server has nothing left to do: on a current-thread runtime with paused
//! time, a short sleep after the write ends exactly when every other task
//! waits, before any of the service's own timers. The checks:
//! - everything read back is at most one well-formed HTTP/1.1 response and
//!   nothing after it (the service answers one request per connection);
//! - exactly one response whenever the input starts with a complete
//!   request (a head httparse accepts and, with no `Transfer-Encoding`, all
//!   the body its `Content-Length` announces); an input that never forms
//!   one (empty, a truncated head, a truncated body) may get no answer,
//!   since the client left before the request was whole;
//! - every status is one the seed allows, and every answer of the service
//!   carries `X-Exit-Code` (a header, or the trailer of a chunked stream);
//!   after a spawn, a 200's exit code is the fake tool's. The one exception
//!   is hyper's own answer to what is not an HTTP/1.1 request at all
//!   (`HTTP_LAYER_STATUSES`, empty body, nothing spawned), which the
//!   service never sees and which no shim sends;
//! - no spawn unless the tool is allowed, and none at all when the input
//!   does not contain the token;
//! - one input ends within `RUN_LIMIT` (fake tools exit at once, and the
//!   client's EOF ends every wait);
//! - where the counting allocator is installed (the fuzz target, the
//!   corpus replay): once the connection and its runtime are gone, nothing
//!   they allocated is still held but the answer read back, and serving
//!   held at most [`SERVE_PEAK_PER_BYTE`] times the input plus
//!   [`SERVE_PEAK_SLACK`] at once.

use airlock::toolexec::{Runner, Service, ToolOutput, ToolProcess};
use airlock_core::heapcount::{self, Tag};
use airlock_core::toolexec::{
    validate_token, Config, ExitStatus, Signal, SpawnError, SpawnRequest, ToolProgram,
};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The server's token; inputs that should be authorized carry it.
pub const TOKEN: &str = "fuzz-token-7Qx";
/// Allowed tools whose fake spawn succeeds.
pub const RUNNING_TOOLS: &[&str] = &["echo", "cat"];
/// An allowed tool the fake runner reports as not installed (409).
pub const MISSING_TOOL: &str = "missing";
/// An allowed tool whose fake spawn fails otherwise (500).
pub const BROKEN_TOOL: &str = "broken";
/// Working directory every `cwd` must stay under.
pub const WORKDIR: &str = "/work/dir";
/// Statuses the seed allows an answer to have.
pub const ALLOWED_STATUSES: &[u16] = &[200, 400, 401, 403, 404, 405, 408, 409, 413, 426, 500, 503, 504, 507];
/// Statuses hyper answers by itself, before the service sees a request
/// (a head it cannot parse, a URI or head too large, a version it does
/// not speak). They carry no body and no `X-Exit-Code`; every answer of
/// the service has a one-line body.
pub const HTTP_LAYER_STATUSES: &[u16] = &[400, 414, 431, 505];
/// Bound on one input, in the runtime's paused time (which jumps ahead
/// only when every task waits); past it the run counts as a hang.
pub const RUN_LIMIT: Duration = Duration::from_secs(5);
/// The client's wait after its last byte, in paused time: shorter than
/// every timer of the service, so it fires first once all else is idle.
const CLIENT_LINGER: Duration = Duration::from_millis(1);
/// Bytes the in-memory connection buffers in each direction.
const DUPLEX_BUFFER: usize = 16 * 1024;
/// Exit code of a fake tool run with no arguments; each argument adds one
/// (modulo `EXIT_CODE_SPAN`), so an answer's exit code names its run.
const EXIT_CODE_BASE: i32 = 3;
const EXIT_CODE_SPAN: usize = 100;
/// Serving one connection holds at most this many times its input at
/// once (the input's copy for the client, hyper's read buffer and the
/// body the service collects)…
pub const SERVE_PEAK_PER_BYTE: u64 = 8;
/// …plus this: the runtime, hyper's connection state and buffers, the
/// in-memory duplex's two buffers.
pub const SERVE_PEAK_SLACK: u64 = 256 << 10;
/// Headers httparse is given room for when parsing either side.
const MAX_HEADERS: usize = 128;

/// The exit code the fake runner gives this spawn.
pub fn fake_exit_code(request: &SpawnRequest) -> i32 {
    EXIT_CODE_BASE + (request.args.len() % EXIT_CODE_SPAN) as i32
}

/// The fake tool's combined output: its name and arguments, one per line.
fn fake_output(request: &SpawnRequest) -> Vec<u8> {
    let mut out = request.tool.as_bytes().to_vec();
    for arg in &request.args {
        out.push(b'\n');
        out.extend_from_slice(arg);
    }
    out.push(b'\n');
    out
}

#[derive(Clone, Default)]
struct FakeRunner {
    spawns: Arc<Mutex<Vec<SpawnRequest>>>,
}

struct FakeProcess {
    code: i32,
}

struct FakeOutput {
    left: Vec<u8>,
}

impl Runner for FakeRunner {
    type Process = FakeProcess;
    type Output = FakeOutput;

    fn spawn(&self, request: &SpawnRequest) -> Result<(FakeProcess, FakeOutput), SpawnError> {
        // The harness's log, not the service's memory.
        Tag::HARNESS.scope(|| self.spawns.lock().expect("spawn log").push(request.clone()));
        match request.tool.as_str() {
            MISSING_TOOL => Err(SpawnError::NotInstalled),
            BROKEN_TOOL => Err(SpawnError::Other("fake spawn failure".to_owned())),
            _ => {
                Ok((FakeProcess { code: fake_exit_code(request) }, FakeOutput { left: fake_output(request) }))
            }
        }
    }
}

impl ToolProcess for FakeProcess {
    fn wait(&mut self) -> impl Future<Output = ExitStatus> + Send {
        let code = self.code;
        async move { ExitStatus::Code(code) }
    }

    fn signal(&self, _signal: Signal) {}
}

impl ToolOutput for FakeOutput {
    fn read(&mut self, max: usize) -> impl Future<Output = std::io::Result<Vec<u8>>> + Send {
        let rest = self.left.split_off(max.min(self.left.len()));
        let chunk = std::mem::replace(&mut self.left, rest);
        async move { Ok(chunk) }
    }

    fn read_now(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        let rest = self.left.split_off(max.min(self.left.len()));
        Ok(std::mem::replace(&mut self.left, rest))
    }
}

fn config() -> Config {
    let token = validate_token(TOKEN.as_bytes()).expect("the fuzz token is valid");
    let mut config = Config::new(token, WORKDIR);
    for tool in RUNNING_TOOLS.iter().chain([MISSING_TOOL, BROKEN_TOOL].iter()) {
        config.tools.insert((*tool).to_owned(), ToolProgram::OnPath);
    }
    config
}

/// What one connection produced.
pub struct Outcome {
    pub wire: Vec<u8>,
    pub spawns: Vec<SpawnRequest>,
}

/// Serve `input` as one connection and collect what came back.
pub fn serve(input: &[u8]) -> Outcome {
    let runner = FakeRunner::default();
    let spawns = runner.spawns.clone();
    let wire = serve_wire(input, runner);
    let spawns = spawns.lock().expect("spawn log").clone();
    Outcome { wire, spawns }
}

/// What one connection read back, its runtime gone.
fn serve_wire(input: &[u8], runner: FakeRunner) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("tokio runtime");
    let config = config();
    let header_timeout = config.header_timeout;
    let wire = rt.block_on(async {
        let (_shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let service = Arc::new(Service::new(config, runner, header_timeout, shutdown_rx));
        let (client, server) = tokio::io::duplex(DUPLEX_BUFFER);
        let served = tokio::spawn(async move { service.serve_connection(server).await });
        let (mut rd, mut wr) = tokio::io::split(client);
        let input = input.to_vec();
        let writer = tokio::spawn(async move {
            // The server may close before taking everything: not an error.
            let _ = wr.write_all(&input).await;
            tokio::time::sleep(CLIENT_LINGER).await;
            let _ = wr.shutdown().await;
            wr
        });
        let run = async {
            let mut wire = Vec::new();
            rd.read_to_end(&mut wire).await.expect("reading the answer");
            let _ = served.await;
            drop(writer.await);
            wire
        };
        tokio::time::timeout(RUN_LIMIT, run).await.expect("one input's run exceeded RUN_LIMIT")
    });
    drop(rt);
    wire
}

thread_local! {
    /// A connection was served on this thread: what a thread keeps for
    /// good (the runtime's thread-locals) is set up.
    static WARM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`serve`], measured on the heap; panics when it kept anything but its
/// answer, or held more than its bound at once.
fn serve_measured(input: &[u8]) -> Outcome {
    if !WARM.with(|w| w.replace(true)) {
        let _ = serve(b"");
    }
    let runner = FakeRunner::default();
    let spawns = runner.spawns.clone();
    let (wire, cost) = heapcount::cost(Tag::new(heapcount::MAX_TAGS - 1), || serve_wire(input, runner));
    if let Some(c) = cost {
        let kept = wire.capacity() as u64;
        assert_eq!(c.kept, kept, "serving kept {} bytes beside its answer", c.kept.saturating_sub(kept));
        let bound = SERVE_PEAK_PER_BYTE * input.len() as u64 + SERVE_PEAK_SLACK;
        assert!(
            c.peak <= bound,
            "bounded_memory: serving {} bytes peaked at {} bytes, over {bound} \
             (SERVE_PEAK_PER_BYTE, SERVE_PEAK_SLACK)",
            input.len(),
            c.peak
        );
    }
    let spawns = spawns.lock().expect("spawn log").clone();
    Outcome { wire, spawns }
}

/// What an HTTP/2 client with prior knowledge sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `bytes`, past the CRs and LFs hyper skips before a head, are
/// HTTP/2's preface: hyper closes such a connection without an answer an
/// HTTP/2 client would misread.
fn opens_with_preface(bytes: &[u8]) -> bool {
    let skip = bytes.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
    bytes[skip..].starts_with(H2_PREFACE)
}

/// Does `input` start with a whole request (see the module comment)?
pub fn forms_request(input: &[u8]) -> bool {
    // HTTP/2's connection preface is not an HTTP/1 request: hyper closes
    // the connection without an answer an HTTP/2 client would misread,
    // after the empty lines an HTTP/1 parser skips before a request too,
    // and after a lone CR as well (hyper finds the preface past it).
    if opens_with_preface(input) {
        return false;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(input) {
        Ok(httparse::Status::Complete(n)) => n,
        // A head httparse refuses (hyper parses with it too) is answered
        // by hyper itself.
        Err(_) => return true,
        Ok(httparse::Status::Partial) => return false,
    };
    // hyper takes the head off its buffer before it reads the URI and
    // the headers; a head it refuses from there on is closed unanswered
    // too when what is left, past empty lines, is the preface. Which heads
    // hyper refuses is hyper's to judge, so any answer is optional there.
    if opens_with_preface(&input[head_len..]) {
        return false;
    }
    let mut content_length: Option<u64> = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // A chunked body's completeness is hyper's to judge.
            return false;
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<u64>().ok()) {
                Some(n) => content_length = Some(n),
                // A malformed length is a malformed head: answered.
                None => return true,
            }
        }
    }
    let body = (input.len() - head_len) as u64;
    body >= content_length.unwrap_or(0)
}

/// The request's minor HTTP version, as far as its request line says (1
/// when it does not).
fn request_version(input: &[u8]) -> u8 {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(input);
    req.version.unwrap_or(1)
}

/// One parsed answer.
struct Answer {
    status: u16,
    exit_code: Option<String>,
    body_len: usize,
}

fn header<'h>(headers: &'h [httparse::Header<'_>], name: &str) -> Option<&'h [u8]> {
    headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
}

/// Parse `wire` as one response and return it and the bytes after it.
fn parse_answer(wire: &[u8], request_version: u8) -> Result<(Answer, &[u8]), String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(wire) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("truncated response head".to_owned()),
        Err(e) => return Err(format!("malformed response head: {e}")),
    };
    // hyper answers an HTTP/1.0 request in HTTP/1.0.
    if resp.version != Some(1) && resp.version != Some(request_version) {
        return Err(format!("response version {:?} to an HTTP/1.{request_version} request", resp.version));
    }
    let status = resp.code.ok_or("no status")?;
    let mut exit_code = header(resp.headers, "x-exit-code").map(|v| String::from_utf8_lossy(v).into_owned());
    let rest = &wire[head_len..];
    let chunked =
        header(resp.headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"));
    let mut body_len = 0;
    let rest = if chunked {
        let mut rest = rest;
        loop {
            let (start, size) = match httparse::parse_chunk_size(rest) {
                Ok(httparse::Status::Complete(x)) => x,
                _ => return Err("malformed or truncated chunk size".to_owned()),
            };
            rest = &rest[start..];
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).map_err(|_| "chunk too large")?;
            if rest.len() < size + 2 || &rest[size..size + 2] != b"\r\n" {
                return Err("truncated chunk".to_owned());
            }
            body_len += size;
            rest = &rest[size + 2..];
        }
        let mut trailers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::parse_headers(rest, &mut trailers) {
            Ok(httparse::Status::Complete((n, trailers))) => {
                if let Some(v) = header(trailers, "x-exit-code") {
                    exit_code = Some(String::from_utf8_lossy(v).into_owned());
                }
                &rest[n..]
            }
            _ => return Err("malformed or truncated trailer".to_owned()),
        }
    } else {
        let len = match header(resp.headers, "content-length") {
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or("malformed Content-Length")?,
            // Without a length the body runs to EOF.
            None => rest.len(),
        };
        if rest.len() < len {
            return Err(format!("body of {} bytes, Content-Length {len}", rest.len()));
        }
        body_len = len;
        &rest[len..]
    };
    Ok((Answer { status, exit_code, body_len }, rest))
}

/// Serve `input` and check everything the module comment promises; panics
/// with the input and the answer on any violation.
pub fn check(input: &[u8]) {
    let outcome = serve_measured(input);
    if let Err(why) = judge(input, &outcome) {
        panic!(
            "toolexec_http: {why}\ninput: {:?}\nanswer: {:?}\nspawns: {:?}",
            String::from_utf8_lossy(input),
            String::from_utf8_lossy(&outcome.wire),
            outcome.spawns
        );
    }
}

pub fn judge(input: &[u8], outcome: &Outcome) -> Result<(), String> {
    if outcome.spawns.len() > 1 {
        return Err(format!("{} spawns on one connection", outcome.spawns.len()));
    }
    for spawn in &outcome.spawns {
        let allowed = RUNNING_TOOLS.contains(&spawn.tool.as_str())
            || spawn.tool == MISSING_TOOL
            || spawn.tool == BROKEN_TOOL;
        if !allowed {
            return Err(format!("spawned a tool not allowed: {:?}", spawn.tool));
        }
        if !input.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()) {
            return Err("spawned although the input never carried the token".to_owned());
        }
        if !spawn.cwd.starts_with(WORKDIR.as_bytes()) {
            return Err(format!(
                "spawned outside the working directory: {:?}",
                String::from_utf8_lossy(&spawn.cwd)
            ));
        }
    }
    if outcome.wire.is_empty() {
        if forms_request(input) {
            return Err("a whole request got no answer".to_owned());
        }
        return Ok(());
    }
    let (answer, rest) = parse_answer(&outcome.wire, request_version(input))?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the one answer", rest.len()));
    }
    let from_http_layer = answer.exit_code.is_none()
        && answer.body_len == 0
        && outcome.spawns.is_empty()
        && HTTP_LAYER_STATUSES.contains(&answer.status);
    if from_http_layer {
        return Ok(());
    }
    if !ALLOWED_STATUSES.contains(&answer.status) {
        return Err(format!("status {} is not one the seed allows", answer.status));
    }
    let Some(code) = answer.exit_code else {
        return Err(format!("a {} answer without X-Exit-Code", answer.status));
    };
    if answer.status == 200 {
        let [spawn] = outcome.spawns.as_slice() else {
            return Err("a 200 answer without a spawn".to_owned());
        };
        if code != fake_exit_code(spawn).to_string() {
            return Err(format!("X-Exit-Code {code}, the tool exited {}", fake_exit_code(spawn)));
        }
    }
    Ok(())
}
