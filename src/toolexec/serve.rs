//! `airlock toolexec serve`: options, token, listeners, the connection
//! cap and signals around [`Service`].
//!
//! The runtime is single-threaded on purpose: the parent-death signal of a
//! tool is tied to the thread that forked it, and between reaping a tool and
//! killing its process group no other task may spawn (and so reuse the
//! group's number).

use super::listen::{Listener, Listeners};
use super::process::{Grants, ProcessRunner};
use super::service::Service;
use airlock_core::toolexec::{validate_token, Config, Gate, EXIT_BAD_TOKEN};
use anyhow::Context;
use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

/// Options of `airlock toolexec serve`; every limit defaults to the
/// constant of the same name in `airlock_core::toolexec`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where to listen: `HOST:PORT` (loopback unless --allow-remote) or
    /// `unix:PATH`. Repeats; default 127.0.0.1:0.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Read the token from FILE (one trailing newline stripped); else
    /// $AIFO_TOOLEEXEC_TOKEN; else a random one, printed.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// An allowed tool: NAME (looked up on PATH per request) or
    /// NAME=PROGRAM (fixed). Repeats.
    #[arg(long = "tool", value_name = "NAME[=PROGRAM]", required = true)]
    pub tools: Vec<String>,
    /// Seconds from spawn until the tool is stopped (answer 124).
    #[arg(long, value_name = "SECS", default_value_t = airlock_core::toolexec::DEFAULT_TIMEOUT.as_secs())]
    pub timeout: u64,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECS", default_value_t = airlock_core::toolexec::DEFAULT_KILL_GRACE.as_secs())]
    pub kill_grace: u64,
    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, value_name = "N", default_value_t = airlock_core::toolexec::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, value_name = "BYTES", default_value_t = airlock_core::toolexec::DEFAULT_MAX_BODY)]
    pub max_body: u64,
    /// Largest buffered (v1) output in bytes (507 above).
    #[arg(long, value_name = "BYTES", default_value_t = airlock_core::toolexec::DEFAULT_MAX_BUFFERED)]
    pub max_buffered: u64,
    /// Seconds a client has to send a complete request head.
    #[arg(long, value_name = "SECS", default_value_t = airlock_core::toolexec::DEFAULT_HEADER_TIMEOUT.as_secs())]
    pub header_timeout: u64,
    /// Allow listening on non-loopback addresses.
    #[arg(long)]
    pub allow_remote: bool,
    /// Let tools use the host's whole network (denied by the sandbox
    /// otherwise). Contradicts --allow-host.
    #[arg(long)]
    pub tool_net: bool,
    /// `--allow-host`, `--deny-host`, `--resolve`: each tool reaches these
    /// hosts through airlock's HTTP and SOCKS5 proxies in its own network
    /// namespace, as `airlock run`'s child does.
    #[command(flatten)]
    pub hosts: crate::egress::HostArgs,
    /// With --allow-host: write one JSON line per proxy connection of any
    /// tool to FILE (`op: egress`).
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Run tools unconfined.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Let tools also read and execute PATH directly (a toolchain outside
    /// the system locations, say `~/.cargo` and `~/.rustup`). Repeats.
    #[arg(long = "sandbox-ro", value_name = "PATH")]
    pub sandbox_ro: Vec<PathBuf>,
    /// Let tools also read and write PATH (a toolchain's cache, say
    /// `~/.cargo/registry`). Repeats.
    #[arg(long = "sandbox-rw", value_name = "PATH")]
    pub sandbox_rw: Vec<PathBuf>,
    /// Refuse to start when unprivileged namespaces are not available,
    /// instead of confining tools with seccomp, capabilities and Landlock
    /// alone.
    #[arg(long)]
    pub require_namespaces: bool,
    #[command(flatten)]
    pub env: crate::envpolicy::EnvArgs,
}

/// The environment variable holding the token, read at start and removed
/// from every tool's environment.
pub const TOKEN_ENV: &str = "AIFO_TOOLEEXEC_TOKEN";
/// The ready line's variable.
pub const URL_ENV: &str = "AIFO_TOOLEEXEC_URL";

