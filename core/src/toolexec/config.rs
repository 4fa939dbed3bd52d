//! Limits and the tool allow-list.

use super::auth::Token;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `--timeout`: seconds from spawn until the tool is stopped.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// `--kill-grace`: seconds between SIGTERM and SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// `--max-connections`: connections served at once; more wait in the backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// `--max-body`: bytes of request body.
pub const DEFAULT_MAX_BODY: u64 = 1_048_576;
/// `--max-buffered`: bytes of tool output a buffered (v1) answer may hold.
pub const DEFAULT_MAX_BUFFERED: u64 = 67_108_864;
/// `--header-timeout`: seconds a client has to send a complete request head.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of tool output that may wait for a streaming client before the
/// tool's pipe is no longer read (a slow reader slows the tool).
pub const STREAM_WINDOW: u64 = 256 * 1024;
/// Largest single read from a tool's pipe.
pub const READ_CHUNK: usize = 64 * 1024;
/// Bytes read without waiting once the drain grace after the tool's exit
/// has run out: the most an unprivileged process's pipe can hold
/// (`/proc/sys/fs/pipe-max-size`), so every byte the tool wrote before it
/// exited fits, and an escaped grandchild that keeps writing cannot keep
/// the answer open.
pub const FINAL_DRAIN: u64 = 1024 * 1024;
/// `X-Exit-Code` of every error answer (the shim exits with it).
pub const EXIT_CODE_ERROR: i32 = 86;
/// `X-Exit-Code` after a timeout.
pub const EXIT_CODE_TIMEOUT: i32 = 124;
/// Exit status of `airlock toolexec serve` on an unusable token.
pub const EXIT_BAD_TOKEN: i32 = 125;
/// The one path served.
pub const EXEC_PATH: &str = "/exec";
/// Body of the 426 answer, byte for byte.
pub const UNSUPPORTED_PROTO_BODY: &str = "Unsupported shim protocol; expected 1 or 2\n";

/// How an allowed tool's program is found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolProgram {
    /// `--tool NAME`: NAME looked up on `PATH` for every request.
    OnPath,
    /// `--tool NAME=PROGRAM`: always this program.
    Fixed(Vec<u8>),
}

/// Everything an [`super::Exchange`] decides with.
#[derive(Clone, Debug)]
pub struct Config {
    pub token: Token,
    /// Allowed tools by the name a client asks for.
    pub tools: BTreeMap<String, ToolProgram>,
    /// Absolute, normalized working directory: the default `cwd` and the
    /// root every `cwd` must stay under.
    pub workdir: Vec<u8>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub max_body: u64,
    pub max_buffered: u64,
    /// The head (hyper) and then the body (this machine) must each arrive
    /// within it.
    pub header_timeout: Duration,
    pub stream_window: u64,
    pub read_chunk: usize,
    pub final_drain: u64,
}

impl Config {
    /// A config with every limit at its default.
    pub fn new(token: Token, workdir: impl Into<Vec<u8>>) -> Self {
        Config {
            token,
            tools: BTreeMap::new(),
            workdir: workdir.into(),
            timeout: DEFAULT_TIMEOUT,
            kill_grace: DEFAULT_KILL_GRACE,
            max_body: DEFAULT_MAX_BODY,
            max_buffered: DEFAULT_MAX_BUFFERED,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            stream_window: STREAM_WINDOW,
            read_chunk: READ_CHUNK,
            final_drain: FINAL_DRAIN,
        }
    }

    /// Parse one `--tool NAME[=PROGRAM]` and add it.
    pub fn add_tool_spec(&mut self, spec: &str) -> Result<(), String> {
        let (name, program) = match spec.split_once('=') {
            Some((n, p)) => (n, ToolProgram::Fixed(p.as_bytes().to_vec())),
            None => (spec, ToolProgram::OnPath),
        };
        if name.is_empty() || name.contains('/') || name.bytes().any(|b| b.is_ascii_whitespace() || b == 0) {
            return Err(format!("bad tool name {name:?}: empty, or holds '/', whitespace or NUL"));
        }
        if let ToolProgram::Fixed(p) = &program {
            if p.is_empty() || p.contains(&0) {
                return Err(format!("bad program for tool {name:?}: empty or holds NUL"));
            }
        }
        self.tools.insert(name.to_owned(), program);
        Ok(())
    }
}
