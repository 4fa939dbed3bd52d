//! Looks through the trees a confined process reaches directly for what
//! the guard covers there (`airlock_core::sandbox::cover` decides each
//! entry): secret files to mask, protected paths to keep read-only, git
//! directories to pin. Symlinks are not followed (a link's target is
//! decided where it really lies, but a link under a protected name counts
//! as that protected path); a tree larger than
//! `MAX_GUARD_SCAN_ENTRIES` is refused, never half checked, and one the
//! process grew past it is said to be unchecked at the end.

use airlock_core::guard::{Act, Class, Guard};
use airlock_core::sandbox::{
    cover, ordered, Cover, CoverRefusal, NsMode, MAX_COVERS, MAX_GUARD_SCAN_ENTRIES,
};
use std::path::{Path, PathBuf};

/// Set-aside paths said one by one on stderr at most; the rest are
/// counted there and listed in the report.
const MAX_SET_ASIDE_SAID: usize = 16;

/// A tree (absolute, resolved) and whether it is granted for writing.
#[derive(Clone, Debug)]
pub struct Tree {
    pub path: PathBuf,
    pub writable: bool,
}

/// What a look through the trees found.
#[derive(Clone, Debug, Default)]
pub struct Found {
    /// In mount order.
    pub covers: Vec<Cover>,
    /// Protected paths present in writable trees (covered or granted), for
    /// the end of the session to compare with.
    pub protected: Vec<PathBuf>,
}

/// Look through `trees` for what `guard` covers.
pub fn scan(guard: &Guard, trees: &[Tree]) -> Result<Found, CoverRefusal> {
    let mut found = walk(guard, trees)?;
    if found.covers.len() > MAX_COVERS {
        return Err(CoverRefusal::TooMany { count: found.covers.len() });
    }
    found.covers = ordered(found.covers);
    Ok(found)
}

/// Every entry of `trees` decided, however many covers that takes; only a
/// tree of more than `MAX_GUARD_SCAN_ENTRIES` entries is refused.
fn walk(guard: &Guard, trees: &[Tree]) -> Result<Found, CoverRefusal> {
    let mut found = Found::default();
    for tree in trees {
        let mut seen = 0usize;
        let mut stack = vec![tree.path.clone()];
        // The tree itself may be guarded (`--sandbox-ro .env`).
        let top = std::fs::symlink_metadata(&tree.path).map(|m| m.is_dir()).unwrap_or(false);
        let (c, descend) = cover(guard, &tree.path, top, tree.writable);
        note(guard, &mut found, c, &tree.path, top, tree.writable);
        if !descend || !top {
            stack.clear();
        }
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_GUARD_SCAN_ENTRIES {
                    return Err(CoverRefusal::TooLarge { tree: tree.path.clone() });
                }
                let Ok(kind) = entry.file_type() else { continue };
                let path = entry.path();
                if kind.is_symlink() {
                    // Never followed, but a link under a protected name
                    // (`deep/.envrc -> payload.sh`) is what an editor or
                    // direnv opens: it counts as that protected path.
                    note(guard, &mut found, None, &path, false, tree.writable);
                    continue;
                }
                let (c, descend) = cover(guard, &path, kind.is_dir(), tree.writable);
                note(guard, &mut found, c, &path, kind.is_dir(), tree.writable);
                if descend && kind.is_dir() {
                    stack.push(path);
                }
            }
        }
    }
    found.protected.sort();
    found.protected.dedup();
    Ok(found)
}

fn note(guard: &Guard, found: &mut Found, c: Option<Cover>, path: &Path, is_dir: bool, writable: bool) {
    if writable {
        let protected = matches!(guard.matched(path.as_os_str().as_encoded_bytes(), Act::Create, is_dir),
            Some(r) if r.class() == Class::Protected);
        if protected {
            found.protected.push(path.to_path_buf());
        }
    }
    if let Some(c) = c {
        found.covers.push(c);
    }
}

