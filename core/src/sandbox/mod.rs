//! The child's OS sandbox, as a pure description.
//!
//! `airlock run` confines its child with Landlock between fork and exec.
//! What the ruleset contains — which paths with which rights, which network
//! accesses are handled, which scopes — and what can honestly be reported
//! as in force are decided here, from the policy, the user's options and
//! the kernel's Landlock ABI (detected by the shell and handed in). The
//! shell only opens the paths and makes the system calls.
//!
//! The rule that everything else follows from: the child reads and
//! executes system locations and nothing else directly; it writes only to
//! sinks (`/dev/null`, `/dev/tty`); every `--allow`/`--allow-rw` root is
//! reached through the proxy and never appears in the ruleset. The same
//! description serves a future tool runner, which grants a working
//! directory read-write (see [`Grant::ReadWrite`]).
//!
//! What each Landlock ABI adds, and so what an older kernel leaves open
//! (reported as `not_enforced`, never silently):
//!
//! | ABI | adds | without it |
//! | --- | --- | --- |
//! | 1 | files: execute, read, write, directories, make/remove | refused: `--no-sandbox` only |
//! | 2 | `refer` (rename/link across directories) | always denied, so nothing is lost |
//! | 3 | `truncate` | `truncate(2)` of any file the user owns |
//! | 4 | TCP bind and connect | TCP |
//! | 5 | `ioctl` on devices | device ioctls on newly opened devices |
//! | 6 | scopes: abstract unix sockets, signals | both reach outside the sandbox |
//! | 9 | `resolve_unix` (connect to named unix sockets) | a seccomp filter refuses `socket(AF_UNIX)` instead |
//! | 10 | UDP bind and send | UDP |
//!
//! ABI 7 and 8 add logging and thread-synchronisation flags only. A kernel
//! newer than [`KNOWN_ABI`] is used as [`KNOWN_ABI`]: rights this module
//! does not know are not handled, and are not claimed.

use crate::policy::{normalize, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

pub mod bounds;
mod confine;
mod egress;
pub mod fuse;
mod guarded;
mod namespaces;
pub mod program;
mod report;
mod seccomp;
pub mod sweep;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_program;
#[cfg(test)]
mod tests_seccomp;
#[cfg(test)]
mod tests_session;

pub use confine::*;
pub use egress::*;
pub use guarded::*;
pub use namespaces::*;
pub use report::*;
pub use seccomp::*;

/// The newest Landlock ABI whose rights this module knows.
pub const KNOWN_ABI: u32 = 10;

/// The oldest ABI airlock confines with. Below it (no Landlock at all)
/// `airlock run` refuses to start unless `--no-sandbox` is given.
pub const MIN_ABI: u32 = 1;

/// System locations the child may read and execute: what `sh`, `python3`,
/// coreutils and `git` need to start and run (found by running them under
/// the sandbox; see docs/decisions.md). Entries missing on a host are
/// skipped. `/etc` is not here: only the loader's cache is.
pub const DEFAULT_READ_EXEC: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// Files the child may read but not execute.
pub const DEFAULT_READ: &[&str] = &["/etc/ld.so.cache", "/dev/zero", "/dev/urandom", "/dev/random"];

/// Sinks the child may open for writing (and truncating: `>/dev/null`
/// opens with `O_TRUNC`). No device ioctls, not even on `/dev/tty`:
/// `TIOCSTI` there would type commands into the user's shell. The
/// descriptors the child inherits (0, 1, 2) keep their ioctls: Landlock
/// checks at open.
pub const DEFAULT_SINKS: &[&str] = &["/dev/null", "/dev/tty"];

/// One Landlock filesystem access right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsRight {
    Execute,
    WriteFile,
    ReadFile,
    ReadDir,
    RemoveDir,
    RemoveFile,
    MakeChar,
    MakeDir,
    MakeReg,
    MakeSock,
    MakeFifo,
    MakeBlock,
    MakeSym,
    Refer,
    Truncate,
    IoctlDev,
    ResolveUnix,
}

