//! The served filesystem's requests (see [`crate::fuse`]), answered by the
//! FS proxy machine: each mount is one of its clients, its opens handles
//! in the same table under the same limits, its decisions the same walk's
//! (an `Effect::Open` or `Effect::Path` the shell resolves from its root
//! descriptors and decides on what it resolves to), its records the same
//! audit log's.
//!
//! A request that needs the host becomes one effect (two for a create or
//! a mkdir, which then look at what they made); everything else is
//! answered at once. Node ids are the mount's node table's; file handles
//! are the proxy's handle numbers, directory handles the mount's own.

use super::audit::{AuditOp, AuditRecord};
use super::wire::{ErrorCode, Mode};
use super::{
    Effect, EffectId, EffectResult, FileId, FsErrorKind, FsProxy, Output, Pending, Slot, Target, Waiting,
};
use crate::fuse::abi::{self, errno, fattr, fopen, oflags};
use crate::fuse::codec::{
    self, DirBuf, DirEntry, EntryOut, Name, Op, OpenOut, Reply, Request, SetattrIn, Statfs,
};
use crate::fuse::mount::{self, Backing, Mount, DIR_HANDLE_BASE};
use crate::handles::{ClientId, Handle};
use crate::pathops::{Kind, PathOp, SetAttr, Time};
use crate::policy::{bytes, RootId};
use crate::resolve::{Create, OpenHow};
use std::path::PathBuf;

/// `utimensat`'s "now".
pub const UTIME_NOW: u32 = (1 << 30) - 1;

/// What a request waiting on an effect is waiting for.
#[derive(Debug)]
pub(super) struct FuseWait {
    unique: u64,
    step: Step,
}

#[derive(Debug)]
enum Step {
    Lookup {
        parent: u64,
        name: Name,
    },
    /// An attribute reply (`GETATTR`, `SETATTR`).
    Attr,
    Readlink,
    Mkdir {
        parent: u64,
        name: Name,
        path: PathBuf,
    },
    /// The new directory, looked at.
    Made {
        parent: u64,
        name: Name,
    },
    Remove {
        parent: u64,
        name: Name,
    },
    Rename {
        parent: u64,
        name: Name,
        newdir: u64,
        newname: Name,
    },
    Open {
        file: FileId,
        mode: Mode,
        path: PathBuf,
        created: Option<(u64, Name)>,
        /// The node, when its reads may go by the kernel (passthrough).
        through: Option<u64>,
    },
    /// A read-only open, its host file being registered for its node.
    Backed {
        handle: Handle,
        node: u64,
    },
    /// The new file, looked at, to answer the create.
    Created {
        handle: Handle,
        parent: u64,
        name: Name,
    },
    Read {
        handle: Handle,
    },
    Write {
        handle: Handle,
    },
    Release {
        handle: Handle,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Access {
        mask: u32,
        path: PathBuf,
    },
}

/// A failed effect's errno, for the request it served.
fn errno_of(kind: FsErrorKind, step: &Step) -> i32 {
    match kind {
        FsErrorKind::NotFound => errno::ENOENT,
        FsErrorKind::Denied => errno::EACCES,
        FsErrorKind::Conflict => match step {
            Step::Remove { .. } | Step::Rename { .. } => errno::ENOTEMPTY,
            Step::Readdir { .. } => errno::ENOTDIR,
            Step::Readlink => errno::EINVAL,
            _ => errno::EEXIST,
        },
        FsErrorKind::Other => errno::EIO,
    }
}

/// The protocol code an errno is recorded under in the audit log.
fn code_of(e: i32) -> ErrorCode {
    match e {
        errno::ENOENT => ErrorCode::NoEnt,
        errno::EACCES | errno::EPERM => ErrorCode::Perm,
        errno::ENFILE | errno::EMFILE | errno::EAGAIN => ErrorCode::Range,
        _ => ErrorCode::Io,
    }
}

fn dtype(kind: Kind) -> u32 {
    match kind {
        Kind::Dir => abi::DT_DIR,
        Kind::Symlink => abi::DT_LNK,
        Kind::File | Kind::Other => abi::DT_REG,
    }
}

fn time(secs: u64, nsecs: u32, now: bool) -> Time {
    if now {
        Time { sec: 0, nsec: UTIME_NOW }
    } else {
        Time { sec: i64::try_from(secs).unwrap_or(i64::MAX), nsec: nsecs.min(999_999_999) }
    }
}

impl FsProxy {
    /// `client` now serves the mount of root `root`, owned by `uid`/`gid`;
    /// `passthrough`: the shell can register backing files for it.
    pub(super) fn fuse_mounted(
        &mut self,
        client: ClientId,
        root: RootId,
        uid: u32,
        gid: u32,
        passthrough: bool,
    ) {
        let Some(r) = self.config.policy.root(root) else {
            self.outputs.push_back(Output::Close { client });
            return;
        };
        if self.fuse.contains_key(&client) || self.clients.contains_key(&client) {
            return;
        }
        let m = Mount::new(root, r.path.clone(), uid, gid, &self.config.fuse, passthrough);
        self.fuse.insert(client, m);
        self.stats.fuse.mounts += 1;
    }

