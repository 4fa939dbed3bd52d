//! The FUSE request and reply codec, sans I/O: one request is the bytes of
//! one read of `/dev/fuse`; one reply the bytes of one write.
//!
//! Both directions are here: the server's ([`parse_request`],
//! [`encode_reply`]) and the kernel's ([`encode_request`],
//! [`decode_reply`]), which the simulator's hostile client and the tests
//! speak. Every length is checked against the bytes actually there; a
//! request that cannot be read whole is refused with the reason, and, when
//! its header could be read, the `unique` to answer `EINVAL` to.

use super::abi::{self, errno, opcode};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One name in a directory, as the kernel passes it: not empty, no `/` or
/// NUL, neither `.` nor `..`, at most [`abi::NAME_MAX`] bytes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<u8>", into = "Vec<u8>")]
pub struct Name(Vec<u8>);

impl Name {
    pub fn new(bytes: &[u8]) -> Result<Name, CodecError> {
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0)
        {
            return Err(CodecError::BadName);
        }
        if bytes.len() > abi::NAME_MAX {
            return Err(CodecError::NameTooLong);
        }
        Ok(Name(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl TryFrom<Vec<u8>> for Name {
    type Error = CodecError;
    fn try_from(v: Vec<u8>) -> Result<Self, CodecError> {
        Name::new(&v)
    }
}

impl From<Name> for Vec<u8> {
    fn from(n: Name) -> Vec<u8> {
        n.0
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// Why a request could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodecError {
    /// Shorter than the header, or than its header or body says.
    Truncated,
    /// The header's length is not the number of bytes read.
    LengthMismatch,
    /// A name that is no single directory entry.
    BadName,
    NameTooLong,
    /// A string lacks its terminating NUL.
    Unterminated,
    /// A `BATCH_FORGET` whose count its bytes do not hold.
    BadCount,
}

impl CodecError {
    /// The errno a request refused for this is answered with.
    pub fn errno(self) -> i32 {
        match self {
            CodecError::NameTooLong => errno::ENAMETOOLONG,
            _ => errno::EINVAL,
        }
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CodecError::Truncated => "truncated request",
            CodecError::LengthMismatch => "request length does not match the bytes read",
            CodecError::BadName => "not a single name",
            CodecError::NameTooLong => "name longer than NAME_MAX",
            CodecError::Unterminated => "string without its NUL",
            CodecError::BadCount => "forget count does not match the request",
        })
    }
}

/// A request refused by the codec: `unique` is set when its header was
/// read (the request is answered with the errno), absent when not even
/// that could be (nothing can be answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub unique: Option<u64>,
    pub opcode: u32,
    pub error: CodecError,
}

/// `fuse_in_header`, less its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags`, and `flags2` in the upper half.
    pub flags: u64,
}

