//! The path operations on the machine: host and virtual, refused against
//! missing, audit and counts, a nested level forwarding them.

use super::*;
use crate::fuzzing::{test_fs, test_policy, Shell};
use crate::policy::{Access, Root};
use serde_json::{json, Value};

const A: ClientId = ClientId(1);

fn shell_with(policy: Policy) -> Shell {
    let mut config = Config::new(policy, StdioRole::Local);
    config.audit = true;
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    s
}

fn call(s: &mut Shell, req: Value) -> Value {
    let before = s.responses(A).len();
    s.send_json(A, &req);
    let mut got = s.responses(A).split_off(before);
    assert_eq!(got.len(), 1, "{req} got {got:?}");
    got.remove(0)
}

fn op(s: &mut Shell, op: &str, params: Value) -> Value {
    call(s, json!({"id": op, "op": op, "params": params}))
}

fn code(v: &Value) -> &str {
    v.pointer("/error/code").and_then(Value::as_str).unwrap_or("ok")
}

fn names(v: &Value) -> Vec<&str> {
    let entries = v.pointer("/result/entries").and_then(Value::as_array);
    entries.map(|e| e.iter().filter_map(|e| e["name"].as_str()).collect()).unwrap_or_default()
}

#[test]
fn host_paths_answer_and_refusals_are_not_missing() {
    let mut s = shell_with(test_policy());
    let stat = op(&mut s, "stat", json!({"path": "/rw/notes.txt"}));
    assert_eq!(stat["result"]["kind"], "file", "{stat}");
    assert_eq!(stat["result"]["size"], 9);
    assert_eq!(code(&op(&mut s, "stat", json!({"path": "/rw/none"}))), "E_NOENT");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": "/etc/passwd"}))), "E_PERM");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": "/etc/none"}))), "E_PERM");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": "../up"}))), "E_PERM");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": ""}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "stat", json!({}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": 3}))), "E_ARG");
    // Changes under the read-only root are refused before any effect.
    let effects = s.effects.len();
    for (name, params) in [
        ("mkdir", json!({"path": "/ro/d"})),
        ("remove", json!({"path": "/ro/hello.txt"})),
        ("rename", json!({"from": "/ro/hello.txt", "to": "/rw/h"})),
        ("rename", json!({"from": "/rw/notes.txt", "to": "/ro/n"})),
    ] {
        assert_eq!(code(&op(&mut s, name, params.clone())), "E_PERM", "{name} {params}");
    }
    assert_eq!(s.effects.len(), effects);
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "/rw/d/e"}))), "E_NOENT");
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "/rw/d/e", "parents": true}))), "ok");
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "/rw/d/e"}))), "E_ARG");
    assert_eq!(names(&op(&mut s, "list", json!({"path": "/rw"}))), ["d", "notes.txt"]);
    let r = op(&mut s, "rename", json!({"from": "/rw/notes.txt", "to": "/rw/d/n.txt", "noreplace": true}));
    assert_eq!(code(&r), "ok", "{r}");
    assert_eq!(names(&op(&mut s, "list", json!({"path": "/rw/d"}))), ["e", "n.txt"]);
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "/rw/d"}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "/rw/d/n.txt"}))), "ok");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "/rw/d/n.txt"}))), "E_NOENT");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "/rw"}))), "E_PERM");
    // Virtual and host never meet in a rename.
    assert_eq!(code(&op(&mut s, "rename", json!({"from": "/rw/d/e", "to": "v"}))), "E_UNSUPPORTED");
    let stats = s.proxy.stats();
    // Counted once served: the two malformed ones never were.
    assert_eq!(stats.path_ops.get("stat"), Some(&6));
    assert_eq!(stats.path_ops.get("rename"), Some(&4));
}

#[test]
fn a_listing_is_paged_within_the_session_limits() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_list_entries = 2;
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    for n in ["a", "b", "c", "d", "e"] {
        assert_eq!(code(&op(&mut s, "mkdir", json!({"path": format!("/rw/{n}")}))), "ok");
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let r = op(&mut s, "list", json!({"path": "/rw", "after": after, "max": 1000}));
        let page: Vec<String> = names(&r).into_iter().map(str::to_owned).collect();
        assert!(page.len() <= 2, "{r}");
        seen.extend(page);
        match r.pointer("/result/next").and_then(Value::as_str) {
            Some(n) => after = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e", "notes.txt"]);
    assert_eq!(code(&op(&mut s, "list", json!({"path": "/rw", "max": 0}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "list", json!({"path": "/rw", "after": "a/b"}))), "E_ARG");
}

#[test]
fn the_virtual_namespace_has_directories_and_leads_to_the_roots() {
    let policy = Policy::new(
        "/home/agent".into(),
        [
            Root { path: "/home/agent/proj/src".into(), access: Access::ReadWrite },
            Root { path: "/ro".into(), access: Access::ReadOnly },
        ],
    );
    let mut s = shell_with(policy);
    let top = op(&mut s, "list", json!({"path": "."}));
    assert_eq!(names(&top), ["proj"], "{top}");
    assert_eq!(op(&mut s, "stat", json!({"path": "proj"}))["result"]["kind"], "dir");
    assert_eq!(op(&mut s, "stat", json!({"path": "."}))["result"]["kind"], "dir");
    // No file where a root makes a directory.
    let r = call(&mut s, json!({"id": "o", "op": "open", "params": {"path": "proj", "mode": "w"}}));
    assert_eq!(code(&r), "E_PERM");
    assert_eq!(code(&op(&mut s, "rename", json!({"from": "proj", "to": "p2"}))), "E_PERM");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "proj"}))), "E_ARG");
    // Files at any depth; explicit directories; conflicts.
    let r =
        call(&mut s, json!({"id": "o", "op": "open", "params": {"path": "out/new/deep.txt", "mode": "w"}}));
    assert_eq!(code(&r), "ok");
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "empty"}))), "ok");
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "empty"}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "mkdir", json!({"path": "empty", "parents": true}))), "ok");
    assert_eq!(names(&op(&mut s, "list", json!({"path": "."}))), ["empty", "out", "proj"]);
    assert_eq!(names(&op(&mut s, "list", json!({"path": "out/new"}))), ["deep.txt"]);
    assert_eq!(op(&mut s, "stat", json!({"path": "out/new/deep.txt"}))["result"]["kind"], "file");
    assert_eq!(code(&op(&mut s, "stat", json!({"path": "nowhere"}))), "E_NOENT");
    assert_eq!(code(&op(&mut s, "rename", json!({"from": "out", "to": "moved"}))), "ok");
    assert!(s.proxy.virtual_file("moved/new/deep.txt").is_some());
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "moved"}))), "E_ARG");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "moved/new/deep.txt"}))), "ok");
    assert_eq!(code(&op(&mut s, "remove", json!({"path": "."}))), "E_PERM");
    // The handle still open on the removed file keeps it (and its bytes)
    // until closed.
    assert_eq!(s.proxy.open_handles(), 1);
    let r = call(&mut s, json!({"id": "c", "op": "close", "params": {"h": 3}}));
    assert_eq!(code(&r), "ok");
    assert_eq!(s.proxy.virt.files(), 1, "only the explicit directory is left");
}