/// The guard over one direct view, from before it is made to after its
/// processes are gone: what it covers (the scan's covers and the
/// placeholders' holds), and at the end what the processes made past
/// them, renamed aside.
#[derive(Debug)]
pub struct View {
    found: Found,
    held: crate::holds::Held,
    trees: Vec<Tree>,
}

/// What a view's end found.
#[derive(Debug, Default)]
pub struct Ended {
    /// Protected paths made where nothing held them.
    pub created: Vec<PathBuf>,
    /// Those renamed aside, and to what.
    pub set_aside: Vec<crate::holds::SetAside>,
    /// Writable trees the process grew past what a scan reads: nothing in
    /// them was checked.
    pub unchecked: Vec<PathBuf>,
}

impl View {
    /// Scan `trees` and hold the protected names absent from the writable
    /// ones (see `crate::holds::hold`).
    pub fn make(guard: &Guard, trees: Vec<Tree>, namespaces: NsMode) -> anyhow::Result<View> {
        let mut found = scan(guard, &trees)?;
        let held = crate::holds::hold(guard, &trees, namespaces, &mut found)?;
        Ok(View { found, held, trees })
    }

    /// The covers for the confinement request, in mount order.
    pub fn covers(&self) -> &[Cover] {
        &self.found.covers
    }

    /// Whether any tree is writable.
    pub fn writable(&self) -> bool {
        self.trees.iter().any(|t| t.writable)
    }

    /// The view was made without a mount namespace: placeholders no mount
    /// holds are entries the process may remove and replace, or trip
    /// over; they go at once.
    pub fn unmounted(&mut self) {
        self.held = crate::holds::Held::default();
    }

    /// Once every process of the view is gone: the protected paths made
    /// past every placeholder, each said on stderr and renamed aside.
    pub fn end(self, guard: &Guard) -> Ended {
        let View { found, held, trees } = self;
        let (created, unchecked) = created(guard, &trees, &found.protected);
        let created = held.made_past(created);
        for tree in &unchecked {
            eprintln!(
                "airlock: warning: {} holds more than {MAX_GUARD_SCAN_ENTRIES} entries now, so airlock could \
                 not look for protected paths the confined process made in it (.git, .vscode, .envrc, …): \
                 look before an editor, an agent or git runs in it",
                tree.display()
            );
        }
        drop(held);
        let set_aside = crate::holds::set_aside(&created);
        // A child that made thousands does not flood the terminal: the
        // report lists every one.
        for s in set_aside.iter().take(MAX_SET_ASIDE_SAID) {
            eprintln!(
                "airlock: warning: a confined process created the protected path {} in a --sandbox-rw \
                 directory, where no placeholder could hold it; it is renamed to {}, where nothing runs \
                 it: look at it before you move it back",
                s.path.display(),
                s.to.display()
            );
        }
        if set_aside.len() > MAX_SET_ASIDE_SAID {
            eprintln!(
                "airlock: warning: {} more protected paths the confined process created were renamed aside \
                 the same way (the report's protected_set_aside lists each)",
                set_aside.len() - MAX_SET_ASIDE_SAID
            );
        }
        Ended { created, set_aside, unchecked }
    }
}

/// Protected paths a writable view let the process create (present now,
/// absent when the view was made, not granted), and the writable trees
/// too large now to be looked through, each scanned alone so one grown
/// tree does not hide what was made in another.
fn created(guard: &Guard, trees: &[Tree], before: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut made, mut unchecked) = (Vec::new(), Vec::new());
    for tree in trees.iter().filter(|t| t.writable) {
        match scan_protected(guard, tree) {
            Some(after) => made.extend(airlock_core::sandbox::created(guard, before, &after)),
            None => unchecked.push(tree.path.clone()),
        }
    }
    made.sort();
    made.dedup();
    (made, unchecked)
}

/// The protected paths in one tree, or `None` when it holds more than a
/// scan reads. However many there are: nothing is mounted at the end, so
/// `MAX_COVERS` does not apply (a child that made thousands gets every
/// one set aside, not none).
fn scan_protected(guard: &Guard, tree: &Tree) -> Option<Vec<PathBuf>> {
    walk(guard, std::slice::from_ref(tree)).ok().map(|found| found.protected)
}