    /// Whether the shell may read another request of mount `client`.
    pub fn fuse_ready(&self, client: ClientId) -> bool {
        self.fuse.get(&client).is_some_and(|m| !m.gone && m.pending < self.config.fuse.max_pending)
    }

    /// Mounts being served (or cleaned up).
    pub fn fuse_mounts(&self) -> usize {
        self.fuse.len()
    }

    /// Nodes the kernel holds of mount `client`, and its lookups handed
    /// out and given back (for the simulator's balance check).
    pub fn fuse_nodes(&self, client: ClientId) -> Option<(usize, (u64, u64))> {
        self.fuse.get(&client).map(|m| (m.nodes.len(), m.nodes.balance()))
    }

    fn fuse_reply(&mut self, client: ClientId, unique: u64, reply: Reply) {
        let Some(m) = self.fuse.get(&client) else { return };
        if m.gone {
            return;
        }
        if let Reply::Error(e) = reply {
            *self.stats.fuse.errors.entry(e).or_default() += 1;
        }
        self.stats.fuse.replies += 1;
        self.outputs.push_back(Output::FuseReply { client, data: codec::encode_reply(unique, &reply) });
    }

    fn fuse_audit(&mut self, record: AuditRecord) {
        if self.audit.is_some() {
            self.outputs.push_back(Output::Audit { record });
        }
    }

    fn fuse_effect(&mut self, client: ClientId, unique: u64, step: Step, effect: Effect) {
        let id = EffectId(self.next_effect);
        self.next_effect += 1;
        if matches!(step, Step::Open { .. }) {
            self.opening += 1;
            self.host_fds += 1;
        }
        if let Some(m) = self.fuse.get_mut(&client) {
            m.pending += 1;
        }
        let waiting = Waiting::Fuse(FuseWait { unique, step });
        self.pending.insert(id, Pending { client, req: None, waiting });
        self.outputs.push_back(Output::Effect { id, effect });
    }

    fn path_effect(&mut self, client: ClientId, unique: u64, step: Step, op: PathOp) {
        let scope = self.own_scope.clone();
        self.fuse_effect(client, unique, step, Effect::Path { op, scope });
    }

    /// One request of mount `client`: the bytes of one read of its device.
    pub(super) fn on_fuse(&mut self, client: ClientId, data: &[u8]) {
        let Some(m) = self.fuse.get(&client) else { return };
        if m.gone {
            return;
        }
        self.stats.fuse.requests += 1;
        let req = match codec::parse_request(data) {
            Ok(r) => r,
            Err(refused) => {
                self.stats.fuse.rejected += 1;
                if let Some(unique) = refused.unique {
                    self.fuse_reply(client, unique, Reply::Error(refused.error.errno()));
                }
                return;
            }
        };
        let unique = req.header.unique;
        // A release is never refused: the kernel forgets the file whatever
        // the answer, so a refused one would leave its host file open.
        let releases = matches!(
            req.op,
            Op::Release { .. } | Op::Releasedir { .. } | Op::Destroy | Op::Flush { .. } | Op::Fsync { .. }
        );
        if m.pending >= self.config.fuse.max_pending && !req.op.unanswered() && !releases {
            // The shell reads no more than this; one that did anyway is
            // refused rather than held.
            self.stats.bounds_refused += 1;
            return self.fuse_reply(client, unique, Reply::Error(errno::EAGAIN));
        }
        if m.agreed.is_none() && !matches!(req.op, Op::Init(_)) {
            return self.fuse_reply(client, unique, Reply::Error(errno::EIO));
        }
        if let Err(e) = self.fuse_serve(client, req) {
            self.fuse_reply(client, unique, Reply::Error(e));
        }
    }