/// `fuse_setattr_in`, the fields the machine serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetattrIn {
    pub valid: u32,
    pub fh: u64,
    pub size: u64,
    pub atime: u64,
    pub atimensec: u32,
    pub mtime: u64,
    pub mtimensec: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One request, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    Init(InitIn),
    Destroy,
    Lookup {
        name: Name,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        forgets: Vec<(u64, u64)>,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: Name,
        target: Vec<u8>,
    },
    Mknod {
        name: Name,
        mode: u32,
        rdev: u32,
    },
    Mkdir {
        name: Name,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: Name,
    },
    Rmdir {
        name: Name,
    },
    Rename {
        newdir: u64,
        name: Name,
        newname: Name,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        name: Name,
    },
    Open {
        flags: u32,
    },
    Create {
        name: Name,
        flags: u32,
        mode: u32,
        umask: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Statfs,
    Release {
        fh: u64,
    },
    Flush {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Opendir {
        flags: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir {
        fh: u64,
    },
    Access {
        mask: u32,
    },
    Interrupt {
        unique: u64,
    },
    Getxattr {
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Setxattr,
    Removexattr,
    /// An answer to a notification: never answered.
    NotifyReply,
    /// Any other opcode: answered `ENOSYS`.
    Unsupported,
}

impl Op {
    /// Whether the request gets no reply at all.
    pub fn unanswered(&self) -> bool {
        matches!(self, Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt { .. } | Op::NotifyReply)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub header: Header,
    pub op: Op,
}

/// Reads little-endian fields off a slice, refusing to run past its end.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A NUL-terminated string.
    fn cstr(&mut self) -> Result<&'a [u8], CodecError> {
        let end = memchr::memchr(0, self.buf).ok_or(CodecError::Unterminated)?;
        let s = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }

    fn name(&mut self) -> Result<Name, CodecError> {
        Name::new(self.cstr()?)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// Parse one request: the bytes of one read of `/dev/fuse`.
pub fn parse_request(bytes: &[u8]) -> Result<Request, Refused> {
    let mut r = Reader { buf: bytes };
    let bare = |error| Refused { unique: None, opcode: 0, error };
    let len = r.u32().map_err(bare)? as usize;
    let op = r.u32().map_err(bare)?;
    let unique = r.u64().map_err(bare)?;
    let nodeid = r.u64().map_err(bare)?;
    let uid = r.u32().map_err(bare)?;
    let gid = r.u32().map_err(bare)?;
    let pid = r.u32().map_err(bare)?;
    let extlen = r.u16().map_err(bare)? as usize * 8;
    r.u16().map_err(bare)?;
    let header = Header { opcode: op, unique, nodeid, uid, gid, pid };
    let refuse = |error| Refused { unique: Some(unique), opcode: op, error };
    if len != bytes.len() {
        return Err(refuse(CodecError::LengthMismatch));
    }
    // Extensions (security contexts, supplementary groups) follow the
    // body; none is agreed, and any sent is set aside.
    let body_len = len.checked_sub(abi::IN_HEADER_LEN + extlen).ok_or(refuse(CodecError::Truncated))?;
    let mut b = Reader { buf: &bytes[abi::IN_HEADER_LEN..abi::IN_HEADER_LEN + body_len] };
    parse_op(op, &mut b).map(|op| Request { header, op }).map_err(refuse)
}

fn parse_op(op: u32, b: &mut Reader<'_>) -> Result<Op, CodecError> {
    Ok(match op {
        opcode::INIT => {
            let major = b.u32()?;
            let minor = b.u32()?;
            let max_readahead = b.u32()?;
            let flags = b.u32()? as u64;
            // `flags2` came with 7.36; an older kernel sends 16 bytes.
            let flags2 = if b.buf.len() >= 4 { b.u32()? as u64 } else { 0 };
            Op::Init(InitIn { major, minor, max_readahead, flags: flags | flags2 << 32 })
        }
        opcode::DESTROY => Op::Destroy,
        opcode::LOOKUP => Op::Lookup { name: b.name()? },
        opcode::FORGET => Op::Forget { nlookup: b.u64()? },
        opcode::BATCH_FORGET => {
            let count = b.u32()? as usize;
            b.u32()?;
            if b.buf.len() / 16 < count {
                return Err(CodecError::BadCount);
            }
            let mut forgets = Vec::with_capacity(count);
            for _ in 0..count {
                forgets.push((b.u64()?, b.u64()?));
            }
            Op::BatchForget { forgets }
        }
        opcode::GETATTR => {
            let flags = b.u32()?;
            b.u32()?;
            let fh = b.u64()?;
            Op::Getattr { fh: (flags & abi::GETATTR_FH != 0).then_some(fh) }
        }
        opcode::SETATTR => {
            let valid = b.u32()?;
            b.u32()?;
            let fh = b.u64()?;
            let size = b.u64()?;
            let _lock_owner = b.u64()?;
            let atime = b.u64()?;
            let mtime = b.u64()?;
            let _ctime = b.u64()?;
            let atimensec = b.u32()?;
            let mtimensec = b.u32()?;
            let _ctimensec = b.u32()?;
            let mode = b.u32()?;
            b.u32()?;
            let uid = b.u32()?;
            let gid = b.u32()?;
            Op::Setattr(SetattrIn { valid, fh, size, atime, atimensec, mtime, mtimensec, mode, uid, gid })
        }
        opcode::READLINK => Op::Readlink,
        opcode::SYMLINK => {
            let name = b.name()?;
            let target = b.cstr()?.to_vec();
            Op::Symlink { name, target }
        }
        opcode::MKNOD => {
            let mode = b.u32()?;
            let rdev = b.u32()?;
            b.take(8)?;
            Op::Mknod { name: b.name()?, mode, rdev }
        }
        opcode::MKDIR => {
            let mode = b.u32()?;
            let umask = b.u32()?;
            Op::Mkdir { name: b.name()?, mode, umask }
        }
        opcode::UNLINK => Op::Unlink { name: b.name()? },
        opcode::RMDIR => Op::Rmdir { name: b.name()? },
        opcode::RENAME => {
            let newdir = b.u64()?;
            Op::Rename { newdir, name: b.name()?, newname: b.name()?, flags: 0 }
        }
        opcode::RENAME2 => {
            let newdir = b.u64()?;
            let flags = b.u32()?;
            b.u32()?;
            Op::Rename { newdir, name: b.name()?, newname: b.name()?, flags }
        }
        opcode::LINK => {
            let oldnodeid = b.u64()?;
            Op::Link { oldnodeid, name: b.name()? }
        }
        opcode::OPEN => {
            let flags = b.u32()?;
            b.u32()?;
            Op::Open { flags }
        }
        opcode::OPENDIR => {
            let flags = b.u32()?;
            b.u32()?;
            Op::Opendir { flags }
        }
        opcode::CREATE => {
            let flags = b.u32()?;
            let mode = b.u32()?;
            let umask = b.u32()?;
            b.u32()?;
            Op::Create { name: b.name()?, flags, mode, umask }
        }
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => {
            let fh = b.u64()?;
            let offset = b.u64()?;
            let size = b.u32()?;
            b.take(abi::READ_IN_LEN - 20)?;
            match op {
                opcode::READ => Op::Read { fh, offset, size },
                _ => Op::Readdir { fh, offset, size, plus: op == opcode::READDIRPLUS },
            }
        }
        opcode::WRITE => {
            let fh = b.u64()?;
            let offset = b.u64()?;
            let size = b.u32()? as usize;
            b.take(abi::WRITE_IN_LEN - 20)?;
            let data = b.take(size)?.to_vec();
            Op::Write { fh, offset, data }
        }
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE | opcode::RELEASEDIR => {
            let fh = b.u64()?;
            b.take(abi::RELEASE_IN_LEN - 8)?;
            match op {
                opcode::RELEASE => Op::Release { fh },
                _ => Op::Releasedir { fh },
            }
        }
        opcode::FLUSH => {
            let fh = b.u64()?;
            b.take(16)?;
            Op::Flush { fh }
        }
        opcode::FSYNC | opcode::FSYNCDIR => {
            let fh = b.u64()?;
            let flags = b.u32()?;
            b.u32()?;
            match op {
                opcode::FSYNC => Op::Fsync { fh, datasync: flags & abi::FSYNC_FDATASYNC != 0 },
                _ => Op::Fsyncdir { fh },
            }
        }
        opcode::ACCESS => {
            let mask = b.u32()?;
            b.u32()?;
            Op::Access { mask }
        }
        opcode::INTERRUPT => Op::Interrupt { unique: b.u64()? },
        opcode::GETXATTR => {
            let size = b.u32()?;
            b.u32()?;
            b.cstr()?;
            Op::Getxattr { size }
        }
        opcode::LISTXATTR => {
            let size = b.u32()?;
            b.u32()?;
            Op::Listxattr { size }
        }
        opcode::SETXATTR => Op::Setxattr,
        opcode::REMOVEXATTR => Op::Removexattr,
        opcode::NOTIFY_REPLY => Op::NotifyReply,
        _ => Op::Unsupported,
    })
}

/// `struct fuse_attr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub atimensec: u32,
    pub mtime: u64,
    pub mtimensec: u32,
    pub ctime: u64,
    pub ctimensec: u32,
    /// Type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    pub fn is_dir(&self) -> bool {
        self.mode & abi::S_IFMT == abi::S_IFDIR
    }

    /// The `d_type` of a directory entry of this node.
    pub fn dtype(&self) -> u32 {
        dtype_of(self.mode)
    }
}

/// The `d_type` for a mode.
pub fn dtype_of(mode: u32) -> u32 {
    (mode & abi::S_IFMT) >> 12
}

/// How long the kernel may keep an answer, as seconds and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Valid {
    pub secs: u64,
    pub nsecs: u32,
}

impl Valid {
    pub fn from_millis(ms: u64) -> Valid {
        Valid { secs: ms / 1000, nsecs: (ms % 1000) as u32 * 1_000_000 }
    }
}

/// `fuse_entry_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: Valid,
    pub attr_valid: Valid,
    pub attr: Attr,
}