#[test]
fn each_path_op_is_audited_with_what_it_touched() {
    let mut s = shell_with(test_policy());
    s.send_json(A, &json!({"id": "1", "op": "list", "params": {"path": "/rw"}}));
    s.send_json(A, &json!({"id": "2", "op": "rename", "params": {"from": "/rw/notes.txt", "to": "/ro/x"}}));
    s.send_json(A, &json!({"id": "3", "op": "remove", "params": {"path": "/rw/notes.txt"}}));
    let records = s.audit.clone();
    assert_eq!(records.len(), 3, "{records:?}");
    assert_eq!(
        (records[0].op, records[0].entries, records[0].allowed),
        (audit::AuditOp::List, Some(1), true)
    );
    assert_eq!(records[1].op, audit::AuditOp::Rename);
    assert_eq!(
        (records[1].path.as_deref(), records[1].to.as_deref()),
        (Some("/rw/notes.txt"), Some("/ro/x"))
    );
    assert_eq!((records[1].allowed, records[1].code), (false, Some(ErrorCode::Perm)));
    assert_eq!((records[2].op, records[2].allowed), (audit::AuditOp::Remove, true));
}

/// An intermediate with `policy` under a top serving `test_policy`.
struct Chain {
    mid: Shell,
    top: Shell,
}

const UP: ClientId = ClientId(100);

impl Chain {
    fn new(policy: Policy) -> Self {
        let mut top = Shell::new(Config::new(test_policy(), StdioRole::Reject), test_fs());
        top.connect(UP);
        let mut config = Config::new(policy, StdioRole::Local);
        config.upstream = true;
        let mut mid = Shell::new(config, crate::fuzzing::MemFs::default());
        mid.connect(A);
        Chain { mid, top }
    }

    fn call(&mut self, name: &str, params: Value) -> Value {
        let before = self.mid.responses(A).len();
        self.mid.send_json(A, &json!({"id": name, "op": name, "params": params}));
        loop {
            let up = self.mid.take_upstream();
            let down = self.top.take_sent(UP);
            if up.is_empty() && down.is_empty() {
                break;
            }
            for f in up {
                self.top.input(Input::Bytes { client: UP, data: f });
            }
            for p in down {
                self.mid.input(Input::UpstreamBytes { data: crate::codec::frame::encode(&p) });
            }
        }
        let mut got = self.mid.responses(A).split_off(before);
        assert_eq!(got.len(), 1, "{got:?}");
        got.remove(0)
    }
}

#[test]
fn a_nested_level_forwards_host_paths_and_keeps_its_virtual_ones() {
    let narrow =
        Policy::new("/home/agent".into(), [Root { path: "/rw/sub".into(), access: Access::ReadWrite }]);
    let mut c = Chain::new(narrow);
    // Outside the nested level's roots: refused there, never forwarded.
    assert_eq!(code(&c.call("stat", json!({"path": "/rw/notes.txt"}))), "E_PERM");
    assert_eq!(code(&c.call("list", json!({"path": "/rw"}))), "E_PERM");
    assert_eq!(c.top.proxy.stats().path_ops.len(), 0);
    assert_eq!(code(&c.call("mkdir", json!({"path": "/rw/sub"}))), "ok");
    assert_eq!(code(&c.call("mkdir", json!({"path": "/rw/sub/a/b", "parents": true}))), "ok");
    assert_eq!(names(&c.call("list", json!({"path": "/rw/sub/a"}))), ["b"]);
    assert_eq!(code(&c.call("rename", json!({"from": "/rw/sub/a", "to": "/rw/sub/z"}))), "ok");
    // The top's intersection holds: out of the nested root is refused by
    // the nested level; the top never sees a relative name.
    assert_eq!(code(&c.call("rename", json!({"from": "/rw/sub/z", "to": "/rw/z"}))), "E_PERM");
    assert_eq!(code(&c.call("mkdir", json!({"path": "mine"}))), "ok");
    assert_eq!(names(&c.call("list", json!({"path": "."}))), ["mine"]);
    assert_eq!(c.top.proxy.stats().path_ops.get("mkdir"), Some(&2));
    assert_eq!(c.top.proxy.stats().path_ops.get("list"), Some(&1));
}
