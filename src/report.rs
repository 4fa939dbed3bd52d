//! `--report FILE`: what a session did, written when airlock exits.

use crate::outfile::OutFile;
use airlock_core::broker::{Broker, BrokerStats};
use airlock_core::fsproxy::{FsProxy, Stats};
use airlock_core::sandbox::{Cover, InForce};
use serde::Serialize;
use std::io::Write;
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

/// The machine's own counters (`requests`, `responses`, `errors_by_code`,
/// `handles_opened`, `handles_closed`, `handles_cleaned_up`, `clients`, …)
/// and what only the end of the session can tell.
#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub stats: Stats,
    /// Handles still in the table at exit. Always 0 unless airlock has a bug.
    pub handles_leaked: u64,
    /// Host files still open at exit. Always 0 unless airlock has a bug.
    pub files_leaked: u64,
    pub upstream: bool,
    pub child_exit: Option<ChildExit>,
    /// The session's LLM broker, when this level runs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerReport>,
    /// What confined the child (`airlock run` only): `landlock_abi`, `fs`,
    /// `net`, `scoped`, `not_enforced`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<InForce>,
    /// The variables of airlock's environment the child did not get, by
    /// name, with why (`airlock run` only); never a value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_removed: Option<Vec<airlock_core::environ::RemovedVar>>,
    /// The guard in the trees the child reached directly.
    #[serde(flatten)]
    pub direct: Direct,
    /// The egress proxies (`--allow-host`): the patterns and the counts
    /// (`connections`, `tunnels`, `refused`, `bytes_up`, `bytes_down`,
    /// `by_rule`, `refused_hosts`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressReport>,
}

/// The guard in the trees the child reached directly (`--sandbox-ro`,
/// `--sandbox-rw`): what the view covered, and the protected paths the
/// child created where a mount could not stop it.
#[derive(Debug, Default, Serialize)]
pub struct Direct {
    /// Secret files masked, protected paths read-only, git directories pinned.
    #[serde(rename = "direct_covered", skip_serializing_if = "Vec::is_empty")]
    pub covered: Vec<Cover>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protected_created: Vec<std::path::PathBuf>,
    /// What of those was renamed aside, and to what.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protected_set_aside: Vec<crate::holds::SetAside>,
    /// Writable trees grown too large at the end to be looked through.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protected_unchecked: Vec<std::path::PathBuf>,
}

/// What the broker did: its own counters (`submitted`, `started`,
/// `succeeded`, `errors_by_code`, `trims`, …; `charged` in pico-USD) and the
/// budget in USD, for reading.
#[derive(Debug, Serialize)]
pub struct BrokerReport {
    pub session_id: String,
    pub initial_units: f64,
    pub remaining_units: f64,
    /// The sum of every charge, before the clamp at zero.
    pub charged_units: f64,
    #[serde(flatten)]
    pub stats: BrokerStats,
}

impl BrokerReport {
    pub fn new(b: &Broker) -> Self {
        let stats = b.stats().clone();
        BrokerReport {
            session_id: b.quota().session_id,
            initial_units: b.initial().as_usd_f64(),
            remaining_units: b.remaining().as_usd_f64(),
            charged_units: stats.charged.as_usd_f64(),
            stats,
        }
    }
}

impl Report {
    pub fn new(proxy: &FsProxy, open_files: usize, child_exit: Option<ChildExit>) -> Self {
        Report {
            stats: proxy.stats().clone(),
            handles_leaked: proxy.open_handles() as u64,
            files_leaked: open_files as u64,
            upstream: proxy.config().upstream,
            child_exit,
            broker: proxy.broker().map(BrokerReport::new),
            sandbox: None,
            direct: Direct::default(),
            env_removed: None,
            egress: None,
        }
    }

    pub fn write(&self, path: &Path, mut out: OutFile) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        out.write_all(text.as_bytes())
            .and_then(|()| out.finish())
            .map_err(|e| anyhow::anyhow!("writing report {}: {e}", path.display()))
    }
}
