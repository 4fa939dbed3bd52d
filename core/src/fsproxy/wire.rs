//! FS proxy messages (seed 000, JSON primary): parsing requests, encoding
//! responses, and the reverse for a proxy that forwards upstream.

use crate::b64;
use crate::broker::{BrokerErrorCode, RawJson};
use crate::codec::json_text;
use crate::codec::plain::{Cursor, Slot};
use crate::handles::Handle;
use crate::pager::wire::FdOp;
use crate::scope::Scope;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::ops::Range;

/// Largest `max` a `read` may ask for (seed 000).
pub const DEFAULT_MAX_READ: u32 = 4096;

/// The id of the first answer on a connection made through the session
/// socket: `Attached` when the session admitted it, an error when a limit
/// refused it.
pub const SOCKET_GREETING_ID: &str = "session";

/// The protocol's error codes: seed 000's "initial set" (`E_*`), and the
/// broker's canonical codes (seed 002), which `LLMCMD` failures carry on
/// the same wire. One enum for both keeps every response's code a plain
/// string on the wire, countable in `Stats::errors_by_code`, and passed
/// through a forwarding proxy unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    #[serde(rename = "E_ARG")]
    Arg,
    #[serde(rename = "E_NOENT")]
    NoEnt,
    #[serde(rename = "E_PERM")]
    Perm,
    #[serde(rename = "E_IO")]
    Io,
    #[serde(rename = "E_CLOSED")]
    Closed,
    #[serde(rename = "E_UNSUPPORTED")]
    Unsupported,
    #[serde(rename = "E_RANGE")]
    Range,
    #[serde(rename = "queue_timeout")]
    QueueTimeout,
    #[serde(rename = "cancelled_before_start")]
    CancelledBeforeStart,
    #[serde(rename = "cancelled_after_start")]
    CancelledAfterStart,
    #[serde(rename = "provider_timeout")]
    ProviderTimeout,
    #[serde(rename = "provider_error")]
    ProviderError,
    #[serde(rename = "queue_full")]
    QueueFull,
    #[serde(rename = "budget_exhausted")]
    BudgetExhausted,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::Arg,
        ErrorCode::NoEnt,
        ErrorCode::Perm,
        ErrorCode::Io,
        ErrorCode::Closed,
        ErrorCode::Unsupported,
        ErrorCode::Range,
        ErrorCode::QueueTimeout,
        ErrorCode::CancelledBeforeStart,
        ErrorCode::CancelledAfterStart,
        ErrorCode::ProviderTimeout,
        ErrorCode::ProviderError,
        ErrorCode::QueueFull,
        ErrorCode::BudgetExhausted,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Arg => "E_ARG",
            ErrorCode::NoEnt => "E_NOENT",
            ErrorCode::Perm => "E_PERM",
            ErrorCode::Io => "E_IO",
            ErrorCode::Closed => "E_CLOSED",
            ErrorCode::Unsupported => "E_UNSUPPORTED",
            ErrorCode::Range => "E_RANGE",
            ErrorCode::QueueTimeout => "queue_timeout",
            ErrorCode::CancelledBeforeStart => "cancelled_before_start",
            ErrorCode::CancelledAfterStart => "cancelled_after_start",
            ErrorCode::ProviderTimeout => "provider_timeout",
            ErrorCode::ProviderError => "provider_error",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::BudgetExhausted => "budget_exhausted",
        }
    }

    /// A broker (seed 002) code rather than a seed 000 one.
    pub const fn is_broker(self) -> bool {
        matches!(
            self,
            ErrorCode::QueueTimeout
                | ErrorCode::CancelledBeforeStart
                | ErrorCode::CancelledAfterStart
                | ErrorCode::ProviderTimeout
                | ErrorCode::ProviderError
                | ErrorCode::QueueFull
                | ErrorCode::BudgetExhausted
        )
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl From<BrokerErrorCode> for ErrorCode {
    /// The broker's refusals before queueing are argument errors on this
    /// wire (`E_ARG`), as it names them itself.
    fn from(code: BrokerErrorCode) -> Self {
        match code {
            BrokerErrorCode::QueueTimeout => ErrorCode::QueueTimeout,
            BrokerErrorCode::CancelledBeforeStart => ErrorCode::CancelledBeforeStart,
            BrokerErrorCode::CancelledAfterStart => ErrorCode::CancelledAfterStart,
            BrokerErrorCode::ProviderTimeout => ErrorCode::ProviderTimeout,
            BrokerErrorCode::ProviderError => ErrorCode::ProviderError,
            BrokerErrorCode::InvalidRequest => ErrorCode::Arg,
            BrokerErrorCode::QueueFull => ErrorCode::QueueFull,
            BrokerErrorCode::BudgetExhausted => ErrorCode::BudgetExhausted,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `open` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// `r`: read-only; the file must exist.
    #[serde(rename = "r")]
    Read,
    /// `w`: write-only; create or truncate.
    #[serde(rename = "w")]
    Write,
    /// `a`: append-only; create if absent.
    #[serde(rename = "a")]
    Append,
    /// `rw`: read and write; create if absent, never truncate.
    #[serde(rename = "rw")]
    ReadWrite,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "r" => Some(Mode::Read),
            "w" => Some(Mode::Write),
            "a" => Some(Mode::Append),
            "rw" => Some(Mode::ReadWrite),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::Write => "w",
            Mode::Append => "a",
            Mode::ReadWrite => "rw",
        }
    }

    pub const fn readable(self) -> bool {
        matches!(self, Mode::Read | Mode::ReadWrite)
    }

    pub const fn writable(self) -> bool {
        !matches!(self, Mode::Read)
    }
}

/// A request, with its operation decoded and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: String,
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Open {
        path: String,
        mode: Mode,
        /// airlock's extension: narrow this one open further (a nested
        /// level forwarding for a client that narrowed itself).
        scope: Option<Scope>,
    },
    Read {
        h: Handle,
        max: u32,
    },
    Write {
        h: Handle,
        data: Vec<u8>,
    },
    Close {
        h: Handle,
    },
    /// airlock's extension: serve the socket passed alongside this request
    /// (SCM_RIGHTS) as a connection of its own, answering there.
    Attach,
    /// airlock's extension: narrow this connection (and everything
    /// attached from it), for good, to the intersection of what it may
    /// reach and `scope`. A nested airlock sends it before anything else.
    Narrow {
        scope: Scope,
    },
    /// Reserved (seed 000); the params are kept for the broker.
    Quota {
        params: Map<String, Value>,
    },
    /// Reserved (seed 000); the params are kept for the broker.
    LlmCmd {
        params: Map<String, Value>,
    },
    /// airlock's extension for the broker: cancel an `LLMCMD` by its
    /// `cancel_token`.
    Cancel {
        params: Map<String, Value>,
    },
    /// The pager's ops (`FD_WRAP`, `FD_READ`, `FD_SEARCH`, `FD_TO_FILE`);
    /// their params are checked by `pager::wire`.
    Fd {
        op: FdOp,
        params: Map<String, Value>,
    },
    /// A path operation (`stat`, `list`, `mkdir`, `remove`, `rename`);
    /// `scope` narrows it as an open's does.
    Path {
        req: PathRequest,
        scope: Option<Scope>,
    },
}

impl Op {
    pub const fn name(&self) -> &'static str {
        match self {
            Op::Open { .. } => "open",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Close { .. } => "close",
            Op::Attach => "attach",
            Op::Narrow { .. } => "narrow",
            Op::Quota { .. } => "QUOTA",
            Op::LlmCmd { .. } => "LLMCMD",
            Op::Cancel { .. } => "CANCEL",
            Op::Fd { op, .. } => op.as_str(),
            Op::Path { req, .. } => req.name(),
        }
    }
}

/// A request that could not be decoded: answered with `code`, under `id`
/// when one could be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub id: Option<String>,
    pub code: ErrorCode,
    pub message: String,
}

