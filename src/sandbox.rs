//! Applies the core's sandbox description (`airlock_core::sandbox`) with
//! Landlock: detects the kernel's ABI, builds the ruleset in airlock (where
//! allocating and opening files is safe), and hands the child a descriptor
//! that it enforces on itself between fork and exec with two system calls.

use airlock_core::policy::{Policy, Root};
use airlock_core::sandbox::{self, program, FsRight, NetRight, Options, Plan, Ruleset, ScopeKind};
use anyhow::{bail, Context};
use landlock::{
    AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, RulesetAttr, RulesetCreatedAttr,
    Scope,
};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// `airlock run`'s sandbox options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SandboxArgs {
    /// Run the child unconfined: it reaches the host directly, as any
    /// process of yours would.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Let the child also read and execute PATH directly (a toolchain, the
    /// agent's own code). Inside an --allow/--allow-rw root it is a direct
    /// read, listed in the report and the audit log; a root itself, or a
    /// directory holding one, is refused.
    #[arg(long = "sandbox-ro", value_name = "PATH")]
    pub sandbox_ro: Vec<PathBuf>,
    /// Let the child also read and write PATH directly (a toolchain's
    /// cache). It may not overlap an --allow/--allow-rw root.
    #[arg(long = "sandbox-rw", value_name = "PATH")]
    pub sandbox_rw: Vec<PathBuf>,
    /// Let the child use the network (TCP bind and connect).
    #[arg(long)]
    pub sandbox_net: bool,
    /// Refuse to start when the kernel (or a container) refuses
    /// unprivileged namespaces, instead of confining with seccomp,
    /// capabilities and Landlock alone.
    #[arg(long)]
    pub require_namespaces: bool,
    /// At most N processes and threads at once in the session (default
    /// 1024). A fork past it fails.
    #[arg(long, value_name = "N")]
    pub max_processes: Option<u64>,
    /// At most BYTES of memory for the session, swap included (default:
    /// half the host's); K, M, G, T suffixes are powers of 1024. Past it
    /// the kernel kills a process of the session.
    #[arg(long, value_name = "BYTES", value_parser = sandbox::bounds::parse_bytes)]
    pub max_memory: Option<u64>,
    /// At most PERCENT of one CPU for the session (200: two CPUs' worth;
    /// default: every CPU but one).
    #[arg(long, value_name = "PERCENT")]
    pub max_cpu: Option<u32>,
    /// Serve the --allow/--allow-rw roots through the proxy alone, not also
    /// as filesystems inside the child's view (see docs/run.md).
    #[arg(long)]
    pub no_fuse: bool,
    /// Testing only: act as if the kernel's Landlock ABI were at most N
    /// (0 simulates a kernel without Landlock).
    #[arg(long, value_name = "N", hide = true)]
    pub sandbox_abi: Option<u32>,
}

