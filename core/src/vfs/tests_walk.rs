//! The walk's operations on the in-memory backend, one behaviour each:
//! every answer pinned (the error's code and words, the value, what is
//! left in the tree), so that a change to a branch of `walk.rs` or
//! `memfs.rs` fails a test (docs/verification.md). A swap between the
//! walk's decision and its act is a [`Swapped`] backend.

use crate::resolve::{Entry, Namespace, Refusal};
use crate::vfs::files::Node;
use crate::vfs::memfs::{MemFiles, MemNode};
use crate::vfs::walk::{self, Opened, ProjectNs};
use crate::vfs::{
    DirEntry, EntryKind, FsOp, FsReply, Gate, GrepFile, GrepLine, GrepQuery, GrepResult, Metadata, OpError,
    PolicyConfig, ProjectPath, ToolPolicy,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

const SECRET: &str = "s3cr3t-token";

/// `.` writable, `ro` read-only, `*.key` and directories named `d`
/// denied.
fn gate() -> Gate {
    ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow: vec!["ro".into()],
        allow_rw: vec![".".into()],
        deny: vec!["*.key".into(), "d/".into()],
        env_allow: vec![("TOKEN".into(), Some(SECRET.into()))],
        ..PolicyConfig::default()
    })
    .unwrap()
    .gate()
    .clone()
}

fn p(s: &str) -> ProjectPath {
    ProjectPath::parse(s).unwrap()
}

fn file(s: &str) -> MemNode {
    MemNode::File(s.as_bytes().to_vec())
}

fn link(t: &str) -> MemNode {
    MemNode::Symlink(t.into())
}

fn files(nodes: &[(&str, MemNode)]) -> MemFiles {
    let mut f = MemFiles::new();
    for (path, node) in nodes {
        f.put(path, node.clone());
    }
    f
}

fn tree() -> MemFiles {
    files(&[
        ("f", file("hello\n")),
        ("sub/g", file("g\n")),
        ("ro/r", file("r\n")),
        ("ro/l", link("../f")),
        ("d/s", file("secret\n")),
        ("x.key", file("k\n")),
        ("node", MemNode::Other),
        ("to_f", link("f")),
        ("to_sub", link("sub")),
        ("out", link("/etc")),
        ("loop", link("loop")),
    ])
}

fn read(path: &str) -> FsOp {
    FsOp::Read { path: p(path) }
}
fn write(path: &str, content: &str) -> FsOp {
    FsOp::Write { path: p(path), content: content.as_bytes().to_vec() }
}
fn exists(path: &str) -> FsOp {
    FsOp::Exists { path: p(path) }
}
fn metadata(path: &str) -> FsOp {
    FsOp::Metadata { path: p(path) }
}
fn list(path: &str) -> FsOp {
    FsOp::ListDir { path: p(path) }
}
fn delete(path: &str) -> FsOp {
    FsOp::Delete { path: p(path) }
}
fn rename(from: &str, to: &str) -> FsOp {
    FsOp::Rename { from: p(from), to: p(to) }
}
fn grep(pattern: &str, paths: &[&str]) -> GrepQuery {
    GrepQuery {
        pattern: pattern.into(),
        paths: paths.iter().map(|s| p(s)).collect(),
        extensions: vec![],
        context: 0,
        max_lines: 100,
    }
}

fn content(s: &str) -> Result<FsReply, OpError> {
    Ok(FsReply::Read(s.as_bytes().to_vec()))
}

fn md(kind: EntryKind, size: u64) -> Result<FsReply, OpError> {
    Ok(FsReply::Metadata(Metadata { kind, size }))
}

/// Each op on a fresh [`tree`] with [`gate`]: its answer, and the tree
/// unchanged unless `changes` (the op wrote).
fn check_each(cases: &[(FsOp, Result<FsReply, OpError>)]) {
    for (op, want) in cases {
        let mut f = tree();
        assert_eq!(&op.run(&mut f, &gate()), want, "{op:?}");
        // A refusal changes nothing, whatever the operation: one that
        // acted and then reported the refusal must not pass. A successful
        // write, delete or rename changes the tree; the tests that need
        // its new shape compare it with `tree_with`.
        let changes = matches!(op, FsOp::Write { .. } | FsOp::Delete { .. } | FsOp::Rename { .. });
        if want.is_err() || !changes {
            assert_eq!(f, tree(), "{op:?} changed the tree");
        }
    }
}

/// The project's paths and nodes, for comparing a whole tree.
fn nodes(f: &MemFiles) -> Vec<(String, MemNode)> {
    f.nodes().iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect()
}

