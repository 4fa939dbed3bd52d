//! Traces of the VFS tool host (`airlock tool --record`, the simulator's
//! `tool` scenario): the FS proxy's JSONL shape with one level, and a
//! header that rebuilds the host: its config, its policy and the instant
//! it was built at.
//!
//! ```text
//! {"format":1,"machine":"vfs","config":{..},"policy":{..},"started":0,"seed":7,"meta":{..}}
//! {"output":{"tool_stdin":"eyJqc29ucnBjIjoiMi4wIiwibWV0aG9kIjoiaW5pdCIs.."}}
//! {"now":1000,"input":{"tool_stdout":"eyJpZCI6MSwibWV0aG9kIjoiZnMucmVhZCIs.."}}
//! {"note":{"swap":"out/link","to":"/etc/passwd"}}
//! ```
//!
//! A recording of `airlock tool` holds no secret: its header leaves out the
//! `--env-allow` values ([`Header::forget_env_values`]), and everything
//! else is scrubbed of them, so its replay's host knows the variables'
//! names only. The simulator's secret is its own and stays in its traces.

use super::{
    first_line, numbered, parse_header, replay_records, Machine, Numbered, Readable, ReplayError, FORMAT,
};
use crate::time::Instant;
use crate::vfs::{Config, Host, Input, Output, PolicyConfig, ToolPolicy};
use serde::{Deserialize, Serialize};
use std::io::BufRead;

/// The machine name of a VFS tool host trace.
pub const MACHINE_VFS: &str = "vfs";

/// The first line of a VFS tool host trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub machine: String,
    pub config: Config,
    pub policy: PolicyConfig,
    /// The `now` the host was built at (the tool's spawn).
    #[serde(default)]
    pub started: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Free-form notes (the simulator's scenario, swarm and failure);
    /// replay ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl Header {
    /// A header for a host built at `started` from `config` and `policy`.
    pub fn new(config: Config, policy: &PolicyConfig, started: Instant) -> Self {
        let policy = policy.clone();
        Header {
            format: FORMAT,
            machine: MACHINE_VFS.to_owned(),
            config,
            policy,
            started,
            seed: None,
            meta: None,
        }
    }

    /// The same header without the `env_allow` variables' values.
    pub fn forget_env_values(mut self) -> Self {
        for (_, value) in &mut self.policy.env_allow {
            *value = None;
        }
        self
    }
}

impl Machine for Host {
    type Input = Input;
    type Output = Output;
    fn handle(&mut self, now: Instant, input: Input) {
        Host::handle(self, now, input)
    }
    fn poll_output(&mut self) -> Option<Output> {
        Host::poll_output(self)
    }
}

impl Readable for Output {
    /// Lines to or from the tool are shown as the JSON they carry.
    fn readable(&self) -> String {
        let text = |bytes: &[u8]| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned());
        let value = match self {
            Output::ToolStdin(bytes) => serde_json::json!({ "tool_stdin": text(bytes) }),
            Output::Finished { line, exit_status } => {
                serde_json::json!({ "finished": { "line": text(line), "exit_status": exit_status } })
            }
            other => match serde_json::to_value(other) {
                Ok(v) => v,
                Err(e) => return e.to_string(),
            },
        };
        value.to_string()
    }
}

/// What a successful replay went through.
#[derive(Debug)]
pub struct ReplayReport {
    pub header: Header,
    pub inputs: u64,
    pub outputs: u64,
    /// The host as the last input left it.
    pub host: Host,
}

/// Replay a VFS tool host trace: rebuild the host from the header, feed
/// the inputs in order and check each recorded output against what the
/// host yields. Fails at the first difference, naming its line.
pub fn replay<R: BufRead>(reader: R) -> Result<ReplayReport, ReplayError<Output>> {
    let mut lines = numbered(reader);
    let (line, text) = first_line(&mut lines)?;
    let header: Header = parse_header(line, &text, MACHINE_VFS)?;
    replay_from(header, lines)
}

pub(super) fn replay_from(header: Header, lines: Numbered<'_>) -> Result<ReplayReport, ReplayError<Output>> {
    let policy = ToolPolicy::new(&header.policy)
        .map_err(|e| ReplayError::Malformed { line: 1, message: format!("header's policy: {e}") })?;
    let mut hosts = [Host::new(header.started, header.config.clone(), policy)];
    let (inputs, outputs) = replay_records(&mut hosts, lines)?;
    let [host] = hosts;
    Ok(ReplayReport { header, inputs, outputs, host })
}
