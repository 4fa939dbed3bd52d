//! The FS proxy client: what a child uses to reach files (and the LLM
//! broker) through airlock.
//!
//! Blocking and dependency-free on purpose: it runs inside children, often
//! small shell helpers, and talks over the descriptor named by `AIRLOCK_FD`.

use airlock_core::codec::frame::{self, FrameDecoder};
use airlock_core::fsproxy::wire::{self, ErrorCode, Failure, Mode, Op, OpKind, Request, Success};
use airlock_core::handles::Handle;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

mod broker;
pub use broker::MAX_ANSWER_FRAME;

/// The environment variable naming the proxy descriptor in a child.
pub const FD_ENV: &str = "AIRLOCK_FD";
/// The descriptor a child gets when `AIRLOCK_FD` is unset.
pub const DEFAULT_FD: RawFd = 3;
/// Bytes per read or write request (the seed's read maximum).
pub const CHUNK: usize = 4096;
/// Requests a streaming transfer keeps in flight before waiting.
pub const WINDOW: usize = 32;

#[derive(Debug)]
pub enum ClientError {
    /// The proxy answered with an error.
    Proxy(Failure),
    Io(io::Error),
    /// The proxy's answer could not be understood.
    BadResponse(String),
}

impl ClientError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Proxy(f) => Some(f.code),
            _ => None,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Proxy(e) => write!(f, "{}: {}", e.code, e.message),
            ClientError::Io(e) => write!(f, "proxy connection: {e}"),
            ClientError::BadResponse(e) => write!(f, "bad response from proxy: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// Take the descriptor named by `AIRLOCK_FD` (default 3).
fn shared_fd() -> Result<OwnedFd, ClientError> {
    let fd = match std::env::var(FD_ENV) {
        Ok(v) => v.trim().parse::<RawFd>().map_err(|_| {
            ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{FD_ENV}={v:?} is not a descriptor"),
            ))
        })?,
        Err(_) => DEFAULT_FD,
    };
    // SAFETY: the borrow lives only for this fcntl, which answers EBADF
    // harmlessly when fd is not open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if rustix::io::fcntl_getfd(borrowed).is_err() {
        return Err(ClientError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!("descriptor {fd} is not open: is this process running under `airlock run`?"),
        )));
    }
    // SAFETY: fd is open (checked above) and the client is its only user in
    // this process: AIRLOCK_FD is inherited for exactly this purpose.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub struct Client {
    conn: File,
    decoder: FrameDecoder,
    next_id: u64,
    /// Requests sent and not yet answered, oldest first.
    inflight: VecDeque<(String, OpKind)>,
    buf: Vec<u8>,
}

impl Client {
    /// Connect with a connection of this process's own: pass a fresh
    /// socket over the shared descriptor (`attach`) and talk over it, so
    /// other processes using the same descriptor at the same time (the two
    /// ends of a shell pipeline, say) never see each other's answers.
    pub fn connect() -> Result<Self, ClientError> {
        let shared = shared_fd()?;
        Self::attach_via(shared.as_fd())
    }

