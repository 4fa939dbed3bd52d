//! The host's timers, its answers' limits and the requests' parameter
//! checks, each pinned by its words: many are here because a mutant of the
//! host's code went unnoticed otherwise (docs/verification.md).

use super::memfs::MemNode;
use super::tests::{files, policy_cfg, Session};
use super::*;
use crate::time::Instant;
use serde_json::{json, Value};
use std::time::Duration;

fn with(cfg: Config) -> Session {
    Session::new(cfg, policy_cfg(), files())
}

fn secs(n: u64) -> Instant {
    Instant::ZERO.saturating_add(Duration::from_secs(n))
}

/// The answer to request `id`.
fn answer(s: &Session, id: u64) -> &Value {
    s.got.iter().rev().find(|v| v["id"] == id).unwrap_or_else(|| panic!("no answer to {id}: {:?}", s.got))
}

fn error_of(s: &Session, id: u64) -> (i64, String) {
    let e = &answer(s, id)["error"];
    (e["code"].as_i64().unwrap_or(0), e["message"].as_str().unwrap_or("").to_owned())
}

#[test]
fn the_next_deadline_follows_what_the_host_waits_for() {
    let mut cfg = Config::new("t");
    cfg.timeout = Duration::from_secs(60);
    cfg.op_timeout = Duration::from_secs(7);
    cfg.kill_grace = Duration::from_secs(3);
    let mut s = with(cfg);
    // Idle: the tool's silence is timed from its last activity.
    assert_eq!(s.host.poll_timeout(), Some(secs(60)));
    s.now = secs(10);
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/x"}));
    // A request in service: its own deadline, not the idle one.
    assert_eq!(s.host.poll_timeout(), Some(secs(17)));
    s.complete(EffectResult::Http(Ok(HttpResponse { status: 204, headers: vec![], body: vec![] })));
    assert_eq!(answer(&s, 1)["result"]["status"], 204);
    assert_eq!(s.host.poll_timeout(), Some(secs(70)));
    // Exited, its stdout still open: the drain is given kill_grace.
    s.now = secs(20);
    s.input(Input::ToolExited(ToolExit::Code(0)));
    assert_eq!(s.host.poll_timeout(), Some(secs(23)));
    s.input(Input::ToolStdoutEof);
    assert!(s.finished.is_some());
    assert_eq!(s.host.poll_timeout(), None);
    assert_eq!(s.host.policy().project(), std::path::Path::new("/p"));
}

#[test]
fn an_overlong_line_left_by_a_dead_tool_or_cut_by_eof_is_a_protocol_error() {
    for eof_first in [false, true] {
        let mut cfg = Config::new("t");
        cfg.max_line = 32;
        let mut s = with(cfg);
        if eof_first {
            s.input(Input::ToolStdout(vec![b'x'; 40]));
            s.input(Input::ToolStdoutEof);
        } else {
            s.input(Input::ToolExited(ToolExit::Code(0)));
            s.input(Input::ToolStdout(vec![b'x'; 40]));
        }
        s.exit(0);
        let (v, code) = s.finished.clone().expect("finished");
        assert_eq!((v["outcome"].as_str(), code), (Some("protocol_error"), 4), "{v}");
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("tool stdout: ") && text.contains("32"), "{text}");
    }
}

#[test]
fn malformed_final_messages_are_protocol_errors_naming_the_field() {
    let cases = [
        (
            json!({"method": "error", "params": {"message": 5}}),
            "malformed error: params.message must be a string",
        ),
        (
            json!({"method": "state", "params": {"type": "stopped", "result": 5}}),
            "malformed state: result must be a string or content blocks",
        ),
    ];
    for (msg, want) in cases {
        let mut s = with(Config::new("t"));
        let mut line = msg.clone();
        line["jsonrpc"] = json!("2.0");
        s.line(&line.to_string());
        let (v, code) = s.finished.clone().unwrap_or_else(|| {
            s.exit(0);
            s.finished.clone().unwrap()
        });
        assert_eq!(code, 4, "{v}");
        assert!(v["content"][0]["text"].as_str().unwrap().contains(want), "{v}");
    }
    // A stopped state without a result completes with no content.
    let mut s = with(Config::new("t"));
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"stopped","result":null}}"#);
    s.exit(0);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!((code, &v["content"]), (0, &json!([])), "{v}");
}

