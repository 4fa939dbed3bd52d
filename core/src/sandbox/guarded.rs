//! The guard (`crate::guard`) in a view the confined process reads and
//! writes directly (`--sandbox-ro`, `--sandbox-rw`, the tool's project
//! for `process.run`): what the shell found on disk in those trees is
//! covered there, since no walk of airlock's stands between the process
//! and those files.
//!
//! - A secret file or `--deny`ed path is **masked**: an empty read-only
//!   file or directory bound over it. Its bytes are out of reach, and the
//!   name, a mount point now, cannot be renamed away or replaced.
//! - In a writable tree, a protected path is bound **read-only** over
//!   itself, and a git directory is **pinned** (bound over itself,
//!   writable): git keeps writing its objects, refs and index there, but
//!   the directory cannot be renamed away and replaced by another whose
//!   `config` the process wrote.
//!
//! Covers need a mount namespace; without one a view with covers is
//! refused, naming the first. A protected name created where none
//! existed when the view was made is beyond a mount's reach: the shell
//! looks for those when the session ends ([`created`]).

use crate::guard::{Act, Class, Guard, Rule};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// Entries the shell looks at in the trees of one view at most; a tree
/// holding more is refused (it cannot be checked for secret files).
pub const MAX_GUARD_SCAN_ENTRIES: usize = 1_000_000;
/// Covers one view may hold (each is a mount).
pub const MAX_COVERS: usize = 4096;

/// What the view does over one guarded path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cover")]
pub enum Cover {
    /// A secret or denied file (`dir` false) or directory: an empty
    /// read-only one bound over it.
    Mask { path: PathBuf, dir: bool, rule: Rule },
    /// A protected path in a writable tree: bound read-only over itself.
    ReadOnly { path: PathBuf, rule: Rule },
    /// A git directory in a writable tree: bound over itself, writable.
    Pin { path: PathBuf },
}

impl Cover {
    pub fn path(&self) -> &Path {
        match self {
            Cover::Mask { path, .. } | Cover::ReadOnly { path, .. } | Cover::Pin { path } => path,
        }
    }
}

impl fmt::Display for Cover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cover::Mask { path, rule, .. } => write!(f, "{} ({}) is masked", path.display(), rule.describe()),
            Cover::ReadOnly { path, rule } => {
                write!(f, "{} ({}) is read-only", path.display(), rule.describe())
            }
            Cover::Pin { path } => write!(f, "{} is pinned in place", path.display()),
        }
    }
}

/// The decision on one entry the shell found in a tree (not following a
/// symlink: a link's target is decided where it really lies): its cover,
/// if any, and whether to look beneath it (a directory not covered
/// whole). `writable`: whether the tree is granted for writing.
pub fn cover(guard: &Guard, path: &Path, is_dir: bool, writable: bool) -> (Option<Cover>, bool) {
    if let Err(hit) = guard.check(path, Act::Read, is_dir) {
        let rule = hit.rule;
        return (Some(Cover::Mask { path: path.to_path_buf(), dir: is_dir, rule }), false);
    }
    if !writable {
        return (None, is_dir);
    }
    match guard.check(path, Act::Write, is_dir) {
        Err(hit) if hit.class == Class::Protected => {
            if hit.rule == Rule::GitDir && is_dir {
                (Some(Cover::Pin { path: path.to_path_buf() }), true)
            } else {
                (Some(Cover::ReadOnly { path: path.to_path_buf(), rule: hit.rule }), false)
            }
        }
        _ => (None, is_dir),
    }
}

/// Covers in the order they are mounted: shallowest first, so a pinned
/// git directory lies beneath the read-only `config` in it.
pub fn ordered(mut covers: Vec<Cover>) -> Vec<Cover> {
    covers.sort_by(|a, b| {
        let depth = |c: &Cover| c.path().components().count();
        depth(a).cmp(&depth(b)).then_with(|| a.cmp(b))
    });
    covers.dedup();
    covers
}

/// Protected paths present at the end (`after`, each a path found then)
/// that were neither there at the start (`before`) nor granted: what a
/// writable direct view let the process create.
pub fn created(guard: &Guard, before: &[PathBuf], after: &[PathBuf]) -> Vec<PathBuf> {
    after
        .iter()
        .filter(|p| !before.contains(p) && guard.check(p, Act::Create, false).is_err())
        .cloned()
        .collect()
}

