//! The path operations on host files — stat, list, mkdir, remove, rename,
//! and set-attributes — each one walk that resolves, decides and acts.
//!
//! A path is resolved by the same walk as an open ([`crate::resolve::walk`]):
//! from the deepest anchor (a root directory the shell holds open), one
//! component at a time, from the descriptor of the directory already
//! reached, symlinks rewritten and walked again. The last name is then
//! looked at in the directory held, decided on by the one decision every
//! operation makes ([`resolve::decide`]: the scope's rule for the resolved
//! path, for reading, or for a change), and acted on *in that directory*,
//! never by path again: a name swapped after the decision cannot redirect
//! the act, which never follows a symlink at the last name.
//!
//! What each operation decides on:
//! - `stat` and `list` follow a symlink at the last name (a `stat` with
//!   `follow: false` looks at the link itself) and decide for reading; a
//!   listing's entries each pass [`resolve::name_visible`], so a name no
//!   request could reach is left out; names that are not UTF-8 are too
//!   (the protocol's paths are strings).
//! - `mkdir` decides for a change on the new directory, and with `parents`
//!   on each missing directory on the way as it makes it.
//! - `remove` and both ends of `rename` decide for a change on the name
//!   itself, not following a symlink there (the link is what is removed or
//!   moved). An anchor (an allowed root, or the directory of a file root)
//!   is never removed, renamed, or replaced; and a directory is moved only
//!   when no rule of the scope and no anchor lies beneath it, at either
//!   end: moving one would carry a read-only or denied subtree (or a root)
//!   out from under its rule, or carry files in under a rule they were
//!   never decided under.
//! - `set_attr` (size, mode, times; not a wire op of the FS proxy, for
//!   shells that serve files as a filesystem) follows a symlink at the last
//!   name and decides for a change.
//!
//! A backend provides the primitives ([`PathNs`]) relative to its
//! directory handles: the production shell with `*at` calls on
//! descriptors, the simulator on its in-memory tree.

use crate::policy::bytes;
use crate::resolve::{self, Finish, Namespace, Refusal, Step, Via};
use crate::scope::Scope;
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Entries one `list` answer holds at most by default (`--max-list-entries`).
pub const DEFAULT_MAX_LIST_ENTRIES: u32 = 1000;
/// Bytes of names one `list` answer holds at most by default
/// (`--max-list-bytes`); a page always holds at least one entry.
pub const DEFAULT_MAX_LIST_BYTES: u32 = 256 << 10;

/// What a node is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    #[default]
    Other,
}

impl Kind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "dir",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }
}

/// A point in time as the file system keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    /// Nanoseconds since the epoch (saturating).
    pub fn as_nanos(self) -> i64 {
        self.sec.saturating_mul(1_000_000_000).saturating_add(i64::from(self.nsec))
    }
}

/// What `stat` learns of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub nlink: u64,
    pub ino: u64,
    pub mtime: Time,
    pub atime: Time,
    pub ctime: Time,
}

impl FileStat {
    /// A stat of `kind`, everything else zero (the simulator's, a
    /// virtual file's).
    pub fn of(kind: Kind, size: u64) -> Self {
        FileStat { kind, size, nlink: 1, ..FileStat::default() }
    }
}

/// One entry of a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: Kind,
    /// A regular file's size; 0 for anything else.
    pub size: u64,
}

/// One page of a listing: entries in byte order of their names, and
/// whether more may follow the last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    pub entries: Vec<DirEntry>,
    pub more: bool,
}

/// Attributes `set_attr` changes; `None` leaves one as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// Truncate or extend a regular file to this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Permission bits (`& 0o7777`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atime: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime: Option<Time>,
}

