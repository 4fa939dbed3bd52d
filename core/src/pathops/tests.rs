//! The path operations over an in-memory namespace: what each decides on,
//! refused against missing, and the attacks on roots and rules.

use super::*;
use crate::policy::Access;
use crate::resolve::{Entry, Namespace};
use crate::scope::Rule;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;

#[derive(Clone, Debug, PartialEq, Eq)]
enum N {
    Dir,
    File(u64),
    Link(PathBuf),
}

/// Absolute paths to nodes; a directory handle is its path.
#[derive(Default, Debug)]
struct Mem {
    nodes: BTreeMap<PathBuf, N>,
    anchors: Vec<PathBuf>,
}

impl Namespace for Mem {
    type Dir = PathBuf;
    fn anchor(&mut self, index: usize) -> Result<PathBuf, Refusal> {
        self.anchors.get(index).cloned().ok_or(Refusal::Fs("anchor".into()))
    }
    fn lookup(&mut self, dir: &PathBuf, name: &OsStr) -> Result<Entry<PathBuf>, Refusal> {
        let p = dir.join(name);
        Ok(match self.nodes.get(&p) {
            Some(N::Dir) => Entry::Dir(p),
            Some(N::File(_)) => Entry::NotDir,
            Some(N::Link(t)) => Entry::Symlink(t.clone()),
            None => Entry::Missing,
        })
    }
}

fn at(dir: &Path, name: &OsStr) -> PathBuf {
    if name == "." {
        dir.to_path_buf()
    } else {
        dir.join(name)
    }
}

impl PathNs for Mem {
    fn inspect(&mut self, dir: &PathBuf, name: &OsStr) -> Result<Option<Node<PathBuf>>, Refusal> {
        let p = at(dir, name);
        Ok(self.nodes.get(&p).map(|n| match n {
            N::Dir => Node { stat: FileStat::of(Kind::Dir, 0), dir: Some(p.clone()), target: None },
            N::File(size) => Node { stat: FileStat::of(Kind::File, *size), dir: None, target: None },
            N::Link(t) => Node { stat: FileStat::of(Kind::Symlink, 0), dir: None, target: Some(t.clone()) },
        }))
    }

