//! The path operations' messages: `stat`, `list`, `mkdir`, `remove` and
//! `rename` requests, parsed and encoded, and their results.
//!
//! ```text
//! → {"id":"1","op":"stat","params":{"path":"out","follow":true}}
//! ← {"id":"1","ok":true,"result":{"kind":"dir","mode":493,"mtime_ns":…,"size":4096}}
//! → {"id":"2","op":"list","params":{"path":"out","after":"a.txt","max":100}}
//! ← {"id":"2","ok":true,"result":{"entries":[{"kind":"file","name":"b.txt","size":3}],"next":"b.txt"}}
//! → {"id":"3","op":"mkdir","params":{"path":"out/new/deep","parents":true}}
//! → {"id":"4","op":"remove","params":{"path":"out/b.txt"}}
//! → {"id":"5","op":"rename","params":{"from":"a","to":"b","noreplace":true}}
//! ← {"id":"5","ok":true,"result":{}}
//! ```
//!
//! Each takes `scope` as `open` does (a nested level narrowing one
//! request). A listing is paged: `next`, present when more entries may
//! follow, is the `after` of the next page.

use super::{reject, ErrorCode, Rejection};
use crate::pathops::{FileStat, Page};
use serde_json::{Map, Value};

/// One path operation as a client asked for it (paths as sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathRequest {
    /// `follow`: a symlink at the last name is followed (the default).
    Stat { path: String, follow: bool },
    /// `after`: the last name of the previous page; `max`: entries wanted
    /// (at most the session's `--max-list-entries`).
    List { path: String, after: Option<String>, max: Option<u32> },
    /// `parents`: make missing directories on the way, and take one
    /// already there as made (`mkdir -p`).
    Mkdir { path: String, parents: bool },
    /// A file, a symlink (not what it leads to) or an empty directory.
    Remove { path: String },
    /// `noreplace`: fail rather than replace what is at `to`.
    Rename { from: String, to: String, noreplace: bool },
}

impl PathRequest {
    pub const fn name(&self) -> &'static str {
        match self {
            PathRequest::Stat { .. } => "stat",
            PathRequest::List { .. } => "list",
            PathRequest::Mkdir { .. } => "mkdir",
            PathRequest::Remove { .. } => "remove",
            PathRequest::Rename { .. } => "rename",
        }
    }

    /// Whether it changes anything (decided as a write).
    pub const fn changes(&self) -> bool {
        matches!(self, PathRequest::Mkdir { .. } | PathRequest::Remove { .. } | PathRequest::Rename { .. })
    }

    /// The path it is about (a rename's source).
    pub fn path(&self) -> &str {
        match self {
            PathRequest::Stat { path, .. }
            | PathRequest::List { path, .. }
            | PathRequest::Mkdir { path, .. }
            | PathRequest::Remove { path } => path,
            PathRequest::Rename { from, .. } => from,
        }
    }

    /// The same request with its paths replaced (by `map`, in order).
    pub fn with_paths(&self, mut map: impl FnMut(&str) -> String) -> PathRequest {
        match self {
            PathRequest::Stat { path, follow } => PathRequest::Stat { path: map(path), follow: *follow },
            PathRequest::List { path, after, max } => {
                PathRequest::List { path: map(path), after: after.clone(), max: *max }
            }
            PathRequest::Mkdir { path, parents } => PathRequest::Mkdir { path: map(path), parents: *parents },
            PathRequest::Remove { path } => PathRequest::Remove { path: map(path) },
            PathRequest::Rename { from, to, noreplace } => {
                PathRequest::Rename { from: map(from), to: map(to), noreplace: *noreplace }
            }
        }
    }
}

/// The op names this module parses.
pub fn is_path_op(op: &str) -> bool {
    matches!(op, "stat" | "list" | "mkdir" | "remove" | "rename")
}

fn string(id: &str, params: &Map<String, Value>, key: &str) -> Result<String, Rejection> {
    match params.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(reject(Some(id), ErrorCode::Arg, format!("{key} is not a string"))),
        None => Err(reject(Some(id), ErrorCode::Arg, format!("missing {key}"))),
    }
}

