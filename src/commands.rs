//! The subcommands: `run`, `serve` and `fs`.

use crate::child::{self, exit_code};
use crate::client::Client;
use crate::config::{self, Settings};
use crate::confine::SandboxArgs;
use crate::hostfs::HostFs;
use crate::outfile::OutFile;
use crate::provider::{HttpProvider, Provider};
use crate::record::Recorder;
use crate::report::{ChildExit, Report};
use crate::session::{BrokerShell, Event, Observer, Session};
use crate::session_socket::SessionSocket;
use crate::telemetry::TelemetryWriter;
use airlock_core::codec::frame::DEFAULT_MAX_FRAME;
use airlock_core::fsproxy::wire::{Mode, DEFAULT_MAX_FRAME_VALUES, DEFAULT_MAX_READ};
use airlock_core::fsproxy::{
    Config, FsProxy, StdioRole, DEFAULT_DESCRIPTOR_RESERVE, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_OPEN_HANDLES, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_REQUESTS, DEFAULT_MAX_READ_BATCH,
    DEFAULT_MAX_SESSION_QUEUED_BYTES, DEFAULT_MAX_UPSTREAM_FRAME, DEFAULT_MAX_VIRTUAL_BYTES,
    DEFAULT_MAX_VIRTUAL_FILES,
};
use airlock_core::guard::{DenySet, Grants, Guard};
use airlock_core::handles::ClientId;
use airlock_core::policy::{Access, Policy, Root};
use airlock_core::sandbox::{Applied, InForce, Plan, StageStatus};
use anyhow::Context;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What every serving command shares: the policy, the limits, the report.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Read settings from this TOML file; a `[broker]` section switches on
    /// the LLM broker (LLMCMD, QUOTA, CANCEL).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Let the child read PATH (a directory covers everything beneath it).
    #[arg(long = "allow", value_name = "PATH")]
    pub allow: Vec<PathBuf>,
    /// Let the child read and write PATH.
    #[arg(long = "allow-rw", value_name = "PATH")]
    pub allow_rw: Vec<PathBuf>,
    /// Let the child change the protected path PATH (and what lies
    /// beneath it): `.git/config`, `.git/hooks`, `.vscode`, `.mcp.json`,
    /// shell start-up files, … are never changed otherwise.
    #[arg(long = "allow-protected", value_name = "PATH")]
    pub allow_protected: Vec<PathBuf>,
    /// Let the child read the secret file PATH (and what lies beneath
    /// it): the `.env` family, SSH keys and credential files are never
    /// served otherwise.
    #[arg(long = "allow-secret", value_name = "PATH")]
    pub allow_secret: Vec<PathBuf>,
    /// Keep paths matching GLOB (gitignore syntax, relative to the working
    /// directory) out of the child's reach, as secret files are.
    #[arg(long = "deny", value_name = "GLOB")]
    pub deny: Vec<String>,
    /// Write a JSON report of the session to FILE when airlock exits.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Record the session as a trace (JSONL) that `airlock replay` checks.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Write one JSON line per file operation and policy decision to FILE
    /// (path, mode, allowed or the rule that refused).
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Largest frame accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME)]
    pub max_frame: usize,
    /// Largest `max` a read may ask for, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_READ)]
    pub max_read: u32,
    /// Most JSON values a request frame may hold (counted before it is
    /// parsed: a parsed value costs about 100 bytes).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_FRAME_VALUES)]
    pub max_frame_values: usize,
    /// Bytes one host read may gather for reads of one handle a client
    /// has queued back to back (0: each read on its own).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_READ_BATCH)]
    pub max_read_batch: u32,
    /// Entries one `list` answer holds at most (more come page by page).
    #[arg(long, value_name = "N", default_value_t = airlock_core::pathops::DEFAULT_MAX_LIST_ENTRIES)]
    pub max_list_entries: u32,
    /// Bytes of names one `list` answer holds at most, past its first entry.
    #[arg(long, value_name = "BYTES", default_value_t = airlock_core::pathops::DEFAULT_MAX_LIST_BYTES)]
    pub max_list_bytes: u32,
    /// Handles that may be open at once.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_OPEN_HANDLES)]
    pub max_open_handles: usize,
    /// Requests a client may have waiting behind the one being served.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_QUEUED_REQUESTS)]
    pub max_queued_requests: usize,
    /// Bytes the session's virtual files may hold in all, names included.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_VIRTUAL_BYTES)]
    pub max_virtual_bytes: u64,
    /// Virtual files the session may hold.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_VIRTUAL_FILES)]
    pub max_virtual_files: usize,
    /// Bytes of requests a client may have waiting.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_QUEUED_BYTES)]
    pub max_queued_bytes: u64,
    /// Bytes of requests all clients together may have waiting.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_SESSION_QUEUED_BYTES)]
    pub max_session_queued_bytes: u64,
    /// Clients served at once: the child and every connection attached.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CLIENTS)]
    pub max_clients: usize,
    /// Bytes of partial frames all connections together may hold.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BUFFERED_BYTES)]
    pub max_buffered_bytes: u64,
    /// Largest frame accepted from an upstream airlock (larger ones fail
    /// the one request they answer).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_UPSTREAM_FRAME)]
    pub max_upstream_frame: usize,
    /// Descriptors the session may hold; default: the soft RLIMIT_NOFILE
    /// less those airlock already uses at start.
    #[arg(long, value_name = "N")]
    pub max_descriptors: Option<usize>,
    /// Of those, descriptors connections must leave free for files and
    /// provider calls.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DESCRIPTOR_RESERVE)]
    pub descriptor_reserve: usize,
    /// How long the kernel may keep a served filesystem's lookups and
    /// attributes, in milliseconds: a change made on the host behind the
    /// mount's back shows within this long (0: every lookup and `stat`
    /// asks airlock).
    #[arg(long, value_name = "MS", default_value_t = airlock_core::fuse::DEFAULT_CACHE_MS)]
    pub fuse_cache_ms: u64,
    /// Do not ask the kernel for passthrough on the served filesystems
    /// (its reading opened host files directly; asked for where airlock
    /// may, as root, though no open uses it yet, docs/decisions.md). Opens
    /// are decided and audited either way.
    #[arg(long)]
    pub no_fuse_passthrough: bool,
    #[command(flatten)]
    pub fds: crate::fdcli::FdArgs,
}

