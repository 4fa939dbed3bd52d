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
    fast::parse(payload, limits).unwrap_or_else(|| parse_request_tree(payload, limits))
}

/// The hot requests (`open`, `read`, `write`, `close`) decoded straight from
/// the frame's bytes into typed fields, with no `Value` tree and no copy of
/// a write's base64. It answers only the well-formed case: anything else
/// (a bad or duplicate field, an escaped base64 string, a scope, any other
/// op) is `None` and goes to [`parse_request_tree`], which decides every
/// case, so both paths give one answer for every frame (property-tested).
mod fast {
    use super::*;
    use serde_json::value::RawValue;

    #[derive(Deserialize)]
    struct Envelope<'a> {
        id: String,
        op: &'a str,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }

    #[derive(Deserialize)]
    struct Params<'a> {
        h: Option<u64>,
        max: Option<u64>,
        #[serde(borrow)]
        data: Option<&'a str>,
        #[serde(rename = "final")]
        fin: Option<bool>,
        path: Option<String>,
        mode: Option<&'a str>,
        #[serde(borrow)]
        scope: Option<&'a RawValue>,
    }

    pub(super) fn parse(payload: &[u8], limits: Limits) -> Option<Result<Request, Rejection>> {
        let env: Envelope<'_> = serde_json::from_slice(payload).ok()?;
        let p: Params<'_> = match env.params {
            Some(raw) => serde_json::from_str(raw.get()).ok()?,
            None => return None,
        };
        let op = match env.op {
            "read" => {
                let (h, max) = (p.h?, p.max?);
                if max == 0 || max > u64::from(limits.max_read) {
                    return None;
                }
                Op::Read { h: Handle::new(h), max: max as u32 }
            }
            "write" => Op::Write { h: Handle::new(p.h?), data: STANDARD.decode(p.data?).ok()? },
            "close" => Op::Close { h: Handle::new(p.h?) },
            "open" if p.scope.is_none() => {
                Op::Open { path: p.path?, mode: Mode::parse(p.mode?)?, scope: None }
            }
            _ => return None,
        };
        // `final` only has to be a boolean or null, which `Params` checked.
        let _ = p.fin;
        Some(Ok(Request { id: env.id, op }))
    }
}

/// Decode one request frame through a `Value` tree: every case, with the
/// message for each way a request can be wrong.
fn parse_request_tree(payload: &[u8], limits: Limits) -> Result<Request, Rejection> {
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
    Opened { handle: u64 },
    Written { written: u64 },
    Value(&'a Map<String, Value>),
    Json(&'a RawJson),
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
    let id = resp.id.as_deref();
    let (result, error) = match &resp.outcome {
        Ok(Success::Data { data, eof }) => return encode_data(id, data, *eof, out),
        Ok(Success::Opened { handle }) => (Some(WireResult::Opened { handle: handle.get() }), None),
        Ok(Success::Written { written }) => (Some(WireResult::Written { written: *written }), None),
        Ok(Success::Closed | Success::Attached) => (None, None),
        Ok(Success::Value(m)) => (Some(WireResult::Value(m)), None),
        Ok(Success::Json(raw)) => (Some(WireResult::Json(raw)), None),
        Err(f) => (None, Some(WireError { code: f.code.as_str(), message: &f.message })),
    };
    let wire = WireResponse { id, ok: error.is_none(), result, error };
    // Serializing strings, integers and JSON already checked cannot fail.
    let _ = serde_json::to_writer(&mut *out, &wire);
}

/// A read's answer, `{"id":…,"ok":true,"result":{"data":"…","eof":…}}`,
/// the bytes serde_json would write: base64's alphabet needs no escaping,
/// so it is encoded in place rather than built as a string and escaped.
fn encode_data(id: Option<&str>, data: &[u8], eof: bool, out: &mut Vec<u8>) {
    out.reserve(64 + id.map_or(4, str::len) + data.len().div_ceil(3) * 4);
    out.extend_from_slice(b"{\"id\":");
    let _ = serde_json::to_writer(&mut *out, &id);
    out.extend_from_slice(b",\"ok\":true,\"result\":{\"data\":\"");
    let start = out.len();
    out.resize(start + data.len().div_ceil(3) * 4, 0);
    let written = STANDARD.encode_slice(data, &mut out[start..]).unwrap_or(0);
    out.truncate(start + written);
    out.extend_from_slice(if eof { b"\",\"eof\":true}}" } else { b"\",\"eof\":false}}" });
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            Ok(Success::Json(_)) => unreachable!("not generated"),
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
            ".*".prop_map(|m| Err(Failure::new(ErrorCode::Io, m))),
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
        ]
    }

    /// A request frame built from pieces, valid or not: ops, fields in any
    /// order, duplicates, missing parts.
    fn request() -> impl Strategy<Value = String> {
        let op = prop_oneof![
            Just(r#""read""#),
            Just(r#""write""#),
            Just(r#""close""#),
            Just(r#""open""#),
            Just(r#""QUOTA""#),
            Just(r#""read""#),
            Just("7"),
        ];
        let key = prop_oneof![
            Just("h"),
            Just("max"),
            Just("data"),
            Just("final"),
            Just("path"),
            Just("mode"),
            Just("scope"),
            Just("other")
        ];
        let params = proptest::collection::vec((key, field()), 0..7).prop_map(|kv| {
            let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
            format!("{{{}}}", body.join(","))
        });
        let params = prop_oneof![8 => params, 1 => Just("null".to_string()), 1 => Just("[1]".to_string())];
        let id = prop_oneof![Just(r#""1""#), Just(r#""a"b""#), Just("5"), Just("null")];
        (id, op, params, any::<u8>()).prop_map(|(id, op, params, shape)| match shape % 6 {
            0 => format!(r#"{{"op":{op},"params":{params},"id":{id}}}"#),
            1 => format!(r#"{{"id":{id},"op":{op}}}"#),
            2 => format!(r#"{{"id":{id},"id":"2","op":{op},"params":{params}}}"#),
            3 => format!(r#"{{"id":{id},"op":{op},"params":{params}}} x"#),
            _ => format!(r#"{{"id":{id},"op":{op},"params":{params}}}"#),
        })
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

    #[test]
    fn the_fast_path_takes_the_hot_requests() {
        let limits = Limits::default();
        for frame in [
            r#"{"id":"1","op":"read","params":{"h":3,"max":4096}}"#,
            r#"{"id":"2","op":"write","params":{"h":3,"data":"aGVsbG8=","final":false}}"#,
            r#"{"id":"3","op":"close","params":{"h":3}}"#,
            r#"{"id":"4","op":"open","params":{"path":"a.txt","mode":"rw"}}"#,
        ] {
            let fast = fast::parse(frame.as_bytes(), limits).expect("taken by the fast path");
            assert_eq!(fast, parse_request_tree(frame.as_bytes(), limits), "{frame}");
        }
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
