//! Performs the FS proxy's file effects on the real filesystem.
//!
//! Every directory a root needs (the root itself, or a file root's parent)
//! is opened once at start-up as a capability (`cap_std::fs::Dir`), and
//! every file is reached from those descriptors only, one component at a
//! time, by the core's walk ([`airlock_core::resolve`]): each component is
//! opened with `O_PATH|O_NOFOLLOW` relative to the descriptor of the
//! directory already reached, a symlink is read from its own descriptor
//! (`readlinkat(fd, "")`) and handed to the walk, which rewrites the path
//! and starts again from the root containing the new one, and the final
//! component is opened with `O_NOFOLLOW` only once the scope permits the
//! fully resolved path in the mode asked. A name swapped after it was
//! looked at cannot redirect anything: every step acts on a descriptor,
//! and the final open refuses a symlink (nor creates through one).
//!
//! The path operations (stat, list, mkdir, remove, rename, set-attributes)
//! run the core's walks ([`airlock_core::pathops`]) over the same
//! descriptors, with their primitives in [`paths`]: [`HostFs::path`] is the
//! one entry point, for the FS proxy's `Effect::Path` and for any other
//! shell serving the same roots.

use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{Effect, EffectResult, FileId, FsErrorKind};
use airlock_core::guard::{Act, Hit};
use airlock_core::pathops::{self, PathDone, PathOp};
use airlock_core::policy::{Policy, RootId};
use airlock_core::resolve::{self, Create, Entry, Final, Namespace, OpenFinal, OpenHow, Refusal};
use airlock_core::scope::Scope;
use anyhow::{bail, Context};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

mod paths;
#[cfg(test)]
mod tests_paths;

pub struct HostFs {
    /// Each policy root's absolute path, by root id.
    roots: Vec<PathBuf>,
    /// Directories held open, and their physical paths (the walk's anchors).
    dirs: Vec<Dir>,
    anchors: Vec<PathBuf>,
    files: BTreeMap<FileId, File>,
    /// Guarded paths the last effects' walks met (refused or granted),
    /// for the machine's report and audit log (`Input::Guarded`).
    hits: Vec<Hit>,
}

fn failed(kind: FsErrorKind, message: impl Into<String>) -> EffectResult {
    EffectResult::Failed { kind, message: message.into() }
}

fn io_failure(e: &io::Error) -> EffectResult {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => FsErrorKind::NotFound,
        io::ErrorKind::PermissionDenied => FsErrorKind::Denied,
        _ => FsErrorKind::Other,
    };
    failed(kind, e.to_string())
}

pub(crate) fn errno_refusal(e: Errno) -> Refusal {
    match e {
        Errno::NOENT | Errno::NOTDIR => Refusal::NotFound,
        Errno::ACCESS | Errno::PERM | Errno::ISDIR | Errno::NXIO | Errno::ROFS => {
            Refusal::Denied(io::Error::from(e).to_string())
        }
        other => Refusal::Fs(io::Error::from(other).to_string()),
    }
}

/// The root directories as the walk's namespace.
pub(crate) struct Caps<'a> {
    dirs: &'a [Dir],
}

impl Namespace for Caps<'_> {
    type Dir = OwnedFd;

    fn anchor(&mut self, index: usize) -> Result<OwnedFd, Refusal> {
        let dir = self.dirs.get(index).ok_or_else(|| Refusal::Fs("unknown anchor".into()))?;
        rustix::fs::openat(
            dir.as_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(errno_refusal)
    }

    fn lookup(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Entry<OwnedFd>, Refusal> {
        lookup_at(dir, name)
    }
}

impl OpenFinal for Caps<'_> {
    type File = File;

    fn open_final(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        path: &Path,
        mode: Mode,
    ) -> Result<Final<File>, Refusal> {
        self.open_final_how(dir, name, path, mode, None)
    }

    fn open_final_how(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        _: &Path,
        mode: Mode,
        how: Option<&OpenHow>,
    ) -> Result<Final<File>, Refusal> {
        let (access, perm) = match how {
            None => (
                match mode {
                    Mode::Read => OFlags::RDONLY,
                    Mode::Write => OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
                    Mode::Append => OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE,
                    Mode::ReadWrite => OFlags::RDWR | OFlags::CREATE,
                },
                0o666,
            ),
            // A served filesystem's open: the access the mode gives, the
            // rest as `open(2)` was asked (its writes carry their offsets,
            // so never `O_APPEND`).
            Some(how) => {
                let mut f = match mode {
                    Mode::Read => OFlags::RDONLY,
                    Mode::Write | Mode::Append => OFlags::WRONLY,
                    Mode::ReadWrite => OFlags::RDWR,
                };
                f |= match how.create {
                    Create::Never => OFlags::empty(),
                    Create::IfMissing => OFlags::CREATE,
                    Create::Exclusive => OFlags::CREATE | OFlags::EXCL,
                };
                if how.truncate {
                    f |= OFlags::TRUNC;
                }
                (f, how.perm & 0o7777)
            }
        };
        // Never follow (nor create through) a final symlink; never block in
        // open (a FIFO would) nor hand a tty to the child.
        let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, name, flags, rustix::fs::Mode::from_raw_mode(perm)) {
            Ok(fd) => {
                let stat = rustix::fs::fstat(&fd).map_err(errno_refusal)?;
                if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
                    return Err(Refusal::Denied("not a regular file".into()));
                }
                Ok(Final::File(File::from(fd)))
            }
            // O_NOFOLLOW met a symlink: hand its target to the walk.
            Err(Errno::LOOP) => match rustix::fs::readlinkat(dir, name, Vec::new()) {
                Ok(target) => Ok(Final::Symlink(PathBuf::from(OsString::from_vec(target.into_bytes())))),
                Err(e) => Err(errno_refusal(e)),
            },
            Err(e) => Err(errno_refusal(e)),
        }
    }
}

