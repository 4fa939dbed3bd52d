//! The check of a confined process's command line before it starts: the
//! program's interpreter chain and the files named as arguments, decided
//! by the core (`airlock_core::sandbox::program`) from the facts read here
//! (a file's kind, its first bytes, a directory's names). `run`'s child
//! ([`super::args::check_run_command`]), `tool`'s tool and `toolexec
//! serve`'s tools go through it.

use airlock_core::sandbox::{program, Ruleset};
use anyhow::bail;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

/// What a confined child is started with once its command line is
/// checked ([`check_command`]).
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub argv: Vec<OsString>,
    /// Variables to set in its environment (a version manager's, as its
    /// `exec` sets them).
    pub env: Vec<(OsString, OsString)>,
}

/// The variables of airlock's own environment the command check reads:
/// the child inherits them.
pub fn env_for_check() -> BTreeMap<OsString, OsString> {
    program::env_read().filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v))).collect()
}

/// Before starting a confined child: the program's interpreter chain and
/// the files named as arguments, decided by the core
/// (`airlock_core::sandbox::program`) from what is read here. What it
/// grants is added to `rules` (and listed there for the report); what it
/// refuses stops the start, naming what to grant; each warning is said
/// once on stderr.
pub fn check_command(
    rules: &mut Ruleset,
    cwd: &Path,
    argv: &[OsString],
    env: &BTreeMap<OsString, OsString>,
    roots: &program::Roots<'_>,
) -> anyhow::Result<Launch> {
    let airlock = std::env::current_exe().ok().and_then(|p| std::fs::canonicalize(p).ok());
    let cmd = program::Command { argv, cwd, env, airlock: airlock.as_deref() };
    let mut facts = program::Facts::default();
    let checked = loop {
        match program::check(&cmd, rules, roots, &facts)? {
            program::Step::Done(c) => break c,
            program::Step::Ask(ask) => {
                if facts.len() >= program::MAX_ASKS {
                    bail!("checking the command read more than {} files; giving up", program::MAX_ASKS);
                }
                let answer = answer(&ask);
                facts.give(ask, answer);
            }
        }
    };
    for w in &checked.warnings {
        eprintln!("airlock: warning: {w}");
    }
    rules.grant_checked(&checked);
    let mut argv = argv.to_vec();
    if let (Some(p), Some(first)) = (&checked.program, argv.first_mut()) {
        *first = p.clone().into_os_string();
    }
    Ok(Launch { argv, env: checked.env })
}

/// One fact for the command check, read from the filesystem.
fn answer(ask: &program::Ask) -> program::Answer {
    use program::{Answer, Ask, Kind, Stat};
    use std::os::unix::fs::PermissionsExt;
    match ask {
        Ask::Stat(p) => Answer::Stat(std::fs::canonicalize(p).ok().and_then(|real| {
            let m = std::fs::metadata(&real).ok()?;
            let kind = if m.is_file() {
                Kind::File { exec: m.permissions().mode() & 0o111 != 0 }
            } else if m.is_dir() {
                Kind::Dir
            } else {
                Kind::Other
            };
            Some(Stat { real, kind })
        })),
        Ask::Read(p) => Answer::Bytes(read_head(p)),
        Ask::List(p) => Answer::Names(std::fs::read_dir(p).ok().map(|d| {
            d.filter_map(Result::ok)
                .take(program::MAX_LISTED)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })),
    }
}

/// The first bytes of a regular file; nothing for anything else (a FIFO
/// is opened without blocking and never read).
fn read_head(p: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(p)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::new();
    f.take(program::HEAD_BYTES as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}
