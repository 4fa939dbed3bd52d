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

pub struct AuditWriter {
    path: PathBuf,
    out: Option<OutFile>,
    line: Vec<u8>,
}

impl AuditWriter {
    pub fn new(path: &Path, out: OutFile) -> Self {
        AuditWriter { path: path.to_path_buf(), out: Some(out), line: Vec::with_capacity(256) }
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
        let Some(out) = &mut self.out else { return };
        if let Some(obj) = value.as_object_mut() {
            obj.insert("ts".into(), crate::telemetry::rfc3339(std::time::SystemTime::now()).into());
        }
        self.line.clear();
        let res = serde_json::to_writer(&mut self.line, &value)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                self.line.push(b'\n');
                out.write_all(&self.line)
            })
            .and_then(|()| out.flush());
        if let Err(e) = res {
            eprintln!("airlock: audit {}: {e}; further records are dropped", self.path.display());
            self.out = None;
        }
    }

    /// Close the file.
    pub fn finish(mut self) {
        if let Some(out) = self.out.take() {
            if let Err(e) = out.finish() {
                eprintln!("airlock: audit {}: {e}", self.path.display());
            }
        }
    }
}
