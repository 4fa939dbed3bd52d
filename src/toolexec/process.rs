//! Tools as processes: argv without a shell, their own process group,
//! stdin `/dev/null`, stdout and stderr on one pipe, the environment the
//! environment policy leaves (never the token), confined by airlock's one confinement (`crate::confine`:
//! namespaces where available, seccomp, no capabilities, Landlock with the
//! work dir read-write; nothing inherited beyond stdio) unless
//! `--no-sandbox`. With `--allow-host`, each tool's network namespace
//! holds the egress proxies `airlock run`'s child gets, served for as long
//! as the tool runs by a service of its own (`crate::egress::service`)
//! under the same patterns.

use super::service::{Runner, ToolOutput, ToolProcess};
use airlock_core::sandbox::StageStatus;
use airlock_core::toolexec::{ExitStatus, Signal, SpawnError, SpawnRequest, ToolProgram};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// Starts tools as processes.
pub struct ProcessRunner {
    workdir: PathBuf,
    /// Every tool's environment (the environment policy's).
    env: Vec<(OsString, OsString)>,
    sandbox: Option<Sandbox>,
    describe: String,
    /// Each tool's program as checked at start (its interpreter chain
    /// granted, or why not): what to run and the variables to set, or the
    /// refusal every spawn of it answers.
    programs: std::collections::BTreeMap<String, Result<crate::confine::program::Launch, String>>,
    /// `--allow-host`: every tool's proxies serve this config, each line
    /// to the `--audit` file.
    egress: Option<(airlock_core::egress::Config, Option<crate::audit::AuditWriter>)>,
    /// The proxies' connection numbers, shared by every tool's service
    /// (one audit log).
    conn_ids: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Paths tools may reach beyond the defaults and the working directory
/// (`--sandbox-ro`, `--sandbox-rw`): absolute and resolved through
/// symlinks, as Landlock and the mount view see them.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    pub read_exec: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
}

impl Grants {
    /// Resolve the flags' paths against `cwd`; a path that does not exist
    /// is an error naming its flag.
    pub fn resolve(cwd: &Path, read_exec: &[PathBuf], read_write: &[PathBuf]) -> anyhow::Result<Grants> {
        let resolve = |flag: &str, paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| {
                    std::fs::canonicalize(cwd.join(p))
                        .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", p.display()))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        Ok(Grants {
            read_exec: resolve("--sandbox-ro", read_exec)?,
            read_write: resolve("--sandbox-rw", read_write)?,
        })
    }
}

/// What each tool is confined by.
struct Sandbox {
    ruleset: airlock_core::sandbox::Ruleset,
    mode: airlock_core::sandbox::NsMode,
    net: bool,
}

