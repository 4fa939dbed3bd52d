//! The VFS tool host (seed 004): a tool subprocess asks for files, HTTP and
//! processes over NDJSON JSON-RPC on its stdin/stdout; the host checks every
//! request against the [`ToolPolicy`] and answers.
//!
//! [`Host`] is the sans-I/O machine. The shell (production or simulator)
//! spawns the tool, then loops:
//!
//! - feeds what happens with [`Host::handle`]`(now, `[`Input`]`)`: bytes
//!   from the tool's stdout and their EOF, its stderr, its exit, the result
//!   of an effect, a signal the user sent airlock, or [`Input::Tick`] when
//!   [`Host::poll_timeout`] is due;
//! - drains [`Host::poll_output`] after every `handle`: bytes for the
//!   tool's stdin ([`Output::ToolStdin`], whole lines), closing it, an
//!   [`Effect`] to run (a [`FsOp`] on its [`ProjectFiles`], an HTTP request,
//!   a process), cancelling one, a signal for the tool's process group, and
//!   finally [`Output::Finished`] with the JSON line to print and the exit
//!   status;
//! - reads the tool's stdout only while [`Host::stdout_budget`] is non-zero
//!   and at most that many bytes at a time (the host stops reading at
//!   [`DEFAULT_MAX_PENDING`] unanswered requests, or while more than
//!   [`DEFAULT_MAX_STDIN_BACKLOG`] bytes it wrote wait unread by the tool;
//!   once the tool has exited its pipe is read out);
//! - reports with [`Input::ToolStdinWritten`] how many bytes of
//!   [`Output::ToolStdin`] the tool took, and [`Input::ToolStdinClosed`]
//!   when writing failed.
//!
//! The first output is always the `init` line. Requests are served one at a
//! time in the order they arrive; an effect in flight answers its request
//! once its [`Input::EffectDone`] comes back (a result for an effect the
//! host no longer waits for, because it timed out or was cancelled, is
//! dropped). Everything handed to the tool is scrubbed of every
//! `--env-allow` value of [`MIN_SECRET_LEN`] bytes or more first (raw bytes
//! before base64, and every string of every message).
//!
//! File system effects: run them with [`FsOp::run`] on a [`ProjectFiles`]
//! and the host's [`Gate`] ([`Host::gate`]), which decides on *resolved*
//! paths: a backend provides the primitives of [`walk::ProjectNs`] on
//! its directory handles, and every operation is the one walk of
//! [`walk`], which decides on each resolved path and acts in the
//! directory it checked.

pub mod files;
/// The `vfs_host` fuzz target's harness (tests and the `fuzzing` feature).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod machine;
pub mod memfs;
pub mod policy;
pub mod scrub;
pub mod url;
pub mod walk;

mod effect;
mod outcome;

pub use effect::{
    Effect, EffectId, EffectResult, Header, HttpMethod, HttpRequest, HttpResponse, OpError, ProcessOutput,
    ProcessRun,
};
pub use files::{
    DirEntry, EntryKind, FsOp, FsReply, Gate, GrepFile, GrepLine, GrepQuery, GrepResult, Metadata,
    ProjectFiles, ProjectPath,
};
pub use machine::{
    Host, Input, NetRefusal, Output, Signal, UserSignal, MAX_AUDITED_URL, MAX_NET_REFUSALS_HELD,
};
pub use outcome::{Outcome, OutcomeKind, ToolExit};
pub use policy::{PolicyConfig, PolicyError, ToolPolicy};