impl SandboxArgs {
    /// The confinement for `plan` (None when unconfined), for a child in
    /// `cwd` with the proxy on fd 3 and the session's socket (when there
    /// is one). `require` is the flag or the config key.
    pub fn confinement(
        &self,
        plan: &Plan,
        cwd: &std::path::Path,
        require: bool,
        session_socket: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<sandbox::Confinement>> {
        let Plan::Confined(ruleset) = plan else { return Ok(None) };
        let mode = crate::confine::ns_mode(require)?;
        let view = sandbox::view_for(ruleset, cwd.to_path_buf());
        let mut c = crate::confine::confinement(ruleset.clone(), view, mode, self.sandbox_net, 3);
        if let Some(socket) = session_socket {
            c.session_socket(socket.to_path_buf(), crate::session_socket::SOCKET_ENV);
        }
        Ok(Some(c))
    }

    /// Ask `confinement` to serve the directory roots of `policy` as
    /// filesystems in the child's view, unless `--no-fuse`, a nested
    /// level (`nested`), or no namespaces; `Err` says why not.
    pub fn serve_roots(
        &self,
        confinement: &mut sandbox::Confinement,
        policy: &Policy,
        nested: bool,
    ) -> Result<(), sandbox::fuse::NotServed> {
        use sandbox::fuse::{FusePlan, NotServed};
        if self.no_fuse {
            return Err(NotServed::Disabled);
        }
        if nested {
            return Err(NotServed::Nested);
        }
        if confinement.namespaces == sandbox::NsMode::Off {
            return Err(NotServed::NoMountNamespace);
        }
        let roots: Vec<(Root, bool)> = policy.roots().iter().map(|r| (r.clone(), r.path.is_dir())).collect();
        let mounts = sandbox::fuse::mounts(&roots, &confinement.view, &confinement.ruleset.direct_read);
        if mounts.is_empty() {
            return Err(NotServed::Failed("no directory root can be mounted at its path".into()));
        }
        let grants = sandbox::fuse::grants(policy.roots(), &mounts);
        confinement.fuse = Some(FusePlan {
            mounts,
            grants,
            socket_fd: confinement.status_fd + 1,
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        });
        Ok(())
    }
}

/// Whether the backing files of a served filesystem can be registered
/// (passthrough): the kernel asks the server for `CAP_SYS_ADMIN` in the
/// initial user namespace, which root has and an ordinary user does not.
pub fn can_passthrough() -> bool {
    rustix::thread::capabilities(None)
        .is_ok_and(|c| c.effective.contains(rustix::thread::CapabilitySet::SYS_ADMIN))
}

impl SandboxArgs {
    /// The session's bounds: the flags, else the config file's keys, else
    /// the defaults for this host.
    pub fn limits(&self, config: &crate::config::Settings) -> anyhow::Result<sandbox::bounds::Limits> {
        let asked = sandbox::bounds::Asked {
            processes: self.max_processes.or(config.max_processes),
            memory: self.max_memory.or(config.max_memory),
            cpu_percent: self.max_cpu.or(config.max_cpu),
        };
        Ok(sandbox::bounds::limits(&asked, &crate::confine::bounds::host())?)
    }
}

/// The trees a confined child reaches directly under `plan`: its
/// `--sandbox-ro` paths read-only, its `--sandbox-rw` paths writable.
pub fn direct_trees(plan: &Plan) -> Vec<crate::guardscan::Tree> {
    let Plan::Confined(rules) = plan else { return Vec::new() };
    rules
        .paths
        .iter()
        .filter_map(|r| match r.source {
            sandbox::Source::User => Some(crate::guardscan::Tree { path: r.path.clone(), writable: false }),
            sandbox::Source::WorkDir => Some(crate::guardscan::Tree { path: r.path.clone(), writable: true }),
            _ => None,
        })
        .collect()
}

/// The kernel's Landlock ABI version; 0 when it has no Landlock (or has it
/// disabled).
pub fn detect_abi() -> u32 {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION
    // the call only reports the version; it touches no memory and opens nothing.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    u32::try_from(v).unwrap_or(0)
}

impl SandboxArgs {
    /// What to do to the child under `policy`: the core decides from the
    /// options and the detected ABI; paths are resolved through symlinks
    /// first, so a `--sandbox-ro` link to a root is caught too.
    pub fn plan(&self, policy: &Policy) -> anyhow::Result<Plan> {
        let detected = detect_abi();
        let abi = self.sandbox_abi.map_or(detected, |n| n.min(detected));
        let resolved = |p: &PathBuf| {
            let full = policy.cwd().join(p);
            std::fs::canonicalize(&full).with_context(|| format!("--sandbox-ro {}", p.display()))
        };
        let read_only = if self.no_sandbox {
            Vec::new()
        } else {
            self.sandbox_ro.iter().map(resolved).collect::<anyhow::Result<Vec<_>>>()?
        };
        let read_write = if self.no_sandbox {
            Vec::new()
        } else {
            let resolved = |p: &PathBuf| {
                std::fs::canonicalize(policy.cwd().join(p))
                    .with_context(|| format!("--sandbox-rw {}", p.display()))
            };
            self.sandbox_rw.iter().map(resolved).collect::<anyhow::Result<Vec<_>>>()?
        };
        let real_roots = real_policy(policy);
        let options = Options { disabled: self.no_sandbox, read_only, read_write, net: self.sandbox_net };
        let airlock = std::env::current_exe().ok().and_then(|p| std::fs::canonicalize(p).ok());
        let inputs = sandbox::Inputs { policy: &real_roots, options: &options, abi, airlock };
        Ok(sandbox::plan(&inputs)?)
    }
}

fn fs_bits(rights: impl IntoIterator<Item = FsRight>) -> BitFlags<AccessFs> {
    rights.into_iter().fold(BitFlags::EMPTY, |acc, r| {
        acc | match r {
            FsRight::Execute => AccessFs::Execute,
            FsRight::WriteFile => AccessFs::WriteFile,
            FsRight::ReadFile => AccessFs::ReadFile,
            FsRight::ReadDir => AccessFs::ReadDir,
            FsRight::RemoveDir => AccessFs::RemoveDir,
            FsRight::RemoveFile => AccessFs::RemoveFile,
            FsRight::MakeChar => AccessFs::MakeChar,
            FsRight::MakeDir => AccessFs::MakeDir,
            FsRight::MakeReg => AccessFs::MakeReg,
            FsRight::MakeSock => AccessFs::MakeSock,
            FsRight::MakeFifo => AccessFs::MakeFifo,
            FsRight::MakeBlock => AccessFs::MakeBlock,
            FsRight::MakeSym => AccessFs::MakeSym,
            FsRight::Refer => AccessFs::Refer,
            FsRight::Truncate => AccessFs::Truncate,
            FsRight::IoctlDev => AccessFs::IoctlDev,
            FsRight::ResolveUnix => AccessFs::ResolveUnix,
        }
    })
}

fn net_bits(rights: impl IntoIterator<Item = NetRight>) -> BitFlags<AccessNet> {
    rights.into_iter().fold(BitFlags::EMPTY, |acc, r| {
        acc | match r {
            NetRight::BindTcp => AccessNet::BindTcp,
            NetRight::ConnectTcp => AccessNet::ConnectTcp,
            NetRight::BindUdp => AccessNet::BindUdp,
            NetRight::ConnectSendUdp => AccessNet::ConnectSendUdp,
        }
    })
}

fn scope_bits(scopes: impl IntoIterator<Item = ScopeKind>) -> BitFlags<Scope> {
    scopes.into_iter().fold(BitFlags::EMPTY, |acc, s| {
        acc | match s {
            ScopeKind::AbstractUnixSocket => Scope::AbstractUnixSocket,
            ScopeKind::Signal => Scope::Signal,
        }
    })
}

/// What the child enforces on itself before exec.
pub struct Prepared {
    /// The Landlock ruleset (close-on-exec).
    pub ruleset: OwnedFd,
    /// The seccomp filter refusing unix sockets, when the ruleset asks.
    pub seccomp: Option<seccompiler::BpfProgram>,
}

/// The filter for [`Ruleset::deny_unix_socket_create`]: `socket(AF_UNIX,
/// …)` (native and x32 numbering) and `io_uring_setup` fail with EACCES;
/// everything else is allowed. A foreign architecture's system calls kill
/// the process (seccompiler's architecture check), so no 32-bit entry
/// point goes around it.
fn unix_socket_filter() -> anyhow::Result<seccompiler::BpfProgram> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    const X32: i64 = 0x4000_0000;
    let af_unix = || -> anyhow::Result<Vec<SeccompRule>> {
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?;
        Ok(vec![SeccompRule::new(vec![cond])?])
    };
    let rules = [
        (libc::SYS_socket, af_unix()?),
        (libc::SYS_socket | X32, af_unix()?),
        (libc::SYS_io_uring_setup, Vec::new()),
        (libc::SYS_io_uring_setup | X32, Vec::new()),
    ]
    .into_iter()
    .collect();
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| anyhow::anyhow!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let filter =
        SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EACCES as u32), arch)?;
    Ok(filter.try_into()?)
}

