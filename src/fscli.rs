//! `airlock fs list|stat|mkdir|remove|rename`, and `write --parents`: the
//! path operations for scripts, each one request (a listing one per page)
//! over the client.

use crate::client::{Client, ClientError};
use crate::commands::FsCommand;
use std::io::Write;

/// The path an error message names.
pub fn shown_path(cmd: &FsCommand) -> &str {
    match cmd {
        FsCommand::Cat { path }
        | FsCommand::Write { path, .. }
        | FsCommand::Append { path, .. }
        | FsCommand::List { path, .. }
        | FsCommand::Stat { path, .. }
        | FsCommand::Mkdir { path, .. }
        | FsCommand::Remove { path } => path,
        FsCommand::Rename { from, .. } => from,
    }
}

/// With `parents`, make the directories `path` is in (`mkdir -p`).
pub fn make_parents(client: &mut Client, path: &str, parents: bool) -> Result<(), ClientError> {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some((dir, _)) if parents && !dir.is_empty() => client.mkdir(dir, true),
        _ => Ok(()),
    }
}

/// A path operation's command; output to stdout.
pub fn path_op(client: &mut Client, cmd: &FsCommand) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match cmd {
        FsCommand::List { path, long } => {
            let mut written = Ok(());
            client.list(path, |e| {
                if written.is_err() {
                    return;
                }
                written = if *long {
                    writeln!(out, "{} {} {}", e.kind, e.size, e.name)
                } else {
                    writeln!(out, "{}", e.name)
                };
            })?;
            written?;
        }
        FsCommand::Stat { path, no_follow } => {
            let s = client.stat(path, !no_follow)?;
            let json = serde_json::json!({
                "kind": s.kind, "size": s.size, "mode": format!("{:04o}", s.mode), "mtime_ns": s.mtime_ns,
            });
            writeln!(out, "{json}")?;
        }
        FsCommand::Mkdir { path, parents } => client.mkdir(path, *parents)?,
        FsCommand::Remove { path } => client.remove(path)?,
        FsCommand::Rename { from, to, no_replace } => client.rename(from, to, *no_replace)?,
        FsCommand::Cat { .. } | FsCommand::Write { .. } | FsCommand::Append { .. } => {
            anyhow::bail!("not a path operation")
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
