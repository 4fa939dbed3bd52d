//! The host's parts on their own (paths, policy, the in-memory files,
//! grep results), beside the machine's tests in `tests.rs`. Many are here
//! because a mutant of the part's code went unnoticed otherwise
//! (docs/verification.md).

use crate::vfs::memfs::{MemFiles, MemNode};
use crate::vfs::{
    EntryKind, Gate, GrepFile, GrepLine, GrepResult, PolicyConfig, ProjectFiles, ProjectPath, ToolPolicy,
};

fn policy() -> ToolPolicy {
    ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow: vec![".".into()],
        allow_rw: vec![".".into()],
        env_allow: vec![("MY_TOKEN".into(), Some("v-1".into()))],
        ..PolicyConfig::default()
    })
    .unwrap()
}

fn gate() -> Gate {
    policy().gate().clone()
}

#[test]
fn only_the_root_is_the_root() {
    assert!(ProjectPath::ROOT.is_root());
    assert!(ProjectPath::parse(".").unwrap().is_root());
    assert!(!ProjectPath::parse("a").unwrap().is_root());
}

#[test]
fn grep_content_bytes_sums_every_line() {
    let line = |s: &str| GrepLine { line_number: 1, content: s.into(), is_match: true };
    let r = GrepResult {
        matches: vec![
            GrepFile { path: ProjectPath::parse("a").unwrap(), lines: vec![line("abc"), line("de")] },
            GrepFile { path: ProjectPath::parse("b").unwrap(), lines: vec![line("")] },
        ],
        truncated: false,
    };
    assert_eq!(r.content_bytes(), 5);
    assert_eq!(GrepResult::default().content_bytes(), 0);
}

#[test]
fn replacing_a_directory_removes_its_tree_and_nothing_beside_it() {
    let mut f = MemFiles::new();
    for p in ["a/x", "a/y/z", "a-b", "a.c", "ab", "b"] {
        f.put(p, MemNode::File(b"1".to_vec()));
    }
    f.put("a", MemNode::File(b"2".to_vec()));
    let left: Vec<&str> = f.nodes().keys().map(ProjectPath::as_str).collect();
    assert_eq!(left, ["", "a", "a-b", "a.c", "ab", "b"]);
}

#[test]
fn metadata_of_a_missing_path_is_not_found() {
    let mut f = MemFiles::new();
    f.put("d/f", MemNode::File(b"123".to_vec()));
    let g = gate();
    let md = |f: &mut MemFiles, p: &str| f.metadata(&g, &ProjectPath::parse(p).unwrap());
    assert!(md(&mut f, "nope").is_err());
    assert!(md(&mut f, "d/nope").is_err());
    assert_eq!(md(&mut f, "d/f").unwrap().kind, EntryKind::File);
    assert_eq!(md(&mut f, "d").unwrap().kind, EntryKind::Dir);
}

#[test]
fn substitution_takes_names_with_underscores_and_refuses_others() {
    let p = policy();
    assert_eq!(p.substitute("Bearer ${MY_TOKEN}!").unwrap(), "Bearer v-1!");
    assert!(p.substitute("${MY-TOKEN}").is_err());
    assert!(p.substitute("${}").is_err());
}

#[test]
fn each_policy_error_names_the_flag_and_the_value() {
    use crate::vfs::PolicyError;
    let err = |cfg: PolicyConfig| ToolPolicy::new(&cfg).unwrap_err().to_string();
    let base = || PolicyConfig { project: "/p".into(), ..PolicyConfig::default() };
    assert_eq!(err(PolicyConfig { project: "p".into(), ..base() }), "project root p is not absolute");
    assert_eq!(
        err(PolicyConfig { allow: vec!["/elsewhere".into()], ..base() }),
        "root \"/elsewhere\" is outside the project"
    );
    let deny = PolicyError::BadDeny { glob: "a{".into(), why: "unclosed".into() };
    assert_eq!(deny.to_string(), "--deny \"a{\": unclosed");
    let url = PolicyError::BadUrlPrefix { prefix: "ftp://x".into(), why: "not http".into() };
    assert_eq!(url.to_string(), "--allow-url \"ftp://x\": not http");
}

#[test]
fn a_tool_path_is_checked_lexically_before_any_gate() {
    let p = policy();
    assert_eq!(p.project_path("a/./b").unwrap().as_str(), "a/b");
    assert!(p.project_path(".").unwrap().is_root());
    for bad in ["../x", "a/../../x", "/etc/passwd", "a\0b"] {
        assert!(p.project_path(bad).is_err(), "{bad:?}");
    }
}
