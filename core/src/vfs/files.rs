//! The `ProjectFiles` abstraction (RFD D09) the `fs.*` methods run on,
//! and the decision a backend asks the core for on every *resolved* path.
//!
//! A backend (the shell's cap-std one, [`super::memfs::MemFiles`])
//! implements [`ProjectFiles`]. Each method gets the host's [`Gate`] and a
//! [`ProjectPath`] that already passed the lexical check. Before it reads,
//! writes, lists or deletes anything it must resolve the path's symlinks
//! and ask [`Gate::check`] about the path it resolved to: a symlink
//! resolving outside the project, outside every root, to a `.env` file or
//! to a `--deny`ed path is refused there, by the core. Both backends do it
//! with [`super::walk`], the one walk that resolves, decides and acts in
//! the directory it checked, so they resolve identically.
//!
//! Shared semantics (the in-memory backend is the reference the cap-std
//! one is property-tested against):
//! - `read`: regular files only, at most `max_file` bytes (else `-32603`);
//! - `write`: parents created; onto a directory `-32003`; a symlink at the
//!   path is followed and the target checked for writing;
//! - `exists`, `metadata`: of the target; a target the gate refuses is
//!   `-32001`, not "absent";
//! - `list_dir`: entries sorted by name, symlinks as `symlink` (not
//!   followed), entries the gate refuses left out, each `path` the
//!   entry's name, relative to the listed directory (seed 004);
//! - `delete`: a file or a symlink itself, never a directory;
//! - `rename`: a file or a symlink itself (a directory could carry denied
//!   files out from under a deny glob); onto an existing path `-32003`;
//! - `grep`: see [`grep_file`] and [`GrepQuery`].

use super::effect::OpError;
use super::scrub::Scrubber;
use crate::guard::{Act, Class, Guard, Hit};
use crate::scope::Scope;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// A project-relative path with only normal components, UTF-8 (the tool
/// sends JSON strings). Empty: the project root (`.`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProjectPath(String);

impl ProjectPath {
    pub const ROOT: ProjectPath = ProjectPath(String::new());

    /// The lexical check: absolute paths and any `..` are `-32001`; an
    /// empty string or a NUL `-32602`; `.` components are dropped.
    pub fn parse(text: &str) -> Result<ProjectPath, OpError> {
        if text.is_empty() {
            return Err(OpError::invalid("path is empty"));
        }
        if text.contains('\0') {
            return Err(OpError::invalid("path contains a NUL byte"));
        }
        if text.starts_with('/') {
            return Err(OpError::denied(format!("path {text:?} denied: absolute paths are refused")));
        }
        let mut parts: Vec<&str> = Vec::new();
        for seg in text.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    return Err(OpError::denied(format!("path {text:?} denied: '..' is refused")));
                }
                s => parts.push(s),
            }
        }
        Ok(ProjectPath(parts.join("/")))
    }

    /// From normal components (backends building child paths).
    pub fn from_parts<'a>(parts: impl IntoIterator<Item = &'a str>) -> ProjectPath {
        let v: Vec<&str> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        ProjectPath(v.join("/"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `.` for the root, else the path.
    pub fn display_str(&self) -> &str {
        if self.0.is_empty() {
            "."
        } else {
            &self.0
        }
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    pub fn join(&self, name: &str) -> ProjectPath {
        if self.0.is_empty() {
            ProjectPath(name.to_string())
        } else {
            ProjectPath(format!("{}/{}", self.0, name))
        }
    }

    pub fn parent(&self) -> Option<ProjectPath> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(i) => ProjectPath(self.0[..i].to_string()),
            None => ProjectPath::ROOT,
        })
    }

    pub fn file_name(&self) -> Option<&str> {
        self.0.rsplit('/').next().filter(|s| !s.is_empty())
    }

    pub fn to_path(&self) -> PathBuf {
        PathBuf::from(&self.0)
    }
}

impl fmt::Display for ProjectPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.display_str())
    }
}

