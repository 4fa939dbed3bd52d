//! Confinement, in one place: every process airlock starts (`run`'s
//! child, `tool`'s tool and its `process.run` programs, `toolexec
//! serve`'s tools) is confined through here alone. The description is the
//! core's (`airlock_core::sandbox`): namespaces and a minimal mount view,
//! seccomp, capabilities dropped and `no_new_privs`, Landlock, the
//! descriptors that cross, the session's socket, its bounds, the served
//! filesystems and the egress proxies' listeners.
//!
//! The one entry is [`start`]: a spawner hands it a [`Request`] and the
//! payload's argv and gets back a `Command` that runs airlock's own
//! binary as the hidden confinement stage ([`stage`]), which applies the
//! description and execs the payload. The spawner sets the environment,
//! stdio, working directory and process group it wants, adds its own
//! `pre_exec` steps, calls [`Pending::install`] last, spawns, and reads
//! what the stage applied (or why it refused) with [`Pending::wait`]
//! before anything else. The session's cgroups ([`Started::groups`]) are
//! removed when dropped.
//!
//! - [`args`]: `airlock run`'s sandbox flags, the plan the core makes of
//!   them, and the request for its child;
//! - [`program`]: the check of a command line (its interpreter chain)
//!   before it starts;
//! - [`landlock`]: the kernel's ABI and the ruleset built from the core's;
//! - [`filter`]: the core's seccomp rules compiled to BPF;
//! - [`stage`]: `airlock __confine`, which applies all of it and execs;
//! - [`fuse`]: the served filesystems' mounts, made by the stage;
//! - [`egress`]: the proxy listeners made in the child's network namespace;
//! - [`bounds`]: the session's cgroups and the host's size;
//! - [`sweep`]: what dead sessions left, found and removed.

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

use airlock_core::policy::Root;
use airlock_core::sandbox::bounds::Limits;
use airlock_core::sandbox::fuse::NotServed;
use airlock_core::sandbox::{Confinement, Cover, NsMode, Ruleset, StageStatus};
use anyhow::{bail, Context};
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// `AIRLOCK_NO_NAMESPACES=1`: never use namespaces (layers 2-4 only).
pub const NO_NAMESPACES_ENV: &str = "AIRLOCK_NO_NAMESPACES";

/// The signal a confined process (and any child airlock starts) gets when
/// airlock dies: SIGKILL, since nobody is left to supervise it and a
/// hostile child could ignore anything milder.
pub const PARENT_DEATH_SIGNAL: rustix::process::Signal = rustix::process::Signal::KILL;

/// The namespace mode for `--require-namespaces` and the environment.
pub fn ns_mode(require: bool) -> anyhow::Result<NsMode> {
    let off = std::env::var_os(NO_NAMESPACES_ENV).is_some_and(|v| v != "0" && !v.is_empty());
    NsMode::from_flags(require, off).map_err(anyhow::Error::msg)
}

/// What a spawner asks for.
#[derive(Clone, Debug)]
pub struct Request {
    /// The Landlock rules: the core's (`run`'s plan, `tool_ruleset`,
    /// `system_ruleset`) with the spawner's grants and the command check's.
    pub ruleset: Ruleset,
    /// The payload's working directory, in the view as on the host.
    pub cwd: PathBuf,
    /// The namespaces ([`ns_mode`]).
    pub namespaces: NsMode,
    /// The network is allowed: no network namespace, no socket refused.
    pub net: bool,
    /// Descriptors 0 to `keep_fds` cross the exec (3 for `run`'s proxy).
    pub keep_fds: u32,
    /// The session's socket on the host, for `run`'s child.
    pub session_socket: Option<PathBuf>,
    /// The session's bounds; `None`: the defaults for this host (none
    /// when they cannot be known).
    pub limits: Option<Limits>,
    /// The guard's covers over the trees the payload reaches directly.
    pub covers: Vec<Cover>,
    /// `--allow-host`: the payload reaches the network through the egress
    /// proxies alone, whose listeners the stage makes in its namespace.
    pub egress: bool,
    /// The roots to serve as filesystems inside the view.
    pub serve: Serve,
}

impl Request {
    /// `ruleset` for a payload in `cwd`: namespaces where available, no
    /// network, stdio alone across the exec, the host's default bounds,
    /// nothing else.
    pub fn new(ruleset: Ruleset, cwd: PathBuf) -> Request {
        Request {
            ruleset,
            cwd,
            namespaces: NsMode::Try,
            net: false,
            keep_fds: 2,
            session_socket: None,
            limits: None,
            covers: Vec::new(),
            egress: false,
            serve: Serve::Nothing,
        }
    }
}