/// [`tree`] with `edits` applied.
fn tree_with(edits: &[(&str, Option<MemNode>)]) -> Vec<(String, MemNode)> {
    let mut want = nodes(&tree());
    for (path, node) in edits {
        want.retain(|(k, _)| k != path);
        if let Some(n) = node {
            want.push((path.to_string(), n.clone()));
        }
    }
    want.sort_by(|a, b| a.0.cmp(&b.0));
    want
}

// ---- what each operation answers ----

#[test]
fn read_answers_a_file_and_refuses_everything_else_by_kind() {
    check_each(&[
        (read("f"), content("hello\n")),
        (read("to_f"), content("hello\n")),
        (read("sub"), Err(OpError::invalid("sub is a directory"))),
        (read("."), Err(OpError::invalid(". is a directory"))),
        (read("node"), Err(OpError::invalid("node is not a regular file"))),
        (read("nope"), Err(OpError::not_found("nope does not exist"))),
        (read("x.key"), Err(OpError::denied("path x.key denied: it matches a --deny glob"))),
    ]);
}

#[test]
fn a_file_over_the_limit_is_refused_and_one_at_it_read() {
    let mut g = gate();
    g.set_limits(4, 10);
    let mut f = files(&[("four", file("1234")), ("five", file("12345"))]);
    assert_eq!(read("four").run(&mut f, &g), content("1234"));
    let big = OpError::too_large("file five (5 bytes)", 4);
    assert_eq!(big.message, "file five (5 bytes) exceeds the limit of 4 bytes");
    assert_eq!(read("five").run(&mut f, &g), Err(big));
}

#[test]
fn write_replaces_or_creates_a_file_and_refuses_other_kinds() {
    check_each(&[
        (write(".", "x"), Err(OpError::exists("the project root is a directory"))),
        (write("sub", "x"), Err(OpError::exists("sub is a directory"))),
        (write("node", "x"), Err(OpError::invalid("node is not a regular file"))),
        (
            write("ro/r", "x"),
            Err(OpError::denied("path ro/r denied: it is under a read-only root (--allow)")),
        ),
    ]);
    let mut f = tree();
    assert_eq!(write("f", "new").run(&mut f, &gate()), Ok(FsReply::Done));
    assert_eq!(write("to_f", "again").run(&mut f, &gate()), Ok(FsReply::Done));
    assert_eq!(write("sub/n", "n").run(&mut f, &gate()), Ok(FsReply::Done));
    assert_eq!(nodes(&f), tree_with(&[("f", Some(file("again"))), ("sub/n", Some(file("n")))]));
}

#[test]
fn write_makes_the_directories_on_the_way() {
    let mut f = tree();
    assert_eq!(write("n1/n2/f", "x").run(&mut f, &gate()), Ok(FsReply::Done));
    let made = [("n1", Some(MemNode::Dir)), ("n1/n2", Some(MemNode::Dir)), ("n1/n2/f", Some(file("x")))];
    assert_eq!(nodes(&f), tree_with(&made));
}

#[test]
fn exists_is_false_only_for_a_missing_path_the_gate_allows() {
    check_each(&[
        (exists("f"), Ok(FsReply::Exists(true))),
        (exists("sub"), Ok(FsReply::Exists(true))),
        (exists("to_f"), Ok(FsReply::Exists(true))),
        (exists("nope"), Ok(FsReply::Exists(false))),
        (exists("n/x"), Ok(FsReply::Exists(false))),
        (exists("x.key"), Err(OpError::denied("path x.key denied: it matches a --deny glob"))),
        (exists("d/nope"), Err(OpError::denied("path d/nope denied: it matches a --deny glob"))),
    ]);
}

#[test]
fn metadata_is_of_the_target_by_kind() {
    check_each(&[
        (metadata("f"), md(EntryKind::File, 6)),
        (metadata("to_f"), md(EntryKind::File, 6)),
        (metadata("sub"), md(EntryKind::Dir, 0)),
        (metadata("to_sub"), md(EntryKind::Dir, 0)),
        (metadata("node"), md(EntryKind::Other, 0)),
        (metadata("nope"), Err(OpError::not_found("nope does not exist"))),
    ]);
}

