//! The served filesystem: each root of `airlock run` mounted as a FUSE
//! filesystem inside the child's mount view, every request decided by the
//! same core as the FS proxy's (policy, handles, limits, audit).
//!
//! - [`abi`]: the kernel's numbers and structure sizes;
//! - [`codec`]: requests and replies, both directions, sans I/O;
//! - [`inodes`]: the node table (node id to parent and name), bounded.
//!
//! The machine that serves a mount is the FS proxy's
//! ([`crate::fsproxy::FsProxy`]): a mount is one of its clients, whose
//! requests come in as `Input::Fuse` and whose replies go out as
//! `Output::FuseReply`, so that its opens share the proxy's handle table
//! and limits, its records the audit log, its counts the report, and its
//! inputs the recorded trace.

pub mod abi;
pub mod codec;

/// The fuzz targets' entry points.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod inodes;
pub mod mount;
pub mod readlink;

use serde::{Deserialize, Serialize};

/// How long the kernel may keep a lookup's or an attribute's answer by
/// default (`--fuse-cache-ms`): a change made on the host behind the
/// mount's back shows within this long.
pub const DEFAULT_CACHE_MS: u64 = 1000;
/// Requests of one mount waiting on an effect at most by default; the
/// shell reads no more of the mount's requests meanwhile.
pub const DEFAULT_MAX_PENDING: usize = 64;
/// The largest write (and read) the kernel sends in one request by
/// default: 1 MiB, the most its page limit allows.
pub const DEFAULT_MAX_WRITE: u32 = 1 << 20;
/// The kernel's own limit (256 pages).
pub const MAX_WRITE_LIMIT: u32 = 1 << 20;

/// The served filesystem's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseConfig {
    #[serde(default = "default_cache_ms")]
    pub cache_ms: u64,
    #[serde(default = "default_max_nodes")]
    pub max_nodes: usize,
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    #[serde(default = "default_max_write")]
    pub max_write: u32,
    /// Ask for passthrough where the shell can register backing files.
    #[serde(default = "default_passthrough")]
    pub passthrough: bool,
}

fn default_cache_ms() -> u64 {
    DEFAULT_CACHE_MS
}
fn default_max_nodes() -> usize {
    inodes::DEFAULT_MAX_NODES
}
fn default_max_pending() -> usize {
    DEFAULT_MAX_PENDING
}
fn default_max_write() -> u32 {
    DEFAULT_MAX_WRITE
}
fn default_passthrough() -> bool {
    true
}

impl FuseConfig {
    pub fn is_default(&self) -> bool {
        self == &FuseConfig::default()
    }
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            cache_ms: DEFAULT_CACHE_MS,
            max_nodes: inodes::DEFAULT_MAX_NODES,
            max_pending: DEFAULT_MAX_PENDING,
            max_write: DEFAULT_MAX_WRITE,
            passthrough: true,
        }
    }
}
