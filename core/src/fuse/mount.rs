//! One mount's state: what was agreed at `INIT`, its node table, its open
//! directories, and the requests waiting on an effect. The FS proxy holds
//! one per mount and serves its requests (`crate::fsproxy`); what is here
//! needs nothing of the proxy.

use super::abi::{self, init};
use super::codec::{Attr, InitIn, InitOut, Name, Valid};
use super::inodes::{Identity, Nodes};
use super::FuseConfig;
use crate::pathops::{FileStat, Kind};
use crate::policy::RootId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Directory handles are numbered from here up, apart from file handles
/// (the proxy's handle numbers), so a `fh` says which it is.
pub const DIR_HANDLE_BASE: u64 = 1 << 62;

/// What `INIT` agreed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    pub minor: u32,
    pub flags: u64,
    pub max_write: u32,
}

impl Agreed {
    pub fn passthrough(&self) -> bool {
        self.flags & init::PASSTHROUGH != 0
    }
}

/// An open directory: the entries handed out of its last page, by the
/// offset each was given, so a listing resumes after any of them.
#[derive(Debug)]
pub struct DirHandle {
    pub node: u64,
    pub next_off: u64,
    /// Offsets of the last page's entries and their names.
    pub page: BTreeMap<u64, Vec<u8>>,
    /// The last page ended the listing.
    pub done: bool,
}

/// A node's passthrough: every open of a node shares one registration of
/// a backing file (the kernel refuses a second while one is in use, and
/// any open of the node that is not passthrough), kept while any is open.
#[derive(Debug)]
pub enum Backing {
    /// Being registered with the first open's file; later opens of the
    /// node wait for it (request, handle).
    Registering { waiting: Vec<(u64, crate::handles::Handle)> },
    /// Registered as `id`, used by `opens` open files.
    Ready { id: u32, opens: usize },
}

#[derive(Debug)]
pub struct Mount {
    pub root: RootId,
    /// The root's path: where the mount stands, and the host directory it
    /// serves.
    pub base: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub nodes: Nodes,
    pub agreed: Option<Agreed>,
    pub dirs: BTreeMap<u64, DirHandle>,
    next_dir: u64,
    /// The path each open file handle was opened at (for the audit log).
    pub opened: BTreeMap<crate::handles::Handle, PathBuf>,
    /// Requests waiting on an effect.
    pub pending: usize,
    /// The mount ended (`DESTROY`, or the device closed).
    pub gone: bool,
    pub valid: Valid,
    /// The shell can register backing files (passthrough).
    pub can_passthrough: bool,
    /// Passthrough by node.
    pub backing: BTreeMap<u64, Backing>,
    /// The node of each file handle opened for passthrough.
    pub through: BTreeMap<crate::handles::Handle, u64>,
}

impl Mount {
    pub fn new(
        root: RootId,
        base: PathBuf,
        uid: u32,
        gid: u32,
        config: &FuseConfig,
        can_passthrough: bool,
    ) -> Self {
        Mount {
            root,
            base,
            uid,
            gid,
            nodes: Nodes::new(config.max_nodes),
            agreed: None,
            dirs: BTreeMap::new(),
            next_dir: DIR_HANDLE_BASE,
            opened: BTreeMap::new(),
            backing: BTreeMap::new(),
            through: BTreeMap::new(),
            pending: 0,
            gone: false,
            valid: Valid::from_millis(config.cache_ms),
            can_passthrough,
        }
    }

