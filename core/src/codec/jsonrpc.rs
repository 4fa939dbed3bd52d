//! NDJSON JSON-RPC 2.0 (seed 004): one JSON object per `\n`-terminated line
//! between a host and a tool's stdin/stdout.
//!
//! [`LineDecoder`] splits the tool's stdout into lines without ever holding
//! more than `max_line` bytes of one line: a line that grows past the limit
//! is refused as soon as its `max_line + 1`-th byte arrives, newline or not.
//! Blank lines (only spaces, tabs and `\r`) are skipped; a `\r` before the
//! `\n` is dropped.
//!
//! [`parse`] turns one line into an [`Incoming`] message, and [`Outgoing`]
//! is everything the host writes. Errors carry the codes of the seed's table
//! as [`ErrorCode`]; there is no `-32700`: a line that is not JSON is an
//! invalid request (`-32600`), answered with `id: null` because its id
//! cannot be read.

use serde_json::{Map, Value};
use std::fmt;

/// Longest line accepted by default: 16 MiB holds the base64 of a
/// 10 MiB file (`vfs::DEFAULT_MAX_FILE`) with room for the envelope.
pub const DEFAULT_MAX_LINE: usize = 16 * 1024 * 1024;

/// Most JSON values one line may hold by default. Parsed, a value costs
/// far more than its text (`[{"a":0},…]` takes about 100 bytes of heap
/// for each byte of line), so the line limit alone would let one 16 MiB
/// line hold over a gigabyte; counted first, a line's values bound that
/// cost whatever its length. 65 536 is far more than any message of the
/// protocol needs (a `result` of content blocks, a `state`).
pub const DEFAULT_MAX_LINE_VALUES: usize = 1 << 16;

/// The protocol's error codes (seed 004, "Error codes"; `-32603` for
/// I/O, size and network failures).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCode {
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    Internal,
    AccessDenied,
    NotFound,
    AlreadyExists,
    Timeout,
    Cancelled,
}

impl ErrorCode {
    pub const fn code(self) -> i64 {
        match self {
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::Internal => -32603,
            ErrorCode::AccessDenied => -32001,
            ErrorCode::NotFound => -32002,
            ErrorCode::AlreadyExists => -32003,
            ErrorCode::Timeout => -32004,
            ErrorCode::Cancelled => -32005,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        [
            ErrorCode::InvalidRequest,
            ErrorCode::MethodNotFound,
            ErrorCode::InvalidParams,
            ErrorCode::Internal,
            ErrorCode::AccessDenied,
            ErrorCode::NotFound,
            ErrorCode::AlreadyExists,
            ErrorCode::Timeout,
            ErrorCode::Cancelled,
        ]
        .into_iter()
        .find(|c| c.code() == code)
    }
}

/// A JSON-RPC error object: a code and a message saying what and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    pub code: ErrorCode,
    pub message: String,
}

impl RpcError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RpcError { code, message: message.into() }
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code.code())
    }
}

/// A request id as the tool wrote it: a JSON number or string. Kept as the
/// JSON value so the response echoes it exactly; [`Id::key`] is its
/// canonical text, for maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Id(Value);

impl Id {
    /// `Some` for a number or a string (the ids JSON-RPC allows besides null).
    pub fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::Number(_) | Value::String(_) => Some(Id(v.clone())),
            _ => None,
        }
    }

    pub fn value(&self) -> &Value {
        &self.0
    }

    /// Canonical text of the id (`1` and `"1"` differ).
    pub fn key(&self) -> String {
        self.0.to_string()
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Id {
        Id(Value::from(n))
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Id {
        Id(Value::from(s))
    }
}

/// One message from the tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Incoming {
    /// `id` and `method`: wants exactly one response.
    Request { id: Id, method: String, params: Value },
    /// `method` without `id`: `result`, `error`, `state`, `cancel`, …
    Notification { method: String, params: Value },
    /// `result` or `error` with an `id` and no `method`: the tool answering
    /// something. The host never asked, so it never replies to one.
    Response { id: Option<Id> },
    /// Not a valid JSON-RPC 2.0 message: to be answered `-32600` with `id`
    /// (`None`: `null`).
    Invalid { id: Option<Id>, reason: String },
}