    fn list(
        &mut self,
        dir: &PathBuf,
        after: Option<&[u8]>,
        max: usize,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Page, Refusal> {
        let mut page = Page::default();
        for (p, n) in &self.nodes {
            if p.parent() != Some(dir.as_path()) {
                continue;
            }
            let name = p.file_name().unwrap_or_default().as_bytes();
            if after.is_some_and(|a| name <= a) || !keep(name) {
                continue;
            }
            if page.entries.len() == max {
                page.more = true;
                break;
            }
            let (kind, size) = match n {
                N::Dir => (Kind::Dir, 0),
                N::File(s) => (Kind::File, *s),
                N::Link(_) => (Kind::Symlink, 0),
            };
            page.entries.push(DirEntry { name: String::from_utf8_lossy(name).into_owned(), kind, size });
        }
        Ok(page)
    }

    fn mkdir(&mut self, dir: &PathBuf, name: &OsStr) -> Result<(), Refusal> {
        let p = dir.join(name);
        if self.nodes.contains_key(&p) {
            return Err(Refusal::Conflict("exists".into()));
        }
        self.nodes.insert(p, N::Dir);
        Ok(())
    }

    fn remove(&mut self, dir: &PathBuf, name: &OsStr, is_dir: bool) -> Result<(), Refusal> {
        let p = dir.join(name);
        match self.nodes.get(&p) {
            None => Err(Refusal::NotFound),
            Some(N::Dir) if !is_dir => Err(Refusal::Conflict("is a directory".into())),
            Some(N::Dir) if self.nodes.keys().any(|k| k.parent() == Some(p.as_path())) => {
                Err(Refusal::Conflict("not empty".into()))
            }
            Some(_) => {
                self.nodes.remove(&p);
                Ok(())
            }
        }
    }

    fn rename(
        &mut self,
        fd: &PathBuf,
        from: &OsStr,
        td: &PathBuf,
        to: &OsStr,
        noreplace: bool,
    ) -> Result<(), Refusal> {
        let (f, t) = (fd.join(from), td.join(to));
        if noreplace && self.nodes.contains_key(&t) {
            return Err(Refusal::Conflict("exists".into()));
        }
        if t.starts_with(&f) && t != f {
            return Err(Refusal::Conflict("into itself".into()));
        }
        let moved: Vec<(PathBuf, N)> = self
            .nodes
            .iter()
            .filter(|(k, _)| k.starts_with(&f))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if moved.is_empty() {
            return Err(Refusal::NotFound);
        }
        for (k, _) in &moved {
            self.nodes.remove(k);
        }
        for (k, v) in moved {
            let rest = k.strip_prefix(&f).unwrap_or(Path::new(""));
            self.nodes.insert(if rest.as_os_str().is_empty() { t.clone() } else { t.join(rest) }, v);
        }
        Ok(())
    }

    fn set_attr(
        &mut self,
        dir: &PathBuf,
        name: &OsStr,
        _: &FileStat,
        attr: &SetAttr,
    ) -> Result<FileStat, Refusal> {
        let p = at(dir, name);
        match self.nodes.get_mut(&p) {
            Some(N::File(size)) => {
                if let Some(s) = attr.size {
                    *size = s;
                }
                Ok(FileStat::of(Kind::File, *size))
            }
            Some(N::Dir) => Ok(FileStat::of(Kind::Dir, 0)),
            _ => Err(Refusal::NotFound),
        }
    }
}

/// Roots `/d` (read-write, with `/d/ro` read-only and `/d/rw2` a second
/// root) and the file root `/f/one.txt`; the anchors a shell would hold.
fn world() -> Mem {
    let mut m =
        Mem { anchors: vec!["/d".into(), "/d/ro".into(), "/d/rw2".into(), "/f".into()], ..Mem::default() };
    for d in ["/", "/d", "/d/ro", "/d/rw2", "/d/a", "/d/a/sub", "/d/hold", "/d/hold/inner", "/f", "/etc"] {
        m.nodes.insert(d.into(), N::Dir);
    }
    for (f, n) in
        [("/d/ro/keep.txt", 4), ("/d/a/x.txt", 3), ("/f/one.txt", 3), ("/f/two.txt", 3), ("/etc/passwd", 9)]
    {
        m.nodes.insert(f.into(), N::File(n));
    }
    m.nodes.insert("/d/tolink".into(), N::Link("ro".into()));
    m.nodes.insert("/d/out".into(), N::Link("/etc".into()));
    m.nodes.insert("/d/a/loop".into(), N::Link("loop".into()));
    m
}

const RO: Option<Access> = Some(Access::ReadOnly);
const RW: Option<Access> = Some(Access::ReadWrite);

fn scope_of(rules: &[(&str, Option<Access>)]) -> Scope {
    Scope::from_rules(rules.iter().map(|(p, a)| Rule { path: p.into(), access: *a }))
}

fn scope() -> Scope {
    scope_of(&[("/d", RW), ("/d/ro", RO), ("/d/rw2", RW), ("/f/one.txt", RW)])
}

fn go(m: &mut Mem, s: &Scope, op: PathOp) -> Result<PathDone, Refusal> {
    let anchors = m.anchors.clone();
    perform(m, &anchors, &[], s, &op)
}

fn stat_op(p: &str, follow: bool) -> PathOp {
    PathOp::Stat { path: p.into(), follow }
}

fn list_op(p: &str, after: Option<&str>, max: u32) -> PathOp {
    PathOp::List { path: p.into(), after: after.map(str::to_owned), max, max_bytes: 1 << 20 }
}

fn rename_op(from: &str, to: &str) -> PathOp {
    PathOp::Rename { from: from.into(), to: to.into(), noreplace: false }
}

fn kind_of(r: Result<PathDone, Refusal>) -> Kind {
    match r {
        Ok(PathDone::Stat(s)) => s.kind,
        other => panic!("not a stat: {other:?}"),
    }
}

fn names(r: Result<PathDone, Refusal>) -> (Vec<String>, bool) {
    match r {
        Ok(PathDone::Listed(p)) => (p.entries.into_iter().map(|e| e.name).collect(), p.more),
        other => panic!("not a listing: {other:?}"),
    }
}

fn fs_kind(r: Result<PathDone, Refusal>) -> crate::fsproxy::FsErrorKind {
    r.expect_err("refused").kind()
}

#[test]
fn stat_follows_decides_on_the_target_and_tells_refused_from_missing() {
    use crate::fsproxy::FsErrorKind as K;
    let (mut m, s) = (world(), scope());
    assert_eq!(kind_of(go(&mut m, &s, stat_op("/d/a/x.txt", true))), Kind::File);
    assert_eq!(kind_of(go(&mut m, &s, stat_op("/d", true))), Kind::Dir);
    assert_eq!(kind_of(go(&mut m, &s, stat_op("/d/tolink", true))), Kind::Dir);
    assert_eq!(kind_of(go(&mut m, &s, stat_op("/d/tolink", false))), Kind::Symlink);
    // Missing where the scope reaches: missing; on the way too.
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/d/a/none", true))), K::NotFound);
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/d/none/deeper", true))), K::NotFound);
    // Out of the scope, there or not: refused, never "missing".
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/d/out/passwd", true))), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/d/out/none", true))), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/f/two.txt", true))), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &s, stat_op("/d/a/loop", true))), K::Denied);
    // A link out of the scope, looked at itself, is the link's.
    assert_eq!(kind_of(go(&mut m, &s, stat_op("/d/out", false))), Kind::Symlink);
    // A narrowing denying a subtree denies its stat whatever is there.
    let narrow = s.intersect(&scope_of(&[("/d", RW), ("/d/a", None)]));
    assert_eq!(fs_kind(go(&mut m, &narrow, stat_op("/d/a/x.txt", true))), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &narrow, stat_op("/d/a/none/x", true))), K::Denied);
}