/// A path operation, on absolute, lexically normal paths (the shell
/// resolves them from its anchors under a scope).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum PathOp {
    Stat {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
        follow: bool,
    },
    /// Entries whose names sort after `after` (bytes order), at most `max`
    /// of them and `max_bytes` bytes of names (at least one).
    List {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        max: u32,
        max_bytes: u32,
    },
    Mkdir {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
        parents: bool,
    },
    Remove {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
    },
    /// `noreplace`: fail rather than replace what is at `to`
    /// (`RENAME_NOREPLACE`).
    Rename {
        #[serde(with = "crate::ospath")]
        from: PathBuf,
        #[serde(with = "crate::ospath")]
        to: PathBuf,
        noreplace: bool,
    },
    SetAttr {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
        attr: SetAttr,
    },
}

impl PathOp {
    pub const fn name(&self) -> &'static str {
        match self {
            PathOp::Stat { .. } => "stat",
            PathOp::List { .. } => "list",
            PathOp::Mkdir { .. } => "mkdir",
            PathOp::Remove { .. } => "remove",
            PathOp::Rename { .. } => "rename",
            PathOp::SetAttr { .. } => "set_attr",
        }
    }

    /// Whether the operation changes anything.
    pub const fn changes(&self) -> bool {
        !matches!(self, PathOp::Stat { .. } | PathOp::List { .. })
    }

    /// Every path it names (a rename's two).
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            PathOp::Stat { path, .. }
            | PathOp::List { path, .. }
            | PathOp::Mkdir { path, .. }
            | PathOp::Remove { path }
            | PathOp::SetAttr { path, .. } => vec![path],
            PathOp::Rename { from, to, .. } => vec![from, to],
        }
    }
}

/// What a path operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathDone {
    Stat(FileStat),
    Listed(Page),
    /// Made, removed or renamed.
    Done,
}

/// A node found at a name, not following it.
#[derive(Debug)]
pub struct Node<D> {
    pub stat: FileStat,
    /// A directory's handle (to list it, or act in it).
    pub dir: Option<D>,
    /// A symlink's target.
    pub target: Option<PathBuf>,
}

