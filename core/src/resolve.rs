//! Opening a host file with every symlink resolved *and checked*: the walk
//! and the decisions, over any namespace that can answer "what is this name
//! in this directory, without following it".
//!
//! The production shell answers with `openat(O_PATH|O_NOFOLLOW)`,
//! `readlinkat` and a final `openat(O_NOFOLLOW)` on directory descriptors
//! it holds (so a name swapped after it was looked at cannot redirect the
//! walk: every step acts on the descriptor of the directory already
//! reached); the simulator answers from its in-memory filesystem. Both run
//! this same walk, so the simulator resolves exactly as production does.
//!
//! The walk starts at the deepest *anchor* (a directory root of the level
//! that owns the files, opened once at start-up) containing the path, goes
//! one component at a time, and whenever a component is a symlink it
//! rewrites the path (relative targets against the link's directory,
//! absolute ones as they are, `..` applied to the physical path) and starts
//! again from the anchor containing the new path. The final component is
//! opened without following it, and only after the scope permits the
//! fully resolved path in the requested mode: read-only, single-file roots
//! and every nested level's narrowing are all decided on the file that is
//! actually opened, never on the text the child sent.

use crate::fsproxy::wire::Mode;
use crate::guard::{Act, Hit};
use crate::policy::bytes::{self, Comp};
use crate::scope::{Denial, Rule, Scope};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Symlinks followed in one open at most (the kernel's `MAXSYMLINKS`).
pub const MAX_SYMLINK_HOPS: usize = 40;

/// What a name in a directory is, not following it.
#[derive(Debug)]
pub enum Entry<D> {
    Dir(D),
    Symlink(PathBuf),
    /// A file of another kind (not a directory on the way to the file).
    NotDir,
    Missing,
}

/// The final component, opened without following it.
#[derive(Debug)]
pub enum Final<F> {
    File(F),
    Symlink(PathBuf),
}

/// The first symlink an open followed, and the scope rule it sits under:
/// what a refusal names so that the child (and the audit log) learns which
/// rule decided, not only that something did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Via {
    pub link: PathBuf,
    /// The rule (an allowed root, or a nested level's narrowing) the link
    /// itself is under, when one is.
    pub root: Option<PathBuf>,
}

/// Why an open failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The resolved path is outside the scope, or outside every anchor.
    /// `denied_by` is the rule that denies it explicitly (a `none` rule of
    /// a narrowing), when one does.
    Outside {
        path: PathBuf,
        denied_by: Option<PathBuf>,
        via: Option<Via>,
    },
    /// A write to a resolved path the scope allows only for reading:
    /// `root` is the read-only rule that decided.
    ReadOnly {
        path: PathBuf,
        root: PathBuf,
        via: Option<Via>,
    },
    /// A protected path, a secret file or a `--deny` glob ([`crate::guard`]):
    /// `hit` names the resolved path and the rule.
    Guarded {
        hit: Hit,
        via: Option<Via>,
    },
    TooManyLinks,
    NotFound,
    /// The request does not fit what is there: a name that already
    /// exists, a directory not empty, a directory where a file was meant
    /// (`E_ARG`, neither refused nor missing).
    Conflict(String),
    /// The file system refused (permission, not a regular file, …).
    Denied(String),
    /// The namespace failed otherwise (I/O error, …).
    Fs(String),
}