/// Descriptors this process may still open: the soft `RLIMIT_NOFILE` less
/// those open now (stdio, the runtime's, inherited ones).
fn descriptors_available() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(1 << 20);
    let open = std::fs::read_dir("/proc/self/fd").map_or(16, Iterator::count);
    usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(open)
}

impl ServeArgs {
    fn policy(&self) -> anyhow::Result<Policy> {
        let cwd = std::env::current_dir().context("reading the working directory")?;
        let roots: Vec<Root> = self
            .allow
            .iter()
            .map(|p| Root { path: physical_root(&cwd, p), access: Access::ReadOnly })
            .chain(
                self.allow_rw
                    .iter()
                    .map(|p| Root { path: physical_root(&cwd, p), access: Access::ReadWrite }),
            )
            .collect();
        let guard = guard(&cwd, &self.allow_protected, &self.allow_secret, &self.deny)?;
        Ok(Policy::new(cwd, roots).with_guard(guard))
    }

    fn config(&self, stdio: StdioRole, upstream: bool) -> anyhow::Result<Config> {
        let mut config = Config::new(self.policy()?, stdio);
        config.upstream = upstream;
        config.max_frame = self.max_frame;
        config.limits.max_read = self.max_read;
        config.limits.max_values = self.max_frame_values;
        config.max_read_batch = self.max_read_batch;
        config.max_list_entries = self.max_list_entries.max(1);
        config.max_list_bytes = self.max_list_bytes;
        config.max_open_handles = self.max_open_handles;
        config.max_queued_requests = self.max_queued_requests;
        config.max_virtual_bytes = self.max_virtual_bytes;
        config.max_virtual_files = self.max_virtual_files;
        config.max_queued_bytes = self.max_queued_bytes;
        config.max_session_queued_bytes = self.max_session_queued_bytes;
        config.max_clients = self.max_clients;
        config.max_buffered_bytes = self.max_buffered_bytes;
        config.max_upstream_frame = self.max_upstream_frame;
        config.max_descriptors = self.max_descriptors.unwrap_or_else(descriptors_available);
        config.descriptor_reserve = self.descriptor_reserve;
        config.isolate_fds = self.fds.isolation(upstream)?;
        config.audit = self.audit.is_some();
        config.fuse.cache_ms = self.fuse_cache_ms;
        config.fuse.passthrough = !self.no_fuse_passthrough;
        Ok(config)
    }
}

