//! `airlock tool`: host one VFS tool (seed 004). The tool runs in its own
//! process group with a minimal environment; its stdin and stdout carry
//! NDJSON JSON-RPC. Every decision (framing, policy, scrubbing, timers,
//! the outcome) is the core's [`airlock_core::vfs::Host`]; this module
//! feeds it real bytes, exits, signals and clock readings, and performs
//! the effects it asks for: files through cap-std ([`capfs`]), HTTP
//! through hyper and rustls ([`http`]), processes in their own groups
//! ([`process`]).

pub mod capfs;
mod driver;
pub mod http;
pub mod process;
mod record;

use airlock_core::vfs::{self, Config, PolicyConfig, ToolPolicy};
use anyhow::{bail, Context};
use clap::Args;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Flags of `airlock tool`. Durations are seconds, fractions allowed.
#[derive(Debug, Args)]
pub struct ToolArgs {
    /// A read-only root (project-relative). Default: `.` when no root is given.
    #[arg(long, value_name = "PATH")]
    pub allow: Vec<String>,
    /// A read-write root (project-relative).
    #[arg(long = "allow-rw", value_name = "PATH")]
    pub allow_rw: Vec<String>,
    /// Refuse paths matching GLOB (gitignore syntax, relative to the project).
    #[arg(long, value_name = "GLOB")]
    pub deny: Vec<String>,
    /// Let the tool change the protected path PATH (project-relative) and
    /// what lies beneath it: `.git/config`, `.git/hooks`, `.vscode`, … are
    /// never changed otherwise.
    #[arg(long = "allow-protected", value_name = "PATH")]
    pub allow_protected: Vec<String>,
    /// Let the tool read the secret file PATH (project-relative): the
    /// `.env` family, SSH keys and credential files are never served
    /// otherwise.
    #[arg(long = "allow-secret", value_name = "PATH")]
    pub allow_secret: Vec<String>,
    /// A program process.run may start: a bare name (resolved on PATH now) or an absolute path.
    #[arg(long = "allow-cmd", value_name = "PROG")]
    pub allow_cmd: Vec<String>,
    /// A URL prefix http.get and http.post may reach. With --allow-host,
    /// a further narrowing: a URL must pass both.
    #[arg(long = "allow-url", value_name = "PREFIX")]
    pub allow_url: Vec<String>,
    /// `--allow-host`, `--deny-host`, `--resolve`: the hosts http.get and
    /// http.post may reach, as `airlock run`'s child may.
    #[command(flatten)]
    pub hosts: crate::egress::HostArgs,
    /// Write one JSON line per http.* request to FILE (`op: egress`): host,
    /// port, the address connected to, the rule that decided, bytes.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// A variable usable as ${VAR} in HTTP headers and process.run envs; its value is scrubbed.
    #[arg(long = "env-allow", value_name = "VAR")]
    pub env_allow: Vec<String>,
    /// tool.name in init (default: CMD's file name).
    #[arg(long)]
    pub name: Option<String>,
    /// tool.arguments in init: a JSON object.
    #[arg(long, value_name = "JSON")]
    pub args: Option<String>,
    /// Input for the next running/waiting state, in order.
    #[arg(long, value_name = "INPUT")]
    pub apply: Vec<String>,
    /// Seconds of silence (no request pending) before the tool is timed out.
    #[arg(long, value_name = "SECS", value_parser = secs, default_value = "60")]
    pub timeout: Duration,
    /// Seconds an HTTP request or process may take.
    #[arg(long = "op-timeout", value_name = "SECS", value_parser = secs, default_value = "30")]
    pub op_timeout: Duration,
    /// Seconds between cancel and SIGTERM.
    #[arg(long = "cancel-grace", value_name = "SECS", value_parser = secs, default_value = "5")]
    pub cancel_grace: Duration,
    /// Seconds between SIGTERM and SIGKILL (and after a final message).
    #[arg(long = "kill-grace", value_name = "SECS", value_parser = secs, default_value = "5")]
    pub kill_grace: Duration,
    /// Longest line read from the tool, in bytes.
    #[arg(long = "max-line", value_name = "BYTES", default_value_t = airlock_core::codec::jsonrpc::DEFAULT_MAX_LINE)]
    pub max_line: usize,
    /// Most JSON values one line from the tool may hold (a line past it is
    /// refused before it is parsed: parsed values cost far more than text).
    #[arg(long = "max-line-values", value_name = "N", default_value_t = airlock_core::codec::jsonrpc::DEFAULT_MAX_LINE_VALUES)]
    pub max_line_values: usize,
    /// Largest file content, HTTP body or process stream, in bytes.
    #[arg(long = "max-file", value_name = "BYTES", default_value_t = vfs::DEFAULT_MAX_FILE)]
    pub max_file: usize,
    /// Write a trace of the run (no secret in it) to FILE.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Refuse to start when unprivileged namespaces are not available,
    /// instead of confining the tool with seccomp, capabilities and
    /// Landlock alone.
    #[arg(long)]
    pub require_namespaces: bool,
    /// Let the tool and its `process.run` programs also read and execute
    /// PATH directly (a library directory, say).
    #[arg(long = "sandbox-ro", value_name = "PATH")]
    pub sandbox_ro: Vec<PathBuf>,
    /// Let the tool and its `process.run` programs also read and write
    /// PATH directly (a scratch directory).
    #[arg(long = "sandbox-rw", value_name = "PATH")]
    pub sandbox_rw: Vec<PathBuf>,
    #[command(flatten)]
    pub env: crate::envpolicy::EnvArgs,
    /// The tool and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub argv: Vec<OsString>,
}

