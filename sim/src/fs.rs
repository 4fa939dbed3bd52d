//! The simulated host filesystem: answers the file effects of the level that
//! holds files, with the semantics the real shell gives them — symlinks
//! included (relative and absolute targets, chains, loops), resolved by the
//! core's own walk (`airlock_core::resolve`), exactly as production does.

use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{EffectResult, FileId};
use airlock_core::policy::bytes;
use airlock_core::resolve::{self, Entry, Final, Namespace, OpenFinal, Refusal};
use airlock_core::scope::Scope;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

#[cfg(test)]
mod oracle;
mod paths;

#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    /// `path` as `files` is keyed.
    key: Vec<u8>,
    pos: usize,
    /// Opened in `a` mode: every write lands at the end, as with O_APPEND.
    append: bool,
    /// The file was removed or replaced while open: its content lives on
    /// here (`HostFs::orphans`) for its handles, as an inode does.
    orphan: Option<u64>,
}

/// Paths are keyed by their canonical spelling (`bytes::canonical`), so a
/// lookup compares bytes and finds what a lookup by components would: `/a//b`
/// and `/a/b/` are the file `/a/b`, as in a real tree.
#[derive(Debug, Default)]
pub struct HostFs {
    files: BTreeMap<Vec<u8>, Vec<u8>>,
    dirs: BTreeSet<Vec<u8>>,
    links: BTreeMap<Vec<u8>, PathBuf>,
    /// Keyed by (level, file): file ids are per machine.
    open: BTreeMap<(usize, FileId), OpenFile>,
    /// Paths changed since the checkers last looked, in the order they
    /// changed, repeats included: only whether a path is here matters, and
    /// a set of paths compared component by component was most of a
    /// write's cost.
    dirty: Vec<PathBuf>,
    /// The anchors last opened from (the world's, which never change) and
    /// each one's `bytes::spelled_count`, kept rather than counted again
    /// on every open.
    anchors_seen: Vec<PathBuf>,
    anchor_counts: Vec<Option<usize>>,
    /// Contents of files removed or replaced while open, by orphan id.
    orphans: BTreeMap<u64, Vec<u8>>,
    next_orphan: u64,
    /// Paths a path operation changed (both ends of a rename), for the
    /// checkers; drained with [`HostFs::take_touched`].
    touched: Vec<PathBuf>,
}

fn key(path: &Path) -> Cow<'_, [u8]> {
    bytes::canonical(bytes::bytes(path))
}

fn path_of(b: Vec<u8>) -> PathBuf {
    PathBuf::from(OsString::from_vec(b))
}

/// `base.join(rel)`, byte for byte, without std's component-aware push.
pub fn joined(base: &Path, rel: &Path) -> PathBuf {
    path_of(bytes::join(bytes::bytes(base), bytes::bytes(rel)))
}

/// The in-memory tree as the walk's namespace: a "descriptor" is the
/// directory's physical path (spelled as the walk reached it, an anchor's
/// borrowed), which stays valid because the simulator never renames
/// directories, and whether that path is spelled canonically.
struct Walk<'a> {
    fs: &'a mut HostFs,
    anchors: &'a [PathBuf],
    /// Each anchor's `bytes::spelled_count`: a number for a canonical one.
    counts: &'a [Option<usize>],
}

/// `dir` joined with `name`, and its key: the joined path itself when
/// `dir` is canonical (`canonical`) and `name` one name, as a walk's are.
fn join_key(dir: &[u8], canonical: bool, name: &OsStr) -> (Vec<u8>, bool) {
    let name = name.as_bytes();
    let p = bytes::join(dir, name);
    let spelled = canonical && !matches!(name, b"" | b".") && !name.contains(&b'/');
    debug_assert!(!spelled || bytes::is_canonical(&p));
    (p, spelled)
}

