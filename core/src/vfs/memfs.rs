//! An in-memory [`ProjectFiles`]: the reference backend. The simulator
//! runs tools against it, and the cap-std backend is property-tested to
//! agree with it.

use super::files::{Node, ProjectPath};
use super::walk::{Opened, ProjectNs};
use crate::resolve::{Entry, Namespace, Refusal};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemNode {
    File(Vec<u8>),
    Dir,
    Symlink(PathBuf),
    Other,
}

/// Paths (project-relative) to nodes; the root always exists, a
/// directory. A node's parent is always a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemFiles {
    nodes: BTreeMap<ProjectPath, MemNode>,
}

impl Default for MemFiles {
    fn default() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(ProjectPath::ROOT, MemNode::Dir);
        MemFiles { nodes }
    }
}

impl MemFiles {
    pub fn new() -> Self {
        Self::default()
    }

    /// Set `path` (with its parents created as directories), replacing
    /// whatever was there (a directory with its contents): test set-up and
    /// the simulator's adversary, not subject to any policy.
    pub fn put(&mut self, path: &str, node: MemNode) {
        let Ok(p) = ProjectPath::parse(path) else { return };
        let mut dir = ProjectPath::ROOT;
        for part in p.parent().iter().flat_map(|d| d.parts().map(str::to_string).collect::<Vec<_>>()) {
            dir = dir.join(&part);
            match self.nodes.get(&dir) {
                Some(MemNode::Dir) => {}
                _ => {
                    self.remove_tree(&dir);
                    self.nodes.insert(dir.clone(), MemNode::Dir);
                }
            }
        }
        self.remove_tree(&p);
        if !p.is_root() {
            self.nodes.insert(p, node);
        }
    }

    /// Move `from` (with everything under it) to `to`, which must not
    /// exist: the simulator's adversary, as a `rename(2)` by a process
    /// outside the host. `false` when it cannot be done.
    pub fn move_tree(&mut self, from: &ProjectPath, to: &ProjectPath) -> bool {
        let parent_ok = to.parent().is_some_and(|p| self.nodes.get(&p) == Some(&MemNode::Dir));
        if from.is_root() || self.nodes.contains_key(to) || !self.nodes.contains_key(from) || !parent_ok {
            return false;
        }
        let prefix = format!("{}/", from.as_str());
        if to.as_str().starts_with(&prefix) {
            return false;
        }
        let moved: Vec<ProjectPath> =
            self.nodes.keys().filter(|k| *k == from || k.as_str().starts_with(&prefix)).cloned().collect();
        for k in moved {
            if let Some(node) = self.nodes.remove(&k) {
                let rest = &k.as_str()[from.as_str().len()..];
                self.nodes.insert(ProjectPath::from_parts([to.as_str(), rest.trim_start_matches('/')]), node);
            }
        }
        true
    }

    pub fn get(&self, path: &str) -> Option<&MemNode> {
        ProjectPath::parse(path).ok().and_then(|p| self.nodes.get(&p))
    }

    pub fn nodes(&self) -> &BTreeMap<ProjectPath, MemNode> {
        &self.nodes
    }

    /// Bytes of file content held.
    pub fn content_bytes(&self) -> usize {
        self.nodes.values().map(|n| if let MemNode::File(b) = n { b.len() } else { 0 }).sum()
    }