/// `fuse_open_out`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `fuse_init_out`, the fields the server sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub max_stack_depth: u32,
}

/// `fuse_kstatfs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// One reply's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A failure: the positive errno.
    Error(i32),
    /// Success without a body (`RELEASE`, `FLUSH`, `UNLINK`, ...).
    Empty,
    Init(InitOut),
    Entry(EntryOut),
    Attr {
        valid: Valid,
        attr: Attr,
    },
    Open(OpenOut),
    Create(EntryOut, OpenOut),
    /// Bytes as they are: a read's data, a symlink's target, a directory
    /// listing built with [`DirBuf`].
    Data(Vec<u8>),
    Write {
        size: u32,
    },
    Statfs(Statfs),
    /// `fuse_getxattr_out`: the size a value or list would take.
    XattrSize(u32),
}

struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn zeros(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + n, 0);
    }

    fn attr(&mut self, a: &Attr) {
        self.u64(a.ino);
        self.u64(a.size);
        self.u64(a.blocks);
        self.u64(a.atime);
        self.u64(a.mtime);
        self.u64(a.ctime);
        self.u32(a.atimensec);
        self.u32(a.mtimensec);
        self.u32(a.ctimensec);
        self.u32(a.mode);
        self.u32(a.nlink);
        self.u32(a.uid);
        self.u32(a.gid);
        self.u32(a.rdev);
        self.u32(a.blksize);
        self.u32(0);
    }

    fn entry(&mut self, e: &EntryOut) {
        self.u64(e.nodeid);
        self.u64(e.generation);
        self.u64(e.entry_valid.secs);
        self.u64(e.attr_valid.secs);
        self.u32(e.entry_valid.nsecs);
        self.u32(e.attr_valid.nsecs);
        self.attr(&e.attr);
    }

    fn open(&mut self, o: &OpenOut) {
        self.u64(o.fh);
        self.u32(o.open_flags);
        self.i32(o.backing_id);
    }
}