impl FsRight {
    pub const ALL: [FsRight; 17] = [
        FsRight::Execute,
        FsRight::WriteFile,
        FsRight::ReadFile,
        FsRight::ReadDir,
        FsRight::RemoveDir,
        FsRight::RemoveFile,
        FsRight::MakeChar,
        FsRight::MakeDir,
        FsRight::MakeReg,
        FsRight::MakeSock,
        FsRight::MakeFifo,
        FsRight::MakeBlock,
        FsRight::MakeSym,
        FsRight::Refer,
        FsRight::Truncate,
        FsRight::IoctlDev,
        FsRight::ResolveUnix,
    ];

    /// The ABI that introduced the right.
    pub fn since(self) -> u32 {
        match self {
            FsRight::Refer => 2,
            FsRight::Truncate => 3,
            FsRight::IoctlDev => 5,
            FsRight::ResolveUnix => 9,
            _ => 1,
        }
    }

    /// Whether the right can be granted on a file (the others only mean
    /// something on a directory, for what lies beneath it).
    pub fn on_files(self) -> bool {
        matches!(
            self,
            FsRight::Execute | FsRight::WriteFile | FsRight::ReadFile | FsRight::Truncate | FsRight::IoctlDev
        )
    }

    /// Rights that change the filesystem or a device: the ones a confined
    /// child may hold only on sinks (and a tool runner on its work dir).
    pub fn writes(self) -> bool {
        !matches!(self, FsRight::Execute | FsRight::ReadFile | FsRight::ReadDir)
    }
}

/// One Landlock network access right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetRight {
    BindTcp,
    ConnectTcp,
    BindUdp,
    ConnectSendUdp,
}

impl NetRight {
    pub const ALL: [NetRight; 4] =
        [NetRight::BindTcp, NetRight::ConnectTcp, NetRight::BindUdp, NetRight::ConnectSendUdp];

    pub fn since(self) -> u32 {
        match self {
            NetRight::BindTcp | NetRight::ConnectTcp => 4,
            NetRight::BindUdp | NetRight::ConnectSendUdp => 10,
        }
    }
}

/// What a Landlock domain can be scoped to (ABI 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    AbstractUnixSocket,
    Signal,
}

impl ScopeKind {
    pub const ALL: [ScopeKind; 2] = [ScopeKind::AbstractUnixSocket, ScopeKind::Signal];

    pub fn since(self) -> u32 {
        6
    }
}

/// How much of a path the child gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// Read files, list directories, execute.
    ReadExec,
    /// Read files and list directories.
    Read,
    /// Open for reading and writing, truncate: a device that swallows or a
    /// terminal; never a place where data lands.
    Sink,
    /// Everything, beneath a directory (a tool runner's work dir). `airlock
    /// run` never grants it.
    ReadWrite,
    /// Connect to the unix sockets directly in a directory (the session's
    /// own socket): `resolve_unix` from ABI 9, nothing before it (then a
    /// connect is not a Landlock matter).
    Connect,
}

impl Grant {
    /// The rights this grant stands for, before the ABI and the kind of
    /// file narrow them.
    pub fn rights(self) -> BTreeSet<FsRight> {
        use FsRight::*;
        let list: &[FsRight] = match self {
            Grant::ReadExec => &[Execute, ReadFile, ReadDir],
            Grant::Read => &[ReadFile, ReadDir],
            Grant::Sink => &[ReadFile, WriteFile, Truncate],
            Grant::ReadWrite => &FsRight::ALL,
            Grant::Connect => &[ResolveUnix],
        };
        list.iter().copied().collect()
    }
}

/// Why a path is in the ruleset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The default list: skipped when missing on the host.
    Default,
    /// The airlock binary itself, so the child can run `"$AIRLOCK"`.
    Airlock,
    /// `--sandbox-ro PATH`: must exist.
    User,
    /// A tool runner's working directory: must exist.
    WorkDir,
    /// A private, size-bounded tmpfs of the confinement's own mount view
    /// (`/tmp`, `/dev/shm`): it exists only inside, and vanishes with it.
    Private,
    /// The directory of the session's own socket (`AIRLOCK_SOCKET`), so a
    /// process of the session whose descriptor 3 was closed still reaches
    /// it; the socket asks for the session's secret before anything else.
    Session,
    /// A root served as a filesystem inside the view (`fuse`): the mount
    /// decides per name, so the child may reach all of it.
    Served,
}