impl Refusal {
    /// How the machine reports it: `E_PERM` for every refusal of the
    /// policy or the file system, `E_NOENT`, or `E_IO`.
    pub fn kind(&self) -> crate::fsproxy::FsErrorKind {
        use crate::fsproxy::FsErrorKind;
        match self {
            Refusal::Outside { .. }
            | Refusal::ReadOnly { .. }
            | Refusal::Guarded { .. }
            | Refusal::TooManyLinks
            | Refusal::Denied(_) => FsErrorKind::Denied,
            Refusal::NotFound => FsErrorKind::NotFound,
            Refusal::Conflict(_) => FsErrorKind::Conflict,
            Refusal::Fs(_) => FsErrorKind::Other,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Outside { path, denied_by, via } => {
                match via {
                    Some(Via { link, root: Some(root) }) => write!(
                        f,
                        "symlink {} leads outside root {}: it resolves to {}",
                        link.display(),
                        root.display(),
                        path.display()
                    )?,
                    Some(Via { link, root: None }) => {
                        write!(f, "symlink {} resolves to {}", link.display(), path.display())?
                    }
                    None => write!(f, "{}", path.display())?,
                }
                match denied_by {
                    Some(rule) => write!(f, ", under {}, which this level denies", rule.display()),
                    None if via.is_some() => f.write_str(", outside every allowed root"),
                    None => f.write_str(" is outside every allowed root"),
                }
            }
            Refusal::ReadOnly { path, root, via } => {
                write!(f, "{} is under read-only root {}", path.display(), root.display())?;
                match via {
                    Some(v) => write!(f, " (reached through symlink {})", v.link.display()),
                    None => Ok(()),
                }
            }
            Refusal::Guarded { hit, via } => {
                write!(f, "{hit}")?;
                match via {
                    Some(v) => write!(f, " (reached through symlink {})", v.link.display()),
                    None => Ok(()),
                }
            }
            Refusal::TooManyLinks => write!(f, "more than {MAX_SYMLINK_HOPS} symlinks"),
            Refusal::NotFound => f.write_str("no such file or directory"),
            Refusal::Conflict(m) | Refusal::Denied(m) | Refusal::Fs(m) => f.write_str(m),
        }
    }
}

/// The file system operations the walk needs, on directories the
/// implementation holds open.
pub trait Namespace {
    type Dir;
    /// The anchor directory `index` (see [`open`]'s `anchors`).
    fn anchor(&mut self, index: usize) -> Result<Self::Dir, Refusal>;
    /// What `name` is in `dir`, not following it.
    fn lookup(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<Entry<Self::Dir>, Refusal>;
}

/// Opening the final component of a path as the FS proxy does.
pub trait OpenFinal: Namespace {
    type File;
    /// Open `name` in `dir` in `mode`, never following a symlink there
    /// (and never creating through one). `path` is its resolved absolute
    /// path, for the record.
    fn open_final(
        &mut self,
        dir: &Self::Dir,
        name: &OsStr,
        path: &Path,
        mode: Mode,
    ) -> Result<Final<Self::File>, Refusal>;

    /// [`OpenFinal::open_final`] as a served filesystem's open asks it:
    /// `how` says whether to create, exclusively or not, whether to
    /// truncate, and the new file's permission bits (`mode` still gives
    /// the access, and the decision). A namespace that knows no more
    /// opens as `mode` says.
    fn open_final_how(
        &mut self,
        dir: &Self::Dir,
        name: &OsStr,
        path: &Path,
        mode: Mode,
        how: Option<&OpenHow>,
    ) -> Result<Final<Self::File>, Refusal> {
        let _ = how;
        self.open_final(dir, name, path, mode)
    }
}

/// Whether an open may or must make the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Create {
    /// The file must exist.
    Never,
    IfMissing,
    /// It must not exist yet (`O_EXCL`).
    Exclusive,
}

/// A served filesystem's open beyond its mode (`open(2)`'s flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenHow {
    pub create: Create,
    pub truncate: bool,
    /// A new file's permission bits.
    pub perm: u32,
}

/// What a [`walk`] does once it holds the directory a path's last name is
/// in, and how it decides and reports: the FS proxy's open is one
/// (decided by a [`Scope`]), each of the VFS tool host's file operations
/// another (decided by its gate). The walk itself, one component at a time
/// from descriptors already reached, is the same for all of them.
pub trait Finish<N: Namespace + ?Sized> {
    type Out;
    type Err;
    /// How a failure of the namespace is reported.
    fn refused(&mut self, r: Refusal) -> Self::Err;
    /// `path` (canonical) is under no anchor.
    fn outside(&mut self, path: &[u8]) -> Self::Err;
    /// The symlink at `link` (canonical) is about to be followed.
    fn link(&mut self, _link: &[u8]) -> Result<(), Self::Err> {
        Ok(())
    }
    /// The directory `name` in `dir`, at `at` (canonical), on the way to
    /// `path` (canonical), is missing (`not_dir` false) or not a
    /// directory. `Ok(true)`: it was made, look again.
    fn missing(
        &mut self,
        _ns: &mut N,
        _dir: &N::Dir,
        _name: &OsStr,
        _at: &[u8],
        _path: &[u8],
        _not_dir: bool,
    ) -> Result<bool, Self::Err> {
        Err(self.refused(Refusal::NotFound))
    }
    /// `path` (canonical) is anchor `index` itself, and the directory it
    /// is in is under no anchor.
    fn anchored(&mut self, _ns: &mut N, _index: usize, path: &[u8]) -> Result<Step<Self::Out>, Self::Err> {
        Err(self.outside(path))
    }
    /// Decide on `path` (canonical, every directory on the way resolved),
    /// the name `name` in `dir`, and act on it without following it there.
    fn last(
        &mut self,
        ns: &mut N,
        dir: &N::Dir,
        name: &OsStr,
        path: &[u8],
    ) -> Result<Step<Self::Out>, Self::Err>;
}