    fn remove_tree(&mut self, p: &ProjectPath) {
        if p.is_root() {
            return;
        }
        let prefix = format!("{}/", p.as_str());
        let doomed: Vec<ProjectPath> = self
            .nodes
            .range(p.clone()..)
            .take_while(|(k, _)| *k == p || k.as_str().starts_with(&prefix) || k.as_str() < prefix.as_str())
            .filter(|(k, _)| *k == p || k.as_str().starts_with(&prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for d in doomed {
            self.nodes.remove(&d);
        }
    }

    fn children(&self, dir: &ProjectPath) -> Vec<(String, &MemNode)> {
        self.nodes
            .iter()
            .filter(|(k, _)| !k.is_root() && k.parent().as_ref() == Some(dir))
            .map(|(k, v)| (k.file_name().unwrap_or("").to_string(), v))
            .collect()
    }

    /// `name` in `dir` (`.`: `dir`), if a name a project path can hold.
    fn at(dir: &ProjectPath, name: &OsStr) -> Option<ProjectPath> {
        match name.to_str()? {
            "." => Some(dir.clone()),
            n => Some(dir.join(n)),
        }
    }

    fn node(&self, p: &ProjectPath) -> Node {
        match self.nodes.get(p) {
            None => Node::Missing,
            Some(MemNode::File(b)) => Node::File { size: b.len() as u64 },
            Some(MemNode::Dir) => Node::Dir,
            Some(MemNode::Symlink(t)) => Node::Symlink(t.clone()),
            Some(MemNode::Other) => Node::Other,
        }
    }
}

/// A directory handle is its path: nothing changes the tree while an
/// operation runs, so a path names the directory it was checked as.
impl Namespace for MemFiles {
    type Dir = ProjectPath;

    fn anchor(&mut self, index: usize) -> Result<ProjectPath, Refusal> {
        match index {
            0 => Ok(ProjectPath::ROOT),
            _ => Err(Refusal::Fs("unknown anchor".into())),
        }
    }

    fn lookup(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Entry<ProjectPath>, Refusal> {
        let Some(p) = Self::at(dir, name) else { return Ok(Entry::Missing) };
        Ok(match self.nodes.get(&p) {
            None => Entry::Missing,
            Some(MemNode::Dir) => Entry::Dir(p),
            Some(MemNode::Symlink(t)) => Entry::Symlink(t.clone()),
            Some(MemNode::File(_) | MemNode::Other) => Entry::NotDir,
        })
    }
}

impl ProjectNs for MemFiles {
    fn stat(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Node, Refusal> {
        Ok(Self::at(dir, name).map_or(Node::Missing, |p| self.node(&p)))
    }

    fn read(&mut self, dir: &ProjectPath, name: &OsStr, max: usize) -> Result<Opened<Vec<u8>>, Refusal> {
        let p = Self::at(dir, name).ok_or(Refusal::NotFound)?;
        Ok(match self.nodes.get(&p) {
            Some(MemNode::File(b)) if b.len() > max => Opened::TooLarge(b.len() as u64),
            Some(MemNode::File(b)) => Opened::Done(b.clone()),
            None => return Err(Refusal::NotFound),
            Some(_) => Opened::Changed,
        })
    }

    fn write(&mut self, dir: &ProjectPath, name: &OsStr, content: &[u8]) -> Result<Opened<()>, Refusal> {
        let p = Self::at(dir, name).ok_or_else(|| Refusal::Denied("name is not UTF-8".into()))?;
        match self.nodes.get(&p) {
            None | Some(MemNode::File(_)) => {
                self.nodes.insert(p, MemNode::File(content.to_vec()));
                Ok(Opened::Done(()))
            }
            _ => Ok(Opened::Changed),
        }
    }

    fn open_dir(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Opened<ProjectPath>, Refusal> {
        let p = Self::at(dir, name).ok_or(Refusal::NotFound)?;
        Ok(match self.nodes.get(&p) {
            Some(MemNode::Dir) => Opened::Done(p),
            None => return Err(Refusal::NotFound),
            Some(_) => Opened::Changed,
        })
    }

    fn list(&mut self, dir: &ProjectPath) -> Result<Vec<(String, Node)>, Refusal> {
        let names: Vec<String> = self.children(dir).into_iter().map(|(n, _)| n).collect();
        Ok(names.into_iter().map(|n| (n.clone(), self.node(&dir.join(&n)))).collect())
    }

    fn mkdir(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<(), Refusal> {
        let p = Self::at(dir, name).ok_or_else(|| Refusal::Denied("name is not UTF-8".into()))?;
        self.nodes.entry(p).or_insert(MemNode::Dir);
        Ok(())
    }

    fn unlink(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Opened<()>, Refusal> {
        let p = Self::at(dir, name).ok_or(Refusal::NotFound)?;
        match self.nodes.get(&p) {
            None => Err(Refusal::NotFound),
            Some(MemNode::Dir) => Ok(Opened::Changed),
            Some(_) => {
                self.nodes.remove(&p);
                Ok(Opened::Done(()))
            }
        }
    }

    fn rename(
        &mut self,
        from_dir: &ProjectPath,
        from: &OsStr,
        to_dir: &ProjectPath,
        to: &OsStr,
    ) -> Result<Opened<bool>, Refusal> {
        let f = Self::at(from_dir, from).ok_or(Refusal::NotFound)?;
        let t = Self::at(to_dir, to).ok_or_else(|| Refusal::Denied("name is not UTF-8".into()))?;
        if self.nodes.contains_key(&t) {
            return Ok(Opened::Done(false));
        }
        match self.nodes.get(&f) {
            None => Err(Refusal::NotFound),
            Some(MemNode::Dir) => Ok(Opened::Changed),
            Some(_) => {
                if let Some(node) = self.nodes.remove(&f) {
                    self.nodes.insert(t, node);
                }
                Ok(Opened::Done(true))
            }
        }
    }
}
