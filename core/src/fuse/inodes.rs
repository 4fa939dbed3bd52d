//! The node table of one mount: what each node id the kernel holds names.
//!
//! A node is kept as its parent and its name, never as a path, so that a
//! rename moves a whole subtree by changing one entry, and a node's path
//! is always where it is now. A node lives while the kernel holds lookups
//! of it (`FORGET` gives them back) or a live child names it as parent.
//! A name unlinked or renamed over detaches its node: the kernel may still
//! hold it (an open file), but it names nothing any more, and a new file
//! at that name gets a new node id. Ids are never reused, so an id the
//! kernel forgot cannot come back naming something else.
//!
//! Bounded: at most `max` nodes (the root included); a lookup past it is
//! refused (`ENFILE`) until the kernel forgets some.

use super::abi::ROOT_ID;
use super::codec::Name;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Nodes one mount may hold by default (`--max-fuse-nodes`): a checkout of
/// a hundred thousand files fits, at some hundred bytes a node.
pub const DEFAULT_MAX_NODES: usize = 1 << 18;

/// Where a node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    Root,
    Named {
        parent: u64,
        name: Name,
    },
    /// Unlinked or replaced: it names nothing.
    Detached,
}

/// What a node is on the host, to tell a file replaced at the same name
/// from the file the kernel already knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub ino: u64,
    /// The file type bits of its mode.
    pub kind: u32,
}

#[derive(Clone, Debug)]
struct Node {
    link: Link,
    /// Lookups the kernel holds.
    lookups: u64,
    /// Live nodes naming this one as parent.
    children: u64,
    id: Identity,
}

/// The table is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

#[derive(Debug)]
pub struct Nodes {
    nodes: BTreeMap<u64, Node>,
    names: BTreeMap<(u64, Name), u64>,
    next: u64,
    max: usize,
    /// Lookups handed out and given back (for the balance check).
    looked_up: u64,
    forgotten: u64,
}

