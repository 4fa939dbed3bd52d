//! The cap-std backend of `airlock tool` and the core's in-memory backend
//! agree: random trees (files, directories, symlinks inside, outside, to
//! `.env` files and dangling) and random operations give the same results
//! (error codes compared, not messages) and leave the same trees.

use airlock::tool::capfs::CapFiles;
use airlock_core::vfs::memfs::{MemFiles, MemNode};
use airlock_core::vfs::{FsOp, GrepQuery, PolicyConfig, ProjectFiles, ProjectPath, ToolPolicy};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const NAMES: [&str; 6] = ["a", "b", "n.txt", ".env", "x.key", "d"];

#[derive(Clone, Debug)]
enum Kind {
    File(&'static str),
    Dir,
    /// Relative target, or `None` for an absolute one into the project
    /// (`Some` relative targets may climb out with `..`).
    Link(LinkTo),
}

#[derive(Clone, Debug)]
enum LinkTo {
    Rel(String),
    AbsInside(String),
    AbsOutside,
}

const CONTENTS: [&str; 5] =
    ["foo\nbar\n", "", "bin\0foo\n", "hit foo\nmiss\nfoo bar\n", "one\ntwo\nthree\nfour foo\n"];

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&NAMES[..]), 1..4).prop_map(|v| v.join("/"))
}

fn op_path() -> impl Strategy<Value = String> {
    prop_oneof![Just(".".to_string()), rel_path()]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => prop::sample::select(&CONTENTS[..]).prop_map(Kind::File),
        2 => Just(Kind::Dir),
        1 => prop_oneof![
            rel_path().prop_map(LinkTo::Rel),
            rel_path().prop_map(|p| LinkTo::Rel(format!("../{p}"))),
            rel_path().prop_map(LinkTo::AbsInside),
            Just(LinkTo::AbsOutside),
        ]
        .prop_map(Kind::Link),
    ]
}

/// A path of the tree (most of the time, so operations meet what exists),
/// its parent, or any path.
fn pick(tree: &[(String, Kind)], sel: (u8, prop::sample::Index), fresh: String) -> String {
    match (sel.0, tree.is_empty()) {
        (0..=4, false) => tree[sel.1.index(tree.len())].0.clone(),
        (5..=6, false) => {
            let p = &tree[sel.1.index(tree.len())].0;
            p.rsplit_once('/').map_or(".".to_string(), |(d, _)| d.to_string())
        }
        _ => fresh,
    }
}

type OpSeed = (u8, (u8, prop::sample::Index), String, (u8, prop::sample::Index), String, usize, usize);

fn op() -> impl Strategy<Value = OpSeed> {
    (
        0u8..9,
        (0u8..10, any::<prop::sample::Index>()),
        op_path(),
        (0u8..10, any::<prop::sample::Index>()),
        op_path(),
        0usize..5,
        0usize..3,
    )
}

fn build_op(project: &Path, (k, p, q, i, ctx): (u8, String, String, usize, usize)) -> Option<FsOp> {
    let pp = ProjectPath::parse(&p).ok()?;
    let qq = ProjectPath::parse(&q).ok()?;
    let _ = project;
    Some(match k {
        0 => FsOp::Read { path: pp },
        1 => FsOp::Write { path: pp, content: CONTENTS[i].as_bytes().to_vec() },
        2 => FsOp::Exists { path: pp },
        3 => FsOp::Metadata { path: pp },
        4 => FsOp::ListDir { path: pp },
        5 => FsOp::Delete { path: pp },
        6 => FsOp::Rename { from: pp, to: qq },
        _ => FsOp::Grep(GrepQuery {
            pattern: ["foo", "o+", "^t", "bar$", "."][i].to_string(),
            paths: vec![pp],
            extensions: if ctx == 2 { vec!["txt".into()] } else { vec![] },
            context: ctx,
            max_lines: 10_000,
        }),
    })
}

/// Create `path` on disk as `MemFiles::put` does in memory: parents made
/// directories (replacing what was there), the node replacing any old one.
fn put_real(root: &Path, path: &str, node: &MemNode) {
    let full = root.join(path);
    let mut dir = root.to_path_buf();
    if let Some(parent) = Path::new(path).parent() {
        for c in parent.components() {
            dir.push(c);
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    std::fs::remove_file(&dir).unwrap();
                    std::fs::create_dir(&dir).unwrap();
                }
                Err(_) => std::fs::create_dir(&dir).unwrap(),
            }
        }
    }
    match std::fs::symlink_metadata(&full) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&full).unwrap(),
        Ok(_) => std::fs::remove_file(&full).unwrap(),
        Err(_) => {}
    }
    match node {
        MemNode::File(b) => std::fs::write(&full, b).unwrap(),
        MemNode::Dir => std::fs::create_dir(&full).unwrap(),
        MemNode::Symlink(t) => std::os::unix::fs::symlink(t, &full).unwrap(),
        MemNode::Other => unreachable!(),
    }
}

