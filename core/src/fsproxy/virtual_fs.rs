//! The session's virtual namespace: in-memory files created by relative
//! paths outside every allowed root. They live as long as the machine and
//! never touch the disk.
//!
//! Names map to nodes, as a directory maps names to inodes: a handle holds
//! its node, not its name, so a file removed or renamed while open is read
//! and written through the handle as on a POSIX file system, and a file
//! created later under the old name is another file. A node no name links
//! to lives until its last handle closes ([`VirtualFs::release`]).
//!
//! Directories are implicit: a name with a `/` in it may be created
//! without making its directories first (as the namespace always allowed),
//! and every proper prefix of a name is a directory. `mkdir` adds an
//! explicit one, which a listing shows while it is empty. A name is never
//! both: a file cannot be created where a directory is, nor beneath a file.
//!
//! What the namespace costs is its names and its contents: both count
//! against `max_total` bytes, and the nodes (files, unlinked files still
//! open, explicit directories) against `max_files`, so a flood of empty
//! files or directories with long names is bounded too.

use super::wire::{ErrorCode, Failure, Mode};
use crate::pathops::{DirEntry, FileStat, Kind, Page};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

/// Total bytes (names and contents) the virtual namespace may hold by
/// default.
pub const DEFAULT_MAX_VIRTUAL_BYTES: u64 = 64 << 20;
/// Virtual files the namespace may hold by default.
pub const DEFAULT_MAX_VIRTUAL_FILES: usize = 4096;

/// A virtual name, shared by the maps that hold it.
pub type Name = Arc<str>;

/// A virtual file's node, which handles hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeId(u64);

#[derive(Debug, Default)]
struct Node {
    data: Vec<u8>,
    /// A name links to it.
    linked: bool,
    /// Handles open on it.
    opens: usize,
}

#[derive(Debug, Default)]
pub struct VirtualFs {
    /// Each file's name and node.
    names: BTreeMap<Name, NodeId>,
    /// Explicit directories (`mkdir`).
    dirs: BTreeSet<Name>,
    nodes: BTreeMap<NodeId, Node>,
    next: u64,
    /// Bytes of every name and every content.
    total: u64,
    max_total: u64,
    max_files: usize,
    /// A planted bug: names cost nothing (see `PlantedBug::VirtualNamesFree`).
    names_free: bool,
}

fn exists(name: &str) -> Failure {
    Failure::new(ErrorCode::Arg, format!("{name} already exists"))
}

fn missing(name: &str) -> Failure {
    Failure::new(ErrorCode::NoEnt, format!("no such file or directory: {name}"))
}

/// Every key from `p` on.
fn from(p: &str) -> (Bound<&str>, Bound<&str>) {
    (Bound::Included(p), Bound::Unbounded)
}