/// What [`Finish::last`] did.
#[derive(Debug)]
pub enum Step<T> {
    Done(T),
    /// The last name is a symlink to this, to be followed.
    Follow(PathBuf),
}

/// The path being walked: absolute, one normal name per component, kept
/// as the bytes `/a/b/c` (just `/` for none) with where each name ends, so
/// that every prefix the walk asks for is a slice rather than a new path.
#[derive(Clone, Debug, Default)]
struct Walked {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Walked {
    /// The normal names of `path`; anything else in it is skipped.
    fn of(path: &Path) -> Self {
        let b = bytes::bytes(path);
        if let Some(ends) = bytes::normal_ends(b) {
            // Nothing to skip: the names end where the separators are.
            return Walked { buf: b.to_vec(), ends };
        }
        Walked::of_comps(path)
    }

    /// [`Walked::of`], component by component.
    fn of_comps(path: &Path) -> Self {
        let mut w = Walked::root(path.as_os_str().len());
        for c in bytes::comps(bytes::bytes(path)) {
            if let Comp::Normal(n) = c {
                w.push(n);
            }
        }
        w
    }

    fn root(capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity.max(1));
        buf.push(b'/');
        Walked { buf, ends: Vec::new() }
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 1 } else { self.ends[i - 1] + 1 };
        &self.buf[start..self.ends[i]]
    }

    /// The path of the first `k` names.
    fn prefix(&self, k: usize) -> &[u8] {
        match k {
            0 => b"/",
            _ => &self.buf[..self.ends[k - 1]],
        }
    }

    fn push(&mut self, name: &[u8]) {
        if !self.ends.is_empty() {
            self.buf.push(b'/');
        }
        self.buf.extend_from_slice(name);
        self.ends.push(self.buf.len());
    }

    fn pop(&mut self) {
        self.ends.pop();
        self.buf.truncate(self.ends.last().copied().unwrap_or(1));
    }

    /// Apply `target` (a symlink's contents) to the physical directory of
    /// the first `dir` names, then append the names from `rest` on: `..`
    /// climbs the physical path (never above `/`).
    fn rewrite(&self, dir: usize, target: &Path, rest: usize) -> Walked {
        let target_bytes = bytes::bytes(target);
        let mut out = if bytes::is_absolute(target_bytes) {
            Walked::root(self.buf.len() + target_bytes.len())
        } else {
            let mut w = Walked::root(self.buf.len() + target_bytes.len());
            w.buf.clear();
            w.buf.extend_from_slice(self.prefix(dir));
            w.ends.extend_from_slice(&self.ends[..dir]);
            w
        };
        for c in bytes::comps(target_bytes) {
            match c {
                Comp::Normal(n) => out.push(n),
                Comp::Parent => out.pop(),
                Comp::Cur | Comp::Root => {}
            }
        }
        for i in rest..self.len() {
            out.push(self.name(i));
        }
        out
    }
}

pub(crate) fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(b.to_vec()))
}

/// Open `path` (absolute, lexically normal) in `mode`, resolving symlinks
/// from the `anchors` (physical absolute paths of directories the
/// namespace holds, by index) and checking the resolved path against
/// `scope`. Returns the file and its resolved path.
pub fn open<N: OpenFinal>(
    ns: &mut N,
    anchors: &[PathBuf],
    path: &Path,
    mode: Mode,
    scope: &Scope,
) -> Result<(N::File, PathBuf), Refusal> {
    open_counted(ns, anchors, &[], path, mode, scope)
}

