//! The `FD_*` ops through the FS proxy: the pager at the top, its file
//! jobs under the policy, and forwarding from an intermediate.

use super::super::{Config, Input, StdioRole};
use crate::codec::frame;
use crate::fuzzing::{test_fs, test_policy, Shell};
use crate::handles::ClientId;
use crate::pager::PagerConfig;
use crate::policy::RootId;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);

fn top() -> Shell {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.pager =
        Some(PagerConfig { max_direct_output_chars: 8, default_page_size: 4, ..PagerConfig::default() });
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    s.connect(B);
    s
}

fn call(s: &mut Shell, client: ClientId, op: &str, params: Value) -> Value {
    let before = s.responses(client).len();
    s.send_json(client, &json!({"id": "x", "op": op, "params": params}));
    let mut got = s.responses(client).split_off(before);
    assert_eq!(got.len(), 1, "{op} {got:?}");
    got.remove(0)
}

fn xml(v: &Value) -> String {
    match v["ok"].as_bool() {
        Some(true) => v["result"]["xml"].as_str().unwrap_or_default().to_owned(),
        _ => v["error"]["message"].as_str().unwrap_or_default().to_owned(),
    }
}

fn b64(s: &[u8]) -> String {
    STANDARD.encode(s)
}

#[test]
fn without_a_file_descriptor_section_the_ops_are_unsupported() {
    let mut s = Shell::new(Config::new(test_policy(), StdioRole::Local), test_fs());
    s.connect(A);
    for op in ["FD_WRAP", "FD_READ", "FD_SEARCH", "FD_TO_FILE"] {
        let r = call(&mut s, A, op, json!({}));
        assert_eq!(r["error"]["code"], "E_UNSUPPORTED", "{op}");
    }
}

#[test]
fn stream_read_search_and_export_through_the_policy() {
    let mut s = top();
    let r = call(&mut s, A, "FD_WRAP", json!({"stream": "s", "data": b64(b"alpha\nbeta\n"), "more": true}));
    assert_eq!(r["result"]["received"], 11);
    let r = call(&mut s, A, "FD_WRAP", json!({"stream": "s", "data": b64(b"gamma\n")}));
    assert_eq!(r["result"]["fd"], "fd:1");
    assert!(xml(&r).starts_with("<fd_result fd=\"fd:1\" pages=\"6\""), "{r}");
    // Another client sees the session's fds.
    let r = call(&mut s, B, "FD_READ", json!({"fd": "fd:1", "page": 3}));
    assert!(
        xml(&r).contains(
            "continued=\"false\" truncated=\"true\" lines=\"2-2\" total_lines=\"3\">beta</fd_content>"
        ),
        "{r}"
    );
    let r = call(&mut s, B, "FD_SEARCH", json!({"fd": "fd:1", "query": "MM", "ignore_case": true}));
    assert!(xml(&r).contains("<match line=\"3\">gamma</match>"), "{r}");
    let r = call(
        &mut s,
        A,
        "FD_TO_FILE",
        json!({"fd": "fd:1", "path": "/rw/out.txt", "start_line": 2, "end_line": 3}),
    );
    assert!(xml(&r).contains("<bytes>11</bytes>"), "{r}");
    assert_eq!(s.fs.files[&(RootId(1), "out.txt".into())], b"beta\ngamma\n");
    // Refused by the policy: nothing written, the seed's error.
    let r = call(&mut s, A, "FD_TO_FILE", json!({"fd": "fd:1", "path": "/ro/hello.txt"}));
    assert_eq!(r["error"]["code"], "E_PERM");
    assert!(xml(&r).contains("<details>Operation: write, Path: /ro/hello.txt</details>"), "{r}");
    assert_eq!(s.fs.files[&(RootId(0), "hello.txt".into())], b"hello");
    let r = call(&mut s, A, "FD_TO_FILE", json!({"fd": "fd:1", "path": "/etc/passwd", "mode": "append"}));
    assert!(xml(&r).contains("type=\"file_operation\""), "{r}");
    // Virtual files work as any other.
    call(&mut s, A, "FD_TO_FILE", json!({"fd": "fd:1", "path": "v.txt"}));
    call(
        &mut s,
        A,
        "FD_TO_FILE",
        json!({"fd": "fd:1", "path": "v.txt", "mode": "insert", "insert_at_line": 2, "page": 1}),
    );
    assert_eq!(s.proxy.virtual_file("v.txt"), Some(&b"alpha\nalphbeta\ngamma\n"[..]));
    // Wrap of a path: read under the policy.
    let r = call(&mut s, A, "FD_WRAP", json!({"path": "/ro/hello.txt"}));
    assert_eq!(r["result"]["data"], b64(b"hello"));
    let r = call(&mut s, A, "FD_WRAP", json!({"path": "/etc/shadow"}));
    assert!(xml(&r).contains("Operation: read, Path: /etc/shadow"), "{r}");
    let r = call(&mut s, A, "FD_WRAP", json!({"path": "v.txt"}));
    assert_eq!(r["result"]["fd"], "fd:2");
    assert_eq!(s.fs.open_files(), 0);
}

