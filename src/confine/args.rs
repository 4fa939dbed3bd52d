//! `airlock run`'s sandbox: its flags (`--no-sandbox`, `--sandbox-ro`,
//! `--sandbox-rw`, `--sandbox-net`, the session's bounds, `--no-fuse`),
//! the plan the core makes of them and the policy (`airlock_core::sandbox`),
//! the check of its command line against that plan, and the confinement
//! it asks [`super::start`] for.

use super::{Request, Serve};
use airlock_core::policy::{Policy, Root};
use airlock_core::sandbox::fuse::NotServed;
use airlock_core::sandbox::{self, program, Options, Plan};
use anyhow::Context;
use std::ffi::OsString;
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
    /// The confinement `run` asks for its child under `plan` (None when
    /// unconfined): in `cwd`, with the proxy on fd 3 and the session's
    /// socket (when there is one). `require` is the flag or the config
    /// key. The caller adds the session's bounds, the guard's covers,
    /// `--allow-host` and the roots to serve ([`SandboxArgs::serve`]).
    pub fn request(
        &self,
        plan: &Plan,
        cwd: &Path,
        require: bool,
        session_socket: Option<&Path>,
    ) -> anyhow::Result<Option<Request>> {
        let Plan::Confined(ruleset) = plan else { return Ok(None) };
        Ok(Some(Request {
            namespaces: super::ns_mode(require)?,
            net: self.sandbox_net,
            keep_fds: 3,
            session_socket: session_socket.map(Path::to_path_buf),
            ..Request::new(ruleset.clone(), cwd.to_path_buf())
        }))
    }

    /// The directory roots of `policy` to serve as filesystems in the
    /// child's view, unless `--no-fuse` or a nested level (`nested`);
    /// [`super::start`] refuses them too without a mount namespace.
    pub fn serve(&self, policy: &Policy, nested: bool) -> Serve {
        if self.no_fuse {
            return Serve::Refused(NotServed::Disabled);
        }
        if nested {
            return Serve::Refused(NotServed::Nested);
        }
        Serve::Roots(policy.roots().to_vec())
    }
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

impl SandboxArgs {
    /// What to do to the child under `policy`: the core decides from the
    /// options and the detected ABI; paths are resolved through symlinks
    /// first, so a `--sandbox-ro` link to a root is caught too.
    pub fn plan(&self, policy: &Policy) -> anyhow::Result<Plan> {
        let detected = super::landlock::detect_abi();
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

/// [`super::program::check_command`] for `airlock run`: the roots are the policy's,
/// resolved, and a path inside one is readable when the policy lets the
/// child read it.
pub fn check_run_command(
    plan: &mut Plan,
    policy: &Policy,
    argv: &[OsString],
) -> anyhow::Result<super::program::Launch> {
    let Plan::Confined(rules) = plan else {
        return Ok(super::program::Launch { argv: argv.to_vec(), env: Vec::new() });
    };
    let real = real_policy(policy);
    let dirs: Vec<PathBuf> = real.roots().iter().map(|r| r.path.clone()).collect();
    let readable = |p: &Path| p.to_str().is_some_and(|s| real.resolve(s, false).is_ok());
    let roots = program::Roots { dirs: &dirs, readable: &readable, grant_outside: false };
    super::program::check_command(rules, policy.cwd(), argv, &super::program::env_for_check(), &roots)
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
