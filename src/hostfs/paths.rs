//! The path operations' primitives on the real file system
//! ([`PathNs`]): every one an `*at` call relative to the descriptor of the
//! directory the core's walk reached and decided on, never following a
//! symlink at the name (`O_PATH|O_NOFOLLOW`, `unlinkat`, `renameat2`,
//! `mkdirat`), so a name swapped after the decision cannot redirect it.
//!
//! `list` reads the whole directory but keeps only the `max` smallest
//! names after the cursor (a bounded ordered set), so a directory of a
//! million entries costs one pass per page and memory for one page.

use super::{errno_refusal, Caps};
use airlock_core::pathops::{DirEntry, FileStat, Kind, Node, Page, PathNs, SetAttr, Time};
use airlock_core::resolve::Refusal;
use rustix::fs::{AtFlags, FileType, OFlags, RenameFlags, Timespec, Timestamps};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

const NO_MODE: rustix::fs::Mode = rustix::fs::Mode::empty();

fn kind_of(t: FileType) -> Kind {
    match t {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// What `stat(2)` says, as the core keeps it.
pub(super) fn file_stat(s: &rustix::fs::Stat) -> FileStat {
    let time = |sec: i64, nsec: u64| Time { sec, nsec: u32::try_from(nsec).unwrap_or(0) };
    FileStat {
        kind: kind_of(FileType::from_raw_mode(s.st_mode)),
        size: u64::try_from(s.st_size).unwrap_or(0),
        mode: s.st_mode & 0o7777,
        nlink: s.st_nlink,
        ino: s.st_ino,
        #[allow(clippy::unnecessary_cast)]
        mtime: time(s.st_mtime as i64, s.st_mtime_nsec as u64),
        #[allow(clippy::unnecessary_cast)]
        atime: time(s.st_atime as i64, s.st_atime_nsec as u64),
        #[allow(clippy::unnecessary_cast)]
        ctime: time(s.st_ctime as i64, s.st_ctime_nsec as u64),
    }
}

/// Errors of the changing calls: what exists, is not empty, or is of the
/// wrong kind is a conflict with the request (`E_ARG`), not a refusal.
fn change_refusal(e: Errno, what: &OsStr) -> Refusal {
    let name = what.to_string_lossy();
    match e {
        Errno::EXIST => Refusal::Conflict(format!("{name} already exists")),
        Errno::NOTEMPTY => Refusal::Conflict(format!("{name} is a directory that is not empty")),
        Errno::ISDIR => Refusal::Conflict(format!("{name} is a directory")),
        Errno::INVAL => Refusal::Conflict(format!("{name}: a directory cannot move into itself")),
        Errno::XDEV => {
            Refusal::Fs(format!("{name}: the two paths are on different file systems: copy, then remove"))
        }
        Errno::BUSY => Refusal::Denied(format!("{name} is in use (a mount point)")),
        other => errno_refusal(other),
    }
}

impl PathNs for Caps<'_> {
    fn inspect(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Option<Node<OwnedFd>>, Refusal> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, NO_MODE) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(errno_refusal(e)),
        };
        let stat = file_stat(&rustix::fs::fstat(&fd).map_err(errno_refusal)?);
        Ok(Some(match stat.kind {
            Kind::Dir => Node { stat, dir: Some(fd), target: None },
            Kind::Symlink => {
                let target = rustix::fs::readlinkat(&fd, "", Vec::new()).map_err(errno_refusal)?;
                Node { stat, dir: None, target: Some(PathBuf::from(OsString::from_vec(target.into_bytes()))) }
            }
            _ => Node { stat, dir: None, target: None },
        }))
    }

    fn list(
        &mut self,
        dir: &OwnedFd,
        after: Option<&[u8]>,
        max: usize,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Page, Refusal> {
        let fd = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, NO_MODE)
            .map_err(errno_refusal)?;
        let mut entries = rustix::fs::Dir::new(fd).map_err(errno_refusal)?;
        // The `max + 1` smallest names kept so far: one more than a page,
        // to know whether another page follows.
        let mut page: BTreeMap<Vec<u8>, FileType> = BTreeMap::new();
        while let Some(entry) = entries.read() {
            let entry = entry.map_err(errno_refusal)?;
            let name = entry.file_name().to_bytes();
            if matches!(name, b"." | b"..") || after.is_some_and(|a| name <= a) {
                continue;
            }
            if page.len() > max && page.last_key_value().is_some_and(|(last, _)| name >= last.as_slice()) {
                continue;
            }
            if !keep(name) {
                continue;
            }
            page.insert(name.to_vec(), entry.file_type());
            if page.len() > max + 1 {
                page.pop_last();
            }
        }
        let more = page.len() > max;
        let mut out = Page { entries: Vec::with_capacity(page.len().min(max)), more };
        for (name, file_type) in page.into_iter().take(max) {
            let os = OsStr::from_bytes(&name);
            // The type the directory gave, or what the name is now; a
            // file's size from a look at it without following it.
            let stat = match file_type {
                FileType::RegularFile | FileType::Unknown => {
                    rustix::fs::statat(dir, os, AtFlags::SYMLINK_NOFOLLOW).ok().map(|s| file_stat(&s))
                }
                _ => None,
            };
            let kind = stat.as_ref().map_or_else(|| kind_of(file_type), |s| s.kind);
            let size = stat.filter(|s| s.kind == Kind::File).map_or(0, |s| s.size);
            let Ok(name) = String::from_utf8(name) else { continue };
            out.entries.push(DirEntry { name, kind, size });
        }
        Ok(out)
    }

    fn mkdir(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<(), Refusal> {
        rustix::fs::mkdirat(dir, name, rustix::fs::Mode::from_raw_mode(0o777))
            .map_err(|e| change_refusal(e, name))
    }

    fn remove(&mut self, dir: &OwnedFd, name: &OsStr, is_dir: bool) -> Result<(), Refusal> {
        let flags = if is_dir { AtFlags::REMOVEDIR } else { AtFlags::empty() };
        rustix::fs::unlinkat(dir, name, flags).map_err(|e| change_refusal(e, name))
    }

    fn rename(
        &mut self,
        from_dir: &OwnedFd,
        from: &OsStr,
        to_dir: &OwnedFd,
        to: &OsStr,
        noreplace: bool,
    ) -> Result<(), Refusal> {
        let flags = if noreplace { RenameFlags::NOREPLACE } else { RenameFlags::empty() };
        rustix::fs::renameat_with(from_dir, from, to_dir, to, flags).map_err(|e| change_refusal(e, to))
    }

    fn set_attr(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        seen: &FileStat,
        attr: &SetAttr,
    ) -> Result<FileStat, Refusal> {
        let access = if attr.size.is_some() { OFlags::WRONLY } else { OFlags::RDONLY };
        let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, NO_MODE) {
            Ok(fd) => fd,
            Err(Errno::LOOP) => return Err(Refusal::Conflict("changed while in use".into())),
            Err(e) => return Err(errno_refusal(e)),
        };
        let now = file_stat(&rustix::fs::fstat(&fd).map_err(errno_refusal)?);
        if now.ino != seen.ino || now.kind != seen.kind {
            return Err(Refusal::Conflict("changed while in use".into()));
        }
        if let Some(size) = attr.size {
            rustix::fs::ftruncate(&fd, size).map_err(errno_refusal)?;
        }
        if let Some(mode) = attr.mode {
            rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode & 0o7777)).map_err(errno_refusal)?;
        }
        if attr.atime.is_some() || attr.mtime.is_some() {
            let spec = |t: Option<Time>| match t {
                Some(t) => Timespec { tv_sec: t.sec, tv_nsec: i64::from(t.nsec) },
                None => Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT },
            };
            let times = Timestamps { last_access: spec(attr.atime), last_modification: spec(attr.mtime) };
            rustix::fs::futimens(&fd, &times).map_err(errno_refusal)?;
        }
        Ok(file_stat(&rustix::fs::fstat(&fd).map_err(errno_refusal)?))
    }
}