    /// Serve `req`: answered here, or handed to an effect. `Err` is the
    /// errno to answer with.
    fn fuse_serve(&mut self, client: ClientId, req: Request) -> Result<(), i32> {
        let Request { header, op } = req;
        let (unique, node) = (header.unique, header.nodeid);
        let config = self.config.fuse.clone();
        let Some(m) = self.fuse.get_mut(&client) else { return Ok(()) };
        match op {
            Op::Init(i) => {
                let out = m.init(&i, &config)?;
                self.fuse_reply(client, unique, Reply::Init(out));
            }
            Op::Destroy => {
                self.fuse_reply(client, unique, Reply::Empty);
                self.fuse_depart(client);
            }
            Op::Forget { nlookup } => m.nodes.forget(node, nlookup),
            Op::BatchForget { forgets } => {
                for (n, count) in forgets {
                    m.nodes.forget(n, count);
                }
            }
            Op::Interrupt { .. } => {
                // Every effect is short and ends with its reply; the
                // request interrupted is answered as it completes.
                self.stats.fuse.interrupts += 1;
            }
            Op::NotifyReply => {}
            Op::Lookup { name } => {
                let path = m.child_path(node, &name).ok_or(errno::ENOENT)?;
                if !m.nodes.has_room() && m.nodes.child(node, &name).is_none() {
                    self.stats.bounds_refused += 1;
                    return Err(errno::ENFILE);
                }
                self.path_effect(
                    client,
                    unique,
                    Step::Lookup { parent: node, name },
                    PathOp::Stat { path, follow: false },
                );
            }
            Op::Getattr { fh } => {
                let path = m.path_of(node);
                match fh.and_then(|fh| self.fuse_file(client, fh)) {
                    Some((_, file)) => self.fuse_effect(client, unique, Step::Attr, Effect::Fstat { file }),
                    None => {
                        let path = path.ok_or(errno::ENOENT)?;
                        self.path_effect(client, unique, Step::Attr, PathOp::Stat { path, follow: false });
                    }
                }
            }
            Op::Setattr(s) => self.fuse_setattr(client, unique, node, &s)?,
            Op::Readlink => {
                let path = m.path_of(node).ok_or(errno::ENOENT)?;
                let scope = self.own_scope.clone();
                self.fuse_effect(client, unique, Step::Readlink, Effect::Readlink { path, scope });
            }
            // Links and special files are never made in a root: a link
            // would point the host's later readers anywhere, a device or
            // FIFO is no file of the project.
            Op::Symlink { .. } | Op::Link { .. } | Op::Mknod { .. } => return Err(errno::EPERM),
            Op::Mkdir { name, .. } => {
                let path = m.child_path(node, &name).ok_or(errno::ENOENT)?;
                let step = Step::Mkdir { parent: node, name, path: path.clone() };
                self.path_effect(client, unique, step, PathOp::Mkdir { path, parents: false });
            }
            Op::Unlink { name } | Op::Rmdir { name } => {
                let path = m.child_path(node, &name).ok_or(errno::ENOENT)?;
                self.path_effect(
                    client,
                    unique,
                    Step::Remove { parent: node, name },
                    PathOp::Remove { path },
                );
            }
            Op::Rename { newdir, name, newname, flags } => {
                if flags & !abi::RENAME_NOREPLACE != 0 {
                    return Err(errno::EINVAL);
                }
                let from = m.child_path(node, &name).ok_or(errno::ENOENT)?;
                let to = m.child_path(newdir, &newname).ok_or(errno::ENOENT)?;
                let noreplace = flags & abi::RENAME_NOREPLACE != 0;
                let step = Step::Rename { parent: node, name, newdir, newname };
                self.path_effect(client, unique, step, PathOp::Rename { from, to, noreplace });
            }
            Op::Open { flags } => {
                let path = m.path_of(node).ok_or(errno::ENOENT)?;
                let (mode, how) = open_mode(flags, None);
                // Passthrough where no open of the node could ever write:
                // the kernel takes every open of a node it passes through
                // the same way.
                let through = (mode == Mode::Read
                    && m.agreed.is_some_and(|a| a.passthrough())
                    && !self.own_scope.permits(&path, true))
                .then_some(node);
                self.fuse_open(client, unique, path, (mode, how), None, through)?;
            }
            Op::Create { name, flags, mode, umask } => {
                let path = m.child_path(node, &name).ok_or(errno::ENOENT)?;
                if !m.nodes.has_room() {
                    self.stats.bounds_refused += 1;
                    return Err(errno::ENFILE);
                }
                let opening = open_mode(flags, Some(mode & !umask & 0o7777));
                self.fuse_open(client, unique, path, opening, Some((node, name)), None)?;
            }
            Op::Read { fh, offset, size } => {
                let (handle, file) = self.fuse_file(client, fh).ok_or(errno::EBADF)?;
                if !self.slot_mode(client, handle).is_some_and(Mode::readable) {
                    return Err(errno::EBADF);
                }
                let max = size.min(config.max_write);
                self.fuse_effect(client, unique, Step::Read { handle }, Effect::ReadAt { file, offset, max });
            }
            Op::Write { fh, offset, data } => {
                let (handle, file) = self.fuse_file(client, fh).ok_or(errno::EBADF)?;
                if !self.slot_mode(client, handle).is_some_and(Mode::writable) {
                    return Err(errno::EBADF);
                }
                self.fuse_effect(
                    client,
                    unique,
                    Step::Write { handle },
                    Effect::WriteAt { file, offset, data },
                );
            }
            Op::Release { fh } => {
                let (handle, file) = self.fuse_file(client, fh).ok_or(errno::EBADF)?;
                let path = self.fuse_open_path(client, handle);
                self.fuse_unthrough(client, handle);
                let _ = self.table.remove(client, handle);
                self.stats.handles_closed += 1;
                if self.config.planted_bug == Some(super::PlantedBug::FuseReleaseKeepsFile) {
                    self.fuse_reply(client, unique, Reply::Empty);
                    return Ok(());
                }
                self.fuse_audit(AuditRecord {
                    handle: Some(handle),
                    ..AuditRecord::of(client, AuditOp::Close, path)
                });
                self.fuse_effect(client, unique, Step::Release { handle }, Effect::Close { file });
            }
            // Writes go to the host file as they come (no write-back
            // cache): nothing is held here to flush or sync.
            Op::Flush { .. } | Op::Fsync { .. } | Op::Fsyncdir { .. } => {
                self.fuse_reply(client, unique, Reply::Empty)
            }
            Op::Opendir { .. } => {
                if m.path_of(node).is_none() {
                    return Err(errno::ENOENT);
                }
                if m.dirs.len() >= self.config.max_open_handles {
                    self.stats.bounds_refused += 1;
                    return Err(errno::EMFILE);
                }
                let fh = m.open_dir(node);
                // The opendir is still asked here each time; a listing the
                // kernel kept is read without asking again (a `git status`
                // lists every directory of the checkout each run).
                let open_flags = fopen::CACHE_DIR | fopen::KEEP_CACHE;
                self.fuse_reply(client, unique, Reply::Open(OpenOut { fh, open_flags, backing_id: 0 }));
            }
            Op::Readdir { plus: true, .. } => return Err(errno::ENOSYS),
            Op::Readdir { fh, offset, size, plus: false } => {
                self.fuse_readdir(client, unique, fh, offset, size)?
            }
            Op::Releasedir { fh } => {
                m.dirs.remove(&fh);
                self.fuse_reply(client, unique, Reply::Empty);
            }
            Op::Statfs => {
                let s =
                    Statfs { bsize: 4096, frsize: 4096, namelen: abi::NAME_MAX as u32, ..Statfs::default() };
                self.fuse_reply(client, unique, Reply::Statfs(s));
            }
            Op::Access { mask } => {
                let path = m.path_of(node).ok_or(errno::ENOENT)?;
                let step = Step::Access { mask, path: path.clone() };
                self.path_effect(client, unique, step, PathOp::Stat { path, follow: false });
            }
            Op::Getxattr { .. } | Op::Listxattr { .. } | Op::Setxattr | Op::Removexattr | Op::Unsupported => {
                return Err(errno::ENOSYS)
            }
        }
        Ok(())
    }