impl Source {
    /// Whether a missing path is an error (the user named it) or skipped.
    pub fn required(self) -> bool {
        !matches!(self, Source::Default)
    }
}

/// One `PathBeneath` rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRule {
    pub path: PathBuf,
    pub grant: Grant,
    /// What the rule grants on a directory, already narrowed to the ABI.
    pub rights: BTreeSet<FsRight>,
    pub source: Source,
}

impl PathRule {
    /// The rights to grant once the shell knows whether the path is a
    /// directory: a file takes only file rights.
    pub fn rights_for(&self, is_dir: bool) -> BTreeSet<FsRight> {
        self.rights.iter().copied().filter(|r| is_dir || r.on_files()).collect()
    }
}

/// The user's sandbox options for `airlock run`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `--no-sandbox`: run the child unconfined.
    pub disabled: bool,
    /// `--sandbox-ro PATH`: further read-and-execute locations.
    pub read_only: Vec<PathBuf>,
    /// `--sandbox-rw PATH`: further locations the child reads and writes
    /// directly (a toolchain's cache); never overlapping a root.
    pub read_write: Vec<PathBuf>,
    /// `--sandbox-net`: leave the network unrestricted.
    pub net: bool,
}

/// Everything a ruleset is computed from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    pub policy: &'a Policy,
    pub options: &'a Options,
    /// The kernel's Landlock ABI as detected; 0 when it has none.
    pub abi: u32,
    /// The airlock binary, granted read and execute.
    pub airlock: Option<PathBuf>,
}

/// A complete Landlock ruleset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruleset {
    /// The kernel's ABI, as detected.
    pub kernel_abi: u32,
    /// The ABI the ruleset is written for: the kernel's, capped at
    /// [`KNOWN_ABI`].
    pub abi: u32,
    pub handled_fs: BTreeSet<FsRight>,
    pub handled_net: BTreeSet<NetRight>,
    pub scoped: BTreeSet<ScopeKind>,
    pub paths: Vec<PathRule>,
    /// Before ABI 9 Landlock cannot stop a connect to a named unix socket
    /// (an ssh agent, a container daemon's socket): the child is then
    /// refused `socket(AF_UNIX, …)` (and io_uring, which could make one)
    /// by a seccomp filter instead. `socketpair` stays allowed, so attach
    /// and pipes between the child's own processes still work.
    pub deny_unix_socket_create: bool,
    /// `--sandbox-ro` paths inside an `--allow`/`--allow-rw` root: the
    /// child reads them directly, past the proxy's audit log, so the
    /// report and the audit log list them.
    #[serde(default)]
    pub direct_read: Vec<PathBuf>,
    /// What airlock granted on its own for the program the user named
    /// (its interpreter chain) and the files named as its arguments
    /// inside a root ([`program`]): listed in the report and the audit
    /// log.
    #[serde(default)]
    pub granted: Vec<program::AutoGrant>,
    /// TCP ports the child may connect to while the network is handled:
    /// airlock's proxy listeners in its network namespace (`--allow-host`).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub connect_ports: BTreeSet<u16>,
}

/// Why `airlock run` will not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The kernel has no Landlock.
    NoLandlock { abi: u32 },
    /// A `--sandbox-ro` path is not absolute after resolution.
    BadPath { path: PathBuf },
    /// A `--sandbox-ro` path is an `--allow`/`--allow-rw` root or lies
    /// above one: the child would reach the whole root directly. (A path
    /// strictly inside a root is a direct read, allowed and listed.)
    OverlapsRoot { path: PathBuf, root: PathBuf },
    /// A `--sandbox-rw` path is a root, lies inside one or above one: the
    /// child would write the root's files behind the proxy's back.
    WriteOverlapsRoot { path: PathBuf, root: PathBuf },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoLandlock { abi } => write!(
                f,
                "this kernel has no Landlock (ABI {abi}), so the child cannot be confined; \
                 pass --no-sandbox to run it unconfined"
            ),
            Refusal::BadPath { path } => write!(f, "--sandbox-ro {}: not a usable path", path.display()),
            Refusal::WriteOverlapsRoot { path, root } => write!(
                f,
                "--sandbox-rw {} overlaps the allowed root {}: the child would write the root's files \
                 behind airlock's policy and audit log; grant writes inside a root with --allow-rw",
                path.display(),
                root.display()
            ),
            Refusal::OverlapsRoot { path, root } => write!(
                f,
                "--sandbox-ro {} overlaps the allowed root {}: it would expose the whole root to the \
                 child, which reaches roots only through airlock; name the files inside the root it \
                 must read or run instead",
                path.display(),
                root.display()
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// What `airlock run` does to its child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `--no-sandbox`.
    Unconfined {
        abi: u32,
    },
    Confined(Ruleset),
}