/// The session's guard: grants by their physical paths (as roots), the
/// `--deny` globs relative to `cwd`, and the user's home (its start-up
/// files are protected wherever a root grants it).
pub(crate) fn guard(
    cwd: &std::path::Path,
    allow_protected: &[PathBuf],
    allow_secret: &[PathBuf],
    deny: &[String],
) -> anyhow::Result<Guard> {
    let grants = |paths: &[PathBuf]| Grants::new(paths.iter().map(|p| physical_root(cwd, p)));
    let deny = DenySet::new(cwd.to_path_buf(), deny.to_vec()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Guard::new(grants(allow_protected), grants(allow_secret), Some(deny), crate::tool::homes()))
}

/// A root by its physical path: symlinks on the way to it are resolved
/// once, at start-up, so the resolved paths of files beneath it compare
/// with it (see `resolve`); a file root's own name is never followed, so a
/// file root that is a symlink leads nowhere it does not itself allow.
fn physical_root(cwd: &std::path::Path, p: &std::path::Path) -> PathBuf {
    let joined = cwd.join(p);
    let abs = airlock_core::policy::normalize(&joined).unwrap_or(joined);
    if abs.is_dir() {
        return std::fs::canonicalize(&abs).unwrap_or(abs);
    }
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent).map(|c| c.join(name)).unwrap_or(abs),
        _ => abs,
    }
}

/// A root that does not exist is a file root (it covers that one name; no
/// operation creates directories), which a name without an extension may
/// not have meant: say so at start-up, once per such root. One whose
/// directory does not exist either could never be created: it is refused
/// before anything starts, naming its flag.
fn missing_root_notes(
    cwd: &std::path::Path,
    allow: &[PathBuf],
    allow_rw: &[PathBuf],
) -> anyhow::Result<Vec<String>> {
    let flagged = allow.iter().map(|p| ("--allow", p)).chain(allow_rw.iter().map(|p| ("--allow-rw", p)));
    let mut notes = Vec::new();
    for (flag, p) in flagged {
        if std::fs::symlink_metadata(cwd.join(p)).is_ok() {
            continue;
        }
        let joined = cwd.join(p);
        let abs = airlock_core::policy::normalize(&joined).unwrap_or(joined);
        match abs.parent().filter(|_| abs.file_name().is_some()) {
            Some(dir) if dir.is_dir() => {}
            Some(dir) => anyhow::bail!(
                "{flag} {}: does not exist, and its directory {} is not an existing directory \
                 (a root is an existing directory, or a file, existing or to be created, in one)",
                p.display(),
                dir.display()
            ),
            None => anyhow::bail!("{flag} {}: names no directory and no file", p.display()),
        }
        if p.extension().is_none() {
            notes.push(format!(
                "{flag} {}: does not exist; taken as a file root (that one file, created on first write), not a directory",
                p.display()
            ));
        }
    }
    Ok(notes)
}

/// What the config's `[broker]` section sets up on this level.
struct BrokerParts {
    shell: BrokerShell,
}

impl ServeArgs {
    fn settings(&self) -> anyhow::Result<Settings> {
        match &self.config {
            Some(path) => config::load(path),
            None => Ok(Settings::default()),
        }
    }

