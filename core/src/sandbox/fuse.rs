//! Which roots the confinement serves as filesystems inside the mount
//! view (see [`crate::fuse`]), and what that adds to the Landlock rules
//! and the report.
//!
//! A directory root is mounted at its own path unless it lies beneath
//! another mounted root (that mount serves it: the scope decides each
//! name, the deepest rule first), is `/`, or holds a location the view
//! needs itself (`/tmp`, `/usr`, the session's socket...): a filesystem
//! mounted there would hide it. A file root is never mounted (a mount
//! needs a directory to stand on, and one at its parent would hide the
//! parent's other names); it stays reachable through the proxy.
//!
//! Landlock grants each mounted root, and each root beneath it, at its own
//! path with its own access (read and execute, or everything): the
//! filesystem decides per name, so Landlock only has to let the child
//! reach it. The host paths themselves are never granted: inside the
//! view, that path *is* the mount.

use super::{Applied, Grant, Mount, PathRule, Ruleset, Source, View};
use crate::policy::{Access, Root};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One root mounted as a filesystem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseMount {
    /// Where it is mounted: the root's own (physical) path.
    pub path: PathBuf,
    /// The index of its root in the policy.
    pub root: usize,
}

/// What the confinement stage is asked to mount, and how it hands the
/// mounts' descriptors to airlock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusePlan {
    pub mounts: Vec<FuseMount>,
    /// Every root at or beneath a mount, with its access: what Landlock
    /// grants once the mounts are in place.
    pub grants: Vec<Root>,
    /// The stage's end of the socket it sends each mount's `/dev/fuse`
    /// descriptor over (a descriptor it inherits).
    pub socket_fd: i32,
    /// The owner of the mounts (`user_id=`, `group_id=`: airlock's ids,
    /// mapped to themselves in the user namespace).
    pub uid: u32,
    pub gid: u32,
}

/// The roots to mount: `roots` with, for each, whether it is a directory
/// on the host (the shell looks), for a child seeing `view`. `direct`:
/// files inside a root granted for direct reads (a program's script named
/// on its command line); the root's mount serves them as well, and should
/// the mount fail their binds below it still do.
pub fn mounts(roots: &[(Root, bool)], view: &View, direct: &[PathBuf]) -> Vec<FuseMount> {
    // Paths the view places: a mount above one would hide it. The
    // working directory's placeholder is no such path (the root serves it).
    let placed: Vec<&Path> = view
        .mounts
        .iter()
        .filter(|m| !matches!(m, Mount::Dir { .. }))
        .map(Mount::path)
        .filter(|p| !direct.iter().any(|d| d == p))
        .collect();
    let mut dirs: Vec<(usize, &Root)> =
        roots.iter().enumerate().filter(|(_, (_, is_dir))| *is_dir).map(|(i, (r, _))| (i, r)).collect();
    // Shallowest first, so an outer root is chosen before one inside it.
    dirs.sort_by_key(|(_, r)| (r.path.components().count(), r.path.clone()));
    let mut out: Vec<FuseMount> = Vec::new();
    for (index, root) in dirs {
        let path = &root.path;
        if path.parent().is_none() || placed.iter().any(|p| p.starts_with(path)) {
            continue;
        }
        if out.iter().any(|m| path.starts_with(&m.path)) {
            continue;
        }
        out.push(FuseMount { path: path.clone(), root: index });
    }
    out
}

/// The roots at or beneath `mounts`, with their access, for Landlock.
pub fn grants(roots: &[Root], mounts: &[FuseMount]) -> Vec<Root> {
    roots.iter().filter(|r| mounts.iter().any(|m| r.path.starts_with(&m.path))).cloned().collect()
}

impl FusePlan {
    /// The Landlock rules for the mounts `mounted` (the stage's report of
    /// what it mounted): each granted root beneath one of them.
    pub fn rules(&self, abi: u32, mounted: &[PathBuf]) -> Vec<PathRule> {
        self.grants
            .iter()
            .filter(|g| mounted.iter().any(|m| g.path.starts_with(m)))
            .map(|g| {
                let grant = match g.access {
                    Access::ReadOnly => Grant::ReadExec,
                    Access::ReadWrite => Grant::ReadWrite,
                };
                let rights = grant.rights().into_iter().filter(|r| r.since() <= abi).collect();
                PathRule { path: g.path.clone(), grant, rights, source: Source::Served }
            })
            .collect()
    }
}

/// Add the rules for what the stage mounted to `ruleset`.
pub fn grant_mounted(ruleset: &mut Ruleset, plan: Option<&FusePlan>, applied: &Applied) {
    if let Some(plan) = plan {
        let rules = plan.rules(ruleset.abi, &applied.fuse);
        ruleset.paths.extend(rules);
    }
}

