//! The host's parts on their own (paths, policy, the in-memory files,
//! grep results), beside the machine's tests in `tests.rs`. Many are here
//! because a mutant of the part's code went unnoticed otherwise
//! (docs/verification.md).

use crate::vfs::memfs::{MemFiles, MemNode};
use crate::vfs::{
    EntryKind, Gate, GrepFile, GrepLine, GrepQuery, GrepResult, PolicyConfig, ProjectFiles, ProjectPath,
    ToolPolicy,
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
    assert_eq!(r.line_count(), 3);
    assert_eq!(GrepResult::default().content_bytes(), 0);
    assert_eq!(GrepResult::default().line_count(), 0);
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
    let invalid = |v: &str| {
        let e = p.substitute(v).unwrap_err();
        assert_eq!(e.code, crate::codec::jsonrpc::ErrorCode::InvalidParams, "{v}: {e:?}");
        e.message
    };
    assert_eq!(invalid("${MY-TOKEN}"), "${MY-TOKEN} is not a variable name");
    assert_eq!(invalid("${}"), "${} is not a variable name");
    assert_eq!(invalid("a ${MY_TOKEN"), "unterminated ${ in a header value");
    assert_eq!(p.substitute("${MY_TOKEN}${MY_TOKEN}").unwrap(), "v-1v-1");
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

#[test]
fn programs_and_urls_without_any_allowance_are_denied_saying_so() {
    let p = policy();
    let e = p.check_program("git").unwrap_err();
    assert_eq!(e.message, "process.run of \"git\" denied: no --allow-cmd allows any program");
    let e = p.check_url("http://127.0.0.1/").unwrap_err();
    assert_eq!(
        e.message,
        "url \"http://127.0.0.1/\" denied: no --allow-host or --allow-url allows any network access"
    );
}

#[test]
fn an_empty_or_nul_root_and_a_prefix_with_a_query_or_dot_segments_are_refused() {
    use crate::vfs::PolicyError;
    let with = |allow: &str, url: &str| {
        ToolPolicy::new(&PolicyConfig {
            project: "/p".into(),
            allow: vec![allow.into()],
            allow_url: vec![url.into()],
            ..PolicyConfig::default()
        })
    };
    let ok_url = "http://h/api/";
    assert_eq!(with("", ok_url).unwrap_err(), PolicyError::RootOutsideProject(String::new()));
    assert_eq!(with("a\0b", ok_url).unwrap_err(), PolicyError::RootOutsideProject("a\0b".into()));
    let bad = |url: &str| match with(".", url).unwrap_err() {
        PolicyError::BadUrlPrefix { prefix, why } if prefix == url => why,
        other => panic!("{url}: {other:?}"),
    };
    assert_eq!(bad("http://h/a?x=1"), "a prefix has no query");
    assert_eq!(bad("http://h/a/../b/"), "dot segments");
    assert_eq!(bad("http://h/./b/"), "dot segments");
    assert!(with(".", ok_url).is_ok());
}

#[test]
fn the_gate_names_each_rule_for_the_path_and_through_a_link() {
    let p = ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow: vec!["ro".into()],
        allow_rw: vec!["rw".into()],
        ..PolicyConfig::default()
    })
    .unwrap();
    let g = p.gate();
    let path = |s: &str| ProjectPath::parse(s).unwrap();
    let no_root = g.check(&path("elsewhere/f"), false, false).unwrap_err();
    assert_eq!(no_root.message, "path elsewhere/f denied: it is under no --allow or --allow-rw root");
    let ro = g.check(&path("ro/f"), true, false).unwrap_err();
    assert_eq!(ro.message, "path ro/f denied: it is under a read-only root (--allow)");
    assert!(g.check(&path("ro/f"), false, false).is_ok() && g.check(&path("rw/f"), true, false).is_ok());
    let linked = g.check_as(&path("elsewhere/f"), &path("rw/link"), false, false).unwrap_err();
    assert_eq!(
        linked.message,
        "path rw/link denied: a symlink on it leads under no --allow or --allow-rw root"
    );
    let linked = g.check_as(&path("ro/f"), &path("rw/link"), true, false).unwrap_err();
    assert_eq!(linked.message, "path rw/link denied: a symlink on it leads under a read-only root (--allow)");
}

#[test]
fn the_gate_holds_its_limits() {
    let mut g = gate();
    g.set_limits(10, 7);
    assert_eq!(g.max_grep_lines(), 7);
    let p = ProjectPath::parse("a/b").unwrap();
    assert!(g.check_write_size(&p, 10).is_ok());
    let e = g.check_write_size(&p, 11).unwrap_err();
    assert_eq!(e.message, "content for a/b (11 bytes) exceeds the limit of 10 bytes");
    assert_eq!(p.to_path(), std::path::PathBuf::from("a/b"));
}

#[test]
fn kinds_and_the_paths_an_op_names() {
    use crate::vfs::files::Node;
    use crate::vfs::FsOp;
    assert_eq!(Node::Other.kind(), EntryKind::Other);
    assert_eq!(Node::Missing.kind(), EntryKind::Other);
    assert_eq!(EntryKind::Other.as_str(), "other");
    let (a, b) = (ProjectPath::parse("a").unwrap(), ProjectPath::parse("b").unwrap());
    let op = FsOp::Rename { from: a.clone(), to: b.clone() };
    assert_eq!(op.paths(), [(&a, true), (&b, true)]);
}

