//! The audit trail (`Config::audit`): one record per file operation a
//! client asked for, with its path, mode, and whether the policy allowed
//! it or the rule that refused it — the answer to "what did the agent
//! touch?". The machine decides what each record says; the shell only
//! writes them (`Output::Audit`).

use super::wire::{ErrorCode, Failure, Mode, Op, PathRequest, Success};
use crate::handles::{ClientId, Handle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Which file operation a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOp {
    Open,
    Read,
    Write,
    Close,
    /// A request resolved to a protected path, a secret file or a
    /// `--deny`ed path: refused, or lifted by a grant (`allowed`).
    Guard,
    Stat,
    List,
    Mkdir,
    Remove,
    Rename,
}

/// One file operation and its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub client: ClientId,
    pub op: AuditOp,
    /// The path as the client asked for it (for read, write and close, the
    /// path its handle was opened with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A rename's destination, as the client asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<Handle>,
    /// Bytes read or written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Entries a listing answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    pub allowed: bool,
    /// For a refusal: its code and the rule, as the client was told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The file is in the session's virtual namespace (a relative path
    /// outside every root): kept in memory, never written to disk.
    #[serde(default, rename = "virtual", skip_serializing_if = "std::ops::Not::not")]
    pub is_virtual: bool,
    /// For `guard`: the rule that matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<crate::guard::Rule>,
}

impl AuditRecord {
    /// A record of `op` on `path` by `client`, allowed, with nothing else
    /// said: the base the others are built on.
    pub fn of(client: ClientId, op: AuditOp, path: Option<String>) -> Self {
        AuditRecord {
            client,
            op,
            path,
            to: None,
            mode: None,
            handle: None,
            bytes: None,
            entries: None,
            allowed: true,
            code: None,
            reason: None,
            is_virtual: false,
            rule: None,
        }
    }

    /// The record of a guarded path the walk of `client`'s request met.
    pub fn guarded(client: ClientId, hit: &crate::guard::Hit) -> Self {
        AuditRecord {
            allowed: hit.granted,
            reason: Some(if hit.granted {
                format!(
                    "{} ({}): lifted by {}",
                    hit.path.display(),
                    hit.rule.describe(),
                    hit.flag().unwrap_or("")
                )
            } else {
                hit.to_string()
            }),
            rule: Some(hit.rule),
            ..AuditRecord::of(client, AuditOp::Guard, Some(hit.path.to_string_lossy().into_owned()))
        }
    }
}

#[derive(Clone, Debug)]
struct Asked {
    op: AuditOp,
    path: Option<String>,
    to: Option<String>,
    mode: Option<Mode>,
    handle: Option<Handle>,
    is_virtual: bool,
}

/// What the machine keeps to write records: the file operations awaiting
/// their answer (by client and request id, in order, since a client may
/// reuse an id) and the path each open handle was opened with.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    asked: BTreeMap<(ClientId, String), VecDeque<Asked>>,
    handles: BTreeMap<(ClientId, Handle), (String, Mode, bool)>,
}

impl Audit {
    /// A request is about to be served: remember a file operation's
    /// particulars for its answer.
    pub(crate) fn request(&mut self, client: ClientId, id: &str, op: &Op) {
        let asked = match op {
            Op::Open { path, mode, .. } => Asked {
                op: AuditOp::Open,
                path: Some(path.clone()),
                to: None,
                mode: Some(*mode),
                handle: None,
                is_virtual: false,
            },
            Op::Path { req, .. } => {
                let (op, to) = match req {
                    PathRequest::Stat { .. } => (AuditOp::Stat, None),
                    PathRequest::List { .. } => (AuditOp::List, None),
                    PathRequest::Mkdir { .. } => (AuditOp::Mkdir, None),
                    PathRequest::Remove { .. } => (AuditOp::Remove, None),
                    PathRequest::Rename { to, .. } => (AuditOp::Rename, Some(to.clone())),
                };
                Asked {
                    op,
                    path: Some(req.path().to_owned()),
                    to,
                    mode: None,
                    handle: None,
                    is_virtual: false,
                }
            }
            Op::Read { h, .. } | Op::Write { h, .. } | Op::Close { h } if !h.is_stdio() => {
                let held = self.handles.get(&(client, *h)).cloned();
                let is_virtual = held.as_ref().is_some_and(|(_, _, v)| *v);
                let (path, mode) = held.map(|(p, m, _)| (p, m)).unzip();
                let op = match op {
                    Op::Read { .. } => AuditOp::Read,
                    Op::Write { .. } => AuditOp::Write,
                    _ => AuditOp::Close,
                };
                Asked { op, path, to: None, mode, handle: Some(*h), is_virtual }
            }
            _ => return,
        };
        self.asked.entry((client, id.to_owned())).or_default().push_back(asked);
    }

    /// Request `id` of `client` opened a file of the virtual namespace:
    /// its record, and those of the handle it gets, say so.
    pub(crate) fn opened_virtual(&mut self, client: ClientId, id: &str) {
        if let Some(asked) = self.asked.get_mut(&(client, id.to_owned())).and_then(|q| q.front_mut()) {
            asked.is_virtual = true;
        }
    }