/// The bytes of the reply to request `unique`.
pub fn encode_reply(unique: u64, reply: &Reply) -> Vec<u8> {
    let body = match reply {
        Reply::Error(_) | Reply::Empty => 0,
        Reply::Init(_) => abi::INIT_OUT_LEN,
        Reply::Entry(_) => abi::ENTRY_OUT_LEN,
        Reply::Attr { .. } => abi::ATTR_OUT_LEN,
        Reply::Open(_) => abi::OPEN_OUT_LEN,
        Reply::Create(..) => abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN,
        Reply::Data(d) => d.len(),
        Reply::Write { .. } | Reply::XattrSize(_) => 8,
        Reply::Statfs(_) => abi::STATFS_OUT_LEN,
    };
    let len = abi::OUT_HEADER_LEN + body;
    let mut w = Writer { buf: Vec::with_capacity(len) };
    w.u32(len as u32);
    w.i32(match reply {
        Reply::Error(e) => -e.abs(),
        _ => 0,
    });
    w.u64(unique);
    match reply {
        Reply::Error(_) | Reply::Empty => {}
        Reply::Init(i) => {
            w.u32(i.major);
            w.u32(i.minor);
            w.u32(i.max_readahead);
            w.u32(i.flags as u32);
            w.u16(i.max_background);
            w.u16(i.congestion_threshold);
            w.u32(i.max_write);
            w.u32(i.time_gran);
            w.u16(i.max_pages);
            w.u16(0);
            w.u32((i.flags >> 32) as u32);
            w.u32(i.max_stack_depth);
            w.zeros(24);
        }
        Reply::Entry(e) => w.entry(e),
        Reply::Attr { valid, attr } => {
            w.u64(valid.secs);
            w.u32(valid.nsecs);
            w.u32(0);
            w.attr(attr);
        }
        Reply::Open(o) => w.open(o),
        Reply::Create(e, o) => {
            w.entry(e);
            w.open(o);
        }
        Reply::Data(d) => w.buf.extend_from_slice(d),
        Reply::Write { size } | Reply::XattrSize(size) => {
            w.u32(*size);
            w.u32(0);
        }
        Reply::Statfs(s) => {
            w.u64(s.blocks);
            w.u64(s.bfree);
            w.u64(s.bavail);
            w.u64(s.files);
            w.u64(s.ffree);
            w.u32(s.bsize);
            w.u32(s.namelen);
            w.u32(s.frsize);
            w.zeros(28);
        }
    }
    debug_assert_eq!(w.buf.len(), len);
    w.buf
}

/// One directory entry of a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub ino: u64,
    /// The offset of the entry after this one (what a `READDIR` resumes at).
    pub off: u64,
    pub dtype: u32,
    pub name: Vec<u8>,
}