/// The primitives a namespace provides for the path operations, each
/// relative to a directory handle and never following a symlink at `name`
/// (`.`: the directory itself).
pub trait PathNs: Namespace {
    /// What `name` is: `None` when nothing is there.
    fn inspect(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<Option<Node<Self::Dir>>, Refusal>;
    /// The directory's entries whose names sort after `after` and that
    /// `keep` keeps, the first `max` in bytes order of their names, and
    /// whether kept ones follow. Memory stays bounded by `max` whatever
    /// the directory holds.
    fn list(
        &mut self,
        dir: &Self::Dir,
        after: Option<&[u8]>,
        max: usize,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Page, Refusal>;
    /// Make a directory; one already there is `Refusal::Conflict`.
    fn mkdir(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<(), Refusal>;
    /// Remove a name: an empty directory when `is_dir`, anything else not.
    fn remove(&mut self, dir: &Self::Dir, name: &OsStr, is_dir: bool) -> Result<(), Refusal>;
    /// Move `from` in `from_dir` to `to` in `to_dir`, replacing what is
    /// there unless `noreplace`.
    fn rename(
        &mut self,
        from_dir: &Self::Dir,
        from: &OsStr,
        to_dir: &Self::Dir,
        to: &OsStr,
        noreplace: bool,
    ) -> Result<(), Refusal>;
    /// Change a regular file's or directory's attributes; `seen` is what
    /// [`PathNs::inspect`] found there (a node swapped in since is refused).
    fn set_attr(
        &mut self,
        dir: &Self::Dir,
        name: &OsStr,
        seen: &FileStat,
        attr: &SetAttr,
    ) -> Result<FileStat, Refusal>;
}

/// Carry out `op` from the `anchors` (physical absolute directories the
/// namespace holds, by index; `counts` as for [`resolve::walk`]) under
/// `scope`.
pub fn perform<N: PathNs>(
    ns: &mut N,
    anchors: &[PathBuf],
    counts: &[Option<usize>],
    scope: &Scope,
    op: &PathOp,
) -> Result<PathDone, Refusal> {
    let ctx = Ctx { scope, anchors, counts };
    match op {
        PathOp::Stat { path, follow } => stat(ns, &ctx, path, *follow).map(PathDone::Stat),
        PathOp::List { path, after, max, max_bytes } => {
            list(ns, &ctx, path, after.as_deref(), *max, *max_bytes).map(PathDone::Listed)
        }
        PathOp::Mkdir { path, parents } => mkdir(ns, &ctx, path, *parents).map(|()| PathDone::Done),
        PathOp::Remove { path } => remove(ns, &ctx, path).map(|()| PathDone::Done),
        PathOp::Rename { from, to, noreplace } => {
            rename(ns, &ctx, from, to, *noreplace).map(|()| PathDone::Done)
        }
        PathOp::SetAttr { path, attr } => set_attr(ns, &ctx, path, attr).map(PathDone::Stat),
    }
}

/// What every walk of one operation shares.
struct Ctx<'a> {
    scope: &'a Scope,
    anchors: &'a [PathBuf],
    counts: &'a [Option<usize>],
}

impl Ctx<'_> {
    /// `path` is an anchor, or holds one beneath it.
    fn holds_anchor(&self, path: &[u8]) -> bool {
        self.anchors.iter().any(|a| {
            let a = bytes::bytes(a);
            a == path || resolve::strictly_beneath(a, path)
        })
    }

    /// A rule of the scope, or an anchor, lies strictly beneath `path`:
    /// moving the directory there would move a subtree out from under the
    /// rule that decides it (or under one it was never decided by).
    fn holds_rules(&self, path: &[u8]) -> bool {
        self.scope.rules().iter().any(|r| resolve::strictly_beneath(bytes::bytes(&r.path), path))
            || self.anchors.iter().any(|a| resolve::strictly_beneath(bytes::bytes(a), path))
    }
}

/// How one walk treats its last name.
#[derive(Clone, Copy, Debug)]
struct How {
    /// Follow a symlink at the last name.
    follow: bool,
    /// Decide for a change.
    write: bool,
    /// Make missing directories on the way, each decided for a change.
    parents: bool,
    /// Refuse to act on an anchor, or a path holding one.
    fixed: bool,
}

/// One operation's walk as a [`Finish`]: `act` runs on the last name once
/// the decision allowed its resolved path.
struct Walker<'a, F> {
    ctx: &'a Ctx<'a>,
    how: How,
    via: Option<Via>,
    act: F,
}

type Act<'f, N, T> = dyn FnMut(
        &mut N,
        &<N as Namespace>::Dir,
        &OsStr,
        &[u8],
        Option<Node<<N as Namespace>::Dir>>,
    ) -> Result<T, Refusal>
    + 'f;

fn root_refusal(path: &[u8]) -> Refusal {
    Refusal::Denied(format!(
        "{} is an allowed root, or holds one: it is never removed, moved or replaced",
        resolve::path_of(path).display()
    ))
}

