//! Every `fs.*` operation as one walk that checks and acts at once.
//!
//! A path is resolved by the FS proxy's walk ([`crate::resolve::walk`])
//! from the project root, one component at a time, each looked up in the
//! directory reached so far (a descriptor the shell holds, never a path
//! it reopens), symlinks rewritten and walked again; the last name is then
//! looked at, decided on by the [`Gate`] (on the path it resolved to, in
//! the mode asked, as a directory or not), and acted on *in the directory
//! held*, never following a symlink there. A swap of any component between
//! the decision and the effect therefore cannot redirect the effect: the
//! walk already holds the directory, and the act, which refuses a symlink
//! and checks it met the kind of node it decided on, fails closed
//! ("changed while in use", `-32603`) when the name changed under it.
//!
//! A backend only provides the primitives ([`ProjectNs`]), relative to its
//! directory handles: the shell's with `openat(2)` and `O_NOFOLLOW`, the
//! in-memory one with paths. The operations' semantics live here, once.

use super::effect::OpError;
use super::files::{listing, DirEntry, EntryKind, Gate, GrepQuery, GrepResult, Metadata, Node, ProjectPath};
use crate::resolve::{self, Finish, Namespace, Refusal, Step, MAX_SYMLINK_HOPS};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// What acting on a name the walk decided on found.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened<T> {
    Done(T),
    /// A regular file over the size asked for (its size).
    TooLarge(u64),
    /// Not the kind of node decided on (a symlink, a directory, a file
    /// swapped in since): nothing was done.
    Changed,
}