/// A `READDIR` answer being filled, never past the size the kernel asked
/// for.
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirBuf {
    pub fn new(max: usize) -> Self {
        DirBuf { buf: Vec::new(), max }
    }

    /// The size `e` takes in a listing.
    pub fn size_of(e: &DirEntry) -> usize {
        (abi::DIRENT_NAME_OFFSET + e.name.len() + 7) & !7
    }

    /// Add `e` if it fits; `false` when it does not (the listing is full).
    pub fn push(&mut self, e: &DirEntry) -> bool {
        let size = Self::size_of(e);
        if self.buf.len() + size > self.max {
            return false;
        }
        let mut w = Writer { buf: std::mem::take(&mut self.buf) };
        w.u64(e.ino);
        w.u64(e.off);
        w.u32(e.name.len() as u32);
        w.u32(e.dtype);
        w.buf.extend_from_slice(&e.name);
        w.zeros(size - abi::DIRENT_NAME_OFFSET - e.name.len());
        self.buf = w.buf;
        true
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Read back a listing made by [`DirBuf`] (the kernel's side).
pub fn decode_dir(mut bytes: &[u8]) -> Result<Vec<DirEntry>, CodecError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut r = Reader { buf: bytes };
        let ino = r.u64()?;
        let off = r.u64()?;
        let namelen = r.u32()? as usize;
        let dtype = r.u32()?;
        let name = r.take(namelen)?.to_vec();
        let size = (abi::DIRENT_NAME_OFFSET + namelen + 7) & !7;
        bytes = bytes.get(size..).ok_or(CodecError::Truncated)?;
        out.push(DirEntry { ino, off, dtype, name });
    }
    Ok(out)
}

/// The bytes of request `req` as the kernel writes them.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut w = Writer { buf: Vec::with_capacity(abi::IN_HEADER_LEN + 64) };
    let h = &req.header;
    w.u32(0);
    w.u32(opcode_of(&req.op, h.opcode));
    w.u64(h.unique);
    w.u64(h.nodeid);
    w.u32(h.uid);
    w.u32(h.gid);
    w.u32(h.pid);
    w.u32(0);
    let name = |w: &mut Writer, n: &Name| {
        w.buf.extend_from_slice(n.as_bytes());
        w.buf.push(0);
    };
    match &req.op {
        Op::Init(i) => {
            w.u32(i.major);
            w.u32(i.minor);
            w.u32(i.max_readahead);
            w.u32(i.flags as u32);
            w.u32((i.flags >> 32) as u32);
            w.zeros(44);
        }
        Op::Destroy | Op::Readlink | Op::Statfs | Op::Setxattr | Op::Removexattr | Op::NotifyReply => {}
        Op::Unsupported => {}
        Op::Lookup { name: n } | Op::Unlink { name: n } | Op::Rmdir { name: n } => name(&mut w, n),
        Op::Forget { nlookup } => w.u64(*nlookup),
        Op::BatchForget { forgets } => {
            w.u32(forgets.len() as u32);
            w.u32(0);
            for (n, c) in forgets {
                w.u64(*n);
                w.u64(*c);
            }
        }
        Op::Getattr { fh } => {
            w.u32(if fh.is_some() { abi::GETATTR_FH } else { 0 });
            w.u32(0);
            w.u64(fh.unwrap_or(0));
        }
        Op::Setattr(s) => {
            w.u32(s.valid);
            w.u32(0);
            w.u64(s.fh);
            w.u64(s.size);
            w.u64(0);
            w.u64(s.atime);
            w.u64(s.mtime);
            w.u64(0);
            w.u32(s.atimensec);
            w.u32(s.mtimensec);
            w.u32(0);
            w.u32(s.mode);
            w.u32(0);
            w.u32(s.uid);
            w.u32(s.gid);
            w.u32(0);
        }
        Op::Symlink { name: n, target } => {
            name(&mut w, n);
            w.buf.extend_from_slice(target);
            w.buf.push(0);
        }
        Op::Mknod { name: n, mode, rdev } => {
            w.u32(*mode);
            w.u32(*rdev);
            w.zeros(8);
            name(&mut w, n);
        }
        Op::Mkdir { name: n, mode, umask } => {
            w.u32(*mode);
            w.u32(*umask);
            name(&mut w, n);
        }
        Op::Rename { newdir, name: a, newname: b, flags } => {
            w.u64(*newdir);
            if *flags != 0 {
                w.u32(*flags);
                w.u32(0);
            }
            name(&mut w, a);
            name(&mut w, b);
        }
        Op::Link { oldnodeid, name: n } => {
            w.u64(*oldnodeid);
            name(&mut w, n);
        }
        Op::Open { flags } | Op::Opendir { flags } => {
            w.u32(*flags);
            w.u32(0);
        }
        Op::Create { name: n, flags, mode, umask } => {
            w.u32(*flags);
            w.u32(*mode);
            w.u32(*umask);
            w.u32(0);
            name(&mut w, n);
        }
        Op::Read { fh, offset, size } | Op::Readdir { fh, offset, size, .. } => {
            w.u64(*fh);
            w.u64(*offset);
            w.u32(*size);
            w.zeros(abi::READ_IN_LEN - 20);
        }
        Op::Write { fh, offset, data } => {
            w.u64(*fh);
            w.u64(*offset);
            w.u32(data.len() as u32);
            w.zeros(abi::WRITE_IN_LEN - 20);
            w.buf.extend_from_slice(data);
        }
        Op::Release { fh } | Op::Releasedir { fh } => {
            w.u64(*fh);
            w.zeros(abi::RELEASE_IN_LEN - 8);
        }
        Op::Flush { fh } => {
            w.u64(*fh);
            w.zeros(16);
        }
        Op::Fsync { fh, datasync } => {
            w.u64(*fh);
            w.u32(if *datasync { abi::FSYNC_FDATASYNC } else { 0 });
            w.u32(0);
        }
        Op::Fsyncdir { fh } => {
            w.u64(*fh);
            w.zeros(8);
        }
        Op::Access { mask } => {
            w.u32(*mask);
            w.u32(0);
        }
        Op::Interrupt { unique } => w.u64(*unique),
        Op::Getxattr { size } => {
            w.u32(*size);
            w.u32(0);
            w.buf.extend_from_slice(b"user.x\0");
        }
        Op::Listxattr { size } => {
            w.u32(*size);
            w.u32(0);
        }
    }
    let len = w.buf.len() as u32;
    w.buf[..4].copy_from_slice(&len.to_le_bytes());
    w.buf
}