    /// The machine for `config` with the broker `settings` describe, and
    /// the shell's side of that broker. A level that forwards upstream runs
    /// no broker of its own (the top one serves the whole tree), but still
    /// keeps the key from its children.
    fn machine(
        &self,
        mut config: Config,
        settings: &Settings,
        key: Option<String>,
    ) -> anyhow::Result<(FsProxy, BrokerParts)> {
        let mut parts = BrokerParts { shell: BrokerShell::default() };
        let mut redactor_for_proxy = None;
        config.pager = crate::fdcli::pager_config(settings, &config)?;
        if let Some(b) = &settings.broker {
            config.broker = Some(b.setup.clone());
            if config.upstream {
                tracing::warn!(
                    "this airlock runs under another: its [broker] is ignored, LLMCMD goes upstream"
                );
            } else {
                if let Some(w) = config::api_key_warning(&b.api_key_env, key.as_deref()) {
                    eprintln!("airlock: warning: {w}");
                }
                let key = key.filter(|k| !k.is_empty());
                let redactor = key_redactor(&b.api_key_env, key.as_deref())?;
                let http = HttpProvider::new(&b.base_url, key, redactor.clone())?;
                if let Some(proxy) = http.proxy() {
                    eprintln!(
                        "airlock: note: provider calls go through the proxy {} (CONNECT)",
                        proxy.address()
                    );
                }
                let provider: Arc<dyn Provider> = Arc::new(http);
                redactor_for_proxy = Some(redactor);
                parts.shell.provider = Some(provider);
                if let Some(path) = &b.telemetry {
                    parts.shell.telemetry = Some(TelemetryWriter::open(path, &b.setup.session_id)?);
                }
            }
        }
        let mut proxy = FsProxy::try_new(config).map_err(|e| anyhow::anyhow!("broker: {e}"))?;
        if let Some(r) = redactor_for_proxy {
            proxy.set_redactor(r);
        }
        Ok((proxy, parts))
    }

    /// Load the settings and take the API key out of airlock's environment.
    /// Before the runtime starts: no other thread may read the environment
    /// while it changes.
    fn secrets(&self) -> anyhow::Result<(Settings, Option<String>)> {
        crate::secrets::not_dumpable()?;
        let settings = self.settings()?;
        let key = settings.broker.as_ref().and_then(|b| crate::secrets::take_env(&b.api_key_env));
        Ok((settings, key))
    }

    /// The session a serving command drives, and its report file.
    fn session(
        &self,
        (settings, key): (Settings, Option<String>),
        stdio: StdioRole,
        upstream: Option<BorrowedFd<'_>>,
        command: &str,
    ) -> anyhow::Result<(Session, Option<OutFile>)> {
        let config = self.config(stdio, upstream.is_some())?;
        // A nested level's roots are its upstream's files, which its own
        // (confined) view need not hold: only the top level checks them.
        if upstream.is_none() {
            for note in missing_root_notes(config.policy.cwd(), &self.allow, &self.allow_rw)? {
                eprintln!("airlock: note: {note}");
            }
        }
        let host =
            if upstream.is_some() { HostFs::nested(&config.policy)? } else { HostFs::new(&config.policy)? };
        let (proxy, parts) = self.machine(config, &settings, key)?;
        let observer = self.recorder(proxy.config(), command, upstream)?;
        // Opened now: a nested level reaches files only through its
        // upstream, which is gone by the time the report is written.
        let report = match &self.report {
            Some(path) => Some(
                OutFile::create(path, upstream)
                    .with_context(|| format!("creating report {}", path.display()))?,
            ),
            None => None,
        };
        let mut session = Session::new(proxy, host, observer);
        session.set_broker_shell(parts.shell);
        if let Some(path) = &self.audit {
            let out = OutFile::create(path, upstream)
                .with_context(|| format!("creating audit file {}", path.display()))?;
            session.set_audit(crate::audit::AuditWriter::new(path, out));
        }
        Ok((session, report))
    }

