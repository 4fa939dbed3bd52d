//! The shell's event loop: moves bytes, exits and effect results into the
//! FS proxy machine and carries its outputs out to sockets, files and stdio.
//!
//! It makes no protocol decision of its own. It is generic over the
//! transport (anything `AsyncRead + AsyncWrite`), so the same loop runs over
//! real socketpairs in `airlock run`/`serve` and over turmoil's simulated
//! network in the simulator.

use crate::hostfs::HostFs;
use crate::provider::Provider;
use crate::stdin::StdinReader;
use crate::telemetry::TelemetryWriter;
use airlock_core::broker::{CallId, ProviderRequest, ProviderResult};
use airlock_core::fsproxy::{Effect, EffectId, EffectResult, FsErrorKind, FsProxy, Input, Output, StdStream};
use airlock_core::handles::ClientId;
use airlock_core::time::Instant;
use airlock_model::backlog::Backlog;
use airlock_model::inflight::{Cancel, Inflight};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Response bytes queued for a client before airlock stops reading its
/// requests: a client that never reads its answers is throttled, not
/// buffered without bound.
pub const MAX_UNSENT_BYTES: usize = 1 << 20;

/// Sees every input the machine is handed and every output it produces,
/// in order (the trace recorder).
pub trait Observer: Send {
    fn input(&mut self, now: Instant, input: &Input);
    fn output(&mut self, output: &Output);
    /// The session is over: make what was observed durable.
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A passed descriptor as a stream, if it is a stream socket: a datagram
/// socket would never hit EOF, so it would be held for good.
fn attach_stream(fd: OwnedFd) -> std::io::Result<UnixStream> {
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "passed descriptor is not a socket",
        ));
    }
    let kind = rustix::net::sockopt::socket_type(&fd)?;
    if kind != rustix::net::SocketType::STREAM {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("passed socket is not a stream socket ({kind:?})"),
        ));
    }
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    UnixStream::from_std(std)
}

fn is_stream_socket(fd: &OwnedFd) -> bool {
    rustix::net::sockopt::socket_type(fd).is_ok_and(|t| t == rustix::net::SocketType::STREAM)
}

async fn write_flush(mut w: impl AsyncWrite + Unpin, data: &[u8]) -> std::io::Result<()> {
    w.write_all(data).await?;
    w.flush().await
}

/// Something that happened outside the loop.
#[derive(Debug)]
pub enum Event {
    Bytes(ClientId, Vec<u8>),
    Eof(ClientId),
    UpstreamBytes(Vec<u8>),
    UpstreamEof,
    EffectDone(EffectId, EffectResult),
    /// A descriptor passed over a client's socket.
    Passed(ClientId, OwnedFd),
    /// The process behind a client is gone.
    Died(ClientId),
    /// A provider call (`Output::StartProvider`) finished; its result waits
    /// in the session's in-flight table.
    ProviderDone(CallId),
    /// A connection on the session socket that sent a secret: the
    /// session's (`None`), or another for the machine to look up.
    Accepted(UnixStream, Option<airlock_core::fsproxy::Secret>),
    /// A connection on the session socket closed for a wrong or missing
    /// secret.
    Unauthenticated,
    /// Mount `index` of the served filesystem (the plan's order): its
    /// `/dev/fuse` descriptor, from the confinement stage.
    FuseMount(u32, OwnedFd),
    /// One request read from a mount's device.
    Fuse(ClientId, Vec<u8>),
}

/// What the session needs to serve the confinement's mounts.
#[derive(Clone, Debug)]
pub struct MountPlan {
    /// The root each mount serves, by index.
    pub roots: Vec<airlock_core::policy::RootId>,
    pub uid: u32,
    pub gid: u32,
    /// Whether backing files can be registered (passthrough).
    pub passthrough: bool,
}

/// The message of the result fed for a provider call dropped on the
/// broker's `CancelProvider`.
pub const CANCELLED: &str = "cancelled";
/// The message of the result fed for a provider call still running when
/// the session ends (every client is gone).
pub const SESSION_ENDED: &str = "cancelled: the session ended";