/// The roots served as filesystems in the payload's view (`run` alone).
#[derive(Clone, Debug)]
pub enum Serve {
    /// Nothing to serve (`tool`, `toolexec`).
    Nothing,
    /// Served through the proxy alone, and why (`--no-fuse`, a nested
    /// level).
    Refused(NotServed),
    /// These roots (the policy's), each mounted where the view can hold it.
    Roots(Vec<Root>),
}

/// A confinement ready to spawn.
pub struct Started {
    /// Runs the stage, which execs the payload.
    pub cmd: tokio::process::Command,
    /// What the stage applied, once spawned.
    pub pending: Pending,
    /// The description the stage applies (for the report).
    pub plan: Confinement,
    /// The session's cgroups, removed when dropped: keep them as long as
    /// the payload runs.
    pub groups: bounds::Groups,
    /// Why the roots asked for ([`Serve`]) are not served as filesystems.
    pub not_served: Option<NotServed>,
}

/// The one entry: `argv` confined as `req` asks.
pub fn start(req: Request, argv: &[OsString]) -> anyhow::Result<Started> {
    let view = airlock_core::sandbox::view_for(&req.ruleset, req.cwd);
    let mut plan = Confinement {
        namespaces: req.namespaces,
        net: req.net,
        ruleset: req.ruleset,
        view,
        keep_fds: req.keep_fds,
        status_fd: req.keep_fds as i32 + 1,
        session: None,
        bounds: None,
        fuse: None,
        egress: None,
    };
    if let Some(socket) = req.session_socket {
        plan.session_socket(socket, crate::session_socket::SOCKET_ENV);
    }
    let groups = match req.limits {
        Some(limits) => {
            let (b, groups) = bounds::session(limits);
            plan.bounds = Some(b);
            groups
        }
        None => bounds::bound(&mut plan),
    };
    plan.view.covers = req.covers;
    if req.egress {
        let listen = crate::egress::listen_for(&plan);
        plan.with_egress(listen);
    }
    let not_served = match req.serve {
        Serve::Nothing => None,
        Serve::Refused(why) => Some(why),
        Serve::Roots(roots) => fuse::serve(&mut plan, &roots).err(),
    };
    let (cmd, pending) = command(&plan, argv)?;
    Ok(Started { cmd, pending, plan, groups, not_served })
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
    /// The served filesystems: the channel their mounts come back on
    /// (airlock's end, the stage's end and its number there).
    mounts: Option<(Option<OwnedFd>, Option<OwnedFd>, RawFd)>,
}

/// The status pipe's write end sits above this in airlock, so no caller's
/// descriptor placement (fd 3 for `run`) lands on it.
const STATUS_FD_FLOOR: RawFd = 10;

/// A `Command` that runs `argv` confined by `plan`.
fn command(plan: &Confinement, argv: &[OsString]) -> anyhow::Result<(tokio::process::Command, Pending)> {
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
    let mounts = match &plan.fuse {
        Some(fuse) => {
            let (ours, theirs) = fuse::channel().context("the served filesystem's socket")?;
            Some((Some(ours), Some(theirs), fuse.socket_fd))
        }
        None => None,
    };
    Ok((cmd, Pending { reader, writer: Some(writer), target: plan.status_fd, egress, mounts }))
}

impl Pending {
    /// Place the served filesystems' socket, the status pipe and the egress
    /// listeners' channel where the stage expects them and ask for SIGKILL
    /// when airlock dies. The last `pre_exec` step: one added after it
    /// could close or replace them.
    pub fn install(&self, cmd: &mut tokio::process::Command) {
        let Some(writer) = &self.writer else { return };
        if let Some((_, Some(theirs), at)) = &self.mounts {
            fuse::install(cmd, theirs, *at);
        }
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
                rustix::process::set_parent_process_death_signal(Some(PARENT_DEATH_SIGNAL))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("airlock exited while starting a confined process"));
                }
                Ok(())
            });
        }
    }

    /// After the spawn: airlock's end of the socket the stage sends the
    /// served filesystems' mounts over (when it serves any). The stage's
    /// end goes here, so airlock's sees the end when the stage's does.
    pub fn mounts(&mut self) -> Option<OwnedFd> {
        let (ours, theirs, _) = self.mounts.as_mut()?;
        drop(theirs.take());
        ours.take()
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