impl<'a> Namespace for Walk<'a> {
    type Dir = (Cow<'a, [u8]>, bool);

    fn anchor(&mut self, index: usize) -> Result<(Cow<'a, [u8]>, bool), Refusal> {
        let canonical = self.counts.get(index).is_some_and(Option::is_some);
        self.anchors
            .get(index)
            .map(|a| (Cow::Borrowed(bytes::bytes(a)), canonical))
            .ok_or_else(|| Refusal::Fs("unknown anchor".into()))
    }

    fn lookup(
        &mut self,
        (dir, canonical): &(Cow<'a, [u8]>, bool),
        name: &OsStr,
    ) -> Result<Entry<(Cow<'a, [u8]>, bool)>, Refusal> {
        let (p, spelled) = join_key(dir, *canonical, name);
        let k = if spelled { Cow::Borrowed(&p[..]) } else { bytes::canonical(&p) };
        Ok(if self.fs.dirs.contains(k.as_ref()) {
            let spelled = matches!(k, Cow::Borrowed(_));
            Entry::Dir((Cow::Owned(p), spelled))
        } else if let Some(t) = self.fs.links.get(k.as_ref()) {
            Entry::Symlink(t.clone())
        } else if self.fs.files.contains_key(k.as_ref()) {
            Entry::NotDir
        } else {
            Entry::Missing
        })
    }
}

impl<'a> OpenFinal for Walk<'a> {
    /// The file's path, and its key in `files`.
    type File = (PathBuf, Vec<u8>);

    fn open_final(
        &mut self,
        (dir, canonical): &(Cow<'a, [u8]>, bool),
        name: &OsStr,
        _: &Path,
        mode: Mode,
    ) -> Result<Final<(PathBuf, Vec<u8>)>, Refusal> {
        let (p, spelled) = join_key(dir, *canonical, name);
        let k = if spelled { Cow::Borrowed(&p[..]) } else { bytes::canonical(&p) };
        if let Some(t) = self.fs.links.get(k.as_ref()) {
            return Ok(Final::Symlink(t.clone()));
        }
        if self.fs.dirs.contains(k.as_ref()) {
            return Err(Refusal::Denied("not a regular file".into()));
        }
        let created = match mode {
            Mode::Read if !self.fs.files.contains_key(k.as_ref()) => return Err(Refusal::NotFound),
            Mode::Read => false,
            Mode::Write => true,
            Mode::Append | Mode::ReadWrite => !self.fs.files.contains_key(k.as_ref()),
        };
        // A write truncates: `created` for it whether or not it was there.
        let k = k.into_owned();
        if created {
            self.fs.files.insert(k.clone(), Vec::new());
        }
        let p = path_of(p);
        if created {
            self.fs.dirty.push(p.clone());
        }
        Ok(Final::File((p, k)))
    }
}

impl HostFs {
    /// The paths changed since the last call (repeats possible).
    pub fn take_dirty(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.dirty)
    }

    pub fn add_dir(&mut self, path: PathBuf) {
        self.dirs.insert(key(&path).into_owned());
    }

    pub fn add_file(&mut self, path: PathBuf, content: Vec<u8>) {
        self.files.insert(key(&path).into_owned(), content);
    }

    /// Make `path` a symlink to `target`, replacing whatever file or link
    /// was there (an attacker swapping names between requests).
    pub fn set_link(&mut self, path: PathBuf, target: PathBuf) {
        // A path spelled as its key is its key.
        let k = match key(&path) {
            Cow::Borrowed(_) => path.into_os_string().into_vec(),
            Cow::Owned(k) => k,
        };
        self.files.remove(&k);
        self.links.insert(k, target);
    }

    /// Make `path` a regular file again (empty if it was not one).
    pub fn unlink(&mut self, path: &Path) {
        self.links.remove(key(path).as_ref());
    }

    pub fn get(&self, path: &Path) -> Option<&[u8]> {
        self.files.get(key(path).as_ref()).map(Vec::as_slice)
    }

    pub fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains(key(path).as_ref())
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Open `path` as the production shell would: resolve it from the
    /// `anchors` and refuse unless `scope` permits the resolved file in
    /// `mode`. Returns the result and, when opened, the resolved path.
    /// `Err` is a misuse by the machine (an id opened twice).
    pub fn open(
        &mut self,
        level: usize,
        file: FileId,
        path: &Path,
        mode: Mode,
        anchors: &[PathBuf],
        scope: &Scope,
    ) -> Result<(EffectResult, Option<PathBuf>), String> {
        if self.open.contains_key(&(level, file)) {
            return Err(format!("level {level} opened file {file:?} twice"));
        }
        let seen = self.anchors_seen.len() == anchors.len()
            && self.anchors_seen.iter().zip(anchors).all(|(a, b)| a.as_os_str() == b.as_os_str());
        if !seen {
            self.anchors_seen = anchors.to_vec();
            self.anchor_counts = anchors.iter().map(|a| bytes::spelled_count(bytes::bytes(a))).collect();
        }
        let counts = std::mem::take(&mut self.anchor_counts);
        let mut walk = Walk { fs: self, anchors, counts: &counts };
        let opened = resolve::open_counted(&mut walk, anchors, &counts, path, mode, scope);
        self.anchor_counts = counts;
        match opened {
            Ok(((p, key), _)) => {
                self.open.insert(
                    (level, file),
                    OpenFile { path: p.clone(), key, pos: 0, append: mode == Mode::Append, orphan: None },
                );
                Ok((EffectResult::Opened, Some(p)))
            }
            Err(r) => Ok((EffectResult::Failed { kind: r.kind(), message: r.to_string() }, None)),
        }
    }

    pub fn read(&mut self, level: usize, file: FileId, max: u32) -> Result<EffectResult, String> {
        let f = self
            .open
            .get_mut(&(level, file))
            .ok_or_else(|| format!("level {level} read unopened {file:?}"))?;
        let data = match f.orphan {
            Some(o) => self.orphans.get(&o),
            None => self.files.get(&f.key),
        };
        let data = data.map(Vec::as_slice).unwrap_or_default();
        let start = f.pos.min(data.len());
        let end = start.saturating_add(max as usize).min(data.len());
        // Like an OS file offset, a position past the end stays put.
        if end > start {
            f.pos = end;
        }
        let data = data[start..end].to_vec();
        let eof = data.is_empty();
        Ok(EffectResult::Data { data, eof })
    }

    pub fn write(&mut self, level: usize, file: FileId, bytes: &[u8]) -> Result<EffectResult, String> {
        let f = self
            .open
            .get_mut(&(level, file))
            .ok_or_else(|| format!("level {level} wrote unopened {file:?}"))?;
        let data = match f.orphan {
            Some(o) => self.orphans.entry(o).or_default(),
            None => {
                // A path operation may have made a directory where the file
                // was: the file is then written past as an orphan.
                if !self.files.contains_key(&f.key) {
                    self.files.insert(f.key.clone(), Vec::new());
                }
                let Some(data) = self.files.get_mut(&f.key) else {
                    return Err(format!("level {level} wrote {file:?}, which vanished"));
                };
                data
            }
        };
        let start = if f.append { data.len() } else { f.pos };
        let end = start + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        f.pos = end;
        if f.orphan.is_none() {
            self.dirty.push(f.path.clone());
        }
        Ok(EffectResult::Written { written: bytes.len() as u64 })
    }

    pub fn close(&mut self, level: usize, file: FileId) -> Result<EffectResult, String> {
        match self.open.remove(&(level, file)) {
            Some(f) => {
                if let Some(o) = f.orphan.filter(|o| !self.open.values().any(|g| g.orphan == Some(*o))) {
                    self.orphans.remove(&o);
                }
                Ok(EffectResult::Closed)
            }
            None => Err(format!("level {level} closed unopened {file:?}")),
        }
    }
}

/// The directories the production shell would hold open for `roots`: each
/// directory root, and each file root's parent.
pub fn anchors(fs: &HostFs, roots: &[airlock_core::policy::Root]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for r in roots {
        let a = if fs.is_dir(&r.path) {
            r.path.clone()
        } else {
            r.path.parent().map_or_else(|| r.path.clone(), Path::to_path_buf)
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}
