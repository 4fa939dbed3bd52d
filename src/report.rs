//! `--report FILE`: what a session did, written when airlock exits.

use airlock_core::fsproxy::wire::ErrorCode;
use airlock_core::fsproxy::FsProxy;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct ChildExit {
    /// Exit code, when the child exited.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// What airlock itself exits with.
    pub status: i32,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub requests: u64,
    pub responses: u64,
    pub errors_by_code: BTreeMap<ErrorCode, u64>,
    pub handles_opened: u64,
    pub handles_closed: u64,
    pub handles_cleaned_up: u64,
    /// Handles still in the table at exit. Always 0 unless airlock has a bug.
    pub handles_leaked: u64,
    /// Host files still open at exit. Always 0 unless airlock has a bug.
    pub files_leaked: u64,
    pub clients: u64,
    pub frames_rejected: u64,
    pub truncated_frames: u64,
    pub upstream: bool,
    pub child_exit: Option<ChildExit>,
}

impl Report {
    pub fn new(proxy: &FsProxy, open_files: usize, child_exit: Option<ChildExit>) -> Self {
        let s = proxy.stats();
        Report {
            requests: s.requests,
            responses: s.responses,
            errors_by_code: s.errors_by_code.clone(),
            handles_opened: s.handles_opened,
            handles_closed: s.handles_closed,
            handles_cleaned_up: s.handles_cleaned_up,
            handles_leaked: proxy.open_handles() as u64,
            files_leaked: open_files as u64,
            clients: s.clients,
            frames_rejected: s.frames_rejected,
            truncated_frames: s.truncated_frames,
            upstream: proxy.config().upstream,
            child_exit,
        }
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("writing report {}: {e}", path.display()))
    }
}