/// Whether the roots are served as a filesystem as the plan wanted: the
/// report lists `fuse` under `not_enforced` otherwise.
pub fn served(plan: Option<&FusePlan>, applied: &Applied) -> bool {
    match plan {
        Some(p) if !p.mounts.is_empty() => p.mounts.iter().all(|m| applied.fuse.contains(&m.path)),
        _ => false,
    }
}

/// Why the roots are served through the proxy alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotServed {
    /// `--no-fuse`.
    Disabled,
    /// Without the mount namespace there is no view to mount in.
    NoMountNamespace,
    /// A nested airlock reaches files through its upstream only.
    Nested,
    /// The stage could not mount (no `/dev/fuse`, a refused mount).
    Failed(String),
}

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotServed::Disabled => f.write_str("--no-fuse"),
            NotServed::NoMountNamespace => f.write_str("no mount namespace"),
            NotServed::Nested => f.write_str("a nested airlock serves through its upstream only"),
            NotServed::Failed(m) => f.write_str(m),
        }
    }
}

/// Say in the report what the served filesystem is: the mounts in force,
/// and `fuse` under `not_enforced` when a directory root (`dir_roots`)
/// is reachable through the proxy alone.
pub fn report(
    f: &mut super::InForce,
    plan: Option<&FusePlan>,
    applied: &Applied,
    dir_roots: bool,
    why: Option<NotServed>,
) {
    f.fuse = applied.fuse.clone();
    if !dir_roots {
        return;
    }
    let reason = match (why, served(plan, applied)) {
        (Some(w), _) => Some(w.to_string()),
        (None, true) => None,
        (None, false) => Some(applied.fuse_error.clone().unwrap_or_else(|| match plan {
            None => "no root could be mounted".to_owned(),
            Some(_) if applied.has(super::Namespace::Mount) => "not every root was mounted".to_owned(),
            Some(_) => NotServed::NoMountNamespace.to_string(),
        })),
    };
    if let Some(r) = reason {
        f.not_enforced.push("fuse");
        f.fuse_reason = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{view, ViewInputs};

    fn root(p: &str, rw: bool) -> Root {
        Root { path: p.into(), access: if rw { Access::ReadWrite } else { Access::ReadOnly } }
    }

    #[test]
    fn directory_roots_are_mounted_unless_covered_or_covering() {
        let view = view(&ViewInputs::new("/work/proj".into()));
        let roots = [
            (root("/work/proj", true), true),
            (root("/work/proj/sub", false), true),
            (root("/work/notes.txt", true), false),
            (root("/tmp", true), true),
            (root("/tmp/scratch", true), true),
            (root("/", false), true),
            (root("/usr/share/doc", false), true),
        ];
        let m = mounts(&roots, &view, &[]);
        let paths: Vec<&Path> = m.iter().map(|m| m.path.as_path()).collect();
        assert_eq!(paths, [Path::new("/tmp/scratch"), Path::new("/work/proj"), Path::new("/usr/share/doc")]);
        let g = grants(&roots.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(), &m);
        assert!(g.contains(&root("/work/proj/sub", false)));
        assert!(!g.iter().any(|r| r.path == Path::new("/work/notes.txt")));
    }

    #[test]
    fn a_direct_read_inside_a_root_does_not_keep_it_from_being_mounted() {
        let mut inputs = ViewInputs::new("/work/proj".into());
        inputs.read_only.push("/work/proj/agent.py".into());
        let view = view(&inputs);
        let roots = [(root("/work/proj", true), true)];
        assert!(mounts(&roots, &view, &[]).is_empty(), "a bind the mount would hide");
        let m = mounts(&roots, &view, &["/work/proj/agent.py".into()]);
        assert_eq!(m.iter().map(|m| m.path.as_path()).collect::<Vec<_>>(), [Path::new("/work/proj")]);
    }

    #[test]
    fn landlock_grants_only_what_was_mounted() {
        let plan = FusePlan {
            mounts: vec![FuseMount { path: "/p".into(), root: 0 }, FuseMount { path: "/q".into(), root: 1 }],
            grants: vec![root("/p", true), root("/p/ro", false), root("/q", false)],
            socket_fd: 5,
            uid: 0,
            gid: 0,
        };
        let rules = plan.rules(7, &["/p".into()]);
        let got: Vec<(&Path, Grant)> = rules.iter().map(|r| (r.path.as_path(), r.grant)).collect();
        assert_eq!(got, [(Path::new("/p"), Grant::ReadWrite), (Path::new("/p/ro"), Grant::ReadExec)]);
        let applied = Applied { fuse: vec!["/p".into()], ..Applied::default() };
        assert!(!served(Some(&plan), &applied));
        let all = Applied { fuse: vec!["/p".into(), "/q".into()], ..Applied::default() };
        assert!(served(Some(&plan), &all));
        assert!(!served(None, &all));
    }
}