use crate::codec::jsonrpc::{DEFAULT_MAX_LINE, DEFAULT_MAX_LINE_VALUES};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// `--max-file`: file content, HTTP bodies, each process stream (L621-624).
pub const DEFAULT_MAX_FILE: usize = 10 * 1024 * 1024;
/// `--timeout`: the tool silent this long with no request pending is hung.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// `--op-timeout`: an effect (file, HTTP, process) running this long is
/// answered `-32004` and cancelled.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(30);
/// `--cancel-grace`: after `cancel`, the wait before SIGTERM.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);
/// `--kill-grace`: the wait before each next signal (SIGTERM, SIGKILL).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Unanswered requests at which the host stops reading the tool's stdout.
pub const DEFAULT_MAX_PENDING: usize = 64;
/// Bytes written for the tool's stdin and not yet taken by it, above which
/// the host pauses (no reading, no serving) until the tool reads or its
/// silence times it out: a tool that never reads costs bounded memory.
pub const DEFAULT_MAX_STDIN_BACKLOG: usize = 4 * 1024 * 1024;
/// Lines (matches and context) one `fs.grep` returns at most.
pub const DEFAULT_MAX_GREP_LINES: usize = 10_000;
/// The tail of the tool's stderr kept for a `no_result` message.
pub const DEFAULT_STDERR_TAIL: usize = 64 * 1024;
/// `--env-allow` values shorter than this are not scrubbed (a 1-byte value
/// would redact every occurrence of a letter).
pub const MIN_SECRET_LEN: usize = 4;
/// The protocol version `init` announces.
pub const PROTOCOL_VERSION: &str = "0.1.0";
/// Bytes of stdout accepted in one `handle` at most (the shell's read size).
pub const MAX_READ_CHUNK: usize = 64 * 1024;

/// Everything about one tool run except the policy. A trace's header
/// carries it (`trace::vfs`), so the host can be rebuilt to replay one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// `--name`: `tool.name` in `init`.
    pub name: String,
    /// `--args`: `tool.arguments` in `init`, an object.
    pub arguments: Value,
    /// `--apply`: inputs for successive `running`/`waiting` states.
    pub applies: Vec<String>,
    pub max_line: usize,
    /// `--max-line-values`: JSON values one line may hold.
    #[serde(default = "default_max_line_values", skip_serializing_if = "is_default_max_line_values")]
    pub max_line_values: usize,
    pub max_file: usize,
    pub timeout: Duration,
    pub op_timeout: Duration,
    pub cancel_grace: Duration,
    pub kill_grace: Duration,
    pub max_pending: usize,
    pub max_stdin_backlog: usize,
    pub max_grep_lines: usize,
    pub stderr_tail: usize,
    /// A deliberate bug, switched on only by the simulator's tests to
    /// prove its checkers can fail (see `fsproxy::PlantedBug`).
    #[doc(hidden)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted_bug: Option<crate::fsproxy::PlantedBug>,
}

impl Config {
    /// Defaults for a tool called `name` with `arguments` `{}`.
    pub fn new(name: impl Into<String>) -> Self {
        Config {
            name: name.into(),
            arguments: Value::Object(Default::default()),
            applies: Vec::new(),
            max_line: DEFAULT_MAX_LINE,
            max_line_values: DEFAULT_MAX_LINE_VALUES,
            max_file: DEFAULT_MAX_FILE,
            timeout: DEFAULT_TIMEOUT,
            op_timeout: DEFAULT_OP_TIMEOUT,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            kill_grace: DEFAULT_KILL_GRACE,
            max_pending: DEFAULT_MAX_PENDING,
            max_stdin_backlog: DEFAULT_MAX_STDIN_BACKLOG,
            max_grep_lines: DEFAULT_MAX_GREP_LINES,
            stderr_tail: DEFAULT_STDERR_TAIL,
            planted_bug: None,
        }
    }

    /// Parse `--args` text: it must be a JSON object (exit 125 otherwise).
    pub fn parse_arguments(text: &str) -> Result<Value, String> {
        match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err("--args must be a JSON object".into()),
            Err(e) => Err(format!("--args is not valid JSON: {e}")),
        }
    }
}

// A trace recorded before the limit existed, or with its default, has no
// field for it: the header stays as it was.
fn default_max_line_values() -> usize {
    DEFAULT_MAX_LINE_VALUES
}

fn is_default_max_line_values(n: &usize) -> bool {
    *n == DEFAULT_MAX_LINE_VALUES
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_guard;
#[cfg(test)]
mod tests_host;
#[cfg(test)]
mod tests_parts;
#[cfg(test)]
mod tests_walk;

#[cfg(test)]
mod heap_tests;