/// Why a view's covers cannot be had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoverRefusal {
    /// More entries than [`MAX_GUARD_SCAN_ENTRIES`] in `tree`.
    TooLarge { tree: PathBuf },
    /// More than [`MAX_COVERS`] guarded paths.
    TooMany { count: usize },
    /// No mount namespace: the first cover that needed one.
    NoMountNamespace { first: Cover, count: usize },
}

impl fmt::Display for CoverRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoverRefusal::TooLarge { tree } => write!(
                f,
                "{} holds more than {MAX_GUARD_SCAN_ENTRIES} entries: airlock cannot check it for secret \
                 files and protected paths; grant a narrower directory",
                tree.display()
            ),
            CoverRefusal::TooMany { count } => write!(
                f,
                "{count} secret files and protected paths to cover, more than {MAX_COVERS}; grant a narrower directory"
            ),
            CoverRefusal::NoMountNamespace { first, count } => {
                let (path, flag) = match first {
                    Cover::Mask { path, .. } => (path, "--allow-secret"),
                    Cover::ReadOnly { path, .. } | Cover::Pin { path } => (path, "--allow-protected"),
                };
                write!(
                    f,
                    "{first}, which takes a mount namespace, and there is none (with {} other path(s) like it); \
                     pass {flag} {} if the process may have it, or run where namespaces are allowed",
                    count - 1,
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for CoverRefusal {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{Grants, Guard};

    #[test]
    fn secrets_are_masked_protected_paths_kept_read_only_and_git_directories_pinned() {
        let g = Guard::new(Grants::default(), Grants::default(), None, []);
        let c = |p: &str, dir: bool, w: bool| cover(&g, Path::new(p), dir, w);
        assert_eq!(
            c("/p/.env", false, false),
            (Some(Cover::Mask { path: "/p/.env".into(), dir: false, rule: Rule::EnvFile }), false)
        );
        assert_eq!(
            c("/p/.env.d", true, true),
            (Some(Cover::Mask { path: "/p/.env.d".into(), dir: true, rule: Rule::EnvFile }), false)
        );
        // Read-only trees: protected paths need no cover.
        assert_eq!(c("/p/.git", true, false), (None, true));
        assert_eq!(c("/p/.git/config", false, false), (None, false));
        assert_eq!(c("/p/.git", true, true), (Some(Cover::Pin { path: "/p/.git".into() }), true));
        assert_eq!(
            c("/p/.git/config", false, true),
            (Some(Cover::ReadOnly { path: "/p/.git/config".into(), rule: Rule::GitConfig }), false)
        );
        assert_eq!(
            c("/p/.git/hooks", true, true),
            (Some(Cover::ReadOnly { path: "/p/.git/hooks".into(), rule: Rule::GitHooks }), false)
        );
        assert_eq!(
            c("/p/sub/.git", false, true),
            (Some(Cover::ReadOnly { path: "/p/sub/.git".into(), rule: Rule::GitDir }), false)
        );
        assert_eq!(c("/p/.git/objects", true, true), (None, true));
        assert_eq!(c("/p/src/main.rs", false, true), (None, false));
        // Granted: nothing to cover.
        let granted = Guard::new(Grants::new(["/p/.git".into()]), Grants::new(["/p/.env".into()]), None, []);
        assert_eq!(cover(&granted, Path::new("/p/.env"), false, true), (None, false));
        assert_eq!(cover(&granted, Path::new("/p/.git/config"), false, true), (None, false));
        let order = ordered(vec![
            Cover::ReadOnly { path: "/p/.git/config".into(), rule: Rule::GitConfig },
            Cover::Pin { path: "/p/.git".into() },
        ]);
        assert_eq!(order[0], Cover::Pin { path: "/p/.git".into() });
        let made = created(&g, &["/p/.git/config".into()], &["/p/.git/config".into(), "/p/x/.vscode".into()]);
        assert_eq!(made, [PathBuf::from("/p/x/.vscode")]);
    }
}