fn reject(id: Option<&str>, code: ErrorCode, message: impl Into<String>) -> Rejection {
    Rejection { id: id.map(str::to_owned), code, message: message.into() }
}

/// Limits that apply while decoding a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_read: u32,
    /// `--max-frame-values`: JSON values a request frame may hold before
    /// it is parsed into a tree (see `codec::values`).
    #[serde(default = "default_max_frame_values", skip_serializing_if = "is_default_max_frame_values")]
    pub max_values: usize,
}

/// Values a request frame may hold by default: far more than any request
/// needs (an LLM request's messages and tools included), and at about 100
/// bytes each once parsed, a few megabytes at worst where `--max-frame`
/// alone allowed about 85 times the frame.
pub const DEFAULT_MAX_FRAME_VALUES: usize = 1 << 16;

// A trace recorded before the limit existed, or with its default, has no
// field for it.
fn default_max_frame_values() -> usize {
    DEFAULT_MAX_FRAME_VALUES
}

fn is_default_max_frame_values(n: &usize) -> bool {
    *n == DEFAULT_MAX_FRAME_VALUES
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_read: DEFAULT_MAX_READ, max_values: DEFAULT_MAX_FRAME_VALUES }
    }
}

fn handle_param(id: &str, params: &Map<String, Value>) -> Result<Handle, Rejection> {
    match params.get("h") {
        None => Err(reject(Some(id), ErrorCode::Arg, "missing h")),
        Some(v) => v
            .as_u64()
            .map(Handle::new)
            .ok_or_else(|| reject(Some(id), ErrorCode::Arg, format!("invalid h: {v}"))),
    }
}

/// A request's `scope` (`open` and the path ops): one more narrowing.
fn scope_param(id: &str, params: &Map<String, Value>) -> Result<Option<Scope>, Rejection> {
    match params.get("scope") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Scope::from_wire(v)
            .map(Some)
            .map_err(|e| reject(Some(id), ErrorCode::Arg, format!("invalid scope: {e}"))),
    }
}

/// Decode one request frame.
pub fn parse_request(payload: &[u8], limits: Limits) -> Result<Request, Rejection> {
    fast::parse(payload, limits).unwrap_or_else(|| parse_request_tree(payload, limits))
}

mod fast;
pub mod path;
pub use path::PathRequest;

/// The fast path's answer, wherever it gives one, is the tree's (the fuzz
/// target `fsproxy_request`; the property tests below check the same).
#[cfg(feature = "fuzzing")]
pub(crate) fn fast_path_agrees(payload: &[u8]) -> Result<(), String> {
    let limits = Limits::default();
    let tree = parse_request_tree(payload, limits);
    match fast::parse(payload, limits) {
        Some(fast) if fast != tree => Err(format!("the fast path read {fast:?}, the tree {tree:?}")),
        _ => Ok(()),
    }
}

/// [`parse_request`], and whether a frame refused as a request is a
/// response as its `Value` tree reads it ([`responds`]): what
/// `bounds::is_response` says of it (the fuzz target `fsproxy_request`
/// holds them equal), read off the tree the parse built rather than by
/// parsing the frame again.
pub(crate) fn parse_request_or_response(
    payload: &[u8],
    limits: Limits,
) -> (Result<Request, Rejection>, bool) {
    // The fast path answers only a frame with an `op`: no response.
    if let Some(req) = fast::parse(payload, limits) {
        return (req, false);
    }
    if let Err(too_many) = values_within(payload, limits) {
        return (Err(too_many), false);
    }
    match serde_json::from_slice::<Value>(payload) {
        Ok(value) => {
            let response = responds(&value);
            (request_from_tree(value, limits), response)
        }
        Err(e) => (Err(not_json(&e)), false),
    }
}

/// Whether a frame's `Value` tree is a response: a JSON object with `ok`,
/// `result` or `error` and no `op`.
pub(crate) fn responds(value: &Value) -> bool {
    match value {
        Value::Object(o) => {
            !o.contains_key("op") && ["ok", "result", "error"].iter().any(|k| o.contains_key(*k))
        }
        _ => false,
    }
}

/// A frame of more values than `limits` allow is refused before a tree is
/// built from it: its id is not read either.
fn values_within(payload: &[u8], limits: Limits) -> Result<(), Rejection> {
    if crate::codec::values::over(payload, limits.max_values) {
        return Err(reject(
            None,
            ErrorCode::Range,
            format!("frame holds more than {} JSON values (--max-frame-values)", limits.max_values),
        ));
    }
    Ok(())
}

fn not_json(e: &serde_json::Error) -> Rejection {
    reject(None, ErrorCode::Arg, format!("frame is not JSON: {e}"))
}

/// Decode one request frame through a `Value` tree: every case, with the
/// message for each way a request can be wrong.
fn parse_request_tree(payload: &[u8], limits: Limits) -> Result<Request, Rejection> {
    values_within(payload, limits)?;
    let value: Value = serde_json::from_slice(payload).map_err(|e| not_json(&e))?;
    request_from_tree(value, limits)
}

fn request_from_tree(value: Value, limits: Limits) -> Result<Request, Rejection> {
    let Value::Object(mut obj) = value else {
        return Err(reject(None, ErrorCode::Arg, "request is not a JSON object"));
    };
    let id = match obj.remove("id") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(reject(None, ErrorCode::Arg, "id is not a string")),
        None => return Err(reject(None, ErrorCode::Arg, "missing id")),
    };
    let op = match obj.remove("op") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "op is not a string")),
        None => return Err(reject(Some(&id), ErrorCode::Arg, "missing op")),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "params is not an object")),
    };
    let op = match op.as_str() {
        "open" => {
            let path = match params.get("path") {
                Some(Value::String(p)) => p.clone(),
                Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "path is not a string")),
                None => return Err(reject(Some(&id), ErrorCode::Arg, "missing path")),
            };
            let mode = match params.get("mode") {
                Some(Value::String(m)) => Mode::parse(m).ok_or_else(|| {
                    reject(Some(&id), ErrorCode::Arg, format!("invalid mode: {m:?} (want r, w, a or rw)"))
                })?,
                Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "mode is not a string")),
                None => return Err(reject(Some(&id), ErrorCode::Arg, "missing mode")),
            };
            Op::Open { path, mode, scope: scope_param(&id, &params)? }
        }
        "read" => {
            let h = handle_param(&id, &params)?;
            let max = match params.get("max") {
                None => return Err(reject(Some(&id), ErrorCode::Arg, "missing max")),
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| reject(Some(&id), ErrorCode::Arg, format!("invalid max: {v}")))?,
            };
            if max == 0 {
                return Err(reject(Some(&id), ErrorCode::Arg, "max must be at least 1"));
            }
            if max > u64::from(limits.max_read) {
                return Err(reject(
                    Some(&id),
                    ErrorCode::Range,
                    format!("max {max} exceeds the limit of {}", limits.max_read),
                ));
            }
            Op::Read { h, max: max as u32 }
        }
        "write" => {
            let h = handle_param(&id, &params)?;
            let data = match params.get("data") {
                Some(Value::String(d)) => b64::decode(d)
                    .map_err(|e| reject(Some(&id), ErrorCode::Arg, format!("data is not base64: {e}")))?,
                Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "data is not a string")),
                None => return Err(reject(Some(&id), ErrorCode::Arg, "missing data")),
            };
            match params.get("final") {
                None | Some(Value::Bool(_)) | Some(Value::Null) => {}
                Some(_) => return Err(reject(Some(&id), ErrorCode::Arg, "final is not a boolean")),
            }
            Op::Write { h, data }
        }
        "close" => Op::Close { h: handle_param(&id, &params)? },
        "attach" => Op::Attach,
        "narrow" => Op::Narrow {
            scope: Scope::from_wire(&Value::Object(params))
                .map_err(|e| reject(Some(&id), ErrorCode::Arg, format!("invalid narrow: {e}")))?,
        },
        op if path::is_path_op(op) => {
            let req = path::parse(&id, op, &params)?;
            Op::Path { req, scope: scope_param(&id, &params)? }
        }
        "QUOTA" => Op::Quota { params },
        "LLMCMD" => Op::LlmCmd { params },
        "CANCEL" => Op::Cancel { params },
        other if FdOp::parse(other).is_some() => match FdOp::parse(other) {
            Some(op) => Op::Fd { op, params },
            None => return Err(reject(Some(&id), ErrorCode::Unsupported, "unknown op")),
        },
        other => {
            return Err(reject(Some(&id), ErrorCode::Unsupported, format!("unknown op: {other:?}")));
        }
    };
    Ok(Request { id, op })
}

