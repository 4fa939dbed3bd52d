//! Path policy: which paths a child may open, and how.
//!
//! This is the lexical half of confinement. It decides, from the path text
//! alone, whether a request names a host file under an allowed root (and
//! which root, and the path relative to it), a file of the session's virtual
//! namespace, or nothing the child may touch. The other half — where the
//! path leads once symlinks are resolved — is decided by the level that owns
//! the files, on the resolved path, against the intersection of every
//! level's policy (`crate::scope`, `crate::resolve`).

use crate::guard::Guard;
use crate::scope::Scope;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

pub mod bytes;
#[cfg(test)]
mod oracle;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Root {
    /// Absolute and lexically normal.
    pub path: PathBuf,
    pub access: Access,
}

/// Index of a root in [`Policy::roots`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RootId(pub usize);

/// Where an allowed path leads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolved {
    /// A host file: `rel` (lexically normal, no `..`, possibly empty for the
    /// root itself) beneath root `root`.
    Host { root: RootId, rel: PathBuf },
    /// A file of the session's in-memory namespace, by normalized name.
    Virtual { name: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    Empty,
    Nul,
    /// A `..` climbs above the working directory a relative path starts in.
    Escape,
    /// An absolute path under no allowed root.
    OutsideRoots,
    /// A write to a path under a read-only root (the root named).
    ReadOnly {
        root: PathBuf,
    },
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Denied::Empty => "empty path",
            Denied::Nul => "path contains a NUL byte",
            Denied::Escape => "path escapes the working directory",
            Denied::OutsideRoots => "path is outside every allowed root",
            Denied::ReadOnly { root } => return write!(f, "path is under read-only root {}", root.display()),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Parts")]
pub struct Policy {
    roots: Vec<Root>,
    cwd: PathBuf,
    /// Protected paths and secret files, with the session's grants and
    /// `--deny` globs: applied on every resolved path (`crate::guard`).
    /// Absent from a policy written before guards, or the plain rule.
    #[serde(default, skip_serializing_if = "Guard::is_plain")]
    guard: Guard,
    /// Each root's [`bytes::spelled_count`], which every resolve would
    /// otherwise derive again.
    #[serde(skip)]
    counts: Vec<Option<usize>>,
}

/// A policy as written (in a trace, say): taken as it is, unnormalized.
#[derive(Deserialize)]
struct Parts {
    roots: Vec<Root>,
    cwd: PathBuf,
    #[serde(default)]
    guard: Guard,
}

impl From<Parts> for Policy {
    fn from(p: Parts) -> Self {
        Policy::kept(p.roots, p.cwd).with_guard(p.guard)
    }
}

/// Lexically normalize `path`: drop `.`, apply `..`. Returns `None` when a
/// `..` would climb above the start of a relative path. For absolute paths
/// `..` at `/` stays at `/`, as the kernel does.
pub fn normalize(path: &Path) -> Option<PathBuf> {
    bytes::normalize(bytes::bytes(path)).map(|v| PathBuf::from(OsString::from_vec(v)))
}

impl Policy {
    /// A policy over `roots` for a process whose working directory is `cwd`.
    /// Relative roots resolve against `cwd`; paths are normalized lexically.
    /// When roots overlap, the most specific one decides, and of two equal
    /// roots the writable one.
    pub fn new(cwd: PathBuf, roots: impl IntoIterator<Item = Root>) -> Self {
        let cwd = normalize(&Path::new("/").join(&cwd)).unwrap_or_else(|| PathBuf::from("/"));
        let mut out: Vec<Root> = Vec::new();
        for r in roots {
            let Some(path) = normalize(&cwd.join(&r.path)) else { continue };
            match out.iter_mut().find(|o| o.path == path) {
                Some(o) => o.access = o.access.max(r.access),
                None => out.push(Root { path, access: r.access }),
            }
        }
        Policy::kept(out, cwd)
    }

    fn kept(roots: Vec<Root>, cwd: PathBuf) -> Self {
        let counts = roots.iter().map(|r| bytes::spelled_count(bytes::bytes(&r.path))).collect();
        Policy { roots, cwd, guard: Guard::default(), counts }
    }

    /// The same roots under `guard` (grants, `--deny` globs, homes).
    pub fn with_guard(mut self, guard: Guard) -> Self {
        self.guard = guard;
        self
    }

    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The scope of this policy: its roots, under its guard.
    pub fn scope(&self) -> Scope {
        Scope::from_roots(&self.roots).with_guard(self.guard.clone())
    }

    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    pub fn root(&self, id: RootId) -> Option<&Root> {
        self.roots.get(id.0)
    }

    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Decide what `path` names for a request that does (`write`) or does
    /// not write.
    pub fn resolve(&self, path: &str, write: bool) -> Result<Resolved, Denied> {
        match self.locate(path, write)? {
            Located::Host { index, abs, root, spelled } => {
                let rel = match (spelled, self.counts[index]) {
                    (true, Some(_)) => bytes::strip_spelled(&abs, bytes::bytes(&root.path)),
                    _ => bytes::strip_prefix(&abs, bytes::bytes(&root.path)).unwrap_or_default(),
                };
                Ok(Resolved::Host { root: RootId(index), rel: PathBuf::from(bytes::os(rel)) })
            }
            Located::Virtual { norm } => {
                let name = std::str::from_utf8(&norm).map_err(|_| Denied::Nul)?;
                if name.is_empty() {
                    // "." names the working directory itself, not a file.
                    return Err(Denied::Empty);
                }
                Ok(Resolved::Virtual { name: name.to_owned() })
            }
        }
    }

    /// Whether [`Policy::resolve`] gives a host file for `path`: the same
    /// decision, without building the path relative to its root.
    pub fn reaches_host(&self, path: &str, write: bool) -> bool {
        matches!(self.locate(path, write), Ok(Located::Host { .. }))
    }

    /// What [`Policy::resolve`] decides before it builds its answer.
    fn locate<'p>(&self, path: &'p str, write: bool) -> Result<Located<'_, 'p>, Denied> {
        if path.is_empty() {
            return Err(Denied::Empty);
        }
        if path.contains('\0') {
            return Err(Denied::Nul);
        }
        let relative = !bytes::is_absolute(path.as_bytes());
        // Split at `/` only, so every name stays valid UTF-8.
        let norm = bytes::normalized(path.as_bytes()).ok_or(Denied::Escape)?;
        let (abs, spelled, norm) = if relative {
            let abs = bytes::join(bytes::bytes(&self.cwd), &norm);
            let spelled = bytes::is_canonical(&abs);
            (Cow::Owned(abs), spelled, Some(norm))
        } else {
            // A normalized absolute path is spelled canonically.
            (norm, true, None)
        };
        let roots = self.roots.iter().zip(self.counts.iter().copied());
        match (bytes::deepest_spelled(&abs, spelled, roots, |r| &r.path), norm) {
            (Some((index, root, _)), _) => {
                if write && root.access == Access::ReadOnly {
                    return Err(Denied::ReadOnly { root: root.path.clone() });
                }
                Ok(Located::Host { index, abs, root, spelled })
            }
            (None, Some(norm)) => Ok(Located::Virtual { norm }),
            (None, None) => Err(Denied::OutsideRoots),
        }
    }
}