#[test]
fn grep_lines_past_max_grep_lines_are_cut_between_files_too() {
    let mut cfg = Config::new("t");
    cfg.max_grep_lines = 1;
    let mut f = files();
    f.put("a.txt", MemNode::File(b"needle\n".to_vec()));
    f.put("b.txt", MemNode::File(b"needle\n".to_vec()));
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.grep", json!({"pattern": "needle", "paths": ["a.txt", "b.txt"]}));
    let r = &answer(&s, 1)["result"];
    assert_eq!(r["truncated"], true, "{r}");
    assert_eq!(r["matches"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["matches"][0]["path"], "a.txt");
}

#[test]
fn answers_over_max_file_are_refused_naming_the_part() {
    let mut cfg = Config::new("t");
    cfg.max_file = 4;
    let mut s = with(cfg);
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/x"}));
    s.complete(EffectResult::Http(Ok(HttpResponse {
        status: 200,
        headers: vec![],
        body: b"12345".to_vec(),
    })));
    assert_eq!(error_of(&s, 1), (-32603, "response body exceeds the limit of 4 bytes".into()));
    for (out, err, which) in [(b"12345".to_vec(), vec![], "stdout"), (vec![], b"12345".to_vec(), "stderr")] {
        s.req(2, "process.run", json!({"program": "echo"}));
        s.complete(EffectResult::Process(Ok(ProcessOutput {
            stdout: out,
            stderr: err,
            exit_code: Some(0),
            signal: None,
        })));
        assert_eq!(error_of(&s, 2), (-32603, format!("process {which} exceeds the limit of 4 bytes")));
    }
    s.req(3, "http.post", json!({"url": "http://127.0.0.1:9/api/x", "body": "12345"}));
    assert_eq!(error_of(&s, 3), (-32603, "body of 5 bytes exceeds --max-file 4".into()));
    // At the limit, everything passes; a killed process reports its signal.
    s.req(4, "process.run", json!({"program": "echo"}));
    let killed = ProcessOutput { stdout: b"1234".to_vec(), stderr: vec![], exit_code: None, signal: Some(9) };
    s.complete(EffectResult::Process(Ok(killed)));
    assert_eq!(
        answer(&s, 4)["result"],
        json!({"stdout": "1234", "stderr": "", "exit_code": null, "signal": 9})
    );
}

#[test]
fn request_parameters_are_checked_and_named() {
    let mut s = with(Config::new("t"));
    let url = "http://127.0.0.1:9/api/x";
    let bad = [
        (
            json!({"url": url, "headers": [{"name": "A"}]}),
            "http.get: each header must be {name, value} with string values",
        ),
        (
            json!({"url": url, "headers": [{"name": "A", "value": 1}]}),
            "http.get: each header must be {name, value} with string values",
        ),
        (
            json!({"url": url, "headers": [{"name": "", "value": "v"}]}),
            "http.get: header name \"\" is not a valid token",
        ),
        (
            json!({"url": url, "headers": [{"name": "a b", "value": "v"}]}),
            "http.get: header name \"a b\" is not a valid token",
        ),
    ];
    for (i, (params, want)) in bad.into_iter().enumerate() {
        let id = 10 + i as u64;
        s.req(id, "http.get", params);
        assert_eq!(error_of(&s, id), (-32602, want.to_string()));
    }
    s.req(20, "process.run", json!({"program": "echo", "args": ["a\u{0}b"]}));
    assert_eq!(error_of(&s, 20), (-32602, "process.run: an argument holds a NUL byte".into()));
    // Without args or a body: none.
    s.req(21, "process.run", json!({"program": "echo"}));
    let Some((_, Effect::Process(p))) = s.held.last() else { panic!("{:?}", s.held) };
    assert!(p.args.is_empty());
    s.complete(EffectResult::Process(Ok(ProcessOutput {
        stdout: vec![],
        stderr: vec![],
        exit_code: Some(0),
        signal: None,
    })));
    s.req(22, "http.post", json!({"url": url}));
    let Some((_, Effect::Http(r))) = s.held.last() else { panic!("{:?}", s.held) };
    assert!(r.body.is_empty() && r.method == HttpMethod::Post);
}

#[test]
fn a_cancel_request_cancels_another_request_in_service() {
    let mut s = with(Config::new("t"));
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/slow"}));
    assert_eq!(s.held.len(), 1);
    s.req(2, "cancel", json!({"id": 1}));
    assert_eq!(s.cancelled.len(), 1, "{}", s.transcript);
    assert_eq!(error_of(&s, 1), (-32005, "cancelled by the tool".into()), "{}", s.transcript);
    assert_eq!(answer(&s, 2)["result"], json!({}));
}