    /// End `session`: flush its trace, write its report.
    async fn close(
        &self,
        session: Session,
        report_file: Option<OutFile>,
        exit: Option<ChildExit>,
        sandbox: Option<(InForce, crate::report::Direct)>,
        env_removed: Option<Vec<airlock_core::environ::RemovedVar>>,
        egress: Option<crate::egress::EgressReport>,
    ) -> anyhow::Result<()> {
        let (proxy, host, observer) = session.shutdown().await;
        if let (Some(mut o), Some(path)) = (observer, &self.record) {
            o.finish().with_context(|| format!("writing trace {}", path.display()))?;
        }
        if let (Some(path), Some(out)) = (&self.report, report_file) {
            let mut report = Report::new(&proxy, host.open_files(), exit);
            if let Some((in_force, direct)) = sandbox {
                report.sandbox = Some(in_force);
                report.direct = direct;
            }
            report.env_removed = env_removed;
            report.egress = egress;
            report.write(path, out)?;
        }
        Ok(())
    }

    fn recorder(
        &self,
        config: &Config,
        command: &str,
        upstream: Option<BorrowedFd<'_>>,
    ) -> anyhow::Result<Option<Box<dyn Observer>>> {
        let Some(path) = &self.record else { return Ok(None) };
        let file =
            OutFile::create(path, upstream).with_context(|| format!("creating trace {}", path.display()))?;
        Ok(Some(Box::new(Recorder::create(file, config, command)?)))
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // One thread: the machine is single-threaded by design and file
    // effects are short; stdin reads have a thread of their own.
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Drive `fut` to its end on a fresh runtime, then leave without waiting
/// for blocking work still in flight (a write to a stdout nobody reads):
/// the session is over, and airlock's exit must not hang on it.
fn block_on<T>(fut: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let rt = runtime()?;
    let out = rt.block_on(fut);
    rt.shutdown_background();
    out
}

const CHILD: ClientId = ClientId(1);

/// `airlock run`: the child's exit status, to exit with.
pub fn run(
    args: &ServeArgs,
    sandbox: &SandboxArgs,
    env: &crate::envpolicy::EnvArgs,
    egress: &crate::egress::EgressArgs,
    argv: &[OsString],
) -> anyhow::Result<i32> {
    crate::heap::keep_freed_memory();
    let secrets = args.secrets()?;
    // After the key is taken out of airlock's environment; withheld all
    // the same, with airlock's own variables, which it sets itself.
    let withhold = secrets
        .0
        .broker
        .iter()
        .map(|b| OsString::from(&b.api_key_env))
        .chain(child::AIRLOCK_ENV.iter().map(OsString::from));
    let env_policy = env.policy(Some(&secrets.0.env), withhold)?;
    let env_decision = crate::envpolicy::decide(&env_policy);
    let egress_config = egress.config(secrets.0.egress.as_ref())?;
    if egress_config.is_some() {
        crate::egress::check_options(sandbox.no_sandbox, sandbox.sandbox_net)?;
    }
    let policy = args.policy()?;
    let mut plan = sandbox.plan(&policy)?;
    let launch = crate::confine::args::check_run_command(&mut plan, &policy, argv)?;
    // What the guard covers in the trees the child reaches directly.
    let trees = crate::confine::args::direct_trees(&plan);
    // Before the view is made, and kept until the session's end is read.
    let require = sandbox.require_namespaces || secrets.0.require_namespaces;
    let mut view = crate::guardscan::View::make(policy.guard(), trees, crate::confine::ns_mode(require)?)?;
    let limits = sandbox.limits(&secrets.0)?;
    block_on(async {
        let upstream = nested_upstream()?;
        let (mut session, report) =
            args.session(secrets, StdioRole::Local, upstream.as_ref().map(|u| u.as_fd()), "run")?;
        if let Some(up) = upstream {
            session.set_upstream(up);
        }
        if let Plan::Confined(rules) = &plan {
            session.audit_sandbox_grants(rules);
        }
        // Lets a process of the session whose descriptor 3 was closed on
        // the way (Python's subprocess does so) reach it still.
        let mut socket = match SessionSocket::create() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!(
                    "airlock: note: no session socket ({e:#}): a process that closes descriptor 3 \
                     cannot reach the session"
                );
                None
            }
        };
        let mut session_env = socket.as_ref().map(SessionSocket::env).unwrap_or_default();
        session_env.extend(launch.env.iter().cloned());
        // The socket alone is in the child's view, read-only.
        let session_path = socket.as_ref().map(|s| s.path().to_path_buf());
        let mut request = sandbox.request(&plan, policy.cwd(), require, session_path.as_deref())?;
        if let Some(r) = request.as_mut() {
            r.limits = Some(limits);
            r.covers = view.covers().to_vec();
        }
        if egress_config.is_some() {
            egress_request(request.as_mut(), &mut session_env)?;
        }
        if let Some(r) = request.as_mut() {
            r.serve = sandbox.serve(&policy, session.proxy().config().upstream);
        }
        let spawned = child::spawn(&launch.argv, &env_decision.keep, request, &session_env)?;
        // The session's cgroups go at the end, however it ends.
        let (confinement, mut groups, not_served) = (spawned.plan, spawned.groups, spawned.not_served);
        if let (Some(socket), Some(fuse)) =
            (spawned.mounts, confinement.as_ref().and_then(|c| c.fuse.as_ref()))
        {
            let roots = fuse.mounts.iter().map(|m| airlock_core::policy::RootId(m.root)).collect();
            let passthrough = crate::confine::fuse::can_passthrough();
            let mounts = crate::session::MountPlan { roots, uid: fuse.uid, gid: fuse.gid, passthrough };
            session.serve_mounts(mounts, socket)?;
        }
        // The stage mounts the roots on its way to the exec, and may look
        // into them (the working directory): they are served meanwhile.
        let (applied, listeners) = {
            let pending = spawned.pending;
            let argv = launch.argv.clone();
            let status = tokio::task::spawn_blocking(move || child::Spawned::confirm(pending, &argv));
            tokio::pin!(status);
            loop {
                tokio::select! {
                    r = &mut status => break r.context("waiting for the confinement stage")??,
                    () = session.run_until(|_| false) => {}
                }
            }
        };
        if let Some(s) = socket.as_mut() {
            session.listen(s)?;
        }
        let dir_roots = policy.roots().iter().any(|r| r.path.is_dir());
        let fuse_plan = confinement.as_ref().and_then(|c| c.fuse.as_ref());
        let bounds_of = |a: &Applied| confinement.as_ref().and_then(|c| c.bounds_in_force(a));
        let mut in_force = match &applied {
            None => plan.in_force(),
            Some(StageStatus::Applied(applied)) => {
                plan.in_force_with(applied, sandbox.sandbox_net).with_bounds(bounds_of(applied))
            }
            Some(StageStatus::ExecFailed { .. }) => plan
                .in_force_with(&Applied::default(), sandbox.sandbox_net)
                .with_bounds(bounds_of(&Applied::default())),
            Some(StageStatus::Refused { message }) => {
                eprintln!("airlock: {message}");
                return Ok(crate::confine::stage::REFUSED_EXIT);
            }
        };
        if confinement.is_some() {
            let stage = match &applied {
                Some(StageStatus::Applied(a)) => a.clone(),
                _ => Applied::default(),
            };
            airlock_core::sandbox::fuse::report(&mut in_force, fuse_plan, &stage, dir_roots, not_served);
            airlock_core::sandbox::report_holds(&mut in_force, view.writable(), &stage);
            if !stage.has(airlock_core::sandbox::Namespace::Mount) {
                view.unmounted();
            }
        }
        let egress_service = match (egress_config, listeners) {
            (Some(config), Some(listeners)) => {
                let trace = args.record.as_deref().map(crate::egress::trace_path);
                let service = crate::egress::service::Service::start(
                    config.clone(),
                    listeners,
                    session.audit_writer(),
                    trace,
                )?;
                Some((config, service))
            }
            (Some(_), None) => anyhow::bail!("--allow-host: the confinement handed over no proxy listeners"),
            (None, _) => None,
        };
        let mut proc = spawned.child;
        let pid = proc.id();
        session.add_unix_client(CHILD, spawned.conn);

        let status: Arc<Mutex<Option<std::process::ExitStatus>>> = Arc::default();
        let events = session.events();
        let st = status.clone();
        tokio::spawn(async move {
            // tokio reaps through SIGCHLD/pidfd: death is observed, not polled.
            let res = proc.wait().await;
            if let Ok(s) = res {
                if let Ok(mut slot) = st.lock() {
                    *slot = Some(s);
                }
            }
            let _ = events.send(Event::Died(CHILD)).await;
        });
        forward_signals(pid);

        // Once the child is gone, so is every session of its tree, including
        // processes that attached connections of their own and outlive it.
        let exited = status.clone();
        let session = session.run_to_end(move |_| exited.lock().map(|g| g.is_some()).unwrap_or(true)).await?;
        let status = status.lock().ok().and_then(|g| *g);
        let code = status.map(exit_code).unwrap_or(1);
        use std::os::unix::process::ExitStatusExt;
        let exit = status.map(|s| ChildExit { code: s.code(), signal: s.signal(), status: code });
        let hit = groups.finish();
        for b in &hit {
            eprintln!("{}", airlock_core::sandbox::bounds::hit_message(*b, &limits));
        }
        if let Some(b) = in_force.bounds.as_mut() {
            b.hit = hit;
        }
        let covered = view.covers().to_vec();
        // Every process of the session is gone: nothing races the renames.
        let ended = view.end(policy.guard());
        let direct = crate::report::Direct {
            covered,
            protected_created: ended.created,
            protected_set_aside: ended.set_aside,
            protected_unchecked: ended.unchecked,
        };
        // Before the audit log closes: the proxies' last lines go there.
        let egress_report = match egress_service {
            Some((config, service)) => {
                let stopped = service.stop().await;
                for m in crate::egress::limit_messages(&config, &stopped) {
                    eprintln!("{m}");
                }
                Some(crate::egress::EgressReport::new(&config, stopped.stats))
            }
            None => None,
        };
        args.close(
            session,
            report,
            exit,
            Some((in_force, direct)),
            Some(env_decision.removed),
            egress_report,
        )
        .await?;
        // The socket and its directory go with the session.
        drop(socket);
        Ok(code)
    })
}