/// `name` lies strictly beneath `dir` ("" is the top).
fn beneath(name: &str, dir: &str) -> bool {
    dir.is_empty() || name.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

impl VirtualFs {
    pub fn new(max_total: u64, max_files: usize) -> Self {
        VirtualFs { max_total, max_files, ..VirtualFs::default() }
    }

    #[doc(hidden)]
    pub fn plant_names_free(&mut self) {
        self.names_free = true;
    }

    fn too_big(&self) -> Failure {
        Failure::new(
            ErrorCode::Range,
            format!(
                "virtual files would exceed their limit of {} bytes, names included (--max-virtual-bytes)",
                self.max_total
            ),
        )
    }

    fn name_cost(&self, name: &str) -> u64 {
        if self.names_free {
            0
        } else {
            name.len() as u64
        }
    }

    /// Room for one more node named `name`.
    fn room_for(&self, name: &str) -> Result<u64, Failure> {
        if self.files() >= self.max_files {
            return Err(Failure::new(
                ErrorCode::Range,
                format!("more than {} virtual files (--max-virtual-files)", self.max_files),
            ));
        }
        let cost = self.name_cost(name);
        if self.total + cost > self.max_total {
            return Err(self.too_big());
        }
        Ok(cost)
    }

    /// Whether `name` is a directory: the top, an explicit one, or a
    /// proper prefix of a name.
    pub fn is_dir(&self, name: &str) -> bool {
        if name.is_empty() || self.dirs.contains(name) {
            return true;
        }
        let prefix = format!("{name}/");
        let under = |k: &Name| k.starts_with(&prefix);
        self.names.range::<str, _>(from(&prefix)).next().is_some_and(|(k, _)| under(k))
            || self.dirs.range::<str, _>(from(&prefix)).next().is_some_and(under)
    }

    /// The file on the way to `name` (a proper prefix that is a file), if any.
    fn file_on_the_way<'a>(&self, name: &'a str) -> Option<&'a str> {
        name.match_indices('/').map(|(i, _)| &name[..i]).find(|p| self.names.contains_key(*p))
    }

    /// Open `name` in `mode`: its node, for the handle to hold (release it
    /// with [`VirtualFs::release`] when the handle closes).
    pub fn open(&mut self, name: &str, mode: Mode) -> Result<NodeId, Failure> {
        let id = match self.names.get(name) {
            Some(&id) => id,
            None if mode == Mode::Read => {
                if self.is_dir(name) {
                    return Err(Failure::new(ErrorCode::Perm, "is a directory, not a regular file"));
                }
                return Err(Failure::new(ErrorCode::NoEnt, format!("no such file: {name}")));
            }
            None => {
                if self.is_dir(name) {
                    return Err(Failure::new(ErrorCode::Perm, "is a directory, not a regular file"));
                }
                if let Some(f) = self.file_on_the_way(name) {
                    return Err(Failure::new(ErrorCode::NoEnt, format!("{f}, on the way, is a file")));
                }
                let cost = self.room_for(name)?;
                let id = NodeId(self.next);
                self.next += 1;
                self.nodes.insert(id, Node { linked: true, ..Node::default() });
                self.names.insert(Arc::from(name), id);
                self.total += cost;
                id
            }
        };
        if let Some(node) = self.nodes.get_mut(&id) {
            if mode == Mode::Write {
                self.total -= node.data.len() as u64;
                node.data = Vec::new();
            }
            node.opens += 1;
        }
        Ok(id)
    }

    /// A handle on `id` closed: a node no name links to goes with its last.
    pub fn release(&mut self, id: NodeId) {
        let Some(node) = self.nodes.get_mut(&id) else { return };
        node.opens = node.opens.saturating_sub(1);
        if node.opens == 0 && !node.linked {
            self.total -= node.data.len() as u64;
            self.nodes.remove(&id);
        }
    }

    pub fn read(&self, id: NodeId, pos: &mut u64, max: u32) -> Vec<u8> {
        let Some(node) = self.nodes.get(&id) else { return Vec::new() };
        let data = &node.data;
        let start = usize::try_from(*pos).unwrap_or(usize::MAX).min(data.len());
        let end = start.saturating_add(max as usize).min(data.len());
        // A position past the end (the file was truncated through another
        // handle) stays where it is, as a file offset does: clamping it
        // would make this handle read later writes at the wrong offset.
        if end > start {
            *pos = end as u64;
        }
        data[start..end].to_vec()
    }

    /// Write at `*pos` (or at the end for append), within the size limit.
    pub fn write(&mut self, id: NodeId, pos: &mut u64, append: bool, bytes: &[u8]) -> Result<u64, Failure> {
        let len = self.nodes.get(&id).map_or(0, |n| n.data.len()) as u64;
        let start = if append { len } else { *pos };
        let end = start.saturating_add(bytes.len() as u64);
        let growth = end.saturating_sub(len);
        if self.total.saturating_add(growth) > self.max_total {
            return Err(self.too_big());
        }
        let Some(node) = self.nodes.get_mut(&id) else {
            return Err(Failure::new(ErrorCode::Io, "virtual file is gone"));
        };
        let (start, end) = (start as usize, end as usize);
        if node.data.len() < end {
            node.data.resize(end, 0);
        }
        node.data[start..end].copy_from_slice(bytes);
        self.total += growth;
        *pos = end as u64;
        Ok(bytes.len() as u64)
    }

    /// Contents of the file named `name`.
    pub fn contents(&self, name: &str) -> Option<&[u8]> {
        let id = self.names.get(name)?;
        self.nodes.get(id).map(|n| n.data.as_slice())
    }

    /// Bytes held, names and contents (of unlinked files still open too).
    pub fn bytes(&self) -> u64 {
        self.total
    }

    /// Nodes held: files, unlinked files still open, explicit directories.
    pub fn files(&self) -> usize {
        self.nodes.len() + self.dirs.len()
    }

    /// `stat` of `name` ("" is the top); `dir_beyond`: a root of the
    /// policy lies beneath it, which makes it a directory too.
    pub fn stat(&self, name: &str, dir_beyond: bool) -> Result<FileStat, Failure> {
        if let Some(node) = self.names.get(name).and_then(|id| self.nodes.get(id)) {
            let mut s = FileStat::of(Kind::File, node.data.len() as u64);
            s.mode = 0o644;
            return Ok(s);
        }
        if dir_beyond || self.is_dir(name) {
            let mut s = FileStat::of(Kind::Dir, 0);
            s.mode = 0o755;
            return Ok(s);
        }
        Err(missing(name))
    }

    /// The entries of directory `name` after `after`, at most `max`;
    /// `beyond`: names of directories in it that roots lie beneath.
    pub fn list(
        &self,
        name: &str,
        after: Option<&str>,
        max: usize,
        beyond: &BTreeSet<String>,
    ) -> Result<Page, Failure> {
        if self.names.contains_key(name) {
            return Err(Failure::new(ErrorCode::Arg, format!("{name} is not a directory")));
        }
        if beyond.is_empty() && !self.is_dir(name) {
            return Err(missing(name));
        }
        let prefix = if name.is_empty() { String::new() } else { format!("{name}/") };
        // Each child once, in byte order: a file, or the first name of
        // a deeper one (a directory). Bounded by the namespace's nodes.
        let mut children: BTreeMap<&str, DirEntry> = BTreeMap::new();
        let files = self.names.range::<str, _>(from(&prefix)).take_while(|(k, _)| k.starts_with(&prefix));
        for (k, id) in files {
            let rest = &k[prefix.len()..];
            let entry = match rest.split_once('/') {
                Some((child, _)) => (child, Kind::Dir, 0),
                None => (rest, Kind::File, self.nodes.get(id).map_or(0, |n| n.data.len() as u64)),
            };
            children.entry(entry.0).or_insert(DirEntry {
                name: entry.0.to_owned(),
                kind: entry.1,
                size: entry.2,
            });
        }
        let dirs = self.dirs.range::<str, _>(from(&prefix)).take_while(|k| k.starts_with(&prefix));
        for k in dirs {
            let child = k[prefix.len()..].split('/').next().unwrap_or_default();
            children.entry(child).or_insert(DirEntry { name: child.to_owned(), kind: Kind::Dir, size: 0 });
        }
        for b in beyond {
            children.entry(b).or_insert(DirEntry { name: b.clone(), kind: Kind::Dir, size: 0 });
        }
        let mut page = Page::default();
        for (child, e) in children {
            if after.is_some_and(|a| child <= a) {
                continue;
            }
            if page.entries.len() == max {
                page.more = true;
                break;
            }
            page.entries.push(e);
        }
        Ok(page)
    }

    /// Make directory `name`; with `parents` one already there is no error.
    /// Its parents need not exist (they are implicit).
    pub fn mkdir(&mut self, name: &str, parents: bool, dir_beyond: bool) -> Result<(), Failure> {
        if name.is_empty() || self.names.contains_key(name) {
            return Err(exists(if name.is_empty() { "." } else { name }));
        }
        if dir_beyond || self.is_dir(name) {
            return if parents { Ok(()) } else { Err(exists(name)) };
        }
        if let Some(f) = self.file_on_the_way(name) {
            return Err(Failure::new(ErrorCode::NoEnt, format!("{f}, on the way, is a file")));
        }
        let cost = self.room_for(name)?;
        self.dirs.insert(Arc::from(name));
        self.total += cost;
        Ok(())
    }

    /// Remove file `name`, or directory `name` when it is explicit and
    /// empty. A file open elsewhere stays readable there until closed.
    pub fn remove(&mut self, name: &str, dir_beyond: bool) -> Result<(), Failure> {
        if name.is_empty() {
            return Err(Failure::new(ErrorCode::Perm, "the working directory itself is never removed"));
        }
        if let Some(id) = self.names.remove(name) {
            self.total -= self.name_cost(name);
            self.unlink(id);
            return Ok(());
        }
        let prefix = format!("{name}/");
        let non_empty = dir_beyond
            || self.names.range::<str, _>(from(&prefix)).next().is_some_and(|(k, _)| k.starts_with(&prefix))
            || self.dirs.range::<str, _>(from(&prefix)).next().is_some_and(|k| k.starts_with(&prefix));
        if non_empty {
            return Err(Failure::new(ErrorCode::Arg, format!("{name} is a directory that is not empty")));
        }
        if self.dirs.remove(name) {
            self.total -= self.name_cost(name);
            return Ok(());
        }
        Err(missing(name))
    }

    /// The name no longer links to `id`.
    fn unlink(&mut self, id: NodeId) {
        let Some(node) = self.nodes.get_mut(&id) else { return };
        node.linked = false;
        if node.opens == 0 {
            self.total -= node.data.len() as u64;
            self.nodes.remove(&id);
        }
    }

    /// Move file or directory `from` to `to`, replacing a file there unless
    /// `noreplace` (an empty explicit directory, when `from` is one). A
    /// directory moves with everything beneath it; open handles follow
    /// their files.
    pub fn rename(&mut self, from: &str, to: &str, noreplace: bool) -> Result<(), Failure> {
        if from.is_empty() || to.is_empty() {
            return Err(Failure::new(ErrorCode::Perm, "the working directory itself is never moved"));
        }
        if from == to {
            return if self.names.contains_key(from) || self.is_dir(from) {
                Ok(())
            } else {
                Err(missing(from))
            };
        }
        if let Some(f) = self.file_on_the_way(to) {
            return Err(Failure::new(ErrorCode::NoEnt, format!("{f}, on the way, is a file")));
        }
        if let Some(&id) = self.names.get(from) {
            if self.is_dir(to) {
                return Err(Failure::new(ErrorCode::Arg, format!("{to} is a directory")));
            }
            let old = self.names.get(to).copied();
            if old.is_some() && noreplace {
                return Err(exists(to));
            }
            let grow = self.name_cost(to).saturating_sub(self.name_cost(from));
            if old.is_none() && self.total + grow > self.max_total {
                return Err(self.too_big());
            }
            self.names.remove(from);
            self.total -= self.name_cost(from);
            if let Some(old) = self.names.insert(Arc::from(to), id) {
                self.total -= self.name_cost(to);
                self.unlink(old);
            }
            self.total += self.name_cost(to);
            return Ok(());
        }
        if !self.is_dir(from) {
            return Err(missing(from));
        }
        if beneath(to, from) {
            return Err(Failure::new(ErrorCode::Arg, format!("{to} is inside {from}, which is being moved")));
        }
        if self.names.contains_key(to) {
            return Err(Failure::new(ErrorCode::Arg, format!("{to} is a file, not a directory")));
        }
        if self.is_dir(to) {
            // Replaced only when an empty explicit directory.
            if noreplace || self.remove(to, false).is_err() {
                return Err(exists(to));
            }
        }
        let moved = |k: &str| k == from || beneath(k, from);
        let files: Vec<(Name, NodeId)> =
            self.names.iter().filter(|(k, _)| moved(k)).map(|(k, v)| (k.clone(), *v)).collect();
        let dirs: Vec<Name> = self.dirs.iter().filter(|k| moved(k)).cloned().collect();
        let renamed = |k: &str| format!("{to}{}", &k[from.len()..]);
        let before: u64 =
            files.iter().map(|(k, _)| self.name_cost(k)).chain(dirs.iter().map(|k| self.name_cost(k))).sum();
        let after: u64 = files
            .iter()
            .map(|(k, _)| self.name_cost(&renamed(k)))
            .chain(dirs.iter().map(|k| self.name_cost(&renamed(k))))
            .sum();
        if self.total - before + after > self.max_total {
            return Err(self.too_big());
        }
        for (k, id) in files {
            self.names.remove(&k);
            self.names.insert(Arc::from(renamed(&k)), id);
        }
        for k in dirs {
            self.dirs.remove(&k);
            self.dirs.insert(Arc::from(renamed(&k)));
        }
        self.total = self.total - before + after;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
