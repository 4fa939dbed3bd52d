//! `airlock narrow`: start a command on a connection of its own, narrowed
//! to less than this process may reach, with the narrowed scope's secret
//! in its environment instead of the session's (issue 40). The command
//! gets the connection on descriptor 3 (`AIRLOCK_FD=3`) and
//! `AIRLOCK_TOKEN` set to that secret, so closing the descriptor and
//! coming back through `AIRLOCK_SOCKET` gives it the narrowed scope again,
//! never the session's. This process holds the connection until the
//! command ends, so the secret works as long as the command runs (and
//! stops working after).

use crate::client::{Client, DEFAULT_FD, FD_ENV};
use crate::session_socket::TOKEN_ENV;
use airlock_core::fsproxy::wire::{Op, Success};
use airlock_core::scope::Scope;
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, clap::Args)]
pub struct NarrowArgs {
    /// A path (file or directory) the command may read, and nothing more.
    #[arg(long = "ro", value_name = "PATH")]
    pub read_only: Vec<PathBuf>,
    /// A path the command may read and change.
    #[arg(long = "rw", value_name = "PATH")]
    pub read_write: Vec<PathBuf>,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<OsString>,
}

/// `path` made absolute against the working directory and lexically
/// normal, as `narrow`'s rules must be.
fn absolute(path: &Path) -> anyhow::Result<String> {
    let abs = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    let normal = airlock_core::policy::normalize(&abs)
        .with_context(|| format!("{} is not a path a rule can name", abs.display()))?;
    normal.to_str().map(str::to_owned).with_context(|| format!("{} is not UTF-8", normal.display()))
}

/// Narrow a fresh connection to the flags' rules, then start the command
/// on it; the command's exit status is returned.
pub fn narrow(args: &NarrowArgs) -> anyhow::Result<i32> {
    if args.read_only.is_empty() && args.read_write.is_empty() {
        bail!("name what the command may reach: --ro PATH or --rw PATH");
    }
    let mut rules = Vec::new();
    for (paths, access) in [(&args.read_only, "r"), (&args.read_write, "rw")] {
        for p in paths {
            rules.push(serde_json::json!({"path": absolute(p)?, "access": access}));
        }
    }
    let scope =
        Scope::from_wire(&serde_json::json!({ "rules": rules })).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut client = Client::connect().context("connecting to the session")?;
    client.send(Op::Narrow { scope })?;
    let secret = match client.recv().context("narrowing the connection")? {
        Success::Value(m) => m.get("secret").and_then(|s| s.as_str()).map(str::to_owned),
        _ => None,
    };
    let Some(secret) = secret else { bail!("the session answered the narrow without a secret") };
    let conn = OwnedFd::from(client.into_file());
    let raw = conn.as_raw_fd();
    let Some((program, rest)) = args.argv.split_first() else { bail!("no command given") };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest).env(FD_ENV, DEFAULT_FD.to_string()).env(TOKEN_ENV, &secret);
    // SAFETY: runs in the forked child before exec and only calls fcntl,
    // dup2 and close_range, which are async-signal-safe; `raw` stays open
    // in the parent until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let src = BorrowedFd::borrow_raw(raw);
            if raw == DEFAULT_FD {
                rustix::io::fcntl_setfd(src, rustix::io::FdFlags::empty())?;
            } else {
                // Never dropped: descriptor 3 must stay open across exec.
                let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(DEFAULT_FD));
                rustix::io::dup2(src, &mut target)?;
            }
            // Nothing else this process inherited (the session's own
            // descriptor included, were it elsewhere) reaches the command.
            crate::child::close_above_3_on_exec();
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", program.to_string_lossy()))?;
    // Held until the command ends: the scope's secret works while some
    // connection under it is open, so a command that closes its
    // descriptor can still come back through the socket; then it goes.
    let status = child.wait()?;
    drop(conn);
    Ok(crate::child::exit_code(status))
}
