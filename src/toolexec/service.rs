//! The HTTP service: hyper on one connection, and one driver task per
//! request that runs the core's `Exchange` against a [`Runner`]. The
//! production runner starts processes (`super::process`); tests and fuzz
//! targets can bring their own.

use super::body::{ChanBody, Frames};
use airlock_core::time::Instant;
use airlock_core::toolexec::{
    Config, Exchange, ExitStatus, Input, Output, RequestHead, Response, Signal, SpawnError, SpawnRequest,
};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, watch, Notify};

/// Starts tools. `spawn` is synchronous so that nothing else runs between
/// the decision and its result.
pub trait Runner: Send + Sync + 'static {
    type Process: ToolProcess;
    type Output: ToolOutput;
    fn spawn(&self, request: &SpawnRequest) -> Result<(Self::Process, Self::Output), SpawnError>;
}

/// A started tool: reaped by `wait`, signalled as a group.
pub trait ToolProcess: Send + 'static {
    /// Resolves once the tool has exited and been reaped.
    fn wait(&mut self) -> impl Future<Output = ExitStatus> + Send;
    fn signal(&self, signal: Signal);
}

/// The tool's stdout+stderr.
pub trait ToolOutput: Send + 'static {
    /// One read of at most `max` bytes; empty at EOF.
    fn read(&mut self, max: usize) -> impl Future<Output = std::io::Result<Vec<u8>>> + Send;
    /// At most `max` bytes of what the pipe holds now, without waiting;
    /// empty at EOF or when it holds nothing.
    fn read_now(&mut self, max: usize) -> std::io::Result<Vec<u8>>;
}

/// Everything a connection needs: the core's config, the runner, the
/// header timeout and the shutdown signal.
pub struct Service<R: Runner> {
    config: Arc<Config>,
    runner: R,
    header_timeout: Duration,
    shutdown: watch::Receiver<bool>,
    started: std::time::Instant,
}