/// Encode a request (used by a proxy forwarding upstream, and by clients).
/// The bytes of `{"id":…,"op":…,"params":{…}}` as serde_json writes a
/// `Value` of it (keys sorted), with the params written where they lie:
/// a forwarded op's params (a wrap's kilobytes of base64) are not copied
/// into a new tree first.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let built;
    let params = match &req.op {
        Op::Quota { params: p }
        | Op::LlmCmd { params: p }
        | Op::Cancel { params: p }
        | Op::Fd { params: p, .. } => p,
        op => {
            built = request_params(op);
            &built
        }
    };
    let mut out = Vec::with_capacity(req.id.len() + 64);
    out.extend_from_slice(b"{\"id\":");
    json_text::string(&mut out, &req.id);
    out.extend_from_slice(b",\"op\":");
    json_text::string(&mut out, req.op.name());
    out.extend_from_slice(b",\"params\":");
    json_text::map(&mut out, params);
    out.push(b'}');
    out
}

/// The params of an op the core builds a request for itself.
fn request_params(op: &Op) -> Map<String, Value> {
    let mut params = Map::new();
    match op {
        Op::Open { path, mode, scope } => {
            params.insert("path".into(), path.clone().into());
            params.insert("mode".into(), mode.as_str().into());
            if let Some(s) = scope {
                params.insert("scope".into(), s.to_wire());
            }
        }
        Op::Narrow { scope } => {
            if let Value::Object(m) = scope.to_wire() {
                params = m;
            }
        }
        Op::Read { h, max } => {
            params.insert("h".into(), h.get().into());
            params.insert("max".into(), (*max).into());
        }
        Op::Write { h, data } => {
            params.insert("h".into(), h.get().into());
            params.insert("data".into(), b64::encode(data).into());
        }
        Op::Close { h } => {
            params.insert("h".into(), h.get().into());
        }
        Op::Path { req, scope } => {
            path::params(req, &mut params);
            if let Some(s) = scope {
                params.insert("scope".into(), s.to_wire());
            }
        }
        // Written from where they lie by `encode_request`.
        Op::Attach | Op::Quota { .. } | Op::LlmCmd { .. } | Op::Cancel { .. } | Op::Fd { .. } => {}
    }
    params
}

/// What a successful request returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Success {
    Opened {
        handle: Handle,
    },
    Data {
        data: Vec<u8>,
        eof: bool,
    },
    /// A read's data as a nested level's upstream sent it: checked, and
    /// passed on as the base64 text it came in (see [`Base64Data`]).
    Base64Data {
        data: Base64Data,
        eof: bool,
    },
    Written {
        written: u64,
    },
    Closed,
    Attached,
    /// A reserved op's result, as the broker built it.
    Value(Map<String, Value>),
    /// A reserved op's result held as JSON text (an `LLMCMD` answer, which
    /// may be large: it is never parsed into a tree).
    Json(RawJson),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
}

impl Failure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure { code, message: message.into() }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// `None` only when the request's id could not be read.
    pub id: Option<String>,
    pub outcome: Result<Success, Failure>,
}

/// One response as JSON text.
pub fn encode_response(resp: &Response) -> Vec<u8> {
    let mut out = Vec::new();
    encode_response_into(resp, &mut out);
    out
}

/// One response as JSON text, appended to `out`: the proxy frames it in
/// place (`frame::encode_with`), so a read's data is written once, as
/// base64, straight into the frame it leaves in.
pub fn encode_response_into(resp: &Response, out: &mut Vec<u8>) {
    // Every answer written directly, as serde_json writes a `Value` of it
    // (property-tested against that serialization).
    let id = resp.id.as_deref();
    match &resp.outcome {
        Ok(Success::Data { data, eof }) => {
            let len = data.len().div_ceil(3) * 4;
            encode_data(id, len, *eof, out, |out| b64::encode_into(data, out));
        }
        Ok(Success::Base64Data { data, eof }) => {
            let text = data.text();
            encode_data(id, text.len(), *eof, out, |out| out.extend_from_slice(text));
        }
        Ok(Success::Opened { handle }) => encode_number(id, b"handle", handle.get(), out),
        Ok(Success::Written { written }) => encode_number(id, b"written", *written, out),
        Ok(Success::Closed | Success::Attached) => {
            encode_head(id, true, out);
            out.push(b'}');
        }
        Err(f) => {
            encode_head(id, false, out);
            out.extend_from_slice(b",\"error\":{\"code\":\"");
            // The codes are plain ASCII names: nothing to escape.
            out.extend_from_slice(f.code.as_str().as_bytes());
            out.extend_from_slice(b"\",\"message\":");
            json_text::string(out, &f.message);
            out.extend_from_slice(b"}}");
        }
        Ok(Success::Value(m)) => {
            encode_head(id, true, out);
            out.extend_from_slice(b",\"result\":");
            json_text::map(out, m);
            out.push(b'}');
        }
        Ok(Success::Json(raw)) => {
            encode_head(id, true, out);
            out.extend_from_slice(b",\"result\":");
            // Checked JSON, written as it is (as serde_json writes a raw
            // value).
            out.extend_from_slice(raw.as_str().as_bytes());
            out.push(b'}');
        }
    }
}

/// `{"id":…,"ok":…`: the start every answer shares.
fn encode_head(id: Option<&str>, ok: bool, out: &mut Vec<u8>) {
    out.reserve(48 + id.map_or(4, str::len));
    out.extend_from_slice(b"{\"id\":");
    json_text::opt_string(out, id);
    out.extend_from_slice(if ok { b",\"ok\":true" } else { b",\"ok\":false" });
}

/// `{"id":…,"ok":true,"result":{"<key>":n}}`.
fn encode_number(id: Option<&str>, key: &[u8], n: u64, out: &mut Vec<u8>) {
    encode_head(id, true, out);
    out.extend_from_slice(b",\"result\":{\"");
    out.extend_from_slice(key);
    out.extend_from_slice(b"\":");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"}}");
}

/// A read's answer, `{"id":…,"ok":true,"result":{"data":"…","eof":…}}`,
/// the bytes serde_json would write: base64's alphabet needs no escaping,
/// so `fill` appends the (`b64_len` bytes of) base64 text in place rather
/// than building it as a string and escaping it.
fn encode_data(
    id: Option<&str>,
    b64_len: usize,
    eof: bool,
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut Vec<u8>),
) {
    out.reserve(64 + id.map_or(4, str::len) + b64_len);
    out.extend_from_slice(b"{\"id\":");
    json_text::opt_string(out, id);
    out.extend_from_slice(b",\"ok\":true,\"result\":{\"data\":\"");
    fill(out);
    out.extend_from_slice(if eof { b"\",\"eof\":true}}" } else { b"\",\"eof\":false}}" });
}

/// A read's data held as the standard base64 text an upstream sent, known
/// to be exactly what decoding and re-encoding it would give: canonical
/// (what `STANDARD.decode` accepts, and what `STANDARD.encode` writes).
/// A nested level passes it on without decoding it, since it only needs
/// its length ([`Base64Data::decoded_len`], for the audit log); the text
/// stays in the frame it arrived in.
#[derive(Clone)]
pub struct Base64Data {
    frame: Vec<u8>,
    start: usize,
    end: usize,
    decoded_len: usize,
}