pub fn serve(args: &ServeArgs) -> anyhow::Result<i32> {
    let token_bytes = match &args.token_file {
        Some(path) => {
            let mut raw =
                std::fs::read(path).with_context(|| format!("reading --token-file {}", path.display()))?;
            if raw.last() == Some(&b'\n') {
                raw.pop();
            }
            Some(raw)
        }
        None => std::env::var_os(TOKEN_ENV).map(std::os::unix::ffi::OsStringExt::into_vec),
    };
    let (token, generated) = match token_bytes {
        Some(raw) => match validate_token(&raw) {
            Ok(t) => (t, false),
            Err(e) => {
                eprintln!("airlock: toolexec: unusable token: {e}");
                return Ok(EXIT_BAD_TOKEN);
            }
        },
        None => (validate_token(random_token()?.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?, true),
    };
    let workdir =
        std::env::current_dir().and_then(std::fs::canonicalize).context("resolving the working directory")?;
    let mut config = Config::new(token, std::os::unix::ffi::OsStrExt::as_bytes(workdir.as_os_str()).to_vec());
    for spec in &args.tools {
        config.add_tool_spec(spec).map_err(|e| anyhow::anyhow!("--tool {spec}: {e}"))?;
    }
    config.timeout = Duration::from_secs(args.timeout);
    config.kill_grace = Duration::from_secs(args.kill_grace);
    config.max_body = args.max_body;
    config.max_buffered = args.max_buffered;
    config.header_timeout = Duration::from_secs(args.header_timeout);
    let grants = Grants::resolve(&workdir, &args.sandbox_ro, &args.sandbox_rw)?;
    let withhold = std::iter::once(OsString::from(TOKEN_ENV))
        .chain(crate::child::AIRLOCK_ENV.iter().map(OsString::from));
    let env = crate::envpolicy::decide(&args.env.policy(None, withhold)?);
    if let Some(note) = crate::envpolicy::note(&env, "each tool") {
        eprintln!("airlock: toolexec: note: {note}");
    }
    let runner = ProcessRunner::new(
        &workdir,
        !args.no_sandbox,
        args.tool_net,
        args.require_namespaces,
        &grants,
        &config.tools,
    )?
    .with_env(env.keep);
    let runner = match args.hosts.config()? {
        Some(net) => {
            let audit = match &args.audit {
                Some(path) => Some(crate::audit::AuditWriter::new(
                    path,
                    crate::outfile::OutFile::create(path, None)
                        .with_context(|| format!("--audit {}", path.display()))?,
                )),
                None => None,
            };
            runner.with_egress(net, audit)?
        }
        None if args.audit.is_some() => {
            anyhow::bail!("--audit records the proxies' connections: it needs an --allow-host")
        }
        None => runner,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args, config, runner, generated))
}

fn random_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut raw = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .context("reading /dev/urandom for a token")?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

/// What the accept loops share: the service and the connection cap.
struct Shared {
    service: Arc<Service<ProcessRunner>>,
    gate: Mutex<Gate>,
    released: Notify,
    shutdown: watch::Receiver<bool>,
}

async fn run(
    args: &ServeArgs,
    config: Config,
    runner: ProcessRunner,
    generated: bool,
) -> anyhow::Result<i32> {
    let specs = if args.listen.is_empty() { vec!["127.0.0.1:0".to_owned()] } else { args.listen.clone() };
    let mut listeners = Listeners::bind(&specs, args.allow_remote).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    eprintln!("airlock: toolexec: {}", runner.describe());
    let token = config.token.clone();
    let service =
        Arc::new(Service::new(config, runner, Duration::from_secs(args.header_timeout), stop_rx.clone()));
    let shared = Arc::new(Shared {
        service,
        gate: Mutex::new(Gate::new(args.max_connections)),
        released: Notify::new(),
        shutdown: stop_rx,
    });
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for url in listeners.urls() {
            writeln!(out, "{URL_ENV}={url}")?;
        }
        if generated {
            writeln!(out, "{TOKEN_ENV}={}", String::from_utf8_lossy(token.as_bytes()))?;
        }
        out.flush()?;
    }
    // Every connection task holds a clone; when all are dropped, every
    // connection has ended.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    let mut accept_tasks = Vec::new();
    for l in listeners.take() {
        accept_tasks.push(tokio::spawn(accept_loop(l, shared.clone(), alive_tx.clone())));
    }
    drop(alive_tx);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("airlock: toolexec: stopping");
    let _ = stop_tx.send(true);
    for t in accept_tasks {
        let _ = t.await;
    }
    // Returns once every connection task is gone (all senders dropped).
    // Tools are stopped within two graces (TERM, KILL, then the drain);
    // a client that stopped reading must not keep the server alive past
    // that, so the rest is dropped (which kills any group still there).
    let bound = Duration::from_secs(args.kill_grace.saturating_mul(2).saturating_add(1));
    if tokio::time::timeout(bound, alive_rx.recv()).await.is_err() {
        eprintln!("airlock: toolexec: connections still open after {} s; closing them", bound.as_secs());
    }
    drop(listeners);
    Ok(0)
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, alive: mpsc::Sender<()>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        // The permit comes before accept: extra clients wait in the backlog.
        loop {
            let released = shared.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if shared.gate.lock().map(|mut g| g.try_take()).unwrap_or(false) {
                break;
            }
            tokio::select! {
                _ = released => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|s| *s) => {
                release(&shared);
                return;
            }
        };
        match accepted {
            Ok(stream) => {
                let shared = shared.clone();
                let alive = alive.clone();
                tokio::spawn(async move {
                    shared.service.serve_connection(stream).await;
                    release(&shared);
                    drop(alive);
                });
            }
            Err(e) => {
                release(&shared);
                tracing::warn!("toolexec: accept: {e}");
                // EMFILE and friends: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn release(shared: &Shared) {
    if let Ok(mut g) = shared.gate.lock() {
        g.release();
    }
    shared.released.notify_waiters();
}
