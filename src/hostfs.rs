//! Performs the FS proxy's file effects on the real filesystem.
//!
//! Every root of the policy is opened once as a capability (`cap_std::fs::Dir`)
//! and every file is opened *relative to* its root through it, so a symlink
//! or `..` that would lead out of the root is refused by the kernel-backed
//! resolution of cap-std, not by string checks.

use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{Effect, EffectResult, FileId, FsErrorKind};
use airlock_core::policy::{Policy, RootId};
use anyhow::{bail, Context};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;

struct RootDir {
    dir: Dir,
    /// A root that names a single file: the file's name inside `dir`.
    file_name: Option<std::ffi::OsString>,
}

pub struct HostFs {
    roots: Vec<RootDir>,
    files: BTreeMap<FileId, File>,
}

fn failed(kind: FsErrorKind, message: impl Into<String>) -> EffectResult {
    EffectResult::Failed { kind, message: message.into() }
}

fn io_failure(e: &io::Error) -> EffectResult {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => FsErrorKind::NotFound,
        // cap-std reports a path that led out of its root as PermissionDenied;
        // ELOOP is what a refused trailing symlink looks like.
        io::ErrorKind::PermissionDenied => FsErrorKind::Denied,
        _ if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => FsErrorKind::Denied,
        _ => FsErrorKind::Other,
    };
    failed(kind, e.to_string())
}

impl HostFs {
    /// Open every root of `policy`. A root that does not exist is accepted
    /// when its parent directory does (it names a file to be created).
    pub fn new(policy: &Policy) -> anyhow::Result<Self> {
        let mut roots = Vec::new();
        for root in policy.roots() {
            let path = &root.path;
            let rd = match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => RootDir {
                    dir: Dir::open_ambient_dir(path, ambient_authority())
                        .with_context(|| format!("opening allowed directory {}", path.display()))?,
                    file_name: None,
                },
                Ok(_) | Err(_) => {
                    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                        bail!("allowed path {} is neither a directory nor a file name", path.display());
                    };
                    if !parent.is_dir() {
                        bail!("allowed path {}: no such file or directory", path.display());
                    }
                    RootDir {
                        dir: Dir::open_ambient_dir(parent, ambient_authority())
                            .with_context(|| format!("opening directory {}", parent.display()))?,
                        file_name: Some(name.to_owned()),
                    }
                }
            };
            roots.push(rd);
        }
        Ok(HostFs { roots, files: BTreeMap::new() })
    }

    /// Files currently open on the machine's behalf.
    pub fn open_files(&self) -> usize {
        self.files.len()
    }

    /// Perform a file effect. Stdio effects are not the host filesystem's
    /// and must not reach here.
    pub fn execute(&mut self, effect: Effect) -> EffectResult {
        match effect {
            Effect::Open { file, root, rel, mode } => self.open(file, root, &rel, mode),
            Effect::Read { file, max } => {
                let Some(f) = self.files.get_mut(&file) else {
                    return failed(FsErrorKind::Other, "file is not open");
                };
                let mut buf = vec![0; max as usize];
                match f.read(&mut buf) {
                    Ok(n) => {
                        buf.truncate(n);
                        EffectResult::Data { eof: n == 0, data: buf }
                    }
                    Err(e) => io_failure(&e),
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
            Effect::ReadStdin { .. } | Effect::WriteStdio { .. } => {
                failed(FsErrorKind::Other, "stdio is not a host file")
            }
        }
    }

    fn open(&mut self, file: FileId, root: RootId, rel: &Path, mode: Mode) -> EffectResult {
        let Some(rd) = self.roots.get(root.0) else {
            return failed(FsErrorKind::Other, "unknown root");
        };
        let target: &Path = match &rd.file_name {
            None if rel.as_os_str().is_empty() => Path::new("."),
            None => rel,
            Some(name) if rel.as_os_str().is_empty() => Path::new(name),
            Some(_) => return failed(FsErrorKind::NotFound, "the allowed path is a file, not a directory"),
        };
        let mut opts = OpenOptions::new();
        match mode {
            Mode::Read => opts.read(true),
            Mode::Write => opts.write(true).create(true).truncate(true),
            Mode::Append => opts.append(true).create(true),
            Mode::ReadWrite => opts.read(true).write(true).create(true),
        };
        // Never block in open (a FIFO would) nor hand a tty to the child.
        opts.custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32);
        let f = match rd.dir.open_with(target, &opts) {
            Ok(f) => f,
            Err(e) => return io_failure(&e),
        };
        match f.metadata() {
            Ok(m) if m.is_file() => {
                self.files.insert(file, f);
                EffectResult::Opened
            }
            Ok(_) => failed(FsErrorKind::Denied, "not a regular file"),
            Err(e) => io_failure(&e),
        }
    }
}