/// What `name` is in `dir`, not following it: a directory as an
/// `O_PATH` descriptor, a symlink's target read from the link's own
/// descriptor (the link looked at). The one lookup every walk of host
/// files makes.
pub(crate) fn lookup_at(dir: &OwnedFd, name: &OsStr) -> Result<Entry<OwnedFd>, Refusal> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags, rustix::fs::Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Entry::Missing),
        Err(e) => return Err(errno_refusal(e)),
    };
    let stat = rustix::fs::fstat(&fd).map_err(errno_refusal)?;
    Ok(match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Entry::Dir(fd),
        FileType::Symlink => {
            let target = rustix::fs::readlinkat(&fd, "", Vec::new()).map_err(errno_refusal)?;
            Entry::Symlink(PathBuf::from(OsString::from_vec(target.into_bytes())))
        }
        _ => Entry::NotDir,
    })
}

impl HostFs {
    /// Open every directory the roots of `policy` need. A root that does not
    /// exist is accepted when its parent directory does (it names a file to
    /// be created). Root paths are taken as physical (the shell resolves
    /// them when it builds the policy).
    pub fn new(policy: &Policy) -> anyhow::Result<Self> {
        Self::open_roots(policy, false)
    }

    /// For a level under an upstream airlock, which reaches files only
    /// through it: inside a confinement's mount view its roots need not
    /// exist here, and are skipped when they do not.
    pub fn nested(policy: &Policy) -> anyhow::Result<Self> {
        Self::open_roots(policy, true)
    }

    fn open_roots(policy: &Policy, nested: bool) -> anyhow::Result<Self> {
        let mut hostfs = HostFs {
            roots: Vec::new(),
            dirs: Vec::new(),
            anchors: Vec::new(),
            files: BTreeMap::new(),
            hits: Vec::new(),
        };
        for root in policy.roots() {
            let path = &root.path;
            hostfs.roots.push(path.clone());
            let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
            let anchor = if is_dir {
                path.clone()
            } else {
                let Some(parent) = path.parent().filter(|_| path.file_name().is_some()) else {
                    bail!("allowed path {} is neither a directory nor a file name", path.display());
                };
                if !parent.is_dir() {
                    if nested {
                        continue;
                    }
                    bail!("allowed path {}: no such file or directory", path.display());
                }
                parent.to_path_buf()
            };
            if hostfs.anchors.contains(&anchor) {
                continue;
            }
            let dir = match Dir::open_ambient_dir(&anchor, ambient_authority()) {
                Ok(dir) => dir,
                Err(_) if nested => continue,
                Err(e) => return Err(e).with_context(|| format!("opening directory {}", anchor.display())),
            };
            hostfs.dirs.push(dir);
            hostfs.anchors.push(anchor);
        }
        Ok(hostfs)
    }

    /// The guarded paths met since last asked.
    pub fn take_hits(&mut self) -> Vec<Hit> {
        std::mem::take(&mut self.hits)
    }

    /// Files currently open on the machine's behalf.
    pub fn open_files(&self) -> usize {
        self.files.len()
    }

