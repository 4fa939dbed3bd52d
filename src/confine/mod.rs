//! The one confinement every process airlock starts goes through: `run`'s
//! child, `tool`'s tool and its `process.run` programs, `toolexec
//! serve`'s tools. The caller builds its `Command` as before (environment,
//! descriptors, process group); [`confine`] turns it into a run of
//! airlock's own binary as the hidden confinement stage (see [`stage`]),
//! which applies the core's description (`airlock_core::sandbox`) and
//! execs the payload; [`Pending::wait`] reads what the stage applied, or
//! why it refused, before anything else happens.

pub mod args;
pub mod bounds;
pub mod egress;
pub mod filter;
pub mod fuse;
pub mod landlock;
pub mod program;
pub mod stage;
pub mod sweep;

pub use args::SandboxArgs;

use airlock_core::sandbox::{Confinement, NsMode, Ruleset, StageStatus, View};
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// `AIRLOCK_NO_NAMESPACES=1`: never use namespaces (layers 2-4 only).
pub const NO_NAMESPACES_ENV: &str = "AIRLOCK_NO_NAMESPACES";

/// The namespace mode for `--require-namespaces` and the environment.
pub fn ns_mode(require: bool) -> anyhow::Result<NsMode> {
    let off = std::env::var_os(NO_NAMESPACES_ENV).is_some_and(|v| v != "0" && !v.is_empty());
    NsMode::from_flags(require, off).map_err(anyhow::Error::msg)
}

/// A confinement under way: what the stage applied is read from here.
pub struct Pending {
    reader: OwnedFd,
    writer: Option<OwnedFd>,
    /// The stage's number for the write end.
    target: RawFd,
    /// `--allow-host`: the channel the proxy listeners come back on
    /// (airlock's end, the stage's end and its number there).
    egress: Option<(OwnedFd, Option<OwnedFd>, RawFd)>,
}

/// The status pipe's write end sits above this in airlock, so no caller's
/// descriptor placement (fd 3 for `run`) lands on it.
const STATUS_FD_FLOOR: RawFd = 10;

/// Build the confinement for `ruleset` and `view`.
pub fn confinement(
    ruleset: Ruleset,
    view: View,
    namespaces: NsMode,
    net: bool,
    keep_fds: u32,
) -> Confinement {
    Confinement {
        namespaces,
        net,
        ruleset,
        view,
        keep_fds,
        status_fd: keep_fds as i32 + 1,
        session: None,
        bounds: None,
        fuse: None,
        egress: None,
    }
}

/// A `Command` that runs `argv` confined by `plan`. Set its environment,
/// stdio, working directory and process group as for `argv` itself, add
/// any `pre_exec` of the caller's, and then, last, [`Pending::install`].
pub fn command(plan: &Confinement, argv: &[OsString]) -> anyhow::Result<(tokio::process::Command, Pending)> {
    if argv.is_empty() {
        bail!("no command given");
    }
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    let text = serde_json::to_string(plan).context("the confinement plan")?;
    cmd.arg0("airlock").arg(stage::STAGE_ARG).arg(text).arg("--").args(argv);
    let (reader, writer) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).context("the confinement status pipe")?;
    let writer = rustix::io::fcntl_dupfd_cloexec(&writer, STATUS_FD_FLOOR)?;
    let egress = match &plan.egress {
        Some(listen) => {
            use rustix::net::{AddressFamily, SocketFlags, SocketType};
            let (ours, theirs) =
                rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
                    .context("the egress listeners' channel")?;
            let theirs = rustix::io::fcntl_dupfd_cloexec(&theirs, STATUS_FD_FLOOR)?;
            Some((ours, Some(theirs), listen.fd))
        }
        None => None,
    };
    Ok((cmd, Pending { reader, writer: Some(writer), target: plan.status_fd, egress }))
}

impl Pending {
    /// Place the status pipe where the stage expects it and ask for SIGKILL
    /// when airlock dies. The last `pre_exec` step: one added after it
    /// could close or replace the pipe.
    pub fn install(&self, cmd: &mut tokio::process::Command) {
        let Some(writer) = &self.writer else { return };
        let raw = writer.as_raw_fd();
        let target = self.target;
        // (-1, -1): no egress channel to place.
        let (egress_raw, egress_target) = match &self.egress {
            Some((_, Some(theirs), at)) => (theirs.as_raw_fd(), *at),
            _ => (-1, -1),
        };
        let parent = rustix::process::getpid();
        // SAFETY: runs in the forked child before exec, after the caller's
        // own pre_exec steps; only system calls (dup2/fcntl, prctl,
        // getppid), nothing allocated. `raw` stays open in airlock until
        // `Pending::wait`.
        unsafe {
            cmd.pre_exec(move || {
                let src = BorrowedFd::borrow_raw(raw);
                if raw == target {
                    rustix::io::fcntl_setfd(src, rustix::io::FdFlags::empty())?;
                } else if libc::dup2(raw, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if egress_raw >= 0 && libc::dup2(egress_raw, egress_target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                rustix::process::set_parent_process_death_signal(Some(crate::child::PARENT_DEATH_SIGNAL))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("airlock exited while starting a confined process"));
                }
                Ok(())
            });
        }
    }

    /// After the spawn: what the stage applied, or why it refused. Blocks
    /// until the payload's exec (or the stage's end): a few milliseconds.
    pub fn wait(self) -> anyhow::Result<StageStatus> {
        self.wait_with_listeners().map(|(status, _)| status)
    }

    /// [`Pending::wait`], and for `--allow-host` the proxy listeners PID 1
    /// created in the child's network namespace (`Some` once it confined).
    pub fn wait_with_listeners(mut self) -> anyhow::Result<(StageStatus, Option<egress::Listeners>)> {
        let egress = self.egress.take().map(|(ours, theirs, _)| {
            drop(theirs);
            ours
        });
        let status = self.wait_status()?;
        let listeners = match (&egress, &status) {
            (Some(ours), StageStatus::Applied(_)) => Some(egress::receive(ours)?),
            _ => None,
        };
        Ok((status, listeners))
    }

    fn wait_status(mut self) -> anyhow::Result<StageStatus> {
        drop(self.writer.take());
        let mut text = String::new();
        let mut file = std::fs::File::from(self.reader);
        file.read_to_string(&mut text).context("reading the confinement status")?;
        let mut last = None;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let s: StageStatus = serde_json::from_str(line)
                .with_context(|| format!("the confinement stage's status {line:?}"))?;
            last = Some(s);
        }
        last.context("the confinement stage ended before confining anything")
    }
}

/// `argv[0]` as the payload will exec it, for messages.
pub fn program_name(argv: &[OsString]) -> String {
    argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default()
}