/// The core's file decisions, handed to backends.
#[derive(Clone, Debug)]
pub struct Gate {
    project: PathBuf,
    /// Roots over `/` + project-relative paths.
    scope: Scope,
    /// Protected paths, secret files and `--deny` globs, decided on the
    /// absolute path (`project` joined with the project path).
    guard: Guard,
    max_file: usize,
    max_grep_lines: usize,
    /// `PlantedBug::ToolLexicalOnly`.
    lexical_only: bool,
    /// Content is scrubbed before a backend searches it (`fs.grep`), so a
    /// match cannot answer questions about a secret.
    scrubber: Scrubber,
    /// `PlantedBug::ToolReopenByPath`.
    reopen_by_path: bool,
    /// `PlantedBug::ToolGuardSkipsRename`.
    guard_skips_rename: bool,
}

impl Gate {
    pub(crate) fn new(project: PathBuf, scope: Scope, guard: Guard, scrubber: Scrubber) -> Self {
        Gate {
            project,
            scope,
            guard,
            max_file: super::DEFAULT_MAX_FILE,
            max_grep_lines: super::DEFAULT_MAX_GREP_LINES,
            lexical_only: false,
            scrubber,
            reopen_by_path: false,
            guard_skips_rename: false,
        }
    }

    pub(crate) fn plant_guard_skips_rename(&mut self) {
        self.guard_skips_rename = true;
    }

    /// The gate `fs.rename` decides with: this one, or, under the planted
    /// bug that skips the guard there, one whose guard lifts every rule.
    pub(crate) fn for_rename(&self) -> std::borrow::Cow<'_, Gate> {
        if self.guard_skips_rename {
            let mut g = self.clone();
            g.guard = Guard::everything();
            std::borrow::Cow::Owned(g)
        } else {
            std::borrow::Cow::Borrowed(self)
        }
    }

    /// The `--env-allow` values' scrubber. A backend searches
    /// [`Scrubber::bytes`] of a file, never its raw content.
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    pub(crate) fn plant_lexical_only(&mut self) {
        self.lexical_only = true;
    }

    pub(crate) fn plant_reopen_by_path(&mut self) {
        self.reopen_by_path = true;
    }

    /// Whether the planted bug that acts on a path reached again from the
    /// root, rather than in the directory checked, is on.
    pub(crate) fn reopen_by_path(&self) -> bool {
        self.reopen_by_path
    }

    pub(crate) fn set_limits(&mut self, max_file: usize, max_grep_lines: usize) {
        self.max_file = max_file;
        self.max_grep_lines = max_grep_lines;
    }

    /// The project root, absolute.
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// Protected paths, secret files and `--deny` globs.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The roots as absolute paths with their access, shallowest first:
    /// what a `process.run` program may reach of the project directly.
    pub fn roots(&self) -> Vec<(PathBuf, crate::policy::Access)> {
        self.scope
            .rules()
            .iter()
            .filter_map(|r| {
                let rel = r.path.strip_prefix("/").unwrap_or(&r.path);
                let abs =
                    if rel.as_os_str().is_empty() { self.project.clone() } else { self.project.join(rel) };
                r.access.map(|a| (abs, a))
            })
            .collect()
    }

    /// Largest file read or written, in bytes.
    pub fn max_file(&self) -> usize {
        self.max_file
    }

    /// Refuses content over `--max-file` for `fs.write` of `path`: one
    /// check, whichever backend then writes it.
    pub fn check_write_size(&self, path: &ProjectPath, len: usize) -> Result<(), OpError> {
        if len > self.max_file {
            return Err(OpError::too_large(&format!("content for {path} ({len} bytes)"), self.max_file));
        }
        Ok(())
    }

    pub fn max_grep_lines(&self) -> usize {
        self.max_grep_lines
    }

    /// May `path` (resolved, or as written) be read (`write` false) or
    /// changed (written, created, removed, renamed)? `is_dir` says whether
    /// it is a directory (deny globs ending in `/` match directories
    /// only). The guard (`--deny`, secret files, protected paths), then
    /// the most specific root decide.
    pub fn check(&self, path: &ProjectPath, write: bool, is_dir: bool) -> Result<(), OpError> {
        match self.refusal(path, write, is_dir) {
            None => Ok(()),
            Some(rule) => Err(OpError::denied(format!("path {path} denied: {}", rule.direct()))),
        }
    }

    /// [`Gate::check`] of `resolved`, the path the tool asked for as
    /// `shown` resolved to (skipped by a planted bug). The refusal names
    /// the rule and `shown`, never `resolved`: where a symlink into a
    /// denied place leads is not the tool's to learn.
    pub fn check_as(
        &self,
        resolved: &ProjectPath,
        shown: &ProjectPath,
        write: bool,
        is_dir: bool,
    ) -> Result<(), OpError> {
        if self.lexical_only {
            return Ok(());
        }
        let Some(rule) = self.refusal(resolved, write, is_dir) else { return Ok(()) };
        let why = if resolved == shown { rule.direct() } else { rule.through_link() };
        Err(OpError::denied(format!("path {shown} denied: {why}")))
    }

    /// Whether the planted bug that skips every check of a resolved path
    /// is on.
    pub(crate) fn lexical_only(&self) -> bool {
        self.lexical_only
    }

    /// The rule that refuses `path` so, if one does.
    fn refusal(&self, path: &ProjectPath, write: bool, is_dir: bool) -> Option<Refused> {
        if !path.is_root() {
            let abs = self.project.join(path.as_str());
            let act = if write { Act::Write } else { Act::Read };
            if let Err(hit) = self.guard.check(&abs, act, is_dir) {
                return Some(Refused::Guard(hit));
            }
        }
        let virt = Path::new("/").join(path.as_str());
        match self.scope.access(&virt) {
            None => Some(Refused::NoRoot),
            Some(crate::policy::Access::ReadOnly) if write => Some(Refused::ReadOnly),
            Some(_) => None,
        }
    }
}

