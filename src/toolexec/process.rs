//! Tools as processes: argv without a shell, their own process group,
//! stdin `/dev/null`, stdout and stderr on one pipe, the environment minus
//! the token, confined by airlock's one confinement (`crate::confine`:
//! namespaces where available, seccomp, no capabilities, Landlock with the
//! work dir read-write; nothing inherited beyond stdio) unless
//! `--no-sandbox`.

use super::serve::TOKEN_ENV;
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
    sandbox: Option<Sandbox>,
    describe: String,
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
    ) -> anyhow::Result<ProcessRunner> {
        if !confine {
            return Ok(ProcessRunner {
                workdir: workdir.to_path_buf(),
                sandbox: None,
                describe: "sandbox: none (--no-sandbox): tools run unconfined".to_owned(),
            });
        }
        let abi = crate::sandbox::detect_abi();
        let rules = airlock_core::sandbox::tool_ruleset(abi, workdir, net).map_err(|e| {
            anyhow::anyhow!("cannot confine tools ({e}); pass --no-sandbox to run them unconfined")
        })?;
        let mode = crate::confine::ns_mode(require_namespaces)?;
        let describe = format!(
            "sandbox: namespaces {}, seccomp, no capabilities, Landlock ABI {abi}: system locations read+execute, {} read-write, network {}",
            match mode {
                airlock_core::sandbox::NsMode::Off => "off",
                airlock_core::sandbox::NsMode::Try => "where available",
                airlock_core::sandbox::NsMode::Require => "required",
            },
            workdir.display(),
            if net { "allowed (--tool-net)" } else { "denied" }
        );
        let sandbox = Sandbox { ruleset: rules, mode, net };
        Ok(ProcessRunner { workdir: workdir.to_path_buf(), sandbox: Some(sandbox), describe })
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
        let program: OsString = match &req.program {
            ToolProgram::OnPath => OsString::from(&req.tool),
            ToolProgram::Fixed(p) => OsString::from_vec(p.clone()),
        };
        let other = |e: std::io::Error| SpawnError::Other(e.to_string());
        let (rd, wr) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| other(e.into()))?;
        let wr2 = wr.try_clone().map_err(other)?;
        let argv: Vec<OsString> = std::iter::once(program.clone())
            .chain(req.args.iter().map(|a| OsString::from_vec(a.clone())))
            .collect();
        let (mut cmd, pending) = match &self.sandbox {
            Some(sb) => {
                let view = airlock_core::sandbox::view_for(&sb.ruleset, real.clone());
                let plan = crate::confine::confinement(sb.ruleset.clone(), view, sb.mode, sb.net, 2);
                let (cmd, pending) =
                    crate::confine::command(&plan, &argv).map_err(|e| SpawnError::Other(format!("{e:#}")))?;
                (cmd, Some(pending))
            }
            None => {
                let mut cmd = tokio::process::Command::new(&program);
                cmd.args(req.args.iter().map(|a| OsStr::from_bytes(a)));
                (cmd, None)
            }
        };
        cmd.current_dir(&real)
            .env_remove(TOKEN_ENV)
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
                rustix::process::set_parent_process_death_signal(Some(crate::child::PARENT_DEATH_SIGNAL))?;
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
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Err(denied(&program)),
            Err(e) => return Err(other(e)),
        };
        let mut child = child;
        match pending.map(crate::confine::Pending::wait).transpose() {
            Ok(None | Some(StageStatus::Applied(_))) => {}
            Ok(Some(StageStatus::ExecFailed { errno })) => {
                let _ = child.start_kill();
                return Err(if errno == libc::ENOENT { SpawnError::NotInstalled } else { denied(&program) });
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
        let pgid = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
        let pipe = pipe::Receiver::from_owned_fd(rd).map_err(other)?;
        Ok((Running { child, pgid, status: None }, OutputPipe { pipe, buf: Vec::new() }))
    }
}

fn denied(program: &OsStr) -> SpawnError {
    SpawnError::Other(format!(
        "{}: permission denied (not executable, or outside what the sandbox lets tools execute)",
        program.to_string_lossy()
    ))
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