impl ProcessRunner {
    pub fn new(
        workdir: &Path,
        confine: bool,
        net: bool,
        require_namespaces: bool,
        grants: &Grants,
        tools: &std::collections::BTreeMap<String, ToolProgram>,
    ) -> anyhow::Result<ProcessRunner> {
        if !confine {
            return Ok(ProcessRunner {
                workdir: workdir.to_path_buf(),
                env: Vec::new(),
                sandbox: None,
                describe: "sandbox: none (--no-sandbox): tools run unconfined".to_owned(),
                programs: Default::default(),
                egress: None,
                conn_ids: Default::default(),
            });
        }
        let abi = crate::confine::landlock::detect_abi();
        let mut rules = airlock_core::sandbox::tool_ruleset(abi, workdir, net).map_err(|e| {
            anyhow::anyhow!("cannot confine tools ({e}); pass --no-sandbox to run them unconfined")
        })?;
        for p in &grants.read_exec {
            rules.grant_read_exec(p.clone());
        }
        for p in &grants.read_write {
            rules.grant_read_write(p.clone());
        }
        // Each tool's program, from the working directory, before any
        // client can change a file there: its interpreter chain is granted
        // (a pyenv shim's version, a venv's base), or every spawn of it is
        // refused naming what to grant, instead of letting the tool's
        // `execvp` run another of that name further along PATH.
        let env = crate::confine::program::env_for_check();
        let no_roots =
            airlock_core::sandbox::program::Roots { dirs: &[], readable: &|_| false, grant_outside: false };
        let mut programs = std::collections::BTreeMap::new();
        for (name, program) in tools {
            let argv = [match program {
                ToolProgram::OnPath => OsString::from(name),
                ToolProgram::Fixed(p) => OsString::from_vec(p.clone()),
            }];
            let checked = crate::confine::program::check_command(&mut rules, workdir, &argv, &env, &no_roots)
                .map_err(|e| format!("{name}: {e:#}"));
            programs.insert(name.clone(), checked);
        }
        for g in &rules.granted {
            eprintln!("airlock: toolexec: granted read-only: {} ({})", g.path.display(), g.reason);
        }
        let mode = crate::confine::ns_mode(require_namespaces)?;
        let extra = |label: &str, paths: &[PathBuf]| {
            paths.iter().map(|p| format!(", {} {label}", p.display())).collect::<String>()
        };
        let describe = format!(
            "sandbox: Landlock ABI {abi}: system locations{} read+execute, {}{} read-write, network {}; seccomp, no capabilities, namespaces {}",
            extra("(--sandbox-ro)", &grants.read_exec),
            workdir.display(),
            extra("(--sandbox-rw)", &grants.read_write),
            if net { "allowed (--tool-net)" } else { "denied" },
            match mode {
                airlock_core::sandbox::NsMode::Off => "off",
                airlock_core::sandbox::NsMode::Try => "where available",
                airlock_core::sandbox::NsMode::Require => "required",
            },
        );
        let sandbox = Sandbox { ruleset: rules, mode, net };
        Ok(ProcessRunner {
            workdir: workdir.to_path_buf(),
            env: Vec::new(),
            sandbox: Some(sandbox),
            describe,
            programs,
            egress: None,
            conn_ids: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1)),
        })
    }

    /// `--allow-host`: each tool reaches the network through the egress
    /// proxies alone, as `config` allows; `audit` gets one line per
    /// connection. Refused (naming the flags) when tools run unconfined or
    /// with the whole network.
    pub fn with_egress(
        mut self,
        config: airlock_core::egress::Config,
        audit: Option<crate::audit::AuditWriter>,
    ) -> anyhow::Result<Self> {
        match &self.sandbox {
            None => anyhow::bail!(
                "--allow-host works through each tool's network namespace; with --no-sandbox tools have \
                 the host's whole network and nothing to allow"
            ),
            Some(sb) if sb.net => anyhow::bail!(
                "--allow-host and --tool-net contradict each other: --tool-net gives tools the host's whole network"
            ),
            Some(sb) if sb.mode == airlock_core::sandbox::NsMode::Off => anyhow::bail!(
                "--allow-host needs a network namespace for each tool, and {}=1 switches namespaces off",
                crate::confine::NO_NAMESPACES_ENV
            ),
            Some(_) => {}
        }
        let patterns = config.rules.allow.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ");
        self.describe = self.describe.replace(
            "network denied",
            &format!("network through airlock's proxies (--allow-host {patterns})"),
        );
        self.egress = Some((config, audit));
        Ok(self)
    }

    /// Start every tool with `env` and nothing else of airlock's
    /// environment.
    pub fn with_env(mut self, env: Vec<(OsString, OsString)>) -> Self {
        self.env = env;
        self
    }

    /// For the startup line: which sandbox is in force.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    fn spawn_process(&self, req: &SpawnRequest) -> Result<(Running, OutputPipe), SpawnError> {
        let cwd = PathBuf::from(OsString::from_vec(req.cwd.clone()));
        let real =
            std::fs::canonicalize(&cwd).map_err(|e| SpawnError::BadCwd(format!("{}: {e}", cwd.display())))?;
        if !real.starts_with(&self.workdir) {
            return Err(SpawnError::BadCwd(format!("{} leaves the working directory", cwd.display())));
        }
        if !real.is_dir() {
            return Err(SpawnError::BadCwd(format!("{} is not a directory", cwd.display())));
        }
        let mut program: OsString = match &req.program {
            ToolProgram::OnPath => OsString::from(&req.tool),
            ToolProgram::Fixed(p) => OsString::from_vec(p.clone()),
        };
        let mut extra_env: &[(OsString, OsString)] = &[];
        if self.sandbox.is_some() {
            match self.programs.get(&req.tool) {
                Some(Ok(started)) => {
                    if let Some(p) = started.argv.first() {
                        program = p.clone();
                    }
                    extra_env = &started.env;
                }
                Some(Err(refused)) => return Err(SpawnError::Other(refused.clone())),
                None => {}
            }
        }
        let other = |e: std::io::Error| SpawnError::Other(e.to_string());
        let (rd, wr) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| other(e.into()))?;
        let wr2 = wr.try_clone().map_err(other)?;
        let argv: Vec<OsString> = std::iter::once(program.clone())
            .chain(req.args.iter().map(|a| OsString::from_vec(a.clone())))
            .collect();
        let mut groups = crate::confine::bounds::Groups::default();
        let (mut cmd, pending) = match &self.sandbox {
            Some(sb) => {
                let req = crate::confine::Request {
                    namespaces: sb.mode,
                    net: sb.net,
                    egress: self.egress.is_some(),
                    ..crate::confine::Request::new(sb.ruleset.clone(), real.clone())
                };
                let s = crate::confine::start(req, &argv).map_err(|e| SpawnError::Other(format!("{e:#}")))?;
                groups = s.groups;
                (s.cmd, Some(s.pending))
            }
            None => {
                let mut cmd = tokio::process::Command::new(&program);
                cmd.args(req.args.iter().map(|a| OsStr::from_bytes(a)));
                (cmd, None)
            }
        };
        let proxy_env = if self.egress.is_some() { crate::egress::child_env() } else { Vec::new() };
        cmd.current_dir(&real)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .envs(proxy_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(wr))
            .stderr(Stdio::from(wr2))
            .process_group(0)
            .kill_on_drop(true);
        let parent = rustix::process::getpid();
        let confined = pending.is_some();
        // SAFETY: the closure runs in the forked child before exec and makes
        // only system calls (prctl, getppid, close_range); it allocates
        // nothing.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(crate::confine::PARENT_DEATH_SIGNAL))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::other("airlock exited while starting the tool"));
                }
                // Unconfined tools, too, get nothing airlock inherited (the
                // confinement stage closes the rest itself).
                if !confined {
                    close_above_stdio_on_exec();
                }
                Ok(())
            });
        }
        if let Some(p) = &pending {
            p.install(&mut cmd);
        }
        let spawned = cmd.spawn();
        // The write ends live in `cmd`; ours must go, or EOF never arrives.
        drop(cmd);
        let child = match spawned {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(SpawnError::NotInstalled),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(denied(&program, &real))
            }
            Err(e) => return Err(other(e)),
        };
        let mut child = child;
        let mut listeners = None;
        let status = pending.map(crate::confine::Pending::wait_with_listeners).transpose().map(|s| {
            s.map(|(status, l)| {
                listeners = l;
                status
            })
        });
        match status {
            Ok(None | Some(StageStatus::Applied(_))) => {}
            Ok(Some(StageStatus::ExecFailed { errno })) => {
                let _ = child.start_kill();
                // A program the host has but the view hides is the
                // sandbox's doing, not a missing install.
                let on_host = resolve_on_host(&program, &real).is_some();
                return Err(if errno == libc::ENOENT && !on_host {
                    SpawnError::NotInstalled
                } else {
                    denied(&program, &real)
                });
            }
            Ok(Some(StageStatus::Refused { message })) => {
                let _ = child.start_kill();
                return Err(SpawnError::Other(message));
            }
            Err(e) => {
                let _ = child.start_kill();
                return Err(SpawnError::Other(format!("{e:#}")));
            }
        }
        let proxies = match (&self.egress, listeners) {
            (Some((config, audit)), Some(listeners)) => {
                let started = crate::egress::service::Service::start_numbered(
                    config.clone(),
                    listeners,
                    audit.as_ref().map(|a| a.with("tool", req.tool.clone())),
                    None,
                    self.conn_ids.clone(),
                );
                match started {
                    Ok(s) => Some((s, config.clone())),
                    Err(e) => {
                        let _ = child.start_kill();
                        return Err(SpawnError::Other(format!("the egress proxies: {e:#}")));
                    }
                }
            }
            (Some(_), None) => {
                let _ = child.start_kill();
                return Err(SpawnError::Other(
                    "--allow-host: the confinement handed over no proxy listeners".into(),
                ));
            }
            (None, _) => None,
        };
        let pgid = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
        let pipe = pipe::Receiver::from_owned_fd(rd).map_err(other)?;
        Ok((
            Running { child, pgid, status: None, proxies, _bounds: groups },
            OutputPipe { pipe, buf: Vec::new() },
        ))
    }
}