/// [`open`], given each anchor's [`bytes::spelled_count`] (`counts[i]`
/// for `anchors[i]`; one not given is counted here), for a caller that
/// opens again and again from the same anchors.
pub fn open_counted<N: OpenFinal>(
    ns: &mut N,
    anchors: &[PathBuf],
    counts: &[Option<usize>],
    path: &Path,
    mode: Mode,
    scope: &Scope,
) -> Result<(N::File, PathBuf), Refusal> {
    open_how(ns, anchors, counts, path, mode, None, scope)
}

/// [`open_counted`] with a served filesystem's [`OpenHow`].
pub fn open_how<N: OpenFinal>(
    ns: &mut N,
    anchors: &[PathBuf],
    counts: &[Option<usize>],
    path: &Path,
    mode: Mode,
    how: Option<&OpenHow>,
    scope: &Scope,
) -> Result<(N::File, PathBuf), Refusal> {
    walk(ns, anchors, counts, path, &mut ProxyOpen { scope, mode, how, via: None })
}

/// The FS proxy's open as a [`Finish`].
struct ProxyOpen<'s> {
    scope: &'s Scope,
    mode: Mode,
    how: Option<&'s OpenHow>,
    /// The first symlink followed: what a refusal names.
    via: Option<Via>,
}

impl ProxyOpen<'_> {
    // Every path the walk builds is spelled canonically: a root and
    // normal names.
    fn rule_for(&self, p: &[u8]) -> Option<&Rule> {
        self.scope.rule_for_spelled(p, true)
    }
}

impl<N: OpenFinal> Finish<N> for ProxyOpen<'_> {
    type Out = N::File;
    type Err = Refusal;

    fn refused(&mut self, r: Refusal) -> Refusal {
        r
    }

    fn outside(&mut self, path: &[u8]) -> Refusal {
        outside(self.rule_for(path), path_of(path), self.via.clone())
    }

    fn anchored(&mut self, _ns: &mut N, _index: usize, path: &[u8]) -> Result<Step<N::File>, Refusal> {
        // A directory root itself: no anchor holds the directory it is
        // in, yet the scope reaches it. It is a directory, not a file out
        // of reach.
        let rule = self.rule_for(path);
        if rule.is_some_and(|r| r.access.is_some()) {
            return Err(Refusal::Denied("is a directory, not a regular file".into()));
        }
        Err(outside(rule, path_of(path), self.via.clone()))
    }

    fn link(&mut self, link: &[u8]) -> Result<(), Refusal> {
        if self.via.is_none() {
            let root = self.rule_for(link).filter(|r| r.access.is_some()).map(|r| r.path.clone());
            self.via = Some(Via { link: path_of(link), root });
        }
        Ok(())
    }

    fn last(
        &mut self,
        ns: &mut N,
        dir: &N::Dir,
        name: &OsStr,
        path: &[u8],
    ) -> Result<Step<N::File>, Refusal> {
        decide(self.scope, path, self.mode.writable(), self.via.as_ref())?;
        Ok(match ns.open_final_how(dir, name, &path_of(path), self.mode, self.how)? {
            Final::File(f) => Step::Done(f),
            Final::Symlink(target) => Step::Follow(target),
        })
    }
}

