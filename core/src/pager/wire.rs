//! The pager's ops on the FS proxy's wire: `FD_WRAP`, `FD_READ`,
//! `FD_SEARCH`, `FD_TO_FILE`, their params, decoded and checked.

use super::error::FdError;
use super::search::MAX_QUERY_BYTES;
use crate::b64;
use serde_json::{Map, Value};

/// Longest path a request may name, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest stream name or source label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdOp {
    Wrap,
    Read,
    Search,
    ToFile,
}

impl FdOp {
    pub fn parse(s: &str) -> Option<FdOp> {
        Some(match s {
            "FD_WRAP" => FdOp::Wrap,
            "FD_READ" => FdOp::Read,
            "FD_SEARCH" => FdOp::Search,
            "FD_TO_FILE" => FdOp::ToFile,
            _ => return None,
        })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            FdOp::Wrap => "FD_WRAP",
            FdOp::Read => "FD_READ",
            FdOp::Search => "FD_SEARCH",
            FdOp::ToFile => "FD_TO_FILE",
        }
    }
}

/// What a read shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The `<fd_result>` with page 1 as its preview.
    Preview,
    Page(u64),
    All,
    Lines(u64, u64),
}

/// What `to-file` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    Whole,
    Page(u64),
    Lines(u64, u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    Write,
    Append,
    /// Before line `at` of the existing file.
    Insert {
        at: u64,
    },
}

impl WriteMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteMode::Write => "write",
            WriteMode::Append => "append",
            WriteMode::Insert { .. } => "insert",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FdRequest {
    /// Bytes to wrap: all of them (`stream: None`), or the next chunk of a
    /// stream the client names, the last when `more` is false.
    Wrap {
        stream: Option<String>,
        data: Vec<u8>,
        more: bool,
        /// When given, the bytes the stream holds so far: a chunk sent
        /// after its stream was dropped is refused rather than starting a
        /// new one.
        offset: Option<u64>,
        source: Option<String>,
    },
    /// Drop a stream the client began.
    WrapAbort {
        stream: String,
    },
    /// Wrap a file, read through the session's file policy.
    WrapPath {
        path: String,
        source: Option<String>,
    },
    Read {
        fd: String,
        view: View,
        cursor: Option<u64>,
    },
    Search {
        fd: String,
        query: String,
        ignore_case: bool,
        cursor: Option<u64>,
    },
    ToFile {
        fd: String,
        path: String,
        mode: WriteMode,
        selection: Selection,
    },
}

fn string(p: &Map<String, Value>, key: &str, max: usize) -> Result<Option<String>, FdError> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() <= max => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(FdError::arg(None, format!("{key} is longer than {max} bytes"))),
        Some(_) => Err(FdError::arg(None, format!("{key} is not a string"))),
    }
}

fn number(p: &Map<String, Value>, key: &str) -> Result<Option<u64>, FdError> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| FdError::arg(None, format!("{key} is not a non-negative integer"))),
    }
}

fn flag(p: &Map<String, Value>, key: &str) -> Result<bool, FdError> {
    match p.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(FdError::arg(None, format!("{key} is not a boolean"))),
    }
}

fn fd_param(p: &Map<String, Value>) -> Result<String, FdError> {
    string(p, "fd", MAX_LABEL_BYTES)?.ok_or_else(|| FdError::arg(None, "missing fd"))
}

/// `start_line`/`end_line`, both or neither.
fn lines(p: &Map<String, Value>, fd: &str) -> Result<Option<(u64, u64)>, FdError> {
    match (number(p, "start_line")?, number(p, "end_line")?) {
        (None, None) => Ok(None),
        (Some(a), Some(b)) => Ok(Some((a, b))),
        _ => Err(FdError::arg(Some(fd), "start_line and end_line go together")),
    }
}