fn flag(id: &str, params: &Map<String, Value>, key: &str, default: bool) -> Result<bool, Rejection> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(reject(Some(id), ErrorCode::Arg, format!("{key} is not a boolean"))),
    }
}

/// Parse the params of path op `op` (one [`is_path_op`] names).
pub fn parse(id: &str, op: &str, params: &Map<String, Value>) -> Result<PathRequest, Rejection> {
    Ok(match op {
        "stat" => {
            PathRequest::Stat { path: string(id, params, "path")?, follow: flag(id, params, "follow", true)? }
        }
        "list" => {
            let after = match params.get("after") {
                None | Some(Value::Null) => None,
                Some(Value::String(a)) if a.is_empty() || a.contains('/') || a.contains('\0') => {
                    return Err(reject(
                        Some(id),
                        ErrorCode::Arg,
                        "after must be one name, as a listing gave it",
                    ));
                }
                Some(Value::String(a)) => Some(a.clone()),
                Some(_) => return Err(reject(Some(id), ErrorCode::Arg, "after is not a string")),
            };
            let max = match params.get("max") {
                None | Some(Value::Null) => None,
                Some(v) => match v.as_u64() {
                    Some(0) => return Err(reject(Some(id), ErrorCode::Arg, "max must be at least 1")),
                    Some(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
                    None => return Err(reject(Some(id), ErrorCode::Arg, format!("invalid max: {v}"))),
                },
            };
            PathRequest::List { path: string(id, params, "path")?, after, max }
        }
        "mkdir" => PathRequest::Mkdir {
            path: string(id, params, "path")?,
            parents: flag(id, params, "parents", false)?,
        },
        "remove" => PathRequest::Remove { path: string(id, params, "path")? },
        "rename" => PathRequest::Rename {
            from: string(id, params, "from")?,
            to: string(id, params, "to")?,
            noreplace: flag(id, params, "noreplace", false)?,
        },
        other => return Err(reject(Some(id), ErrorCode::Unsupported, format!("unknown op: {other:?}"))),
    })
}

/// The params of `req` (for a level forwarding it, or a client).
pub fn params(req: &PathRequest, params: &mut Map<String, Value>) {
    match req {
        PathRequest::Stat { path, follow } => {
            params.insert("path".into(), path.clone().into());
            params.insert("follow".into(), (*follow).into());
        }
        PathRequest::List { path, after, max } => {
            params.insert("path".into(), path.clone().into());
            if let Some(a) = after {
                params.insert("after".into(), a.clone().into());
            }
            if let Some(m) = max {
                params.insert("max".into(), (*m).into());
            }
        }
        PathRequest::Mkdir { path, parents } => {
            params.insert("path".into(), path.clone().into());
            params.insert("parents".into(), (*parents).into());
        }
        PathRequest::Remove { path } => {
            params.insert("path".into(), path.clone().into());
        }
        PathRequest::Rename { from, to, noreplace } => {
            params.insert("from".into(), from.clone().into());
            params.insert("to".into(), to.clone().into());
            params.insert("noreplace".into(), (*noreplace).into());
        }
    }
}

/// A `stat` result: `kind`, `size`, `mode` (permission bits), `mtime_ns`.
pub fn stat_result(s: &FileStat) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("kind".into(), s.kind.as_str().into());
    m.insert("size".into(), s.size.into());
    m.insert("mode".into(), s.mode.into());
    m.insert("mtime_ns".into(), s.mtime.as_nanos().into());
    m
}

/// A `list` result: `entries` (`name`, `kind`, `size`), and `next` when
/// more may follow.
pub fn page_result(p: &Page) -> Map<String, Value> {
    let entries = p
        .entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("name".into(), e.name.clone().into());
            m.insert("kind".into(), e.kind.as_str().into());
            m.insert("size".into(), e.size.into());
            Value::Object(m)
        })
        .collect();
    let mut m = Map::new();
    m.insert("entries".into(), Value::Array(entries));
    if p.more {
        if let Some(last) = p.entries.last() {
            m.insert("next".into(), last.name.clone().into());
        }
    }
    m
}