    /// The handle and host file a file handle `fh` of mount `client` names.
    fn fuse_file(&self, client: ClientId, fh: u64) -> Option<(Handle, FileId)> {
        if fh >= DIR_HANDLE_BASE {
            return None;
        }
        let handle = Handle::new(fh);
        match self.table.get(client, handle) {
            Ok(Slot { target: Target::Host(file), .. }) => Some((handle, *file)),
            _ => None,
        }
    }

    fn slot_mode(&self, client: ClientId, handle: Handle) -> Option<Mode> {
        self.table.get(client, handle).ok().map(|s| s.mode)
    }

    fn fuse_open_path(&self, client: ClientId, handle: Handle) -> Option<String> {
        self.fuse.get(&client).and_then(|m| m.opened.get(&handle)).map(|p| p.to_string_lossy().into_owned())
    }

    fn fuse_open(
        &mut self,
        client: ClientId,
        unique: u64,
        path: PathBuf,
        (mode, how): (Mode, OpenHow),
        created: Option<(u64, Name)>,
        through: Option<u64>,
    ) -> Result<(), i32> {
        let refuse = |this: &mut FsProxy, e: i32, reason: String| {
            this.stats.bounds_refused += 1;
            this.fuse_audit(AuditRecord {
                mode: Some(mode),
                allowed: false,
                code: Some(code_of(e)),
                reason: Some(reason),
                ..AuditRecord::of(client, AuditOp::Open, Some(path.to_string_lossy().into_owned()))
            });
            Err(e)
        };
        if self.table.len() + self.opening >= self.config.max_open_handles {
            let why = format!("too many open handles (limit {})", self.config.max_open_handles);
            return refuse(self, errno::ENFILE, why);
        }
        if self.descriptors_held() + 1 + super::bounds::PROVIDER_DESCRIPTOR_RESERVE
            > self.config.max_descriptors
        {
            let why =
                format!("too many descriptors in use (--max-descriptors {})", self.config.max_descriptors);
            return refuse(self, errno::EMFILE, why);
        }
        let Some(m) = self.fuse.get(&client) else { return Ok(()) };
        let (root, rel) = (m.root, m.rel(&path).to_path_buf());
        let file = FileId(self.next_file);
        self.next_file += 1;
        let scope = self.own_scope.clone();
        let effect = Effect::Open { file, root, rel, mode, scope, how: Some(how) };
        self.fuse_effect(client, unique, Step::Open { file, mode, path, created, through }, effect);
        Ok(())
    }