/// Resolve `path` (absolute, lexically normal) from the `anchors`, one
/// component at a time from the descriptors of the directories already
/// reached, and hand its last name to `fin` in the directory it is in.
/// Symlinks on the way (and the last one when `fin` follows it) rewrite
/// the path, which is walked again from its deepest anchor. Returns what
/// `fin` made and the path it was made at (canonical).
pub fn walk<N: Namespace, F: Finish<N>>(
    ns: &mut N,
    anchors: &[PathBuf],
    counts: &[Option<usize>],
    path: &Path,
    fin: &mut F,
) -> Result<(F::Out, PathBuf), F::Err> {
    debug_assert!(counts.iter().zip(anchors).all(|(c, a)| *c == bytes::spelled_count(bytes::bytes(a))));
    let mut parts = Walked::of(path);
    // Symlinks followed, and directories made and then gone again: both
    // bounded, so neither a loop nor a racing peer keeps the walk going.
    let mut hops = 0;
    let count = |i: usize, a: &PathBuf| {
        counts.get(i).copied().unwrap_or_else(|| bytes::spelled_count(bytes::bytes(a)))
    };
    'walk: loop {
        let Some(parent) = parts.len().checked_sub(1) else {
            return Err(fin.refused(Refusal::Denied("not a regular file".into())));
        };
        let parent_path = parts.prefix(parent);
        // The deepest anchor containing the directory the file is in.
        let counted = anchors.iter().enumerate().map(|(i, a)| (a, count(i, a)));
        // The depth found is the anchor's number of components.
        let Some((index, _, depth)) = bytes::deepest_spelled(parent_path, true, counted, PathBuf::as_path)
        else {
            // The path may be an anchor itself.
            let counted = anchors.iter().enumerate().map(|(i, a)| (a, count(i, a)));
            let step = match bytes::deepest_spelled(&parts.buf, true, counted, PathBuf::as_path) {
                Some((index, _, depth)) if depth == parts.len() + 1 => fin.anchored(ns, index, &parts.buf)?,
                _ => return Err(fin.outside(&parts.buf)),
            };
            match step {
                Step::Done(out) => return Ok((out, path_of(&parts.buf))),
                Step::Follow(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(fin.refused(Refusal::TooManyLinks));
                    }
                    fin.link(&parts.buf)?;
                    parts = parts.rewrite(parent, &target, parts.len());
                    continue 'walk;
                }
            }
        };
        let depth = depth - 1;
        let mut dir = ns.anchor(index).map_err(|e| fin.refused(e))?;
        let mut i = depth;
        while i < parent {
            let name = bytes::os(parts.name(i));
            match ns.lookup(&dir, name).map_err(|e| fin.refused(e))? {
                Entry::Dir(d) => dir = d,
                Entry::Symlink(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(fin.refused(Refusal::TooManyLinks));
                    }
                    fin.link(parts.prefix(i + 1))?;
                    parts = parts.rewrite(i, &target, i + 1);
                    continue 'walk;
                }
                e @ (Entry::NotDir | Entry::Missing) => {
                    let not_dir = matches!(e, Entry::NotDir);
                    if !fin.missing(ns, &dir, name, parts.prefix(i + 1), &parts.buf, not_dir)? {
                        return Err(fin.refused(Refusal::NotFound));
                    }
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(fin.refused(Refusal::TooManyLinks));
                    }
                    // Made: look at it again (it may have been swapped).
                    continue;
                }
            }
            i += 1;
        }
        match fin.last(ns, &dir, bytes::os(parts.name(parent)), &parts.buf)? {
            Step::Done(out) => return Ok((out, path_of(&parts.buf))),
            Step::Follow(target) => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(fin.refused(Refusal::TooManyLinks));
                }
                fin.link(&parts.buf)?;
                parts = parts.rewrite(parent, &target, parts.len());
            }
        }
    }
}

/// The one decision on a resolved path, made by every operation that
/// reaches host files (open, stat, list, mkdir, remove, rename, and a
/// listing's entries through [`name_visible`]): whether `scope` permits
/// `path` (canonical, every symlink on the way resolved) for reading, or
/// for a change when `write` (a write, a create, a remove, either end of a
/// rename). `via` is the first symlink followed, for the refusal to name.
pub fn decide(scope: &Scope, path: &[u8], write: bool, via: Option<&Via>) -> Result<(), Refusal> {
    // One decision for the read and the write question: the scope's rule,
    // then the guard (protected paths, secret files, --deny).
    let act = if write { Act::Write } else { Act::Read };
    match scope.decide(path, act, false) {
        Err(Denial::Outside { rule }) => Err(outside(rule, path_of(path), via.cloned())),
        Err(Denial::ReadOnly { rule }) => {
            Err(Refusal::ReadOnly { path: path_of(path), root: rule.path.clone(), via: via.cloned() })
        }
        Err(Denial::Guarded(hit)) => Err(Refusal::Guarded { hit, via: via.cloned() }),
        Ok(_) => Ok(()),
    }
}