    /// The answer to request `id` of `client`: its record, when it was a
    /// file operation.
    pub(crate) fn answered(
        &mut self,
        client: ClientId,
        id: &str,
        outcome: &Result<Success, Failure>,
    ) -> Option<AuditRecord> {
        let key = (client, id.to_owned());
        let queue = self.asked.get_mut(&key)?;
        let asked = queue.pop_front()?;
        if queue.is_empty() {
            self.asked.remove(&key);
        }
        let mut record = AuditRecord {
            to: asked.to,
            mode: asked.mode,
            handle: asked.handle,
            allowed: outcome.is_ok(),
            is_virtual: asked.is_virtual,
            ..AuditRecord::of(client, asked.op, asked.path)
        };
        match outcome {
            Ok(Success::Opened { handle }) => {
                record.handle = Some(*handle);
                if let (Some(path), Some(mode)) = (&record.path, record.mode) {
                    self.handles.insert((client, *handle), (path.clone(), mode, record.is_virtual));
                }
            }
            Ok(Success::Data { data, .. }) => record.bytes = Some(data.len() as u64),
            Ok(Success::Base64Data { data, .. }) => record.bytes = Some(data.decoded_len() as u64),
            Ok(Success::Written { written }) => record.bytes = Some(*written),
            Ok(Success::Closed) => {
                if let Some(h) = record.handle {
                    self.handles.remove(&(client, h));
                }
            }
            Ok(Success::Value(m)) if record.op == AuditOp::List => {
                record.entries = m.get("entries").and_then(|e| e.as_array()).map(|a| a.len() as u64);
            }
            Ok(_) => {}
            Err(f) => {
                record.code = Some(f.code);
                record.reason = Some(f.message.clone());
            }
        }
        Some(record)
    }

    /// The client is gone: nothing of it is answered or held any more.
    pub(crate) fn departed(&mut self, client: ClientId) {
        self.asked.retain(|(c, _), _| *c != client);
        self.handles.retain(|(c, _), _| *c != client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_handle_and_forget_a_departed_client() {
        let (c, h) = (ClientId(1), Handle::FIRST);
        let mut a = Audit::default();
        a.request(c, "1", &Op::Open { path: "f".into(), mode: Mode::Write, scope: None });
        let open = a.answered(c, "1", &Ok(Success::Opened { handle: h })).unwrap();
        assert_eq!((open.op, open.handle, open.allowed), (AuditOp::Open, Some(h), true));
        a.request(c, "2", &Op::Write { h, data: b"abc".to_vec() });
        let write = a.answered(c, "2", &Ok(Success::Written { written: 3 })).unwrap();
        assert_eq!((write.path.as_deref(), write.mode, write.bytes), (Some("f"), Some(Mode::Write), Some(3)));
        a.request(c, "3", &Op::Open { path: "/etc/passwd".into(), mode: Mode::Read, scope: None });
        let refused =
            a.answered(c, "3", &Err(Failure::new(ErrorCode::Perm, "path is outside every allowed root")));
        let refused = refused.unwrap();
        assert_eq!((refused.allowed, refused.code), (false, Some(ErrorCode::Perm)));
        assert_eq!(refused.reason.as_deref(), Some("path is outside every allowed root"));
        // Not a file operation: no record.
        assert!(a.answered(c, "9", &Ok(Success::Closed)).is_none());
        a.request(c, "4", &Op::Read { h, max: 10 });
        a.departed(c);
        assert!(a.asked.is_empty() && a.handles.is_empty());
    }

    #[test]
    fn a_virtual_file_is_marked_in_every_record_of_its_handle() {
        let (c, h, h2) = (ClientId(1), Handle::FIRST, Handle::new(4));
        let mut a = Audit::default();
        a.request(c, "1", &Op::Open { path: "notes.md".into(), mode: Mode::Write, scope: None });
        a.opened_virtual(c, "1");
        let open = a.answered(c, "1", &Ok(Success::Opened { handle: h })).unwrap();
        assert!(open.is_virtual);
        let line = serde_json::to_value(&open).unwrap();
        assert_eq!(line["virtual"], true, "{line}");
        a.request(c, "2", &Op::Write { h, data: b"abc".to_vec() });
        assert!(a.answered(c, "2", &Ok(Success::Written { written: 3 })).unwrap().is_virtual);
        // A host file's records carry no flag at all.
        a.request(c, "3", &Op::Open { path: "/r/f".into(), mode: Mode::Read, scope: None });
        let host = a.answered(c, "3", &Ok(Success::Opened { handle: h2 })).unwrap();
        assert!(!host.is_virtual);
        assert!(serde_json::to_value(&host).unwrap().get("virtual").is_none());
        a.request(c, "4", &Op::Close { h });
        assert!(a.answered(c, "4", &Ok(Success::Closed)).unwrap().is_virtual);
    }
}
