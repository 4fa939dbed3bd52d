//! `--record FILE`: a real session as a trace (`airlock_core::trace`), for
//! `airlock replay` and for the regression traces under `traces/`.

use crate::outfile::OutFile;
use crate::session::Observer;
use airlock_core::fsproxy::{Config, Input, Output};
use airlock_core::time::Instant;
use airlock_core::trace::{Header, TraceWriter};
use anyhow::Context;
use std::io::BufWriter;

pub struct Recorder {
    writer: TraceWriter<BufWriter<OutFile>>,
    /// The first write error; recording stops there, the session does not.
    error: Option<std::io::Error>,
}

impl Recorder {
    /// Record into `file`, which `OutFile::create` opened.
    pub fn create(file: OutFile, config: &Config, command: &str) -> anyhow::Result<Self> {
        let mut header = Header::fsproxy(config.clone());
        header.meta = Some(serde_json::json!({ "recorded_by": command }));
        let writer = TraceWriter::new(BufWriter::new(file), &header).context("writing the trace header")?;
        Ok(Recorder { writer, error: None })
    }

    fn note(&mut self, r: std::io::Result<()>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }
}

impl Observer for Recorder {
    fn input(&mut self, now: Instant, input: &Input) {
        if self.error.is_none() {
            let r = self.writer.input(0, now, input);
            self.note(r);
        }
    }

    fn output(&mut self, output: &Output) {
        if self.error.is_none() {
            let r = self.writer.output(0, output);
            self.note(r);
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.writer.flush()
    }
}