/// The user's home, as written and resolved: its start-up files are
/// protected wherever a root covers it.
pub(crate) fn homes() -> Vec<PathBuf> {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from) else {
        return Vec::new();
    };
    let real = std::fs::canonicalize(&home).ok();
    let mut out = vec![home];
    out.extend(real);
    out.dedup();
    out
}

fn secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(v).map_err(|_| format!("{s:?} is not a valid number of seconds"))
}

/// Everything the run needs, checked before the tool starts (exit 125).
pub(crate) struct Prepared {
    pub project: PathBuf,
    pub config: Config,
    pub policy: ToolPolicy,
    /// What `policy` was built from, for a trace's header.
    pub policy_config: PolicyConfig,
    pub record: Option<PathBuf>,
    /// `--audit FILE`.
    pub audit: Option<PathBuf>,
    /// What http.* may reach.
    pub net: http::Net,
    /// What the tool and its processes reach directly.
    pub grants: process::Grants,
    /// The tool's environment (the environment policy's).
    pub env: Vec<(OsString, OsString)>,
}

fn prepare(a: &ToolArgs) -> anyhow::Result<Prepared> {
    let project = std::env::current_dir()
        .and_then(std::fs::canonicalize)
        .context("the working directory (the project root)")?;
    let Some(cmd) = a.argv.first() else { bail!("no command given") };
    let name = match &a.name {
        Some(n) => n.clone(),
        None => Path::new(cmd).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    };
    let mut config = Config::new(name);
    if let Some(text) = &a.args {
        config.arguments = Config::parse_arguments(text).map_err(anyhow::Error::msg)?;
    }
    config.applies = a.apply.clone();
    config.timeout = a.timeout;
    config.op_timeout = a.op_timeout;
    config.cancel_grace = a.cancel_grace;
    config.kill_grace = a.kill_grace;
    config.max_line = a.max_line;
    config.max_line_values = a.max_line_values;
    config.max_file = a.max_file;
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let mut allow_cmd = Vec::new();
    for c in &a.allow_cmd {
        allow_cmd.push((c.clone(), resolve_program(c, &path_env)?));
    }
    let policy_config = PolicyConfig {
        project: project.clone(),
        allow: a.allow.clone(),
        allow_rw: a.allow_rw.clone(),
        deny: a.deny.clone(),
        allow_cmd,
        allow_url: a.allow_url.clone(),
        allow_host: a.hosts.allow_host.clone(),
        deny_host: a.hosts.deny_host.clone(),
        env_allow: a.env_allow.iter().map(|v| (v.clone(), take_secret(v))).collect(),
        path_env,
        allow_protected: a.allow_protected.clone(),
        allow_secret: a.allow_secret.clone(),
        homes: homes(),
    };
    let policy = ToolPolicy::new(&policy_config)?;
    let net = http::Net {
        rules: std::sync::Arc::new(policy.net_rules().clone()),
        hosts: std::sync::Arc::new(a.hosts.hosts()?),
    };
    let grants = process::Grants {
        require_namespaces: a.require_namespaces,
        read_only: canonical_all(&a.sandbox_ro, "--sandbox-ro")?,
        read_write: canonical_all(&a.sandbox_rw, "--sandbox-rw")?,
        project: policy
            .gate()
            .roots()
            .into_iter()
            .map(|(p, access)| (p, access == airlock_core::policy::Access::ReadWrite))
            .collect(),
        guard: policy.gate().guard().clone(),
    };
    let env = tool_env(a)?;
    Ok(Prepared {
        env,
        project,
        config,
        policy,
        policy_config,
        record: a.record.clone(),
        audit: a.audit.clone(),
        net,
        grants,
    })
}

