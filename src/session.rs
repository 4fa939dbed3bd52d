//! The shell's event loop: moves bytes, exits and effect results into the
//! FS proxy machine and carries its outputs out to sockets, files and stdio.
//!
//! It makes no protocol decision of its own. It is generic over the
//! transport (anything `AsyncRead + AsyncWrite`), so the same loop runs over
//! real socketpairs in `airlock run`/`serve` and over turmoil's simulated
//! network in the simulator.

use crate::hostfs::HostFs;
use airlock_core::fsproxy::{Effect, EffectId, EffectResult, FsErrorKind, FsProxy, Input, Output, StdStream};
use airlock_core::handles::ClientId;
use airlock_core::time::Instant;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

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
    /// The process behind a client is gone.
    Died(ClientId),
}

/// Flow control between a connection's writer and its reader.
#[derive(Default)]
struct Backlog {
    bytes: AtomicUsize,
    drained: Notify,
}

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    backlog: Arc<Backlog>,
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
    departed: BTreeMap<ClientId, ()>,
    upstream: Option<Conn>,
    observer: Option<Box<dyn Observer>>,
}

fn spawn_conn<T>(
    stream: T,
    on_bytes: impl Fn(Vec<u8>) -> Event + Send + 'static,
    on_eof: Event,
    events: mpsc::Sender<Event>,
) -> Conn
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let backlog = Arc::new(Backlog::default());
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let bl = backlog.clone();
    let writer = tokio::spawn(async move {
        while let Some(data) = rx.recv().await {
            let ok = wr.write_all(&data).await.is_ok() && wr.flush().await.is_ok();
            bl.bytes.fetch_sub(data.len(), Ordering::AcqRel);
            bl.drained.notify_waiters();
            if !ok {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    let bl = backlog.clone();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0; READ_CHUNK];
        loop {
            while bl.bytes.load(Ordering::Acquire) > MAX_UNSENT_BYTES {
                let drained = bl.drained.notified();
                if bl.bytes.load(Ordering::Acquire) <= MAX_UNSENT_BYTES {
                    break;
                }
                drained.await;
            }
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
    Conn { tx, backlog, reader, writer }
}

impl Conn {
    fn send(&self, data: Vec<u8>) {
        self.backlog.bytes.fetch_add(data.len(), Ordering::AcqRel);
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
            departed: BTreeMap::new(),
            upstream: None,
            observer,
        }
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

    /// Forward to an upstream proxy over `stream`.
    pub fn set_upstream<T>(&mut self, stream: T)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.upstream =
            Some(spawn_conn(stream, Event::UpstreamBytes, Event::UpstreamEof, self.events_tx.clone()));
    }

    /// Whether `client` has left and everything it held is released.
    pub fn finished(&self, client: ClientId) -> bool {
        self.departed.contains_key(&client) && self.proxy.quiescent()
    }

    /// Handle events until `done` holds.
    pub async fn run_until(&mut self, mut done: impl FnMut(&Session) -> bool) {
        while !done(self) {
            let Some(ev) = self.events.recv().await else { break };
            let input = match ev {
                Event::Bytes(client, data) => Input::Bytes { client, data },
                Event::Eof(client) => Input::Eof { client },
                Event::Died(client) => Input::Died { client },
                Event::UpstreamBytes(data) => Input::UpstreamBytes { data },
                Event::UpstreamEof => Input::UpstreamEof,
                Event::EffectDone(id, result) => Input::EffectDone { id, result },
            };
            self.feed(input);
        }
    }

    /// Flush what is queued for the upstream proxy (cleanup closes must
    /// reach it before this process exits).
    pub async fn shutdown(mut self) -> (FsProxy, HostFs, Option<Box<dyn Observer>>) {
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
                if let Some((id, result)) = self.carry_out(out) {
                    work.push_back(Input::EffectDone { id, result });
                }
            }
        }
    }

    fn carry_out(&mut self, out: Output) -> Option<(EffectId, EffectResult)> {
        match out {
            Output::Send { client, data } => {
                if let Some(conn) = self.conns.get(&client) {
                    conn.send(data);
                }
                None
            }
            Output::Close { client } => {
                if let Some(conn) = self.conns.remove(&client) {
                    conn.reader.abort();
                    // The writer ends once it has flushed what is queued
                    // (the error response that ended a session, say).
                    drop(conn.tx);
                }
                self.departed.insert(client, ());
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
                    let events = self.events_tx.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0; max as usize];
                        let result = match tokio::io::stdin().read(&mut buf).await {
                            Ok(n) => {
                                buf.truncate(n);
                                EffectResult::Data { eof: n == 0, data: buf }
                            }
                            Err(e) => {
                                EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() }
                            }
                        };
                        let _ = events.send(Event::EffectDone(id, result)).await;
                    });
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
                file_effect => Some((id, self.host.execute(file_effect))),
            },
        }
    }
}
