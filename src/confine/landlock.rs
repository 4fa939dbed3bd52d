//! Landlock: the kernel's ABI, detected for the planners (the core narrows
//! every ruleset to it), and the core's ruleset
//! (`airlock_core::sandbox::Ruleset`) built as a Landlock ruleset by the
//! confinement stage ([`super::stage`]), each path opened `O_PATH` (a
//! missing default skipped, a missing grant an error) with the rights the
//! core narrowed to the ABI and to the kind of file, and each TCP port the
//! payload may connect to (`--allow-host`'s proxies).

use airlock_core::sandbox::{FsRight, NetRight, Ruleset, ScopeKind};
use anyhow::{bail, Context};
use landlock::{
    AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, RulesetAttr, RulesetCreatedAttr,
    Scope,
};
use std::os::fd::OwnedFd;

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

/// Build `rules` as a Landlock ruleset, to enforce with
/// `landlock_restrict_self`. Every right is a hard requirement: the core
/// asked only for what the ABI has, so anything the kernel refuses is an
/// error, never a silent downgrade.
pub fn ruleset(rules: &Ruleset) -> anyhow::Result<OwnedFd> {
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
