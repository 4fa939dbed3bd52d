//! The real [`ProjectFiles`]: the project directory opened once with
//! cap-std, every operation relative to that handle, so no path (a `..`,
//! an absolute symlink, a link swapped in by the tool mid-walk) can reach
//! outside it. Policy is the core's: each method resolves symlinks with
//! [`files::resolve`] over this directory and acts only on the resolved
//! path the core's [`Gate`] allowed, never following a symlink at its last
//! component (`O_NOFOLLOW`), and opening files non-blocking so a FIFO
//! planted in the project cannot hang the host.
//!
//! Semantics match the core's in-memory backend (property-tested in
//! `tests/tool_backends.rs`). `fs.grep` walks with cap-std (depth-first,
//! names in byte order) and searches each file with grep-searcher.

use airlock_core::vfs::files::{self, Lookup, Node};
use airlock_core::vfs::{
    DirEntry, EntryKind, Gate, GrepFile, GrepLine, GrepQuery, GrepResult, Metadata, OpError, ProjectFiles,
    ProjectPath,
};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

pub struct CapFiles {
    root: Dir,
}

impl CapFiles {
    /// Open `project` (absolute) as the root every operation stays under.
    pub fn open(project: &Path) -> io::Result<Self> {
        Ok(CapFiles { root: Dir::open_ambient_dir(project, cap_std::ambient_authority())? })
    }

    /// Another handle on the same directory (for a blocking task).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(CapFiles { root: self.root.try_clone()? })
    }
}

/// `.` for the root: cap-std wants a relative path, never an empty one.
fn rel(p: &ProjectPath) -> PathBuf {
    if p.is_root() {
        PathBuf::from(".")
    } else {
        p.to_path()
    }
}

fn io_err(what: &ProjectPath, e: io::Error) -> OpError {
    match e.kind() {
        io::ErrorKind::NotFound => OpError::not_found(format!("{what} does not exist")),
        io::ErrorKind::AlreadyExists => OpError::exists(format!("{what} already exists")),
        // cap-std refuses a path leading out of the root this way.
        io::ErrorKind::PermissionDenied => OpError::denied(format!("path {what} denied: {e}")),
        _ => OpError::io(format!("{what}: {e}")),
    }
}

