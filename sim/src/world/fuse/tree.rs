//! The `fuse` world's host filesystem: a tree of inodes in memory, so a
//! file unlinked or renamed over while open stays readable through its
//! descriptor, as on a real disk. It offers the primitives the core's
//! walks act with (`resolve::Namespace`, `OpenFinal`, `pathops::PathNs`),
//! so every decision is the core's own, made as the production shell's
//! walk makes it; this file only says what the disk does.

use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{EffectResult, FileId, FsErrorKind};
use airlock_core::pathops::{DirEntry, FileStat, Kind, Node, Page, PathNs, SetAttr, Time};
use airlock_core::resolve::{Create, Entry, Final, Namespace, OpenFinal, OpenHow, Refusal};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

pub const ROOT_INO: u64 = 1;

#[derive(Clone, Debug)]
pub enum Body {
    Dir(BTreeMap<Vec<u8>, u64>),
    File(Vec<u8>),
    Link(PathBuf),
}

#[derive(Clone, Debug)]
pub struct Inode {
    pub body: Body,
    pub mode: u32,
    /// Names it has in directories.
    pub links: u32,
    pub mtime: i64,
}

#[derive(Debug)]
struct Open {
    ino: u64,
    write: bool,
}

#[derive(Debug, Default)]
pub struct Tree {
    nodes: BTreeMap<u64, Inode>,
    next: u64,
    open: BTreeMap<FileId, Open>,
    /// The world's clock, for times.
    pub now: i64,
}

fn kind(b: &Body) -> Kind {
    match b {
        Body::Dir(_) => Kind::Dir,
        Body::File(_) => Kind::File,
        Body::Link(_) => Kind::Symlink,
    }
}

fn conflict(what: &str) -> Refusal {
    Refusal::Conflict(what.to_owned())
}

impl Tree {
    pub fn new() -> Self {
        let mut t = Tree { next: ROOT_INO + 1, ..Tree::default() };
        t.nodes.insert(ROOT_INO, Inode { body: Body::Dir(BTreeMap::new()), mode: 0o755, links: 1, mtime: 0 });
        t
    }