    fn fuse_setattr(&mut self, client: ClientId, unique: u64, node: u64, s: &SetattrIn) -> Result<(), i32> {
        let Some(m) = self.fuse.get(&client) else { return Ok(()) };
        let chown =
            (s.valid & fattr::UID != 0 && s.uid != m.uid) || (s.valid & fattr::GID != 0 && s.gid != m.gid);
        if chown {
            // Owners are the host's to keep: every file shows as the
            // child's own.
            return Err(errno::EPERM);
        }
        let size = (s.valid & fattr::SIZE != 0).then_some(s.size);
        let mode = (s.valid & fattr::MODE != 0).then_some(s.mode & 0o7777);
        let atime = (s.valid & fattr::ATIME != 0)
            .then(|| time(s.atime, s.atimensec, s.valid & fattr::ATIME_NOW != 0));
        let mtime = (s.valid & fattr::MTIME != 0)
            .then(|| time(s.mtime, s.mtimensec, s.valid & fattr::MTIME_NOW != 0));
        // An open file's truncation goes through its handle: it may be
        // unlinked already, and it was decided at its open.
        let file = (s.valid & fattr::FH != 0).then(|| self.fuse_file(client, s.fh)).flatten();
        if let (Some(size), None, None, None, Some((handle, file))) = (size, mode, atime, mtime, file) {
            if !self.slot_mode(client, handle).is_some_and(Mode::writable) {
                return Err(errno::EBADF);
            }
            self.fuse_effect(client, unique, Step::Attr, Effect::Truncate { file, size });
            return Ok(());
        }
        let Some(m) = self.fuse.get(&client) else { return Ok(()) };
        let path = m.path_of(node).ok_or(errno::ENOENT)?;
        if size.is_none() && mode.is_none() && atime.is_none() && mtime.is_none() {
            self.path_effect(client, unique, Step::Attr, PathOp::Stat { path, follow: false });
            return Ok(());
        }
        let attr = SetAttr { size, mode, atime, mtime };
        self.path_effect(client, unique, Step::Attr, PathOp::SetAttr { path, attr });
        Ok(())
    }