fn node_of(root: &Dir, p: &ProjectPath) -> Result<Node, OpError> {
    match root.symlink_metadata(rel(p)) {
        Ok(m) => {
            let ft = m.file_type();
            Ok(if ft.is_symlink() {
                let target = root.read_link_contents(rel(p)).map_err(|e| io_err(p, e))?;
                Node::Symlink(target)
            } else if ft.is_dir() {
                Node::Dir
            } else if ft.is_file() {
                Node::File { size: m.len() }
            } else {
                Node::Other
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Node::Missing),
        // A file where a directory was expected on the way.
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(Node::Missing),
        Err(e) => Err(io_err(p, e)),
    }
}

impl Lookup for CapFiles {
    fn lookup(&mut self, path: &ProjectPath) -> Result<Node, OpError> {
        node_of(&self.root, path)
    }
}

impl CapFiles {
    /// A regular file's content, at most `max` bytes, opened without
    /// following a last-component symlink and without blocking on a FIFO.
    fn read_regular(&self, p: &ProjectPath, shown: &ProjectPath, max: usize) -> Result<Vec<u8>, OpError> {
        let mut opts = OpenOptions::new();
        opts.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let mut f = self.root.open_with(rel(p), &opts).map_err(|e| io_err(shown, e))?;
        let meta = f.metadata().map_err(|e| io_err(shown, e))?;
        if meta.is_dir() {
            return Err(OpError::invalid(format!("{shown} is a directory")));
        }
        if !meta.is_file() {
            return Err(OpError::invalid(format!("{shown} is not a regular file")));
        }
        if meta.len() > max as u64 {
            return Err(OpError::too_large(&format!("file {shown} ({} bytes)", meta.len()), max));
        }
        let mut buf = Vec::with_capacity(meta.len() as usize);
        // The file may grow while read: never past the limit.
        (&mut f).take(max as u64 + 1).read_to_end(&mut buf).map_err(|e| io_err(shown, e))?;
        if buf.len() > max {
            return Err(OpError::too_large(&format!("file {shown}"), max));
        }
        Ok(buf)
    }

    fn create_parents(&self, p: &ProjectPath) -> Result<(), OpError> {
        let Some(parent) = p.parent() else { return Ok(()) };
        if parent.is_root() {
            return Ok(());
        }
        let mut dir = ProjectPath::ROOT;
        for part in parent.parts() {
            dir = dir.join(part);
            match node_of(&self.root, &dir)? {
                Node::Dir => {}
                Node::Missing => match self.root.create_dir(rel(&dir)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err(&dir, e)),
                },
                _ => return Err(OpError::exists(format!("{dir} exists and is not a directory"))),
            }
        }
        Ok(())
    }

    fn grep_walk(
        &self,
        gate: &Gate,
        q: &GrepQuery,
        matcher: &grep_regex::RegexMatcher,
        path: &ProjectPath,
        out: &mut GrepResult,
    ) -> Result<bool, OpError> {
        match node_of(&self.root, path)? {
            Node::File { size } => {
                if !q.wants(path) || size > gate.max_file() as u64 || gate.check(path, false, false).is_err()
                {
                    return Ok(true);
                }
                let content = match self.read_regular(path, path, gate.max_file()) {
                    Ok(c) => c,
                    // Gone or swapped since the walk saw it: skipped like a link.
                    Err(_) => return Ok(true),
                };
                // Searched scrubbed: a match must not answer for a secret.
                Ok(grep_content(matcher, path, &gate.scrubber().bytes(&content), q, gate.max_file(), out))
            }
            Node::Dir => {
                if gate.check(path, false, true).is_err() {
                    return Ok(true);
                }
                let mut names: Vec<String> = match self.root.read_dir(rel(path)) {
                    Ok(rd) => rd.flatten().filter_map(|e| e.file_name().into_string().ok()).collect(),
                    Err(_) => return Ok(true),
                };
                names.sort();
                for name in names {
                    if !self.grep_walk(gate, q, matcher, &path.join(&name), out)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            _ => Ok(true),
        }
    }
}

/// Collects one file's lines within the search's budgets.
struct Collect<'a> {
    file: GrepFile,
    used_lines: usize,
    used_bytes: usize,
    q: &'a GrepQuery,
    max_bytes: usize,
    stopped: bool,
    truncated: bool,
}

impl Collect<'_> {
    fn push(&mut self, number: Option<u64>, bytes: &[u8], is_match: bool) -> bool {
        let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let text = String::from_utf8_lossy(line).into_owned();
        if self.used_lines >= self.q.max_lines || self.used_bytes + text.len() > self.max_bytes {
            self.truncated = true;
            self.stopped = true;
            return false;
        }
        self.used_lines += 1;
        self.used_bytes += text.len();
        self.file.lines.push(GrepLine { line_number: number.unwrap_or(0), content: text, is_match });
        true
    }
}

impl Sink for Collect<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        Ok(self.push(mat.line_number(), mat.bytes(), true))
    }

    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, io::Error> {
        Ok(self.push(ctx.line_number(), ctx.bytes(), false))
    }
}

/// Search one file's content; `false` once a budget is reached.
fn grep_content(
    matcher: &grep_regex::RegexMatcher,
    path: &ProjectPath,
    content: &[u8],
    q: &GrepQuery,
    max_bytes: usize,
    out: &mut GrepResult,
) -> bool {
    // Binary: a NUL anywhere, decided on the whole file before any line.
    if content.contains(&0) {
        return true;
    }
    let mut sink = Collect {
        file: GrepFile { path: path.clone(), lines: Vec::new() },
        used_lines: out.line_count(),
        used_bytes: out.content_bytes(),
        q,
        max_bytes,
        stopped: false,
        truncated: false,
    };
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .before_context(q.context)
        .after_context(q.context)
        .binary_detection(BinaryDetection::none())
        .build();
    // A slice search cannot fail on I/O; a sink error is impossible too.
    let _ = searcher.search_slice(matcher, content, &mut sink);
    if sink.truncated {
        out.truncated = true;
    }
    let stopped = sink.stopped;
    if !sink.file.lines.is_empty() {
        out.matches.push(sink.file);
    }
    !stopped
}

fn matcher(q: &GrepQuery) -> Result<grep_regex::RegexMatcher, OpError> {
    // The core's compile decides validity (and bounds its size) first.
    q.regex()?;
    grep_regex::RegexMatcherBuilder::new()
        .line_terminator(Some(b'\n'))
        .size_limit(airlock_core::vfs::files::GREP_REGEX_SIZE_LIMIT)
        .dfa_size_limit(airlock_core::vfs::files::GREP_REGEX_SIZE_LIMIT)
        .build(&q.pattern)
        .map_err(|e| OpError::invalid(format!("pattern is not a valid regex: {e}")))
}

