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
mod paths;
pub use broker::MAX_ANSWER_FRAME;
pub use paths::{Entry, ListPage, Stat};

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

/// Why the inherited descriptor cannot be used.
enum NoFd {
    /// Neither `AIRLOCK_FD` nor the session socket is in the environment.
    NotUnderAirlock,
    /// `AIRLOCK_FD` names a descriptor that is closed, or is something
    /// other than a socket (a file that took its number once it closed).
    Closed(RawFd),
    Invalid(String),
}

/// Take the descriptor named by `AIRLOCK_FD` (default 3), if it is open
/// and a socket.
fn shared_fd() -> Result<OwnedFd, NoFd> {
    let fd = match std::env::var(FD_ENV) {
        Ok(v) => v
            .trim()
            .parse::<RawFd>()
            .map_err(|_| NoFd::Invalid(format!("{FD_ENV}={v:?} is not a descriptor")))?,
        Err(_) => DEFAULT_FD,
    };
    // SAFETY: the borrow lives only for this fstat, which answers EBADF
    // harmlessly when fd is not open.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let is_socket = rustix::fs::fstat(borrowed)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket);
    if !is_socket {
        return Err(if std::env::var_os(FD_ENV).is_some() {
            NoFd::Closed(fd)
        } else {
            NoFd::NotUnderAirlock
        });
    }
    // SAFETY: fd is open (checked above) and the client is its only user in
    // this process: AIRLOCK_FD is inherited for exactly this purpose.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The session socket and its secret, from the environment.
fn session_socket() -> Option<(std::path::PathBuf, String)> {
    let path = std::env::var_os(crate::session_socket::SOCKET_ENV).filter(|p| !p.is_empty())?;
    let token = std::env::var(crate::session_socket::TOKEN_ENV).unwrap_or_default();
    Some((path.into(), token))
}

fn not_connected(message: String) -> ClientError {
    ClientError::Io(io::Error::new(io::ErrorKind::NotFound, message))
}

/// What to tell a process whose descriptor `fd` a parent closed.
fn closed_fd_message(fd: RawFd) -> String {
    format!(
        "descriptor {fd} ({FD_ENV}) is not open: a parent process closed it (Python's subprocess \
         closes descriptors above 2 unless given pass_fds=[{fd}]; so does `exec {fd}>&-` in a shell)"
    )
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
    ///
    /// When the descriptor is gone (a parent closed it), the connection is
    /// made through the session socket instead (`AIRLOCK_SOCKET`, proved
    /// with `AIRLOCK_TOKEN`).
    pub fn connect() -> Result<Self, ClientError> {
        let why = match shared_fd() {
            Ok(shared) => return Self::attach_via(shared.as_fd()),
            Err(why) => why,
        };
        match (why, session_socket()) {
            (NoFd::Invalid(msg), _) => Err(ClientError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))),
            (NoFd::NotUnderAirlock, None) => Err(not_connected(format!(
                "descriptor {DEFAULT_FD} is not open and neither {FD_ENV} nor {} is set: \
                 is this process running under `airlock run`?",
                crate::session_socket::SOCKET_ENV
            ))),
            (NoFd::Closed(fd), None) => Err(not_connected(format!(
                "{}, and no session socket is named ({} is not set): keep the descriptor open, \
                 or keep AIRLOCK_SOCKET and AIRLOCK_TOKEN in the environment",
                closed_fd_message(fd),
                crate::session_socket::SOCKET_ENV
            ))),
            (why, Some((path, token))) => Self::connect_socket(&path, &token).map_err(|e| {
                let fd = match why {
                    NoFd::Closed(fd) => fd,
                    _ => DEFAULT_FD,
                };
                match e {
                    ClientError::Io(io) => {
                        let hint = if matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
                            " (the sandbox refuses unix sockets here: keep the descriptor open)"
                        } else {
                            ""
                        };
                        not_connected(format!(
                            "{}, and the session socket {} failed: {io}{hint}",
                            closed_fd_message(fd),
                            path.display()
                        ))
                    }
                    other => other,
                }
            }),
        }
    }

    /// A connection through the session socket at `path`, proved with the
    /// session's secret `token`.
    pub fn connect_socket(path: &std::path::Path, token: &str) -> Result<Self, ClientError> {
        let mut stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.write_all(token.as_bytes())?;
        let mut client = Self::new(File::from(OwnedFd::from(stream)));
        client.inflight.push_back((wire::SOCKET_GREETING_ID.to_owned(), OpKind::Attach));
        match client.recv() {
            Err(ClientError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the session closed the connection (a wrong {}, or the session is ending)",
                        crate::session_socket::TOKEN_ENV
                    ),
                )))
            }
            Err(e) => Err(e),
            Ok(_) => Ok(client),
        }
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
        match shared_fd() {
            Ok(fd) => Ok(Self::new(File::from(fd))),
            Err(NoFd::Invalid(msg)) => Err(ClientError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))),
            Err(NoFd::Closed(fd)) => Err(not_connected(closed_fd_message(fd))),
            Err(NoFd::NotUnderAirlock) => Err(not_connected(format!(
                "descriptor {DEFAULT_FD} is not open: is this process running under `airlock run`?"
            ))),
        }
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