/// The rule a [`Gate`] refuses a path by.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Refused {
    /// A protected path, a secret file or a `--deny` glob.
    Guard(Hit),
    NoRoot,
    ReadOnly,
}

impl Refused {
    /// Worded for the path itself.
    fn direct(&self) -> String {
        match self {
            // The words `.env` files were always refused with.
            Refused::Guard(hit) if hit.rule == crate::guard::Rule::EnvFile => {
                ".env files are never accessible".into()
            }
            Refused::Guard(hit) => match hit.class {
                Class::Secret => format!(
                    "it is a secret file ({}), never served; --allow-secret PATH shares one",
                    hit.rule.describe()
                ),
                Class::Protected => format!(
                    "it is a protected path ({}), read but never changed; --allow-protected PATH lifts it",
                    hit.rule.describe()
                ),
                Class::Denied => "it matches a --deny glob".into(),
            },
            Refused::NoRoot => "it is under no --allow or --allow-rw root".into(),
            Refused::ReadOnly => "it is under a read-only root (--allow)".into(),
        }
    }

    /// Worded for a path a symlink on it leads to, which it does not name.
    fn through_link(&self) -> String {
        match self {
            Refused::Guard(hit) if hit.rule == crate::guard::Rule::EnvFile => {
                "a symlink on it leads to a .env file, never accessible".into()
            }
            Refused::Guard(hit) => match hit.class {
                Class::Secret => {
                    format!("a symlink on it leads to a secret file ({}), never served", hit.rule.describe())
                }
                Class::Protected => format!(
                    "a symlink on it leads to a protected path ({}), never changed",
                    hit.rule.describe()
                ),
                Class::Denied => "a symlink on it leads where a --deny glob matches".into(),
            },
            Refused::NoRoot => "a symlink on it leads under no --allow or --allow-rw root".into(),
            Refused::ReadOnly => "a symlink on it leads under a read-only root (--allow)".into(),
        }
    }
}

/// What a name is, not following it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File {
        size: u64,
    },
    Dir,
    Symlink(PathBuf),
    /// A device, socket, fifo, …
    Other,
    Missing,
}

impl Node {
    /// How `fs.list_dir` shows it.
    pub fn kind(&self) -> EntryKind {
        match self {
            Node::File { .. } => EntryKind::File,
            Node::Dir => EntryKind::Dir,
            Node::Symlink(_) => EntryKind::Symlink,
            Node::Other | Node::Missing => EntryKind::Other,
        }
    }
}

