//! The `--audit FILE` writer: one JSON line per record the machine yields
//! (`Output::Audit`), each with `ts` (UTC, when written), flushed line by
//! line so a crash loses at most the line being written. Like the report,
//! a nested airlock writes it through its upstream proxy.
//!
//! Auditing never stops a session: the first write error is reported once
//! on stderr and later records are dropped (and counted in `dropped`).

use crate::outfile::OutFile;
use airlock_core::fsproxy::audit::AuditRecord;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Cheap to clone: every clone writes to the one file (the egress
/// proxies' thread writes its connections there too), line by line.
#[derive(Clone)]
pub struct AuditWriter {
    inner: std::sync::Arc<std::sync::Mutex<Inner>>,
    /// Fields every line of this clone carries (`toolexec serve`: the
    /// tool whose proxies wrote it).
    fields: Vec<(&'static str, serde_json::Value)>,
}

struct Inner {
    path: PathBuf,
    out: Option<OutFile>,
    line: Vec<u8>,
}

impl AuditWriter {
    pub fn new(path: &Path, out: OutFile) -> Self {
        let inner = Inner { path: path.to_path_buf(), out: Some(out), line: Vec::with_capacity(256) };
        AuditWriter { inner: std::sync::Arc::new(std::sync::Mutex::new(inner)), fields: Vec::new() }
    }

    /// A clone whose every line also says `key: value`.
    pub fn with(&self, key: &'static str, value: impl Into<serde_json::Value>) -> AuditWriter {
        let mut w = self.clone();
        w.fields.push((key, value.into()));
        w
    }

    /// One line per proxy connection (`op: egress`): host, port, address,
    /// bytes each way, duration, the rule that decided, how it ended.
    /// `airlock tool` writes its `http.*` requests with the same fields.
    pub fn egress<T: serde::Serialize>(&mut self, record: &T) {
        let mut value = serde_json::to_value(record).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("op".into(), "egress".into());
        }
        self.write_value(value);
    }

    pub fn write(&mut self, record: &AuditRecord) {
        self.write_value(serde_json::to_value(record).unwrap_or_default());
    }

    /// At start, one line per `--sandbox-ro` path inside an allowed root:
    /// the child reads those directly, so no later line records it.
    pub fn direct_read(&mut self, path: &Path) {
        let value = serde_json::json!({
            "op": "direct_read",
            "path": path.to_string_lossy(),
            "allowed": true,
            "reason": "--sandbox-ro inside an allowed root: read by the child directly, not through airlock",
        });
        self.write_value(value);
    }

    /// At start, one line per location airlock granted on its own (the
    /// program's interpreter chain, an argument inside a root): `op`
    /// `direct_read` inside a root, `grant` outside every root.
    pub fn granted(&mut self, g: &airlock_core::sandbox::program::AutoGrant) {
        let value = serde_json::json!({
            "op": if g.direct_read { "direct_read" } else { "grant" },
            "path": g.path.to_string_lossy(),
            "allowed": true,
            "automatic": true,
            "reason": g.reason,
        });
        self.write_value(value);
    }

    fn write_value(&mut self, mut value: serde_json::Value) {
        // A writer that panicked mid-line poisons nothing worth refusing.
        let mut guard = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let inner = &mut *guard;
        let Some(out) = &mut inner.out else { return };
        if let Some(obj) = value.as_object_mut() {
            obj.insert("ts".into(), crate::telemetry::rfc3339(std::time::SystemTime::now()).into());
            for (k, v) in &self.fields {
                obj.insert((*k).into(), v.clone());
            }
        }
        inner.line.clear();
        let res = serde_json::to_writer(&mut inner.line, &value)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                inner.line.push(b'\n');
                out.write_all(&inner.line)
            })
            .and_then(|()| out.flush());
        if let Err(e) = res {
            eprintln!("airlock: audit {}: {e}; further records are dropped", inner.path.display());
            inner.out = None;
        }
    }

    /// Close the file; later records (from any clone) are dropped.
    pub fn finish(self) {
        let mut guard = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(out) = guard.out.take() {
            if let Err(e) = out.finish() {
                eprintln!("airlock: audit {}: {e}", guard.path.display());
            }
        }
    }
}