impl<N, T> Finish<N> for Walker<'_, &mut Act<'_, N, T>>
where
    N: PathNs,
{
    type Out = T;
    type Err = Refusal;

    fn refused(&mut self, r: Refusal) -> Refusal {
        r
    }

    fn outside(&mut self, path: &[u8]) -> Refusal {
        let rule = self.ctx.scope.rule_for_spelled(path, true);
        resolve::outside(rule, resolve::path_of(path), self.via.clone())
    }

    fn link(&mut self, link: &[u8]) -> Result<(), Refusal> {
        if self.via.is_none() {
            let rule = self.ctx.scope.rule_for_spelled(link, true);
            let root = rule.filter(|r| r.access.is_some()).map(|r| r.path.clone());
            self.via = Some(Via { link: resolve::path_of(link), root });
        }
        Ok(())
    }

    fn missing(
        &mut self,
        ns: &mut N,
        dir: &N::Dir,
        name: &OsStr,
        at: &[u8],
        path: &[u8],
        not_dir: bool,
    ) -> Result<bool, Refusal> {
        // Decided first: whether a refused path exists is not the
        // client's to learn either.
        resolve::decide(self.ctx.scope, path, self.how.write, self.via.as_ref())?;
        if not_dir || !self.how.parents {
            return Err(Refusal::NotFound);
        }
        resolve::decide(self.ctx.scope, at, true, self.via.as_ref())?;
        match ns.mkdir(dir, name) {
            // Made by someone else meanwhile: look again all the same.
            Ok(()) | Err(Refusal::Conflict(_)) => Ok(true),
            Err(e) => Err(e),
        }
    }

    fn anchored(&mut self, ns: &mut N, index: usize, path: &[u8]) -> Result<Step<T>, Refusal> {
        resolve::decide(self.ctx.scope, path, self.how.write, self.via.as_ref())?;
        if self.how.fixed {
            return Err(root_refusal(path));
        }
        // The anchor itself: its descriptor, and what it is.
        let dir = ns.anchor(index)?;
        let found = ns.inspect(&dir, OsStr::new("."))?;
        (self.act)(ns, &dir, OsStr::new("."), path, found).map(Step::Done)
    }

    fn last(&mut self, ns: &mut N, dir: &N::Dir, name: &OsStr, path: &[u8]) -> Result<Step<T>, Refusal> {
        let found = ns.inspect(dir, name)?;
        if let Some(target) = found.as_ref().and_then(|n| n.target.as_ref()).filter(|_| self.how.follow) {
            return Ok(Step::Follow(target.clone()));
        }
        resolve::decide(self.ctx.scope, path, self.how.write, self.via.as_ref())?;
        if self.how.fixed && self.ctx.holds_anchor(path) {
            return Err(root_refusal(path));
        }
        (self.act)(ns, dir, name, path, found).map(Step::Done)
    }
}

/// Walk to `path`'s last name and `act` on it there; returns what `act`
/// made and the canonical path it acted on.
fn run<N: PathNs, T>(
    ns: &mut N,
    ctx: &Ctx<'_>,
    path: &Path,
    how: How,
    act: &mut Act<'_, N, T>,
) -> Result<(T, PathBuf), Refusal> {
    let mut w = Walker { ctx, how, via: None, act };
    resolve::walk(ns, ctx.anchors, ctx.counts, path, &mut w)
}

fn stat<N: PathNs>(ns: &mut N, ctx: &Ctx<'_>, path: &Path, follow: bool) -> Result<FileStat, Refusal> {
    let how = How { follow, write: false, parents: false, fixed: false };
    run(ns, ctx, path, how, &mut |_, _, _, _, found| found.map(|n| n.stat).ok_or(Refusal::NotFound))
        .map(|(s, _)| s)
}

fn list<N: PathNs>(
    ns: &mut N,
    ctx: &Ctx<'_>,
    path: &Path,
    after: Option<&str>,
    max: u32,
    max_bytes: u32,
) -> Result<Page, Refusal> {
    let how = How { follow: true, write: false, parents: false, fixed: false };
    let scope = ctx.scope;
    let (page, _) = run(ns, ctx, path, how, &mut |ns, _, _, at, found| {
        let Some(node) = found else { return Err(Refusal::NotFound) };
        let Some(d) = node.dir else {
            return Err(Refusal::Conflict(format!("{} is not a directory", resolve::path_of(at).display())));
        };
        let mut child = at.to_vec();
        let mut keep = |name: &[u8]| {
            if std::str::from_utf8(name).is_err() || name.contains(&b'/') || matches!(name, b"." | b"..") {
                return false;
            }
            child.truncate(at.len());
            if child != b"/" {
                child.push(b'/');
            }
            child.extend_from_slice(name);
            resolve::name_visible(scope, &child)
        };
        ns.list(&d, after.map(str::as_bytes), max.max(1) as usize, &mut keep)
    })?;
    Ok(trim(page, max.max(1) as usize, max_bytes as usize))
}