/// The opcode `op` is sent with (`fallback` for the ops that stand for
/// several: an unsupported one, extended attributes).
pub fn opcode_of(op: &Op, fallback: u32) -> u32 {
    match op {
        Op::Init(_) => opcode::INIT,
        Op::Destroy => opcode::DESTROY,
        Op::Lookup { .. } => opcode::LOOKUP,
        Op::Forget { .. } => opcode::FORGET,
        Op::BatchForget { .. } => opcode::BATCH_FORGET,
        Op::Getattr { .. } => opcode::GETATTR,
        Op::Setattr(_) => opcode::SETATTR,
        Op::Readlink => opcode::READLINK,
        Op::Symlink { .. } => opcode::SYMLINK,
        Op::Mknod { .. } => opcode::MKNOD,
        Op::Mkdir { .. } => opcode::MKDIR,
        Op::Unlink { .. } => opcode::UNLINK,
        Op::Rmdir { .. } => opcode::RMDIR,
        Op::Rename { flags: 0, .. } => opcode::RENAME,
        Op::Rename { .. } => opcode::RENAME2,
        Op::Link { .. } => opcode::LINK,
        Op::Open { .. } => opcode::OPEN,
        Op::Create { .. } => opcode::CREATE,
        Op::Read { .. } => opcode::READ,
        Op::Write { .. } => opcode::WRITE,
        Op::Statfs => opcode::STATFS,
        Op::Release { .. } => opcode::RELEASE,
        Op::Flush { .. } => opcode::FLUSH,
        Op::Fsync { .. } => opcode::FSYNC,
        Op::Opendir { .. } => opcode::OPENDIR,
        Op::Readdir { plus: false, .. } => opcode::READDIR,
        Op::Readdir { plus: true, .. } => opcode::READDIRPLUS,
        Op::Releasedir { .. } => opcode::RELEASEDIR,
        Op::Fsyncdir { .. } => opcode::FSYNCDIR,
        Op::Access { .. } => opcode::ACCESS,
        Op::Interrupt { .. } => opcode::INTERRUPT,
        Op::Getxattr { .. } => opcode::GETXATTR,
        Op::Listxattr { .. } => opcode::LISTXATTR,
        Op::Setxattr => opcode::SETXATTR,
        Op::Removexattr => opcode::REMOVEXATTR,
        Op::NotifyReply => opcode::NOTIFY_REPLY,
        Op::Unsupported => fallback,
    }
}

/// A reply as the kernel reads it: its `unique`, and its errno or body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub unique: u64,
    pub reply: Reply,
}