/// The tree on disk, in the in-memory backend's terms.
fn snapshot(root: &Path) -> BTreeMap<String, MemNode> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeMap<String, MemNode>) {
        let dir = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let name = e.file_name().into_string().unwrap();
            let p = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let full = root.join(&p);
            let m = std::fs::symlink_metadata(&full).unwrap();
            if m.is_symlink() {
                out.insert(p, MemNode::Symlink(std::fs::read_link(&full).unwrap()));
            } else if m.is_dir() {
                out.insert(p.clone(), MemNode::Dir);
                walk(root, &p, out);
            } else {
                out.insert(p, MemNode::File(std::fs::read(&full).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

fn mem_snapshot(m: &MemFiles) -> BTreeMap<String, MemNode> {
    m.nodes().iter().filter(|(k, _)| !k.is_root()).map(|(k, v)| (k.as_str().to_string(), v.clone())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn cap_std_and_in_memory_backends_agree(
        tree in prop::collection::vec((rel_path(), kind()), 0..12),
        ops in prop::collection::vec(op(), 1..12),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let project = std::fs::canonicalize(dir.path()).unwrap().join("p");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(dir.path().join("outside.txt"), "outside foo\n").unwrap();
        let mut mem = MemFiles::new();
        for (path, k) in &tree {
            let node = match k {
                Kind::File(c) => MemNode::File(c.as_bytes().to_vec()),
                Kind::Dir => MemNode::Dir,
                Kind::Link(LinkTo::Rel(t)) => MemNode::Symlink(PathBuf::from(t)),
                Kind::Link(LinkTo::AbsInside(t)) => MemNode::Symlink(project.join(t)),
                Kind::Link(LinkTo::AbsOutside) => MemNode::Symlink(dir.path().join("outside.txt")),
            };
            mem.put(path, node.clone());
            put_real(&project, path, &node);
        }
        prop_assert_eq!(snapshot(&project), mem_snapshot(&mem), "set-up differs");
        let policy = ToolPolicy::new(&PolicyConfig {
            project: project.clone(),
            allow: vec![".".into()],
            allow_rw: vec!["a".into(), "n.txt".into()],
            deny: vec!["*.key".into()],
            path_env: "/usr/bin:/bin".into(),
            ..Default::default()
        }).unwrap();
        let gate = policy.gate();
        let mut cap = CapFiles::open(&project).unwrap();
        for o in ops {
            let (k, ps, pf, qs, qf, i, ctx) = o;
            let seed = (k, pick(&tree, ps, pf), pick(&tree, qs, qf), i, ctx);
            let Some(op) = build_op(&project, seed) else { continue };
            let a = op.run(&mut mem, gate);
            let b = op.run(&mut cap, gate);
            match (&a, &b) {
                (Ok(x), Ok(y)) => prop_assert_eq!(x, y, "{:?}", op),
                (Err(x), Err(y)) => prop_assert_eq!(x.code, y.code, "{:?}: {} vs {}", op, x, y),
                _ => prop_assert!(false, "{:?}: in-memory {:?}, cap-std {:?}", op, a, b),
            }
            prop_assert_eq!(snapshot(&project), mem_snapshot(&mem), "trees differ after {:?}", op);
        }
        prop_assert_eq!(std::fs::read(dir.path().join("outside.txt")).unwrap(), b"outside foo\n".to_vec());
    }
}

#[test]
fn a_fifo_in_the_project_does_not_hang_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let project = std::fs::canonicalize(dir.path()).unwrap();
    let fifo = project.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let policy = ToolPolicy::new(&PolicyConfig { project: project.clone(), ..Default::default() }).unwrap();
    let mut cap = CapFiles::open(&project).unwrap();
    let path = ProjectPath::parse("pipe").unwrap();
    let r = cap.read(policy.gate(), &path);
    assert!(r.is_err(), "{r:?}");
    let g = FsOp::Grep(GrepQuery {
        pattern: "x".into(),
        paths: vec![ProjectPath::ROOT],
        extensions: vec![],
        context: 0,
        max_lines: 10,
    })
    .run(&mut cap, policy.gate());
    assert!(matches!(g, Ok(airlock_core::vfs::FsReply::Grep(ref r)) if r.matches.is_empty()), "{g:?}");
}
