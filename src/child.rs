//! Process and descriptor plumbing for `airlock run`: its child with the
//! proxy on fd 3, and the upstream descriptor a nested airlock inherits.
//! How the child is confined is `crate::confine`'s alone ([`spawn`] hands
//! it the request); this places the child's descriptors and environment.
//!
//! Every descriptor airlock opens is close-on-exec (Rust's default), so the
//! only copy of the child's end of the socketpair that outlives `spawn` is
//! the one placed on fd 3 of the child: EOF arrives when the child and its
//! descendants have closed it, never later because of a stray copy.
//!
//! Between fork and exec the child also asks for SIGKILL when airlock
//! dies, so it never runs on unsupervised. Confined, the child is
//! airlock's confinement stage, which closes every descriptor above 3
//! before the payload's exec and keeps the payload's whole tree in
//! namespaces (or under a subreaper) that end with it; unconfined
//! (`--no-sandbox`), the child marks every descriptor above 3
//! close-on-exec itself, so it gets exactly 0, 1, 2 and 3. The child stays
//! in airlock's process group: a terminal's signals reach both.

use crate::client::{DEFAULT_FD, FD_ENV};
use crate::session_socket::{SOCKET_ENV, TOKEN_ENV};
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
    /// The confinement under way, when confined: what the stage applied
    /// is read from it ([`Spawned::confirm`]) while airlock serves the
    /// mounts the stage makes on the way.
    pub pending: Option<crate::confine::Pending>,
    /// airlock's end of the socket the stage sends the served
    /// filesystem's mounts over.
    pub mounts: Option<OwnedFd>,
    /// The description the stage applies, when confined.
    pub plan: Option<airlock_core::sandbox::Confinement>,
    /// The session's cgroups, removed when dropped (none unconfined).
    pub groups: crate::confine::bounds::Groups,
    /// Why the roots asked for are not served as filesystems.
    pub not_served: Option<airlock_core::sandbox::fuse::NotServed>,
}

impl Spawned {
    /// What the stage applied, read to its end (blocks until the
    /// payload's exec); an exec that failed is an error naming `argv[0]`.
    pub fn confirm(
        pending: Option<crate::confine::Pending>,
        argv: &[OsString],
    ) -> anyhow::Result<(Option<airlock_core::sandbox::StageStatus>, Option<crate::confine::egress::Listeners>)>
    {
        let (applied, listeners) =
            match pending.map(crate::confine::Pending::wait_with_listeners).transpose()? {
                Some((status, listeners)) => (Some(status), listeners),
                None => (None, None),
            };
        if let Some(airlock_core::sandbox::StageStatus::ExecFailed { errno }) = applied {
            let program = argv.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            bail!("starting {program}: {}", std::io::Error::from_raw_os_error(errno));
        }
        Ok((applied, listeners))
    }
}

/// airlock's own variables for a child: set by airlock after the
/// environment policy, so an enclosing session's never pass.
pub const AIRLOCK_ENV: [&str; 4] = [EXE_ENV, FD_ENV, SOCKET_ENV, TOKEN_ENV];

/// Start `argv` with the proxy on fd 3, the environment `env` (what the
/// environment policy kept of airlock's: see `crate::envpolicy`) and
/// `AIRLOCK_FD=3`. `confine`, when given, is what `crate::confine::start`
/// confines it with; then [`Spawned::confirm`] says what is in force.
/// `session_env` names this session's socket and secret; an enclosing
/// session's never reach the child, whose requests must go through this
/// level.
pub fn spawn(
    argv: &[OsString],
    env: &[(OsString, OsString)],
    confine: Option<crate::confine::Request>,
    session_env: &[(OsString, OsString)],
) -> anyhow::Result<Spawned> {
    let Some((program, args)) = argv.split_first() else { bail!("no command given") };
    let (ours, theirs) = StdUnixStream::pair().context("creating the proxy socketpair")?;
    let child_raw: RawFd = theirs.as_raw_fd();
    let (mut cmd, mut pending, plan, groups, not_served) = match confine {
        Some(req) => {
            let s = crate::confine::start(req, argv)?;
            (s.cmd, Some(s.pending), Some(s.plan), s.groups, s.not_served)
        }
        None => {
            let mut cmd = Command::new(program);
            cmd.args(args);
            (cmd, None, None, crate::confine::bounds::Groups::default(), None)
        }
    };
    // airlock's own variables come after the policy, which withholds
    // any an enclosing session set.
    cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    cmd.env(FD_ENV, DEFAULT_FD.to_string()).kill_on_drop(true);
    cmd.envs(session_env.iter().map(|(k, v)| (k, v)));
    if let Ok(exe) = std::env::current_exe() {
        cmd.env(EXE_ENV, exe);
    }
    let confined = pending.is_some();
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and makes
    // only system calls (fcntl, dup2, close_range, prctl, getppid), which
    // are async-signal-safe; it allocates nothing. `child_raw` stays open
    // in the parent until after spawn returns.
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
            // The stage closes everything above 3 itself, before the
            // payload's exec (its status pipe must reach it first).
            if !confined {
                close_above_3_on_exec();
            }
            rustix::process::set_parent_process_death_signal(Some(crate::confine::PARENT_DEATH_SIGNAL))?;
            // airlock may have died before the request above: then the
            // child was already reparented and must not run at all.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("airlock exited while starting the child"));
            }
            Ok(())
        });
    }
    if let Some(p) = &pending {
        p.install(&mut cmd);
    }
    let child = cmd.spawn().with_context(|| format!("starting {}", program.to_string_lossy()))?;
    // The child has its copy; ours must go, or EOF would never arrive.
    drop(theirs);
    drop(cmd);
    let mounts = pending.as_mut().and_then(crate::confine::Pending::mounts);
    ours.set_nonblocking(true)?;
    Ok(Spawned { child, conn: UnixStream::from_std(ours)?, pending, mounts, plan, groups, not_served })
}

/// Mark every descriptor above 3 close-on-exec. Not closed outright: the
/// standard library's own pipe that reports a failed exec must live until
/// the exec.
pub(crate) fn close_above_3_on_exec() {
    // SAFETY: close_range only changes descriptor flags; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if r != 0 {
        // Before Linux 5.11: one by one, up to a generous bound.
        for fd in 4..65_536 {
            // SAFETY: a borrow for one fcntl; EBADF for a closed number is harmless.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
        }
    }
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