#[test]
fn a_child_dying_mid_export_leaves_no_file_open_and_gets_no_answer() {
    let mut s = top();
    call(&mut s, A, "FD_WRAP", json!({"data": b64(&b"0123456789\n".repeat(20_000))}));
    s.auto = false;
    s.send_json(A, &json!({"id": "t", "op": "FD_TO_FILE", "params": {"fd": "fd:1", "path": "/rw/big.txt"}}));
    s.send_json(A, &json!({"id": "u", "op": "FD_READ", "params": {"fd": "fd:1"}}));
    s.complete(0, false); // open
    s.complete(0, false); // first write
    s.input(Input::Died { client: A });
    s.settle();
    assert_eq!(s.fs.open_files(), 0);
    assert_eq!(s.proxy.pager_busy(), (0, 0, 0));
    assert_eq!(s.proxy.tracked_clients(), 1);
    let answered: Vec<Value> = s.responses(A);
    assert!(answered.iter().all(|r| r["id"] != "t" && r["id"] != "u"), "{answered:?}");
    // The stream of a client that dies is dropped with it.
    s.auto = true;
    call(&mut s, B, "FD_WRAP", json!({"stream": "q", "data": b64(b"abc"), "more": true}));
    assert_eq!(s.proxy.pager_busy().0, 1);
    s.input(Input::Eof { client: B });
    assert_eq!(s.proxy.pager_busy(), (0, 0, 0));
}

fn intermediate(isolate: Option<Vec<String>>) -> Shell {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.upstream = true;
    config.isolate_fds = isolate;
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    s.connect(B);
    s
}

fn upstream(s: &mut Shell) -> Vec<Value> {
    s.take_upstream().iter().map(|f| serde_json::from_slice(&f[4..]).unwrap()).collect()
}

fn reply(s: &mut Shell, v: Value) {
    s.input(Input::UpstreamBytes { data: frame::encode(v.to_string().as_bytes()) });
}

