//! The kernel's FUSE ABI (`include/uapi/linux/fuse.h`): the numbers and
//! the sizes of the structures the codec reads and writes. Only what the
//! served filesystem uses is named; everything else is an unknown opcode
//! answered `ENOSYS`.

/// The protocol's major version; a kernel speaking another is refused.
pub const KERNEL_VERSION: u32 = 7;
/// The minor version airlock speaks: 7.40 added passthrough
/// (`FUSE_PASSTHROUGH`, `backing_id` in `fuse_open_out`).
pub const KERNEL_MINOR_VERSION: u32 = 40;
/// The oldest minor version served: 7.31 (Linux 5.4) has every structure
/// in its current size and `FUSE_MAX_PAGES`.
pub const MIN_MINOR_VERSION: u32 = 31;

/// The node id of a mount's root.
pub const ROOT_ID: u64 = 1;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
}

/// `fuse_init_in.flags` / `fuse_init_out.flags` (the upper 32 bits travel
/// in `flags2` once `INIT_EXT` is agreed).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const PASSTHROUGH: u64 = 1 << 37;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const KEEP_CACHE: u32 = 1 << 1;
    /// A directory's listing kept by the kernel (with `KEEP_CACHE`, across
    /// opens) until the directory changes: through the mount at once, on
    /// the host once its attributes are asked again (`--fuse-cache-ms`).
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is meaningful.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`: data only.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

/// `renameat2` flags.
pub const RENAME_NOREPLACE: u32 = 1 << 0;
pub const RENAME_EXCHANGE: u32 = 1 << 1;
pub const RENAME_WHITEOUT: u32 = 1 << 2;

/// The smallest read buffer the kernel accepts.
pub const MIN_READ_BUFFER: usize = 8192;

pub const IN_HEADER_LEN: usize = 40;
pub const OUT_HEADER_LEN: usize = 16;
pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
pub const OPEN_OUT_LEN: usize = 16;
pub const INIT_IN_LEN: usize = 64;
/// `fuse_init_in` before 7.36 (no `flags2`): 16 bytes.
pub const INIT_IN_COMPAT_LEN: usize = 16;
pub const INIT_OUT_LEN: usize = 64;
pub const STATFS_OUT_LEN: usize = 80;
pub const SETATTR_IN_LEN: usize = 88;
pub const READ_IN_LEN: usize = 40;
pub const WRITE_IN_LEN: usize = 40;
pub const RELEASE_IN_LEN: usize = 24;
pub const DIRENT_NAME_OFFSET: usize = 24;
pub const DIRENTPLUS_NAME_OFFSET: usize = ENTRY_OUT_LEN + DIRENT_NAME_OFFSET;

/// Longest name in a directory (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Longest symlink target (`PATH_MAX` less its NUL).
pub const PATH_MAX: usize = 4095;

/// `errno` values the served filesystem answers with.
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EBADF: i32 = 9;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EACCES: i32 = 13;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const ERANGE: i32 = 34;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOSYS: i32 = 38;
    pub const ENOTEMPTY: i32 = 39;
    pub const ELOOP: i32 = 40;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EINTR: i32 = 4;
    pub const ESTALE: i32 = 116;
}

/// File type bits of a mode.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// `d_type` values of a directory entry.
pub const DT_UNKNOWN: u32 = 0;
pub const DT_DIR: u32 = 4;
pub const DT_REG: u32 = 8;
pub const DT_LNK: u32 = 10;

/// Open flags (`O_*`) the machine looks at.
pub mod oflags {
    pub const ACCMODE: u32 = 0o3;
    pub const RDONLY: u32 = 0;
    pub const WRONLY: u32 = 1;
    pub const RDWR: u32 = 2;
    pub const CREAT: u32 = 0o100;
    pub const EXCL: u32 = 0o200;
    pub const TRUNC: u32 = 0o1000;
    pub const APPEND: u32 = 0o2000;
}

/// `access(2)` mask bits.
pub const W_OK: u32 = 2;