    fn fuse_readdir(
        &mut self,
        client: ClientId,
        unique: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<(), i32> {
        let max_entries = self.config.max_list_entries;
        let max_bytes = self.config.max_list_bytes;
        let Some(m) = self.fuse.get_mut(&client) else { return Ok(()) };
        let d = m.dirs.get(&fh).ok_or(errno::EBADF)?;
        let after = match offset {
            0..=2 => None,
            k => d.page.get(&k).cloned(),
        };
        // Past the end, or an offset of a page long gone: nothing more.
        let ended = offset > 2 && (after.is_none() || (d.done && d.page.keys().next_back() == Some(&offset)));
        if ended {
            self.fuse_reply(client, unique, Reply::Data(Vec::new()));
            return Ok(());
        }
        let path = m.path_of(d.node).ok_or(errno::ENOENT)?;
        let after = match after {
            Some(a) => Some(String::from_utf8(a).map_err(|_| errno::EIO)?),
            None => None,
        };
        let max = (size / 32).clamp(1, max_entries.max(1));
        let op = PathOp::List { path, after, max, max_bytes: max_bytes.min(size) };
        self.path_effect(client, unique, Step::Readdir { fh, offset, size }, op);
        Ok(())
    }

    pub(super) fn fuse_effect_done(&mut self, client: ClientId, wait: FuseWait, result: EffectResult) {
        let FuseWait { unique, step } = wait;
        if let Step::Open { .. } = step {
            self.opening -= 1;
            if !matches!(result, EffectResult::Opened) {
                self.host_fds = self.host_fds.saturating_sub(1);
            }
        }
        if let Step::Release { .. } = step {
            self.host_fds = self.host_fds.saturating_sub(1);
        }
        let gone = match self.fuse.get_mut(&client) {
            Some(m) => {
                m.pending = m.pending.saturating_sub(1);
                m.gone
            }
            None => true,
        };
        if gone {
            // Opened for a mount that has ended: closed at once.
            if let (Step::Open { file, .. }, EffectResult::Opened) = (&step, &result) {
                let cleanup = Pending { client, req: None, waiting: Waiting::Cleanup };
                self.effect(cleanup, Effect::Close { file: *file });
            }
            // A registration no open will use.
            if let (Step::Backed { .. }, EffectResult::Backing { id }) = (&step, &result) {
                let cleanup = Pending { client, req: None, waiting: Waiting::Cleanup };
                self.effect(cleanup, Effect::Unback { client, id: *id });
            }
            self.fuse_finish(client);
            return;
        }
        if let Step::Release { handle } = step {
            // The handle is gone whatever the close says.
            if let Some(m) = self.fuse.get_mut(&client) {
                m.opened.remove(&handle);
            }
            return self.fuse_reply(client, unique, Reply::Empty);
        }
        if let Step::Backed { handle, node } = step {
            return self.fuse_backed(client, unique, handle, node, result);
        }
        // A create that fails after its open leaves a handle the kernel
        // never learns of: closed here, or it would be held for good.
        let created = match &step {
            Step::Created { handle, .. } => Some(*handle),
            _ => None,
        };
        if let Err(e) = self.fuse_step(client, unique, step, result) {
            if let Some(handle) = created {
                self.fuse_drop(client, handle);
            }
            self.fuse_reply(client, unique, Reply::Error(e));
        }
    }

    /// Carry on with `step` now that its effect gave `result`.
    fn fuse_step(
        &mut self,
        client: ClientId,
        unique: u64,
        step: Step,
        result: EffectResult,
    ) -> Result<(), i32> {
        if let EffectResult::Failed { kind, message } = &result {
            let e = errno_of(*kind, &step);
            match step {
                // A name not there is an answer the kernel may keep.
                Step::Lookup { .. } if *kind == FsErrorKind::NotFound => {
                    let Some(m) = self.fuse.get(&client) else { return Ok(()) };
                    let entry = EntryOut { nodeid: 0, entry_valid: m.valid, ..EntryOut::default() };
                    self.fuse_reply(client, unique, Reply::Entry(entry));
                    return Ok(());
                }
                Step::Open { mode, path, .. } => {
                    self.fuse_audit(AuditRecord {
                        mode: Some(mode),
                        allowed: false,
                        code: Some(code_of(e)),
                        reason: Some(message.clone()),
                        ..AuditRecord::of(client, AuditOp::Open, Some(path.to_string_lossy().into_owned()))
                    });
                }
                Step::Read { handle } | Step::Write { handle } => {
                    let op = if matches!(step, Step::Read { .. }) { AuditOp::Read } else { AuditOp::Write };
                    let path = self.fuse_open_path(client, handle);
                    self.fuse_audit(AuditRecord {
                        handle: Some(handle),
                        allowed: false,
                        code: Some(code_of(e)),
                        reason: Some(message.clone()),
                        ..AuditRecord::of(client, op, path)
                    });
                }
                _ => {}
            }
            return Err(e);
        }
        let Some(m) = self.fuse.get_mut(&client) else { return Ok(()) };
        let valid = m.valid;
        match (step, result) {
            (Step::Lookup { parent, name }, EffectResult::Stat { stat }) => {
                let attr = m.attr(&stat);
                let nodeid =
                    m.nodes.found(parent, &name, mount::identity(&stat)).map_err(|_| errno::ENFILE)?;
                let entry = EntryOut { nodeid, generation: 0, entry_valid: valid, attr_valid: valid, attr };
                self.fuse_reply(client, unique, Reply::Entry(entry));
            }
            (Step::Attr, EffectResult::Stat { stat }) => {
                let attr = m.attr(&stat);
                self.fuse_reply(client, unique, Reply::Attr { valid, attr });
            }
            (Step::Readlink, EffectResult::Target { target }) => {
                self.fuse_reply(client, unique, Reply::Data(target));
            }
            (Step::Mkdir { parent, name, path }, EffectResult::Done) => {
                self.path_effect(
                    client,
                    unique,
                    Step::Made { parent, name },
                    PathOp::Stat { path, follow: false },
                );
            }
            (Step::Made { parent, name }, EffectResult::Stat { stat }) => {
                let attr = m.attr(&stat);
                let nodeid =
                    m.nodes.found(parent, &name, mount::identity(&stat)).map_err(|_| errno::ENFILE)?;
                let entry = EntryOut { nodeid, generation: 0, entry_valid: valid, attr_valid: valid, attr };
                self.fuse_reply(client, unique, Reply::Entry(entry));
            }
            (Step::Remove { parent, name }, EffectResult::Done) => {
                m.nodes.detach(parent, &name);
                self.fuse_reply(client, unique, Reply::Empty);
            }
            (Step::Rename { parent, name, newdir, newname }, EffectResult::Done) => {
                m.nodes.renamed(parent, &name, newdir, &newname);
                self.fuse_reply(client, unique, Reply::Empty);
            }
            (Step::Open { file, mode, path, created, through }, EffectResult::Opened) => {
                let handle = self.table.insert(client, Slot { mode, target: Target::Host(file) });
                self.stats.handles_opened += 1;
                self.fuse_audit(AuditRecord {
                    mode: Some(mode),
                    handle: Some(handle),
                    ..AuditRecord::of(client, AuditOp::Open, Some(path.to_string_lossy().into_owned()))
                });
                if let Some(m) = self.fuse.get_mut(&client) {
                    m.opened.insert(handle, path);
                }
                if let Some(node) = through {
                    self.fuse_through(client, unique, handle, file, node);
                    return Ok(());
                }
                match created {
                    None => {
                        let open_flags = if mode == Mode::Read { fopen::KEEP_CACHE } else { 0 };
                        let out = OpenOut { fh: handle.get(), open_flags, backing_id: 0 };
                        self.fuse_reply(client, unique, Reply::Open(out));
                    }
                    Some((parent, name)) => {
                        self.fuse_effect(
                            client,
                            unique,
                            Step::Created { handle, parent, name },
                            Effect::Fstat { file },
                        );
                    }
                }
            }
            (Step::Created { handle, parent, name }, EffectResult::Stat { stat }) => {
                let attr = m.attr(&stat);
                let nodeid =
                    m.nodes.found(parent, &name, mount::identity(&stat)).map_err(|_| errno::ENFILE)?;
                let entry = EntryOut { nodeid, generation: 0, entry_valid: valid, attr_valid: valid, attr };
                let open = OpenOut { fh: handle.get(), open_flags: 0, backing_id: 0 };
                self.fuse_reply(client, unique, Reply::Create(entry, open));
            }
            (Step::Read { handle }, EffectResult::Data { data, .. }) => {
                let path = self.fuse_open_path(client, handle);
                self.fuse_audit(AuditRecord {
                    handle: Some(handle),
                    bytes: Some(data.len() as u64),
                    ..AuditRecord::of(client, AuditOp::Read, path)
                });
                self.fuse_reply(client, unique, Reply::Data(data));
            }
            (Step::Write { handle }, EffectResult::Written { written }) => {
                let path = self.fuse_open_path(client, handle);
                self.fuse_audit(AuditRecord {
                    handle: Some(handle),
                    bytes: Some(written),
                    ..AuditRecord::of(client, AuditOp::Write, path)
                });
                let size = u32::try_from(written).unwrap_or(u32::MAX);
                self.fuse_reply(client, unique, Reply::Write { size });
            }
            (Step::Readdir { fh, offset, size }, EffectResult::Listed { page }) => {
                let Some(d) = m.dirs.get_mut(&fh) else { return Err(errno::EBADF) };
                let mut buf = DirBuf::new(size as usize);
                let own = mount::entry_ino(b".");
                let mut full = false;
                for (off, name) in [(1u64, &b"."[..]), (2, &b".."[..])] {
                    if offset < off && !full {
                        let e = DirEntry { ino: own, off, dtype: abi::DT_DIR, name: name.to_vec() };
                        full = !buf.push(&e);
                    }
                }
                d.page.clear();
                let mut emitted = 0;
                for entry in &page.entries {
                    if full {
                        break;
                    }
                    let off = d.next_off;
                    let name = entry.name.as_bytes().to_vec();
                    let e = DirEntry {
                        ino: mount::entry_ino(&name),
                        off,
                        dtype: dtype(entry.kind),
                        name: name.clone(),
                    };
                    if !buf.push(&e) {
                        break;
                    }
                    d.next_off += 1;
                    d.page.insert(off, name);
                    emitted += 1;
                }
                d.done = !page.more && emitted == page.entries.len();
                self.fuse_reply(client, unique, Reply::Data(buf.into_bytes()));
            }
            (Step::Access { mask, path }, EffectResult::Stat { stat }) => {
                if mask & abi::W_OK != 0 {
                    let scope = self.own_scope.clone();
                    if crate::resolve::decide(&scope, bytes::bytes(&path), true, None).is_err() {
                        return Err(errno::EACCES);
                    }
                }
                if mask & 1 != 0 && stat.kind != Kind::Dir && stat.mode & 0o111 == 0 {
                    return Err(errno::EACCES);
                }
                self.fuse_reply(client, unique, Reply::Empty);
            }
            // An effect answered with what it does not give: the shell's
            // fault, never the kernel's to see as success.
            _ => return Err(errno::EIO),
        }
        Ok(())
    }

    /// Close `handle`, which the kernel never got.
    /// A read-only open of `node` by the kernel itself: with the node's
    /// registration, once there is one (the first open registers its file).
    fn fuse_through(&mut self, client: ClientId, unique: u64, handle: Handle, file: FileId, node: u64) {
        let Some(m) = self.fuse.get_mut(&client) else { return };
        match m.backing.get_mut(&node) {
            None => {
                m.backing.insert(node, Backing::Registering { waiting: Vec::new() });
                let step = Step::Backed { handle, node };
                self.fuse_effect(client, unique, step, Effect::Backing { client, file });
            }
            Some(Backing::Registering { waiting }) => waiting.push((unique, handle)),
            Some(Backing::Ready { id, opens }) => {
                *opens += 1;
                let id = *id;
                m.through.insert(handle, node);
                self.stats.fuse.passthrough += 1;
                self.fuse_reply(client, unique, Reply::Open(through_out(handle, id)));
            }
        }
    }

    /// The node's registration came back: every open waiting on it is
    /// answered, passed through, or served when it failed.
    fn fuse_backed(
        &mut self,
        client: ClientId,
        unique: u64,
        handle: Handle,
        node: u64,
        result: EffectResult,
    ) {
        let Some(m) = self.fuse.get_mut(&client) else { return };
        let waiting = match m.backing.remove(&node) {
            Some(Backing::Registering { waiting }) => waiting,
            _ => Vec::new(),
        };
        let opens: Vec<(u64, Handle)> = std::iter::once((unique, handle)).chain(waiting).collect();
        match result {
            EffectResult::Backing { id } if id > 0 && i32::try_from(id).is_ok() => {
                m.backing.insert(node, Backing::Ready { id, opens: opens.len() });
                for (_, h) in &opens {
                    m.through.insert(*h, node);
                }
                self.stats.fuse.passthrough += opens.len() as u64;
                for (u, h) in opens {
                    self.fuse_reply(client, u, Reply::Open(through_out(h, id)));
                }
            }
            other => {
                if let EffectResult::Backing { id } = other {
                    let cleanup = Pending { client, req: None, waiting: Waiting::Cleanup };
                    self.effect(cleanup, Effect::Unback { client, id });
                }
                for (u, h) in opens {
                    let out = OpenOut { fh: h.get(), open_flags: fopen::KEEP_CACHE, backing_id: 0 };
                    self.fuse_reply(client, u, Reply::Open(out));
                }
            }
        }
    }

    /// `handle` is released: its node's registration goes with the last
    /// open that used it.
    fn fuse_unthrough(&mut self, client: ClientId, handle: Handle) {
        let Some(m) = self.fuse.get_mut(&client) else { return };
        let Some(node) = m.through.remove(&handle) else { return };
        let last = match m.backing.get_mut(&node) {
            Some(Backing::Ready { id, opens }) => {
                *opens = opens.saturating_sub(1);
                (*opens == 0).then_some(*id)
            }
            _ => None,
        };
        if self.config.planted_bug == Some(super::PlantedBug::FuseBackingKept) {
            return;
        }
        if let Some(id) = last {
            m.backing.remove(&node);
            let cleanup = Pending { client, req: None, waiting: Waiting::Cleanup };
            self.effect(cleanup, Effect::Unback { client, id });
        }
    }

    fn fuse_drop(&mut self, client: ClientId, handle: Handle) {
        if let Some(m) = self.fuse.get_mut(&client) {
            m.opened.remove(&handle);
        }
        if let Ok(Slot { target: Target::Host(file), .. }) = self.table.remove(client, handle) {
            self.stats.handles_closed += 1;
            self.effect(Pending { client, req: None, waiting: Waiting::Cleanup }, Effect::Close { file });
        }
    }

    /// The mount ended (`DESTROY`, or its device closed): nothing more is
    /// answered, and once no effect is under way everything it held is
    /// closed.
    pub(super) fn fuse_depart(&mut self, client: ClientId) {
        let Some(m) = self.fuse.get_mut(&client) else { return };
        if !m.gone {
            m.gone = true;
            m.dirs.clear();
            if let Some(a) = &mut self.audit {
                a.departed(client);
            }
        }
        self.fuse_finish(client);
    }

    fn fuse_finish(&mut self, client: ClientId) {
        let Some(m) = self.fuse.get(&client) else { return };
        if !m.gone || m.pending > 0 {
            return;
        }
        let ids: Vec<u32> = m
            .backing
            .values()
            .filter_map(|b| match b {
                Backing::Ready { id, .. } => Some(*id),
                Backing::Registering { .. } => None,
            })
            .collect();
        for (_, slot) in self.table.drain_owner(client) {
            self.stats.handles_closed += 1;
            self.stats.handles_cleaned_up += 1;
            if let Target::Host(file) = slot.target {
                self.effect(Pending { client, req: None, waiting: Waiting::Cleanup }, Effect::Close { file });
            }
        }
        for id in ids {
            self.effect(
                Pending { client, req: None, waiting: Waiting::Cleanup },
                Effect::Unback { client, id },
            );
        }
        self.fuse.remove(&client);
        self.outputs.push_back(Output::Close { client });
    }
}

/// An open the kernel passes through to registration `id`.
fn through_out(handle: Handle, id: u32) -> OpenOut {
    OpenOut { fh: handle.get(), open_flags: fopen::PASSTHROUGH, backing_id: i32::try_from(id).unwrap_or(0) }
}

/// The proxy mode and the open's particulars for open flags `flags`
/// (`perm`: a create's permission bits, umask applied).
fn open_mode(flags: u32, perm: Option<u32>) -> (Mode, OpenHow) {
    let truncate = flags & oflags::TRUNC != 0;
    let create = match perm {
        None => Create::Never,
        Some(_) if flags & oflags::EXCL != 0 => Create::Exclusive,
        Some(_) => Create::IfMissing,
    };
    let how = OpenHow { create, truncate, perm: perm.unwrap_or(0) };
    // Making or truncating a file is a change, decided as a write even
    // when the file is then only read.
    let mode = match flags & oflags::ACCMODE {
        oflags::RDONLY if !truncate && perm.is_none() => Mode::Read,
        oflags::WRONLY => Mode::Write,
        _ => Mode::ReadWrite,
    };
    (mode, how)
}