    fn insert(&mut self, body: Body, mode: u32) -> u64 {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, Inode { body, mode, links: 0, mtime: self.now });
        ino
    }

    fn entries(&self, dir: u64) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match self.nodes.get(&dir).map(|n| &n.body) {
            Some(Body::Dir(e)) => Some(e),
            _ => None,
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Option<&mut BTreeMap<Vec<u8>, u64>> {
        match self.nodes.get_mut(&dir).map(|n| &mut n.body) {
            Some(Body::Dir(e)) => Some(e),
            _ => None,
        }
    }

    /// The inode at `path` (absolute, no symlink followed on the way).
    pub fn at(&self, path: &Path) -> Option<u64> {
        let mut ino = ROOT_INO;
        for c in path.components() {
            if let Component::Normal(n) = c {
                ino = *self.entries(ino)?.get(n.as_bytes())?;
            }
        }
        Some(ino)
    }

    /// Put `body` at `path`, making directories on the way, replacing what
    /// was there (the world's own setup, and the attacker's swaps).
    pub fn put(&mut self, path: &Path, body: Body) {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { return };
        let mut dir = ROOT_INO;
        for c in parent.components() {
            if let Component::Normal(n) = c {
                dir = match self.entries(dir).and_then(|e| e.get(n.as_bytes())).copied() {
                    Some(d) if self.entries(d).is_some() => d,
                    _ => {
                        let d = self.insert(Body::Dir(BTreeMap::new()), 0o755);
                        self.link(dir, n.as_bytes(), d);
                        d
                    }
                };
            }
        }
        let mode = if matches!(body, Body::Dir(_)) { 0o755 } else { 0o644 };
        let ino = self.insert(body, mode);
        self.link(dir, name.as_bytes(), ino);
    }

    fn link(&mut self, dir: u64, name: &[u8], ino: u64) {
        let old = self.entries_mut(dir).and_then(|e| e.insert(name.to_vec(), ino));
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.links += 1;
        }
        if let Some(old) = old {
            self.unlinked(old);
        }
    }

    fn unlinked(&mut self, ino: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else { return };
        n.links = n.links.saturating_sub(1);
        if n.links == 0 && !self.open.values().any(|o| o.ino == ino) {
            if let Some(Inode { body: Body::Dir(e), .. }) = self.nodes.remove(&ino) {
                for (_, child) in e {
                    self.unlinked(child);
                }
            }
        }
    }

    /// Every regular file beneath `path`, by path, with its content.
    pub fn files_under(&self, path: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let Some(ino) = self.at(path) else { return out };
        self.collect(ino, path.to_path_buf(), &mut out, 0);
        out
    }

    fn collect(&self, ino: u64, at: PathBuf, out: &mut BTreeMap<PathBuf, Vec<u8>>, depth: usize) {
        if depth > 64 {
            return;
        }
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::File(d)) => {
                out.insert(at, d.clone());
            }
            Some(Body::Dir(e)) => {
                for (name, child) in e {
                    self.collect(*child, at.join(OsStr::from_bytes(name)), out, depth + 1);
                }
            }
            _ => {}
        }
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    fn stat(&self, ino: u64) -> Option<FileStat> {
        let n = self.nodes.get(&ino)?;
        let size = match &n.body {
            Body::File(d) => d.len() as u64,
            Body::Link(t) => t.as_os_str().len() as u64,
            Body::Dir(e) => e.len() as u64,
        };
        let t = Time { sec: n.mtime, nsec: 0 };
        Some(FileStat {
            kind: kind(&n.body),
            size,
            mode: n.mode,
            nlink: u64::from(n.links.max(1)),
            ino,
            mtime: t,
            atime: t,
            ctime: t,
        })
    }

    /// An opened file's effects: the file as the descriptor holds it.
    pub fn file_effect(&mut self, file: FileId, what: FileOp) -> EffectResult {
        let Some(o) = self.open.get(&file) else {
            return EffectResult::Failed { kind: FsErrorKind::Other, message: "file is not open".into() };
        };
        let (ino, write) = (o.ino, o.write);
        let now = self.now;
        let Some(n) = self.nodes.get_mut(&ino) else {
            return EffectResult::Failed { kind: FsErrorKind::Other, message: "inode gone".into() };
        };
        let Body::File(data) = &mut n.body else {
            return EffectResult::Failed { kind: FsErrorKind::Other, message: "not a file".into() };
        };
        let bad = |m: &str| EffectResult::Failed { kind: FsErrorKind::Denied, message: m.to_owned() };
        match what {
            FileOp::Read { offset, max } => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(max as usize).min(data.len());
                EffectResult::Data { data: data[start..end].to_vec(), eof: end == start }
            }
            FileOp::Write { offset, bytes } if write => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                let Some(end) = start.checked_add(bytes.len()).filter(|e| *e <= 1 << 24) else {
                    return EffectResult::Failed {
                        kind: FsErrorKind::Other,
                        message: "file too large".into(),
                    };
                };
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[start..end].copy_from_slice(&bytes);
                n.mtime = now;
                EffectResult::Written { written: bytes.len() as u64 }
            }
            FileOp::Truncate { size } if write => {
                if size > 1 << 24 {
                    return EffectResult::Failed {
                        kind: FsErrorKind::Other,
                        message: "file too large".into(),
                    };
                }
                data.resize(size as usize, 0);
                n.mtime = now;
                self.fstat(ino)
            }
            FileOp::Write { .. } | FileOp::Truncate { .. } => bad("Bad file descriptor"),
            FileOp::Stat => self.fstat(ino),
        }
    }

    fn fstat(&self, ino: u64) -> EffectResult {
        match self.stat(ino) {
            Some(stat) => EffectResult::Stat { stat },
            None => EffectResult::Failed { kind: FsErrorKind::Other, message: "inode gone".into() },
        }
    }

    /// Keep the file `ino` open as `file`.
    pub fn opened(&mut self, file: FileId, ino: u64, mode: Mode) -> Result<(), String> {
        if self.open.contains_key(&file) {
            return Err(format!("file {file:?} opened twice"));
        }
        self.open.insert(file, Open { ino, write: mode.writable() });
        Ok(())
    }

    pub fn close(&mut self, file: FileId) -> Result<EffectResult, String> {
        let o = self.open.remove(&file).ok_or_else(|| format!("closed unopened {file:?}"))?;
        if self.nodes.get(&o.ino).is_some_and(|n| n.links == 0) && !self.open.values().any(|x| x.ino == o.ino)
        {
            self.nodes.remove(&o.ino);
        }
        Ok(EffectResult::Closed)
    }

    /// Whether `anc` is `ino` or a directory above it.
    fn holds(&self, anc: u64, ino: u64) -> bool {
        if anc == ino {
            return true;
        }
        let Some(e) = self.entries(anc) else { return false };
        e.values().any(|c| self.entries(*c).is_some() && self.holds(*c, ino))
    }
}

