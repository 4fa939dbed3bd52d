//! The real [`ProjectFiles`]: the project directory opened once, every
//! operation the core's one walk ([`walk`]) from that descriptor: each
//! component looked up with `openat(O_PATH|O_NOFOLLOW)` in the directory
//! already reached (the FS proxy's lookup, [`crate::hostfs`]), the last
//! name decided on by the core's gate and then opened, listed, created,
//! removed or renamed relative to the descriptor of its checked directory,
//! never following a symlink there (`O_NOFOLLOW`, `unlinkat`,
//! `renameat2(RENAME_NOREPLACE)`), files opened non-blocking so a FIFO
//! planted in the project cannot hang the host. A tool swapping a
//! directory for a symlink between the decision and the effect meets a
//! descriptor that no longer has that name, or a symlink the open refuses:
//! the request fails, and nothing outside the policy is touched.
//!
//! Semantics match the core's in-memory backend (property-tested in
//! `tests/tool_backends.rs`). `fs.grep` searches each file with
//! grep-searcher.

use airlock_core::resolve::{Entry, Namespace, Refusal};
use airlock_core::vfs::files::Node;
use airlock_core::vfs::walk::{self, Opened, ProjectNs};
use airlock_core::vfs::{Gate, GrepFile, GrepLine, GrepQuery, GrepResult, OpError, ProjectPath};
use cap_std::fs::Dir;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use rustix::fs::{AtFlags, FileType, OFlags, RenameFlags};
use rustix::io::Errno;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::hostfs::{errno_refusal, lookup_at};

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

const NO_MODE: rustix::fs::Mode = rustix::fs::Mode::empty();
/// Every file open: never through a symlink, never blocking (a FIFO),
/// never a controlling terminal.
const FILE_FLAGS: OFlags =
    OFlags::NOFOLLOW.union(OFlags::NONBLOCK).union(OFlags::NOCTTY).union(OFlags::CLOEXEC);

fn target_of(fd: &OwnedFd) -> Result<PathBuf, Refusal> {
    let target = rustix::fs::readlinkat(fd, "", Vec::new()).map_err(errno_refusal)?;
    Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
}

fn node_of_stat(stat: &rustix::fs::Stat) -> Node {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Node::Dir,
        FileType::RegularFile => Node::File { size: stat.st_size as u64 },
        FileType::Symlink => Node::Symlink(PathBuf::new()),
        _ => Node::Other,
    }
}

impl Namespace for CapFiles {
    type Dir = OwnedFd;

    fn anchor(&mut self, index: usize) -> Result<OwnedFd, Refusal> {
        if index != 0 {
            return Err(Refusal::Fs("unknown anchor".into()));
        }
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::openat(self.root.as_fd(), ".", flags, NO_MODE).map_err(errno_refusal)
    }

    fn lookup(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Entry<OwnedFd>, Refusal> {
        lookup_at(dir, name)
    }
}

impl ProjectNs for CapFiles {
    fn stat(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Node, Refusal> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, NO_MODE) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(Node::Missing),
            Err(e) => return Err(errno_refusal(e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(errno_refusal)?;
        Ok(match node_of_stat(&stat) {
            Node::Symlink(_) => Node::Symlink(target_of(&fd)?),
            node => node,
        })
    }

    fn read(&mut self, dir: &OwnedFd, name: &OsStr, max: usize) -> Result<Opened<Vec<u8>>, Refusal> {
        let fd = match rustix::fs::openat(dir, name, OFlags::RDONLY | FILE_FLAGS, NO_MODE) {
            Ok(fd) => fd,
            Err(Errno::LOOP) => return Ok(Opened::Changed),
            Err(e) => return Err(errno_refusal(e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(errno_refusal)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Ok(Opened::Changed);
        }
        if stat.st_size as u64 > max as u64 {
            return Ok(Opened::TooLarge(stat.st_size as u64));
        }
        let mut buf = Vec::with_capacity(stat.st_size as usize);
        // The file may grow while read: never past the limit.
        File::from(fd).take(max as u64 + 1).read_to_end(&mut buf).map_err(|e| Refusal::Fs(e.to_string()))?;
        if buf.len() > max {
            return Ok(Opened::TooLarge(buf.len() as u64));
        }
        Ok(Opened::Done(buf))
    }

    fn write(&mut self, dir: &OwnedFd, name: &OsStr, content: &[u8]) -> Result<Opened<()>, Refusal> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | FILE_FLAGS;
        let fd = match rustix::fs::openat(dir, name, flags, rustix::fs::Mode::from_raw_mode(0o666)) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::ISDIR | Errno::NXIO) => return Ok(Opened::Changed),
            Err(e) => return Err(errno_refusal(e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(errno_refusal)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Ok(Opened::Changed);
        }
        File::from(fd).write_all(content).map_err(|e| Refusal::Fs(e.to_string()))?;
        Ok(Opened::Done(()))
    }

    fn open_dir(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Opened<OwnedFd>, Refusal> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, name, flags, NO_MODE) {
            Ok(fd) => Ok(Opened::Done(fd)),
            Err(Errno::LOOP | Errno::NOTDIR) => Ok(Opened::Changed),
            Err(e) => Err(errno_refusal(e)),
        }
    }

    fn list(&mut self, dir: &OwnedFd) -> Result<Vec<(String, Node)>, Refusal> {
        let entries = rustix::fs::Dir::read_from(dir).map_err(errno_refusal)?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(errno_refusal)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            // Names the protocol cannot carry (not UTF-8) are left out.
            let Ok(text) = std::str::from_utf8(name) else { continue };
            let node = match entry.file_type() {
                FileType::Directory => Node::Dir,
                FileType::RegularFile => Node::File { size: 0 },
                FileType::Symlink => Node::Symlink(PathBuf::new()),
                FileType::Unknown => {
                    match rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => node_of_stat(&st),
                        Err(_) => continue,
                    }
                }
                _ => Node::Other,
            };
            out.push((text.to_string(), node));
        }
        Ok(out)
    }

    fn mkdir(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<(), Refusal> {
        match rustix::fs::mkdirat(dir, name, rustix::fs::Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(errno_refusal(e)),
        }
    }

    fn unlink(&mut self, dir: &OwnedFd, name: &OsStr) -> Result<Opened<()>, Refusal> {
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) => Ok(Opened::Done(())),
            Err(Errno::ISDIR) => Ok(Opened::Changed),
            Err(e) => Err(errno_refusal(e)),
        }
    }

    fn rename(
        &mut self,
        from_dir: &OwnedFd,
        from: &OsStr,
        to_dir: &OwnedFd,
        to: &OsStr,
    ) -> Result<Opened<bool>, Refusal> {
        match rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
            Ok(()) => Ok(Opened::Done(true)),
            Err(Errno::EXIST) => Ok(Opened::Done(false)),
            Err(e) => Err(errno_refusal(e)),
        }
    }

    /// ripgrep's searcher over each file's scrubbed content, within the
    /// walk that checked it.
    fn grep_files(&mut self, gate: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError> {
        let matcher = matcher(q)?;
        let max = gate.max_file();
        walk::grep(self, gate, q, &mut |path, content, out| {
            grep_content(&matcher, path, content, q, max, out)
        })
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
