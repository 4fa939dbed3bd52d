//! The egress proxies, served: one thread with a runtime of its own drives
//! the session's egress machine (`airlock_core::egress::Egress`) and
//! carries out what it decides.
//!
//! - Two accept loops take the child's connections on the listeners PID 1
//!   created in the child's network namespace (`crate::confine::egress`).
//! - Each connection has a task that owns its sockets and does what the
//!   machine says, in order: read (at most what was granted), write to the
//!   client, connect to the offered addresses in turn (reporting the peer
//!   actually reached), write to the destination, relay, close.
//! - A relay is two copy loops, one per direction, each within the credit
//!   the machine granted, reporting every move; a direction's end shuts
//!   the other side's write half, as a TCP proxy must.
//! - Lookups are `getaddrinfo` on the runtime's blocking pool.
//!
//! The thread is the session's: [`Service::stop`] feeds `Shutdown`, closes
//! every connection, and hands back the counts.

use crate::audit::AuditWriter;
use crate::confine::egress::Listeners;
use airlock_core::egress::{Config, ConnId, ConnectError, Egress, End, Input, Listener, Output, Stats};
use airlock_core::time::Instant;
use airlock_core::trace::egress as trace;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};

/// Bytes one relay read moves at most.
pub const RELAY_CHUNK: usize = 256 << 10;
/// How long one address may take to answer a connect.
pub const CONNECT_ATTEMPT: Duration = Duration::from_secs(10);
/// After a refusal, how long the client's unread bytes are drained so the
/// close is a FIN, not a reset that could lose the answer.
pub const LINGER: Duration = Duration::from_millis(500);
/// ...and how many bytes at most.
pub const LINGER_BYTES: usize = 64 << 10;
/// How long stopping waits for the connections' tasks to close.
const STOP_GRACE: Duration = Duration::from_secs(2);

enum Event {
    Accepted(ConnId, Listener, TcpStream),
    Machine(Input),
    Stop(oneshot::Sender<Stopped>),
}

type Events = mpsc::UnboundedSender<Event>;

enum Cmd {
    Read(usize),
    Send(Vec<u8>),
    Connect(Vec<SocketAddr>),
    SendUpstream(Vec<u8>),
    Relay(u64, u64),
    Close,
}

/// What a stopped service hands back.
#[derive(Debug, Default)]
pub struct Stopped {
    pub stats: Stats,
    /// Tunnels a limit ended (`End::Limit`): the statistics count them
    /// as allowed, yet the session's budget cut them.
    pub cut_by_limit: u64,
}

/// The running service.
pub struct Service {
    events: Events,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Where the machine's inputs and outputs are recorded (`--record`).
struct Recorder {
    out: std::io::BufWriter<std::fs::File>,
    failed: bool,
}

impl Recorder {
    fn line(&mut self, text: &str) {
        if !self.failed && self.out.write_all(text.as_bytes()).is_err() {
            self.failed = true;
        }
    }
}

impl Service {
    /// Serve `listeners` under `config` on a thread of its own. `audit`
    /// gets one line per connection; `record` names the trace file.
    pub fn start(
        config: Config,
        listeners: Listeners,
        audit: Option<AuditWriter>,
        record: Option<PathBuf>,
    ) -> anyhow::Result<Service> {
        Service::start_numbered(config, listeners, audit, record, Arc::new(AtomicU64::new(1)))
    }