/// `--allow-host`: PID 1 creates the proxies' listeners in the child's
/// network namespace, Landlock lets the child reach them, and the child
/// is told where they are.
fn egress_request(
    request: Option<&mut crate::confine::Request>,
    env: &mut Vec<(OsString, OsString)>,
) -> anyhow::Result<()> {
    let r = request.context("--allow-host works through the sandbox, which is off")?;
    r.egress = true;
    env.extend(crate::egress::child_env());
    Ok(())
}

/// Under another airlock, a connection of this level's own, attached over
/// the inherited descriptor: the narrowing this level sends upstream then
/// applies to its requests alone, never to other processes that share the
/// descriptor (the shell that started it, say, or its siblings).
fn nested_upstream() -> anyhow::Result<Option<tokio::net::UnixStream>> {
    if std::env::var_os(crate::client::FD_ENV).is_none()
        && std::env::var_os(crate::session_socket::SOCKET_ENV).is_none()
    {
        return Ok(None);
    }
    let client = Client::connect().context("attaching to the upstream airlock")?;
    let std = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(client.into_file()));
    std.set_nonblocking(true)?;
    Ok(Some(tokio::net::UnixStream::from_std(std)?))
}

/// Pass termination requests on to the child, so airlock outlives it long
/// enough to clean up. SIGINT is not forwarded: a terminal already sends it
/// to the whole foreground group, child included, and a second copy would
/// defeat a child's own graceful first-interrupt handling.
fn forward_signals(pid: Option<u32>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) else { return };
    for (kind, sig) in [
        (SignalKind::terminate(), rustix::process::Signal::TERM),
        (SignalKind::hangup(), rustix::process::Signal::HUP),
        (SignalKind::interrupt(), rustix::process::Signal::INT),
    ] {
        let Ok(mut stream) = signal(kind) else { continue };
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if sig != rustix::process::Signal::INT {
                    let _ = rustix::process::kill_process(pid, sig);
                }
            }
        });
    }
}