/// The refusal, naming what to grant: the directory holding the program
/// as the host resolves it (through symlinks, so a rustup proxy names
/// rustup's directory), and for a rustup proxy its toolchains too.
fn denied(program: &OsStr, cwd: &Path) -> SpawnError {
    let name = program.to_string_lossy();
    let Some(real) = resolve_on_host(program, cwd) else {
        return SpawnError::Other(format!(
            "{name}: permission denied (not executable, or outside what the sandbox lets tools execute; \
             grant its directory with --sandbox-ro PATH)"
        ));
    };
    let dir = real.parent().unwrap_or(&real);
    let mut need = format!("--sandbox-ro {}", dir.display());
    if real.file_name().is_some_and(|n| n == "rustup") {
        let home = std::env::var_os("RUSTUP_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".rustup")));
        if let Some(home) = home {
            need.push_str(&format!(" --sandbox-ro {} (the toolchains rustup runs)", home.display()));
        }
    }
    SpawnError::Other(format!(
        "{name}: permission denied: {} is outside what the sandbox lets tools execute; grant it with {need}",
        real.display()
    ))
}

/// Where the host would find `program` (a path, resolved against `cwd`,
/// or a name looked up on PATH), through symlinks; None when nowhere.
fn resolve_on_host(program: &OsStr, cwd: &Path) -> Option<PathBuf> {
    let is_file = |p: &Path| std::fs::canonicalize(p).ok().filter(|r| r.is_file());
    if program.as_bytes().contains(&b'/') {
        return is_file(&cwd.join(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| is_file(&cwd.join(dir).join(program)))
}

/// Mark every descriptor above 2 close-on-exec.
fn close_above_stdio_on_exec() {
    // SAFETY: close_range only changes descriptor flags; no memory is passed.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
}

/// A started tool.
pub struct Running {
    child: tokio::process::Child,
    pgid: Option<rustix::process::Pid>,
    status: Option<ExitStatus>,
    /// `--allow-host`: the tool's proxies, stopped once it is reaped (its
    /// last connections' audit lines written first).
    proxies: Option<(crate::egress::service::Service, airlock_core::egress::Config)>,
    /// The tool's cgroups, removed with it.
    _bounds: crate::confine::bounds::Groups,
}

/// The read end of the tool's stdout+stderr pipe.
pub struct OutputPipe {
    pipe: pipe::Receiver,
    buf: Vec<u8>,
}

impl OutputPipe {
    /// One read of at most `max` bytes; empty at EOF.
    pub async fn read(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        let max = max.max(1);
        self.buf.resize(max, 0);
        let n = self.pipe.read(&mut self.buf[..max]).await?;
        Ok(self.buf[..n].to_vec())
    }

    /// At most `max` bytes the pipe holds now; empty at EOF or when it
    /// holds nothing. A plain read of the non-blocking fd: tokio's
    /// readiness cache may not know yet of bytes that arrived while this
    /// process was not running.
    pub fn read_now(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        let max = max.max(1);
        self.buf.resize(max, 0);
        match rustix::io::read(&self.pipe, &mut self.buf[..max]) {
            Ok(n) => Ok(self.buf[..n].to_vec()),
            Err(rustix::io::Errno::AGAIN) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Running {
    /// Reap the tool.
    pub async fn wait(&mut self) -> ExitStatus {
        let status = match self.child.wait().await {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => ExitStatus::Code(c),
                (None, Some(sig)) => ExitStatus::Signal(sig),
                (None, None) => ExitStatus::Code(1),
            },
            Err(e) => {
                tracing::warn!("toolexec: waiting for the tool: {e}");
                ExitStatus::Code(1)
            }
        };
        self.status = Some(status);
        if let Some((service, config)) = self.proxies.take() {
            // A limit the tool's connections reached is said, as `run`
            // says it (the tool was told: a 429, a cut tunnel).
            let stopped = service.stop().await;
            for m in crate::egress::limit_messages(&config, &stopped) {
                eprintln!("{} (a tool's proxies)", m.replacen("airlock:", "airlock: toolexec:", 1));
            }
        }
        status
    }

    pub fn signal(&self, sig: Signal) {
        let Some(pgid) = self.pgid else { return };
        let s = match sig {
            Signal::Term => rustix::process::Signal::TERM,
            Signal::Kill => rustix::process::Signal::KILL,
        };
        // ESRCH: the group is already empty.
        let _ = rustix::process::kill_process_group(pgid, s);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only when the driver itself is torn down mid-run.
        if self.status.is_none() {
            self.signal(Signal::Kill);
        }
    }
}

impl Runner for ProcessRunner {
    type Process = Running;
    type Output = OutputPipe;

    fn spawn(&self, request: &SpawnRequest) -> Result<(Running, OutputPipe), SpawnError> {
        self.spawn_process(request)
    }
}

impl ToolProcess for Running {
    async fn wait(&mut self) -> ExitStatus {
        Running::wait(self).await
    }

    fn signal(&self, signal: Signal) {
        Running::signal(self, signal)
    }
}

impl ToolOutput for OutputPipe {
    async fn read(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        OutputPipe::read(self, max).await
    }

    fn read_now(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        OutputPipe::read_now(self, max)
    }
}