/// The shell's side of the broker: who makes the calls, where telemetry
/// goes.
#[derive(Default)]
pub struct BrokerShell {
    pub provider: Option<Arc<dyn Provider>>,
    pub telemetry: Option<TelemetryWriter>,
}

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    backlog: Arc<Backlog>,
    /// Told each time the loop has handled bytes this connection read
    /// (a Unix connection's reader waits for it before reading again).
    handled: Arc<tokio::sync::Notify>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

pub struct Session {
    proxy: FsProxy,
    host: HostFs,
    start: tokio::time::Instant,
    events_tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    conns: BTreeMap<ClientId, Conn>,
    /// Descriptors passed by each client, oldest first, for `attach`.
    passed: BTreeMap<ClientId, VecDeque<OwnedFd>>,
    upstream: Option<Conn>,
    observer: Option<Box<dyn Observer>>,
    broker: BrokerShell,
    /// Provider calls in flight: their results, settled exactly once by
    /// whichever comes first, the task finishing or the broker cancelling.
    inflight: Arc<Inflight<CallId, ProviderResult>>,
    /// The calls' tasks, so a cancel can drop the HTTP request.
    provider_tasks: BTreeMap<CallId, AbortHandle>,
    /// Reads of handle 0, started on the first; dropped with the session.
    stdin: Option<StdinReader>,
    /// `--audit FILE`.
    audit: Option<crate::audit::AuditWriter>,
    /// Accepts connections on the session socket, while the session lasts.
    acceptor: Option<JoinHandle<()>>,
    /// The connection of the `Input::Accepted` being handled.
    accepted: Option<UnixStream>,
    /// The served filesystem's mounts and their devices.
    mounts: Option<MountPlan>,
    devices: BTreeMap<ClientId, crate::served::Device>,
}

/// How long a refused connection of the session socket is given to take
/// its refusal before it is closed.
pub const REFUSAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Descriptors a client may pass ahead of the `attach` requests that claim
/// them; more are closed on arrival.
pub const MAX_PASSED_DESCRIPTORS: usize = 16;

/// Queued responses a connection's writer hands the kernel in one vectored
/// write at most: one system call per wakeup rather than one per response
/// (a pipelining client has many answered per batch of requests read).
pub const MAX_WRITE_BATCH: usize = 64;
/// Bytes gathered into one vectored write at most, once past the first
/// response: the kernel copies a batch while the responses are still in
/// the cache they were encoded into.
pub const MAX_WRITE_BATCH_BYTES: usize = 64 << 10;

/// Write every byte of `batch`, in order, with as few vectored writes as
/// the stream takes.
async fn write_batch<W>(wr: &mut W, batch: &[Vec<u8>]) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    // The first buffer not yet wholly written, and how much of it was.
    let (mut first, mut done) = (0, 0);
    while first < batch.len() {
        let mut slices = [std::io::IoSlice::new(&[]); MAX_WRITE_BATCH];
        let mut count = 0;
        for (slot, buf) in slices.iter_mut().zip(&batch[first..]) {
            let from = if count == 0 { done } else { 0 };
            *slot = std::io::IoSlice::new(&buf[from..]);
            count += 1;
        }
        let mut n = wr.write_vectored(&slices[..count]).await?;
        if n == 0 && slices[..count].iter().any(|s| !s.is_empty()) {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < batch.len() {
            let left = batch[first].len() - done;
            if n < left {
                done += n;
                break;
            }
            n -= left;
            first += 1;
            done = 0;
        }
    }
    wr.flush().await
}

fn spawn_writer<W>(mut wr: W, backlog: Arc<Backlog>) -> (mpsc::UnboundedSender<Vec<u8>>, JoinHandle<()>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let mut batch = Vec::with_capacity(MAX_WRITE_BATCH);
        while let Some(data) = rx.recv().await {
            let mut bytes = data.len();
            batch.push(data);
            while batch.len() < MAX_WRITE_BATCH && bytes < MAX_WRITE_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(data) => {
                        bytes += data.len();
                        batch.push(data);
                    }
                    Err(_) => break,
                }
            }
            let ok = write_batch(&mut wr, &batch).await.is_ok();
            backlog.sent(bytes);
            batch.clear();
            if !ok {
                break;
            }
        }
        // Nothing drains any more: the reader must not wait on us.
        backlog.close();
        let _ = wr.shutdown().await;
    });
    (tx, writer)
}

