//! `airlock toolexec`: allow-listed host tools over HTTP (seed 001).
//!
//! `serve` is the production shell around `airlock_core::toolexec`: hyper
//! parses HTTP, this module moves bytes between sockets, pipes and
//! processes, and the core's `Exchange` decides everything else.
//!
//! [`Service`] is that shell for one connection over any byte stream,
//! generic over a [`Runner`] that starts tools: [`ProcessRunner`] in
//! production; a fuzz target or bench can pass an in-memory runner and a
//! `tokio::io::duplex` stream to push raw bytes through hyper into the
//! very same service.

mod body;
mod listen;
mod process;
mod serve;
mod service;
pub mod shim;
pub mod shims;

pub use process::ProcessRunner;
pub use serve::{ServeArgs, TOKEN_ENV, URL_ENV};
pub use service::{Runner, Service, ToolOutput, ToolProcess};

use clap::Subcommand;

/// `airlock toolexec …`
#[derive(Debug, Subcommand)]
pub enum ToolexecCommand {
    /// Serve allow-listed tools over HTTP (v1 buffered, v2 streaming).
    Serve(Box<ServeArgs>),
    /// Run TOOL on the host through a ToolExec server (Rust v2 client).
    Shim(shim::ShimArgs),
    /// Write the POSIX curl shim and one link per tool into DIR.
    WriteShims(shims::WriteShimsArgs),
}

/// Run a `toolexec` subcommand; returns the process exit status.
pub fn toolexec(cmd: &ToolexecCommand) -> anyhow::Result<i32> {
    match cmd {
        ToolexecCommand::Serve(args) => serve::serve(args),
        ToolexecCommand::Shim(a) => Ok(shim::run(&a.tool, &a.args)),
        ToolexecCommand::WriteShims(a) => shims::write_shims(a),
    }
}