#[test]
fn an_intermediate_forwards_under_its_own_policy_and_view() {
    let mut s = intermediate(Some(vec!["fd:7".into()]));
    // Not in the view: answered here.
    s.send_json(A, &json!({"id": "1", "op": "FD_READ", "params": {"fd": "fd:3"}}));
    assert!(upstream(&mut s).is_empty());
    assert_eq!(s.responses(A)[0]["error"]["code"], "E_NOENT");
    s.send_json(A, &json!({"id": "2", "op": "FD_READ", "params": {"fd": "fd:7", "page": 2}}));
    // The level narrows its upstream before its first forward.
    let up = upstream(&mut s);
    assert_eq!(up.len(), 1);
    assert_eq!(up[0]["op"], "narrow");
    reply(&mut s, json!({"id": up[0]["id"], "ok": true, "result": {}}));
    let up = upstream(&mut s);
    assert_eq!(up[0]["op"], "FD_READ");
    reply(&mut s, json!({"id": up[0]["id"], "ok": true, "result": {"xml": "<fd_content/>", "next": null}}));
    assert_eq!(s.responses(A)[1]["result"]["xml"], "<fd_content/>");
    // A path is checked here and sent up absolute.
    s.send_json(A, &json!({"id": "3", "op": "FD_TO_FILE", "params": {"fd": "fd:7", "path": "/ro/x"}}));
    assert!(upstream(&mut s).is_empty());
    assert_eq!(s.responses(A)[2]["error"]["code"], "E_PERM");
    // Streams are renamed per client; a new fd joins the view.
    s.send_json(
        A,
        &json!({"id": "4", "op": "FD_WRAP", "params": {"stream": "s", "data": "YQ==", "more": true}}),
    );
    s.send_json(
        B,
        &json!({"id": "5", "op": "FD_WRAP", "params": {"stream": "s", "data": "YQ==", "more": true}}),
    );
    let up = upstream(&mut s);
    assert_ne!(up[0]["params"]["stream"], up[1]["params"]["stream"]);
    reply(&mut s, json!({"id": up[0]["id"], "ok": true, "result": {"received": 1}}));
    reply(&mut s, json!({"id": up[1]["id"], "ok": true, "result": {"received": 1}}));
    s.send_json(A, &json!({"id": "6", "op": "FD_WRAP", "params": {"stream": "s", "data": "YQ=="}}));
    let up = upstream(&mut s);
    reply(&mut s, json!({"id": up[0]["id"], "ok": true, "result": {"fd": "fd:9", "xml": "", "next": null}}));
    s.send_json(A, &json!({"id": "7", "op": "FD_READ", "params": {"fd": "fd:9"}}));
    assert_eq!(upstream(&mut s).len(), 1);
    // B dies with its stream open: it is aborted at the top.
    s.input(Input::Died { client: B });
    let up = upstream(&mut s);
    assert_eq!(up.len(), 1);
    assert_eq!(up[0]["params"]["abort"], true);
    assert_eq!(up[0]["params"]["stream"], "s1");
}

#[test]
fn a_narrowed_level_exports_and_wraps_only_inside_its_narrowing() {
    use crate::fsproxy::Effect;
    use std::path::Path;
    let mut s = top();
    let r = call(&mut s, A, "FD_WRAP", json!({"data": b64(b"one\ntwo\nthree\n")}));
    assert_eq!(r["result"]["fd"], "fd:1");
    s.send_json(
        A,
        &json!({"id": "n", "op": "narrow", "params": {"rules": [{"path": "/rw/sub", "access": "rw"}]}}),
    );
    // Outside the narrowing, though inside the top's own policy: refused,
    // nothing written, no effect.
    let effects = s.effects.len();
    let r = call(&mut s, A, "FD_TO_FILE", json!({"fd": "fd:1", "path": "/rw/out.txt"}));
    assert!(xml(&r).contains("type=\"file_operation\""), "{r}");
    assert!(!s.fs.files.contains_key(&(RootId(1), "out.txt".into())));
    assert_eq!(s.effects.len(), effects);
    let r = call(&mut s, A, "FD_WRAP", json!({"path": "/ro/hello.txt"}));
    assert!(xml(&r).contains("Operation: read, Path: /ro/hello.txt"), "{r}");
    // Inside it: the open is decided under the intersection, so a symlink
    // under /rw/sub cannot lead it to /rw/out.txt.
    s.auto = false;
    s.send_json(
        A,
        &json!({"id": "t", "op": "FD_TO_FILE", "params": {"fd": "fd:1", "path": "/rw/sub/f.txt"}}),
    );
    let scope = s.effects.iter().find_map(|(_, e)| match e {
        Effect::Open { scope, .. } => Some(scope.clone()),
        _ => None,
    });
    s.auto = true;
    s.settle();
    let scope = scope.unwrap_or_else(|| panic!("no open effect"));
    assert!(scope.permits(Path::new("/rw/sub/f.txt"), true));
    assert!(!scope.permits(Path::new("/rw/out.txt"), false));
    // Another client of the same level keeps the level's own policy.
    let r = call(&mut s, B, "FD_TO_FILE", json!({"fd": "fd:1", "path": "/rw/out.txt"}));
    assert!(xml(&r).contains("<bytes>14</bytes>"), "{r}");
}
