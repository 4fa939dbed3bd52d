//! Process plumbing for `airlock tool`: the tool itself and `process.run`
//! effects, each in a process group of its own so one signal reaches every
//! descendant that stayed in it, and a guard that SIGKILLs the group when
//! its owner goes away (an effect cancelled by the core, a panic, an early
//! return): nothing airlock started outlives it by accident.

use airlock_core::vfs::{OpError, ProcessOutput, ProcessRun};
use rustix::process::{Pid, Signal};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use tokio::io::{AsyncRead, AsyncReadExt};

/// SIGKILLs its process group when dropped.
pub struct GroupGuard {
    pgid: Option<Pid>,
}

impl GroupGuard {
    pub fn new(pid: Option<u32>) -> Self {
        GroupGuard { pgid: pid.and_then(|p| Pid::from_raw(p as i32)) }
    }

    pub fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH once the group is empty: nothing left to signal.
            let _ = rustix::process::kill_process_group(pgid, sig);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
    }
}

/// Whether `name` is in the environment policy's core set (what airlock
/// itself keeps in its own environment, too).
pub fn core_env(name: &str) -> bool {
    airlock_core::environ::CORE_NAMES.contains(&name) || name.starts_with("LC_")
}

/// What `--sandbox-ro`, `--sandbox-rw` and `--require-namespaces` give
/// the tool and its `process.run` programs.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    pub require_namespaces: bool,
    /// Resolved paths, read and executed directly.
    pub read_only: Vec<std::path::PathBuf>,
    /// Resolved paths, read and written directly.
    pub read_write: Vec<std::path::PathBuf>,
    /// The tool policy's roots (absolute, resolved) and whether each is
    /// writable: what a `process.run` program reaches of the project.
    pub project: Vec<(std::path::PathBuf, bool)>,
    /// The tool policy's guard, covering secret files, `--deny`ed paths
    /// and protected paths in every tree reached directly.
    pub guard: airlock_core::guard::Guard,
}

impl Grants {
    fn apply(&self, ruleset: &mut airlock_core::sandbox::Ruleset) {
        for p in &self.read_only {
            ruleset.grant_read_exec(p.clone());
        }
        for p in &self.read_write {
            ruleset.grant_read_write(p.clone());
        }
    }

    /// The project as the tool's policy lets it be reached: its read-only
    /// roots read and executed, its read-write roots read and written;
    /// nothing of it otherwise.
    fn apply_project(&self, ruleset: &mut airlock_core::sandbox::Ruleset) {
        for (p, writable) in &self.project {
            if !p.exists() {
                continue;
            }
            if *writable {
                ruleset.grant_read_write(p.clone());
            } else {
                ruleset.grant_read_exec(p.clone());
            }
        }
    }

    /// The guard over the trees `ruleset` grants directly (see
    /// `crate::guardscan::View`): kept as long as the process runs, and
    /// ended once it and all it started are gone.
    fn view(&self, ruleset: &airlock_core::sandbox::Ruleset) -> anyhow::Result<crate::guardscan::View> {
        use airlock_core::sandbox::Source;
        let trees: Vec<crate::guardscan::Tree> = ruleset
            .paths
            .iter()
            .filter_map(|r| match r.source {
                Source::User => Some(crate::guardscan::Tree { path: r.path.clone(), writable: false }),
                Source::WorkDir => Some(crate::guardscan::Tree { path: r.path.clone(), writable: true }),
                _ => None,
            })
            .collect();
        crate::guardscan::View::make(&self.guard, trees, crate::confine::ns_mode(self.require_namespaces)?)
    }
}