#[test]
fn a_listing_is_paged_and_shows_only_what_the_scope_reaches() {
    let (mut m, s) = (world(), scope());
    let all = names(go(&mut m, &s, list_op("/d", None, 100)));
    assert_eq!(all.0, ["a", "hold", "out", "ro", "rw2", "tolink"]);
    assert!(!all.1);
    let (first, more) = names(go(&mut m, &s, list_op("/d", None, 2)));
    assert_eq!((first.as_slice(), more), (&["a".to_owned(), "hold".to_owned()][..], true));
    let (next, _) = names(go(&mut m, &s, list_op("/d", Some("hold"), 2)));
    assert_eq!(next, ["out", "ro"]);
    // A denied subtree is left out; a listing through a link lists its target.
    let narrow = s.intersect(&scope_of(&[("/d", RW), ("/d/a", None), ("/d/a/sub", RO)]));
    let (shown, _) = names(go(&mut m, &narrow, list_op("/d", None, 100)));
    assert_eq!(shown, ["a", "hold", "out", "ro", "rw2", "tolink"], "a leads to a rule that reaches");
    let narrow = s.intersect(&scope_of(&[("/d", RW), ("/d/a", None)]));
    let (shown, _) = names(go(&mut m, &narrow, list_op("/d", None, 100)));
    assert!(!shown.contains(&"a".to_owned()), "{shown:?}");
    assert_eq!(names(go(&mut m, &s, list_op("/d/tolink", None, 100))).0, ["keep.txt"]);
    // A file root's directory is not the root's to list.
    assert_eq!(fs_kind(go(&mut m, &s, list_op("/f", None, 100))), crate::fsproxy::FsErrorKind::Denied);
    // A file is no directory.
    assert!(matches!(go(&mut m, &s, list_op("/d/a/x.txt", None, 100)), Err(Refusal::Conflict(_))));
    // Cut by bytes of names, never below one entry.
    let op = PathOp::List { path: "/d".into(), after: None, max: 100, max_bytes: 1 };
    assert_eq!(names(go(&mut m, &s, op)), (vec!["a".to_owned()], true));
}

#[test]
fn mkdir_decides_every_directory_it_makes() {
    let (mut m, s) = (world(), scope());
    assert!(go(&mut m, &s, PathOp::Mkdir { path: "/d/new".into(), parents: false }).is_ok());
    assert!(matches!(
        go(&mut m, &s, PathOp::Mkdir { path: "/d/new".into(), parents: false }),
        Err(Refusal::Conflict(_))
    ));
    assert!(go(&mut m, &s, PathOp::Mkdir { path: "/d/new".into(), parents: true }).is_ok());
    assert_eq!(
        go(&mut m, &s, PathOp::Mkdir { path: "/d/p/q/r".into(), parents: false }),
        Err(Refusal::NotFound)
    );
    assert!(go(&mut m, &s, PathOp::Mkdir { path: "/d/p/q/r".into(), parents: true }).is_ok());
    assert!(m.nodes.contains_key(Path::new("/d/p/q/r")));
    // Into the read-only root, directly or through a link: refused, and
    // nothing made on the way.
    for p in ["/d/ro/n", "/d/tolink/n/m", "/d/out/n"] {
        let r = go(&mut m, &s, PathOp::Mkdir { path: p.into(), parents: true });
        assert_eq!(fs_kind(r), crate::fsproxy::FsErrorKind::Denied, "{p}");
    }
    assert!(!m.nodes.keys().any(|k| k.starts_with("/d/ro/n") || k.starts_with("/etc/n")));
    // A narrowing read-only beneath: the deeper directory is refused, the
    // one above it may be made.
    let narrow = s.intersect(&scope_of(&[("/d", RW), ("/d/w/frozen", RO)]));
    let r = go(&mut m, &narrow, PathOp::Mkdir { path: "/d/w/frozen/x".into(), parents: true });
    assert!(matches!(r, Err(Refusal::ReadOnly { .. })), "{r:?}");
    assert!(!m.nodes.contains_key(Path::new("/d/w/frozen")));
}