    /// [`Client::connect`] over `shared`, a proxy connection this process
    /// keeps using for something else (a nested airlock's upstream).
    pub fn attach_via(shared: BorrowedFd<'_>) -> Result<Self, ClientError> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let id = "attach".to_owned();
        let request = frame::encode(&wire::encode_request(&Request { id: id.clone(), op: Op::Attach }));
        let fds = [theirs.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut ancillary = rustix::net::SendAncillaryBuffer::new(&mut space);
        ancillary.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
        // One small message: the kernel queues it whole, so it cannot
        // interleave with another process's request on the shared socket.
        let sent = rustix::net::sendmsg(
            shared,
            &[io::IoSlice::new(&request)],
            &mut ancillary,
            rustix::net::SendFlags::NOSIGNAL,
        )
        .map_err(io::Error::from)?;
        if sent != request.len() {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::WriteZero,
                "attach request was cut short",
            )));
        }
        drop(theirs);
        let mut client = Self::new(File::from(OwnedFd::from(ours)));
        client.inflight.push_back((id, OpKind::Attach));
        client.recv()?;
        Ok(client)
    }

    /// The connection itself, once no request is in flight (a nested
    /// airlock takes its attached connection as its upstream).
    pub fn into_file(self) -> File {
        self.conn
    }

    /// Use the descriptor named by `AIRLOCK_FD` (default 3) directly. Only
    /// safe while no other process uses it at the same time.
    pub fn shared() -> Result<Self, ClientError> {
        Ok(Self::new(File::from(shared_fd()?)))
    }

    /// A client over an already-connected stream.
    pub fn new(conn: File) -> Self {
        Client {
            conn,
            // Answers, not requests: an LLMCMD result may be far larger
            // than any request the proxy accepts.
            decoder: FrameDecoder::new(MAX_ANSWER_FRAME),
            next_id: 1,
            inflight: VecDeque::new(),
            buf: vec![0; 64 * 1024],
        }
    }

    /// Accept answers of up to `max` bytes (the pager's are sized to the
    /// session's `--max-frame`, which may be above the default). Call
    /// before the first request.
    pub fn set_max_frame(&mut self, max: usize) {
        self.decoder = FrameDecoder::new(max);
    }

    /// Send a request without waiting for its answer.
    pub fn send(&mut self, op: Op) -> Result<(), ClientError> {
        let id = self.next_id.to_string();
        self.next_id += 1;
        let kind = OpKind::from(&op);
        let payload = wire::encode_request(&Request { id: id.clone(), op });
        self.conn.write_all(&frame::encode(&payload))?;
        self.inflight.push_back((id, kind));
        Ok(())
    }

    /// The answer to the oldest request in flight.
    pub fn recv(&mut self) -> Result<Success, ClientError> {
        let Some((id, kind)) = self.inflight.pop_front() else {
            return Err(ClientError::BadResponse("no request in flight".into()));
        };
        let payload = loop {
            match self.decoder.next_frame() {
                Ok(Some(p)) => break p,
                Ok(None) => {}
                Err(e) => return Err(ClientError::BadResponse(e.to_string())),
            }
            let n = self.conn.read(&mut self.buf)?;
            if n == 0 {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "proxy closed the connection",
                )));
            }
            self.decoder.push(&self.buf[..n]);
        };
        let resp = wire::parse_response(&payload, kind).map_err(ClientError::BadResponse)?;
        if resp.id.as_deref() != Some(id.as_str()) {
            return Err(ClientError::BadResponse(format!("expected the answer to {id}, got {:?}", resp.id)));
        }
        resp.outcome.map_err(ClientError::Proxy)
    }

    fn call(&mut self, op: Op) -> Result<Success, ClientError> {
        self.send(op)?;
        self.recv()
    }

    pub fn open(&mut self, path: &str, mode: Mode) -> Result<Handle, ClientError> {
        match self.call(Op::Open { path: path.to_owned(), mode, scope: None })? {
            Success::Opened { handle } => Ok(handle),
            other => Err(ClientError::BadResponse(format!("open answered {other:?}"))),
        }
    }

    /// Up to `max` bytes; empty at end of file.
    pub fn read(&mut self, h: Handle, max: u32) -> Result<Vec<u8>, ClientError> {
        match self.call(Op::Read { h, max })? {
            Success::Data { data, .. } => Ok(data),
            other => Err(ClientError::BadResponse(format!("read answered {other:?}"))),
        }
    }

    pub fn write(&mut self, h: Handle, data: &[u8]) -> Result<u64, ClientError> {
        match self.call(Op::Write { h, data: data.to_vec() })? {
            Success::Written { written } => Ok(written),
            other => Err(ClientError::BadResponse(format!("write answered {other:?}"))),
        }
    }

    pub fn close(&mut self, h: Handle) -> Result<(), ClientError> {
        self.call(Op::Close { h }).map(|_| ())
    }

    /// Copy the whole of `path` to `out`, keeping [`WINDOW`] reads in flight.
    pub fn cat(&mut self, path: &str, out: &mut impl Write) -> Result<u64, ClientError> {
        let h = self.open(path, Mode::Read)?;
        let result = self.copy_out(h, out);
        let closed = self.close(h);
        let n = result?;
        closed?;
        Ok(n)
    }

    fn copy_out(&mut self, h: Handle, out: &mut impl Write) -> Result<u64, ClientError> {
        let mut total = 0u64;
        let mut eof = false;
        for _ in 0..WINDOW {
            self.send(Op::Read { h, max: CHUNK as u32 })?;
        }
        let mut first_err = None;
        while !self.inflight.is_empty() {
            match self.recv() {
                Ok(Success::Data { data, eof: at_end }) => {
                    if first_err.is_none() && !eof {
                        if let Err(e) = out.write_all(&data) {
                            first_err = Some(ClientError::Io(e));
                        }
                        total += data.len() as u64;
                    }
                    eof |= at_end;
                    if !eof && first_err.is_none() {
                        self.send(Op::Read { h, max: CHUNK as u32 })?;
                    }
                }
                Ok(other) => {
                    first_err.get_or_insert(ClientError::BadResponse(format!("read answered {other:?}")));
                }
                Err(e @ (ClientError::Io(_) | ClientError::BadResponse(_))) => return Err(e),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    /// Write all of `input` to `path` (opened in `mode`: `w` or `a`), keeping
    /// [`WINDOW`] writes in flight. Returns the bytes the proxy acknowledged.
    pub fn copy_in(&mut self, path: &str, mode: Mode, input: &mut impl Read) -> Result<u64, ClientError> {
        let h = self.open(path, mode)?;
        let result = self.copy_in_handle(h, input);
        let closed = self.close(h);
        let n = result?;
        closed?;
        Ok(n)
    }

    fn copy_in_handle(&mut self, h: Handle, input: &mut impl Read) -> Result<u64, ClientError> {
        let mut buf = vec![0; CHUNK];
        let mut acked = 0u64;
        let mut sent_lens = VecDeque::new();
        let mut first_err = None;
        let mut input_done = false;
        loop {
            while !input_done && first_err.is_none() && sent_lens.len() < WINDOW {
                let n = match input.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        first_err = Some(ClientError::Io(e));
                        break;
                    }
                };
                if n == 0 {
                    input_done = true;
                    break;
                }
                self.send(Op::Write { h, data: buf[..n].to_vec() })?;
                sent_lens.push_back(n as u64);
            }
            let Some(len) = sent_lens.pop_front() else { break };
            match self.recv() {
                Ok(Success::Written { written }) if written == len => acked += written,
                Ok(other) => {
                    first_err.get_or_insert(ClientError::BadResponse(format!(
                        "write of {len} bytes answered {other:?}"
                    )));
                }
                Err(e @ (ClientError::Io(_) | ClientError::BadResponse(_))) => return Err(e),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(acked),
        }
    }
}
