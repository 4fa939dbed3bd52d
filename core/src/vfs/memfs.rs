//! An in-memory [`ProjectFiles`]: the reference backend. The simulator
//! runs tools against it, and the cap-std backend is property-tested to
//! agree with it.

use super::effect::OpError;
use super::files::{
    self, grep_file, resolve, DirEntry, EntryKind, Gate, GrepQuery, GrepResult, Lookup, Metadata, Node,
    ProjectFiles, ProjectPath,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemNode {
    File(Vec<u8>),
    Dir,
    Symlink(PathBuf),
    Other,
}

/// Paths (project-relative) to nodes; the root always exists. A node's
/// parent is always a directory.
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

    fn create_parents(&mut self, p: &ProjectPath) -> Result<(), OpError> {
        let mut dir = ProjectPath::ROOT;
        let parts: Vec<String> =
            p.parent().map(|d| d.parts().map(str::to_string).collect()).unwrap_or_default();
        for part in parts {
            dir = dir.join(&part);
            match self.nodes.get(&dir) {
                Some(MemNode::Dir) => {}
                None => {
                    self.nodes.insert(dir.clone(), MemNode::Dir);
                }
                Some(_) => return Err(OpError::exists(format!("{dir} exists and is not a directory"))),
            }
        }
        Ok(())
    }

    fn grep_walk(
        &self,
        gate: &Gate,
        q: &GrepQuery,
        re: &regex::Regex,
        path: &ProjectPath,
        out: &mut GrepResult,
    ) -> bool {
        match self.nodes.get(path) {
            Some(MemNode::File(content)) => {
                if !q.wants(path)
                    || content.len() > gate.max_file()
                    || gate.check(path, false, false).is_err()
                {
                    return true;
                }
                grep_file(re, path, &gate.scrubber().bytes(content), q, gate.max_file(), out)
            }
            Some(MemNode::Dir) => {
                if gate.check(path, false, true).is_err() {
                    return true;
                }
                for (name, _) in self.children(path) {
                    if !self.grep_walk(gate, q, re, &path.join(&name), out) {
                        return false;
                    }
                }
                true
            }
            _ => true,
        }
    }
}

impl Lookup for MemFiles {
    fn lookup(&mut self, path: &ProjectPath) -> Result<Node, OpError> {
        Ok(match self.nodes.get(path) {
            None => Node::Missing,
            Some(MemNode::File(b)) => Node::File { size: b.len() as u64 },
            Some(MemNode::Dir) => Node::Dir,
            Some(MemNode::Symlink(t)) => Node::Symlink(t.clone()),
            Some(MemNode::Other) => Node::Other,
        })
    }
}

impl ProjectFiles for MemFiles {
    fn read(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<u8>, OpError> {
        let r = resolve(self, gate, path, true, false)?;
        match self.nodes.get(&r.path) {
            Some(MemNode::File(b)) if b.len() > gate.max_file() => {
                Err(OpError::too_large(&format!("file {path} ({} bytes)", b.len()), gate.max_file()))
            }
            Some(MemNode::File(b)) => Ok(b.clone()),
            Some(MemNode::Dir) => Err(OpError::invalid(format!("{path} is a directory"))),
            Some(_) => Err(OpError::invalid(format!("{path} is not a regular file"))),
            None => Err(OpError::not_found(format!("{path} does not exist"))),
        }
    }

    fn write(&mut self, gate: &Gate, path: &ProjectPath, content: &[u8]) -> Result<(), OpError> {
        gate.check_write_size(path, content.len())?;
        let r = resolve(self, gate, path, true, true)?;
        match r.node {
            Node::Dir => return Err(OpError::exists(format!("{path} is a directory"))),
            Node::Other => return Err(OpError::invalid(format!("{path} is not a regular file"))),
            _ => {}
        }
        if r.path.is_root() {
            return Err(OpError::exists("the project root is a directory"));
        }
        self.create_parents(&r.path)?;
        self.nodes.insert(r.path, MemNode::File(content.to_vec()));
        Ok(())
    }

    fn exists(&mut self, gate: &Gate, path: &ProjectPath) -> Result<bool, OpError> {
        let r = resolve(self, gate, path, true, false)?;
        Ok(r.node != Node::Missing)
    }

    fn metadata(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Metadata, OpError> {
        let r = resolve(self, gate, path, true, false)?;
        match r.node {
            Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
            Node::File { size } => Ok(Metadata { kind: EntryKind::File, size }),
            Node::Dir => Ok(Metadata { kind: EntryKind::Dir, size: 0 }),
            _ => Ok(Metadata { kind: EntryKind::Other, size: 0 }),
        }
    }

    fn list_dir(&mut self, gate: &Gate, path: &ProjectPath) -> Result<Vec<DirEntry>, OpError> {
        let r = resolve(self, gate, path, true, false)?;
        match r.node {
            Node::Dir => {}
            Node::Missing => return Err(OpError::not_found(format!("{path} does not exist"))),
            _ => return Err(OpError::invalid(format!("{path} is not a directory"))),
        }
        let children: Vec<(String, Node)> = self
            .children(&r.path)
            .into_iter()
            .map(|(n, m)| {
                let node = match m {
                    MemNode::File(b) => Node::File { size: b.len() as u64 },
                    MemNode::Dir => Node::Dir,
                    MemNode::Symlink(t) => Node::Symlink(t.clone()),
                    MemNode::Other => Node::Other,
                };
                (n, node)
            })
            .collect();
        Ok(files::listing(gate, path, &r.path, children))
    }

    fn delete(&mut self, gate: &Gate, path: &ProjectPath) -> Result<(), OpError> {
        let r = resolve(self, gate, path, false, true)?;
        match r.node {
            Node::Missing => Err(OpError::not_found(format!("{path} does not exist"))),
            Node::Dir => {
                Err(OpError::invalid(format!("{path} is a directory: fs.delete removes files only")))
            }
            _ => {
                self.nodes.remove(&r.path);
                Ok(())
            }
        }
    }

    fn rename(&mut self, gate: &Gate, from: &ProjectPath, to: &ProjectPath) -> Result<(), OpError> {
        let f = resolve(self, gate, from, false, true)?;
        match f.node {
            Node::Missing => return Err(OpError::not_found(format!("{from} does not exist"))),
            Node::Dir => {
                return Err(OpError::invalid(format!("{from} is a directory: fs.rename moves files only")))
            }
            _ => {}
        }
        let t = resolve(self, gate, to, false, true)?;
        if t.node != Node::Missing {
            return Err(OpError::exists(format!("{to} already exists")));
        }
        if t.path.is_root() {
            return Err(OpError::exists("the project root exists"));
        }
        self.create_parents(&t.path)?;
        if let Some(node) = self.nodes.remove(&f.path) {
            self.nodes.insert(t.path, node);
        }
        Ok(())
    }

    fn grep(&mut self, gate: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError> {
        let re = q.regex()?;
        let mut out = GrepResult::default();
        for p in &q.paths {
            // Given paths: checked lexically already; a symlink is skipped
            // like any link met on the way.
            if let Some(MemNode::Symlink(_)) = self.nodes.get(p) {
                continue;
            }
            let r = resolve(self, gate, p, false, false)?;
            if r.node == Node::Missing {
                return Err(OpError::not_found(format!("{p} does not exist")));
            }
            if !self.grep_walk(gate, q, &re, &r.path, &mut out) {
                break;
            }
        }
        Ok(out)
    }
}