/// Read the reply to a request of `opcode` (the kernel knows what it
/// asked). A reply whose length or body does not fit what was asked is
/// refused, as the kernel refuses it.
pub fn decode_reply(opcode: u32, bytes: &[u8]) -> Result<Decoded, CodecError> {
    let mut r = Reader { buf: bytes };
    let len = r.u32()? as usize;
    let error = r.u32()? as i32;
    let unique = r.u64()?;
    if len != bytes.len() {
        return Err(CodecError::LengthMismatch);
    }
    if error != 0 {
        if !r.buf.is_empty() || !(-4095..=0).contains(&error) {
            return Err(CodecError::LengthMismatch);
        }
        return Ok(Decoded { unique, reply: Reply::Error(-error) });
    }
    let attr = |r: &mut Reader<'_>| -> Result<Attr, CodecError> {
        let ino = r.u64()?;
        let size = r.u64()?;
        let blocks = r.u64()?;
        let atime = r.u64()?;
        let mtime = r.u64()?;
        let ctime = r.u64()?;
        let atimensec = r.u32()?;
        let mtimensec = r.u32()?;
        let ctimensec = r.u32()?;
        let mode = r.u32()?;
        let nlink = r.u32()?;
        let uid = r.u32()?;
        let gid = r.u32()?;
        let rdev = r.u32()?;
        let blksize = r.u32()?;
        r.u32()?;
        Ok(Attr {
            ino,
            size,
            blocks,
            atime,
            atimensec,
            mtime,
            mtimensec,
            ctime,
            ctimensec,
            mode,
            nlink,
            uid,
            gid,
            rdev,
            blksize,
        })
    };
    let entry = |r: &mut Reader<'_>| -> Result<EntryOut, CodecError> {
        let nodeid = r.u64()?;
        let generation = r.u64()?;
        let es = r.u64()?;
        let asecs = r.u64()?;
        let en = r.u32()?;
        let an = r.u32()?;
        Ok(EntryOut {
            nodeid,
            generation,
            entry_valid: Valid { secs: es, nsecs: en },
            attr_valid: Valid { secs: asecs, nsecs: an },
            attr: attr(r)?,
        })
    };
    let open = |r: &mut Reader<'_>| -> Result<OpenOut, CodecError> {
        Ok(OpenOut { fh: r.u64()?, open_flags: r.u32()?, backing_id: r.u32()? as i32 })
    };
    let reply = match opcode {
        opcode::INIT => {
            let major = r.u32()?;
            let minor = r.u32()?;
            let max_readahead = r.u32()?;
            let flags = r.u32()? as u64;
            let max_background = r.u16()?;
            let congestion_threshold = r.u16()?;
            let max_write = r.u32()?;
            let time_gran = r.u32()?;
            let max_pages = r.u16()?;
            r.u16()?;
            let flags2 = r.u32()? as u64;
            let max_stack_depth = r.u32()?;
            r.take(24)?;
            Reply::Init(InitOut {
                major,
                minor,
                max_readahead,
                flags: flags | flags2 << 32,
                max_background,
                congestion_threshold,
                max_write,
                time_gran,
                max_pages,
                max_stack_depth,
            })
        }
        opcode::LOOKUP | opcode::MKDIR | opcode::MKNOD | opcode::SYMLINK | opcode::LINK => {
            Reply::Entry(entry(&mut r)?)
        }
        opcode::GETATTR | opcode::SETATTR => {
            let secs = r.u64()?;
            let nsecs = r.u32()?;
            r.u32()?;
            Reply::Attr { valid: Valid { secs, nsecs }, attr: attr(&mut r)? }
        }
        opcode::OPEN | opcode::OPENDIR => Reply::Open(open(&mut r)?),
        opcode::CREATE => {
            let e = entry(&mut r)?;
            Reply::Create(e, open(&mut r)?)
        }
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS | opcode::READLINK => {
            Reply::Data(r.rest().to_vec())
        }
        opcode::WRITE => {
            let size = r.u32()?;
            r.u32()?;
            Reply::Write { size }
        }
        opcode::GETXATTR | opcode::LISTXATTR => {
            let size = r.u32()?;
            r.u32()?;
            Reply::XattrSize(size)
        }
        opcode::STATFS => {
            let blocks = r.u64()?;
            let bfree = r.u64()?;
            let bavail = r.u64()?;
            let files = r.u64()?;
            let ffree = r.u64()?;
            let bsize = r.u32()?;
            let namelen = r.u32()?;
            let frsize = r.u32()?;
            r.take(28)?;
            Reply::Statfs(Statfs { blocks, bfree, bavail, files, ffree, bsize, namelen, frsize })
        }
        _ => Reply::Empty,
    };
    if !r.buf.is_empty() {
        return Err(CodecError::LengthMismatch);
    }
    Ok(Decoded { unique, reply })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(opcode: u32) -> Header {
        Header { opcode, unique: 7, nodeid: 1, uid: 1000, gid: 1000, pid: 42 }
    }

    fn name(s: &str) -> Name {
        Name::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn names_are_single_entries() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert_eq!(Name::new(bad), Err(CodecError::BadName), "{bad:?}");
        }
        assert_eq!(Name::new(&[b'x'; 256]), Err(CodecError::NameTooLong));
        assert!(Name::new(&[b'x'; 255]).is_ok());
        assert!(Name::new(b"...").is_ok());
    }

    #[test]
    fn a_lookup_as_the_kernel_writes_it() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(40u32 + 6).to_le_bytes());
        bytes.extend_from_slice(&opcode::LOOKUP.to_le_bytes());
        bytes.extend_from_slice(&9u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(b"a.txt\0");
        let req = parse_request(&bytes).unwrap();
        assert_eq!(req.header.unique, 9);
        assert_eq!(req.op, Op::Lookup { name: name("a.txt") });
        assert_eq!(encode_request(&req), bytes);
    }

    #[test]
    fn refusals_name_the_request_when_they_can() {
        let req = Request { header: header(opcode::LOOKUP), op: Op::Lookup { name: name("a") } };
        let mut bytes = encode_request(&req);
        // A name without its NUL.
        bytes.pop();
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        let e = parse_request(&bytes).unwrap_err();
        assert_eq!((e.unique, e.error), (Some(7), CodecError::Unterminated));
        // A length that is not what was read.
        let bytes = encode_request(&req);
        let e = parse_request(&bytes[..bytes.len() - 1]).unwrap_err();
        assert_eq!(e.error, CodecError::LengthMismatch);
        // No header at all.
        assert_eq!(parse_request(&bytes[..10]).unwrap_err().unique, None);
        // A write shorter than its size says.
        let w =
            Request { header: header(opcode::WRITE), op: Op::Write { fh: 1, offset: 0, data: vec![1; 10] } };
        let mut bytes = encode_request(&w);
        bytes.truncate(bytes.len() - 3);
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(parse_request(&bytes).unwrap_err().error, CodecError::Truncated);
        // A batch forget claiming more than it holds allocates nothing for them.
        let f =
            Request { header: header(opcode::BATCH_FORGET), op: Op::BatchForget { forgets: vec![(2, 1)] } };
        let mut bytes = encode_request(&f);
        bytes[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_request(&bytes).unwrap_err().error, CodecError::BadCount);
    }

    #[test]
    fn unknown_opcodes_are_unsupported_not_refused() {
        let req = Request { header: header(9999), op: Op::Unsupported };
        let bytes = encode_request(&req);
        assert_eq!(parse_request(&bytes).unwrap().op, Op::Unsupported);
    }

    #[test]
    fn replies_have_the_sizes_of_the_kernels_structures() {
        let attr = Attr { ino: 5, mode: abi::S_IFREG | 0o644, nlink: 1, ..Attr::default() };
        let entry = EntryOut { nodeid: 2, attr, ..EntryOut::default() };
        assert_eq!(encode_reply(1, &Reply::Entry(entry)).len(), 16 + 128);
        assert_eq!(encode_reply(1, &Reply::Attr { valid: Valid::default(), attr }).len(), 16 + 104);
        assert_eq!(encode_reply(1, &Reply::Init(InitOut::default())).len(), 16 + 64);
        assert_eq!(encode_reply(1, &Reply::Statfs(Statfs::default())).len(), 16 + 80);
        assert_eq!(encode_reply(1, &Reply::Open(OpenOut::default())).len(), 16 + 16);
        let e = encode_reply(3, &Reply::Error(errno::EACCES));
        assert_eq!(e, [16, 0, 0, 0, 0xf3, 0xff, 0xff, 0xff, 3, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_listing_never_exceeds_its_size() {
        let mut d = DirBuf::new(75);
        let e = |n: &str| DirEntry { ino: 1, off: 1, dtype: abi::DT_REG, name: n.as_bytes().to_vec() };
        assert!(d.push(&e("a")));
        assert!(d.push(&e("bbbbbbbbb")));
        assert!(!d.push(&e("c")));
        let bytes = d.into_bytes();
        assert_eq!(bytes.len(), 32 + 40);
        assert_eq!(decode_dir(&bytes).unwrap(), vec![e("a"), e("bbbbbbbbb")]);
    }

    fn arb_name() -> impl Strategy<Value = Name> {
        proptest::collection::vec(any::<u8>().prop_filter("name byte", |b| *b != 0 && *b != b'/'), 1..20)
            .prop_filter_map("a name", |v| Name::new(&v).ok())
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            arb_name().prop_map(|name| Op::Lookup { name }),
            any::<u64>().prop_map(|nlookup| Op::Forget { nlookup }),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..4)
                .prop_map(|forgets| Op::BatchForget { forgets }),
            proptest::option::of(any::<u64>()).prop_map(|fh| Op::Getattr { fh }),
            (any::<u32>(), any::<u64>(), any::<u32>()).prop_map(|(valid, size, mode)| Op::Setattr(
                SetattrIn { valid, size, mode, ..SetattrIn::default() }
            )),
            (arb_name(), any::<u32>(), any::<u32>()).prop_map(|(name, mode, umask)| Op::Mkdir {
                name,
                mode,
                umask
            }),
            (any::<u64>(), arb_name(), arb_name(), prop_oneof![Just(0u32), Just(1), Just(2)])
                .prop_map(|(newdir, name, newname, flags)| Op::Rename { newdir, name, newname, flags }),
            any::<u32>().prop_map(|flags| Op::Open { flags }),
            (arb_name(), any::<u32>(), any::<u32>(), any::<u32>())
                .prop_map(|(name, flags, mode, umask)| Op::Create { name, flags, mode, umask }),
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(fh, offset, size)| Op::Read {
                fh,
                offset,
                size
            }),
            (any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(fh, offset, data)| Op::Write { fh, offset, data }),
            (any::<u64>(), any::<u64>(), any::<u32>(), any::<bool>())
                .prop_map(|(fh, offset, size, plus)| Op::Readdir { fh, offset, size, plus }),
            any::<u64>().prop_map(|fh| Op::Release { fh }),
            any::<u64>().prop_map(|unique| Op::Interrupt { unique }),
            (arb_name(), proptest::collection::vec(1u8..=255, 0..30))
                .prop_map(|(name, target)| Op::Symlink { name, target }),
            Just(Op::Destroy),
            Just(Op::Statfs),
            Just(Op::Readlink),
        ]
    }

    proptest! {
        /// What the kernel's side writes, the server's side reads back.
        #[test]
        fn requests_round_trip(op in arb_op(), unique in any::<u64>(), nodeid in any::<u64>()) {
            let req = Request { header: Header { opcode: opcode_of(&op, 0), unique, nodeid, uid: 1, gid: 2, pid: 3 }, op };
            let bytes = encode_request(&req);
            prop_assert_eq!(parse_request(&bytes), Ok(req));
        }

        /// Whatever the bytes, parsing ends with a request or a reason,
        /// and a request it reads is one it would write back the same.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(req) = parse_request(&bytes) {
                // The same request, though perhaps under the opcode a
                // kernel would send it with (RENAME2 without flags is RENAME).
                let again = parse_request(&encode_request(&req));
                prop_assert!(again.is_ok(), "{:?}", again);
                let again = again.unwrap();
                prop_assert_eq!(again.op, req.op);
                prop_assert_eq!(
                    (again.header.unique, again.header.nodeid, again.header.uid),
                    (req.header.unique, req.header.nodeid, req.header.uid)
                );
            }
        }

        #[test]
        fn replies_round_trip(ino in any::<u64>(), size in any::<u64>(), mode in any::<u32>(), fh in any::<u64>(), unique in any::<u64>()) {
            let attr = Attr { ino, size, mode, ..Attr::default() };
            let entry = EntryOut { nodeid: ino, attr, ..EntryOut::default() };
            let open = OpenOut { fh, open_flags: 2, backing_id: 0 };
            for (op, reply) in [
                (opcode::LOOKUP, Reply::Entry(entry)),
                (opcode::GETATTR, Reply::Attr { valid: Valid::from_millis(1500), attr }),
                (opcode::CREATE, Reply::Create(entry, open)),
                (opcode::OPEN, Reply::Open(open)),
                (opcode::READ, Reply::Data(vec![1, 2, 3])),
                (opcode::WRITE, Reply::Write { size: 7 }),
                (opcode::LOOKUP, Reply::Error(errno::ENOENT)),
                (opcode::RELEASE, Reply::Empty),
            ] {
                let bytes = encode_reply(unique, &reply);
                prop_assert_eq!(decode_reply(op, &bytes), Ok(Decoded { unique, reply }));
            }
        }
    }
}