#[test]
fn list_dir_lists_a_directory_only() {
    let entry = |name: &str, kind| DirEntry { path: p(name), kind };
    let sub = Ok(FsReply::ListDir(vec![entry("g", EntryKind::File)]));
    let ro = Ok(FsReply::ListDir(vec![entry("l", EntryKind::Symlink), entry("r", EntryKind::File)]));
    check_each(&[
        (list("sub"), sub.clone()),
        (list("to_sub"), sub),
        (list("ro"), ro),
        (list("f"), Err(OpError::invalid("f is not a directory"))),
        (list("nope"), Err(OpError::not_found("nope does not exist"))),
        (list("d"), Err(OpError::denied("path d denied: it matches a --deny glob"))),
    ]);
}

#[test]
fn the_root_is_listed_without_what_the_gate_refuses() {
    let mut f = files(&[("a", file("")), ("d/s", file("")), ("x.key", file("")), ("e/d", file(""))]);
    let got = list(".").run(&mut f, &gate());
    let names = |r: Result<FsReply, OpError>| match r {
        Ok(FsReply::ListDir(v)) => v.into_iter().map(|e| e.path.as_str().to_string()).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(names(got), ["a", "e"]);
}

#[test]
fn a_deny_glob_for_directories_spares_a_file_of_that_name() {
    let mut f = files(&[("e/d", file("a file\n")), ("d/s", file(""))]);
    assert_eq!(read("e/d").run(&mut f, &gate()), content("a file\n"));
    assert_eq!(
        list("d").run(&mut f, &gate()),
        Err(OpError::denied("path d denied: it matches a --deny glob"))
    );
}

#[test]
fn delete_removes_a_file_or_a_link_itself_never_a_directory() {
    check_each(&[
        (delete("sub"), Err(OpError::invalid("sub is a directory: fs.delete removes files only"))),
        (delete("nope"), Err(OpError::not_found("nope does not exist"))),
        (delete("ro/l"), Err(OpError::denied("path ro/l denied: it is under a read-only root (--allow)"))),
    ]);
    let mut f = tree();
    for path in ["to_f", "out", "node", "sub/g"] {
        assert_eq!(delete(path).run(&mut f, &gate()), Ok(FsReply::Done), "{path}");
    }
    assert_eq!(nodes(&f), tree_with(&[("to_f", None), ("out", None), ("node", None), ("sub/g", None)]));
}

#[test]
fn rename_moves_a_file_or_a_link_and_never_replaces() {
    check_each(&[
        (rename("nope", "n"), Err(OpError::not_found("nope does not exist"))),
        (rename("nope", "f"), Err(OpError::not_found("nope does not exist"))),
        (rename("sub", "n"), Err(OpError::invalid("sub is a directory: fs.rename moves files only"))),
        (rename("f", "sub/g"), Err(OpError::exists("sub/g already exists"))),
        (rename("f", "to_sub"), Err(OpError::exists("to_sub already exists"))),
        (
            rename("f", "ro/n"),
            Err(OpError::denied("path ro/n denied: it is under a read-only root (--allow)")),
        ),
        (
            rename("ro/r", "n"),
            Err(OpError::denied("path ro/r denied: it is under a read-only root (--allow)")),
        ),
    ]);
    let mut f = tree();
    assert_eq!(rename("f", "n1/n2/g").run(&mut f, &gate()), Ok(FsReply::Done));
    assert_eq!(rename("to_sub", "sub/l").run(&mut f, &gate()), Ok(FsReply::Done));
    let want = tree_with(&[
        ("f", None),
        ("n1", Some(MemNode::Dir)),
        ("n1/n2", Some(MemNode::Dir)),
        ("n1/n2/g", Some(file("hello\n"))),
        ("to_sub", None),
        ("sub/l", Some(link("sub"))),
    ]);
    assert_eq!(nodes(&f), want);
}

// ---- the walk: links, directories on the way, refusals ----

#[test]
fn a_symlink_loop_is_refused_after_the_hop_limit() {
    check_each(&[
        (read("loop"), Err(OpError::io("path loop: more than 40 symlinks"))),
        (read("loop/x"), Err(OpError::io("path loop/x: more than 40 symlinks"))),
    ]);
}

#[test]
fn a_link_out_of_the_project_is_denied() {
    let why = "path out denied: a symlink on it leads outside the project";
    check_each(&[(read("out"), Err(OpError::denied(why))), (exists("out"), Err(OpError::denied(why)))]);
}

#[test]
fn with_the_lexical_bug_planted_a_link_out_of_the_project_is_missing() {
    let mut g = gate();
    g.plant_lexical_only();
    assert_eq!(read("out").run(&mut tree(), &g), Err(OpError::not_found("out does not exist")));
}

#[test]
fn a_link_to_a_name_not_utf8_is_denied() {
    let target = PathBuf::from(OsStr::from_bytes(b"n\xff"));
    let mut f = files(&[("bad", MemNode::Symlink(target))]);
    let why = "path bad denied: a symlink on it leads to a name not UTF-8";
    assert_eq!(read("bad").run(&mut f, &gate()), Err(OpError::denied(why)));
    assert_eq!(
        read("bad/x").run(&mut f, &gate()),
        Err(OpError::denied("path bad/x denied: a symlink on it leads to a name not UTF-8"))
    );
}

#[test]
fn a_directory_on_the_way_that_is_a_file_is_not_found() {
    let why = "f/x: a directory on the way is a file";
    check_each(&[
        (read("f/x"), Err(OpError::not_found(why))),
        (write("f/x", ""), Err(OpError::not_found(why))),
    ]);
}

#[test]
fn a_read_does_not_make_a_missing_directory_on_the_way() {
    check_each(&[
        (read("n/x"), Err(OpError::not_found("n/x does not exist"))),
        (delete("n/x"), Err(OpError::not_found("n/x does not exist"))),
    ]);
}

#[test]
fn a_denied_path_is_refused_before_its_directories_are_looked_at() {
    check_each(&[
        (
            write("ro/n/f", ""),
            Err(OpError::denied("path ro/n/f denied: it is under a read-only root (--allow)")),
        ),
        (read("d/n/x"), Err(OpError::denied("path d/n/x denied: it matches a --deny glob"))),
        (read("d/s/x"), Err(OpError::denied("path d/s/x denied: it matches a --deny glob"))),
    ]);
}

#[test]
fn a_link_into_a_denied_place_is_refused_without_naming_it() {
    let mut f = files(&[("d/s", file("secret\n")), ("l", link("d/s"))]);
    let why = "path l denied: a symlink on it leads where a --deny glob matches";
    assert_eq!(read("l").run(&mut f, &gate()), Err(OpError::denied(why)));
}

#[test]
fn resolve_reports_the_path_a_name_leads_to() {
    let mut f = tree();
    let g = gate();
    let resolve = |f: &mut MemFiles, path: &str, follow, write| walk::resolve(f, &g, &p(path), follow, write);
    assert_eq!(resolve(&mut f, "to_f", true, false), Ok((p("f"), Node::File { size: 6 })));
    assert_eq!(resolve(&mut f, "to_f", false, false), Ok((p("to_f"), Node::Symlink("f".into()))));
    // A link not followed is decided on only when it is to be changed.
    assert_eq!(resolve(&mut f, "ro/l", false, false), Ok((p("ro/l"), Node::Symlink("../f".into()))));
    let ro = "path ro/l denied: it is under a read-only root (--allow)";
    assert_eq!(resolve(&mut f, "ro/l", false, true), Err(OpError::denied(ro)));
    assert_eq!(resolve(&mut f, "n/x", true, false), Ok((p("n/x"), Node::Missing)));
    let key = "path x.key denied: it matches a --deny glob";
    assert_eq!(resolve(&mut f, "x.key", true, false), Err(OpError::denied(key)));
}

#[test]
fn the_walk_works_from_a_project_at_the_file_system_root() {
    let g = ToolPolicy::new(&PolicyConfig {
        project: "/".into(),
        allow_rw: vec![".".into()],
        ..Default::default()
    })
    .unwrap()
    .gate()
    .clone();
    let mut f = files(&[("a/b", file("x")), ("l", link("/a/b"))]);
    assert_eq!(read("a/b").run(&mut f, &g), content("x"));
    assert_eq!(read("l").run(&mut f, &g), content("x"));
    assert_eq!(write("a/c", "y").run(&mut f, &g), Ok(FsReply::Done));
    assert_eq!(f.get("a/c"), Some(&file("y")));
}

// ---- a backend's refusals and swaps between the decision and the act ----

/// A change a peer makes to the tree, or a primitive failing.
#[derive(Clone, Debug)]
enum Change {
    Put(&'static str, MemNode),
    Move(&'static str, &'static str),
    Fail(Refusal),
}

/// [`MemFiles`] changed just before the `nth` call of the primitive `on`.
struct Swapped {
    files: MemFiles,
    on: &'static str,
    nth: usize,
    calls: usize,
    change: Option<Change>,
}

impl Swapped {
    fn new(files: MemFiles, on: &'static str, nth: usize, change: Change) -> Self {
        Swapped { files, on, nth, calls: 0, change: Some(change) }
    }

    fn hit(&mut self, primitive: &str) -> Result<(), Refusal> {
        if primitive != self.on {
            return Ok(());
        }
        self.calls += 1;
        if self.calls != self.nth {
            return Ok(());
        }
        match self.change.take() {
            Some(Change::Put(path, node)) => self.files.put(path, node),
            Some(Change::Move(from, to)) => assert!(self.files.move_tree(&p(from), &p(to))),
            Some(Change::Fail(r)) => return Err(r),
            None => {}
        }
        Ok(())
    }
}

impl Namespace for Swapped {
    type Dir = ProjectPath;
    fn anchor(&mut self, index: usize) -> Result<ProjectPath, Refusal> {
        self.hit("anchor")?;
        self.files.anchor(index)
    }
    fn lookup(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Entry<ProjectPath>, Refusal> {
        self.hit("lookup")?;
        self.files.lookup(dir, name)
    }
}

impl ProjectNs for Swapped {
    fn stat(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Node, Refusal> {
        self.hit("stat")?;
        self.files.stat(dir, name)
    }
    fn read(&mut self, dir: &ProjectPath, name: &OsStr, max: usize) -> Result<Opened<Vec<u8>>, Refusal> {
        self.hit("read")?;
        self.files.read(dir, name, max)
    }
    fn write(&mut self, dir: &ProjectPath, name: &OsStr, content: &[u8]) -> Result<Opened<()>, Refusal> {
        self.hit("write")?;
        self.files.write(dir, name, content)
    }
    fn open_dir(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Opened<ProjectPath>, Refusal> {
        self.hit("open_dir")?;
        self.files.open_dir(dir, name)
    }
    fn list(&mut self, dir: &ProjectPath) -> Result<Vec<(String, Node)>, Refusal> {
        self.hit("list")?;
        self.files.list(dir)
    }
    fn mkdir(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<(), Refusal> {
        self.hit("mkdir")?;
        self.files.mkdir(dir, name)
    }
    fn unlink(&mut self, dir: &ProjectPath, name: &OsStr) -> Result<Opened<()>, Refusal> {
        self.hit("unlink")?;
        self.files.unlink(dir, name)
    }
    fn rename(
        &mut self,
        from_dir: &ProjectPath,
        from: &OsStr,
        to_dir: &ProjectPath,
        to: &OsStr,
    ) -> Result<Opened<bool>, Refusal> {
        self.hit("rename")?;
        self.files.rename(from_dir, from, to_dir, to)
    }
}

/// `op` on [`tree`] changed just before the `nth` call of `on`, with
/// `g`: the answer, once the change happened.
fn swapped_with(
    g: &Gate,
    on: &'static str,
    nth: usize,
    change: Change,
    op: FsOp,
) -> Result<FsReply, OpError> {
    let mut s = Swapped::new(tree(), on, nth, change.clone());
    let got = op.run(&mut s, g);
    assert!(s.change.is_none(), "{change:?} before {on} #{nth} never happened in {op:?}");
    got
}

fn swapped(on: &'static str, change: Change, op: FsOp) -> Result<FsReply, OpError> {
    swapped_with(&gate(), on, 1, change, op)
}

#[test]
fn a_refusal_of_the_backend_is_worded_for_the_path() {
    let fail = Change::Fail;
    let outside = Refusal::Outside { path: "/x".into(), denied_by: None, via: None };
    let read_only = Refusal::ReadOnly { path: "/x".into(), root: "/".into(), via: None };
    let beyond = "path f denied: it is outside the project";
    let cases = [
        ("stat", fail(Refusal::NotFound), read("f"), Err(OpError::not_found("f does not exist"))),
        ("stat", fail(Refusal::TooManyLinks), read("f"), Err(OpError::io("path f: more than 40 symlinks"))),
        ("stat", fail(Refusal::Denied("no".into())), read("f"), Err(OpError::denied("path f denied: no"))),
        ("stat", fail(Refusal::Fs("disk".into())), read("f"), Err(OpError::io("f: disk"))),
        ("stat", fail(outside), read("f"), Err(OpError::denied(beyond))),
        ("stat", fail(read_only), read("f"), Err(OpError::denied(beyond))),
        ("lookup", fail(Refusal::Fs("disk".into())), read("sub/g"), Err(OpError::io("sub/g: disk"))),
        ("anchor", fail(Refusal::Fs("disk".into())), list("."), Err(OpError::io(".: disk"))),
        (
            "mkdir",
            fail(Refusal::Denied("ro fs".into())),
            write("n/f", ""),
            Err(OpError::denied("path n/f denied: ro fs")),
        ),
        ("read", fail(Refusal::Fs("eio".into())), read("f"), Err(OpError::io("f: eio"))),
        ("write", fail(Refusal::Fs("eio".into())), write("f", ""), Err(OpError::io("f: eio"))),
        ("list", fail(Refusal::Fs("eio".into())), list("sub"), Err(OpError::io("sub: eio"))),
    ];
    for (on, change, op, want) in cases {
        assert_eq!(swapped(on, change, op.clone()), want, "{on} {op:?}");
    }
}

#[test]
fn a_name_swapped_before_the_act_fails_closed() {
    let changed = |path: &str| Err(OpError::io(format!("{path} changed while it was in use")));
    let gone = |path: &str| Err(OpError::not_found(format!("{path} does not exist")));
    let dir = || MemNode::Dir;
    let cases = [
        ("read", Change::Put("f", dir()), read("f"), changed("f")),
        ("read", Change::Move("f", "gone"), read("f"), gone("f")),
        ("write", Change::Put("f", dir()), write("f", "x"), changed("f")),
        ("open_dir", Change::Put("sub", file("")), list("sub"), changed("sub")),
        ("open_dir", Change::Move("sub", "gone"), list("sub"), gone("sub")),
        ("unlink", Change::Put("f", dir()), delete("f"), changed("f")),
        ("unlink", Change::Move("f", "gone"), delete("f"), gone("f")),
        ("rename", Change::Put("f", dir()), rename("f", "g2"), changed("f")),
        ("rename", Change::Move("f", "gone"), rename("f", "g2"), gone("f")),
        ("rename", Change::Put("g2", file("")), rename("f", "g2"), Err(OpError::exists("g2 already exists"))),
    ];
    for (on, change, op, want) in cases {
        assert_eq!(swapped(on, change, op.clone()), want, "{on} {op:?}");
    }
}

#[test]
fn a_delete_decided_on_a_missing_name_does_not_act() {
    let mut s = Swapped::new(tree(), "unlink", 1, Change::Put("nope", file("late")));
    assert_eq!(delete("nope").run(&mut s, &gate()), Err(OpError::not_found("nope does not exist")));
    assert!(s.change.is_some(), "unlink was called");
}

/// With the planted bug that reaches the parent again by its path, `a`
/// swapped for a link to `target` after the decision on `a/b/f`.
fn reopened(target: &'static str) -> Result<FsReply, OpError> {
    let mut g = gate();
    g.plant_reopen_by_path();
    let f = files(&[
        ("a/b/f", file("a")),
        ("d/b/f", file("denied")),
        ("x/d/b/f", file("x/d")),
        ("x/y", MemNode::Dir),
        ("q/b/f", file("q")),
        ("file", file("")),
    ]);
    let mut s = Swapped::new(f, "anchor", 2, Change::Put("a", link(target)));
    let got = read("a/b/f").run(&mut s, &g);
    assert!(s.change.is_none(), "the parent was never reached again");
    got
}

#[test]
fn with_the_reopen_bug_planted_the_act_follows_a_parent_swapped_for_a_link() {
    let gone = Err(OpError::not_found("a/b/f does not exist"));
    assert_eq!(reopened("d"), content("denied"));
    assert_eq!(reopened("/p/d"), content("denied"));
    assert_eq!(reopened("x//y/../d"), content("x/d"));
    // An absolute target out of the project is nothing there.
    assert_eq!(reopened("/q"), gone);
    assert_eq!(reopened("file"), gone);
    assert_eq!(reopened("a"), Err(OpError::io("path a/b/f: more than 40 symlinks")));
}

#[test]
fn with_the_reopen_bug_planted_the_parent_is_reached_again_by_path() {
    let mut g = gate();
    g.plant_reopen_by_path();
    let mut f = files(&[("a/b/f", file("a")), ("f", file("root"))]);
    assert_eq!(read("a/b/f").run(&mut f, &g), content("a"));
    assert_eq!(read("f").run(&mut f, &g), content("root"));
}

#[test]
fn the_reopen_follows_as_many_links_as_the_walk_and_no_more() {
    let mut g = gate();
    g.plant_reopen_by_path();
    // `a` and `hops - 1` links after it, the last to `d`.
    let chain = |hops: usize| {
        let mut f = files(&[("d/f", file("end"))]);
        for i in 1..hops {
            let next = if i + 1 < hops { format!("c{}", i + 1) } else { "d".into() };
            f.put(&format!("c{i}"), MemNode::Symlink(next.into()));
        }
        let first: &'static str = if hops > 1 { "c1" } else { "d" };
        let mut s = Swapped::new(f, "anchor", 2, Change::Put("a", link(first)));
        s.files.put("a/f", file("a"));
        read("a/f").run(&mut s, &g)
    };
    assert_eq!(chain(40), content("end"));
    assert_eq!(chain(41), Err(OpError::io("path a/f: more than 40 symlinks")));
}

// ---- fs.grep ----

fn grep_run(f: &mut MemFiles, g: &Gate, q: &GrepQuery) -> Result<GrepResult, OpError> {
    match FsOp::Grep(q.clone()).run(f, g)? {
        FsReply::Grep(r) => Ok(r),
        other => panic!("{other:?}"),
    }
}

/// The files a grep matched in, in order.
fn matched(r: &GrepResult) -> Vec<&str> {
    r.matches.iter().map(|m| m.path.as_str()).collect()
}

fn hit_tree() -> MemFiles {
    files(&[
        ("a.rs", file("hit\n")),
        ("b.txt", file("hit\n")),
        ("s/c.rs", file("hit\n")),
        ("s/d/e.rs", file("hit\n")),
        ("s/x.key", file("hit\n")),
        ("s/l", link("../a.rs")),
        ("s/z/e.rs", file("hit\n")),
        ("t/f.rs", file("hit\n")),
    ])
}

#[test]
fn grep_searches_every_path_given_in_order() {
    let r = grep_run(&mut hit_tree(), &gate(), &grep("hit", &["t", "a.rs", "s"])).unwrap();
    assert_eq!(matched(&r), ["t/f.rs", "a.rs", "s/c.rs", "s/z/e.rs"]);
    assert!(!r.truncated);
    let line = GrepLine { line_number: 1, content: "hit".into(), is_match: true };
    assert_eq!(r.matches[0], GrepFile { path: p("t/f.rs"), lines: vec![line] });
}

#[test]
fn grep_skips_a_given_link_and_refuses_a_missing_path() {
    let mut f = hit_tree();
    assert_eq!(grep_run(&mut f, &gate(), &grep("hit", &["s/l"])), Ok(GrepResult::default()));
    assert_eq!(
        grep_run(&mut f, &gate(), &grep("hit", &["nope"])),
        Err(OpError::not_found("nope does not exist"))
    );
    let bad = grep_run(&mut f, &gate(), &grep("(", &["."])).unwrap_err();
    assert!(bad.message.starts_with("pattern is not a valid regex: "), "{bad:?}");
}

#[test]
fn grep_searches_only_the_extensions_asked_for() {
    let q = GrepQuery { extensions: vec!["txt".into()], ..grep("hit", &["."]) };
    assert_eq!(matched(&grep_run(&mut hit_tree(), &gate(), &q).unwrap()), ["b.txt"]);
}

#[test]
fn grep_skips_a_file_over_the_limit_and_searches_one_at_it() {
    let mut g = gate();
    g.set_limits(4, 100);
    let mut f = files(&[("a", file("h")), ("b", file("h\nxx")), ("c", file("h\nxxx"))]);
    assert_eq!(matched(&grep_run(&mut f, &g, &grep("^h$", &["."])).unwrap()), ["a", "b"]);
}

#[test]
fn grep_searches_content_scrubbed() {
    let mut f = files(&[("a", file(&format!("t={SECRET}\n")))]);
    let r = grep_run(&mut f, &gate(), &grep("t=", &["."])).unwrap();
    assert_eq!(r.matches[0].lines[0].content, "t=[REDACTED]");
    assert_eq!(grep_run(&mut f, &gate(), &grep("s3cr3t", &["."])), Ok(GrepResult::default()));
}

#[test]
fn a_full_budget_deep_in_a_tree_stops_the_search() {
    let q = GrepQuery { max_lines: 1, ..grep("hit", &["s", "t"]) };
    let r = grep_run(&mut hit_tree(), &gate(), &q).unwrap();
    assert_eq!(matched(&r), ["s/c.rs"]);
    assert!(r.truncated);
}

#[test]
fn grep_skips_what_changed_since_it_was_listed() {
    let all = grep_run(&mut tree(), &gate(), &grep(".", &["."])).unwrap();
    assert_eq!(matched(&all), ["f", "ro/r", "sub/g"]);
    let found = |on, nth, change| match swapped_with(&gate(), on, nth, change, FsOp::Grep(grep(".", &["."])))
    {
        Ok(FsReply::Grep(r)) => matched(&r).join(" "),
        other => panic!("{other:?}"),
    };
    // `f` swapped for a directory between the listing and its read.
    assert_eq!(found("read", 1, Change::Put("f", MemNode::Dir)), "ro/r sub/g");
    // `ro` moved away between the listing and its opening, or unlistable.
    assert_eq!(found("open_dir", 2, Change::Move("ro", "gone")), "f sub/g");
    assert_eq!(found("list", 2, Change::Fail(Refusal::Fs("eio".into()))), "f sub/g");
}

// ---- the in-memory backend itself ----

#[test]
fn putting_a_file_beside_another_keeps_it_and_the_root_stays() {
    let mut f = files(&[("a/x", file("1")), ("a/y", file("2"))]);
    f.put(".", file("not the root"));
    f.put("../z", file("outside"));
    let want = [("", MemNode::Dir), ("a", MemNode::Dir), ("a/x", file("1")), ("a/y", file("2"))];
    assert_eq!(nodes(&f), want.map(|(k, v)| (k.to_string(), v)));
    assert_eq!(f.content_bytes(), 2);
    assert_eq!(f.get("a/y"), Some(&file("2")));
    assert_eq!(f.get("a/z"), None);
}

#[test]
fn move_tree_moves_a_whole_tree_and_nothing_beside_it() {
    let mut f = files(&[("a/x", file("1")), ("a/y/z", file("2")), ("a-b", file("3")), ("ab", file("4"))]);
    assert!(f.move_tree(&p("a"), &p("n")));
    let want = [
        ("", MemNode::Dir),
        ("a-b", file("3")),
        ("ab", file("4")),
        ("n", MemNode::Dir),
        ("n/x", file("1")),
        ("n/y", MemNode::Dir),
        ("n/y/z", file("2")),
    ];
    assert_eq!(nodes(&f), want.map(|(k, v)| (k.to_string(), v)));
}

#[test]
fn move_tree_refuses_what_rename_would_and_changes_nothing() {
    let base = files(&[("a/x", file("1")), ("b", file("2")), ("c/k", file("3"))]);
    let cases = [
        (ProjectPath::ROOT, p("z")),
        (p("a"), p("b")),
        (p("a"), p("c")),
        (p("nope"), p("z")),
        (p("a"), p("m/z")),
        (p("a"), p("b/z")),
        (p("a"), p("a/x2")),
        (p("a"), ProjectPath::ROOT),
    ];
    for (from, to) in cases {
        let mut f = base.clone();
        assert!(!f.move_tree(&from, &to), "{from} -> {to}");
        assert_eq!(f, base, "{from} -> {to}");
    }
}

#[test]
fn the_in_memory_backend_has_one_anchor() {
    let mut f = MemFiles::new();
    assert_eq!(f.anchor(0), Ok(ProjectPath::ROOT));
    assert_eq!(f.anchor(1), Err(Refusal::Fs("unknown anchor".into())));
}

#[test]
fn a_name_not_utf8_is_refused_by_every_primitive() {
    let mut f = files(&[("a", file("1"))]);
    let (root, bad, a) = (ProjectPath::ROOT, OsStr::from_bytes(b"\xff"), OsStr::new("a"));
    let not_utf8 = || Refusal::Denied("name is not UTF-8".into());
    assert_eq!(f.stat(&root, bad), Ok(Node::Missing));
    assert!(matches!(f.lookup(&root, bad), Ok(Entry::Missing)));
    assert_eq!(f.read(&root, bad, 10), Err(Refusal::NotFound));
    assert_eq!(f.write(&root, bad, b""), Err(not_utf8()));
    assert_eq!(f.open_dir(&root, bad), Err(Refusal::NotFound));
    assert_eq!(f.mkdir(&root, bad), Err(not_utf8()));
    assert_eq!(f.unlink(&root, bad), Err(Refusal::NotFound));
    assert_eq!(f.rename(&root, bad, &root, a), Err(Refusal::NotFound));
    assert_eq!(f.rename(&root, a, &root, bad), Err(not_utf8()));
    assert_eq!(f, files(&[("a", file("1"))]));
}

#[test]
fn the_root_is_never_written_over() {
    let mut f = MemFiles::new();
    assert_eq!(f.write(&ProjectPath::ROOT, OsStr::new("."), b"x"), Ok(Opened::Changed));
    assert_eq!(f, MemFiles::new());
}