/// Start the tool: own group, the environment `env`, three pipes, and
/// airlock's one confinement (`crate::confine`): the system locations
/// only, an empty read-only working directory (project files come through
/// the JSON-RPC protocol alone), no network, nothing inherited beyond
/// stdio.
pub fn spawn_tool(
    argv: &[std::ffi::OsString],
    grants: &Grants,
    policy: &airlock_core::vfs::ToolPolicy,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> anyhow::Result<(tokio::process::Child, (crate::confine::bounds::Groups, crate::guardscan::View))> {
    use airlock_core::sandbox::StageStatus;
    if argv.is_empty() {
        anyhow::bail!("no command given");
    }
    let abi = crate::confine::landlock::detect_abi();
    let mut ruleset = airlock_core::sandbox::system_ruleset(abi, false)
        .map_err(|e| anyhow::anyhow!("cannot confine the tool: {e}"))?;
    let cwd = std::env::current_dir()?;
    grants.apply(&mut ruleset);
    // The program's interpreter chain, and the tool's own files named on
    // its command line (its script), read and executed directly; nothing
    // else of the project, and never a project file the tool's policy
    // would refuse it (`.env`, a --deny glob, outside every root): naming
    // one grants nothing.
    // Resolved in the environment the tool will have.
    let seen: std::collections::BTreeMap<_, _> = env
        .iter()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| airlock_core::sandbox::program::env_read().any(|r| r == k))
        })
        .cloned()
        .collect();
    let project: Vec<std::path::PathBuf> = std::fs::canonicalize(policy.project()).into_iter().collect();
    let readable = |p: &std::path::Path| readable_by_policy(policy, p);
    let roots =
        airlock_core::sandbox::program::Roots { dirs: &project, readable: &readable, grant_outside: true };
    let started = crate::confine::program::check_command(&mut ruleset, &cwd, argv, &seen, &roots)?;
    for g in &ruleset.granted {
        eprintln!("airlock: tool: granted read-only: {} ({})", g.path.display(), g.reason);
    }
    let argv = &started.argv[..];
    let view = grants.view(&ruleset)?;
    let namespaces = crate::confine::ns_mode(grants.require_namespaces)?;
    let covers = view.covers().to_vec();
    let req = crate::confine::Request { namespaces, covers, ..crate::confine::Request::new(ruleset, cwd) };
    let crate::confine::Started { mut cmd, pending, groups, .. } = crate::confine::start(req, argv)?;
    cmd.process_group(0)
        .env_clear()
        .kill_on_drop(true)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(started.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    pending.install(&mut cmd);
    let mut child = cmd.spawn()?;
    drop(cmd);
    match pending.wait() {
        Ok(StageStatus::Applied(_)) => Ok((child, (groups, view))),
        Ok(StageStatus::Refused { message }) => {
            let _ = child.start_kill();
            anyhow::bail!("{message}")
        }
        Ok(StageStatus::ExecFailed { errno }) => {
            let _ = child.start_kill();
            Err(std::io::Error::from_raw_os_error(errno).into())
        }
        Err(e) => {
            let _ = child.start_kill();
            Err(e)
        }
    }
}

/// Whether the tool's policy lets it read `real` (resolved): a file
/// outside the project is the user's to name; one inside must pass the
/// same check an `fs.read` of it would.
fn readable_by_policy(policy: &airlock_core::vfs::ToolPolicy, real: &std::path::Path) -> bool {
    let Ok(project) = std::fs::canonicalize(policy.project()) else { return false };
    let Ok(rel) = real.strip_prefix(&project) else { return true };
    let Some(text) = rel.to_str() else { return false };
    policy.project_path(text).is_ok_and(|pp| policy.gate().check(&pp, false, false).is_ok())
}