/// `airlock serve --fd N`: the upstream role; returns when the client is gone.
pub fn serve(args: &ServeArgs, fd: RawFd) -> anyhow::Result<i32> {
    crate::heap::keep_freed_memory();
    let secrets = args.secrets()?;
    block_on(async {
        let (mut session, report) = args.session(secrets, StdioRole::Reject, None, "serve")?;
        let stream = child::adopt_socket(fd)?;
        session.add_unix_client(CHILD, stream);
        // The client hitting EOF ends the session, as `run`'s child exiting
        // does: connections it attached go with it, even ones only airlock
        // itself still holds open (both ends of one socketpair).
        let session = session.run_to_end(|s| !s.serves(CHILD)).await?;
        args.close(session, report, None, None, None, None).await?;
        Ok(0)
    })
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum FsCommand {
    /// Copy a file to stdout.
    Cat { path: String },
    /// Replace (or create) a file with stdin.
    Write {
        /// Make the directories on the way first (`mkdir -p` of its
        /// directory).
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// Append stdin to a file (creating it).
    Append {
        /// Make the directories on the way first.
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// List a directory, one name per line (all of it, page by page).
    List {
        /// Each entry as `KIND SIZE NAME`.
        #[arg(short, long)]
        long: bool,
        path: String,
    },
    /// What a path is, as one JSON object: kind, size, mode, mtime_ns.
    Stat {
        /// Look at a symlink itself rather than what it leads to.
        #[arg(long)]
        no_follow: bool,
        path: String,
    },
    /// Make a directory.
    Mkdir {
        /// Make the directories on the way too; one already there is fine.
        #[arg(short, long)]
        parents: bool,
        path: String,
    },
    /// Remove a file, a symlink, or an empty directory.
    Remove { path: String },
    /// Rename (move) FROM to TO, replacing what is at TO.
    Rename {
        /// Fail rather than replace what is at TO.
        #[arg(long)]
        no_replace: bool,
        from: String,
        to: String,
    },
}

/// `airlock fs ...`: the client side, for scripts running under airlock.
pub fn fs(cmd: &FsCommand) -> anyhow::Result<i32> {
    let path = crate::fscli::shown_path(cmd);
    // No proxy is an error of this command like any other (exit 1, as for
    // `airlock llm`), not a failure of airlock to start (125).
    let mut client = match Client::connect() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("airlock fs: {path}: connecting to the airlock proxy: {e}");
            return Ok(1);
        }
    };
    let result = match cmd {
        FsCommand::Cat { path } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let r = client.cat(path, &mut out);
            let flushed = out.flush();
            match (r, flushed) {
                (Ok(_), Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                (r, _) => r.map(|_| ()).map_err(anyhow::Error::from),
            }
        }
        FsCommand::Write { path, parents } | FsCommand::Append { path, parents } => {
            let mode = if matches!(cmd, FsCommand::Write { .. }) { Mode::Write } else { Mode::Append };
            crate::fscli::make_parents(&mut client, path, *parents)
                .and_then(|()| client.copy_in(path, mode, &mut std::io::stdin().lock()).map(|_| ()))
                .map_err(Into::into)
        }
        other => crate::fscli::path_op(&mut client, other),
    };
    match result {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("airlock fs: {path}: {e}");
            Ok(1)
        }
    }
}

/// The redactor that keeps the provider key from children (see
/// `airlock_core::broker::secret`). A key shorter than the redactor's
/// minimum is sent but not scrubbed (scrubbing a few letters everywhere
/// would mangle replies and protect nothing); a key with `"` or `\\`,
/// which no provider issues, is refused rather than guarded badly.
fn key_redactor(var: &str, key: Option<&str>) -> anyhow::Result<airlock_core::broker::Redactor> {
    use airlock_core::broker::{Redactor, SecretError};
    let Some(key) = key else { return Ok(Redactor::new()) };
    match Redactor::with_secret(key) {
        Ok(r) => Ok(r),
        Err(SecretError::TooShort) => {
            tracing::warn!("${var} is too short to be scrubbed from provider replies");
            Ok(Redactor::new())
        }
        Err(e) => anyhow::bail!("${var}: the API key {e}, so it could not be kept from children"),
    }
}