impl ProjectFiles for CapFiles {
    fn read(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<u8>, OpError> {
        let r = files::resolve(self, gate, path, true, false)?;
        match r.node {
            Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
            Node::Dir => Err(OpError::invalid(format!("{path} is a directory"))),
            Node::File { size } if size > gate.max_file() as u64 => {
                Err(OpError::too_large(&format!("file {path} ({size} bytes)"), gate.max_file()))
            }
            Node::File { .. } => self.read_regular(&r.path, path, gate.max_file()),
            _ => Err(OpError::invalid(format!("{path} is not a regular file"))),
        }
    }

    fn write(&mut self, gate: &Gate, path: &ProjectPath, content: &[u8]) -> Result<(), OpError> {
        gate.check_write_size(path, content.len())?;
        let r = files::resolve(self, gate, path, true, true)?;
        match r.node {
            Node::Dir => return Err(OpError::exists(format!("{path} is a directory"))),
            Node::Other => return Err(OpError::invalid(format!("{path} is not a regular file"))),
            _ => {}
        }
        if r.path.is_root() {
            return Err(OpError::exists("the project root is a directory"));
        }
        self.create_parents(&r.path)?;
        let mut opts = OpenOptions::new();
        opts.write(true).create(true).truncate(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let mut f = self.root.open_with(rel(&r.path), &opts).map_err(|e| io_err(path, e))?;
        f.write_all(content).map_err(|e| io_err(path, e))?;
        Ok(())
    }

    fn exists(&mut self, gate: &Gate, path: &ProjectPath) -> Result<bool, OpError> {
        let r = files::resolve(self, gate, path, true, false)?;
        Ok(r.node != Node::Missing)
    }

    fn metadata(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Metadata, OpError> {
        let r = files::resolve(self, gate, path, true, false)?;
        match r.node {
            Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
            Node::File { size } => Ok(Metadata { kind: EntryKind::File, size }),
            Node::Dir => Ok(Metadata { kind: EntryKind::Dir, size: 0 }),
            _ => Ok(Metadata { kind: EntryKind::Other, size: 0 }),
        }
    }

    fn list_dir(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<DirEntry>, OpError> {
        let r = files::resolve(self, gate, path, true, false)?;
        match r.node {
            Node::Dir => {}
            Node::Missing => return Err(OpError::not_found(format!("{path} does not exist"))),
            _ => return Err(OpError::invalid(format!("{path} is not a directory"))),
        }
        let rd = self.root.read_dir(rel(&r.path)).map_err(|e| io_err(path, e))?;
        let mut children = Vec::new();
        for entry in rd.flatten() {
            // Names the protocol cannot carry (not UTF-8) are left out.
            let Ok(name) = entry.file_name().into_string() else { continue };
            let Ok(ft) = entry.file_type() else { continue };
            let node = if ft.is_symlink() {
                Node::Symlink(PathBuf::new())
            } else if ft.is_dir() {
                Node::Dir
            } else if ft.is_file() {
                Node::File { size: 0 }
            } else {
                Node::Other
            };
            children.push((name, node));
        }
        Ok(files::listing(gate, path, &r.path, children))
    }

    fn delete(&mut self, gate: &Gate, path: &ProjectPath) -> Result<(), OpError> {
        let r = files::resolve(self, gate, path, false, true)?;
        match r.node {
            Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
            Node::Dir => {
                Err(OpError::invalid(format!("{path} is a directory: fs.delete removes files only")))
            }
            _ => self.root.remove_file(rel(&r.path)).map_err(|e| io_err(path, e)),
        }
    }

    fn rename(&mut self, gate: &Gate, from: &ProjectPath, to: &ProjectPath) -> Result<(), OpError> {
        let f = files::resolve(self, gate, from, false, true)?;
        match f.node {
            Node::Missing => return Err(OpError::not_found(format!("{from} does not exist"))),
            Node::Dir => {
                return Err(OpError::invalid(format!("{from} is a directory: fs.rename moves files only")))
            }
            _ => {}
        }
        let t = files::resolve(self, gate, to, false, true)?;
        if t.node != Node::Missing {
            return Err(OpError::exists(format!("{to} already exists")));
        }
        if t.path.is_root() {
            return Err(OpError::exists("the project root exists"));
        }
        self.create_parents(&t.path)?;
        self.root.rename(rel(&f.path), &self.root, rel(&t.path)).map_err(|e| io_err(from, e))
    }

    fn grep(&mut self, gate: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError> {
        let matcher = matcher(q)?;
        let mut out = GrepResult::default();
        for p in &q.paths {
            // A given symlink is skipped like any link met on the way.
            // (A path through a symlinked directory is not a link itself:
            // the walk below resolves it.)
            if let Ok(Node::Symlink(_)) = node_of(&self.root, p) {
                continue;
            }
            let r = files::resolve(self, gate, p, false, false)?;
            if r.node == Node::Missing {
                return Err(OpError::not_found(format!("{p} does not exist")));
            }
            if !self.grep_walk(gate, q, &matcher, &r.path, &mut out)? {
                break;
            }
        }
        Ok(out)
    }
}