/// Run one `process.run` effect to its end. Dropping the future kills the
/// group (the core cancelled it or its `--op-timeout` passed).
///
/// The process goes through airlock's one confinement: the system
/// locations, its program, the project as the tool's policy lets the tool
/// reach it (read-only roots read-only, read-write roots writable, secret
/// files and `--deny`ed paths masked, protected paths read-only), the
/// network as before, and nothing else of the host; namespaces where
/// available (without them, a project holding anything to cover is
/// refused).
pub async fn run(p: ProcessRun, grants: &Grants) -> Result<ProcessOutput, OpError> {
    use airlock_core::sandbox::StageStatus;
    let starting = |e: &dyn std::fmt::Display| OpError::io(format!("starting {}: {e}", p.program.display()));
    let abi = crate::confine::landlock::detect_abi();
    let mut ruleset = airlock_core::sandbox::system_ruleset(abi, true).map_err(|e| starting(&e))?;
    grants.apply_project(&mut ruleset);
    grants.apply(&mut ruleset);
    // The program itself, unless a granted location (the system's, the
    // project) already holds it: a file bound over one inside a bound
    // directory (or over a symlink there) cannot be mounted.
    if let Ok(real) = std::fs::canonicalize(&p.program) {
        if !ruleset.paths.iter().any(|r| real.starts_with(&r.path)) {
            ruleset.grant_read_exec(real);
        }
    }
    // The placeholders go when this run ends, however it ends.
    let view = grants.view(&ruleset).map_err(|e| starting(&e))?;
    let covers = view.covers().to_vec();
    let namespaces = crate::confine::ns_mode(grants.require_namespaces).map_err(|e| starting(&e))?;
    let argv: Vec<std::ffi::OsString> =
        std::iter::once(p.program.clone().into_os_string()).chain(p.args.iter().map(Into::into)).collect();
    let req = crate::confine::Request {
        namespaces,
        net: true,
        covers,
        ..crate::confine::Request::new(ruleset, p.cwd.clone())
    };
    // The groups are removed when this run ends, however it ends.
    let crate::confine::Started { mut cmd, pending, groups, .. } =
        crate::confine::start(req, &argv).map_err(|e| starting(&e))?;
    cmd.process_group(0)
        .env_clear()
        .kill_on_drop(true)
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&p.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    pending.install(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| starting(&e))?;
    drop(cmd);
    match pending.wait() {
        Ok(StageStatus::Applied(_)) => {}
        Ok(StageStatus::ExecFailed { errno }) => {
            let _ = child.start_kill();
            return Err(starting(&std::io::Error::from_raw_os_error(errno)));
        }
        Ok(StageStatus::Refused { message }) => {
            let _ = child.start_kill();
            return Err(starting(&message));
        }
        Err(e) => {
            let _ = child.start_kill();
            return Err(starting(&e));
        }
    }
    let guard = GroupGuard::new(child.id());
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(OpError::io("the process has no output pipes"));
    };
    let max = p.max_output;
    let waiting = async {
        let status = child.wait().await.map_err(|e| OpError::io(format!("waiting for the process: {e}")))?;
        // Descendants still holding its pipes go with the group, so the
        // streams end now rather than whenever they let go.
        guard.signal(Signal::KILL);
        Ok::<_, OpError>(status)
    };
    // The first error (a stream over the limit) drops the rest, and the
    // guard then kills the group.
    let (status, stdout, stderr) =
        tokio::try_join!(waiting, bounded(out, max, "stdout"), bounded(err, max, "stderr"))?;
    // The group and the cgroups gone, what the run made past every
    // placeholder is renamed aside.
    drop(guard);
    drop(groups);
    view.end(&grants.guard);
    Ok(output(stdout, stderr, status))
}

fn output(stdout: Vec<u8>, stderr: Vec<u8>, status: std::process::ExitStatus) -> ProcessOutput {
    ProcessOutput { stdout, stderr, exit_code: status.code(), signal: status.signal() }
}

/// Read a stream to its end, refusing more than `max` bytes.
async fn bounded<R: AsyncRead + Unpin>(mut r: R, max: usize, what: &str) -> Result<Vec<u8>, OpError> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|e| OpError::io(format!("reading the process's {what}: {e}")))?;
        if n == 0 {
            return Ok(buf);
        }
        if buf.len() + n > max {
            return Err(OpError::too_large(&format!("the process's {what}"), max));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
