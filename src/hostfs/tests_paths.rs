//! The path operations on a real directory tree: what the `*at` calls do
//! under the core's walks, and the attacks a child could try on them.

use super::HostFs;
use airlock_core::fsproxy::FsErrorKind;
use airlock_core::pathops::{Kind, PathDone, PathOp, SetAttr};
use airlock_core::policy::{Access, Policy, Root};
use airlock_core::resolve::Refusal;
use airlock_core::scope::Scope;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
    host: HostFs,
    scope: Scope,
}

/// `base/rw` read-write with `base/rw/ro` read-only inside it, `base/rw2`
/// read-write, `base/outside` under no root.
fn tree() -> Tree {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().canonicalize().expect("canonical");
    for d in ["rw/ro", "rw/a/sub", "rw2", "outside"] {
        std::fs::create_dir_all(base.join(d)).expect("mkdir");
    }
    std::fs::write(base.join("rw/ro/keep.txt"), "keep").expect("write");
    std::fs::write(base.join("rw/a/x.txt"), "xyz").expect("write");
    std::fs::write(base.join("outside/secret"), "secret").expect("write");
    let policy = Policy::new(
        base.clone(),
        [
            Root { path: base.join("rw"), access: Access::ReadWrite },
            Root { path: base.join("rw/ro"), access: Access::ReadOnly },
            Root { path: base.join("rw2"), access: Access::ReadWrite },
        ],
    );
    let host = HostFs::new(&policy).expect("roots");
    let scope = Scope::from_roots(policy.roots());
    Tree { _dir: dir, base, host, scope }
}

impl Tree {
    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    fn go(&mut self, op: PathOp) -> Result<PathDone, Refusal> {
        let scope = self.scope.clone();
        self.host.path(&op, &scope)
    }

    fn list_all(&mut self, rel: &str, max: u32) -> Vec<String> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let op = PathOp::List { path: self.p(rel), after: after.clone(), max, max_bytes: 1 << 20 };
            let Ok(PathDone::Listed(page)) = self.go(op) else { panic!("listing {rel}") };
            assert!(page.entries.len() <= max as usize);
            out.extend(page.entries.iter().map(|e| e.name.clone()));
            if !page.more {
                return out;
            }
            after = page.entries.last().map(|e| e.name.clone());
        }
    }
}

fn kind(r: Result<PathDone, Refusal>) -> FsErrorKind {
    r.expect_err("refused").kind()
}

#[test]
fn a_huge_directory_is_listed_in_bounded_pages_in_order() {
    let mut t = tree();
    let big = t.p("rw/big");
    std::fs::create_dir(&big).expect("mkdir");
    let mut want: Vec<String> = (0..2500).map(|i| format!("f{i:05}")).collect();
    for n in &want {
        std::fs::write(big.join(n), "").expect("write");
    }
    // A name that is not UTF-8 is left out.
    std::fs::write(big.join(non_utf8()), "").expect("write");
    want.sort();
    assert_eq!(t.list_all("rw/big", 1000), want);
    assert_eq!(t.list_all("rw/big", 7).len(), 2500);
}

/// A file name that is not UTF-8.
fn non_utf8() -> &'static std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(b"bad\xff")
}

