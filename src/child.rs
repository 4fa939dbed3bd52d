//! Process and descriptor plumbing: a child with the proxy on fd 3, and the
//! upstream descriptor a nested airlock inherits.
//!
//! Every descriptor airlock opens is close-on-exec (Rust's default), so the
//! only copy of the child's end of the socketpair that outlives `spawn` is
//! the one placed on fd 3 of the child: EOF arrives when the child and its
//! descendants have closed it, never later because of a stray copy.

use crate::client::{DEFAULT_FD, FD_ENV};
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

/// The environment variable that tells a child where the airlock binary is,
/// so scripts can call `"$AIRLOCK" fs cat FILE` without it on PATH.
pub const EXE_ENV: &str = "AIRLOCK";

pub struct Spawned {
    pub child: Child,
    /// airlock's end of the child's proxy connection.
    pub conn: UnixStream,
}

/// Start `argv` with the proxy on fd 3 and `AIRLOCK_FD=3` in its
/// environment, and without the variables in `remove_env` (secrets such as
/// the provider's API key, which only airlock may see).
pub fn spawn(argv: &[OsString], remove_env: &[OsString]) -> anyhow::Result<Spawned> {
    let Some((program, args)) = argv.split_first() else { bail!("no command given") };
    let (ours, theirs) = StdUnixStream::pair().context("creating the proxy socketpair")?;
    let child_raw: RawFd = theirs.as_raw_fd();
    let mut cmd = Command::new(program);
    cmd.args(args).env(FD_ENV, DEFAULT_FD.to_string()).kill_on_drop(true);
    for var in remove_env {
        cmd.env_remove(var);
    }
    if let Ok(exe) = std::env::current_exe() {
        cmd.env(EXE_ENV, exe);
    }
    // SAFETY: the closure runs in the forked child before exec and calls
    // only fcntl and dup2, which are async-signal-safe; it allocates nothing.
    // `child_raw` stays open in the parent until after spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let src = BorrowedFd::borrow_raw(child_raw);
            if child_raw == DEFAULT_FD {
                // Already in place; dup2 onto itself would leave it
                // close-on-exec.
                rustix::io::fcntl_setfd(src, rustix::io::FdFlags::empty())?;
            } else {
                // Never dropped: fd 3 must stay open across exec.
                let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(DEFAULT_FD));
                rustix::io::dup2(src, &mut target)?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("starting {}", program.to_string_lossy()))?;
    // The child has its copy; ours must go, or EOF would never arrive.
    drop(theirs);
    ours.set_nonblocking(true)?;
    Ok(Spawned { child, conn: UnixStream::from_std(ours)? })
}

/// Take ownership of descriptor `fd`, which must be an open socket, as an
/// async stream; it is made close-on-exec so no child inherits it.
pub fn adopt_socket(fd: RawFd) -> anyhow::Result<UnixStream> {
    // SAFETY: the borrow lives only for these two calls, which answer EBADF
    // harmlessly when fd is not open.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let stat = rustix::fs::fstat(borrowed).with_context(|| format!("descriptor {fd} is not open"))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        bail!("descriptor {fd} is not a socket");
    }
    rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::CLOEXEC)?;
    // SAFETY: fd is open (fstat succeeded) and nothing else in this process
    // owns it: it was inherited for airlock's use alone.
    let std = unsafe { StdUnixStream::from_raw_fd(fd) };
    std.set_nonblocking(true)?;
    Ok(UnixStream::from_std(std)?)
}

/// The upstream proxy connection when airlock itself runs under an airlock.
pub fn inherited_upstream() -> anyhow::Result<Option<UnixStream>> {
    let Some(v) = std::env::var_os(FD_ENV) else { return Ok(None) };
    let text = v.to_string_lossy();
    let fd: RawFd =
        text.trim().parse().with_context(|| format!("{FD_ENV}={text:?} is not a descriptor number"))?;
    adopt_socket(fd).with_context(|| format!("upstream proxy from {FD_ENV}={fd}")).map(Some)
}

/// The exit status airlock passes on: the child's code, or 128+N when a
/// signal N ended it (as shells report it).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}