    /// [`Service::start`], numbering connections from `next`: services
    /// that share one audit log (`toolexec serve`'s, one per tool) share
    /// it, so no two connections there have one number.
    pub fn start_numbered(
        config: Config,
        listeners: Listeners,
        audit: Option<AuditWriter>,
        record: Option<PathBuf>,
        next: Arc<AtomicU64>,
    ) -> anyhow::Result<Service> {
        let recorder = match &record {
            Some(path) => {
                let file = std::fs::File::create(path)
                    .map_err(|e| anyhow::anyhow!("creating the egress trace {}: {e}", path.display()))?;
                let mut r = Recorder { out: std::io::BufWriter::new(file), failed: false };
                let mut header = trace::Header::new(&config);
                header.meta = Some(serde_json::json!({ "recorded_by": "run" }));
                r.line(&trace::header_line(&header));
                Some(r)
            }
            None => None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let events = tx.clone();
        let thread = std::thread::Builder::new().name("airlock-egress".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("airlock: the egress proxies could not start: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let Listeners { http, socks } = listeners;
                let mut accepts = Vec::new();
                for (l, kind) in [(http, Listener::Http), (socks, Listener::Socks)] {
                    match TcpListener::from_std(l) {
                        Ok(l) => accepts.push(tokio::spawn(accept_loop(l, kind, next.clone(), tx.clone()))),
                        Err(e) => eprintln!("airlock: an egress listener: {e}"),
                    }
                }
                let driver = Driver {
                    m: Egress::new(config),
                    start: tokio::time::Instant::now(),
                    conns: BTreeMap::new(),
                    tasks: tokio::task::JoinSet::new(),
                    events: tx,
                    audit,
                    recorder,
                    cut_by_limit: 0,
                };
                driver.run(rx).await;
                for a in accepts {
                    a.abort();
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(Service { events, thread: Some(thread) })
    }

    /// End every connection and the thread; the session's counts.
    pub async fn stop(mut self) -> Stopped {
        let (tx, rx) = oneshot::channel();
        let stats = if self.events.send(Event::Stop(tx)).is_ok() { rx.await.ok() } else { None };
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        stats.unwrap_or_default()
    }
}

impl Drop for Service {
    /// A service dropped without [`Service::stop`] (its tool's driver torn
    /// down mid-run) still ends its thread and every connection; nobody
    /// waits for the counts.
    fn drop(&mut self) {
        if self.thread.take().is_some() {
            let (tx, _) = oneshot::channel();
            let _ = self.events.send(Event::Stop(tx));
        }
    }
}

async fn accept_loop(l: TcpListener, kind: Listener, next: Arc<AtomicU64>, events: Events) {
    loop {
        match l.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                let id = ConnId(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                if events.send(Event::Accepted(id, kind, stream)).is_err() {
                    return;
                }
            }
            Err(e) => {
                // Out of descriptors, say: the connection waits in the
                // backlog until one is free.
                tracing::warn!("egress proxy accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

struct Driver {
    m: Egress,
    start: tokio::time::Instant,
    conns: BTreeMap<ConnId, mpsc::UnboundedSender<Cmd>>,
    tasks: tokio::task::JoinSet<()>,
    events: Events,
    audit: Option<AuditWriter>,
    recorder: Option<Recorder>,
    cut_by_limit: u64,
}

impl Driver {
    fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>) {
        loop {
            let deadline = self.m.poll_timeout().map(|t| self.start + Duration::from_micros(t.as_micros()));
            let ev = match deadline {
                Some(at) => tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(at) => Some(Event::Machine(Input::Tick)),
                    ev = rx.recv() => ev,
                },
                None => rx.recv().await,
            };
            // Finished tasks are reaped as they go.
            while self.tasks.try_join_next().is_some() {}
            match ev {
                None => return,
                Some(Event::Accepted(id, listener, stream)) => {
                    let (tx, cmds) = mpsc::unbounded_channel();
                    self.tasks.spawn(conn_task(id, stream, cmds, self.events.clone()));
                    self.conns.insert(id, tx);
                    self.feed(Input::Accepted { conn: id, listener });
                }
                Some(Event::Machine(input)) => self.feed(input),
                Some(Event::Stop(reply)) => {
                    self.feed(Input::Shutdown);
                    let _ = tokio::time::timeout(STOP_GRACE, async {
                        while self.tasks.join_next().await.is_some() {}
                    })
                    .await;
                    self.tasks.abort_all();
                    if let Some(r) = &mut self.recorder {
                        let _ = r.out.flush();
                    }
                    let _ = reply
                        .send(Stopped { stats: self.m.stats().clone(), cut_by_limit: self.cut_by_limit });
                    return;
                }
            }
        }
    }

    fn feed(&mut self, input: Input) {
        let now = self.now();
        if let Some(r) = &mut self.recorder {
            r.line(&trace::input_line(now, &input));
        }
        self.m.handle(now, input);
        while let Some(o) = self.m.poll_output() {
            if let Some(r) = &mut self.recorder {
                r.line(&trace::output_line(&o));
            }
            self.dispatch(o);
        }
    }

    fn send(&mut self, conn: ConnId, cmd: Cmd) {
        if let Some(tx) = self.conns.get(&conn) {
            let _ = tx.send(cmd);
        }
    }

    fn dispatch(&mut self, o: Output) {
        match o {
            Output::ReadClient { conn, max } => self.send(conn, Cmd::Read(max)),
            Output::Send { conn, data } => self.send(conn, Cmd::Send(data)),
            Output::Resolve { conn, name, port } => {
                let events = self.events.clone();
                tokio::spawn(async move {
                    let result = match tokio::net::lookup_host((name.as_str(), port)).await {
                        Ok(addrs) => {
                            let mut ips = Vec::new();
                            for a in addrs {
                                if !ips.contains(&a.ip()) {
                                    ips.push(a.ip());
                                }
                            }
                            Ok(ips)
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    let _ = events.send(Event::Machine(Input::Resolved { conn, result }));
                });
            }
            Output::Connect { conn, addrs } => self.send(conn, Cmd::Connect(addrs)),
            Output::SendUpstream { conn, data } => self.send(conn, Cmd::SendUpstream(data)),
            Output::Relay { conn, up, down } => self.send(conn, Cmd::Relay(up, down)),
            Output::Close { conn } => {
                self.send(conn, Cmd::Close);
                self.conns.remove(&conn);
            }
            Output::Audit { record } => {
                if record.allowed && record.end == End::Limit {
                    self.cut_by_limit += 1;
                }
                tracing::debug!(conn = %record.conn, host = ?record.host, rule = %record.rule, "egress");
                if let Some(a) = &mut self.audit {
                    a.egress(&record);
                }
            }
        }
    }
}

fn connect_error(e: &std::io::Error) -> ConnectError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => ConnectError::Refused,
        K::TimedOut => ConnectError::TimedOut,
        K::NetworkUnreachable | K::HostUnreachable => ConnectError::Unreachable,
        _ => ConnectError::Other(e.to_string()),
    }
}

/// The first of `addrs` that answers, and the peer it is.
async fn connect(addrs: Vec<SocketAddr>) -> Result<(TcpStream, SocketAddr), ConnectError> {
    let mut last = ConnectError::Unreachable;
    for a in addrs {
        match tokio::time::timeout(CONNECT_ATTEMPT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => match s.peer_addr() {
                Ok(peer) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, peer));
                }
                Err(e) => last = connect_error(&e),
            },
            Ok(Err(e)) => last = connect_error(&e),
            Err(_) => last = ConnectError::TimedOut,
        }
    }
    Err(last)
}

/// Credit one direction of a relay may still use.
#[derive(Default)]
struct Credit {
    left: std::sync::Mutex<u64>,
    more: Notify,
}

impl Credit {
    fn add(&self, n: u64) {
        if n > 0 {
            *self.left.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += n;
            self.more.notify_one();
        }
    }

    fn take(&self, n: u64) {
        let mut left = self.left.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *left = left.saturating_sub(n);
    }

    async fn wait(&self) -> u64 {
        loop {
            let more = self.more.notified();
            let left = *self.left.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if left > 0 {
                return left;
            }
            more.await;
        }
    }
}

#[derive(Clone, Copy)]
enum Dir {
    Up,
    Down,
}

/// Copy `from` to `to` within `credit`, reporting every move; at `from`'s
/// end, shut `to`'s write side. `Err` on a failed read or write.
async fn copy_dir(
    conn: ConnId,
    dir: Dir,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    credit: Arc<Credit>,
    events: Events,
) -> Result<(), String> {
    let mut buf = vec![0u8; RELAY_CHUNK];
    loop {
        let allowed = credit.wait().await;
        let want = usize::try_from(allowed).unwrap_or(usize::MAX).min(RELAY_CHUNK);
        let n = from.read(&mut buf[..want]).await.map_err(|e| e.to_string())?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        to.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
        credit.take(n as u64);
        let (up, down) = match dir {
            Dir::Up => (n as u64, 0),
            Dir::Down => (0, n as u64),
        };
        if events.send(Event::Machine(Input::Moved { conn, up, down })).is_err() {
            return Err("the session ended".into());
        }
    }
}

/// Close a client that was refused: what was sent is flushed, its write
/// side shut, and what it still sends read and dropped for a moment, so
/// the close reaches it as a FIN after the answer, never a reset.
async fn linger_close(mut client: TcpStream) {
    let _ = client.flush().await;
    let _ = client.shutdown().await;
    let mut sink = vec![0u8; 8192];
    let mut left = LINGER_BYTES;
    let _ = tokio::time::timeout(LINGER, async {
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

async fn conn_task(id: ConnId, client: TcpStream, mut cmds: mpsc::UnboundedReceiver<Cmd>, events: Events) {
    let machine = |input: Input| {
        let _ = events.send(Event::Machine(input));
    };
    let mut client = client;
    let mut upstream: Option<TcpStream> = None;
    let mut reading: Option<usize> = None;
    let mut buf = Vec::new();
    // Before the relay: commands in order, a read or a connect at a time.
    loop {
        tokio::select! {
            biased;
            cmd = cmds.recv() => {
                let Some(cmd) = cmd else { return };
                match cmd {
                    Cmd::Read(max) => reading = Some(max),
                    Cmd::Send(data) => {
                        if client.write_all(&data).await.is_err() {
                            machine(Input::ClientGone { conn: id });
                        }
                    }
                    Cmd::Connect(addrs) => {
                        // A Close while connecting drops the attempt.
                        let attempt = connect(addrs);
                        tokio::pin!(attempt);
                        let result = loop {
                            tokio::select! {
                                biased;
                                cmd = cmds.recv() => match cmd {
                                    Some(Cmd::Close) | None => return linger_close(client).await,
                                    Some(_) => continue,
                                },
                                r = &mut attempt => break r,
                            }
                        };
                        let result = result.map(|(s, peer)| {
                            upstream = Some(s);
                            peer
                        });
                        machine(Input::Connected { conn: id, result });
                    }
                    Cmd::SendUpstream(data) => {
                        let ok = match upstream.as_mut() {
                            Some(u) => u.write_all(&data).await.is_ok(),
                            None => false,
                        };
                        if !ok {
                            machine(Input::RelayEnded { conn: id, error: Some("writing to the destination failed".into()) });
                        }
                    }
                    Cmd::Relay(up, down) => {
                        let Some(upstream) = upstream.take() else { return };
                        return relay(id, client, upstream, up, down, cmds, events.clone()).await;
                    }
                    Cmd::Close => {
                        drop(upstream);
                        return linger_close(client).await;
                    }
                }
            }
            r = async {
                buf.resize(reading.unwrap_or(0).min(64 << 10), 0);
                client.read(&mut buf).await
            }, if reading.is_some() => {
                reading = None;
                match r {
                    Ok(n) => machine(Input::ClientBytes { conn: id, data: buf[..n].to_vec() }),
                    Err(_) => machine(Input::ClientGone { conn: id }),
                }
            }
        }
    }
}

/// Both directions at once, until both end, one fails, or the machine
/// closes the tunnel.
async fn relay(
    id: ConnId,
    client: TcpStream,
    upstream: TcpStream,
    up: u64,
    down: u64,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    events: Events,
) {
    let (client_rd, client_wr) = client.into_split();
    let (up_rd, up_wr) = upstream.into_split();
    let up_credit = Arc::new(Credit::default());
    let down_credit = Arc::new(Credit::default());
    up_credit.add(up);
    down_credit.add(down);
    let mut up_task =
        tokio::spawn(copy_dir(id, Dir::Up, client_rd, up_wr, up_credit.clone(), events.clone()));
    let mut down_task =
        tokio::spawn(copy_dir(id, Dir::Down, up_rd, client_wr, down_credit.clone(), events.clone()));
    let (mut up_done, mut down_done) = (false, false);
    let mut error = None;
    loop {
        tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                Some(Cmd::Relay(u, d)) => {
                    up_credit.add(u);
                    down_credit.add(d);
                }
                Some(Cmd::Close) | None => {
                    up_task.abort();
                    down_task.abort();
                    return;
                }
                Some(_) => {}
            },
            r = &mut up_task, if !up_done => {
                up_done = true;
                if let Ok(Err(e)) | Err(e) = r.map_err(|e| e.to_string()) {
                    error.get_or_insert(e);
                }
            }
            r = &mut down_task, if !down_done => {
                down_done = true;
                if let Ok(Err(e)) | Err(e) = r.map_err(|e| e.to_string()) {
                    error.get_or_insert(e);
                }
            }
        }
        if (up_done && down_done) || error.is_some() {
            up_task.abort();
            down_task.abort();
            let _ = events.send(Event::Machine(Input::RelayEnded { conn: id, error: error.take() }));
            // The machine answers with a close; wait for it (or the end).
            while let Some(cmd) = cmds.recv().await {
                if matches!(cmd, Cmd::Close) {
                    break;
                }
            }
            return;
        }
    }
}