/// What a path names, as [`Policy::locate`] finds it.
enum Located<'a, 'p> {
    Host { index: usize, abs: Cow<'p, [u8]>, root: &'a Root, spelled: bool },
    Virtual { norm: Cow<'p, [u8]> },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::Component;

    fn policy() -> Policy {
        Policy::new(
            PathBuf::from("/work/proj"),
            [
                Root { path: "/data".into(), access: Access::ReadOnly },
                Root { path: "/data/out".into(), access: Access::ReadWrite },
                Root { path: "scratch".into(), access: Access::ReadWrite },
            ],
        )
    }

    fn host(root: usize, rel: &str) -> Result<Resolved, Denied> {
        Ok(Resolved::Host { root: RootId(root), rel: rel.into() })
    }

    #[test]
    fn resolves_roots_virtuals_and_refusals() {
        let p = policy();
        assert_eq!(p.resolve("/data/a.txt", false), host(0, "a.txt"));
        assert_eq!(p.resolve("/data/a.txt", true), Err(Denied::ReadOnly { root: "/data".into() }));
        assert_eq!(p.resolve("/data/out/b", true), host(1, "b"));
        assert_eq!(p.resolve("/data/x/../out/b", true), host(1, "b"));
        assert_eq!(p.resolve("scratch/c", true), host(2, "c"));
        assert_eq!(p.resolve("/work/proj/scratch/./c", true), host(2, "c"));
        assert_eq!(p.resolve("notes.txt", true), Ok(Resolved::Virtual { name: "notes.txt".into() }));
        assert_eq!(p.resolve("./a/../notes.txt", false), Ok(Resolved::Virtual { name: "notes.txt".into() }));
        assert_eq!(p.resolve("../proj/notes.txt", false), Err(Denied::Escape));
        assert_eq!(p.resolve("scratch/../../x", false), Err(Denied::Escape));
        assert_eq!(p.resolve("/data/../etc/passwd", false), Err(Denied::OutsideRoots));
        assert_eq!(p.resolve("/etc/passwd", false), Err(Denied::OutsideRoots));
        assert_eq!(p.resolve("/../../data/a", false), host(0, "a"));
        assert_eq!(p.resolve("a\0b", false), Err(Denied::Nul));
        assert_eq!(p.resolve("", false), Err(Denied::Empty));
        assert_eq!(p.resolve(".", false), Err(Denied::Empty));
        assert_eq!(p.resolve("/dataset", false), Err(Denied::OutsideRoots));
    }

    proptest! {
        /// Whatever the text, an allowed host path is beneath its root and
        /// carries no `..`; a virtual name is relative and carries no `..`.
        #[test]
        fn resolution_never_leaves(parts in proptest::collection::vec(prop_oneof![
            Just("..".to_string()), Just(".".to_string()), Just("data".to_string()),
            Just("out".to_string()), Just("scratch".to_string()), Just("".to_string()), "[a-z]{1,3}",
        ], 0..8), absolute in any::<bool>(), write in any::<bool>()) {
            let p = policy();
            let text = format!("{}{}", if absolute { "/" } else { "" }, parts.join("/"));
            match p.resolve(&text, write) {
                Ok(Resolved::Host { root, rel }) => {
                    let r = p.root(root).unwrap();
                    prop_assert!(rel.components().all(|c| matches!(c, Component::Normal(_))));
                    prop_assert!(r.path.join(&rel).starts_with(&r.path));
                    if write { prop_assert_eq!(r.access, Access::ReadWrite); }
                }
                Ok(Resolved::Virtual { name }) => {
                    prop_assert!(!absolute);
                    prop_assert!(Path::new(&name).components().all(|c| matches!(c, Component::Normal(_))));
                }
                Err(_) => {}
            }
        }
    }
}
