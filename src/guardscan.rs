//! Looks through the trees a confined process reaches directly for what
//! the guard covers there (`airlock_core::sandbox::cover` decides each
//! entry): secret files to mask, protected paths to keep read-only, git
//! directories to pin. Symlinks are not followed (a link's target is
//! decided where it really lies); a tree larger than
//! `MAX_GUARD_SCAN_ENTRIES` is refused, never half checked.

use airlock_core::guard::{Act, Class, Guard};
use airlock_core::sandbox::{cover, ordered, Cover, CoverRefusal, MAX_COVERS, MAX_GUARD_SCAN_ENTRIES};
use std::path::{Path, PathBuf};

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
                if kind.is_symlink() {
                    continue;
                }
                let path = entry.path();
                let (c, descend) = cover(guard, &path, kind.is_dir(), tree.writable);
                note(guard, &mut found, c, &path, kind.is_dir(), tree.writable);
                if descend && kind.is_dir() {
                    stack.push(path);
                }
            }
        }
    }
    if found.covers.len() > MAX_COVERS {
        return Err(CoverRefusal::TooMany { count: found.covers.len() });
    }
    found.covers = ordered(found.covers);
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

/// Protected paths a writable view let the process create: present now,
/// absent when the view was made, not granted.
pub fn created(guard: &Guard, trees: &[Tree], before: &[PathBuf]) -> Vec<PathBuf> {
    let writable: Vec<Tree> = trees.iter().filter(|t| t.writable).cloned().collect();
    match scan(guard, &writable) {
        Ok(after) => airlock_core::sandbox::created(guard, before, &after.protected),
        Err(_) => Vec::new(),
    }
}