impl Base64Data {
    /// `text` as checked base64 data, or `None` when it is not canonical
    /// standard base64.
    pub fn new(text: Vec<u8>) -> Option<Self> {
        let decoded_len = canonical_base64_len(&text)?;
        Some(Base64Data { start: 0, end: text.len(), frame: text, decoded_len })
    }

    /// The base64 text (ASCII).
    pub fn text(&self) -> &[u8] {
        self.frame.get(self.start..self.end).unwrap_or_default()
    }

    /// Bytes the text decodes to.
    pub fn decoded_len(&self) -> usize {
        self.decoded_len
    }

    /// The decoded bytes, for whoever needs them rather than the text.
    pub fn decode(&self) -> Vec<u8> {
        // Checked canonical when it was built.
        b64::decode(self.text()).unwrap_or_default()
    }
}

impl PartialEq for Base64Data {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Eq for Base64Data {}

impl fmt::Debug for Base64Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Base64Data")
            .field("text", &String::from_utf8_lossy(self.text()))
            .field("decoded_len", &self.decoded_len)
            .finish()
    }
}

/// Value of a standard base64 symbol, 0xff for any other byte.
const fn symbol_value(b: u8) -> u8 {
    match b {
        b'A'..=b'Z' => b - b'A',
        b'a'..=b'z' => b - b'a' + 26,
        b'0'..=b'9' => b - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => 0xff,
    }
}

/// Written without branches so the compiler checks many bytes per
/// instruction.
#[inline(always)]
fn is_symbol(b: u8) -> bool {
    ((b | 0x20).wrapping_sub(b'a') < 26) | (b.wrapping_sub(b'0') < 10) | (b == b'+') | (b == b'/')
}

/// The number of bytes `text` decodes to when it is canonical standard
/// base64, exactly the texts `STANDARD.decode` accepts: a multiple of four
/// symbols, at most two `=` and only at the end, and the bits the padding
/// leaves over zero. `None` for anything else (property-tested against
/// the decoder).
pub fn canonical_base64_len(text: &[u8]) -> Option<usize> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let pad = match text {
        [.., b'=', b'='] => 2,
        [.., b'='] => 1,
        _ => 0,
    };
    let body = &text[..text.len() - pad];
    let all_symbols = body.chunks(64).all(|c| c.iter().fold(true, |ok, &b| ok & is_symbol(b)));
    if !all_symbols {
        return None;
    }
    // The last symbol before the padding carries 2 (one `=`) or 4 (two)
    // bits beyond the last byte; the canonical encoding leaves them zero.
    let spare = match pad {
        1 => 0b11,
        2 => 0b1111,
        _ => 0,
    };
    if body.last().is_some_and(|&b| symbol_value(b) & spare != 0) {
        return None;
    }
    Some(text.len() / 4 * 3 - pad)
}

/// Decode a response to a request of kind `op` (a proxy forwarding upstream,
/// or a client). `op` tells how to read `result`.
pub fn parse_response(payload: &[u8], op: OpKind) -> Result<Response, String> {
    let value: Value = serde_json::from_slice(payload).map_err(|e| format!("response is not JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("response is not a JSON object".into());
    };
    let id = match obj.get("id") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(_) => return Err("response id is not a string".into()),
    };
    let ok = obj.get("ok").and_then(Value::as_bool).ok_or("response lacks a boolean ok")?;
    if !ok {
        let err = obj.get("error").and_then(Value::as_object).ok_or("failed response lacks error")?;
        let code = err
            .get("code")
            .and_then(Value::as_str)
            .and_then(ErrorCode::parse)
            .ok_or("failed response has no known error code")?;
        let message = err.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
        return Ok(Response { id, outcome: Err(Failure { code, message }) });
    }
    let empty = Map::new();
    let result = match obj.get("result") {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => &empty,
        Some(_) => return Err("result is not an object".into()),
    };
    let success = match op {
        OpKind::Open => Success::Opened {
            handle: result
                .get("handle")
                .and_then(Value::as_u64)
                .map(Handle::new)
                .ok_or("open result lacks handle")?,
        },
        OpKind::Read => {
            let data = result.get("data").and_then(Value::as_str).ok_or("read result lacks data")?;
            let data = b64::decode(data).map_err(|e| format!("read data is not base64: {e}"))?;
            let eof = result.get("eof").and_then(Value::as_bool).ok_or("read result lacks eof")?;
            Success::Data { data, eof }
        }
        OpKind::Write => Success::Written {
            written: result.get("written").and_then(Value::as_u64).ok_or("write result lacks written")?,
        },
        OpKind::Close => Success::Closed,
        OpKind::Attach => Success::Attached,
        OpKind::Other => Success::Value(result.clone()),
    };
    Ok(Response { id, outcome: Ok(success) })
}

/// An upstream's answer to a request this level forwarded, decoded and
/// checked as [`parse_response`] does, and for a `read`, its data at most
/// `max_read` bytes (what this level asked for): an upstream that sends
/// more is refused, not passed on.
///
/// This is the reference: it decodes a read's data and holds the bytes.
/// [`parse_upstream_response`] gives the same answer without decoding.
pub fn parse_upstream_response_decoded(
    payload: &[u8],
    op: OpKind,
    max_read: u32,
) -> Result<Response, String> {
    let resp = parse_response(payload, op)?;
    if let Ok(Success::Data { data, .. }) = &resp.outcome {
        check_read_len(data.len(), max_read)?;
    }
    Ok(resp)
}

fn check_read_len(len: usize, max_read: u32) -> Result<(), String> {
    if len as u64 > u64::from(max_read) {
        return Err(format!("read data of {len} bytes exceeds the {max_read} bytes asked for"));
    }
    Ok(())
}

/// [`parse_upstream_response_decoded`], with a read's data kept as the
/// base64 text it came in ([`Success::Base64Data`]) rather than decoded
/// here and encoded again for the client: the text is checked canonical
/// and of a decoded length within `max_read`, so what goes on is exactly
/// what decoding and re-encoding would give. Anything but the well-formed
/// read answer (a failure, another op, an escaped or non-canonical text,
/// a field of a wrong type, a duplicate or unknown field) goes to the
/// reference, which decides it (both are property-tested to agree).
pub fn parse_upstream_response(payload: Vec<u8>, op: OpKind, max_read: u32) -> Result<Response, String> {
    if op == OpKind::Read {
        if let Some(read) = ReadAnswer::parse(&payload).filter(|r| r.within(max_read)) {
            return Ok(read.into_response(payload));
        }
    }
    parse_upstream_response_decoded(&payload, op, max_read)
}

/// A successful `read` answer, typed-parsed from its frame in one pass,
/// its data checked canonical base64 where it lies in the frame. Only the
/// well-formed answer parses (a JSON object with exactly `id`, `ok: true`
/// and `result: {data, eof}`, the data unescaped); anything else is left
/// to [`parse_upstream_response_decoded`].
pub(crate) struct ReadAnswer {
    id: Option<String>,
    eof: bool,
    text: Range<usize>,
    decoded_len: usize,
}

