//! Leftovers of dead sessions, found and removed: socket directories and
//! placeholder ledgers (`crate::holds`), named by
//! `airlock_core::sandbox::sweep`, which decides what is stale; and a
//! tree removed whatever a child did to its modes.

use airlock_core::sandbox::sweep::{self, Owner};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// This process, as its leftovers name it.
pub fn me() -> Owner {
    Owner { pid: std::process::id(), start: running_start(std::process::id()).unwrap_or(0) }
}

/// The start time of the process that has `pid` now, if any.
pub fn running_start(pid: u32) -> Option<u64> {
    sweep::start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Remove the socket directories in `base` that dead sessions of this
/// user left, and the placeholders their ledgers name (a SIGKILLed airlock cleans nothing up): named for an owner
/// that no longer runs, or of the unowned older form with no one
/// listening on the socket inside. Anything not the user's own directory
/// is left alone. Errors are logged, never fatal.
pub fn socket_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    // SAFETY: geteuid takes nothing.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(text) = name.to_str() else { continue };
        let stale = match sweep::owner(text) {
            Some(owner) => sweep::is_stale(owner, running_start(owner.pid)),
            None if sweep::is_unowned_socket_dir(text) => nobody_listens(&entry.path().join("session")),
            None => continue,
        };
        if !stale {
            continue;
        }
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() && m.uid() == me => {}
            Ok(m) if m.is_file() && m.uid() == me && crate::holds::is_ledger(text) => {
                crate::holds::release_ledger(&path);
                continue;
            }
            _ => continue,
        }
        match remove_tree(&path) {
            Ok(()) => tracing::debug!("removed {}, left by a session that is gone", path.display()),
            Err(e) => tracing::warn!("removing {}, left by a session that is gone: {e}", path.display()),
        }
    }
}

fn nobody_listens(socket: &Path) -> bool {
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(_) => false,
        Err(e) => matches!(e.raw_os_error(), Some(libc::ECONNREFUSED) | Some(libc::ENOENT)),
    }
}

/// Remove `path` and everything beneath it without following a symlink,
/// giving each directory back its owner's write and search bits first: a
/// child that made a directory 0500 (or 0) does not keep it on disk.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("no name to remove"))?;
    let dir = rustix::fs::open(parent, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    remove_at(&dir, name, 0)
}

/// Deeper than this is not a tree airlock made.
const MAX_DEPTH: usize = 64;

fn remove_at(parent: &OwnedFd, name: &OsStr, depth: usize) -> std::io::Result<()> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other("too deep"));
    }
    // O_PATH opens a directory whatever its mode; its mode is then set
    // through the descriptor's /proc link, which never follows a symlink
    // put in its place.
    let nofollow = OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let handle = rustix::fs::openat(parent, name, OFlags::PATH | nofollow, Mode::empty())?;
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    let _ = rustix::fs::chmod(link.as_str(), Mode::from_raw_mode(0o700));
    let dir = rustix::fs::openat(&handle, ".", OFlags::RDONLY | nofollow, Mode::empty())?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir.as_fd())? {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_owned());
        }
    }
    for n in names {
        remove_at(&dir, &n, depth + 1)?;
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_tree_goes_whatever_its_modes_and_symlinks_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::write(top.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, top.join("a/link")).unwrap();
        for (p, m) in [("a/b", 0o500), ("a", 0o000), ("", 0o500)] {
            std::fs::set_permissions(top.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        assert!(outside.join("keep").exists());
    }
}