/// The tool's environment: the core set (`--env-clear` is the tool's
/// default: it reaches files, URLs and programs only through airlock) and
/// each `--env-pass`; never an `--env-allow` variable, whose value is
/// scrubbed from everything the tool sees, nor airlock's own variables.
fn tool_env(a: &ToolArgs) -> anyhow::Result<Vec<(OsString, OsString)>> {
    if let Some(name) = a.env.env_pass.iter().find(|n| a.env_allow.contains(n)) {
        bail!(
            "--env-pass {name}: {name} is --env-allow'ed, so its value is a secret scrubbed from \
             everything the tool sees; it cannot also be in the tool's environment"
        );
    }
    let withhold =
        a.env_allow.iter().map(OsString::from).chain(crate::child::AIRLOCK_ENV.iter().map(OsString::from));
    let mut policy = a.env.policy(None, withhold)?;
    policy.base = airlock_core::environ::Base::Core;
    Ok(crate::envpolicy::decide(&policy).keep)
}

/// An `--env-allow` value, removed from airlock's own environment (as
/// `airlock run` does its key): a same-user tool reading
/// `/proc/<airlock>/environ` finds nothing. A variable of the core set
/// (`PATH`, `HOME`, …) stays in airlock's, which needs it, but is kept
/// from the tool all the same.
fn take_secret(name: &str) -> Option<String> {
    if process::core_env(name) {
        std::env::var(name).ok()
    } else {
        crate::secrets::take_env(name)
    }
}

fn canonical_all(paths: &[PathBuf], flag: &str) -> anyhow::Result<Vec<PathBuf>> {
    paths
        .iter()
        .map(|p| std::fs::canonicalize(p).with_context(|| format!("{flag} {}", p.display())))
        .collect()
}

/// An `--allow-cmd` as the absolute program it names, found now.
fn resolve_program(prog: &str, path_env: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(prog);
    if p.is_absolute() {
        if !is_executable(p) {
            bail!("--allow-cmd {prog}: not an executable file");
        }
        return Ok(p.to_path_buf());
    }
    if prog.contains('/') || prog.is_empty() {
        bail!("--allow-cmd {prog:?}: give a bare name (found on PATH) or an absolute path");
    }
    std::env::split_paths(path_env)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(prog))
        .find(|c| is_executable(c))
        .with_context(|| format!("--allow-cmd {prog}: not found on PATH"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Run the tool to its outcome; the exit status to leave with. An `Err`
/// means it never started (exit 125, stdout empty).
pub fn tool(a: &ToolArgs) -> anyhow::Result<i32> {
    // Before any secret is read, and before the runtime's threads: the
    // environment changes in `prepare`.
    crate::secrets::not_dumpable()?;
    let prepared = prepare(a)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(driver::run(prepared, &a.argv))
}