impl<R: Runner> Service<R> {
    pub fn new(config: Config, runner: R, header_timeout: Duration, shutdown: watch::Receiver<bool>) -> Self {
        Service {
            config: Arc::new(config),
            runner,
            header_timeout,
            shutdown,
            started: std::time::Instant::now(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// Serve one connection (one request: every answer closes it).
    pub async fn serve_connection<IO>(self: &Arc<Self>, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        serve_connection(io, self.clone()).await
    }
}

/// What a read of the tool's pipe tells the core. At its end (or on an
/// error, logged) the pipe is dropped.
fn read_input<P>(read: std::io::Result<Vec<u8>>, pipe: &mut Option<P>) -> Input {
    match read {
        Ok(bytes) if !bytes.is_empty() => Input::ToolOutput(bytes),
        Ok(_) => {
            *pipe = None;
            Input::ToolEof
        }
        Err(e) => {
            tracing::warn!("toolexec: reading tool output: {e}");
            *pipe = None;
            Input::ToolEof
        }
    }
}

async fn serve_connection<IO, R>(io: IO, shared: Arc<Service<R>>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    R: Runner,
{
    let got_head = Arc::new(Notify::new());
    let svc_shared = shared.clone();
    let svc_got_head = got_head.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        svc_got_head.notify_one();
        let shared = svc_shared.clone();
        async move { Ok::<_, Infallible>(handle_request(req, shared).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .title_case_headers(true)
        .keep_alive(false)
        .half_close(false)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(shared.header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(HeadCase::new(io)), service);
    tokio::pin!(conn);
    let mut shutdown = shared.shutdown.clone();
    // Until a complete head arrives, the connection may be closed by the
    // header timeout or by shutdown; afterwards it runs to its end (the
    // request driver handles shutdown itself).
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::info!("toolexec: connection: {e}");
            }
            return;
        }
        _ = got_head.notified() => {}
        _ = tokio::time::sleep(shared.header_timeout) => {
            tracing::info!("toolexec: request head not complete within the header timeout");
            return;
        }
        _ = shutdown.wait_for(|s| *s) => return,
    }
    if let Err(e) = conn.await {
        tracing::info!("toolexec: connection: {e}");
    }
}

fn head_of(req: &hyper::Request<Incoming>) -> RequestHead {
    RequestHead {
        method: req.method().as_str().to_owned(),
        path: req.uri().path().to_owned(),
        headers: req.headers().iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect(),
        http11: req.version() == hyper::Version::HTTP_11,
    }
}

fn to_hyper(r: Response, body: ChanBody) -> hyper::Response<ChanBody> {
    let mut builder = hyper::Response::builder().status(r.status);
    for (name, value) in r.headers {
        builder = builder.header(name, value);
    }
    builder.body(body).unwrap_or_else(|_| {
        let mut fallback = hyper::Response::new(ChanBody::full(Bytes::new()));
        *fallback.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        fallback
    })
}

/// The service: hand the request to its driver and wait for the head of the
/// answer. If hyper drops this future (the client left), the driver sees
/// the answer channel close.
async fn handle_request<R: Runner>(
    req: hyper::Request<Incoming>,
    shared: Arc<Service<R>>,
) -> hyper::Response<ChanBody> {
    let (head_tx, head_rx) = oneshot::channel();
    tokio::spawn(drive(req, shared, head_tx));
    match head_rx.await {
        Ok(resp) => resp,
        // The driver ended without an answer: only when the client is gone
        // (or half-closed, and may still read this). Every error answer
        // carries the exit code the shim exits with.
        Err(_) => to_hyper(
            Response {
                status: 500,
                headers: vec![("X-Exit-Code", airlock_core::toolexec::EXIT_CODE_ERROR.to_string())],
                body: Vec::new(),
            },
            ChanBody::full(Bytes::new()),
        ),
    }
}

/// Runs one exchange: every decision is the core's, this loop only carries
/// them out and reports what happened.
async fn drive<R: Runner>(
    req: hyper::Request<Incoming>,
    shared: Arc<Service<R>>,
    head_tx: oneshot::Sender<hyper::Response<ChanBody>>,
) {
    let mut x = Exchange::new(shared.config.clone(), shared.now());
    let head = head_of(&req);
    let mut body = Some(req.into_body());
    let mut reading_body = false;
    let mut head_tx = Some(head_tx);
    let mut frames: Option<Frames> = None;
    let mut running: Option<R::Process> = None;
    let mut read_credit: Option<usize> = None;
    let mut pipe: Option<R::Output> = None;
    let mut shutdown = shared.shutdown.clone();
    let mut shutdown_fed = false;
    let mut exited = false;
    x.handle(shared.now(), Input::Head(head));
    loop {
        while let Some(output) = x.poll_output() {
            match output {
                Output::ReadBody => reading_body = true,
                Output::Respond(mut r) => {
                    reading_body = false;
                    tracing::info!("toolexec: answered {}", r.status);
                    // A v1 body can be --max-buffered bytes: moved, not copied.
                    let body = Bytes::from(std::mem::take(&mut r.body));
                    let resp = to_hyper(r, ChanBody::full(body));
                    if let Some(tx) = head_tx.take() {
                        let _ = tx.send(resp);
                    }
                }
                Output::Spawn(request) => {
                    tracing::info!("toolexec: {} with {} argument(s)", request.tool, request.args.len());
                    let result = match shared.runner.spawn(&request) {
                        Ok((r, p)) => {
                            running = Some(r);
                            pipe = Some(p);
                            Ok(())
                        }
                        Err(e) => Err(e),
                    };
                    x.handle(shared.now(), Input::Spawned(result));
                }
                Output::ReadOutput { max } => read_credit = Some(max),
                Output::ReadNow { max } => {
                    // Replaces the waiting read (dropping its future loses
                    // nothing: bytes are taken only by a completed read).
                    read_credit = None;
                    let read = match pipe.as_mut() {
                        Some(p) => p.read_now(max),
                        None => Ok(Vec::new()),
                    };
                    x.handle(shared.now(), read_input(read, &mut pipe));
                }
                Output::SendHead(r) => {
                    let (body, f) = ChanBody::channel();
                    frames = Some(f);
                    if let Some(tx) = head_tx.take() {
                        let _ = tx.send(to_hyper(r, body));
                    }
                }
                Output::SendChunk(bytes) => {
                    if let Some(f) = &frames {
                        f.data(Bytes::from(bytes));
                    }
                }
                Output::Finish { exit_code } => {
                    if let Some(f) = frames.take() {
                        f.finish(exit_code);
                    }
                }
                Output::Signal(sig) => {
                    if let Some(r) = &running {
                        r.signal(sig);
                    }
                }
                Output::Done => return,
            }
        }
        let deadline = x.poll_timeout();
        let sleep_until = deadline.map(|d| {
            let now = shared.now();
            tokio::time::Instant::now() + d.saturating_duration_since(now)
        });
        let answer_pending = head_tx.is_some();
        tokio::select! {
            frame = async { body.as_mut().expect("body present while reading").frame().await }, if reading_body && body.is_some() => {
                match frame {
                    Some(Ok(f)) => {
                        if let Ok(data) = f.into_data() {
                            x.handle(shared.now(), Input::Body(data.to_vec()));
                        }
                    }
                    Some(Err(_)) => x.handle(shared.now(), Input::ClientGone),
                    None => {
                        reading_body = false;
                        body = None;
                        x.handle(shared.now(), Input::BodyEnd);
                    }
                }
            }
            read = async { pipe.as_mut().expect("pipe while reading").read(read_credit.unwrap_or(1)).await }, if read_credit.is_some() && pipe.is_some() => {
                read_credit = None;
                x.handle(shared.now(), read_input(read, &mut pipe));
            }
            status = async { running.as_mut().expect("running while waiting").wait().await }, if running.is_some() && !exited => {
                exited = true;
                x.handle(shared.now(), Input::ToolExited(status));
            }
            took = async { frames.as_mut().expect("frames while streaming").took().await }, if frames.is_some() => {
                match took {
                    Some(n) => x.handle(shared.now(), Input::ClientTook(n)),
                    None => {
                        frames = None;
                        x.handle(shared.now(), Input::ClientGone);
                    }
                }
            }
            _ = async { head_tx.as_mut().expect("answer pending").closed().await }, if answer_pending => {
                head_tx = None;
                x.handle(shared.now(), Input::ClientGone);
            }
            _ = async { tokio::time::sleep_until(sleep_until.expect("deadline")).await }, if sleep_until.is_some() => {
                x.handle_timeout(shared.now());
            }
            _ = shutdown.wait_for(|s| *s), if !shutdown_fed => {
                shutdown_fed = true;
                x.handle(shared.now(), Input::Shutdown);
            }
        }
    }
}

/// hyper title-cases every header name, which turns the seed's
/// `WWW-Authenticate` into `Www-Authenticate` and offers no per-name
/// exception on the server side. The head is patched on its way out; the
/// spelling has the same length, so byte counts are unchanged.
const TITLE_CASED: &[u8] = b"\r\nWww-Authenticate:";
const SPELLED: &[u8] = b"\r\nWWW-Authenticate:";

fn patch_head<'a>(buf: &'a [u8], in_head: &mut bool, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    if !*in_head {
        return buf;
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let head = &buf[..head_end.unwrap_or(buf.len())];
    if head_end.is_some() {
        *in_head = false;
    }
    match head.windows(TITLE_CASED.len()).position(|w| w == TITLE_CASED) {
        Some(at) => {
            scratch.clear();
            scratch.extend_from_slice(buf);
            scratch[at..at + SPELLED.len()].copy_from_slice(SPELLED);
            scratch
        }
        None => buf,
    }
}

/// The connection's byte stream with the response head patched (see
/// `TITLE_CASED`).
struct HeadCase<IO> {
    io: IO,
    /// Still inside the response head (one request per connection, so only
    /// the first head matters).
    in_head: bool,
}

impl<IO> HeadCase<IO> {
    fn new(io: IO) -> Self {
        HeadCase { io, in_head: true }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for HeadCase<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeadCase<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let mut in_head = this.in_head;
        let mut scratch = Vec::new();
        let out = patch_head(buf, &mut in_head, &mut scratch);
        let r = Pin::new(&mut this.io).poll_write(cx, out);
        // The head ends for good only once its last byte was written.
        if let Poll::Ready(Ok(n)) = r {
            if !in_head && buf[..n.min(buf.len())].windows(4).any(|w| w == b"\r\n\r\n") {
                this.in_head = false;
            }
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::patch_head;

    #[test]
    fn only_the_head_is_patched() {
        let wire = b"HTTP/1.1 401 Unauthorized\r\nWww-Authenticate: Bearer\r\n\r\n\r\nWww-Authenticate: body";
        let (mut in_head, mut scratch) = (true, Vec::new());
        let out = patch_head(wire, &mut in_head, &mut scratch).to_vec();
        assert_eq!(
            out,
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\n\r\n\r\nWww-Authenticate: body"
        );
        assert!(!in_head);
        let (mut in_head, mut scratch) = (false, Vec::new());
        assert_eq!(patch_head(wire, &mut in_head, &mut scratch), wire);
    }
}