/// A project's file system as the walk's namespace (anchor 0 is the
/// project root), with the primitives the operations act with. `name` is
/// one name in `dir`, or `.` for `dir` itself; none follows a symlink at
/// `name`.
pub trait ProjectNs: Namespace {
    /// What `name` is (a symlink with its target).
    fn stat(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<Node, Refusal>;
    /// A regular file's content, if at most `max` bytes (without blocking
    /// on a FIFO).
    fn read(&mut self, dir: &Self::Dir, name: &OsStr, max: usize) -> Result<Opened<Vec<u8>>, Refusal>;
    /// Create or truncate a regular file and write `content` to it.
    fn write(&mut self, dir: &Self::Dir, name: &OsStr, content: &[u8]) -> Result<Opened<()>, Refusal>;
    /// Open a directory for listing.
    fn open_dir(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<Opened<Self::Dir>, Refusal>;
    /// A directory's entries (names not UTF-8 left out), symlinks as
    /// such; a file's size may be left 0.
    fn list(&mut self, dir: &Self::Dir) -> Result<Vec<(String, Node)>, Refusal>;
    /// Make a directory (one already there is no error).
    fn mkdir(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<(), Refusal>;
    /// Remove a name that is not a directory.
    fn unlink(&mut self, dir: &Self::Dir, name: &OsStr) -> Result<Opened<()>, Refusal>;
    /// Move `from` in `from_dir` (not a directory) to `to` in `to_dir`,
    /// never replacing anything there: `Done(false)` when `to` exists.
    fn rename(
        &mut self,
        from_dir: &Self::Dir,
        from: &OsStr,
        to_dir: &Self::Dir,
        to: &OsStr,
    ) -> Result<Opened<bool>, Refusal>;

    /// `fs.grep` through the walk, each file searched with the core's
    /// [`grep_file`](super::files::grep_file); a backend with a faster
    /// searcher of its own passes that to [`grep`] instead.
    fn grep_files(&mut self, gate: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError>
    where
        Self: Sized,
    {
        let re = q.regex()?;
        let max = gate.max_file();
        grep(self, gate, q, &mut |path, content, out| {
            super::files::grep_file(&re, path, content, q, max, out)
        })
    }
}

/// How an operation walks its path.
#[derive(Clone, Copy, Debug)]
struct How {
    /// Follow a symlink at the last component.
    follow: bool,
    /// Decide for writing.
    write: bool,
    /// Make missing directories on the way (once the whole path passed).
    create: bool,
}

const READ: How = How { follow: true, write: false, create: false };

/// What a refusal of the namespace tells the tool about `shown`.
fn refused(shown: &ProjectPath, r: Refusal) -> OpError {
    match r {
        Refusal::NotFound => OpError::not_found(format!("{shown} does not exist")),
        Refusal::TooManyLinks => OpError::io(format!("path {shown}: more than {MAX_SYMLINK_HOPS} symlinks")),
        Refusal::Denied(m) => OpError::denied(format!("path {shown} denied: {m}")),
        Refusal::Fs(m) => OpError::io(format!("{shown}: {m}")),
        Refusal::Conflict(m) => OpError::invalid(format!("{shown}: {m}")),
        // Decisions of a scope: not made by this walk.
        Refusal::Outside { .. } | Refusal::ReadOnly { .. } | Refusal::Guarded { .. } => {
            OpError::denied(format!("path {shown} denied: it is outside the project"))
        }
    }
}

fn changed(shown: &ProjectPath) -> OpError {
    OpError::io(format!("{shown} changed while it was in use"))
}

/// The project path of `full` (canonical, under `project`).
fn relative(project: &[u8], full: &[u8], shown: &ProjectPath) -> Result<ProjectPath, OpError> {
    let rest = match full.strip_prefix(project) {
        Some([]) => return Ok(ProjectPath::ROOT),
        Some(rest) if project == b"/" => rest,
        Some([b'/', rest @ ..]) => rest,
        _ => return Err(OpError::denied(format!("path {shown} denied: it is outside the project"))),
    };
    let text = std::str::from_utf8(rest).map_err(|_| {
        OpError::denied(format!("path {shown} denied: a symlink on it leads to a name not UTF-8"))
    })?;
    Ok(ProjectPath::from_parts(text.split('/')))
}

/// One tool operation as a [`Finish`]: `act` runs on the last name once
/// the gate allowed its resolved path.
struct Op<'a, F> {
    gate: &'a Gate,
    project: &'a [u8],
    shown: &'a ProjectPath,
    how: How,
    act: F,
}

impl<'a, N, T, F> Finish<N> for Op<'a, F>
where
    N: ProjectNs,
    F: FnMut(&mut N, &N::Dir, &OsStr, &ProjectPath, Node) -> Result<T, OpError>,
{
    type Out = T;
    type Err = OpError;

    fn refused(&mut self, r: Refusal) -> OpError {
        refused(self.shown, r)
    }

    fn outside(&mut self, _: &[u8]) -> OpError {
        // The planted bug lets a link out of the project resolve to
        // nothing there.
        if self.gate.lexical_only() {
            return OpError::not_found(format!("{} does not exist", self.shown));
        }
        OpError::denied(format!("path {} denied: a symlink on it leads outside the project", self.shown))
    }

    fn missing(
        &mut self,
        ns: &mut N,
        dir: &N::Dir,
        name: &OsStr,
        _at: &[u8],
        path: &[u8],
        not_dir: bool,
    ) -> Result<bool, OpError> {
        // Decided first: whether a denied path exists is not the tool's
        // to learn either.
        let resolved = relative(self.project, path, self.shown)?;
        self.gate.check_as(&resolved, self.shown, self.how.write, false)?;
        if not_dir {
            return Err(OpError::not_found(format!("{}: a directory on the way is a file", self.shown)));
        }
        if !self.how.create {
            return Err(OpError::not_found(format!("{} does not exist", self.shown)));
        }
        ns.mkdir(dir, name).map_err(|r| refused(self.shown, r))?;
        Ok(true)
    }

    fn anchored(&mut self, ns: &mut N, index: usize, path: &[u8]) -> Result<Step<T>, OpError> {
        let dir = ns.anchor(index).map_err(|r| refused(self.shown, r))?;
        self.last(ns, &dir, OsStr::new("."), path)
    }

    fn last(&mut self, ns: &mut N, dir: &N::Dir, name: &OsStr, path: &[u8]) -> Result<Step<T>, OpError> {
        let node = ns.stat(dir, name).map_err(|r| refused(self.shown, r))?;
        if let Node::Symlink(target) = node {
            if self.how.follow {
                return Ok(Step::Follow(target));
            }
            // Not followed: acted on as the link itself, decided on when
            // it is changed (a link read is only ever skipped: `fs.grep`).
            let resolved = relative(self.project, path, self.shown)?;
            if self.how.write {
                self.gate.check_as(&resolved, self.shown, true, false)?;
            }
            return (self.act)(ns, dir, name, &resolved, Node::Symlink(target)).map(Step::Done);
        }
        let resolved = relative(self.project, path, self.shown)?;
        self.gate.check_as(&resolved, self.shown, self.how.write, node == Node::Dir)?;
        if self.gate.reopen_by_path() {
            if let Some(parent) = resolved.parent() {
                let dir = reopen(ns, self.project, &parent).map_err(|r| refused(self.shown, r))?;
                return (self.act)(ns, &dir, name, &resolved, node).map(Step::Done);
            }
        }
        (self.act)(ns, dir, name, &resolved, node).map(Step::Done)
    }
}

/// The planted bug's second walk: `dir` reached again by its path from
/// the root, following every symlink on the way unchecked.
fn reopen<N: ProjectNs>(ns: &mut N, project: &[u8], dir: &ProjectPath) -> Result<N::Dir, Refusal> {
    let mut parts: Vec<Vec<u8>> = dir.parts().map(|p| p.as_bytes().to_vec()).collect();
    let mut hops = 0;
    'walk: loop {
        let mut d = ns.anchor(0)?;
        for i in 0..parts.len() {
            match ns.lookup(&d, OsStr::from_bytes(&parts[i]))? {
                resolve::Entry::Dir(next) => d = next,
                resolve::Entry::Symlink(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(Refusal::TooManyLinks);
                    }
                    let t = target.as_os_str().as_bytes();
                    // The project is absolute: a target it prefixes is too.
                    let mut next: Vec<Vec<u8>> = match t.strip_prefix(project) {
                        Some(rest) => rest.split(|&b| b == b'/').map(<[u8]>::to_vec).collect(),
                        _ if t.first() == Some(&b'/') => return Err(Refusal::NotFound),
                        _ => parts[..i]
                            .iter()
                            .cloned()
                            .chain(t.split(|&b| b == b'/').map(<[u8]>::to_vec))
                            .collect(),
                    };
                    let mut norm: Vec<Vec<u8>> = Vec::new();
                    for c in next.drain(..).chain(parts[i + 1..].iter().cloned()) {
                        match &c[..] {
                            b"" | b"." => {}
                            b".." => {
                                norm.pop();
                            }
                            _ => norm.push(c),
                        }
                    }
                    parts = norm;
                    continue 'walk;
                }
                _ => return Err(Refusal::NotFound),
            }
        }
        return Ok(d);
    }
}

/// Walk to `shown`'s last name and `act` on it there.
fn run<N, T, F>(ns: &mut N, gate: &Gate, shown: &ProjectPath, how: How, act: F) -> Result<T, OpError>
where
    N: ProjectNs,
    F: FnMut(&mut N, &N::Dir, &OsStr, &ProjectPath, Node) -> Result<T, OpError>,
{
    let project = gate.project();
    let anchors = [project.to_path_buf()];
    let path = project.join(shown.as_str());
    let mut op = Op { gate, project: project.as_os_str().as_bytes(), shown, how, act };
    resolve::walk(ns, &anchors, &[], &path, &mut op).map(|(out, _)| out)
}

/// A path with its symlinks resolved (its last component's too when
/// `follow_last`) and decided on for reading or writing, and what is
/// there: for tests and the simulator's checkers.
pub fn resolve<N: ProjectNs>(
    ns: &mut N,
    gate: &Gate,
    path: &ProjectPath,
    follow_last: bool,
    write: bool,
) -> Result<(ProjectPath, Node), OpError> {
    let how = How { follow: follow_last, write, create: false };
    let found = run(ns, gate, path, how, |_, _, _, resolved, node| Ok((resolved.clone(), node)));
    match found {
        // A missing path, decided on: the walk reports it not found.
        Err(e) if e.code == crate::codec::jsonrpc::ErrorCode::NotFound => Ok((path.clone(), Node::Missing)),
        other => other,
    }
}

pub fn read<N: ProjectNs>(ns: &mut N, gate: &Gate, path: &ProjectPath) -> Result<Vec<u8>, OpError> {
    run(ns, gate, path, READ, |ns, dir, name, _, node| match node {
        Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
        Node::Dir => Err(OpError::invalid(format!("{path} is a directory"))),
        Node::File { .. } => match ns.read(dir, name, gate.max_file()).map_err(|r| refused(path, r))? {
            Opened::Done(b) => Ok(b),
            Opened::TooLarge(size) => {
                Err(OpError::too_large(&format!("file {path} ({size} bytes)"), gate.max_file()))
            }
            Opened::Changed => Err(changed(path)),
        },
        _ => Err(OpError::invalid(format!("{path} is not a regular file"))),
    })
}

pub fn write<N: ProjectNs>(
    ns: &mut N,
    gate: &Gate,
    path: &ProjectPath,
    content: &[u8],
) -> Result<(), OpError> {
    gate.check_write_size(path, content.len())?;
    let how = How { follow: true, write: true, create: true };
    run(ns, gate, path, how, |ns, dir, name, resolved, node| match node {
        _ if resolved.is_root() => Err(OpError::exists("the project root is a directory")),
        Node::Dir => Err(OpError::exists(format!("{path} is a directory"))),
        Node::File { .. } | Node::Missing => {
            match ns.write(dir, name, content).map_err(|r| refused(path, r))? {
                Opened::Done(()) => Ok(()),
                _ => Err(changed(path)),
            }
        }
        _ => Err(OpError::invalid(format!("{path} is not a regular file"))),
    })
}

pub fn exists<N: ProjectNs>(ns: &mut N, gate: &Gate, path: &ProjectPath) -> Result<bool, OpError> {
    match run(ns, gate, path, READ, |_, _, _, _, node| Ok(node != Node::Missing)) {
        // A directory missing on the way, once the gate allowed the path.
        Err(e) if e.code == crate::codec::jsonrpc::ErrorCode::NotFound => Ok(false),
        other => other,
    }
}

pub fn metadata<N: ProjectNs>(ns: &mut N, gate: &Gate, path: &ProjectPath) -> Result<Metadata, OpError> {
    run(ns, gate, path, READ, |_, _, _, _, node| match node {
        Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
        Node::File { size } => Ok(Metadata { kind: EntryKind::File, size }),
        Node::Dir => Ok(Metadata { kind: EntryKind::Dir, size: 0 }),
        _ => Ok(Metadata { kind: EntryKind::Other, size: 0 }),
    })
}

pub fn list_dir<N: ProjectNs>(ns: &mut N, gate: &Gate, path: &ProjectPath) -> Result<Vec<DirEntry>, OpError> {
    run(ns, gate, path, READ, |ns, dir, name, resolved, node| match node {
        Node::Dir => {
            let Opened::Done(d) = ns.open_dir(dir, name).map_err(|r| refused(path, r))? else {
                return Err(changed(path));
            };
            let children = ns.list(&d).map_err(|r| refused(path, r))?;
            Ok(listing(gate, path, resolved, children))
        }
        Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
        _ => Err(OpError::invalid(format!("{path} is not a directory"))),
    })
}

pub fn delete<N: ProjectNs>(ns: &mut N, gate: &Gate, path: &ProjectPath) -> Result<(), OpError> {
    let how = How { follow: false, write: true, create: false };
    run(ns, gate, path, how, |ns, dir, name, _, node| match node {
        Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
        Node::Dir => Err(OpError::invalid(format!("{path} is a directory: fs.delete removes files only"))),
        _ => match ns.unlink(dir, name).map_err(|r| refused(path, r))? {
            Opened::Done(()) => Ok(()),
            _ => Err(changed(path)),
        },
    })
}

pub fn rename<N: ProjectNs>(
    ns: &mut N,
    gate: &Gate,
    from: &ProjectPath,
    to: &ProjectPath,
) -> Result<(), OpError> {
    let gate = &*gate.for_rename();
    let how = How { follow: false, write: true, create: false };
    run(ns, gate, from, how, |ns, from_dir, from_name, _, node| {
        match node {
            Node::Missing => return Err(OpError::not_found(format!("{from} does not exist"))),
            Node::Dir => {
                return Err(OpError::invalid(format!("{from} is a directory: fs.rename moves files only")))
            }
            _ => {}
        }
        // The destination walked while the source's directory is held.
        let how = How { follow: false, write: true, create: true };
        run(ns, gate, to, how, |ns, to_dir, to_name, _, node| {
            if node != Node::Missing {
                return Err(OpError::exists(format!("{to} already exists")));
            }
            match ns.rename(from_dir, from_name, to_dir, to_name).map_err(|r| refused(from, r))? {
                Opened::Done(true) => Ok(()),
                Opened::Done(false) => Err(OpError::exists(format!("{to} already exists"))),
                _ => Err(changed(from)),
            }
        })
    })
}

/// Searches one file's content for `fs.grep` (already scrubbed,
/// [`Gate::scrubber`]), appending to the result; `false` once a budget is
/// reached.
pub type Search<'a> = dyn FnMut(&ProjectPath, &[u8], &mut GrepResult) -> bool + 'a;

/// `fs.grep`: each given path walked and decided on as `fs.read` would
/// (a given symlink skipped), then its tree searched from the directories
/// held, every name decided on before it is opened.
pub fn grep<N: ProjectNs>(
    ns: &mut N,
    gate: &Gate,
    q: &GrepQuery,
    search: &mut Search,
) -> Result<GrepResult, OpError> {
    let mut out = GrepResult::default();
    for p in &q.paths {
        let how = How { follow: false, write: false, create: false };
        let go_on = run(ns, gate, p, how, |ns, dir, name, resolved, node| match node {
            Node::Symlink(_) => Ok(true),
            Node::Missing => Err(OpError::not_found(format!("{p} does not exist"))),
            node => Ok(grep_tree(ns, gate, q, dir, name, resolved, node, &mut out, search)),
        });
        let go_on = go_on?;
        if !go_on {
            break;
        }
    }
    Ok(out)
}

/// Search `name` in `dir` (at `path`) and, a directory, its tree; files
/// and directories the gate refuses, symlinks, and anything that changed
/// since it was listed are skipped. `false` once a budget is reached.
#[allow(clippy::too_many_arguments)]
fn grep_tree<N: ProjectNs>(
    ns: &mut N,
    gate: &Gate,
    q: &GrepQuery,
    dir: &N::Dir,
    name: &OsStr,
    path: &ProjectPath,
    node: Node,
    out: &mut GrepResult,
    search: &mut Search,
) -> bool {
    match node {
        Node::File { size } => {
            if !q.wants(path) || size > gate.max_file() as u64 || gate.check(path, false, false).is_err() {
                return true;
            }
            match ns.read(dir, name, gate.max_file()) {
                // Searched scrubbed, in every backend: a match must not
                // answer for a secret.
                Ok(Opened::Done(content)) => search(path, &gate.scrubber().bytes(&content), out),
                _ => true,
            }
        }
        Node::Dir => {
            if gate.check(path, false, true).is_err() {
                return true;
            }
            let Ok(Opened::Done(d)) = ns.open_dir(dir, name) else { return true };
            let Ok(mut children) = ns.list(&d) else { return true };
            children.sort_by(|a, b| a.0.cmp(&b.0));
            for (child, node) in children {
                if !grep_tree(ns, gate, q, &d, OsStr::new(&child), &path.join(&child), node, out, search) {
                    return false;
                }
            }
            true
        }
        _ => true,
    }
}

/// Every namespace the walk can drive is a project's files: each
/// operation resolves and acts through this module's one walk.
impl<N: ProjectNs> super::files::ProjectFiles for N {
    fn read(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<u8>, OpError> {
        read(self, gate, path)
    }

    fn write(&mut self, gate: &Gate, path: &ProjectPath, content: &[u8]) -> Result<(), OpError> {
        write(self, gate, path, content)
    }

    fn exists(&mut self, gate: &Gate, path: &ProjectPath) -> Result<bool, OpError> {
        exists(self, gate, path)
    }

    fn metadata(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Metadata, OpError> {
        metadata(self, gate, path)
    }

    fn list_dir(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<DirEntry>, OpError> {
        list_dir(self, gate, path)
    }

    fn delete(&mut self, gate: &Gate, path: &ProjectPath) -> Result<(), OpError> {
        delete(self, gate, path)
    }

    fn rename(&mut self, gate: &Gate, from: &ProjectPath, to: &ProjectPath) -> Result<(), OpError> {
        rename(self, gate, from, to)
    }

    fn grep(&mut self, gate: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError> {
        self.grep_files(gate, q)
    }
}