/// A connection over any byte stream (turmoil's, in the simulator).
fn spawn_conn<T>(
    stream: T,
    on_bytes: impl Fn(Vec<u8>) -> Event + Send + 'static,
    on_eof: Event,
    events: mpsc::Sender<Event>,
) -> Conn
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let backlog = Arc::new(Backlog::new(MAX_UNSENT_BYTES));
    let (tx, writer) = spawn_writer(wr, backlog.clone());
    let bl = backlog.clone();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0; READ_CHUNK];
        loop {
            bl.room().await;
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if events.send(on_bytes(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = events.send(on_eof).await;
    });
    Conn { tx, backlog, handled: Arc::default(), reader, writer }
}

/// Read what is there, with any descriptors passed alongside it.
fn recv_with_fds(fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    // CMSG_CLOEXEC: a passed descriptor must never leak into a child.
    let msg =
        rustix::net::recvmsg(fd, &mut iov, &mut ancillary, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)?;
    let mut fds = Vec::new();
    for m in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = m {
            fds.extend(passed);
        }
    }
    Ok((msg.bytes, fds))
}

/// A connection over a Unix socket, which may carry descriptors (`attach`).
fn spawn_unix_conn(stream: UnixStream, client: ClientId, events: mpsc::Sender<Event>) -> Conn {
    let (rd, wr) = stream.into_split();
    let backlog = Arc::new(Backlog::new(MAX_UNSENT_BYTES));
    let (tx, writer) = spawn_writer(wr, backlog.clone());
    let bl = backlog.clone();
    let handled = Arc::new(tokio::sync::Notify::new());
    let handled_rx = handled.clone();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0; READ_CHUNK];
        let sock: &UnixStream = rd.as_ref();
        loop {
            bl.room().await;
            if sock.readable().await.is_err() {
                break;
            }
            let got = sock.try_io(Interest::READABLE, || recv_with_fds(sock.as_fd(), &mut buf));
            match got {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok((0, _)) | Err(_) => break,
                Ok((n, fds)) => {
                    // Descriptors first: they came with the first of these bytes.
                    for fd in fds {
                        if events.send(Event::Passed(client, fd)).await.is_err() {
                            return;
                        }
                    }
                    if events.send(Event::Bytes(client, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                    // Read again once the loop has answered these: the
                    // client has had that long to send more, so the read
                    // finds its next requests more often than an empty
                    // socket (a system call and a reactor poll for nothing).
                    handled_rx.notified().await;
                }
            }
        }
        let _ = events.send(Event::Eof(client)).await;
    });
    Conn { tx, backlog, handled, reader, writer }
}

impl Conn {
    fn send(&self, data: Vec<u8>) {
        self.backlog.queued(data.len());
        let _ = self.tx.send(data);
    }
}

impl Session {
    pub fn new(proxy: FsProxy, host: HostFs, observer: Option<Box<dyn Observer>>) -> Self {
        let (events_tx, events) = mpsc::channel(64);
        Session {
            proxy,
            host,
            start: tokio::time::Instant::now(),
            events_tx,
            events,
            conns: BTreeMap::new(),
            passed: BTreeMap::new(),
            upstream: None,
            observer,
            broker: BrokerShell::default(),
            inflight: Arc::default(),
            provider_tasks: BTreeMap::new(),
            stdin: None,
            audit: None,
            acceptor: None,
            accepted: None,
            mounts: None,
            devices: BTreeMap::new(),
        }
    }

    /// Serve the mounts of `plan` as their descriptors arrive on `socket`
    /// (from the confinement stage).
    pub fn serve_mounts(&mut self, plan: MountPlan, socket: OwnedFd) -> anyhow::Result<()> {
        crate::served::receive(socket, self.events_tx.clone())?;
        self.mounts = Some(plan);
        Ok(())
    }

    /// The mounts being served.
    pub fn served_mounts(&self) -> usize {
        self.devices.len()
    }