/// A page cut to `max` entries and `max_bytes` bytes of names (at least
/// one entry), `more` set when anything was cut.
pub fn trim(mut page: Page, max: usize, max_bytes: usize) -> Page {
    let mut bytes = 0usize;
    let mut keep = 0;
    for e in &page.entries {
        bytes = bytes.saturating_add(e.name.len());
        if keep >= max || (keep > 0 && bytes > max_bytes) {
            break;
        }
        keep += 1;
    }
    if keep < page.entries.len() {
        page.entries.truncate(keep);
        page.more = true;
    }
    page
}

fn mkdir<N: PathNs>(ns: &mut N, ctx: &Ctx<'_>, path: &Path, parents: bool) -> Result<(), Refusal> {
    // With `parents` a symlink at the last name is followed (`mkdir -p`
    // is content with a link to a directory); without, it is a name that
    // already exists.
    let how = How { follow: parents, write: true, parents, fixed: false };
    run(ns, ctx, path, how, &mut |ns, dir, name, at, found| match found {
        None => ns.mkdir(dir, name),
        Some(n) if parents && n.stat.kind == Kind::Dir => Ok(()),
        Some(_) => Err(Refusal::Conflict(format!("{} already exists", resolve::path_of(at).display()))),
    })
    .map(|((), _)| ())
}

fn remove<N: PathNs>(ns: &mut N, ctx: &Ctx<'_>, path: &Path) -> Result<(), Refusal> {
    let how = How { follow: false, write: true, parents: false, fixed: true };
    run(ns, ctx, path, how, &mut |ns, dir, name, _, found| match found {
        None => Err(Refusal::NotFound),
        Some(n) => ns.remove(dir, name, n.stat.kind == Kind::Dir),
    })
    .map(|((), _)| ())
}

fn rename<N: PathNs>(
    ns: &mut N,
    ctx: &Ctx<'_>,
    from: &Path,
    to: &Path,
    noreplace: bool,
) -> Result<(), Refusal> {
    let how = How { follow: false, write: true, parents: false, fixed: true };
    run(ns, ctx, from, how, &mut |ns, from_dir, from_name, from_at, found| {
        let Some(node) = found else { return Err(Refusal::NotFound) };
        let is_dir = node.stat.kind == Kind::Dir;
        let moved = |at: &[u8]| {
            Refusal::Denied(format!(
                "{} is a directory with another rule or root beneath it: moving it would move that \
                 subtree out from under its rule, or files in under one",
                resolve::path_of(at).display()
            ))
        };
        if is_dir && ctx.holds_rules(from_at) {
            return Err(moved(from_at));
        }
        // The destination walked while the source's directory is held.
        run(ns, ctx, to, how, &mut |ns, to_dir, to_name, to_at, there| {
            if is_dir && ctx.holds_rules(to_at) {
                return Err(moved(to_at));
            }
            if noreplace && there.is_some() {
                return Err(Refusal::Conflict(format!(
                    "{} already exists",
                    resolve::path_of(to_at).display()
                )));
            }
            ns.rename(from_dir, from_name, to_dir, to_name, noreplace)
        })
        .map(|((), _)| ())
    })
    .map(|((), _)| ())
}

fn set_attr<N: PathNs>(ns: &mut N, ctx: &Ctx<'_>, path: &Path, attr: &SetAttr) -> Result<FileStat, Refusal> {
    let how = How { follow: true, write: true, parents: false, fixed: false };
    run(ns, ctx, path, how, &mut |ns, dir, name, at, found| {
        let Some(node) = found else { return Err(Refusal::NotFound) };
        match node.stat.kind {
            Kind::File => ns.set_attr(dir, name, &node.stat, attr),
            Kind::Dir if attr.size.is_none() => ns.set_attr(dir, name, &node.stat, attr),
            Kind::Dir => Err(Refusal::Conflict(format!("{} is a directory", resolve::path_of(at).display()))),
            _ => Err(Refusal::Denied("not a regular file or directory".into())),
        }
    })
    .map(|(s, _)| s)
}

#[cfg(test)]
mod tests;