impl ReadAnswer {
    pub(crate) fn parse(payload: &[u8]) -> Option<Self> {
        // Read with the plain scanner, which declines (rather than reports)
        // whatever is not the plain answer: every other answer an upstream
        // sends (an fd op's, a failure) comes here first, and serde's
        // derived structs spent more formatting why they refused it than
        // reading it.
        let mut c = Cursor::new(payload);
        let mut id: Slot<&str> = None;
        let mut ok: Slot<bool> = None;
        let mut result: Slot<(Range<usize>, bool)> = None;
        c.ws();
        c.object(|c, key| match key {
            b"id" => c.member(&mut id, Cursor::text),
            b"ok" => c.member(&mut ok, |c| c.literal(b"true").map(|()| true)),
            b"result" => c.member(&mut result, |c| {
                let (mut data, mut eof): (Slot<Range<usize>>, Slot<bool>) = (None, None);
                c.object(|c, key| match key {
                    // Bytes, not text: base64's alphabet is ASCII, so the
                    // canonical check below covers what UTF-8 validation
                    // (and the refusal of escapes) would.
                    b"data" => c.member(&mut data, |c| {
                        let text = c.raw_string()?;
                        let end = c.pos() - 1;
                        Some(end - text.len()..end)
                    }),
                    b"eof" => c.member(&mut eof, |c| match c.peek()? {
                        b't' => c.literal(b"true").map(|()| true),
                        _ => c.literal(b"false").map(|()| false),
                    }),
                    _ => None,
                })?;
                Some((data??, eof??))
            }),
            // An unknown member, even one serde_json would skip: the
            // reference's (it skips under the nesting limit).
            _ => None,
        })?;
        let (Some(Some(true)), Some(Some((text, eof))), true) = (ok, result, c.at_end()) else {
            return None;
        };
        let decoded_len = canonical_base64_len(payload.get(text.clone())?)?;
        Some(ReadAnswer { id: id.flatten().map(str::to_owned), eof, text, decoded_len })
    }

    /// The upstream's id for the request this answers.
    pub(crate) fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Whether the data is at most `max_read` bytes, as a read of that
    /// size must return.
    pub(crate) fn within(&self, max_read: u32) -> bool {
        check_read_len(self.decoded_len, max_read).is_ok()
    }

    /// The answer, holding `payload`: the frame this was parsed from.
    pub(crate) fn into_response(self, payload: Vec<u8>) -> Response {
        let ReadAnswer { id, eof, text, decoded_len } = self;
        debug_assert!(text.end <= payload.len());
        let data = Base64Data { frame: payload, start: text.start, end: text.end, decoded_len };
        Response { id, outcome: Ok(Success::Base64Data { data, eof }) }
    }
}

/// How to read a response's `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Open,
    Read,
    Write,
    Close,
    Attach,
    Other,
}