    /// Serve the processes that reach the session through `socket`.
    pub fn listen(&mut self, socket: &mut crate::session_socket::SessionSocket) -> anyhow::Result<()> {
        self.acceptor = Some(socket.serve(self.events_tx.clone())?);
        Ok(())
    }

    /// Accept no more connections on the session socket.
    fn stop_listening(&mut self) {
        if let Some(task) = self.acceptor.take() {
            task.abort();
        }
    }

    /// Write the machine's audit records (`Config::audit`) with `writer`.
    pub fn set_audit(&mut self, writer: crate::audit::AuditWriter) {
        self.audit = Some(writer);
    }

    /// Another handle on the audit log, for records of the session's
    /// other services (the egress proxies).
    pub fn audit_writer(&self) -> Option<crate::audit::AuditWriter> {
        self.audit.clone()
    }

    /// Record, in the audit log if any, the paths the child reads
    /// directly and what airlock granted on its own (see
    /// `AuditWriter::direct_read`, `AuditWriter::granted`).
    pub fn audit_sandbox_grants(&mut self, rules: &airlock_core::sandbox::Ruleset) {
        if let Some(audit) = &mut self.audit {
            for p in &rules.direct_read {
                // An automatic one is written below, with its reason.
                if !rules.granted.iter().any(|g| g.path == *p) {
                    audit.direct_read(p);
                }
            }
            for g in &rules.granted {
                audit.granted(g);
            }
        }
    }

    /// Make the broker's provider calls with `shell.provider` and write its
    /// telemetry to `shell.telemetry`.
    pub fn set_broker_shell(&mut self, shell: BrokerShell) {
        self.broker = shell;
    }

    /// Where the machine's next timer falls, on tokio's clock.
    fn wake_at(&self) -> Option<tokio::time::Instant> {
        let due = self.proxy.poll_timeout()?;
        Some(self.start + std::time::Duration::from_micros(due.as_micros()))
    }

    /// A sender for events from outside (process exits).
    pub fn events(&self) -> mpsc::Sender<Event> {
        self.events_tx.clone()
    }

    pub fn proxy(&self) -> &FsProxy {
        &self.proxy
    }

    pub fn host(&self) -> &HostFs {
        &self.host
    }

    fn now(&self) -> Instant {
        let micros = self.start.elapsed().as_micros();
        Instant::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// Serve a client over `stream`.
    pub fn add_client<T>(&mut self, client: ClientId, stream: T)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let conn =
            spawn_conn(stream, move |b| Event::Bytes(client, b), Event::Eof(client), self.events_tx.clone());
        self.conns.insert(client, conn);
        self.feed(Input::Connected { client });
    }

    /// Serve a client over a Unix socket, which may pass further sockets
    /// to attach.
    pub fn add_unix_client(&mut self, client: ClientId, stream: UnixStream) {
        self.conns.insert(client, spawn_unix_conn(stream, client, self.events_tx.clone()));
        self.feed(Input::Connected { client });
    }

    /// Whether `client`'s connection is still served.
    pub fn serves(&self, client: ClientId) -> bool {
        self.conns.contains_key(&client)
    }