/// The `fs.list_dir` answer for the children of the resolved directory
/// `real` (listed as `shown`), whatever backend read them: an entry is
/// left out when the gate refuses it by the name shown or by its real
/// path, and the rest come sorted. One function, so the backends cannot
/// drift apart on what a listing reveals.
pub fn listing(
    gate: &Gate,
    shown: &ProjectPath,
    real: &ProjectPath,
    children: impl IntoIterator<Item = (String, Node)>,
) -> Vec<DirEntry> {
    let mut out: Vec<DirEntry> = children
        .into_iter()
        .filter_map(|(name, node)| {
            let is_dir = node == Node::Dir;
            let allowed = gate.check(&shown.join(&name), false, is_dir).is_ok()
                && gate.check(&real.join(&name), false, is_dir).is_ok();
            allowed.then(|| DirEntry { path: ProjectPath::from_parts([name.as_str()]), kind: node.kind() })
        })
        .collect();
    out.sort();
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
    }
}

/// `fs.metadata`: of the target, so never `Symlink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    pub kind: EntryKind,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DirEntry {
    pub path: ProjectPath,
    pub kind: EntryKind,
}

/// `fs.grep`, validated: `pattern` compiles (`regex` syntax), `paths`
/// passed the lexical check (default `.`), `extensions` without dots.
///
/// Files are searched in path order (each given path in turn, a
/// directory's files depth-first in name order); symlinks (given or
/// found), files the gate refuses, files over `max_file` and binary files
/// (a NUL byte anywhere) are skipped. A file's content is scrubbed of
/// the secrets whole ([`Gate::scrubber`]) before it is searched or split:
/// a secret spanning lines is one `[REDACTED]`, and the line numbers are
/// those of the scrubbed text `fs.read` returns. Lines are split at `\n` (the `\n`
/// not part of the content, a `\r` before it kept), content converted
/// lossily to UTF-8. A match line's `context` lines before and after are
/// included, overlapping ranges merged, each line once. The search stops
/// once `max_lines` lines (matches and context) or `max_file` bytes of
/// content are collected, with `truncated: true`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepQuery {
    pub pattern: String,
    pub paths: Vec<ProjectPath>,
    pub extensions: Vec<String>,
    pub context: usize,
    pub max_lines: usize,
}

/// Compiled size of a grep pattern at most, so a hostile pattern costs
/// bounded memory and time.
pub const GREP_REGEX_SIZE_LIMIT: usize = 1 << 20;

impl GrepQuery {
    pub fn regex(&self) -> Result<Regex, OpError> {
        regex::RegexBuilder::new(&self.pattern)
            .size_limit(GREP_REGEX_SIZE_LIMIT)
            .dfa_size_limit(GREP_REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| OpError::invalid(format!("pattern is not a valid regex: {e}")))
    }