impl From<&Op> for OpKind {
    fn from(op: &Op) -> Self {
        match op {
            Op::Open { .. } => OpKind::Open,
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Close { .. } => OpKind::Close,
            Op::Attach => OpKind::Attach,
            Op::Narrow { .. }
            | Op::Quota { .. }
            | Op::LlmCmd { .. }
            | Op::Cancel { .. }
            | Op::Fd { .. }
            | Op::Path { .. } => OpKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use proptest::prelude::*;

    /// A frame the fast path leaves to the tree is counted first: past
    /// `max_values` it is refused naming the flag, without an id (none
    /// was read); at the limit it is parsed as ever.
    #[test]
    fn a_frame_past_max_values_is_refused_before_its_tree_is_built() {
        let frame = |n: usize| {
            let junk = vec!["0"; n].join(",");
            format!(r#"{{"id":"a","op":"chmod","params":{{"path":"x","junk":[{junk}]}}}}"#)
        };
        // One, two braces, `[` and three commas: 7 values, and n - 1 more
        // commas.
        let limits = Limits { max_values: 100, ..Limits::default() };
        let at = frame(94);
        assert!(
            !crate::codec::values::over(at.as_bytes(), 100) && crate::codec::values::over(at.as_bytes(), 99)
        );
        let e = parse_request(at.as_bytes(), limits).unwrap_err();
        assert_eq!((e.id.as_deref(), e.code), (Some("a"), ErrorCode::Unsupported), "{e:?}");
        let past = frame(95);
        for got in
            [parse_request(past.as_bytes(), limits), parse_request_or_response(past.as_bytes(), limits).0]
        {
            let e = got.unwrap_err();
            assert_eq!((e.id, e.code), (None, ErrorCode::Range));
            assert_eq!(e.message, "frame holds more than 100 JSON values (--max-frame-values)");
        }
    }

    /// What the responses were before they were written by hand: each
    /// result built as a `Value` and serialized by serde_json.
    fn reference(resp: &Response) -> Vec<u8> {
        let (ok, result, error) = match &resp.outcome {
            Ok(Success::Data { data, eof }) => {
                (true, Some(serde_json::json!({ "data": STANDARD.encode(data), "eof": eof })), None)
            }
            Ok(Success::Opened { handle }) => {
                (true, Some(serde_json::json!({ "handle": handle.get() })), None)
            }
            Ok(Success::Written { written }) => (true, Some(serde_json::json!({ "written": written })), None),
            Ok(Success::Closed | Success::Attached) => (true, None, None),
            Ok(Success::Value(m)) => (true, Some(Value::Object(m.clone())), None),
            Ok(Success::Json(_) | Success::Base64Data { .. }) => unreachable!("not generated"),
            Err(f) => {
                (false, None, Some(serde_json::json!({ "code": f.code.as_str(), "message": f.message })))
            }
        };
        let mut obj = Map::new();
        obj.insert("id".into(), resp.id.clone().map_or(Value::Null, Value::String));
        obj.insert("ok".into(), Value::Bool(ok));
        if let Some(r) = result {
            obj.insert("result".into(), r);
        }
        if let Some(e) = error {
            obj.insert("error".into(), e);
        }
        // Field order as the wire has it: id, ok, result/error.
        let mut out = b"{".to_vec();
        for (i, key) in ["id", "ok", "result", "error"].iter().enumerate() {
            if let Some(v) = obj.get(*key) {
                if i > 0 && out.len() > 1 {
                    out.push(b',');
                }
                out.extend_from_slice(&serde_json::to_vec(key).unwrap());
                out.push(b':');
                out.extend_from_slice(&serde_json::to_vec(v).unwrap());
            }
        }
        out.push(b'}');
        out
    }

    fn outcome() -> impl Strategy<Value = Result<Success, Failure>> {
        prop_oneof![
            (proptest::collection::vec(any::<u8>(), 0..5000), any::<bool>())
                .prop_map(|(data, eof)| Ok(Success::Data { data, eof })),
            any::<u64>().prop_map(|h| Ok(Success::Opened { handle: Handle::new(h) })),
            any::<u64>().prop_map(|written| Ok(Success::Written { written })),
            Just(Ok(Success::Closed)),
            Just(Ok(Success::Attached)),
            (".{0,8}", any::<u32>()).prop_map(|(k, n)| {
                let mut m = Map::new();
                m.insert(k, n.into());
                Ok(Success::Value(m))
            }),
            (proptest::sample::select(ErrorCode::ALL.to_vec()), ".*")
                .prop_map(|(code, m)| Err(Failure::new(code, m))),
        ]
    }

    /// A JSON value for a request field: right, wrong or odd.
    fn field() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..10).prop_map(|n| n.to_string()),
            Just("4096".into()),
            Just("4097".into()),
            Just("0".into()),
            Just("-1".into()),
            Just("3.0".into()),
            Just("18446744073709551616".into()),
            Just("null".into()),
            Just("true".into()),
            Just("[]".into()),
            Just("{}".into()),
            Just(r#""r""#.into()),
            Just(r#""rw""#.into()),
            Just(r#""x""#.into()),
            Just(r#""a.txt""#.into()),
            Just(r#""a\/b""#.into()),
            Just(r#""aGVsbG8=""#.into()),
            Just(r#""aGVsbG8""#.into()),
            Just(r#""aGVsbG8=""#.into()),
            Just(r#"{"roots":[]}"#.into()),
            "[a-zA-Z0-9+/=]{0,12}".prop_map(|s| format!("{s:?}")),
            // What a hand-read scanner could get wrong: numbers JSON
            // spells oddly or not at all, escapes, control characters,
            // bytes that are not UTF-8, truncated literals.
            Just("01".into()),
            Just("-0".into()),
            Just("1e2".into()),
            Just("1E2".into()),
            Just("2.".into()),
            Just("+1".into()),
            Just("4096 ".into()),
            Just("nul".into()),
            Just("nullx".into()),
            Just("tru".into()),
            Just("falsey".into()),
            Just(r#""\u0072""#.into()),
            Just(r#""r\"""#.into()),
            Just("\"a\tb\"".into()),
            Just("\"a\u{1}b\"".into()),
            Just("\"\u{e9}t\u{e9}\"".into()),
            Just("\"\u{7f}\"".into()),
            Just(r#""aGVs\nbG8=""#.into()),
            Just(r#""aGVs bG8=""#.into()),
            Just(r#""""#.into()),
            Just(r#"""#.into()),
        ]
    }

    /// A frame with JSON whitespace put between its tokens at random, or
    /// one of its bytes replaced: the scanner must read the first as the
    /// tree does, and decline whatever the second breaks.
    fn jostle(frame: String, seed: u64) -> String {
        let ws = [" ", "\t", "\n", "\r", "  \n "];
        let mut out = String::new();
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut in_string, mut escaped) = (false, false);
        for ch in frame.chars() {
            let between = !in_string && matches!(ch, '{' | '}' | '[' | ']' | ':' | ',' | '"');
            if between && next() % 3 == 0 {
                out.push_str(ws[(next() % 5) as usize]);
            }
            out.push(ch);
            if in_string {
                if escaped {
                    escaped = false;
                } else if ch == '\\' {
                    escaped = true;
                } else if ch == '"' {
                    in_string = false;
                }
            } else if ch == '"' {
                in_string = true;
            }
            if between && next() % 3 == 0 {
                out.push_str(ws[(next() % 5) as usize]);
            }
        }
        if next() % 4 == 0 {
            out.insert_str(0, ws[(next() % 5) as usize]);
        }
        if next() % 4 == 0 {
            out.push_str(ws[(next() % 5) as usize]);
        }
        if next() % 8 == 0 && !out.is_empty() {
            // One byte replaced by a JSON-significant one, anywhere.
            let mut bytes = out.into_bytes();
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = b"{}[]:,\" \\0n-.e\xff"[(next() % 15) as usize];
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        out
    }

    /// A request frame built from pieces, valid or not: ops, fields in any
    /// order, duplicates, missing parts.
    /// The params' keys the frame builders draw, and `extra`.
    fn keys(extra: &[&'static str]) -> Vec<&'static str> {
        ["h", "max", "data", "final", "path", "mode", "fd"].iter().chain(extra).copied().collect()
    }

    fn request() -> impl Strategy<Value = String> {
        let op = prop_oneof![
            Just(r#""read""#),
            Just(r#""write""#),
            Just(r#""close""#),
            Just(r#""open""#),
            Just(r#""QUOTA""#),
            Just(r#""read""#),
            Just(r#""FD_WRAP""#),
            Just(r#""FD_READ""#),
            Just(r#""FD_NOPE""#),
            Just("7"),
        ];
        let key = prop::sample::select(keys(&["scope", "more", "other"]));
        let params = proptest::collection::vec((key, field()), 0..7).prop_map(|kv| {
            let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
            format!("{{{}}}", body.join(","))
        });
        // Deep nesting: the tree's parser stops at 128 levels, serde's
        // skipping of an unknown field does not.
        let deep = format!("{}{}", "[".repeat(130), "]".repeat(130));
        let params = prop_oneof![
            8 => params,
            1 => Just("null".to_string()),
            1 => Just("[1]".to_string()),
            // Right for one op each, so the other parts decide.
            1 => Just(r#"{"h":3,"max":1}"#.to_string()),
            1 => Just(r#"{"h":3,"data":"aGk=","final":true}"#.to_string()),
            1 => Just(r#"{"path":"a.txt","mode":"r"}"#.to_string()),
            // A derived struct would take its fields as an array.
            1 => Just("[3,4096,null,null,null,null,null]".to_string()),
            1 => Just(r#"[3,null,"aGk=",null,null,null,null]"#.to_string()),
            1 => Just(format!(r#"{{"h":3,"max":1,"other":{deep}}}"#)),
        ];
        let id = prop_oneof![
            Just(r#""1""#),
            Just(r#""a"b""#),
            Just("5"),
            Just("null"),
            Just(r#""a\"b""#),
            Just("\"\u{e9}\""),
        ];
        let key = prop_oneof![
            8 => Just(["id", "op", "params"]),
            1 => Just([r"\u0069d", "op", "params"]),
            1 => Just(["id", r"o\u0070", "params"]),
            1 => Just(["id", "op", r"param\u0073"]),
        ];
        let frame = (id, op, params, any::<u8>(), key).prop_map(|(id, op, params, shape, [i, o, p])| {
            let (id, op, params) =
                (format!(r#""{i}":{id}"#), format!(r#""{o}":{op}"#), format!(r#""{p}":{params}"#));
            match shape % 8 {
                0 => format!(r#"{{{op},{params},{id}}}"#),
                6 => format!(r#"[{id},{op},{params}]"#),
                7 => format!(r#"{{{id},{op},{params},"x":[[[[[[]]]]]]}}"#),
                1 => format!(r#"{{{id},{op}}}"#),
                2 => format!(r#"{{{id},"id":"2",{op},{params}}}"#),
                3 => format!(r#"{{{id},{op},{params}}} x"#),
                _ => format!(r#"{{{id},{op},{params}}}"#),
            }
        });
        prop_oneof![
            1 => frame.clone(),
            1 => (frame, any::<u64>()).prop_map(|(f, seed)| jostle(f, seed)),
            2 => (near_valid(), any::<u64>()).prop_map(|(f, seed)| jostle(f, seed)),
        ]
    }

    /// A hot request right in every part but one: one member's value
    /// odd, or the member repeated, dropped or joined by another. Frames
    /// built from random parts are rarely right enough to reach the end
    /// of the fast path; these are, so its every check is tried.
    fn near_valid() -> impl Strategy<Value = String> {
        let op = prop_oneof![
            Just(("read", vec![("h", "3"), ("max", "4096")])),
            Just(("write", vec![("h", "3"), ("data", r#""aGk=""#), ("final", "true")])),
            Just(("close", vec![("h", "3")])),
            Just(("open", vec![("path", r#""a.txt""#), ("mode", r#""r""#)])),
            Just(("FD_READ", vec![("fd", r#""fd:1""#), ("page", "2")])),
            Just((
                "FD_WRAP",
                vec![("data", r#""aGk=""#), ("stream", r#""s1""#), ("more", "true"), ("offset", "0")]
            )),
            Just(("FD_TO_FILE", vec![("fd", r#""fd:1""#), ("path", r#""o.txt""#), ("mode", "null")])),
        ];
        let key = prop::sample::select(keys(&[r"\u00e9"]));
        (op, any::<prop::sample::Index>(), 0..5u8, field(), key, any::<bool>()).prop_map(
            |((op, members), at, how, odd, extra, params_first)| {
                let mut members: Vec<(String, String)> =
                    members.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
                let k = at.index(members.len());
                match how {
                    0 => members[k].1 = odd,
                    1 => members.push(members[k].clone()),
                    2 => drop(members.remove(k)),
                    3 => members.insert(k, (extra.to_owned(), odd)),
                    _ => {}
                }
                let body: Vec<String> = members.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
                let params = format!("{{{}}}", body.join(","));
                if params_first {
                    format!(r#"{{"params":{params},"op":"{op}","id":"7"}}"#)
                } else {
                    format!(r#"{{"id":"7","op":"{op}","params":{params}}}"#)
                }
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn the_fast_path_agrees_with_the_tree_on_every_frame(frame in request()) {
            let limits = Limits::default();
            let tree = parse_request_tree(frame.as_bytes(), limits);
            if let Some(fast) = fast::parse(frame.as_bytes(), limits) {
                prop_assert_eq!(&fast, &tree, "frame {}", frame);
            }
            prop_assert_eq!(parse_request(frame.as_bytes(), limits), tree);
        }
    }

    /// `encode_request` as it was: the whole request built as a `Value`.
    fn encode_request_by_value(req: &Request) -> Vec<u8> {
        let params = match &req.op {
            Op::Quota { params: p }
            | Op::LlmCmd { params: p }
            | Op::Cancel { params: p }
            | Op::Fd { params: p, .. } => p.clone(),
            op => request_params(op),
        };
        let mut obj = Map::new();
        obj.insert("id".into(), req.id.clone().into());
        obj.insert("op".into(), req.op.name().into());
        obj.insert("params".into(), Value::Object(params));
        serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// A request is encoded as the bytes serde_json writes for it as a
        /// `Value`, params written where they lie or built alike.
        #[test]
        fn a_request_encodes_as_its_value(frame in request()) {
            if let Ok(req) = parse_request_tree(frame.as_bytes(), Limits::default()) {
                prop_assert_eq!(encode_request(&req), encode_request_by_value(&req), "frame {}", frame);
            }
        }
    }

    #[test]
    fn forwarded_ops_encode_as_their_value() {
        for frame in [
            r#"{"id":"a\"b","op":"FD_WRAP","params":{"data":"aGk=","source":"s\n","more":false,"offset":0}}"#,
            r#"{"id":"q","op":"QUOTA","params":{}}"#,
            r#"{"id":"l","op":"LLMCMD","params":{"prompt":"p","z":[1,{"x":null}]}}"#,
            r#"{"id":"c","op":"CANCEL","params":{"token":"t"}}"#,
            r#"{"id":"t","op":"attach"}"#,
            r#"{"id":"n","op":"narrow","params":{"rules":[{"path":"/data","access":"r"}]}}"#,
            r#"{"id":"o","op":"open","params":{"path":"/d/x","mode":"rw","scope":{"rules":[{"path":"/d","access":"rw"}]}}}"#,
        ] {
            let req = parse_request_tree(frame.as_bytes(), Limits::default()).expect(frame);
            assert_eq!(encode_request(&req), encode_request_by_value(&req), "{frame}");
        }
    }

    /// Frames shaped like responses, requests, or both at once.
    fn response_or_request() -> impl Strategy<Value = String> {
        let key =
            prop_oneof![Just("id"), Just("op"), Just("ok"), Just("result"), Just("error"), Just("params")];
        let value = prop_oneof![
            Just("null"),
            Just("true"),
            Just(r#""open""#),
            Just(r#""read""#),
            Just(r#"{"h":3,"max":1}"#),
            Just(r#"{"path":"a","mode":"r"}"#),
            Just(r#"{"code":"E_ARG","message":"m"}"#),
            Just("3"),
        ];
        prop_oneof![
            proptest::collection::vec((key, value), 0..6).prop_map(|kv| {
                let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
                format!("{{{}}}", body.join(","))
            }),
            request(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// The machine asks whether a frame is a response only when it does
        /// not parse as a request: sound because no frame is both.
        #[test]
        fn no_frame_is_both_a_response_and_a_request(frame in response_or_request()) {
            let limits = Limits::default();
            let response = crate::fsproxy::bounds::is_response(frame.as_bytes());
            prop_assert!(!(response && parse_request(frame.as_bytes(), limits).is_ok()), "frame {}", frame);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// The machine reads whether a refused frame is a response off the
        /// request parse: the parse is `parse_request`'s and, where it
        /// refuses, the answer `is_response`'s, for frames of every shape
        /// and with any bytes changed.
        #[test]
        fn the_parse_tells_a_response_as_is_response_does(
            frame in response_or_request(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let mut frame = frame.into_bytes();
            for (at, b) in edits {
                if !frame.is_empty() {
                    let i = at.index(frame.len());
                    frame[i] = b;
                }
            }
            let limits = Limits::default();
            let (req, response) = parse_request_or_response(&frame, limits);
            prop_assert_eq!(&req, &parse_request(&frame, limits));
            if req.is_err() {
                prop_assert_eq!(response, crate::fsproxy::bounds::is_response(&frame));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// A `data` member the op does not decode is still part of the
        /// JSON: any bytes in it (not UTF-8, control characters, escapes)
        /// are answered as the tree answers them.
        #[test]
        fn a_data_member_an_op_ignores_is_still_read_as_json(
            op in prop_oneof![Just("read"), Just("close"), Just("open"), Just("write")],
            data in proptest::collection::vec(
                prop_oneof![any::<u8>().prop_filter("not a quote", |b| *b != b'"'), Just(b'\\'), 0u8..0x20, Just(b'a')],
                0..12,
            ),
        ) {
            let mut frame = format!(r#"{{"id":"1","op":"{op}","params":{{"h":3,"max":1,"path":"a","mode":"r","data":""#).into_bytes();
            frame.extend_from_slice(&data);
            frame.extend_from_slice(br#""}}"#);
            let limits = Limits::default();
            let tree = parse_request_tree(&frame, limits);
            if let Some(fast) = fast::parse(&frame, limits) {
                prop_assert_eq!(&fast, &tree, "frame {}", String::from_utf8_lossy(&frame));
            }
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_go_to_the_tree() {
        let limits = Limits::default();
        for frame in [
            &b"{\"id\":\"1\",\"op\":\"open\",\"params\":{\"path\":\"a\xff\",\"mode\":\"r\"}}"[..],
            b"{\"id\":\"\xc3\",\"op\":\"read\",\"params\":{\"h\":3,\"max\":1}}",
            b"{\"id\":\"1\",\"op\":\"read\",\"params\":{\"h\":3,\"max\":1}}\xff",
            b"{\"id\":\"1\",\"op\":\"write\",\"params\":{\"h\":3,\"data\":\"aGk\xe9\"}}",
        ] {
            assert_eq!(fast::parse(frame, limits), None);
            assert!(parse_request(frame, limits).is_err());
        }
    }

    #[test]
    fn the_fast_path_takes_the_hot_requests() {
        let limits = Limits::default();
        for frame in [
            r#"{"id":"1","op":"read","params":{"h":3,"max":4096}}"#,
            r#"{"id":"2","op":"write","params":{"h":3,"data":"aGVsbG8=","final":false}}"#,
            r#"{"id":"3","op":"close","params":{"h":3}}"#,
            r#"{"id":"4","op":"open","params":{"path":"a.txt","mode":"rw"}}"#,
            r#"{"id":"5","op":"FD_WRAP","params":{"data":"aGk=","more":false,"offset":0,"source":"tool","stream":null}}"#,
            r#"{"id":"6","op":"FD_READ","params":{"fd":"fd:1"}}"#,
            r#"{"id":"7","op":"FD_SEARCH","params":{"fd":"fd:1","ignore_case":true,"query":"é"}}"#,
            r#"{"id":"8","op":"FD_TO_FILE","params":{"fd":"fd:1","insert_at_line":2,"mode":"insert","path":"o"}}"#,
        ] {
            let fast = fast::parse(frame.as_bytes(), limits).expect("taken by the fast path");
            assert_eq!(fast, parse_request_tree(frame.as_bytes(), limits), "{frame}");
        }
    }

    /// Base64 texts, right and wrong in every way the decoder cares about.
    fn b64_text() -> impl Strategy<Value = String> {
        let valid = proptest::collection::vec(any::<u8>(), 0..40).prop_map(|d| STANDARD.encode(d));
        let odd = prop_oneof![
            Just(b'='),
            Just(b'A'),
            Just(b'B'),
            Just(b'/'),
            Just(b'!'),
            Just(b'-'),
            Just(b'_'),
            Just(b' '),
            Just(b'\n'),
            Just(0xc3)
        ];
        prop_oneof![
            4 => valid.clone(),
            // One symbol replaced: padding in the middle, spare bits set,
            // the URL-safe alphabet, whitespace.
            3 => (valid.clone(), any::<prop::sample::Index>(), odd).prop_map(|(t, i, b)| {
                let mut t = t.into_bytes();
                if !t.is_empty() {
                    let i = i.index(t.len());
                    t[i] = b;
                }
                String::from_utf8_lossy(&t).into_owned()
            }),
            // Padding cut or added.
            2 => (valid.clone(), 1usize..4).prop_map(|(t, n)| t[..t.len().saturating_sub(n)].to_owned()),
            // Spare bits set: the last symbol before the padding moved on.
            2 => valid.clone().prop_filter_map("no padding", |t| {
                let end = t.trim_end_matches('=').len();
                (end < t.len()).then(|| {
                    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                    let mut t = t.into_bytes();
                    let v = alphabet.iter().position(|&a| a == t[end - 1]).unwrap_or(0);
                    t[end - 1] = alphabet[(v + 1) % 64];
                    String::from_utf8_lossy(&t).into_owned()
                })
            }),
            1 => valid.clone().prop_map(|t| t + "="),
            1 => valid.prop_map(|t| t + "=="),
            2 => "[A-Za-z0-9+/=]{0,12}",
            1 => ".{0,8}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn canonical_base64_is_what_the_decoder_accepts(text in b64_text()) {
            let decoded = STANDARD.decode(&text).ok().map(|d| d.len());
            prop_assert_eq!(canonical_base64_len(text.as_bytes()), decoded, "text {:?}", text);
        }

    }

    /// An upstream's answer to a forwarded read, as a well-behaved or a
    /// hostile upstream sends it, and the `max` the read asked for.
    fn upstream_read_answer() -> impl Strategy<Value = (String, u32)> {
        let data = prop_oneof![
            6 => b64_text().prop_map(|t| serde_json::to_string(&t).unwrap()),
            2 => proptest::collection::vec(any::<u8>(), 0..5000)
                .prop_map(|d| serde_json::to_string(&STANDARD.encode(d)).unwrap()),
            1 => Just(r#""aGk\u003d""#.to_owned()),
            1 => Just(r#""aG\/k""#.to_owned()),
            1 => Just("null".to_owned()),
            1 => Just("5".to_owned()),
            1 => Just(r#"["aGk="]"#.to_owned()),
        ];
        let eof = prop_oneof![
            4 => Just("false"),
            4 => Just("true"),
            1 => Just("null"),
            1 => Just(r#""true""#),
            1 => Just("0")
        ];
        let deep = format!("{}{}", "[".repeat(130), "]".repeat(130));
        let result = (data, eof, any::<u8>()).prop_map(move |(d, e, shape)| match shape % 8 {
            0 => format!(r#"{{"eof":{e},"data":{d}}}"#),
            1 => format!(r#"{{"data":{d}}}"#),
            2 => format!(r#"{{"data":{d},"eof":{e},"x":1}}"#),
            3 => format!(r#"[{d},{e}]"#),
            4 => format!(r#"{{"data":{d},"eof":{e},"data":"aGk="}}"#),
            5 => format!(r#"{{"data":{d},"eof":{e},"x":{deep}}}"#),
            _ => format!(r#"{{"data":{d},"eof":{e}}}"#),
        });
        let result = prop_oneof![10 => result, 1 => Just("null".to_owned()), 1 => Just("7".to_owned())];
        let id = prop_oneof![
            4 => Just(r#""u1""#),
            1 => Just("null"),
            1 => Just("3"),
            1 => Just(r#""u\u0031""#)
        ];
        let ok = prop_oneof![8 => Just("true"), 1 => Just("false"), 1 => Just(r#""true""#)];
        let answer = (id, ok, result, any::<u8>()).prop_map(|(id, ok, r, shape)| match shape % 10 {
            0 => format!(r#"{{"result":{r},"ok":{ok},"id":{id}}}"#),
            1 => format!(r#"{{"ok":{ok},"result":{r}}}"#),
            2 => format!(r#"{{"id":{id},"ok":{ok},"result":{r},"error":{{"code":"E_IO","message":"m"}}}}"#),
            3 => format!(r#"{{"id":{id},"ok":{ok},"error":{{"code":"E_PERM"}}}}"#),
            4 => format!(r#"[{id},{ok},{r}]"#),
            5 => format!(r#"{{"id":{id},"ok":{ok},"result":{r}}} x"#),
            6 => format!(r#"{{"id":{id},"id":"u2","ok":{ok},"result":{r}}}"#),
            _ => format!(r#" {{ "id" : {id} , "ok" : {ok} , "result" : {r} }} "#),
        });
        let max = prop_oneof![Just(DEFAULT_MAX_READ), 1u32..64, 0u32..=5000];
        (answer, max)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn passing_a_read_through_gives_what_decoding_and_encoding_would(
            (answer, max) in upstream_read_answer(),
            client_id in proptest::option::of("[a-z0-9\"\\\\]{0,6}"),
        ) {
            let passed = parse_upstream_response(answer.clone().into_bytes(), OpKind::Read, max);
            let decoded = parse_upstream_response_decoded(answer.as_bytes(), OpKind::Read, max);
            match (passed, decoded) {
                (Ok(p), Ok(d)) => {
                    prop_assert_eq!(&p.id, &d.id);
                    // What the client below hears, under its own id.
                    let p = Response { id: client_id.clone(), outcome: p.outcome };
                    let d = Response { id: client_id, outcome: d.outcome };
                    prop_assert_eq!(encode_response(&p), encode_response(&d), "answer {}", answer);
                    if let (Ok(Success::Base64Data { data, .. }), Ok(Success::Data { data: bytes, .. })) =
                        (&p.outcome, &d.outcome)
                    {
                        prop_assert_eq!(data.decoded_len(), bytes.len());
                        prop_assert_eq!(&data.decode(), bytes);
                        prop_assert!(bytes.len() as u64 <= u64::from(max));
                    }
                }
                (Err(p), Err(d)) => prop_assert_eq!(p, d, "answer {}", answer),
                (p, d) => prop_assert!(false, "answer {} passed as {:?}, decoded as {:?}", answer, p, d),
            }
        }
    }

    #[test]
    fn airlock_answers_pass_through_without_decoding() {
        for (data, max) in [(vec![], 1), (b"hi".to_vec(), 2), (vec![0xff; 4096], DEFAULT_MAX_READ)] {
            let payload = encode_response(&Response {
                id: Some("u9".into()),
                outcome: Ok(Success::Data { data: data.clone(), eof: data.is_empty() }),
            });
            let resp = parse_upstream_response(payload, OpKind::Read, max).expect("a valid answer");
            match resp.outcome {
                Ok(Success::Base64Data { data: b64, eof }) => {
                    assert_eq!((b64.text(), eof), (STANDARD.encode(&data).as_bytes(), data.is_empty()));
                    assert_eq!(b64.decoded_len(), data.len());
                }
                other => panic!("not passed through: {other:?}"),
            }
        }
        // One byte over what was asked for is refused by both paths.
        let payload = encode_response(&Response {
            id: Some("u9".into()),
            outcome: Ok(Success::Data { data: vec![1; 5], eof: false }),
        });
        let want = Err("read data of 5 bytes exceeds the 4 bytes asked for".to_owned());
        assert_eq!(parse_upstream_response(payload.clone(), OpKind::Read, 4), want);
        assert_eq!(parse_upstream_response_decoded(&payload, OpKind::Read, 4), want);
    }

    proptest! {
        #[test]
        fn responses_are_the_bytes_serde_json_writes(
            id in proptest::option::of(".{0,40}"),
            outcome in outcome(),
        ) {
            let resp = Response { id, outcome };
            let got = encode_response(&resp);
            prop_assert_eq!(String::from_utf8(got.clone()).unwrap(), String::from_utf8(reference(&resp)).unwrap());
            // And it parses back to what was sent.
            let v: Value = serde_json::from_slice(&got).unwrap();
            prop_assert_eq!(v["id"].as_str(), resp.id.as_deref());
        }
    }
}
