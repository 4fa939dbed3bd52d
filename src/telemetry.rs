//! The broker's telemetry file: one JSON line per request
//! (`Output::Telemetry`), appended and flushed record by record, so a
//! crash loses at most the record being written.
//!
//! Telemetry never stops a session: the first write error is reported once
//! on stderr and later records are dropped.

use airlock_core::broker::TelemetryRecord;
use anyhow::Context;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub struct TelemetryWriter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    records: u64,
}

impl TelemetryWriter {
    /// Open `path` for appending (created if missing). Failing here is a
    /// start-up error: the config names a file airlock cannot write.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("broker.telemetry: opening {}", path.display()))?;
        Ok(TelemetryWriter { path: path.to_path_buf(), out: Some(BufWriter::new(file)), records: 0 })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn write(&mut self, record: &TelemetryRecord) {
        let Some(out) = &mut self.out else { return };
        let res = serde_json::to_writer(&mut *out, record)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        match res {
            Ok(()) => self.records += 1,
            Err(e) => self.fail(&e),
        }
    }

    /// Flush what is buffered (it is already, record by record; this is
    /// for the error report).
    pub fn finish(&mut self) {
        if let Some(out) = &mut self.out {
            if let Err(e) = out.flush() {
                self.fail(&e);
            }
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        eprintln!("airlock: telemetry {}: {e}; further records are dropped", self.path.display());
        // Discard what is buffered rather than let the drop retry it.
        if let Some(out) = self.out.take() {
            drop(out.into_parts());
        }
    }
}