#[test]
fn remove_takes_the_name_itself_and_never_a_root() {
    use crate::fsproxy::FsErrorKind as K;
    let (mut m, s) = (world(), scope());
    // The link, not its target.
    assert!(go(&mut m, &s, PathOp::Remove { path: "/d/tolink".into() }).is_ok());
    assert!(m.nodes.contains_key(Path::new("/d/ro/keep.txt")));
    assert!(go(&mut m, &s, PathOp::Remove { path: "/d/out".into() }).is_ok());
    assert!(m.nodes.contains_key(Path::new("/etc/passwd")));
    for root in ["/d", "/d/ro", "/d/rw2", "/f"] {
        assert_eq!(fs_kind(go(&mut m, &s, PathOp::Remove { path: root.into() })), K::Denied, "{root}");
        assert!(m.nodes.contains_key(Path::new(root)));
    }
    assert_eq!(fs_kind(go(&mut m, &s, PathOp::Remove { path: "/d/ro/keep.txt".into() })), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &s, PathOp::Remove { path: "/d/hold".into() })), K::Conflict);
    assert_eq!(fs_kind(go(&mut m, &s, PathOp::Remove { path: "/d/none".into() })), K::NotFound);
    assert_eq!(fs_kind(go(&mut m, &s, PathOp::Remove { path: "/f/two.txt".into() })), K::Denied);
    assert!(go(&mut m, &s, PathOp::Remove { path: "/f/one.txt".into() }).is_ok());
    assert!(go(&mut m, &s, PathOp::Remove { path: "/d/hold/inner".into() }).is_ok());
}

#[test]
fn rename_never_moves_a_rule_or_a_root_nor_files_in_under_one() {
    use crate::fsproxy::FsErrorKind as K;
    let (mut m, s) = (world(), scope());
    // Across two roots: done, both ends decided.
    assert!(go(&mut m, &s, rename_op("/d/a/x.txt", "/d/rw2/x.txt")).is_ok());
    assert!(m.nodes.contains_key(Path::new("/d/rw2/x.txt")));
    // Into or out of the read-only root, through a link or not.
    assert!(matches!(
        go(&mut m, &s, rename_op("/d/rw2/x.txt", "/d/tolink/x.txt")),
        Err(Refusal::ReadOnly { .. })
    ));
    assert!(matches!(go(&mut m, &s, rename_op("/d/ro/keep.txt", "/d/k.txt")), Err(Refusal::ReadOnly { .. })));
    // Out of every root.
    assert_eq!(fs_kind(go(&mut m, &s, rename_op("/d/rw2/x.txt", "/d/out/x.txt"))), K::Denied);
    // A root renamed away, replaced, or a directory holding one.
    assert_eq!(fs_kind(go(&mut m, &s, rename_op("/d/rw2", "/d/gone"))), K::Denied);
    assert_eq!(fs_kind(go(&mut m, &s, rename_op("/d/hold", "/d/rw2"))), K::Denied);
    let s2 = scope_of(&[("/", RW), ("/d/ro", RO)]);
    assert_eq!(fs_kind(go(&mut m, &s2, rename_op("/d", "/moved"))), K::Denied);
    // A directory with a narrower rule beneath it stays, and none moves
    // in under a rule it was never decided by.
    let narrow = s.intersect(&scope_of(&[("/d", RW), ("/d/hold/inner", RO), ("/d/zone/sealed", None)]));
    assert_eq!(fs_kind(go(&mut m, &narrow, rename_op("/d/hold", "/d/h2"))), K::Denied);
    assert!(m.nodes.contains_key(Path::new("/d/hold/inner")));
    assert_eq!(fs_kind(go(&mut m, &narrow, rename_op("/d/a", "/d/zone"))), K::Denied);
    // A file may move beside such rules.
    m.nodes.insert("/d/hold/f".into(), N::File(1));
    assert!(go(&mut m, &narrow, rename_op("/d/hold/f", "/d/zone2")).is_ok());
    // A plain directory moves whole; noreplace keeps what is there.
    assert!(go(&mut m, &s, rename_op("/d/a", "/d/b")).is_ok());
    assert!(m.nodes.contains_key(Path::new("/d/b/sub")));
    let op = PathOp::Rename { from: "/d/b".into(), to: "/d/hold".into(), noreplace: true };
    assert_eq!(fs_kind(go(&mut m, &s, op)), K::Conflict);
    assert_eq!(fs_kind(go(&mut m, &s, rename_op("/d/none", "/d/x"))), K::NotFound);
    // The single-file root may be replaced, not moved out of reach.
    assert_eq!(fs_kind(go(&mut m, &s, rename_op("/f/one.txt", "/f/two.txt"))), K::Denied);
}