/// Build `rules` as a Landlock ruleset (and seccomp filter) for [`enforce`]
/// in the child. Every right is a hard requirement: the core asked only
/// for what the ABI has, so anything the kernel refuses is an error, never
/// a silent downgrade.
pub fn prepare(rules: &Ruleset) -> anyhow::Result<Prepared> {
    let seccomp = if rules.deny_unix_socket_create { Some(unix_socket_filter()?) } else { None };
    Ok(Prepared { ruleset: landlock_ruleset(rules)?, seccomp })
}

pub fn landlock_ruleset(rules: &Ruleset) -> anyhow::Result<OwnedFd> {
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(fs_bits(rules.handled_fs.iter().copied()))?;
    if !rules.handled_net.is_empty() {
        ruleset = ruleset.handle_access(net_bits(rules.handled_net.iter().copied()))?;
    }
    if !rules.scoped.is_empty() {
        ruleset = ruleset.scope(scope_bits(rules.scoped.iter().copied()))?;
    }
    let mut created = ruleset.create().context("creating the Landlock ruleset")?;
    for rule in &rules.paths {
        // A grant whose rights this ABI does not have (a connect before
        // ABI 9) is no rule at all: Landlock refuses an empty one.
        if rule.rights.is_empty() {
            continue;
        }
        let fd = match rustix::fs::open(
            &rule.path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if !rule.source.required() => continue,
            Err(e) => bail!("sandbox: {}: {e}", rule.path.display()),
        };
        let stat = rustix::fs::fstat(&fd)?;
        let is_dir = rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory;
        let rights = rule.rights_for(is_dir);
        created = created
            .add_rule(PathBeneath::new(fd, fs_bits(rights)))
            .with_context(|| format!("sandbox rule for {}", rule.path.display()))?;
    }
    for port in &rules.connect_ports {
        created = created
            .add_rule(landlock::NetPort::new(*port, AccessNet::ConnectTcp))
            .with_context(|| format!("sandbox rule for TCP port {port}"))?;
    }
    let fd: Option<OwnedFd> = created.into();
    fd.context("the kernel gave no Landlock ruleset")
}

