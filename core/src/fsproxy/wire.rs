//! FS proxy messages (seed 000, JSON primary): parsing requests, encoding
//! responses, and the reverse for a proxy that forwards upstream.

use crate::broker::{BrokerErrorCode, RawJson};
use crate::handles::Handle;
use crate::pager::wire::FdOp;
use crate::scope::Scope;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Largest `max` a `read` may ask for (seed 000).
pub const DEFAULT_MAX_READ: u32 = 4096;

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
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_read: DEFAULT_MAX_READ }
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

/// Decode one request frame.
pub fn parse_request(payload: &[u8], limits: Limits) -> Result<Request, Rejection> {
    let value: Value = serde_json::from_slice(payload)
        .map_err(|e| reject(None, ErrorCode::Arg, format!("frame is not JSON: {e}")))?;
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
            let scope = match params.get("scope") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    Scope::from_wire(v)
                        .map_err(|e| reject(Some(&id), ErrorCode::Arg, format!("invalid scope: {e}")))?,
                ),
            };
            Op::Open { path, mode, scope }
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
                Some(Value::String(d)) => STANDARD
                    .decode(d)
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
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut params = Map::new();
    match &req.op {
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
            params.insert("data".into(), STANDARD.encode(data).into());
        }
        Op::Close { h } => {
            params.insert("h".into(), h.get().into());
        }
        Op::Attach => {}
        Op::Quota { params: p }
        | Op::LlmCmd { params: p }
        | Op::Cancel { params: p }
        | Op::Fd { params: p, .. } => params = p.clone(),
    }
    let mut obj = Map::new();
    obj.insert("id".into(), req.id.clone().into());
    obj.insert("op".into(), req.op.name().into());
    obj.insert("params".into(), Value::Object(params));
    // Serializing a Value built from strings and integers cannot fail.
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
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

#[derive(Serialize)]
struct WireError<'a> {
    code: &'static str,
    message: &'a str,
}

#[derive(Serialize)]
struct WireResponse<'a> {
    id: Option<&'a str>,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<WireResult<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<WireError<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireResult<'a> {
    Value(Value),
    Json(&'a RawJson),
}

fn encode_raw(id: Option<&str>, raw: &RawJson) -> Vec<u8> {
    let wire = WireResponse { id, ok: true, result: Some(WireResult::Json(raw)), error: None };
    serde_json::to_vec(&wire).unwrap_or_default()
}

pub fn encode_response(resp: &Response) -> Vec<u8> {
    let (ok, result, error) = match &resp.outcome {
        Ok(s) => {
            let result = match s {
                Success::Opened { handle } => Some(serde_json::json!({ "handle": handle.get() })),
                Success::Data { data, eof } => {
                    Some(serde_json::json!({ "data": STANDARD.encode(data), "eof": eof }))
                }
                Success::Written { written } => Some(serde_json::json!({ "written": written })),
                Success::Closed | Success::Attached => None,
                Success::Value(m) => Some(Value::Object(m.clone())),
                Success::Json(raw) => return encode_raw(resp.id.as_deref(), raw),
            }
            .map(WireResult::Value);
            (true, result, None)
        }
        Err(f) => (false, None, Some(WireError { code: f.code.as_str(), message: &f.message })),
    };
    let wire = WireResponse { id: resp.id.as_deref(), ok, result, error };
    serde_json::to_vec(&wire).unwrap_or_default()
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
            let data = STANDARD.decode(data).map_err(|e| format!("read data is not base64: {e}"))?;
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
            Op::Narrow { .. } | Op::Quota { .. } | Op::LlmCmd { .. } | Op::Cancel { .. } | Op::Fd { .. } => {
                OpKind::Other
            }
        }
    }
}
