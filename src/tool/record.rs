//! `--record FILE`: the run as a trace in the project's JSONL shape (a
//! header, then `{"now", "input"}` and `{"output"}` lines in the order the
//! core saw and produced them), with machine `"vfs"`: `airlock replay`
//! rebuilds the host from the header and checks every output.
//!
//! A trace holds no secret: every string of every line is scrubbed of the
//! `--env-allow` values, and so is every string that is base64 (the form
//! bytes take in the core's serde types), decoded, scrubbed and encoded
//! again. Header values (`${VAR}` substituted) and file contents are
//! covered that way; the variables' values never appear.

use airlock_core::time::Instant;
use airlock_core::trace::vfs::Header;
use airlock_core::vfs::scrub::Scrubber;
use airlock_core::vfs::{Input, Output, ToolPolicy};
use anyhow::Context;
use base64::Engine as _;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

pub struct Recorder {
    out: BufWriter<File>,
    scrubber: Scrubber,
    failed: bool,
}

impl Recorder {
    pub fn create(path: &Path, policy: &ToolPolicy) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("--record {}", path.display()))?;
        Ok(Recorder { out: BufWriter::new(file), scrubber: policy.scrubber().clone(), failed: false })
    }

    /// Write the header, before the host it describes yields anything.
    pub fn start(&mut self, header: Header) {
        match serde_json::to_value(&header) {
            Ok(v) => self.line(v),
            Err(_) => self.failed = true,
        }
    }

    pub fn input(&mut self, now: Instant, input: &Input) {
        match serde_json::to_value(input) {
            Ok(v) => self.line(json!({ "now": now.as_micros(), "input": v })),
            Err(_) => self.failed = true,
        }
    }

    pub fn output(&mut self, output: &Output) {
        match serde_json::to_value(output) {
            Ok(v) => self.line(json!({ "output": v })),
            Err(_) => self.failed = true,
        }
    }

    pub fn finish(&mut self) {
        if self.out.flush().is_err() {
            self.failed = true;
        }
        if self.failed {
            tracing::warn!("the trace is incomplete: a line could not be written");
        }
    }

    fn line(&mut self, mut v: Value) {
        scrub_deep(&self.scrubber, &mut v);
        let mut text = v.to_string();
        text.push('\n');
        if self.out.write_all(text.as_bytes()).is_err() {
            self.failed = true;
        }
    }
}

/// Scrub every string, and every base64 string's decoded bytes.
fn scrub_deep(s: &Scrubber, v: &mut Value) {
    if s.is_empty() {
        return;
    }
    match v {
        Value::String(text) => {
            let engine = &base64::engine::general_purpose::STANDARD;
            if let Ok(bytes) = engine.decode(text.as_bytes()) {
                if s.finds(&bytes) {
                    *text = engine.encode(s.bytes(&bytes));
                }
            }
            *text = s.string(text);
        }
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_deep(s, x)),
        Value::Object(o) => o.values_mut().for_each(|x| scrub_deep(s, x)),
        _ => {}
    }
}