/// What an open file is asked.
pub enum FileOp {
    Read { offset: u64, max: u32 },
    Write { offset: u64, bytes: Vec<u8> },
    Truncate { size: u64 },
    Stat,
}

/// The tree as the walks' namespace, from the anchors' paths.
pub struct Walk<'a> {
    pub tree: &'a mut Tree,
    pub anchors: &'a [PathBuf],
}

impl Namespace for Walk<'_> {
    type Dir = u64;

    fn anchor(&mut self, index: usize) -> Result<u64, Refusal> {
        let a = self.anchors.get(index).ok_or_else(|| Refusal::Fs("unknown anchor".into()))?;
        self.tree.at(a).filter(|i| self.tree.entries(*i).is_some()).ok_or(Refusal::NotFound)
    }

    fn lookup(&mut self, dir: &u64, name: &OsStr) -> Result<Entry<u64>, Refusal> {
        let Some(ino) = self.tree.entries(*dir).and_then(|e| e.get(name.as_bytes())).copied() else {
            return Ok(Entry::Missing);
        };
        Ok(match self.tree.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(_)) => Entry::Dir(ino),
            Some(Body::Link(t)) => Entry::Symlink(t.clone()),
            _ => Entry::NotDir,
        })
    }
}

impl OpenFinal for Walk<'_> {
    type File = u64;

    fn open_final(
        &mut self,
        dir: &u64,
        name: &OsStr,
        path: &Path,
        mode: Mode,
    ) -> Result<Final<u64>, Refusal> {
        self.open_final_how(dir, name, path, mode, None)
    }

    fn open_final_how(
        &mut self,
        dir: &u64,
        name: &OsStr,
        _: &Path,
        mode: Mode,
        how: Option<&OpenHow>,
    ) -> Result<Final<u64>, Refusal> {
        let (create, truncate, perm) = match how {
            Some(h) => (h.create, h.truncate, h.perm),
            None => (
                if mode == Mode::Read { Create::Never } else { Create::IfMissing },
                mode == Mode::Write,
                0o644,
            ),
        };
        let existing = self.tree.entries(*dir).and_then(|e| e.get(name.as_bytes())).copied();
        let ino = match existing {
            Some(_) if create == Create::Exclusive => return Err(conflict("file exists")),
            Some(ino) => ino,
            None if create == Create::Never => return Err(Refusal::NotFound),
            None => {
                let ino = self.tree.insert(Body::File(Vec::new()), perm & 0o7777);
                self.tree.link(*dir, name.as_bytes(), ino);
                return Ok(Final::File(ino));
            }
        };
        let now = self.tree.now;
        match self.tree.nodes.get_mut(&ino).map(|n| (&mut n.body, &mut n.mtime)) {
            Some((Body::Link(t), _)) => Ok(Final::Symlink(t.clone())),
            Some((Body::File(d), mtime)) => {
                if truncate {
                    d.clear();
                    *mtime = now;
                }
                Ok(Final::File(ino))
            }
            _ => Err(Refusal::Denied("not a regular file".into())),
        }
    }
}