/// `A` lies beneath `b` or is `b` (lexically, both normal and absolute).
fn within(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

/// Collects path rules, narrowed to the ABI, without duplicates.
struct Paths {
    abi: u32,
    rules: Vec<PathRule>,
}

impl Paths {
    fn add(&mut self, path: PathBuf, grant: Grant, source: Source) {
        let abi = self.abi;
        if self.rules.iter().any(|p| p.path == path && p.grant == grant) {
            return;
        }
        let rights = grant.rights().into_iter().filter(|r| r.since() <= abi).collect();
        self.rules.push(PathRule { path, grant, rights, source });
    }

    /// The default list: system locations, the loader's cache, sinks.
    fn defaults(abi: u32) -> Self {
        let mut paths = Paths { abi, rules: Vec::new() };
        for p in DEFAULT_READ_EXEC {
            paths.add(PathBuf::from(p), Grant::ReadExec, Source::Default);
        }
        for p in DEFAULT_READ {
            paths.add(PathBuf::from(p), Grant::Read, Source::Default);
        }
        for p in DEFAULT_SINKS {
            paths.add(PathBuf::from(p), Grant::Sink, Source::Default);
        }
        paths
    }
}

/// The ruleset for `airlock run`'s child, or why there is none.
pub fn plan(inputs: &Inputs<'_>) -> Result<Plan, Refusal> {
    if inputs.options.disabled {
        return Ok(Plan::Unconfined { abi: inputs.abi });
    }
    if inputs.abi < MIN_ABI {
        return Err(Refusal::NoLandlock { abi: inputs.abi });
    }
    let mut paths = Paths::defaults(inputs.abi.min(KNOWN_ABI));
    if let Some(exe) = &inputs.airlock {
        paths.add(exe.clone(), Grant::ReadExec, Source::Airlock);
    }
    let cwd = inputs.policy.cwd();
    let mut direct = Vec::new();
    for raw in &inputs.options.read_only {
        let path = match normalize(&cwd.join(raw)) {
            Some(p) if p.is_absolute() && p.parent().is_some() => p,
            _ => return Err(Refusal::BadPath { path: raw.clone() }),
        };
        if let Some(root) = inputs.policy.roots().iter().find(|r| within(&r.path, &path)) {
            return Err(Refusal::OverlapsRoot { path, root: root.path.clone() });
        }
        if inputs.policy.roots().iter().any(|r| within(&path, &r.path)) && !direct.contains(&path) {
            direct.push(path.clone());
        }
        paths.add(path, Grant::ReadExec, Source::User);
    }
    for raw in &inputs.options.read_write {
        let path = match normalize(&cwd.join(raw)) {
            Some(p) if p.is_absolute() && p.parent().is_some() => p,
            _ => return Err(Refusal::BadPath { path: raw.clone() }),
        };
        // A direct write inside a root would go around the proxy's policy
        // (a read-only root) and its audit log; one above a root, the same.
        if let Some(root) =
            inputs.policy.roots().iter().find(|r| within(&r.path, &path) || within(&path, &r.path))
        {
            return Err(Refusal::WriteOverlapsRoot { path, root: root.path.clone() });
        }
        paths.add(path, Grant::ReadWrite, Source::WorkDir);
    }
    let mut rules = ruleset(inputs.abi, inputs.options.net, paths);
    rules.direct_read = direct;
    Ok(Plan::Confined(rules))
}

/// A ruleset for a tool runner: the defaults, everything beneath
/// `work_dir`, and the network only when `net`.
pub fn tool_ruleset(abi: u32, work_dir: &Path, net: bool) -> Result<Ruleset, Refusal> {
    if abi < MIN_ABI {
        return Err(Refusal::NoLandlock { abi });
    }
    let mut paths = Paths::defaults(abi.min(KNOWN_ABI));
    paths.add(work_dir.to_path_buf(), Grant::ReadWrite, Source::WorkDir);
    Ok(ruleset(abi, net, paths))
}

impl Ruleset {
    /// Grant `path` (absolute, resolved) read and execute, as a
    /// `--sandbox-ro` path: a program's own files named on its command
    /// line.
    pub fn grant_read_exec(&mut self, path: PathBuf) {
        let mut paths = Paths { abi: self.abi, rules: std::mem::take(&mut self.paths) };
        paths.add(path, Grant::ReadExec, Source::User);
        self.paths = paths.rules;
    }

    /// Apply what [`program::check`] decided: each location granted read
    /// and execute, those inside a root listed as direct reads, and every
    /// one recorded for the report.
    pub fn grant_checked(&mut self, checked: &program::Checked) {
        for g in &checked.grants {
            self.grant_read_exec(g.path.clone());
            if g.direct_read && !self.direct_read.contains(&g.path) {
                self.direct_read.push(g.path.clone());
            }
            if !self.granted.contains(g) {
                self.granted.push(g.clone());
            }
        }
    }

    /// Let the child connect to the session's socket in `dir` (it is in
    /// the view at its own path, and on ABI 9+ Landlock lets it resolve).
    pub fn grant_session_dir(&mut self, dir: PathBuf) {
        let mut paths = Paths { abi: self.abi, rules: std::mem::take(&mut self.paths) };
        paths.add(dir, Grant::Connect, Source::Session);
        self.paths = paths.rules;
    }

    /// Grant `path` (absolute, resolved) everything beneath it, as a work
    /// dir (`--sandbox-rw`).
    pub fn grant_read_write(&mut self, path: PathBuf) {
        let mut paths = Paths { abi: self.abi, rules: std::mem::take(&mut self.paths) };
        paths.add(path, Grant::ReadWrite, Source::WorkDir);
        self.paths = paths.rules;
    }
}

/// A ruleset with the defaults alone: a program that reaches project
/// files only through a protocol (the VFS tool) and the network only when
/// `net`.
pub fn system_ruleset(abi: u32, net: bool) -> Result<Ruleset, Refusal> {
    if abi < MIN_ABI {
        return Err(Refusal::NoLandlock { abi });
    }
    Ok(ruleset(abi, net, Paths::defaults(abi.min(KNOWN_ABI))))
}

fn ruleset(kernel_abi: u32, net: bool, paths: Paths) -> Ruleset {
    let abi = paths.abi;
    let handled_fs = FsRight::ALL.into_iter().filter(|r| r.since() <= abi).collect();
    let handled_net =
        if net { BTreeSet::new() } else { NetRight::ALL.into_iter().filter(|r| r.since() <= abi).collect() };
    let scoped = ScopeKind::ALL.into_iter().filter(|s| s.since() <= abi).collect();
    let deny_unix_socket_create = abi < FsRight::ResolveUnix.since();
    Ruleset {
        kernel_abi,
        abi,
        handled_fs,
        handled_net,
        scoped,
        paths: paths.rules,
        deny_unix_socket_create,
        direct_read: Vec::new(),
        granted: Vec::new(),
        connect_ports: BTreeSet::new(),
    }
}

/// What the child would do with a path named on its command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Use {
    /// Run it (the program).
    Execute,
    /// Read it (an argument).
    Read,
}

impl Ruleset {
    /// Whether the child may `use_` the absolute, resolved `path` directly:
    /// some rule covering it (the path itself or a directory above it)
    /// grants the right. Lexical only: the shell resolves symlinks first.
    pub fn permits(&self, path: &Path, use_: Use) -> bool {
        let right = match use_ {
            Use::Execute => FsRight::Execute,
            Use::Read => FsRight::ReadFile,
        };
        self.paths.iter().any(|r| within(path, &r.path) && r.rights.contains(&right))
    }
}