    /// Perform a file effect. Stdio effects are not the host filesystem's
    /// and must not reach here.
    pub fn execute(&mut self, effect: Effect) -> EffectResult {
        match effect {
            Effect::Open { file, root, rel, mode, scope, how } => {
                self.open(file, root, &rel, mode, how.as_ref(), &scope)
            }
            Effect::ReadAt { file, offset, max } => {
                let Some(f) = self.files.get(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                let mut data = Vec::with_capacity(max as usize);
                match rustix::io::pread(f, rustix::buffer::spare_capacity(&mut data), offset) {
                    Ok(n) => EffectResult::Data { eof: n == 0, data },
                    Err(e) => io_failure(&io::Error::from(e)),
                }
            }
            Effect::WriteAt { file, offset, data } => {
                let Some(f) = self.files.get(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                match std::os::unix::fs::FileExt::write_all_at(f, &data, offset) {
                    Ok(()) => EffectResult::Written { written: data.len() as u64 },
                    Err(e) => io_failure(&e),
                }
            }
            Effect::Read { file, max } => {
                let Some(f) = self.files.get_mut(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                // Read into spare capacity: nothing zeroed only to be
                // overwritten (a read answer's hot path).
                let mut data = Vec::with_capacity(max as usize);
                match rustix::io::read(&*f, rustix::buffer::spare_capacity(&mut data)) {
                    Ok(n) => EffectResult::Data { eof: n == 0, data },
                    Err(e) => io_failure(&io::Error::from(e)),
                }
            }
            Effect::Write { file, data } => {
                let Some(f) = self.files.get_mut(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                match f.write_all(&data) {
                    Ok(()) => EffectResult::Written { written: data.len() as u64 },
                    Err(e) => io_failure(&e),
                }
            }
            Effect::Close { file } => match self.files.remove(&file) {
                Some(_) => EffectResult::Closed,
                None => failed(FsErrorKind::Other, "file is not open"),
            },
            Effect::Path { op, scope } => EffectResult::of_path(self.path(&op, &scope)),
            Effect::Fstat { file } => match self.files.get(&file).map(rustix::fs::fstat) {
                Some(Ok(s)) => EffectResult::Stat { stat: paths::file_stat(&s) },
                Some(Err(e)) => io_failure(&io::Error::from(e)),
                None => failed(FsErrorKind::Other, "file is not open"),
            },
            Effect::Truncate { file, size } => {
                let Some(f) = self.files.get(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                match rustix::fs::ftruncate(f, size).and_then(|()| rustix::fs::fstat(f)) {
                    Ok(s) => EffectResult::Stat { stat: paths::file_stat(&s) },
                    Err(e) => io_failure(&io::Error::from(e)),
                }
            }
            Effect::Readlink { path, scope } => {
                let mut caps = Caps { dirs: &self.dirs };
                match airlock_core::fuse::readlink::readlink(&mut caps, &self.anchors, &[], &scope, &path) {
                    Ok(target) => EffectResult::Target { target },
                    Err(r) => failed(r.kind(), r.to_string()),
                }
            }
            Effect::ReadStdin { .. } | Effect::WriteStdio { .. } => {
                failed(FsErrorKind::Other, "stdio is not a host file")
            }
            Effect::DrawSecret => {
                failed(FsErrorKind::Other, "a secret is drawn by the session, not the host files")
            }
            Effect::Backing { .. } | Effect::Unback { .. } => {
                failed(FsErrorKind::Other, "a backing file is registered by the session, with its mount")
            }
        }
    }

    /// The open `file`'s descriptor (to register it as a backing file).
    pub fn fd(&self, file: FileId) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.files.get(&file).map(|f| f.as_fd())
    }

    /// Carry out a path operation under `scope`: its paths (absolute,
    /// lexically normal) resolved from the roots' descriptors, decided on
    /// where they lead, and acted on relative to the directory decided on.
    pub fn path(&mut self, op: &PathOp, scope: &Scope) -> Result<PathDone, Refusal> {
        let mut caps = Caps { dirs: &self.dirs };
        let done = pathops::perform(&mut caps, &self.anchors, &[], scope, op);
        // A guarded path the walk met: for the report and the audit log,
        // as for an open.
        if let Err(Refusal::Guarded { hit, .. }) = &done {
            self.hits.push(hit.clone());
        }
        done
    }

    fn open(
        &mut self,
        file: FileId,
        root: RootId,
        rel: &Path,
        mode: Mode,
        how: Option<&OpenHow>,
        scope: &Scope,
    ) -> EffectResult {
        let Some(root_path) = self.roots.get(root.0) else {
            return failed(FsErrorKind::Other, "unknown root");
        };
        let path = root_path.join(rel);
        let mut caps = Caps { dirs: &self.dirs };
        match resolve::open_how(&mut caps, &self.anchors, &[], &path, mode, how, scope) {
            Ok((f, real)) => {
                // A guarded path reached through a grant: for the report.
                let act = if mode.writable() { Act::Write } else { Act::Read };
                if let Ok(Some(hit)) = scope.guard().check(&real, act, false) {
                    self.hits.push(hit);
                }
                self.files.insert(file, f);
                EffectResult::Opened
            }
            Err(refusal) => {
                if let Refusal::Guarded { hit, .. } = &refusal {
                    self.hits.push(hit.clone());
                }
                failed(refusal.kind(), refusal.to_string())
            }
        }
    }
}