/// In the forked child, before exec: no new privileges (required to
/// restrict oneself unprivileged), the seccomp filter if any, then the
/// ruleset. System calls only, nothing allocated: safe between fork and
/// exec.
pub fn enforce(ruleset: RawFd, seccomp: Option<&seccompiler::BpfProgram>) -> std::io::Result<()> {
    rustix::thread::set_no_new_privs(true)?;
    if let Some(filter) = seccomp {
        // A prctl and a seccomp call on the prepared program; an error
        // carries only the errno, so nothing is allocated.
        if seccompiler::apply_filter(filter).is_err() {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: landlock_restrict_self takes a descriptor and flags, and
    // reads no memory of ours; `ruleset` is the child's inherited copy of
    // the descriptor `prepare` returned, which the parent keeps open until
    // the spawn returns.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a confined child is started with once its command line is
/// checked ([`check_command`]).
#[derive(Debug, Clone, Default)]
pub struct Started {
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
) -> anyhow::Result<Started> {
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
    Ok(Started { argv, env: checked.env })
}

/// [`check_command`] for `airlock run`: the roots are the policy's,
/// resolved, and a path inside one is readable when the policy lets the
/// child read it.
pub fn check_run_command(plan: &mut Plan, policy: &Policy, argv: &[OsString]) -> anyhow::Result<Started> {
    let Plan::Confined(rules) = plan else { return Ok(Started { argv: argv.to_vec(), env: Vec::new() }) };
    let real = real_policy(policy);
    let dirs: Vec<PathBuf> = real.roots().iter().map(|r| r.path.clone()).collect();
    let readable = |p: &Path| p.to_str().is_some_and(|s| real.resolve(s, false).is_ok());
    let roots = program::Roots { dirs: &dirs, readable: &readable, grant_outside: false };
    check_command(rules, policy.cwd(), argv, &env_for_check(), &roots)
}

/// Roots as the kernel will see them: through symlinks, where they exist,
/// and as written otherwise.
fn real_policy(policy: &Policy) -> Policy {
    Policy::new(
        policy.cwd().to_path_buf(),
        policy.roots().iter().flat_map(|r| {
            let real = std::fs::canonicalize(&r.path).ok();
            [Some(r.clone()), real.map(|path| Root { path, access: r.access })].into_iter().flatten()
        }),
    )
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