#[test]
fn stat_and_list_resolve_and_decide_where_a_link_leads() {
    let mut t = tree();
    symlink(t.p("outside"), t.p("rw/a/out")).expect("symlink");
    symlink("ro", t.p("rw/tolink")).expect("symlink");
    let stat = |t: &mut Tree, rel: &str, follow| t.go(PathOp::Stat { path: t.p(rel), follow });
    match stat(&mut t, "rw/a/x.txt", true) {
        Ok(PathDone::Stat(s)) => assert_eq!((s.kind, s.size), (Kind::File, 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(kind(stat(&mut t, "rw/a/out/secret", true)), FsErrorKind::Denied);
    assert_eq!(kind(stat(&mut t, "rw/a/out/none", true)), FsErrorKind::Denied);
    assert_eq!(kind(stat(&mut t, "rw/a/none", true)), FsErrorKind::NotFound);
    assert!(matches!(stat(&mut t, "rw/a/out", false), Ok(PathDone::Stat(s)) if s.kind == Kind::Symlink));
    assert_eq!(
        kind(t.go(PathOp::List { path: t.p("rw/a/out"), after: None, max: 10, max_bytes: 100 })),
        FsErrorKind::Denied
    );
    assert_eq!(t.list_all("rw/tolink", 10), ["keep.txt"]);
    assert_eq!(t.list_all("rw", 10), ["a", "ro", "tolink"]);
}

#[test]
fn changes_never_leave_the_roots_nor_touch_a_root() {
    let mut t = tree();
    let rename = |t: &mut Tree, a: &str, b: &str, noreplace| {
        t.go(PathOp::Rename { from: t.p(a), to: t.p(b), noreplace })
    };
    // Across roots: done, with renameat2 between the two descriptors.
    assert!(rename(&mut t, "rw/a/x.txt", "rw2/x.txt", false).is_ok());
    assert_eq!(std::fs::read(t.p("rw2/x.txt")).expect("moved"), b"xyz");
    // Into the read-only root, or out of every root.
    assert!(matches!(rename(&mut t, "rw2/x.txt", "rw/ro/x.txt", false), Err(Refusal::ReadOnly { .. })));
    assert_eq!(kind(rename(&mut t, "rw2/x.txt", "outside/x.txt", false)), FsErrorKind::Denied);
    // A root renamed away, removed, or a directory holding one moved.
    assert_eq!(kind(rename(&mut t, "rw2", "rw/gone", false)), FsErrorKind::Denied);
    assert_eq!(kind(rename(&mut t, "rw/ro", "rw/gone", false)), FsErrorKind::Denied);
    assert_eq!(kind(t.go(PathOp::Remove { path: t.p("rw2") })), FsErrorKind::Denied);
    assert!(t.p("rw2").is_dir() && t.p("rw/ro/keep.txt").is_file());
    // noreplace: RENAME_NOREPLACE; without it, replaced.
    std::fs::write(t.p("rw/a/y.txt"), "y").expect("write");
    std::fs::write(t.p("rw/a/z.txt"), "z").expect("write");
    assert_eq!(kind(rename(&mut t, "rw/a/y.txt", "rw/a/z.txt", true)), FsErrorKind::Conflict);
    assert!(rename(&mut t, "rw/a/y.txt", "rw/a/z.txt", false).is_ok());
    assert_eq!(std::fs::read(t.p("rw/a/z.txt")).expect("replaced"), b"y");
    // mkdir -p, remove of a non-empty directory, of a link itself.
    assert!(t.go(PathOp::Mkdir { path: t.p("rw/n/e/w"), parents: true }).is_ok());
    assert!(t.p("rw/n/e/w").is_dir());
    assert_eq!(kind(t.go(PathOp::Mkdir { path: t.p("rw/n"), parents: false })), FsErrorKind::Conflict);
    assert_eq!(kind(t.go(PathOp::Remove { path: t.p("rw/n") })), FsErrorKind::Conflict);
    symlink(t.p("outside/secret"), t.p("rw/link")).expect("symlink");
    assert!(t.go(PathOp::Remove { path: t.p("rw/link") }).is_ok());
    assert!(t.p("outside/secret").is_file());
    assert!(!t.p("rw/link").exists());
    // mkdir through a link out of the roots makes nothing there.
    symlink(t.p("outside"), t.p("rw/esc")).expect("symlink");
    assert_eq!(kind(t.go(PathOp::Mkdir { path: t.p("rw/esc/made"), parents: true })), FsErrorKind::Denied);
    assert!(!t.p("outside/made").exists());
}

#[test]
fn set_attr_truncates_and_changes_mode_on_the_file_decided_on() {
    let mut t = tree();
    let attr = SetAttr { size: Some(1), mode: Some(0o600), ..SetAttr::default() };
    match t.go(PathOp::SetAttr { path: t.p("rw/a/x.txt"), attr: attr.clone() }) {
        Ok(PathDone::Stat(s)) => assert_eq!((s.size, s.mode), (1, 0o600)),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(t.p("rw/a/x.txt")).expect("read"), b"x");
    assert_eq!(std::fs::metadata(t.p("rw/a/x.txt")).expect("meta").permissions().mode() & 0o777, 0o600);
    assert!(matches!(
        t.go(PathOp::SetAttr { path: t.p("rw/ro/keep.txt"), attr }),
        Err(Refusal::ReadOnly { .. })
    ));
    assert_eq!(std::fs::read(Path::new(&t.p("rw/ro/keep.txt"))).expect("read"), b"keep");
}