impl Nodes {
    /// A table holding the root alone.
    pub fn new(max: usize) -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT_ID, Node { link: Link::Root, lookups: 0, children: 0, id: Identity::default() });
        Nodes {
            nodes,
            names: BTreeMap::new(),
            next: ROOT_ID + 1,
            max: max.max(1),
            looked_up: 0,
            forgotten: 0,
        }
    }

    /// Nodes held, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn contains(&self, node: u64) -> bool {
        self.nodes.contains_key(&node)
    }

    /// Lookups the kernel holds of `node`.
    pub fn lookups(&self, node: u64) -> u64 {
        self.nodes.get(&node).map_or(0, |n| n.lookups)
    }

    /// Lookups handed out, and given back, since the mount began.
    pub fn balance(&self) -> (u64, u64) {
        (self.looked_up, self.forgotten)
    }

    /// The names from the root down to `node`, or `None` when it is
    /// unknown or detached (or hangs beneath a detached directory).
    pub fn names(&self, node: u64) -> Option<Vec<&Name>> {
        let mut out = Vec::new();
        let mut at = node;
        // Each step climbs one parent; a cycle cannot form (a node only
        // ever names an existing node as parent, and renames of a
        // directory into its own subtree are refused by the host), but the
        // bound keeps a broken table from looping.
        for _ in 0..=self.nodes.len() {
            match &self.nodes.get(&at)?.link {
                Link::Root => {
                    out.reverse();
                    return Some(out);
                }
                Link::Named { parent, name } => {
                    out.push(name);
                    at = *parent;
                }
                Link::Detached => return None,
            }
        }
        None
    }

    /// The node at `name` in `parent`, if the kernel holds one.
    pub fn child(&self, parent: u64, name: &Name) -> Option<u64> {
        self.names.get(&(parent, name.clone())).copied()
    }

    pub fn identity(&self, node: u64) -> Option<Identity> {
        self.nodes.get(&node).map(|n| n.id)
    }

    /// A lookup of `name` in `parent` found `id`: the node the kernel now
    /// holds one more lookup of. The same node as before when the same
    /// file is still there; a new one (the old one detached) when it was
    /// replaced.
    pub fn found(&mut self, parent: u64, name: &Name, id: Identity) -> Result<u64, Full> {
        if let Some(existing) = self.child(parent, name) {
            if self.nodes.get(&existing).is_some_and(|n| n.id == id) {
                if let Some(n) = self.nodes.get_mut(&existing) {
                    n.lookups += 1;
                }
                self.looked_up += 1;
                return Ok(existing);
            }
            self.detach(parent, name);
        }
        if self.nodes.len() >= self.max || !self.nodes.contains_key(&parent) {
            return Err(Full);
        }
        let node = self.next;
        self.next += 1;
        self.nodes.insert(
            node,
            Node { link: Link::Named { parent, name: name.clone() }, lookups: 1, children: 0, id },
        );
        self.names.insert((parent, name.clone()), node);
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children += 1;
        }
        self.looked_up += 1;
        Ok(node)
    }

    /// Whether one more node fits.
    pub fn has_room(&self) -> bool {
        self.nodes.len() < self.max
    }

    /// The kernel gives back `count` lookups of `node`.
    pub fn forget(&mut self, node: u64, count: u64) {
        if node == ROOT_ID {
            return;
        }
        let Some(n) = self.nodes.get_mut(&node) else { return };
        let given = count.min(n.lookups);
        n.lookups -= given;
        self.forgotten += given;
        self.reap(node);
    }

    /// `name` in `parent` is gone (unlinked, or replaced by a rename).
    pub fn detach(&mut self, parent: u64, name: &Name) {
        let Some(node) = self.names.remove(&(parent, name.clone())) else { return };
        if let Some(n) = self.nodes.get_mut(&node) {
            n.link = Link::Detached;
        }
        self.release_parent(parent);
        self.reap(node);
    }

    /// `name` in `parent` was moved to `newname` in `newparent`,
    /// replacing whatever was there.
    pub fn renamed(&mut self, parent: u64, name: &Name, newparent: u64, newname: &Name) {
        if parent == newparent && name == newname {
            return;
        }
        self.detach(newparent, newname);
        let Some(node) = self.names.remove(&(parent, name.clone())) else { return };
        // A directory never moves into its own subtree (the host refuses
        // it); a table that says otherwise is stale, and the node is
        // taken for gone rather than made into a cycle.
        if !self.nodes.contains_key(&newparent) || self.within(newparent, node) {
            // The destination directory is not one the kernel holds; the
            // node names nothing the table can reach.
            if let Some(n) = self.nodes.get_mut(&node) {
                n.link = Link::Detached;
            }
            self.release_parent(parent);
            self.reap(node);
            return;
        }
        if let Some(n) = self.nodes.get_mut(&node) {
            n.link = Link::Named { parent: newparent, name: newname.clone() };
        }
        self.names.insert((newparent, newname.clone()), node);
        if let Some(p) = self.nodes.get_mut(&newparent) {
            p.children += 1;
        }
        self.release_parent(parent);
    }

    /// Whether `node` is `ancestor` or lies beneath it.
    fn within(&self, mut node: u64, ancestor: u64) -> bool {
        for _ in 0..=self.nodes.len() {
            if node == ancestor {
                return true;
            }
            match self.nodes.get(&node).map(|n| &n.link) {
                Some(Link::Named { parent, .. }) => node = *parent,
                _ => return false,
            }
        }
        false
    }

    /// Two names swapped places (`RENAME_EXCHANGE`).
    pub fn exchanged(&mut self, a_parent: u64, a: &Name, b_parent: u64, b: &Name) {
        let (ka, kb) = (self.child(a_parent, a), self.child(b_parent, b));
        // As for a rename: neither may end up inside itself.
        let cycle =
            ka.is_some_and(|n| self.within(b_parent, n)) || kb.is_some_and(|n| self.within(a_parent, n));
        if cycle {
            self.detach(a_parent, a);
            self.detach(b_parent, b);
            return;
        }
        let na = self.names.remove(&(a_parent, a.clone()));
        let nb = self.names.remove(&(b_parent, b.clone()));
        if let Some(n) = na {
            self.names.insert((b_parent, b.clone()), n);
            if let Some(node) = self.nodes.get_mut(&n) {
                node.link = Link::Named { parent: b_parent, name: b.clone() };
            }
        }
        if let Some(n) = nb {
            self.names.insert((a_parent, a.clone()), n);
            if let Some(node) = self.nodes.get_mut(&n) {
                node.link = Link::Named { parent: a_parent, name: a.clone() };
            }
        }
        // Children counts move with the nodes between the two parents.
        let moved = |n: Option<u64>| u64::from(n.is_some());
        if a_parent != b_parent {
            if let Some(p) = self.nodes.get_mut(&a_parent) {
                p.children = p.children - moved(na) + moved(nb);
            }
            if let Some(p) = self.nodes.get_mut(&b_parent) {
                p.children = p.children - moved(nb) + moved(na);
            }
        }
    }

    fn release_parent(&mut self, parent: u64) {
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children = p.children.saturating_sub(1);
        }
        self.reap(parent);
    }

    /// Drop `node` if nothing holds it any more, and then its parent in
    /// turn.
    fn reap(&mut self, mut node: u64) {
        loop {
            if node == ROOT_ID {
                return;
            }
            let Some(n) = self.nodes.get(&node) else { return };
            if n.lookups > 0 || n.children > 0 {
                return;
            }
            let link = n.link.clone();
            self.nodes.remove(&node);
            match link {
                Link::Named { parent, name } => {
                    self.names.remove(&(parent, name));
                    match self.nodes.get_mut(&parent) {
                        Some(p) => p.children = p.children.saturating_sub(1),
                        None => return,
                    }
                    node = parent;
                }
                Link::Root | Link::Detached => return,
            }
        }
    }

    /// Every node but the root is gone (the kernel forgot them all).
    pub fn only_root(&self) -> bool {
        self.nodes.len() == 1 && self.names.is_empty()
    }

    /// Check the table's own consistency (tests and the simulator): every
    /// name indexes a node that names it back, every children count is
    /// the number of nodes naming that parent, no node is held by nothing.
    pub fn check(&self) -> Result<(), String> {
        let mut children: BTreeMap<u64, u64> = BTreeMap::new();
        for (id, n) in &self.nodes {
            match &n.link {
                Link::Named { parent, name } => {
                    if self.names.get(&(*parent, name.clone())) != Some(id) {
                        return Err(format!("node {id} is not indexed under its name"));
                    }
                    if !self.nodes.contains_key(parent) {
                        return Err(format!("node {id} names a missing parent {parent}"));
                    }
                    *children.entry(*parent).or_default() += 1;
                }
                Link::Root if *id != ROOT_ID => return Err(format!("node {id} claims to be the root")),
                _ => {}
            }
        }
        for (id, n) in &self.nodes {
            if n.children != children.get(id).copied().unwrap_or(0) {
                return Err(format!("node {id} counts {} children, has {:?}", n.children, children.get(id)));
            }
            if *id != ROOT_ID && n.lookups == 0 && n.children == 0 {
                return Err(format!("node {id} is held by nothing"));
            }
        }
        if self.names.len() > self.nodes.len() {
            return Err("more names than nodes".into());
        }
        if self.nodes.len() > self.max {
            return Err(format!("{} nodes past the limit of {}", self.nodes.len(), self.max));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(s: &str) -> Name {
        Name::new(s.as_bytes()).unwrap()
    }

    fn file(ino: u64) -> Identity {
        Identity { ino, kind: super::super::abi::S_IFREG }
    }

    fn dir(ino: u64) -> Identity {
        Identity { ino, kind: super::super::abi::S_IFDIR }
    }

    #[test]
    fn paths_follow_renames_and_unlinks_detach() {
        let mut t = Nodes::new(100);
        let d = t.found(ROOT_ID, &n("src"), dir(10)).unwrap();
        let f = t.found(d, &n("a.rs"), file(11)).unwrap();
        assert_eq!(t.names(f).unwrap(), vec![&n("src"), &n("a.rs")]);
        // The same file again is the same node, one lookup more.
        assert_eq!(t.found(d, &n("a.rs"), file(11)), Ok(f));
        assert_eq!(t.lookups(f), 2);
        // Renaming the directory moves the file with it.
        t.renamed(ROOT_ID, &n("src"), ROOT_ID, &n("lib"));
        assert_eq!(t.names(f).unwrap(), vec![&n("lib"), &n("a.rs")]);
        // Another file at the same name is another node.
        let g = t.found(d, &n("a.rs"), file(12)).unwrap();
        assert_ne!(g, f);
        assert_eq!(t.names(f), None, "the replaced node names nothing");
        t.detach(d, &n("a.rs"));
        assert_eq!(t.names(g), None);
        t.check().unwrap();
        t.forget(f, 2);
        t.forget(g, 1);
        assert!(t.contains(d), "the directory is still looked up");
        t.forget(d, 1);
        assert!(t.only_root());
        t.check().unwrap();
    }

    #[test]
    fn a_directory_lives_while_a_child_is_held() {
        let mut t = Nodes::new(100);
        let d = t.found(ROOT_ID, &n("d"), dir(1)).unwrap();
        let f = t.found(d, &n("f"), file(2)).unwrap();
        t.forget(d, 1);
        assert_eq!(t.names(f).unwrap(), vec![&n("d"), &n("f")]);
        t.forget(f, 1);
        assert!(t.only_root());
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Nodes::new(3);
        t.found(ROOT_ID, &n("a"), file(1)).unwrap();
        t.found(ROOT_ID, &n("b"), file(2)).unwrap();
        assert_eq!(t.found(ROOT_ID, &n("c"), file(3)), Err(Full));
        // A node already held is found again without room.
        assert!(t.found(ROOT_ID, &n("a"), file(1)).is_ok());
    }

    #[derive(Clone, Debug)]
    enum Step {
        Found(u8, u8, u8),
        Forget(u8, u8),
        Detach(u8, u8),
        Rename(u8, u8, u8, u8),
        Exchange(u8, u8, u8, u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (any::<u8>(), 0u8..4, 0u8..3).prop_map(|(p, c, i)| Step::Found(p, c, i)),
            (any::<u8>(), 1u8..3).prop_map(|(p, c)| Step::Forget(p, c)),
            (any::<u8>(), 0u8..4).prop_map(|(p, c)| Step::Detach(p, c)),
            (any::<u8>(), 0u8..4, any::<u8>(), 0u8..4).prop_map(|(a, b, c, d)| Step::Rename(a, b, c, d)),
            (any::<u8>(), 0u8..4, any::<u8>(), 0u8..4).prop_map(|(a, b, c, d)| Step::Exchange(a, b, c, d)),
        ]
    }

    proptest! {
        /// Whatever the kernel does, the table stays consistent and
        /// bounded, and once every lookup is given back only the root is
        /// left.
        #[test]
        fn lookups_and_forgets_balance(steps in proptest::collection::vec(step(), 0..80)) {
            let mut t = Nodes::new(12);
            let mut held: Vec<u64> = Vec::new();
            let names = ["a", "b", "c", "d"];
            let pick = |held: &Vec<u64>, i: u8| if held.is_empty() || i.is_multiple_of(3) { ROOT_ID } else { held[i as usize % held.len()] };
            for s in steps {
                match s {
                    Step::Found(p, c, i) => {
                        let parent = pick(&held, p);
                        if t.contains(parent) {
                            if let Ok(id) = t.found(parent, &n(names[c as usize]), Identity { ino: i as u64, kind: 0 }) {
                                held.push(id);
                            }
                        }
                    }
                    Step::Forget(p, c) => {
                        if !held.is_empty() {
                            let i = p as usize % held.len();
                            let id = held[i];
                            let give = (c as usize).min(held.iter().filter(|h| **h == id).count());
                            for _ in 0..give {
                                let at = held.iter().position(|h| *h == id).unwrap();
                                held.remove(at);
                            }
                            t.forget(id, give as u64);
                        }
                    }
                    Step::Detach(p, c) => t.detach(pick(&held, p), &n(names[c as usize])),
                    Step::Rename(a, b, c, d) => {
                        t.renamed(pick(&held, a), &n(names[b as usize]), pick(&held, c), &n(names[d as usize]))
                    }
                    Step::Exchange(a, b, c, d) => {
                        let (pa, pb) = (pick(&held, a), pick(&held, c));
                        if (pa, b) != (pb, d) {
                            t.exchanged(pa, &n(names[b as usize]), pb, &n(names[d as usize]))
                        }
                    }
                }
                prop_assert!(t.check().is_ok(), "{:?}", t.check());
            }
            for id in held.clone() {
                t.forget(id, 1);
            }
            prop_assert!(t.only_root(), "{} nodes left", t.len());
            let (a, b) = t.balance();
            prop_assert_eq!(a, b);
        }
    }
}