/// Parse one line (without its newline). `params`, when absent, is `null`.
pub fn parse(line: &[u8]) -> Incoming {
    parse_bounded(line, DEFAULT_MAX_LINE_VALUES)
}

/// [`parse`], refusing a line of more than `max_values` JSON values before
/// anything of it is built (see [`DEFAULT_MAX_LINE_VALUES`]).
pub fn parse_bounded(line: &[u8], max_values: usize) -> Incoming {
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        Err(e) => {
            return Incoming::Invalid { id: None, reason: format!("line is not UTF-8 ({e})") };
        }
    };
    if super::values::over(line, max_values) {
        return Incoming::Invalid {
            id: None,
            reason: format!("line holds more than {max_values} JSON values (--max-line-values)"),
        };
    }
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Incoming::Invalid { id: None, reason: format!("line is not JSON ({e})") },
    };
    let obj = match value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Incoming::Invalid { id: None, reason: "batch requests are not supported".into() };
        }
        other => {
            return Incoming::Invalid {
                id: None,
                reason: format!("a message must be a JSON object, not {}", kind(&other)),
            };
        }
    };
    classify(obj)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn classify(mut obj: Map<String, Value>) -> Incoming {
    let raw_id = obj.remove("id");
    let id = raw_id.as_ref().and_then(Id::from_value);
    let invalid = |id: Option<Id>, reason: String| Incoming::Invalid { id, reason };
    match obj.get("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        Some(other) => return invalid(id, format!("jsonrpc must be \"2.0\", not {other}")),
        None => return invalid(id, "jsonrpc \"2.0\" is missing".into()),
    }
    match &raw_id {
        None | Some(Value::Number(_)) | Some(Value::String(_)) => {}
        Some(Value::Null) => return invalid(None, "id must not be null".into()),
        Some(other) => return invalid(None, format!("id must be a number or a string, not {}", kind(other))),
    }
    let method = obj.remove("method");
    let params = obj.remove("params").unwrap_or(Value::Null);
    match method {
        Some(Value::String(method)) => {
            if !matches!(params, Value::Null | Value::Object(_) | Value::Array(_)) {
                return invalid(id, format!("params must be an object or an array, not {}", kind(&params)));
            }
            match id {
                Some(id) => Incoming::Request { id, method, params },
                None => Incoming::Notification { method, params },
            }
        }
        Some(other) => invalid(id, format!("method must be a string, not {}", kind(&other))),
        None if obj.contains_key("result") || obj.contains_key("error") => Incoming::Response { id },
        None => invalid(id, "method is missing".into()),
    }
}

/// Everything the host writes to the tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Outgoing {
    /// `{"jsonrpc":"2.0","id":ID,"result":RESULT}`
    Result { id: Id, result: Value },
    /// `{"jsonrpc":"2.0","id":ID|null,"error":{"code","message"}}`
    Error { id: Option<Id>, error: RpcError },
    /// `{"jsonrpc":"2.0","method":M,"params":P}` (`init`, `apply`, `cancel`).
    Notification { method: String, params: Option<Value> },
}

impl Outgoing {
    /// The message as a JSON value (keys in a fixed order).
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("jsonrpc".into(), Value::from("2.0"));
        match self {
            Outgoing::Result { id, result } => {
                m.insert("id".into(), id.0.clone());
                m.insert("result".into(), result.clone());
            }
            Outgoing::Error { id, error } => {
                m.insert("id".into(), id.as_ref().map_or(Value::Null, |i| i.0.clone()));
                let mut e = Map::new();
                e.insert("code".into(), Value::from(error.code.code()));
                e.insert("message".into(), Value::from(error.message.clone()));
                m.insert("error".into(), Value::Object(e));
            }
            Outgoing::Notification { method, params } => {
                m.insert("method".into(), Value::from(method.clone()));
                if let Some(p) = params {
                    m.insert("params".into(), p.clone());
                }
            }
        }
        Value::Object(m)
    }

    /// The message as one NDJSON line, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        encode_line(&self.to_value())
    }
}