/// Whether a listing shows the entry at `path` (canonical): one the
/// scope reaches and the guard lets be read, or one on the way to a
/// deeper rule that it reaches.
/// Every listing asks this of every name it returns, so what a listing
/// shows is decided where every other access is: an entry no request
/// could reach is left out rather than shown and then refused.
pub fn name_visible(scope: &Scope, path: &[u8]) -> bool {
    // A secret or `--deny`ed file is absent, as it is to every other
    // request (a protected path is readable, so listed).
    if scope.guard().check(Path::new(bytes::os(path)), Act::Read, false).is_err() {
        return false;
    }
    if scope.rule_for_spelled(path, true).is_some_and(|r| r.access.is_some()) {
        return true;
    }
    scope.rules().iter().any(|r| r.access.is_some() && strictly_beneath(bytes::bytes(&r.path), path))
}

/// `inner` (canonical) lies strictly beneath `outer` (canonical).
pub(crate) fn strictly_beneath(inner: &[u8], outer: &[u8]) -> bool {
    match inner.strip_prefix(outer) {
        Some([b'/', _, ..]) => true,
        Some([_, ..]) => outer == b"/",
        _ => false,
    }
}

/// `rule` is the scope's rule for `path`.
pub(crate) fn outside(rule: Option<&Rule>, path: PathBuf, via: Option<Via>) -> Refusal {
    let denied_by = rule.filter(|r| r.access.is_none()).map(|r| r.path.clone());
    Refusal::Outside { path, denied_by, via }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Access;
    use std::collections::BTreeMap;

    /// A namespace of absolute paths: directories, files, symlinks.
    #[derive(Default)]
    struct Mem {
        nodes: BTreeMap<PathBuf, Node>,
        anchors: Vec<PathBuf>,
    }

    #[derive(Clone)]
    enum Node {
        Dir,
        File,
        Link(PathBuf),
    }

    impl Namespace for Mem {
        type Dir = PathBuf;
        fn anchor(&mut self, index: usize) -> Result<PathBuf, Refusal> {
            Ok(self.anchors[index].clone())
        }
        fn lookup(&mut self, dir: &PathBuf, name: &OsStr) -> Result<Entry<PathBuf>, Refusal> {
            let p = dir.join(name);
            Ok(match self.nodes.get(&p) {
                Some(Node::Dir) => Entry::Dir(p),
                Some(Node::File) => Entry::NotDir,
                Some(Node::Link(t)) => Entry::Symlink(t.clone()),
                None => Entry::Missing,
            })
        }
    }

    impl OpenFinal for Mem {
        type File = PathBuf;

        fn open_final(
            &mut self,
            dir: &PathBuf,
            name: &OsStr,
            _: &Path,
            mode: Mode,
        ) -> Result<Final<PathBuf>, Refusal> {
            let p = dir.join(name);
            match self.nodes.get(&p).cloned() {
                Some(Node::File) => Ok(Final::File(p)),
                Some(Node::Link(t)) => Ok(Final::Symlink(t)),
                Some(Node::Dir) => Err(Refusal::Denied("not a regular file".into())),
                None if mode == Mode::Read => Err(Refusal::NotFound),
                None => {
                    self.nodes.insert(p.clone(), Node::File);
                    Ok(Final::File(p))
                }
            }
        }
    }

    fn world() -> Mem {
        let mut m = Mem { anchors: vec!["/d".into()], ..Mem::default() };
        for d in ["/d", "/d/ro", "/d/a", "/d/a/sub", "/d/a/other"] {
            m.nodes.insert(d.into(), Node::Dir);
        }
        for f in ["/d/ro/keep.txt", "/d/a/other/secret", "/d/secret.txt"] {
            m.nodes.insert(f.into(), Node::File);
        }
        m.nodes.insert("/d/rolink".into(), Node::Link("ro".into()));
        m.nodes.insert("/d/a/sub/up".into(), Node::Link("../other".into()));
        m.nodes.insert("/d/out.txt".into(), Node::Link("/d/secret.txt".into()));
        m.nodes.insert("/d/loop".into(), Node::Link("loop".into()));
        m.nodes.insert("/d/a/sub/ok".into(), Node::Link("../sub/../sub/f".into()));
        m.nodes.insert("/d/a/sub/f".into(), Node::File);
        m
    }

    proptest::proptest! {
        /// A normal absolute path is split where its separators are, as
        /// its components say.
        #[test]
        fn walked_of_a_normal_path_is_its_components(
            names in proptest::collection::vec(
                proptest::sample::select(vec!["a", "bc", "..", ".", "", "...", ".x", "data"]),
                0..6,
            ),
            absolute in proptest::bool::ANY,
        ) {
            let text = format!("{}{}", if absolute { "/" } else { "" }, names.join("/"));
            let path = Path::new(&text);
            let (fast, slow) = (Walked::of(path), Walked::of_comps(path));
            proptest::prop_assert_eq!(&fast.buf, &slow.buf);
            proptest::prop_assert_eq!(&fast.ends, &slow.ends);
        }
    }

    fn scope(rules: &[(&str, Option<Access>)]) -> Scope {
        Scope::from_rules(rules.iter().map(|(p, a)| Rule { path: p.into(), access: *a }))
    }

    const RO: Option<Access> = Some(Access::ReadOnly);
    const RW: Option<Access> = Some(Access::ReadWrite);

    #[test]
    fn a_directory_root_itself_is_a_directory_not_a_path_outside() {
        let mut m = world();
        let anchors = m.anchors.clone();
        let reached = scope(&[("/d", RO)]);
        for path in ["/d", "/d/"] {
            let e = open(&mut m, &anchors, Path::new(path), Mode::Read, &reached).unwrap_err();
            assert_eq!(e, Refusal::Denied("is a directory, not a regular file".into()), "{path}");
        }
        // A level whose scope does not reach the root learns nothing of it.
        let narrowed = scope(&[("/d", None)]);
        let e = open(&mut m, &anchors, Path::new("/d"), Mode::Read, &narrowed).unwrap_err();
        assert!(matches!(e, Refusal::Outside { .. }), "{e:?}");
        let elsewhere = scope(&[("/d/a", RO)]);
        let e = open(&mut m, &anchors, Path::new("/d"), Mode::Read, &elsewhere).unwrap_err();
        assert!(matches!(e, Refusal::Outside { .. }), "{e:?}");
    }

    #[test]
    fn protected_and_secret_files_are_decided_on_the_resolved_file() {
        use crate::guard::{Class, Grants, Guard, Rule as GuardRule};
        let mut m = world();
        for d in ["/d/.git", "/d/.git/hooks"] {
            m.nodes.insert(d.into(), Node::Dir);
        }
        for f in ["/d/.git/config", "/d/.git/index", "/d/.env"] {
            m.nodes.insert(f.into(), Node::File);
        }
        m.nodes.insert("/d/cfg".into(), Node::Link(".git/config".into()));
        m.nodes.insert("/d/notes.txt".into(), Node::Link("/d/.env".into()));
        m.nodes.insert("/d/g".into(), Node::Link(".git".into()));
        let anchors = m.anchors.clone();
        let s = scope(&[("/d", RW)]);
        // Written through a symlink, by its own name, created, truncated:
        // refused, naming the rule and the link.
        for (path, mode) in [
            ("/d/cfg", Mode::Write),
            ("/d/cfg", Mode::Append),
            ("/d/.git/config", Mode::ReadWrite),
            ("/d/g/hooks/pre-commit", Mode::Write),
            ("/d/g/config.worktree", Mode::Append),
            ("/d/a/.git", Mode::Write),
        ] {
            let e = open(&mut m, &anchors, Path::new(path), mode, &s).unwrap_err();
            let Refusal::Guarded { hit, .. } = &e else { panic!("{path}: {e:?}") };
            assert_eq!(hit.class, Class::Protected, "{path}");
            assert!(e.to_string().contains("--allow-protected"), "{e}");
        }
        assert!(!m.nodes.contains_key(Path::new("/d/.git/hooks/pre-commit")));
        // Read freely; the rest of .git written freely.
        assert!(open(&mut m, &anchors, Path::new("/d/cfg"), Mode::Read, &s).is_ok());
        assert!(open(&mut m, &anchors, Path::new("/d/g/index"), Mode::Write, &s).is_ok());
        // A secret is never served, by any name.
        let e = open(&mut m, &anchors, Path::new("/d/notes.txt"), Mode::Read, &s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/d/.env is a secret file (the .env family): airlock never serves it; pass --allow-secret \
             /d/.env to share it (reached through symlink /d/notes.txt)"
        );
        let Refusal::Guarded { hit, .. } = e else { unreachable!() };
        assert_eq!(hit.rule, GuardRule::EnvFile);
        // Granted at this level, but not at a nested one: refused.
        let granted = Guard::new(Grants::new(["/d/.git".into()]), Grants::default(), None, []);
        let top = s.clone().with_guard(granted);
        assert!(open(&mut m, &anchors, Path::new("/d/cfg"), Mode::Write, &top).is_ok());
        let nested = scope(&[("/d", RW)]);
        let both = top.intersect(&nested);
        assert!(matches!(
            open(&mut m, &anchors, Path::new("/d/cfg"), Mode::Write, &both),
            Err(Refusal::Guarded { .. })
        ));
    }

    #[test]
    fn the_four_attacks_are_decided_on_the_resolved_file() {
        let mut m = world();
        let anchors = m.anchors.clone();
        // Read-only decided on the resolved file.
        let s = scope(&[("/d", RW), ("/d/ro", RO)]);
        let r = open(&mut m, &anchors, Path::new("/d/rolink/keep.txt"), Mode::Write, &s);
        let e = r.unwrap_err();
        assert_eq!(
            e,
            Refusal::ReadOnly {
                path: "/d/ro/keep.txt".into(),
                root: "/d/ro".into(),
                via: Some(Via { link: "/d/rolink".into(), root: Some("/d".into()) }),
            }
        );
        assert_eq!(
            e.to_string(),
            "/d/ro/keep.txt is under read-only root /d/ro (reached through symlink /d/rolink)"
        );
        assert!(open(&mut m, &anchors, Path::new("/d/rolink/keep.txt"), Mode::Read, &s).is_ok());
        // A narrower nested level cannot be left through a symlink.
        let s = scope(&[("/d/a/sub", RW)]);
        let r = open(&mut m, &anchors, Path::new("/d/a/sub/up/secret"), Mode::Read, &s);
        assert_eq!(
            r.unwrap_err().to_string(),
            "symlink /d/a/sub/up leads outside root /d/a/sub: it resolves to /d/a/other/secret, \
             outside every allowed root"
        );
        // A single-file root that is a symlink to a sibling.
        let s = scope(&[("/d/out.txt", RW)]);
        let r = open(&mut m, &anchors, Path::new("/d/out.txt"), Mode::Read, &s);
        assert_eq!(
            r.unwrap_err(),
            Refusal::Outside {
                path: "/d/secret.txt".into(),
                denied_by: None,
                via: Some(Via { link: "/d/out.txt".into(), root: Some("/d/out.txt".into()) }),
            }
        );
        // Loops end.
        let s = scope(&[("/d", RW)]);
        assert_eq!(
            open(&mut m, &anchors, Path::new("/d/loop"), Mode::Read, &s).unwrap_err(),
            Refusal::TooManyLinks
        );
        // `..` in a target climbs the physical path.
        let (_, p) = open(&mut m, &anchors, Path::new("/d/a/sub/ok"), Mode::Read, &s).unwrap();
        assert_eq!(p, PathBuf::from("/d/a/sub/f"));
        // Outside every anchor.
        m.nodes.insert("/d/abs".into(), Node::Link("/etc/passwd".into()));
        let s = Scope::everything();
        assert_eq!(
            open(&mut m, &anchors, Path::new("/d/abs"), Mode::Read, &s).unwrap_err(),
            Refusal::Outside {
                path: "/etc/passwd".into(),
                denied_by: None,
                via: Some(Via { link: "/d/abs".into(), root: Some("/".into()) }),
            }
        );
        // A plain path under a rule a narrowing denies names that rule.
        let s = scope(&[("/d", RW), ("/d/a", None)]);
        let e = open(&mut m, &anchors, Path::new("/d/a/sub/f"), Mode::Read, &s).unwrap_err();
        assert_eq!(e.to_string(), "/d/a/sub/f, under /d/a, which this level denies");
        let s = scope(&[("/d/ro", RW)]);
        let e = open(&mut m, &anchors, Path::new("/d/secret.txt"), Mode::Read, &s).unwrap_err();
        assert_eq!(e.to_string(), "/d/secret.txt is outside every allowed root");
        // No file is created through a refused path.
        let s = scope(&[("/d", RW), ("/d/ro", RO)]);
        assert!(open(&mut m, &anchors, Path::new("/d/rolink/new"), Mode::Write, &s).is_err());
        assert!(!m.nodes.contains_key(Path::new("/d/ro/new")));
    }
}