    pub fn wants(&self, path: &ProjectPath) -> bool {
        if self.extensions.is_empty() {
            return true;
        }
        let name = path.file_name().unwrap_or("");
        match name.rsplit_once('.') {
            Some((stem, ext)) if !stem.is_empty() => self.extensions.iter().any(|e| e == ext),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepLine {
    pub line_number: u64,
    pub content: String,
    pub is_match: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepFile {
    pub path: ProjectPath,
    pub lines: Vec<GrepLine>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepResult {
    pub matches: Vec<GrepFile>,
    pub truncated: bool,
}

impl GrepResult {
    pub fn line_count(&self) -> usize {
        self.matches.iter().map(|f| f.lines.len()).sum()
    }
    pub fn content_bytes(&self) -> usize {
        self.matches.iter().flat_map(|f| &f.lines).map(|l| l.content.len()).sum()
    }
}

/// Search one file's content, appending to `out` within its budgets.
/// Returns `false` once a budget is reached (the search must stop).
pub fn grep_file(
    re: &Regex,
    path: &ProjectPath,
    content: &[u8],
    q: &GrepQuery,
    max_bytes: usize,
    out: &mut GrepResult,
) -> bool {
    if content.contains(&0) {
        return true;
    }
    let mut lines: Vec<&[u8]> = content.split(|&b| b == b'\n').collect();
    if content.ends_with(b"\n") {
        lines.pop();
    }
    let texts: Vec<std::borrow::Cow<str>> = lines.iter().map(|l| String::from_utf8_lossy(l)).collect();
    let mut keep: Vec<Option<bool>> = vec![None; texts.len()];
    for (i, t) in texts.iter().enumerate() {
        if re.is_match(t) {
            let lo = i.saturating_sub(q.context);
            let hi = (i + q.context).min(texts.len().saturating_sub(1));
            for (j, k) in keep.iter_mut().enumerate().take(hi + 1).skip(lo) {
                if j == i {
                    *k = Some(true);
                } else if k.is_none() {
                    *k = Some(false);
                }
            }
        }
    }
    let mut file = GrepFile { path: path.clone(), lines: Vec::new() };
    let mut used_lines = out.line_count();
    let mut used_bytes = out.content_bytes();
    let mut go_on = true;
    for (i, k) in keep.iter().enumerate() {
        let Some(is_match) = *k else { continue };
        let text = &texts[i];
        if used_lines >= q.max_lines || used_bytes + text.len() > max_bytes {
            out.truncated = true;
            go_on = false;
            break;
        }
        used_lines += 1;
        used_bytes += text.len();
        file.lines.push(GrepLine { line_number: i as u64 + 1, content: text.to_string(), is_match });
    }
    if !file.lines.is_empty() {
        out.matches.push(file);
    }
    go_on
}

/// A file system request that passed the lexical check, for a backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    Read {
        path: ProjectPath,
    },
    Write {
        path: ProjectPath,
        #[serde(with = "crate::b64")]
        content: Vec<u8>,
    },
    Exists {
        path: ProjectPath,
    },
    Metadata {
        path: ProjectPath,
    },
    ListDir {
        path: ProjectPath,
    },
    Delete {
        path: ProjectPath,
    },
    Rename {
        from: ProjectPath,
        to: ProjectPath,
    },
    Grep(GrepQuery),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsReply {
    Read(#[serde(with = "crate::b64")] Vec<u8>),
    Done,
    Exists(bool),
    Metadata(Metadata),
    ListDir(Vec<DirEntry>),
    Grep(GrepResult),
}

/// A project's files (RFD D09). Every method resolves symlinks and asks
/// `gate` about the resolved path before touching anything (see the
/// module docs for the semantics both backends share).
pub trait ProjectFiles {
    fn read(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<u8>, OpError>;
    fn write(&mut self, gate: &Gate, path: &ProjectPath, content: &[u8]) -> Result<(), OpError>;
    fn exists(&mut self, gate: &Gate, path: &ProjectPath) -> Result<bool, OpError>;
    fn metadata(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Metadata, OpError>;
    fn list_dir(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<DirEntry>, OpError>;
    fn delete(&mut self, gate: &Gate, path: &ProjectPath) -> Result<(), OpError>;
    fn rename(&mut self, gate: &Gate, from: &ProjectPath, to: &ProjectPath) -> Result<(), OpError>;
    fn grep(&mut self, gate: &Gate, query: &GrepQuery) -> Result<GrepResult, OpError>;
}

impl FsOp {
    /// Run the op on `files`: the one dispatch both shells use.
    pub fn run<F: ProjectFiles + ?Sized>(&self, files: &mut F, gate: &Gate) -> Result<FsReply, OpError> {
        match self {
            FsOp::Read { path } => files.read(gate, path).map(FsReply::Read),
            FsOp::Write { path, content } => files.write(gate, path, content).map(|()| FsReply::Done),
            FsOp::Exists { path } => files.exists(gate, path).map(FsReply::Exists),
            FsOp::Metadata { path } => files.metadata(gate, path).map(FsReply::Metadata),
            FsOp::ListDir { path } => files.list_dir(gate, path).map(FsReply::ListDir),
            FsOp::Delete { path } => files.delete(gate, path).map(|()| FsReply::Done),
            FsOp::Rename { from, to } => files.rename(gate, from, to).map(|()| FsReply::Done),
            FsOp::Grep(q) => files.grep(gate, q).map(FsReply::Grep),
        }
    }

    /// The project paths the op names, with whether it writes them.
    pub fn paths(&self) -> Vec<(&ProjectPath, bool)> {
        match self {
            FsOp::Read { path }
            | FsOp::Exists { path }
            | FsOp::Metadata { path }
            | FsOp::ListDir { path } => {
                vec![(path, false)]
            }
            FsOp::Write { path, .. } | FsOp::Delete { path } => vec![(path, true)],
            FsOp::Rename { from, to } => vec![(from, true), (to, true)],
            FsOp::Grep(q) => q.paths.iter().map(|p| (p, false)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::memfs::{MemFiles, MemNode};
    use crate::vfs::{PolicyConfig, ToolPolicy};
    use proptest::prelude::*;

    fn gate() -> Gate {
        let cfg = PolicyConfig {
            project: "/p".into(),
            allow: vec![".".into()],
            allow_rw: vec!["w".into()],
            deny: vec!["d/".into(), "*.key".into()],
            ..PolicyConfig::default()
        };
        ToolPolicy::new(&cfg).unwrap().gate().clone()
    }

    const NAMES: &[&str] = &["a", "b", "w", "d", "x.key", ".env", ".env.x"];
    const TARGETS: &[&str] =
        &["a", "../a", "../../a", "/p/a", "/p/d", "/etc", "b/c", ".", "..", "/p/../p/a", "w", ".env"];

    fn arb_path() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("a"),
                Just("b"),
                Just("w"),
                Just("d"),
                Just("x.key"),
                Just(".env"),
                Just(".."),
                Just("."),
                Just("")
            ],
            0..4,
        )
        .prop_map(|v| v.join("/"))
    }

    proptest! {
        /// The lexical check never lets an escape through.
        #[test]
        fn parsed_paths_are_relative_and_normal(text in arb_path(), abs in any::<bool>()) {
            let text = if abs { format!("/{text}") } else { text };
            if let Ok(p) = ProjectPath::parse(&text) {
                prop_assert!(!p.as_str().starts_with('/'));
                prop_assert!(p.parts().all(|c| c != ".." && c != "." && !c.is_empty()));
            }
        }

        /// Whatever the links, a resolution that succeeds ends on a path
        /// the gate allows in the mode asked, made of real directories.
        #[test]
        fn resolution_ends_inside_the_policy(
            links in proptest::collection::vec((0..NAMES.len(), 0..NAMES.len(), 0..TARGETS.len()), 0..8),
            path in arb_path(),
            write in any::<bool>(),
            follow in any::<bool>(),
        ) {
            let g = gate();
            let mut f = MemFiles::new();
            for n in ["a", "b/c", "w/f", "d/s", "x.key", ".env"] {
                f.put(n, MemNode::File(b"x".to_vec()));
            }
            for (dir, name, t) in links {
                f.put(&format!("{}/{}", NAMES[dir], NAMES[name]), MemNode::Symlink(TARGETS[t].into()));
            }
            let Ok(p) = ProjectPath::parse(&path) else { return Ok(()) };
            if let Ok((r, node)) = crate::vfs::walk::resolve(&mut f, &g, &p, follow, write) {
                // A link not followed is decided on only when changed.
                let link = matches!(node, Node::Symlink(_)) && !write;
                if node != Node::Missing && !link {
                    prop_assert!(g.check(&r, write, node == Node::Dir).is_ok(), "{} -> {}", p, r);
                }
                // A missing path is reported as asked for, not resolved.
                if let Some(parent) = r.parent().filter(|_| node != Node::Missing) {
                    let mut dir = ProjectPath::ROOT;
                    for part in parent.parts() {
                        dir = dir.join(part);
                        let n = f.nodes().get(&dir);
                        prop_assert!(matches!(n, Some(MemNode::Dir) | None), "{dir} is {n:?}");
                    }
                }
            }
        }
    }
}