/// A JSON value as one line: serde_json escapes every control character,
/// so the text never holds a raw newline.
pub fn encode_line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec());
    out.push(b'\n');
    out
}

/// Why the decoder gave up on the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineError {
    /// A line reached `max + 1` bytes without a newline.
    TooLong { max: usize },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::TooLong { max } => write!(f, "a line exceeds the maximum of {max} bytes"),
        }
    }
}

/// Incremental, bounded NDJSON line splitter.
///
/// Push bytes with [`LineDecoder::push`], then take lines with
/// [`LineDecoder::next_line`] until `Ok(None)`. Complete lines not yet
/// taken stay buffered (the host stops taking them while the tool has too
/// many requests unanswered); [`LineDecoder::buffered`] counts them. Once a
/// line is too long the decoder is failed for good: framing is lost.
#[derive(Debug)]
pub struct LineDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` before `start` are consumed.
    start: usize,
    /// Bytes from `start` already known to hold no newline.
    scanned: usize,
    max: usize,
    failed: Option<LineError>,
}

/// Capacity a decoder keeps after a large line is out.
const KEEP_CAPACITY: usize = 64 * 1024;

impl LineDecoder {
    pub fn new(max_line: usize) -> Self {
        LineDecoder { buf: Vec::new(), start: 0, scanned: 0, max: max_line, failed: None }
    }

    pub fn max_line(&self) -> usize {
        self.max
    }

    /// Append bytes read from the tool.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next non-blank line, without its `\n` (and `\r`).
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        loop {
            if let Some(e) = &self.failed {
                return Err(e.clone());
            }
            let pending = &self.buf[self.start..];
            let from = self.scanned.min(pending.len());
            match pending[from..].iter().position(|&b| b == b'\n') {
                Some(rel) => {
                    let end = from + rel;
                    if end > self.max {
                        return self.fail();
                    }
                    let mut line = &pending[..end];
                    if line.last() == Some(&b'\r') {
                        line = &line[..line.len() - 1];
                    }
                    let out = if is_blank(line) { None } else { Some(line.to_vec()) };
                    self.start += end + 1;
                    self.scanned = 0;
                    self.compact();
                    if out.is_some() {
                        return Ok(out);
                    }
                }
                None => {
                    self.scanned = pending.len();
                    if pending.len() > self.max {
                        return self.fail();
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// At EOF: a last line without its newline, if any.
    pub fn finish(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        if let Some(l) = self.next_line()? {
            return Ok(Some(l));
        }
        let rest = &self.buf[self.start..];
        let mut line = rest;
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        let out = if is_blank(line) { None } else { Some(line.to_vec()) };
        self.buf.clear();
        self.start = 0;
        self.scanned = 0;
        Ok(out)
    }

    /// Bytes held: complete lines not yet taken plus a partial one.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether a complete line is waiting (without taking it).
    pub fn has_line(&self) -> bool {
        self.buf[self.start..].contains(&b'\n')
    }

    pub fn failed(&self) -> Option<&LineError> {
        self.failed.as_ref()
    }

    fn fail(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        let e = LineError::TooLong { max: self.max };
        self.failed = Some(e.clone());
        self.buf = Vec::new();
        self.start = 0;
        self.scanned = 0;
        Err(e)
    }

    fn compact(&mut self) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > KEEP_CAPACITY {
                self.buf.shrink_to(KEEP_CAPACITY);
            }
        }
    }
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

#[cfg(test)]
#[path = "jsonrpc_tests.rs"]
mod tests;