#[test]
fn set_attr_follows_and_decides_for_a_change() {
    let (mut m, s) = (world(), scope());
    let op =
        |p: &str| PathOp::SetAttr { path: p.into(), attr: SetAttr { size: Some(1), ..SetAttr::default() } };
    assert_eq!(go(&mut m, &s, op("/d/a/x.txt")), Ok(PathDone::Stat(FileStat::of(Kind::File, 1))));
    assert!(matches!(go(&mut m, &s, op("/d/tolink/keep.txt")), Err(Refusal::ReadOnly { .. })));
    assert_eq!(m.nodes.get(Path::new("/d/ro/keep.txt")), Some(&N::File(4)));
    assert!(matches!(go(&mut m, &s, op("/d/a")), Err(Refusal::Conflict(_))));
}

#[test]
fn trim_keeps_order_and_one_entry() {
    let e = |n: &str| DirEntry { name: n.into(), kind: Kind::File, size: 0 };
    let page = Page { entries: vec![e("aaaa"), e("bb"), e("c")], more: false };
    assert_eq!(trim(page.clone(), 10, 100), page);
    let t = trim(page.clone(), 10, 6);
    assert_eq!((t.entries.len(), t.more), (2, true));
    let t = trim(page.clone(), 1, 100);
    assert_eq!((t.entries.len(), t.more), (1, true));
    let t = trim(page, 10, 0);
    assert_eq!((t.entries.len(), t.more), (1, true));
}

#[derive(Clone, Debug)]
enum Step {
    Mkdir(usize, bool),
    Remove(usize),
    Rename(usize, usize),
    Link(usize, usize),
}

const PATHS: [&str; 10] = [
    "/d/a",
    "/d/a/sub",
    "/d/ro/x",
    "/d/tolink",
    "/d/rw2/y",
    "/d/hold",
    "/d/out",
    "/f/one.txt",
    "/d/z",
    "/etc",
];

proptest! {
    /// Whatever a client makes, removes, renames, and an attacker links
    /// between steps, nothing under the read-only root or outside the
    /// scope changes, and every anchor stays where it was.
    #[test]
    fn nothing_outside_the_scope_or_read_only_ever_changes(steps in proptest::collection::vec(
        prop_oneof![
            (0usize..10, any::<bool>()).prop_map(|(p, b)| Step::Mkdir(p, b)),
            (0usize..10).prop_map(Step::Remove),
            (0usize..10, 0usize..10).prop_map(|(a, b)| Step::Rename(a, b)),
            (0usize..10, 0usize..10).prop_map(|(a, b)| Step::Link(a, b)),
        ],
        0..40,
    )) {
        let (mut m, s) = (world(), scope());
        let frozen = |m: &Mem| -> Vec<(PathBuf, N)> {
            m.nodes.iter().filter(|(k, _)| !k.starts_with("/d") || k.starts_with("/d/ro")).map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let before = frozen(&m);
        for step in steps {
            match step {
                Step::Mkdir(p, parents) => { let _ = go(&mut m, &s, PathOp::Mkdir { path: PATHS[p].into(), parents }); }
                Step::Remove(p) => { let _ = go(&mut m, &s, PathOp::Remove { path: PATHS[p].into() }); }
                Step::Rename(a, b) => { let _ = go(&mut m, &s, rename_op(PATHS[a], PATHS[b])); }
                // The attacker (outside airlock) swaps a name in the
                // read-write part for a link anywhere.
                Step::Link(a, b) => {
                    let site = PathBuf::from(PATHS[a]);
                    if site.starts_with("/d") && !site.starts_with("/d/ro") && !m.anchors.contains(&site) {
                        m.nodes.retain(|k, _| !k.starts_with(&site));
                        m.nodes.insert(site, N::Link(PATHS[b].into()));
                    }
                }
            }
            for a in &m.anchors {
                prop_assert_eq!(m.nodes.get(a), Some(&N::Dir), "anchor {:?} moved", a);
            }
        }
        let after: Vec<(PathBuf, N)> = frozen(&m).into_iter().filter(|(k, _)| !k.starts_with("/f/one.txt")).collect();
        let before: Vec<(PathBuf, N)> = before.into_iter().filter(|(k, _)| !k.starts_with("/f/one.txt")).collect();
        prop_assert_eq!(after, before);
    }
}
