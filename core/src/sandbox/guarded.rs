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
//! - A protected name **absent** where a writable view is made is
//!   **held**: at the top of each writable tree and of each work tree in
//!   it, and in each git directory ([`hold_sites`], [`holds`]), the shell
//!   makes an empty placeholder on disk and binds an empty read-only one
//!   over it, so the name cannot be made; the placeholder goes when the
//!   view does.
//!
//! Covers need a mount namespace; without one a view with covers other
//! than holds is refused, naming the first (holds are then listed as not
//! enforced). A protected name made deeper, in a directory the process
//! created (or `commondir`, which no placeholder can stand for), is
//! beyond a mount's reach: the shell looks for those when the session
//! ends ([`created`]).

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
    /// A protected name absent from a writable tree: a placeholder made
    /// there (an empty directory when `dir`, else an empty file) with an
    /// empty read-only one bound over it.
    Hold { path: PathBuf, dir: bool, rule: Rule },
}

impl Cover {
    pub fn path(&self) -> &Path {
        match self {
            Cover::Mask { path, .. }
            | Cover::ReadOnly { path, .. }
            | Cover::Pin { path }
            | Cover::Hold { path, .. } => path,
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
            Cover::Hold { path, rule, .. } => {
                write!(f, "{} ({}) is held empty and read-only", path.display(), rule.describe())
            }
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

/// What kind of place a placeholder goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HoldAt {
    /// A writable tree's top, or a work tree's (a directory holding a git
    /// directory or a `.git` file).
    Top,
    /// A git directory.
    GitDir,
}

/// The places a writable view's placeholders go, from its writable trees
/// (directories) and the covers found in them: each tree's top; each
/// work tree's, the parent of a pinned git directory or of a `.git` file
/// kept read-only; each pinned git directory. Deeper places are made by
/// the process, after the view, where no mount reaches.
pub fn hold_sites(writable_tops: &[PathBuf], covers: &[Cover]) -> Vec<(PathBuf, HoldAt)> {
    let mut sites: Vec<(PathBuf, HoldAt)> = writable_tops.iter().map(|t| (t.clone(), HoldAt::Top)).collect();
    for c in covers {
        match c {
            Cover::Pin { path } => {
                sites.push((path.clone(), HoldAt::GitDir));
                if let Some(parent) = path.parent() {
                    sites.push((parent.to_path_buf(), HoldAt::Top));
                }
            }
            Cover::ReadOnly { path, rule: Rule::GitDir } if path.file_name().is_some_and(|n| n == ".git") => {
                if let Some(parent) = path.parent() {
                    sites.push((parent.to_path_buf(), HoldAt::Top));
                }
            }
            _ => {}
        }
    }
    sites.sort();
    sites.dedup();
    sites
}

/// The placeholders the guard calls for at `site`: every name
/// [`crate::guard::names::held`] lists there that the guard protects for
/// creation (or, for a directory, whose content it protects) and no
/// grant lifts (home start-up files only where `site` is
/// a home). The shell makes those that are absent.
pub fn holds(guard: &Guard, site: &Path, at: HoldAt) -> Vec<Cover> {
    use std::os::unix::ffi::OsStrExt;
    crate::guard::names::held(at == HoldAt::GitDir)
        .into_iter()
        .filter_map(|(rel, dir)| {
            let path = site.join(std::ffi::OsStr::from_bytes(&rel));
            let protected = |p: &Path, is_dir| match guard.check(p, Act::Create, is_dir) {
                Err(hit) if hit.class == Class::Protected => Some(hit.rule),
                _ => None,
            };
            // A directory is held when it is protected, or what it would
            // hold is (`.config/autostart/*`).
            let rule =
                protected(&path, dir).or_else(|| dir.then(|| protected(&path.join("_"), false)).flatten())?;
            Some(Cover::Hold { path, dir, rule })
        })
        .collect()
}

/// The report's account of holds, for a view with `writable` direct
/// trees: without a mount namespace none is in force (none is made, or
/// those made go at once), and `protected_create` joins `not_enforced`.
pub fn report_holds(f: &mut super::InForce, writable: bool, applied: &super::Applied) {
    if writable && !applied.has(super::Namespace::Mount) && !f.not_enforced.contains(&"protected_create") {
        f.not_enforced.push("protected_create");
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

/// What a protected path the process made past every placeholder is
/// renamed to at the session's end, so that nothing it left there runs on
/// the host: `NAME.airlock-refused`, or with `-N` when that is taken
/// (`taken` says which names exist). The new name is no protected one.
pub const SET_ASIDE_SUFFIX: &str = ".airlock-refused";

/// Candidates tried for a set-aside name at most.
pub const MAX_SET_ASIDE_TRIES: usize = 64;

/// The name to set `path` aside to, given which names are `taken`;
/// `None` when every candidate is.
pub fn set_aside_name(path: &Path, taken: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let name = path.file_name()?.to_os_string();
    (0..MAX_SET_ASIDE_TRIES)
        .map(|n| {
            let mut to = name.clone();
            to.push(SET_ASIDE_SUFFIX);
            if n > 0 {
                to.push(format!("-{n}"));
            }
            path.with_file_name(to)
        })
        .find(|p| !taken(p))
}

/// The paths to set aside among `created`: the shallowest of each
/// subtree (what lies beneath goes with it), in order.
pub fn set_aside_roots(mut created: Vec<PathBuf>) -> Vec<PathBuf> {
    created.sort_by_key(|p| (p.components().count(), p.clone()));
    let mut roots: Vec<PathBuf> = Vec::new();
    for p in created {
        if !roots.iter().any(|r| p.starts_with(r)) {
            roots.push(p);
        }
    }
    roots
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
                    Cover::ReadOnly { path, .. } | Cover::Pin { path } | Cover::Hold { path, .. } => {
                        (path, "--allow-protected")
                    }
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

    #[test]
    fn what_is_made_past_every_placeholder_is_set_aside_under_a_name_no_rule_protects() {
        let g = Guard::new(Grants::default(), Grants::default(), None, []);
        let roots = set_aside_roots(vec![
            "/p/deep/.git/config".into(),
            "/p/deep/.git".into(),
            "/p/deep/.git/hooks".into(),
            "/p/a/.vscode".into(),
        ]);
        assert_eq!(roots, [PathBuf::from("/p/a/.vscode"), PathBuf::from("/p/deep/.git")]);
        let to =
            set_aside_name(Path::new("/p/deep/.git"), |p| p == Path::new("/p/deep/.git.airlock-refused"));
        assert_eq!(to, Some(PathBuf::from("/p/deep/.git.airlock-refused-1")));
        for made in ["/p/deep/.git", "/p/a/.vscode", "/p/.mcp.json", "/home/u/.bashrc", "/p/.git/hooks"] {
            let to = set_aside_name(Path::new(made), |_| false).unwrap();
            assert!(g.check(&to, Act::Create, true).is_ok(), "{}", to.display());
            assert!(g.check(&to.join("config"), Act::Create, false).is_ok(), "{}", to.display());
        }
        assert_eq!(set_aside_name(Path::new("/p/.vscode"), |_| true), None);
    }

    #[test]
    fn absent_protected_names_are_held_at_each_top_and_git_directory() {
        let g = Guard::new(Grants::default(), Grants::default(), None, []);
        let covers = [
            Cover::Pin { path: "/p/.git".into() },
            Cover::Pin { path: "/p/vendor/lib/.git".into() },
            Cover::ReadOnly { path: "/p/wt/.git".into(), rule: Rule::GitDir },
            Cover::ReadOnly { path: "/p/.git/config".into(), rule: Rule::GitConfig },
        ];
        let sites = hold_sites(&["/p".into()], &covers);
        assert_eq!(
            sites,
            [
                ("/p".into(), HoldAt::Top),
                ("/p/.git".into(), HoldAt::GitDir),
                ("/p/vendor/lib".into(), HoldAt::Top),
                ("/p/vendor/lib/.git".into(), HoldAt::GitDir),
                ("/p/wt".into(), HoldAt::Top),
            ]
        );
        let names = |site: &str, at| {
            holds(&g, Path::new(site), at)
                .into_iter()
                .map(|c| match c {
                    Cover::Hold { path, dir, .. } => (path.to_string_lossy().into_owned(), dir),
                    other => panic!("{other:?}"),
                })
                .collect::<Vec<_>>()
        };
        let top = names("/p", HoldAt::Top);
        for want in [".git", ".vscode", ".idea", ".claude", ".cursor", ".mcp.json", ".envrc"] {
            assert!(top.contains(&(format!("/p/{want}"), true)), "{want}: {top:?}");
        }
        // Not a home: its start-up files are not protected there.
        assert!(!top.iter().any(|(p, _)| p.ends_with(".bashrc")), "{top:?}");
        let home = names("/home/u", HoldAt::Top);
        assert!(home.contains(&("/home/u/.bashrc".into(), false)), "{home:?}");
        assert!(home.contains(&("/home/u/.ssh/authorized_keys".into(), false)), "{home:?}");
        assert!(home.contains(&("/home/u/.config/autostart".into(), true)), "{home:?}");
        let git = names("/p/.git", HoldAt::GitDir);
        assert_eq!(
            git,
            [
                ("/p/.git/hooks".into(), true),
                ("/p/.git/modules".into(), true),
                ("/p/.git/worktrees".into(), true),
                ("/p/.git/config".into(), false),
                ("/p/.git/config.worktree".into(), false),
            ]
        );
        // Without a mount namespace, holds are said not to be in force.
        let mut f = crate::sandbox::Plan::Unconfined { abi: 0 }.in_force();
        report_holds(&mut f, false, &crate::sandbox::Applied::default());
        assert!(!f.not_enforced.contains(&"protected_create"));
        report_holds(&mut f, true, &crate::sandbox::Applied::default());
        report_holds(&mut f, true, &crate::sandbox::Applied::default());
        assert_eq!(f.not_enforced.iter().filter(|g| **g == "protected_create").count(), 1);
        let mounted = crate::sandbox::Applied {
            namespaces: vec![crate::sandbox::Namespace::Mount],
            ..crate::sandbox::Applied::default()
        };
        let mut f = crate::sandbox::Plan::Unconfined { abi: 0 }.in_force();
        report_holds(&mut f, true, &mounted);
        assert!(!f.not_enforced.contains(&"protected_create"));
        // A grant lifts its path: nothing to hold there.
        let granted = Guard::new(Grants::new(["/p/.vscode".into()]), Grants::default(), None, []);
        assert!(!holds(&granted, Path::new("/p"), HoldAt::Top)
            .iter()
            .any(|c| c.path() == Path::new("/p/.vscode")));
    }
}