/// The planted bugs' switches (for the simulator's checkers) do what
/// they say, and only when planted.
#[test]
fn the_planted_switches_skip_the_resolved_check_and_mark_the_reopen() {
    let mut g = gate();
    let env = ProjectPath::parse(".env").unwrap();
    let shown = ProjectPath::parse("link").unwrap();
    assert!(g.check_as(&env, &shown, false, false).is_err());
    assert!(!g.lexical_only() && !g.reopen_by_path());
    g.plant_lexical_only();
    assert!(g.lexical_only() && g.check_as(&env, &shown, false, false).is_ok());
    // The direct check of a path the tool named is not the planted one's.
    assert!(g.check(&env, false, false).is_err());
    g.plant_reopen_by_path();
    assert!(g.reopen_by_path());
}

#[test]
fn an_error_shows_its_words_and_code_and_travels_as_its_code() {
    use crate::vfs::OpError;
    let codes = [
        (OpError::denied("m"), -32001),
        (OpError::not_found("m"), -32002),
        (OpError::exists("m"), -32003),
        (OpError::io("m"), -32603),
        (OpError::invalid("m"), -32602),
    ];
    for (e, code) in codes {
        assert_eq!(e.to_string(), format!("m ({code})"));
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json, serde_json::json!({"code": code, "message": "m"}));
        assert_eq!(serde_json::from_value::<OpError>(json).unwrap(), e);
    }
    let unknown = serde_json::from_value::<OpError>(serde_json::json!({"code": 7, "message": "m"}));
    assert_eq!(unknown.unwrap_err().to_string(), "unknown error code 7");
}

#[test]
fn the_default_limits_are_the_documented_figures() {
    use crate::vfs::*;
    assert_eq!(DEFAULT_MAX_FILE, 10_485_760);
    assert_eq!(DEFAULT_MAX_STDIN_BACKLOG, 4_194_304);
    assert_eq!(DEFAULT_STDERR_TAIL, 65_536);
    assert_eq!(MAX_READ_CHUNK, 65_536);
}

#[test]
fn tool_arguments_must_be_a_json_object() {
    use crate::vfs::Config;
    assert_eq!(Config::parse_arguments(r#"{"a":1}"#), Ok(serde_json::json!({"a": 1})));
    assert_eq!(Config::parse_arguments("[1]"), Err("--args must be a JSON object".into()));
    let bad = "--args is not valid JSON: EOF while parsing an object at line 1 column 1";
    assert_eq!(Config::parse_arguments("{"), Err(bad.into()));
}

#[test]
fn a_trace_header_names_the_line_values_limit_only_when_not_the_default() {
    use crate::vfs::Config;
    let cfg = Config::new("t");
    let mut json = serde_json::to_value(&cfg).unwrap();
    assert_eq!(json.get("max_line_values"), None);
    json["max_line"] = 7.into();
    let back: Config = serde_json::from_value(json).unwrap();
    assert_eq!(back, Config { max_line: 7, ..cfg.clone() });
    let other = Config { max_line_values: 5, ..cfg };
    assert_eq!(serde_json::to_value(&other).unwrap()["max_line_values"], 5);
}

/// A listing hides what the gate refuses under the path shown and under
/// the real one, and a directory-only glob hides directories alone.
#[test]
fn a_listing_hides_by_either_path_and_by_kind() {
    use crate::vfs::files::{listing, Node};
    let p = ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow: vec![".".into()],
        deny: vec!["secret/".into(), "real/hidden.txt".into(), "link/shown-only.txt".into()],
        ..PolicyConfig::default()
    })
    .unwrap();
    let file = || Node::File { size: 1 };
    let names = |shown: &str, real: &str, children: Vec<(&str, Node)>| -> Vec<String> {
        let (shown, real) = (ProjectPath::parse(shown).unwrap(), ProjectPath::parse(real).unwrap());
        let children = children.into_iter().map(|(n, k)| (n.to_string(), k));
        listing(p.gate(), &shown, &real, children).iter().map(|e| e.path.as_str().to_owned()).collect()
    };
    assert_eq!(names(".", ".", vec![("secret", Node::Dir), ("b", file())]), ["b"]);
    assert_eq!(names(".", ".", vec![("secret", file()), ("b", file())]), ["b", "secret"]);
    let through_link = vec![("hidden.txt", file()), ("shown-only.txt", file()), ("ok.txt", file())];
    assert_eq!(names("link", "real", through_link), ["ok.txt"]);
}

#[test]
fn grep_extensions_want_a_name_with_a_stem() {
    let q = GrepQuery {
        pattern: "x".into(),
        paths: vec![],
        extensions: vec!["rs".into()],
        context: 0,
        max_lines: 1,
    };
    let wants = |p: &str| q.wants(&ProjectPath::parse(p).unwrap());
    assert!(wants("a.rs") && wants("d/b.c.rs"));
    assert!(!wants(".rs") && !wants("d/.rs") && !wants("rs") && !wants("a.rsx"));
    let any = GrepQuery { extensions: vec![], ..q.clone() };
    assert!(any.wants(&ProjectPath::parse(".rs").unwrap()));
}