/// Decode `op`'s params.
pub fn parse(op: FdOp, p: &Map<String, Value>) -> Result<FdRequest, FdError> {
    match op {
        FdOp::Wrap => {
            let source = string(p, "source", MAX_LABEL_BYTES)?;
            let stream = string(p, "stream", MAX_LABEL_BYTES)?;
            let path = string(p, "path", MAX_PATH_BYTES)?;
            let data = match p.get("data") {
                None | Some(Value::Null) => None,
                Some(Value::String(d)) => {
                    Some(b64::decode(d).map_err(|e| FdError::arg(None, format!("data is not base64: {e}")))?)
                }
                Some(_) => return Err(FdError::arg(None, "data is not a string")),
            };
            let more = flag(p, "more")?;
            if flag(p, "abort")? {
                return match (stream, data, path) {
                    (Some(stream), None, None) => Ok(FdRequest::WrapAbort { stream }),
                    _ => Err(FdError::arg(None, "abort takes a stream and nothing else")),
                };
            }
            match (path, data) {
                (Some(path), None) if stream.is_none() && !more => Ok(FdRequest::WrapPath { path, source }),
                (Some(_), None) => Err(FdError::arg(None, "a path is wrapped whole, not streamed")),
                (None, Some(data)) => {
                    if more && stream.is_none() {
                        return Err(FdError::arg(None, "more needs a stream"));
                    }
                    Ok(FdRequest::Wrap { stream, data, more, offset: number(p, "offset")?, source })
                }
                (Some(_), Some(_)) => Err(FdError::arg(None, "give data or path, not both")),
                (None, None) => Err(FdError::arg(None, "missing data or path")),
            }
        }
        FdOp::Read => {
            let fd = fd_param(p)?;
            let page = number(p, "page")?;
            let all = flag(p, "all")? || flag(p, "read_all")?;
            let preview = flag(p, "preview")?;
            let range = lines(p, &fd)?;
            let view = match (page, all, range, preview) {
                (None, false, None, false) => View::Page(1),
                (Some(n), false, None, false) => View::Page(n),
                (None, true, None, false) => View::All,
                (None, false, Some((a, b)), false) => View::Lines(a, b),
                (None, false, None, true) => View::Preview,
                _ => {
                    return Err(FdError::arg(
                        Some(&fd),
                        "choose one of page, all, start_line/end_line, preview",
                    ))
                }
            };
            Ok(FdRequest::Read { view, cursor: number(p, "cursor")?, fd })
        }
        FdOp::Search => {
            let fd = fd_param(p)?;
            let query = string(p, "query", MAX_QUERY_BYTES)?
                .ok_or_else(|| FdError::arg(Some(&fd), "missing query"))?;
            if query.is_empty() {
                return Err(FdError::arg(Some(&fd), "the query is empty"));
            }
            let ignore_case = flag(p, "ignore_case")?;
            Ok(FdRequest::Search { query, ignore_case, cursor: number(p, "cursor")?, fd })
        }
        FdOp::ToFile => {
            let fd = fd_param(p)?;
            let path =
                string(p, "path", MAX_PATH_BYTES)?.ok_or_else(|| FdError::arg(Some(&fd), "missing path"))?;
            if path.is_empty() {
                return Err(FdError::arg(Some(&fd), "the path is empty"));
            }
            let at = number(p, "insert_at_line")?;
            let mode = match (string(p, "mode", MAX_LABEL_BYTES)?.as_deref(), at) {
                (None | Some("write"), None) => WriteMode::Write,
                (Some("append"), None) => WriteMode::Append,
                (Some("insert"), Some(at)) => WriteMode::Insert { at },
                (Some("insert"), None) => {
                    return Err(FdError::arg(Some(&fd), "mode insert needs insert_at_line"))
                }
                (None | Some("write" | "append"), Some(_)) => {
                    return Err(FdError::arg(Some(&fd), "insert_at_line goes with mode insert"))
                }
                (Some(m), _) => {
                    return Err(FdError::arg(
                        Some(&fd),
                        format!("unknown mode {m:?}: want write, append or insert"),
                    ))
                }
            };
            let selection = match (number(p, "page")?, lines(p, &fd)?) {
                (None, None) => Selection::Whole,
                (Some(n), None) => Selection::Page(n),
                (None, Some((a, b))) => Selection::Lines(a, b),
                (Some(_), Some(_)) => {
                    return Err(FdError::arg(Some(&fd), "give page or start_line/end_line, not both"))
                }
            };
            Ok(FdRequest::ToFile { fd, path, mode, selection })
        }
    }
}

/// `fd:N` → N; anything else is no fd.
pub fn parse_fd(s: &str) -> Option<u64> {
    let n: u64 = s.strip_prefix("fd:")?.parse().ok()?;
    (format!("fd:{n}") == s).then_some(n)
}