    /// Clients being served.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.conns.keys().copied()
    }

    /// End every session still open (the process tree is going away).
    pub fn depart_all(&mut self) {
        // Nobody may join a session that is ending.
        self.stop_listening();
        let live: Vec<ClientId> = self.conns.keys().chain(self.devices.keys()).copied().collect();
        for client in live {
            self.feed(Input::Died { client });
        }
    }

    /// Whether every client has left and every file is released.
    pub fn all_finished(&self) -> bool {
        self.conns.is_empty() && self.devices.is_empty() && self.proxy.quiescent()
    }

    /// Forward to an upstream proxy over `stream`.
    pub fn set_upstream<T>(&mut self, stream: T)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.upstream =
            Some(spawn_conn(stream, Event::UpstreamBytes, Event::UpstreamEof, self.events_tx.clone()));
    }

    /// Handle events until `done` holds.
    ///
    /// Cancel-safe: it awaits nothing but the next event, and handles each
    /// event to the end before awaiting again, so it may be one branch of a
    /// `select!` whose other branch needs the session too (accepting
    /// connections, say) and be called again afterwards without losing any.
    pub async fn run_until(&mut self, mut done: impl FnMut(&Session) -> bool) {
        while !done(self) {
            let ev = match self.wake_at() {
                // Timers first: a deadline that has passed is handled
                // before any event, however busy the clients keep us.
                Some(at) => tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(at) => {
                        self.feed(Input::Tick);
                        continue;
                    }
                    ev = self.events.recv() => ev,
                },
                None => self.events.recv().await,
            };
            let Some(ev) = ev else { break };
            let input = match ev {
                Event::Passed(client, fd) => {
                    // Only a stream socket can be a connection: anything
                    // else (a datagram socket never hits EOF) is closed on
                    // arrival, so the attach meant for it finds none.
                    if !is_stream_socket(&fd) {
                        tracing::debug!(%client, "passed descriptor is not a stream socket; closed");
                        continue;
                    }
                    let queue = self.passed.entry(client).or_default();
                    if !self.conns.contains_key(&client) || queue.len() >= MAX_PASSED_DESCRIPTORS {
                        continue;
                    }
                    queue.push_back(fd);
                    Input::Descriptor { client }
                }
                Event::Accepted(stream, secret) => {
                    if self.acceptor.is_none() {
                        continue;
                    }
                    self.accepted = Some(stream);
                    Input::Accepted { secret }
                }
                Event::Unauthenticated => {
                    tracing::debug!("session socket: connection without the session's secret closed");
                    Input::Unauthenticated
                }
                Event::FuseMount(index, fd) => {
                    let Some(plan) = &self.mounts else { continue };
                    let Some(root) = plan.roots.get(index as usize).copied() else { continue };
                    let client = crate::served::mount_client(index);
                    let max_write = self.proxy.config().fuse.max_write as usize;
                    match crate::served::Device::serve(fd, client, max_write, self.events_tx.clone()) {
                        Ok(dev) => {
                            self.devices.insert(client, dev);
                        }
                        Err(e) => {
                            tracing::warn!(index, "serving a mount: {e}");
                            continue;
                        }
                    }
                    let (uid, gid, passthrough) = (plan.uid, plan.gid, plan.passthrough);
                    Input::FuseMounted { client, root, uid, gid, passthrough }
                }
                Event::Fuse(client, data) => Input::Fuse { client, data },
                Event::Bytes(client, data) => Input::Bytes { client, data },
                Event::Eof(client) => {
                    tracing::debug!(%client, "end of connection");
                    Input::Eof { client }
                }
                Event::Died(client) => {
                    tracing::debug!(%client, "process gone");
                    Input::Died { client }
                }
                Event::UpstreamBytes(data) => Input::UpstreamBytes { data },
                Event::UpstreamEof => Input::UpstreamEof,
                Event::EffectDone(id, result) => Input::EffectDone { id, result },
                Event::ProviderDone(call) => {
                    self.provider_tasks.remove(&call);
                    // Nothing when a cancel settled the call first.
                    let Some(result) = self.inflight.take(call) else { continue };
                    Input::ProviderDone { call, result }
                }
            };
            let read_by = match input {
                Input::Bytes { client, .. } => Some(client),
                _ => None,
            };
            let fuse_by = match input {
                Input::Fuse { client, .. } => Some(client),
                _ => None,
            };
            self.feed(input);
            // A mount's next request is read once the machine has room.
            if let Some(dev) =
                fuse_by.filter(|c| self.proxy.fuse_ready(*c)).and_then(|c| self.devices.get(&c))
            {
                dev.ready.notify_one();
            }
            // Admitted or refused by now; never held past its input.
            self.accepted = None;
            // Answered (queued for the writer, which runs first): the
            // reader may read again.
            if let Some(conn) = read_by.and_then(|c| self.conns.get(&c)) {
                conn.handled.notify_one();
            }
        }
    }

    /// Handle events until `done` holds, then end every session still
    /// open and handle events until all are finished.
    ///
    /// The loop runs as a task of its own, not in the future the runtime
    /// blocks on: a connection's reader then wakes it onto the thread's run
    /// queue, where waking the blocked-on future makes the scheduler poll
    /// the reactor (an `epoll_wait`) before it runs, once per batch of
    /// requests read.
    pub async fn run_to_end(
        mut self,
        done: impl FnMut(&Session) -> bool + Send + 'static,
    ) -> Result<Session, tokio::task::JoinError> {
        tokio::spawn(async move {
            self.run_until(done).await;
            self.depart_all();
            self.run_until(Session::all_finished).await;
            self
        })
        .await
    }

    /// Flush what is queued for the upstream proxy (cleanup closes must
    /// reach it before this process exits).
    pub async fn shutdown(mut self) -> (FsProxy, HostFs, Option<Box<dyn Observer>>) {
        self.stop_listening();
        self.end_provider_calls();
        // A pending read of stdin ends here, having read nothing.
        self.stdin = None;
        if let Some(t) = &mut self.broker.telemetry {
            t.finish();
        }
        if let Some(a) = self.audit.take() {
            a.finish();
        }
        for (_, conn) in std::mem::take(&mut self.conns) {
            conn.reader.abort();
            conn.writer.abort();
        }
        if let Some(up) = self.upstream.take() {
            up.reader.abort();
            drop(up.tx);
            let _ = up.writer.await;
        }
        (self.proxy, self.host, self.observer)
    }

    /// Drop every provider call still running (the session is over: nobody
    /// is left to answer) and tell the broker, so each gets its telemetry
    /// record.
    pub fn end_provider_calls(&mut self) {
        for (_, task) in std::mem::take(&mut self.provider_tasks) {
            task.abort();
        }
        for (call, result) in self.inflight.drain() {
            let result = result.unwrap_or_else(|| ProviderResult::error(None, SESSION_ENDED));
            self.feed(Input::ProviderDone { call, result });
        }
    }

    fn start_provider(&mut self, call: CallId, request: ProviderRequest) -> Option<Input> {
        let Some(provider) = self.broker.provider.clone() else {
            let message = "no provider is configured".to_string();
            return Some(Input::ProviderDone { call, result: ProviderResult::error(None, message) });
        };
        let events = self.events_tx.clone();
        let inflight = self.inflight.clone();
        inflight.start(call);
        let task = tokio::spawn(async move {
            let result = provider.complete(request).await;
            if inflight.complete(call, result) {
                let _ = events.send(Event::ProviderDone(call)).await;
            }
        });
        // A call id the broker reuses would be a core bug; the older task
        // is dropped rather than leaked.
        if let Some(old) = self.provider_tasks.insert(call, task.abort_handle()) {
            old.abort();
        }
        None
    }

    fn cancel_provider(&mut self, call: CallId) -> Option<Input> {
        let task = self.provider_tasks.remove(&call);
        let result = match self.inflight.cancel(call) {
            // Finished before the cancel: its usage was billed, so its real
            // result is the one to report (its event will find nothing).
            Cancel::Finished(result) => result,
            Cancel::Running => {
                // Dropping the task drops the HTTP request and closes its
                // connection: the provider-side cancel.
                if let Some(task) = task {
                    task.abort();
                }
                ProviderResult::error(None, CANCELLED)
            }
            Cancel::Unknown => return None,
        };
        Some(Input::ProviderDone { call, result })
    }

    /// Hand one input to the machine and carry out everything it asks for.
    /// File effects run inline and their results go straight back in, in
    /// the order the effects were issued, so a request on a local file is
    /// answered within one call.
    fn feed(&mut self, input: Input) {
        let mut work = VecDeque::from([input]);
        while let Some(input) = work.pop_front() {
            let now = self.now();
            if let Some(obs) = &mut self.observer {
                obs.input(now, &input);
            }
            self.proxy.handle(now, input);
            while let Some(out) = self.proxy.poll_output() {
                if let Some(obs) = &mut self.observer {
                    obs.output(&out);
                }
                if let Some(next) = self.carry_out(out) {
                    // What the effect's walk met, before its result.
                    if let Input::EffectDone { id, .. } = &next {
                        for hit in self.host.take_hits() {
                            work.push_back(Input::Guarded { id: *id, hit });
                        }
                    }
                    work.push_back(next);
                }
            }
            if let Some(name) = self.proxy.take_virtual_notice() {
                eprintln!(
                    "airlock: note: {name} is outside every allowed root, so it is kept in memory (the \
                     session's virtual namespace) and never written to disk; allow its directory with \
                     --allow-rw to write it there (this is said once; --audit marks each such record \
                     \"virtual\": true)"
                );
            }
        }
    }

    fn carry_out(&mut self, out: Output) -> Option<Input> {
        match out {
            Output::Send { client, data } => {
                if let Some(conn) = self.conns.get(&client) {
                    conn.send(data);
                }
                None
            }
            Output::FuseReply { client, data } => {
                if let Some(dev) = self.devices.get(&client) {
                    dev.reply(&data);
                }
                None
            }
            Output::Close { client } if self.devices.contains_key(&client) => {
                tracing::debug!(%client, "mount ended; its files released");
                self.devices.remove(&client);
                None
            }
            Output::Close { client } => {
                tracing::debug!(%client, open_handles = self.proxy.open_handles(), "session ended; handles released");
                if let Some(conn) = self.conns.remove(&client) {
                    conn.reader.abort();
                    // The writer ends once it has flushed what is queued
                    // (the error response that ended a session, say).
                    drop(conn.tx);
                }
                self.passed.remove(&client);
                None
            }
            Output::DropDescriptor { client, newest } => {
                if let Some(q) = self.passed.get_mut(&client) {
                    let fd = if newest { q.pop_back() } else { q.pop_front() };
                    tracing::debug!(%client, dropped = fd.is_some(), "passed descriptor refused");
                }
                None
            }
            Output::Attach { from, client } => {
                let fd = self.passed.get_mut(&from).and_then(VecDeque::pop_front);
                match fd.map(attach_stream) {
                    Some(Ok(stream)) => {
                        tracing::debug!(%from, %client, "attached a connection of its own");
                        self.conns.insert(client, spawn_unix_conn(stream, client, self.events_tx.clone()));
                        None
                    }
                    // Not a usable socket: the new client is gone at once.
                    Some(Err(e)) => {
                        tracing::warn!(%from, "attach: passed descriptor unusable: {e}");
                        Some(Input::Eof { client })
                    }
                    None => Some(Input::Eof { client }),
                }
            }
            Output::Admit { client } => match self.accepted.take() {
                Some(stream) => {
                    tracing::debug!(%client, "admitted a connection through the session socket");
                    self.conns.insert(client, spawn_unix_conn(stream, client, self.events_tx.clone()));
                    None
                }
                None => Some(Input::Eof { client }),
            },
            Output::Dismiss => {
                tracing::debug!("session socket: connection with an unknown secret closed");
                drop(self.accepted.take());
                None
            }
            Output::Refuse { data } => {
                if let Some(mut stream) = self.accepted.take() {
                    // Told why, then closed; a peer that never reads
                    // holds nothing past the timeout.
                    tokio::spawn(async move {
                        let say = async {
                            let _ = stream.write_all(&data).await;
                            let _ = stream.shutdown().await;
                        };
                        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, say).await;
                    });
                }
                None
            }
            Output::StartProvider { call, request, deadline: _ } => {
                tracing::debug!(%call, model = %request.model, max_tokens = request.max_tokens, "provider call");
                self.start_provider(call, request)
            }
            Output::CancelProvider { call } => {
                tracing::debug!(%call, "provider call dropped");
                self.cancel_provider(call)
            }
            Output::Audit { record } => {
                if let Some(a) = &mut self.audit {
                    a.write(&record);
                }
                None
            }
            Output::Telemetry { record } => {
                if let Some(t) = &mut self.broker.telemetry {
                    t.write(&record);
                }
                None
            }
            Output::BudgetPassed { initial, charged } => {
                eprintln!(
                    "airlock: warning: the LLM budget of {initial} is spent: {charged} charged so far; \
                     calls go on, since broker.enforce_budget is off"
                );
                None
            }
            Output::SendUpstream { data } => {
                if let Some(up) = &self.upstream {
                    up.send(data);
                }
                None
            }
            Output::Effect { id, effect } => match effect {
                Effect::ReadStdin { max } => {
                    // Never tokio's stdin: its blocking read would hold the
                    // runtime (and airlock's exit) until stdin has bytes.
                    if self.stdin.is_none() {
                        match StdinReader::start(self.events_tx.clone()) {
                            Ok(reader) => self.stdin = Some(reader),
                            Err(e) => {
                                let message = format!("reading stdin: {e}");
                                let result = EffectResult::Failed { kind: FsErrorKind::Other, message };
                                return Some(Input::EffectDone { id, result });
                            }
                        }
                    }
                    if let Some(reader) = &self.stdin {
                        reader.read(id, max);
                    }
                    None
                }
                Effect::WriteStdio { stream, data } => {
                    let events = self.events_tx.clone();
                    tokio::spawn(async move {
                        let len = data.len() as u64;
                        let res = match stream {
                            StdStream::Stdout => write_flush(tokio::io::stdout(), &data).await,
                            StdStream::Stderr => write_flush(tokio::io::stderr(), &data).await,
                        };
                        let result = match res {
                            Ok(()) => EffectResult::Written { written: len },
                            Err(e) => {
                                EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() }
                            }
                        };
                        let _ = events.send(Event::EffectDone(id, result)).await;
                    });
                    None
                }
                Effect::Backing { client, file } => {
                    let result = match (self.devices.get(&client), self.host.fd(file)) {
                        (Some(dev), Some(fd)) => match dev.register_backing(fd) {
                            Ok(id) => EffectResult::Backing { id },
                            Err(e) => {
                                EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() }
                            }
                        },
                        _ => EffectResult::Failed {
                            kind: FsErrorKind::Other,
                            message: "no mount or no open file to back".into(),
                        },
                    };
                    Some(Input::EffectDone { id, result })
                }
                Effect::Unback { client, id: backing } => {
                    let result = match self.devices.get(&client).map(|d| d.drop_backing(backing)) {
                        Some(Ok(())) => EffectResult::Done,
                        Some(Err(e)) => {
                            EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() }
                        }
                        None => EffectResult::Failed {
                            kind: FsErrorKind::Other,
                            message: "the mount is gone".into(),
                        },
                    };
                    Some(Input::EffectDone { id, result })
                }
                Effect::DrawSecret => {
                    let result = match crate::session_socket::draw_secret() {
                        Ok(secret) => EffectResult::Secret { secret },
                        Err(e) => EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() },
                    };
                    Some(Input::EffectDone { id, result })
                }
                file_effect => Some(Input::EffectDone { id, result: self.host.execute(file_effect) }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A stream that takes at most `step` bytes per write, across the
    /// buffers of a vectored one.
    struct Trickle {
        got: Vec<u8>,
        step: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut taken = 0;
            for buf in bufs {
                let n = buf.len().min(self.step - taken);
                self.got.extend_from_slice(&buf[..n]);
                taken += n;
            }
            Poll::Ready(Ok(taken))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write(batch: &[Vec<u8>], step: usize) -> (std::io::Result<()>, Trickle) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut w = Trickle { got: Vec::new(), step, calls: 0 };
        let res = rt.block_on(write_batch(&mut w, batch));
        (res, w)
    }

    #[test]
    fn a_batch_leaves_whole_and_in_order_through_short_writes() {
        let batch =
            vec![b"abc".to_vec(), Vec::new(), b"defghij".to_vec(), b"k".to_vec(), (0..=255).collect()];
        for step in [1, 2, 5, 7, 4096] {
            let (res, w) = write(&batch, step);
            res.expect("written");
            assert_eq!(w.got, batch.concat(), "step {step}");
        }
        assert_eq!(write(&batch, 4096).1.calls, 1, "one write when the stream takes it all");
        // More buffers than one vectored write carries: two writes.
        let many: Vec<Vec<u8>> = (0..MAX_WRITE_BATCH as u8 + 10).map(|i| vec![i; 3]).collect();
        let (res, w) = write(&many, 1 << 20);
        res.expect("written");
        assert_eq!((w.got, w.calls), (many.concat(), 2));
    }

    #[test]
    fn a_stream_that_takes_nothing_fails_the_batch() {
        let (res, w) = write(&[b"abc".to_vec()], 0);
        assert_eq!(res.map_err(|e| e.kind()), Err(std::io::ErrorKind::WriteZero));
        assert!(w.got.is_empty());
    }
}