impl PathNs for Walk<'_> {
    fn inspect(&mut self, dir: &u64, name: &OsStr) -> Result<Option<Node<u64>>, Refusal> {
        let ino = if name.as_bytes() == b"." {
            Some(*dir)
        } else {
            self.tree.entries(*dir).and_then(|e| e.get(name.as_bytes())).copied()
        };
        let Some(ino) = ino else { return Ok(None) };
        let Some(stat) = self.tree.stat(ino) else { return Ok(None) };
        let n = &self.tree.nodes[&ino];
        Ok(Some(Node {
            dir: matches!(n.body, Body::Dir(_)).then_some(ino),
            target: match &n.body {
                Body::Link(t) => Some(t.clone()),
                _ => None,
            },
            stat,
        }))
    }

    fn list(
        &mut self,
        dir: &u64,
        after: Option<&[u8]>,
        max: usize,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Page, Refusal> {
        let e = self.tree.entries(*dir).ok_or(Refusal::NotFound)?.clone();
        let mut entries = Vec::new();
        let mut more = false;
        for (name, ino) in e.iter().filter(|(n, _)| after.is_none_or(|a| n.as_slice() > a)) {
            if !keep(name) {
                continue;
            }
            if entries.len() == max {
                more = true;
                break;
            }
            let Some(stat) = self.tree.stat(*ino) else { continue };
            let Ok(name) = String::from_utf8(name.clone()) else { continue };
            let size = if stat.kind == Kind::File { stat.size } else { 0 };
            entries.push(DirEntry { name, kind: stat.kind, size });
        }
        Ok(Page { entries, more })
    }

    fn mkdir(&mut self, dir: &u64, name: &OsStr) -> Result<(), Refusal> {
        if self.tree.entries(*dir).ok_or(Refusal::NotFound)?.contains_key(name.as_bytes()) {
            return Err(conflict("already exists"));
        }
        let ino = self.tree.insert(Body::Dir(BTreeMap::new()), 0o755);
        self.tree.link(*dir, name.as_bytes(), ino);
        Ok(())
    }

    fn remove(&mut self, dir: &u64, name: &OsStr, is_dir: bool) -> Result<(), Refusal> {
        let ino =
            self.tree.entries(*dir).and_then(|e| e.get(name.as_bytes())).copied().ok_or(Refusal::NotFound)?;
        match (self.tree.entries(ino), is_dir) {
            (Some(e), true) if !e.is_empty() => return Err(conflict("directory not empty")),
            (Some(_), false) => return Err(conflict("is a directory")),
            (None, true) => return Err(conflict("not a directory")),
            _ => {}
        }
        if let Some(e) = self.tree.entries_mut(*dir) {
            e.remove(name.as_bytes());
        }
        self.tree.unlinked(ino);
        Ok(())
    }

    fn rename(
        &mut self,
        from_dir: &u64,
        from: &OsStr,
        to_dir: &u64,
        to: &OsStr,
        noreplace: bool,
    ) -> Result<(), Refusal> {
        let ino = self
            .tree
            .entries(*from_dir)
            .and_then(|e| e.get(from.as_bytes()))
            .copied()
            .ok_or(Refusal::NotFound)?;
        let there = self.tree.entries(*to_dir).ok_or(Refusal::NotFound)?.get(to.as_bytes()).copied();
        if there == Some(ino) {
            return Ok(());
        }
        if self.tree.entries(ino).is_some() && self.tree.holds(ino, *to_dir) {
            return Err(conflict("a directory cannot move into itself"));
        }
        if let Some(t) = there {
            if noreplace {
                return Err(conflict("already exists"));
            }
            match (self.tree.entries(ino).is_some(), self.tree.entries(t)) {
                (true, Some(e)) if !e.is_empty() => return Err(conflict("directory not empty")),
                (true, None) => return Err(conflict("not a directory")),
                (false, Some(_)) => return Err(conflict("is a directory")),
                _ => {}
            }
        }
        if let Some(e) = self.tree.entries_mut(*from_dir) {
            e.remove(from.as_bytes());
        }
        if let Some(n) = self.tree.nodes.get_mut(&ino) {
            n.links -= 1;
        }
        self.tree.link(*to_dir, to.as_bytes(), ino);
        Ok(())
    }

    fn set_attr(
        &mut self,
        dir: &u64,
        name: &OsStr,
        seen: &FileStat,
        attr: &SetAttr,
    ) -> Result<FileStat, Refusal> {
        let ino = if name.as_bytes() == b"." {
            *dir
        } else {
            self.tree.entries(*dir).and_then(|e| e.get(name.as_bytes())).copied().ok_or(Refusal::NotFound)?
        };
        if ino != seen.ino {
            return Err(Refusal::Fs("changed while in use".into()));
        }
        let now = self.tree.now;
        let n = self.tree.nodes.get_mut(&ino).ok_or(Refusal::NotFound)?;
        if let Some(size) = attr.size {
            match &mut n.body {
                Body::File(d) if size <= 1 << 24 => d.resize(size as usize, 0),
                Body::File(_) => return Err(Refusal::Fs("file too large".into())),
                _ => return Err(conflict("is a directory")),
            }
        }
        if let Some(m) = attr.mode {
            n.mode = m & 0o7777;
        }
        if attr.size.is_some() || attr.mtime.is_some() {
            n.mtime = attr.mtime.filter(|t| t.nsec != (1 << 30) - 1).map_or(now, |t| t.sec);
        }
        self.tree.stat(ino).ok_or(Refusal::NotFound)
    }
}
