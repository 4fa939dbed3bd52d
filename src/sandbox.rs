//! Applies the core's sandbox description (`airlock_core::sandbox`) with
//! Landlock: detects the kernel's ABI, builds the ruleset in airlock (where
//! allocating and opening files is safe), and hands the child a descriptor
//! that it enforces on itself between fork and exec with two system calls.

use airlock_core::policy::{Policy, Root};
use airlock_core::sandbox::{self, FsRight, NetRight, Options, Plan, Ruleset, ScopeKind, Use};
use anyhow::{bail, Context};
use landlock::{
    AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, RulesetAttr, RulesetCreatedAttr,
    Scope,
};
use std::ffi::{OsStr, OsString};
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
    /// Testing only: act as if the kernel's Landlock ABI were at most N
    /// (0 simulates a kernel without Landlock).
    #[arg(long, value_name = "N", hide = true)]
    pub sandbox_abi: Option<u32>,
}

impl SandboxArgs {
    /// The confinement for `plan` (None when unconfined), for a child in
    /// `cwd` with the proxy on fd 3. `require` is the flag or the config
    /// key.
    pub fn confinement(
        &self,
        plan: &Plan,
        cwd: &std::path::Path,
        require: bool,
        session_dir: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<sandbox::Confinement>> {
        let Plan::Confined(ruleset) = plan else { return Ok(None) };
        let mode = crate::confine::ns_mode(require)?;
        let mut ruleset = ruleset.clone();
        if let Some(dir) = session_dir {
            ruleset.grant_session_dir(dir.to_path_buf());
        }
        let view = sandbox::view_for(&ruleset, cwd.to_path_buf());
        Ok(Some(crate::confine::confinement(ruleset, view, mode, self.sandbox_net, 3)))
    }
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
        // Roots as the kernel will see them: through symlinks, where they
        // exist, and as written otherwise.
        let real_roots = Policy::new(
            policy.cwd().to_path_buf(),
            policy.roots().iter().flat_map(|r| {
                let real = std::fs::canonicalize(&r.path).ok();
                [Some(r.clone()), real.map(|path| Root { path, access: r.access })].into_iter().flatten()
            }),
        );
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

/// Before starting a confined child: every file its command line names
/// that it could not use directly is refused here, naming the flag,
/// instead of failing inside (or, for the program, silently running
/// another one further along `PATH`, as `execvp` does past a refusal).
/// The program is found the way `execvp` finds it; an argument counts
/// when it names an existing file. Arguments of airlock itself (`"$AIRLOCK"
/// fs cat data.txt`) are paths for the proxy, not files to read, and are
/// left alone.
pub fn check_command(plan: &Plan, cwd: &Path, argv: &[OsString]) -> anyhow::Result<()> {
    let Plan::Confined(rules) = plan else { return Ok(()) };
    let Some(prog) = argv.first() else { return Ok(()) };
    let Some(found) = find_program(prog, cwd, std::env::var_os("PATH").as_deref()) else {
        return Ok(());
    };
    let real = std::fs::canonicalize(&found).unwrap_or_else(|_| found.clone());
    if !rules.permits(&real, Use::Execute) {
        bail!(
            "the program {} is {}, which the sandboxed child may not run (it would fail, or run \
             another {} found later on PATH); pass --sandbox-ro {} (or a directory holding it and \
             what it runs), or put another first on PATH",
            Path::new(prog).display(),
            found.display(),
            Path::new(prog).display(),
            found.display()
        );
    }
    let airlock = std::env::current_exe().ok().and_then(|p| std::fs::canonicalize(p).ok());
    if airlock.as_deref() == Some(real.as_path()) {
        return Ok(());
    }
    for arg in &argv[1..] {
        if arg.is_empty() {
            continue;
        }
        let path = cwd.join(arg);
        if !std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false) {
            continue;
        }
        let real = std::fs::canonicalize(&path).unwrap_or(path);
        if !rules.permits(&real, Use::Read) {
            bail!(
                "{} is a file the sandboxed child may not read directly ({}); pass --sandbox-ro {} \
                 to let it, or --no-sandbox",
                Path::new(arg).display(),
                real.display(),
                Path::new(arg).display()
            );
        }
    }
    Ok(())
}

/// Where `execvp` would find `prog`: a name with a slash is a path (from
/// `cwd`); otherwise the first regular, executable file of that name along
/// `path` (an empty entry is the working directory).
pub fn find_program(prog: &OsStr, cwd: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        |p: &Path| std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if prog.as_bytes().contains(&b'/') {
        let p = cwd.join(prog);
        return runnable(&p).unwrap_or(false).then_some(p);
    }
    if prog.is_empty() {
        return None;
    }
    let dirs = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    dirs.as_bytes().split(|b| *b == b':').find_map(|dir| {
        let dir = if dir.is_empty() { cwd.to_path_buf() } else { cwd.join(OsStr::from_bytes(dir)) };
        let p = dir.join(prog);
        runnable(&p).unwrap_or(false).then_some(p)
    })
}
