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
pub mod inodes;

/// The fuzz targets' entry points.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