    /// The answer to `INIT`: what the kernel offers and airlock wants.
    /// `Err` with the errno when the kernel's version is not served.
    pub fn init(&mut self, i: &InitIn, config: &FuseConfig) -> Result<InitOut, i32> {
        if i.major != abi::KERNEL_VERSION || i.minor < abi::MIN_MINOR_VERSION {
            return Err(abi::errno::EIO);
        }
        let minor = i.minor.min(abi::KERNEL_MINOR_VERSION);
        let mut want = init::ASYNC_READ
            | init::ATOMIC_O_TRUNC
            | init::BIG_WRITES
            | init::AUTO_INVAL_DATA
            | init::PARALLEL_DIROPS
            | init::MAX_PAGES
            | init::INIT_EXT;
        if self.can_passthrough && config.passthrough && minor >= 40 {
            want |= init::PASSTHROUGH;
        }
        let flags = want & i.flags;
        let max_write = config.max_write.clamp(abi::MIN_READ_BUFFER as u32, super::MAX_WRITE_LIMIT);
        let max_pages = max_write.div_ceil(4096) as u16;
        let agreed = Agreed { minor, flags, max_write };
        self.agreed = Some(agreed);
        Ok(InitOut {
            major: abi::KERNEL_VERSION,
            minor,
            max_readahead: i.max_readahead.min(max_write),
            flags,
            max_background: 16,
            congestion_threshold: 12,
            max_write,
            time_gran: 1,
            max_pages,
            // Backing files may sit on a stacked filesystem (overlayfs).
            max_stack_depth: if flags & init::PASSTHROUGH != 0 { 2 } else { 0 },
        })
    }

    /// The path of `node` on the host, or `None` when it names nothing
    /// (unknown, or unlinked).
    pub fn path_of(&self, node: u64) -> Option<PathBuf> {
        let names = self.nodes.names(node)?;
        let mut p = self.base.clone();
        for n in names {
            p.push(crate::policy::bytes::os(n.as_bytes()));
        }
        Some(p)
    }

    /// The path of `name` in directory `parent`.
    pub fn child_path(&self, parent: u64, name: &Name) -> Option<PathBuf> {
        let mut p = self.path_of(parent)?;
        p.push(crate::policy::bytes::os(name.as_bytes()));
        Some(p)
    }

    /// `path` relative to the mount's base (empty for the base itself).
    pub fn rel<'p>(&self, path: &'p Path) -> &'p Path {
        path.strip_prefix(&self.base).unwrap_or(Path::new(""))
    }

    /// A new directory handle for `node`.
    pub fn open_dir(&mut self, node: u64) -> u64 {
        let fh = self.next_dir;
        self.next_dir += 1;
        self.dirs.insert(fh, DirHandle { node, next_off: 3, page: BTreeMap::new(), done: false });
        fh
    }

    /// How the kernel sees a node the host describes as `stat`.
    pub fn attr(&self, stat: &FileStat) -> Attr {
        attr_of(stat, self.uid, self.gid)
    }
}

/// The type bits for a kind. A FIFO, socket or device shows as an empty
/// regular file: it is never opened through the mount (the host refuses
/// anything but a regular file), and a kernel-side special file of the
/// mount would be no way to the host's.
pub fn type_bits(kind: Kind) -> u32 {
    match kind {
        Kind::Dir => abi::S_IFDIR,
        Kind::Symlink => abi::S_IFLNK,
        Kind::File | Kind::Other => abi::S_IFREG,
    }
}

/// The kernel's attributes for `stat`, every file owned by the mount's
/// owner (the child's own ids): what it may do is the policy's to say,
/// not the host's owners'.
pub fn attr_of(stat: &FileStat, uid: u32, gid: u32) -> Attr {
    let size = if stat.kind == Kind::Other { 0 } else { stat.size };
    let secs = |t: crate::pathops::Time| (t.sec.max(0) as u64, t.nsec.min(999_999_999));
    let (atime, atimensec) = secs(stat.atime);
    let (mtime, mtimensec) = secs(stat.mtime);
    let (ctime, ctimensec) = secs(stat.ctime);
    Attr {
        ino: stat.ino,
        size,
        blocks: size.div_ceil(512),
        atime,
        atimensec,
        mtime,
        mtimensec,
        ctime,
        ctimensec,
        mode: type_bits(stat.kind) | (stat.mode & 0o7777),
        nlink: u32::try_from(stat.nlink).unwrap_or(u32::MAX).max(1),
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
    }
}

/// What tells a file at a name from another one put there since.
pub fn identity(stat: &FileStat) -> Identity {
    Identity { ino: stat.ino, kind: type_bits(stat.kind) }
}

/// A stable, non-zero inode number for a listing's entry (a zero one is
/// skipped by `readdir(3)`): the entry's own, when the kernel holds it,
/// else one from its name.
pub fn entry_ino(name: &[u8]) -> u64 {
    // FNV-1a.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}
