//! Sessions through the machine with the in-memory backend.

use super::memfs::{MemFiles, MemNode};
use super::*;
use crate::time::Instant;
use serde_json::{json, Value};

pub(crate) fn policy_cfg() -> PolicyConfig {
    PolicyConfig {
        project: "/p".into(),
        allow: vec![".".into()],
        allow_rw: vec!["out".into()],
        deny: vec!["*.key".into()],
        allow_cmd: vec![("echo".into(), "/bin/echo".into())],
        allow_url: vec!["http://127.0.0.1:9/api".into()],
        env_allow: vec![("TOKEN".into(), Some("s3cr3t-token".into()))],
        path_env: "/usr/bin:/bin".into(),
        ..Default::default()
    }
}

/// A tool driven line by line; effects run on `files` at once.
pub(crate) struct Session {
    pub host: Host,
    pub files: MemFiles,
    pub now: Instant,
    /// Lines the tool got.
    pub got: Vec<Value>,
    pub effects: Vec<Effect>,
    pub finished: Option<(Value, i32)>,
    pub closed: bool,
    pub signals: Vec<Signal>,
    /// Effects the test completes itself (HTTP, process).
    pub held: Vec<(EffectId, Effect)>,
    pub cancelled: Vec<EffectId>,
    /// `> ` lines from the tool, `< ` lines to it, `! ` everything else.
    pub transcript: String,
}

impl Session {
    pub fn new(cfg: Config, pcfg: PolicyConfig, files: MemFiles) -> Self {
        let host = Host::new(Instant::ZERO, cfg, ToolPolicy::new(&pcfg).unwrap());
        let mut s = Session {
            host,
            files,
            now: Instant::ZERO,
            got: vec![],
            effects: vec![],
            finished: None,
            closed: false,
            signals: vec![],
            held: vec![],
            cancelled: vec![],
            transcript: String::new(),
        };
        s.drain();
        s
    }

    pub fn input(&mut self, i: Input) {
        self.host.handle(self.now, i);
        self.drain();
    }

    pub fn line(&mut self, l: &str) {
        self.transcript.push_str(&format!("> {l}\n"));
        self.input(Input::ToolStdout(format!("{l}\n").into_bytes()));
    }

    pub fn req(&mut self, id: u64, method: &str, params: Value) {
        let l = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string();
        self.line(&l);
    }

    pub fn note(&mut self, n: &str) {
        self.transcript.push_str(&format!("! {n}\n"));
    }

    pub fn advance(&mut self, secs: u64) {
        self.now = self.now.saturating_add(std::time::Duration::from_secs(secs));
        self.note(&format!("+{secs}s"));
        self.input(Input::Tick);
    }

    pub fn complete(&mut self, result: EffectResult) {
        let (id, _) = self.held.remove(0);
        self.input(Input::EffectDone { id, result });
    }

    pub fn exit(&mut self, code: i32) {
        self.note(&format!("tool exits {code}"));
        self.input(Input::ToolExited(ToolExit::Code(code)));
        self.input(Input::ToolStdoutEof);
    }

    fn drain(&mut self) {
        while let Some(o) = self.host.poll_output() {
            match o {
                Output::ToolStdin(b) => {
                    for l in b.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                        self.transcript.push_str(&format!("< {}\n", String::from_utf8_lossy(l)));
                        self.got.push(serde_json::from_slice(l).unwrap());
                    }
                }
                Output::CloseStdin => {
                    self.transcript.push_str("! close stdin\n");
                    self.closed = true
                }
                Output::Effect { id, effect } => {
                    self.effects.push(effect.clone());
                    match effect {
                        Effect::Fs(op) => {
                            let r = op.run(&mut self.files, self.host.gate());
                            self.host.handle(self.now, Input::EffectDone { id, result: EffectResult::Fs(r) });
                        }
                        other => {
                            self.transcript
                                .push_str(&format!("! effect {}\n", serde_json::to_string(&other).unwrap()));
                            self.held.push((id, other));
                        }
                    }
                }
                Output::CancelEffect(id) => {
                    self.transcript.push_str(&format!("! cancel effect {}\n", id.0));
                    self.held.retain(|(i, _)| *i != id);
                    self.cancelled.push(id);
                }
                Output::Signal(s) => {
                    self.transcript.push_str(&format!("! signal {s:?}\n"));
                    self.signals.push(s)
                }
                Output::Finished { line, exit_status } => {
                    self.transcript
                        .push_str(&format!("! finished {exit_status} {}", String::from_utf8_lossy(&line)));
                    self.finished = Some((serde_json::from_slice(&line).unwrap(), exit_status));
                }
            }
        }
    }

    pub fn last(&self) -> &Value {
        self.got.last().unwrap()
    }
}

pub(crate) fn files() -> MemFiles {
    let mut f = MemFiles::new();
    f.put("src/main.rs", MemNode::File(b"fn main() {}\n".to_vec()));
    f.put("img.bin", MemNode::File(vec![0xff, 0, 1]));
    f.put(".env", MemNode::File(b"TOKEN=x".to_vec()));
    f.put("link_env", MemNode::Symlink(".env".into()));
    f
}

#[test]
fn init_then_read_then_result() {
    let mut s = Session::new(Config::new("t"), policy_cfg(), files());
    assert_eq!(s.got[0]["method"], "init");
    assert_eq!(s.got[0]["params"]["protocol_version"], "0.1.0");
    s.line(r#"{"jsonrpc":"2.0","id":1,"method":"fs.read","params":{"path":"src/main.rs"}}"#);
    assert_eq!(s.last(), &json!({"jsonrpc":"2.0","id":1,"result":{"content":"fn main() {}\n","size":13}}));
    s.line(r#"{"jsonrpc":"2.0","id":2,"method":"fs.read","params":{"path":"link_env"}}"#);
    assert_eq!(s.last()["error"]["code"], -32001);
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"done"}}"#);
    assert!(s.closed);
    s.input(Input::ToolExited(ToolExit::Code(0)));
    s.input(Input::ToolStdoutEof);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        v,
        json!({"outcome":"completed","content":[{"type":"text","text":"done"}],"tool_exit":{"code":0}})
    );
}

fn session() -> Session {
    Session::new(Config::new("t"), policy_cfg(), files())
}

fn code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or(0)
}

fn finish(s: &mut Session) -> (Value, i32) {
    s.exit(0);
    s.finished.clone().expect("finished")
}

#[test]
fn every_fs_method_transcript() {
    let mut cfg = Config::new("editor");
    cfg.arguments = json!({"path": "src/main.rs"});
    let mut f = files();
    f.put("src/lib.rs", MemNode::File(b"pub fn a() {}\n// fn main\nfn b() {}\n".to_vec()));
    f.put("out/old.txt", MemNode::File(b"old".to_vec()));
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.read", json!({"path": "img.bin"}));
    s.req(2, "fs.write", json!({"path": "out/a/b/new.txt", "content": "hi"}));
    s.req(3, "fs.write", json!({"path": "out/bin", "content": "AP8=", "encoding": "base64"}));
    s.req(4, "fs.exists", json!({"path": "out/a/b/new.txt"}));
    s.req(5, "fs.exists", json!({"path": "nope"}));
    s.req(6, "fs.metadata", json!({"path": "src"}));
    s.req(7, "fs.metadata", json!({"path": "out/bin"}));
    s.req(8, "fs.list_dir", json!({"path": "."}));
    s.req(9, "fs.rename", json!({"from": "out/old.txt", "to": "out/renamed.txt"}));
    s.req(10, "fs.rename", json!({"from": "out/bin", "to": "out/renamed.txt"}));
    s.req(11, "fs.delete", json!({"path": "out/renamed.txt"}));
    s.req(12, "fs.delete", json!({"path": "out/a"}));
    s.req(13, "fs.write", json!({"path": "out/a", "content": "x"}));
    s.req(14, "fs.grep", json!({"pattern": "fn (main|b)", "extensions": ["rs"], "context": 1}));
    s.req(15, "fs.read", json!({"path": "out/a/b/new.txt"}));
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":[{"type":"text","text":"ok"}]}}"#);
    let (v, code) = finish(&mut s);
    assert_eq!(code, 0);
    assert_eq!(v["outcome"], "completed");
    assert_eq!(s.files.get("out/bin"), Some(&MemNode::File(vec![0, 0xff])));
    insta::assert_snapshot!("every_fs_method", s.transcript);
}

#[test]
fn invalid_messages_transcript() {
    let mut s = session();
    s.line("not json");
    s.input(Input::ToolStdout(b"\xff\xfe\n".to_vec()));
    s.transcript.push_str("> <bytes ff fe>\n");
    s.line(r#"[{"jsonrpc":"2.0","id":1,"method":"fs.read"}]"#);
    s.line(r#"{"jsonrpc":"1.0","id":2,"method":"fs.read"}"#);
    s.line(r#"{"id":3,"method":"fs.read"}"#);
    s.line(r#"{"jsonrpc":"2.0","id":null,"method":"fs.read"}"#);
    s.line(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"fs.read"}"#);
    s.line(r#"{"jsonrpc":"2.0","id":4,"method":7}"#);
    s.line(r#"{"jsonrpc":"2.0","id":5}"#);
    s.line(r#"{"jsonrpc":"2.0","id":6,"result":{}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":8,"method":"fs.nope","params":{}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":9,"method":"fs.read","params":{}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":10,"method":"fs.read","params":{"path":7}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":11,"method":"fs.read","params":"x"}"#);
    s.line(r#"{"jsonrpc":"2.0","method":"whatever","params":{}}"#);
    s.line("   ");
    s.line(r#"{"jsonrpc":"2.0","id":"s","method":"fs.grep","params":{"pattern":"("}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":12,"method":"fs.write","params":{"path":"out/x","content":"!!","encoding":"base64"}}"#);
    s.line(r#"{"jsonrpc":"2.0","id":13,"method":"fs.write","params":{"path":"out/x","content":"x","encoding":"rot13"}}"#);
    // Responses from the tool and unknown notifications get nothing back.
    let answers: Vec<&Value> = s.got.iter().skip(1).collect();
    assert_eq!(answers.len(), 16, "{}", s.transcript);
    assert!(answers.iter().all(|a| a.get("error").is_some()));
    insta::assert_snapshot!("invalid_messages", s.transcript);
}

#[test]
fn policy_refusals_before_any_effect() {
    let mut f = files();
    f.put("src/.env.local", MemNode::File(b"x".to_vec()));
    f.put("keys/a.key", MemNode::File(b"x".to_vec()));
    f.put("up", MemNode::Symlink("/etc".into()));
    f.put("inproj", MemNode::Symlink("/p/src".into()));
    f.put("rel_out", MemNode::Symlink("../../etc/passwd".into()));
    f.put("keylink", MemNode::Symlink("keys".into()));
    f.put("out/ro_link", MemNode::Symlink("../src/main.rs".into()));
    let mut s = Session::new(Config::new("t"), policy_cfg(), f);
    let cases: Vec<(&str, Value, i64)> = vec![
        ("fs.read", json!({"path": "/etc/passwd"}), -32001),
        ("fs.read", json!({"path": "src/../src/main.rs"}), -32001),
        ("fs.read", json!({"path": ".env"}), -32001),
        ("fs.read", json!({"path": "src/.env.local"}), -32001),
        ("fs.read", json!({"path": "keys/a.key"}), -32001),
        ("fs.write", json!({"path": "src/main.rs", "content": ""}), -32001),
        ("fs.read", json!({"path": "up/passwd"}), -32001),
        ("fs.read", json!({"path": "rel_out"}), -32001),
        ("fs.read", json!({"path": "link_env"}), -32001),
        ("fs.read", json!({"path": "keylink/a.key"}), -32001),
        ("fs.write", json!({"path": "out/ro_link", "content": "pwned"}), -32001),
        ("fs.exists", json!({"path": "link_env"}), -32001),
        ("fs.read", json!({"path": "nope"}), -32002),
        ("fs.read", json!({"path": ""}), -32602),
        ("process.run", json!({"program": "sh"}), -32001),
        ("http.get", json!({"url": "https://example.com/"}), -32001),
    ];
    for (i, (m, p, want)) in cases.iter().enumerate() {
        s.req(i as u64 + 1, m, p.clone());
        assert_eq!(code(s.last()), *want, "{m} {p}: {}", s.last());
    }
    // The absolute symlink into the project is fine.
    s.req(100, "fs.read", json!({"path": "inproj/main.rs"}));
    assert_eq!(s.last()["result"]["content"], "fn main() {}\n");
    // Nothing was written.
    assert_eq!(s.files.get("src/main.rs"), Some(&MemNode::File(b"fn main() {}\n".to_vec())));
    // Listing leaves out the denied.
    s.req(101, "fs.list_dir", json!({"path": "."}));
    let names: Vec<&str> = s.last()["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&".env") && names.contains(&"link_env") && names.contains(&"src"), "{names:?}");
    s.req(102, "fs.list_dir", json!({"path": "keylink"}));
    assert_eq!(s.last()["result"]["entries"], json!([]));
}

#[test]
fn served_in_order_and_reading_stops_at_max_pending() {
    let mut s = session();
    let mut chunk = String::new();
    for id in 1..=70u64 {
        chunk.push_str(
            &json!({"jsonrpc":"2.0","id":id,"method":"http.get","params":{"url":"http://127.0.0.1:9/api/x"}})
                .to_string(),
        );
        chunk.push('\n');
    }
    s.input(Input::ToolStdout(chunk.into_bytes()));
    // One in service, 63 queued; six more wait unread in the decoder.
    assert_eq!(s.host.unanswered(), 64);
    assert_eq!(s.host.stdout_budget(), 0);
    assert_eq!(s.held.len(), 1);
    let ok = || EffectResult::Http(Ok(HttpResponse { status: 200, headers: vec![], body: b"ok".to_vec() }));
    s.complete(ok());
    assert_eq!(s.host.unanswered(), 64);
    assert_eq!(s.host.stdout_budget(), 0);
    for _ in 0..69 {
        s.complete(ok());
    }
    assert_eq!(s.host.unanswered(), 0);
    assert!(s.host.stdout_budget() > 0);
    let ids: Vec<u64> = s.got.iter().skip(1).map(|v| v["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (1..=70).collect::<Vec<_>>());
}

#[test]
fn op_timeout_and_the_tools_own_cancel() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/slow"}));
    s.req(2, "http.get", json!({"url": "http://127.0.0.1:9/api/queued"}));
    s.req(3, "http.get", json!({"url": "http://127.0.0.1:9/api/third"}));
    s.advance(29);
    assert_eq!(s.got.len(), 1);
    s.advance(1);
    assert_eq!(code(&s.got[1]), -32004);
    assert_eq!(s.got[1]["id"], 1);
    assert_eq!(s.cancelled.len(), 1);
    // 2 is in service now, 3 queued: the tool cancels both.
    s.line(r#"{"jsonrpc":"2.0","method":"cancel","params":{"id":3}}"#);
    assert_eq!((s.got[2]["id"].clone(), code(&s.got[2])), (json!(3), -32005));
    s.line(r#"{"jsonrpc":"2.0","method":"cancel","params":{"id":2}}"#);
    assert_eq!((s.got[3]["id"].clone(), code(&s.got[3])), (json!(2), -32005));
    assert_eq!(s.cancelled.len(), 2);
    // A late result for a cancelled effect is dropped.
    let n = s.got.len();
    s.host.handle(
        s.now,
        Input::EffectDone { id: s.cancelled[0], result: EffectResult::Http(Err(OpError::io("late"))) },
    );
    assert!(s.host.poll_output().is_none());
    assert_eq!(s.got.len(), n);
    // A cancel of an unknown id and a cancel of itself change nothing.
    s.line(r#"{"jsonrpc":"2.0","method":"cancel","params":{"id":99}}"#);
    s.req(4, "cancel", json!({"id": 4}));
    assert_eq!(s.last()["result"], json!({}));
    insta::assert_snapshot!("op_timeout_and_cancel", s.transcript);
}

#[test]
fn duplicate_pending_id_is_answered_with_null() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/a"}));
    s.req(1, "fs.read", json!({"path": "src/main.rs"}));
    s.complete(EffectResult::Http(Ok(HttpResponse { status: 204, headers: vec![], body: vec![] })));
    assert_eq!(s.got[1]["id"], 1);
    assert_eq!(s.got[2]["id"], Value::Null);
    assert_eq!(code(&s.got[2]), -32600);
    // Once answered, the id may be used again.
    s.req(1, "fs.exists", json!({"path": "src"}));
    assert_eq!(s.last()["result"]["exists"], true);
}

#[test]
fn user_cancel_sequence() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/a"}));
    s.req(2, "fs.read", json!({"path": "src/main.rs"}));
    s.input(Input::UserSignal(UserSignal::Int));
    assert_eq!((code(&s.got[1]), code(&s.got[2])), (-32005, -32005));
    assert_eq!(s.got[3], json!({"jsonrpc":"2.0","method":"cancel"}));
    assert!(s.closed);
    assert_eq!(s.host.poll_timeout(), Some(Instant::from_micros(5_000_000)));
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term]);
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term, Signal::Kill]);
    s.note("tool dies of SIGKILL");
    s.input(Input::ToolExited(ToolExit::Signal(9)));
    s.input(Input::ToolStdoutEof);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!(code, 130);
    assert_eq!(v["outcome"], "cancelled");
    assert_eq!(v["tool_exit"], json!({"signal": 9}));
    insta::assert_snapshot!("user_cancel", s.transcript);
}

#[test]
fn silence_times_out_but_not_while_a_request_is_pending() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/a"}));
    s.advance(25);
    s.complete(EffectResult::Http(Ok(HttpResponse { status: 200, headers: vec![], body: vec![] })));
    s.advance(59);
    assert!(s.signals.is_empty());
    s.advance(1);
    assert_eq!(s.signals, vec![Signal::Term]);
    assert!(s.closed);
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term, Signal::Kill]);
    s.input(Input::ToolExited(ToolExit::Signal(9)));
    s.input(Input::ToolStdoutEof);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!((code, v["outcome"].as_str()), (124, Some("timeout")));
}

#[test]
fn stateful_tool_gets_its_applies_then_is_cancelled() {
    let mut cfg = Config::new("stager");
    cfg.applies = vec!["y".into(), "n".into()];
    let mut s = Session::new(cfg, policy_cfg(), files());
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"running","content":"hunk 1"}}"#);
    assert_eq!(s.last(), &json!({"jsonrpc":"2.0","method":"apply","params":{"input":"y"}}));
    s.line(
        r#"{"jsonrpc":"2.0","method":"state","params":{"type":"waiting","content":"hunk 2","question":{}}}"#,
    );
    assert_eq!(s.last()["params"]["input"], "n");
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"waiting","content":"hunk 3"}}"#);
    assert_eq!(s.last(), &json!({"jsonrpc":"2.0","method":"cancel"}));
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term]);
    let (v, code) = finish(&mut s);
    assert_eq!(code, 5);
    assert_eq!(v["outcome"], "waiting");
    assert_eq!(v["states"].as_array().unwrap().len(), 3);
    insta::assert_snapshot!("stateful", s.transcript);

    let mut cfg = Config::new("stager");
    cfg.applies = vec!["y".into()];
    let mut s = Session::new(cfg, policy_cfg(), files());
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"running","content":"hunk 1"}}"#);
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"stopped","result":"Staged 1 hunk."}}"#);
    let (v, code) = finish(&mut s);
    assert_eq!(code, 0);
    assert_eq!(v["content"], json!([{"type":"text","text":"Staged 1 hunk."}]));
    assert_eq!(v["states"].as_array().unwrap().len(), 2);
}

#[test]
fn outcomes_error_no_result_protocol_error() {
    // error
    let mut s = session();
    s.line(r#"{"jsonrpc":"2.0","method":"error","params":{"message":"bad input","transient":false}}"#);
    let (v, code) = finish(&mut s);
    assert_eq!(code, 1);
    assert_eq!(v["error"], json!({"message":"bad input","transient":false}));
    assert_eq!(v["content"], json!([{"type":"text","text":"bad input"}]));
    // no_result, with the tail of stderr
    let mut cfg = Config::new("t");
    cfg.stderr_tail = 8;
    let mut s = Session::new(cfg, policy_cfg(), files());
    s.input(Input::ToolStderr(b"panicked at the disco".to_vec()));
    s.input(Input::ToolExited(ToolExit::Code(101)));
    assert!(s.finished.is_none(), "waits for stdout's end");
    s.input(Input::ToolStdoutEof);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!(code, 3);
    let text = v["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("exit code 101") && text.ends_with("he disco") && !text.contains("panicked"),
        "{text}"
    );
    // A result already read before the exit is seen counts.
    let mut s = session();
    s.input(Input::ToolExited(ToolExit::Code(0)));
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"late but fine"}}"#);
    s.input(Input::ToolStdoutEof);
    assert_eq!(s.finished.clone().unwrap().1, 0);
    // stdout never ends: the host gives up kill_grace after the exit.
    let mut s = session();
    s.input(Input::ToolExited(ToolExit::Code(0)));
    s.advance(5);
    assert_eq!(s.finished.clone().unwrap().1, 3);
    // protocol errors: a line over the limit, a malformed result
    let mut cfg = Config::new("t");
    cfg.max_line = 64;
    let mut s = Session::new(cfg, policy_cfg(), files());
    s.input(Input::ToolStdout(vec![b'x'; 65]));
    assert!(s.closed);
    let (v, code) = finish(&mut s);
    assert_eq!(code, 4);
    assert!(v["content"][0]["text"].as_str().unwrap().contains("64"));
    let mut s = session();
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":7}}"#);
    assert_eq!(finish(&mut s).1, 4);
    let mut s = session();
    s.line(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"dancing"}}"#);
    assert_eq!(finish(&mut s).1, 4);
    // stdout closed while alive: no result possible.
    let mut s = session();
    s.input(Input::ToolStdoutEof);
    assert!(s.closed);
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term]);
    s.input(Input::ToolExited(ToolExit::Signal(15)));
    assert_eq!(s.finished.clone().unwrap().1, 3);
}

#[test]
fn a_final_message_answers_pending_requests_and_reaps() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/a"}));
    s.req(2, "fs.read", json!({"path": "src/main.rs"}));
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"bye"}}"#);
    assert_eq!((code(&s.got[1]), code(&s.got[2])), (-32005, -32005));
    assert!(s.closed);
    s.advance(5);
    s.advance(5);
    assert_eq!(s.signals, vec![Signal::Term, Signal::Kill]);
    s.input(Input::ToolExited(ToolExit::Signal(9)));
    // The group is killed once the tool is gone.
    assert_eq!(s.signals.last(), Some(&Signal::Kill));
    s.input(Input::ToolStdoutEof);
    assert_eq!(s.finished.clone().unwrap().1, 0);
    assert!(s.host.poll_timeout().is_none());
}

const SECRET: &str = "s3cr3t-token";

#[test]
fn secrets_are_scrubbed_from_everything_the_tool_gets() {
    let mut f = files();
    f.put("out/leak.txt", MemNode::File(format!("token={SECRET}\n").into_bytes()));
    let mut bin = vec![0u8, 0xff];
    bin.extend_from_slice(SECRET.as_bytes());
    f.put("out/leak.bin", MemNode::File(bin));
    f.put(&format!("out/{SECRET}"), MemNode::File(b"name".to_vec()));
    let mut cfg = Config::new("t");
    cfg.arguments = json!({ "x": SECRET });
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.read", json!({"path": "out/leak.txt"}));
    s.req(2, "fs.read", json!({"path": "out/leak.bin"}));
    s.req(3, "fs.list_dir", json!({"path": "out"}));
    s.req(4, "fs.grep", json!({"pattern": "token", "paths": ["out"]}));
    s.req(5, "fs.read", json!({"path": format!("nope-{SECRET}")}));
    s.req(6, "http.get", json!({"url": "http://127.0.0.1:9/api", "headers": [{"name": "Authorization", "value": "Bearer ${TOKEN}"}]}));
    let Some((_, Effect::Http(r))) = s.held.first() else { panic!("no http effect") };
    assert_eq!(r.headers[0].value, format!("Bearer {SECRET}").into_bytes());
    s.complete(EffectResult::Http(Ok(HttpResponse {
        status: 200,
        headers: vec![Header { name: "x-echo".into(), value: SECRET.as_bytes().to_vec() }],
        body: format!("you sent {SECRET}").into_bytes(),
    })));
    let all: String = s.got.iter().map(|v| v.to_string()).collect();
    assert!(!all.contains(SECRET), "{all}");
    assert!(all.contains("[REDACTED]"));
    // Base64 payloads are scrubbed before they are encoded.
    let b64 = s.got[2]["result"]["content"].as_str().unwrap();
    let raw = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap();
    assert_eq!(raw, [&[0u8, 0xff][..], b"[REDACTED]"].concat());
    assert_eq!(s.got[2]["result"]["encoding"], "base64");
}

#[test]
fn http_and_process_requests() {
    let mut pc = policy_cfg();
    pc.env_allow.push(("UNSET".into(), None));
    pc.env_allow.push(("LANGX".into(), Some("C".into())));
    let mut s = Session::new(Config::new("t"), pc, files());
    s.req(
        1,
        "http.get",
        json!({"url": "http://127.0.0.1:9/api", "headers": [{"name": "A", "value": "${HOME}"}]}),
    );
    assert_eq!(code(s.last()), -32001);
    s.req(
        2,
        "http.get",
        json!({"url": "http://127.0.0.1:9/api", "headers": [{"name": "A", "value": "${UNSET}"}]}),
    );
    assert_eq!(code(s.last()), -32002);
    s.req(
        3,
        "http.get",
        json!({"url": "http://127.0.0.1:9/api", "headers": [{"name": "A", "value": "x\r\nEvil: 1"}]}),
    );
    assert_eq!(code(s.last()), -32602);
    s.req(4, "http.get", json!({"url": "http://127.0.0.1:9/apix"}));
    assert_eq!(code(s.last()), -32001);
    s.req(5, "http.post", json!({"url": "http://127.0.0.1:9/api/p", "body": "AAE=", "encoding": "base64"}));
    let Some((_, Effect::Http(r))) = s.held.first().cloned() else { panic!() };
    assert_eq!((r.method, r.body.clone()), (HttpMethod::Post, vec![0, 1]));
    s.complete(EffectResult::Http(Ok(HttpResponse { status: 201, headers: vec![], body: vec![0xff] })));
    assert_eq!(s.last()["result"], json!({"status":201,"headers":[],"body":"/w==","encoding":"base64"}));
    s.req(6, "process.run", json!({"program": "echo", "args": ["hi"], "envs": ["HOME"]}));
    assert_eq!(code(s.last()), -32001);
    s.req(7, "process.run", json!({"program": "echo", "args": ["hi"], "envs": ["LANGX", "UNSET"]}));
    let Some((_, Effect::Process(p))) = s.held.first().cloned() else { panic!() };
    assert_eq!(p.program, std::path::PathBuf::from("/bin/echo"));
    assert_eq!(p.env, vec![("PATH".into(), "/usr/bin:/bin".into()), ("LANGX".into(), "C".into())]);
    assert_eq!(p.cwd, std::path::PathBuf::from("/p"));
    s.complete(EffectResult::Process(Ok(ProcessOutput {
        stdout: format!("hi {SECRET}\n").into_bytes(),
        stderr: vec![],
        exit_code: Some(0),
        signal: None,
    })));
    assert_eq!(s.last()["result"], json!({"stdout":"hi [REDACTED]\n","stderr":"","exit_code":0}));
    s.req(8, "process.run", json!({"program": "echo"}));
    s.complete(EffectResult::Process(Err(OpError::too_large("process stdout", 10))));
    assert_eq!(code(s.last()), -32603);
}

#[test]
fn grep_semantics() {
    let mut f = MemFiles::new();
    f.put("a.rs", MemNode::File(b"1\nfoo\n3\n4\n5\nfoo\n7\n8\n9\n10\nfoo\n".to_vec()));
    f.put("b.txt", MemNode::File(b"foo\n".to_vec()));
    f.put("c.rs", MemNode::File(b"foo\0bin\n".to_vec()));
    f.put("d.rs", MemNode::Symlink("a.rs".into()));
    f.put("sub/e.rs", MemNode::File(b"x foo\n".to_vec()));
    f.put("sub/x.key", MemNode::File(b"foo\n".to_vec()));
    let mut s = Session::new(Config::new("t"), policy_cfg(), f);
    s.req(1, "fs.grep", json!({"pattern": "^foo$|x foo", "extensions": [".rs"], "context": 2}));
    let r = &s.last()["result"];
    assert_eq!(r["truncated"], false);
    let files: Vec<&str> =
        r["matches"].as_array().unwrap().iter().map(|m| m["path"].as_str().unwrap()).collect();
    assert_eq!(files, vec!["a.rs", "sub/e.rs"]);
    let lines: Vec<(u64, bool)> = r["matches"][0]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["line_number"].as_u64().unwrap(), l["is_match"].as_bool().unwrap()))
        .collect();
    // 1-4 and 4-8 merge; 9-11 stays apart... 9 is within 2 of 11.
    assert_eq!(
        lines,
        vec![
            (1, false),
            (2, true),
            (3, false),
            (4, false),
            (5, false),
            (6, true),
            (7, false),
            (8, false),
            (9, false),
            (10, false),
            (11, true)
        ]
    );
    let mut cfg = Config::new("t");
    cfg.max_grep_lines = 2;
    let mut f = MemFiles::new();
    f.put("a.rs", MemNode::File(b"foo\nfoo\nfoo\n".to_vec()));
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.grep", json!({"pattern": "foo", "paths": ["a.rs"]}));
    assert_eq!(s.last()["result"]["truncated"], true);
    assert_eq!(s.last()["result"]["matches"][0]["lines"].as_array().unwrap().len(), 2);
}

#[test]
fn a_response_over_max_line_is_an_error() {
    let mut cfg = Config::new("t");
    cfg.max_line = 200;
    let mut f = files();
    f.put("big.txt", MemNode::File(vec![b'a'; 300]));
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.read", json!({"path": "big.txt"}));
    assert_eq!(code(s.last()), -32603);
    assert!(s.last()["error"]["message"].as_str().unwrap().contains("line limit"));
}

#[test]
fn a_file_over_max_file_is_refused() {
    let mut cfg = Config::new("t");
    cfg.max_file = 4;
    let mut f = files();
    f.put("big.txt", MemNode::File(vec![b'a'; 5]));
    let mut s = Session::new(cfg, policy_cfg(), f);
    s.req(1, "fs.read", json!({"path": "big.txt"}));
    assert_eq!(code(s.last()), -32603);
    s.req(2, "fs.write", json!({"path": "out/x", "content": "12345"}));
    assert_eq!(code(s.last()), -32603);
}

#[test]
fn clock_running_backwards_changes_nothing() {
    let mut s = session();
    s.advance(30);
    s.now = Instant::ZERO;
    s.input(Input::Tick);
    s.advance(59);
    assert!(s.signals.is_empty());
    s.advance(1);
    assert_eq!(s.signals, vec![Signal::Term]);
}

#[test]
fn a_zero_op_timeout_still_answers_every_queued_request() {
    let mut cfg = Config::new("t");
    cfg.op_timeout = std::time::Duration::ZERO;
    let mut s = Session::new(cfg, policy_cfg(), files());
    let mut chunk = String::new();
    for id in 1..=3u64 {
        chunk.push_str(
            &json!({"jsonrpc":"2.0","id":id,"method":"http.get","params":{"url":"http://127.0.0.1:9/api"}})
                .to_string(),
        );
        chunk.push('\n');
    }
    s.input(Input::ToolStdout(chunk.into_bytes()));
    let codes: Vec<i64> = s.got.iter().skip(1).map(code).collect();
    assert_eq!(codes, vec![-32004, -32004, -32004]);
    assert_eq!(s.host.unanswered(), 0);
}

#[test]
fn a_result_behind_a_full_queue_counts_when_the_tool_exits() {
    let mut cfg = Config::new("t");
    cfg.max_pending = 2;
    let mut s = Session::new(cfg, policy_cfg(), files());
    let mut chunk = String::new();
    for id in 1..=4u64 {
        chunk.push_str(
            &json!({"jsonrpc":"2.0","id":id,"method":"http.get","params":{"url":"http://127.0.0.1:9/api"}})
                .to_string(),
        );
        chunk.push('\n');
    }
    chunk.push_str(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"fire and forget"}}"#);
    chunk.push('\n');
    s.input(Input::ToolStdout(chunk.into_bytes()));
    assert_eq!(s.host.unanswered(), 2);
    s.exit(0);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!((code, v["content"][0]["text"].as_str()), (0, Some("fire and forget")));
    assert!(!s.cancelled.is_empty(), "the effect in flight is cancelled");
}

#[test]
fn stdout_closed_behind_a_full_queue_still_reads_every_line() {
    let mut cfg = Config::new("t");
    cfg.max_pending = 1;
    let mut s = Session::new(cfg, policy_cfg(), files());
    let mut chunk = String::new();
    for id in 1..=3u64 {
        chunk.push_str(
            &json!({"jsonrpc":"2.0","id":id,"method":"http.get","params":{"url":"http://127.0.0.1:9/api"}})
                .to_string(),
        );
        chunk.push('\n');
    }
    // The last line has no newline.
    chunk.push_str(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"last"}}"#);
    s.input(Input::ToolStdout(chunk.into_bytes()));
    s.input(Input::ToolStdoutEof);
    assert!(!s.closed, "lines are still to be read");
    for _ in 0..3 {
        s.complete(EffectResult::Http(Ok(HttpResponse { status: 200, headers: vec![], body: vec![] })));
    }
    let ids: Vec<u64> = s.got.iter().skip(1).map(|v| v["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert!(s.closed);
    s.input(Input::ToolExited(ToolExit::Code(0)));
    assert_eq!(s.finished.clone().unwrap().1, 0);
}

#[test]
fn after_the_exit_the_pipe_is_read_out_past_the_pending_limit() {
    let mut cfg = Config::new("t");
    cfg.max_pending = 1;
    let mut s = Session::new(cfg, policy_cfg(), files());
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api"}));
    assert_eq!(s.host.stdout_budget(), 0);
    s.input(Input::ToolExited(ToolExit::Code(0)));
    assert!(s.host.stdout_budget() > 0, "a dead tool's pipe is read out");
    assert!(s.closed && !s.cancelled.is_empty());
    s.req(2, "fs.read", json!({"path": "src/main.rs"}));
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"left behind"}}"#);
    s.input(Input::ToolStdoutEof);
    let (v, code) = s.finished.clone().unwrap();
    assert_eq!((code, v["content"][0]["text"].as_str()), (0, Some("left behind")));
    // Nothing was answered to a dead tool.
    assert_eq!(s.got.len(), 1);
}

#[test]
fn lines_queued_when_the_run_ends_get_their_answers() {
    let mut s = session();
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api"}));
    s.line("{not json");
    s.req(2, "fs.read", json!({"path": "/etc/passwd"}));
    s.req(3, "fs.read", json!({"path": "src/main.rs"}));
    s.line(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"bye"}}"#);
    let answers: Vec<(Value, i64)> = s.got.iter().skip(1).map(|v| (v["id"].clone(), code(v))).collect();
    assert_eq!(
        answers,
        vec![(json!(1), -32005), (Value::Null, -32600), (json!(2), -32001), (json!(3), -32005)]
    );
    assert!(s.closed);
}

/// A multi-line secret is one `[REDACTED]` line to `fs.grep`, which
/// searches the scrubbed text: no pattern matches any part of the secret,
/// and line numbers are those of what `fs.read` returns.
#[test]
fn grep_searches_the_scrubbed_text() {
    let key = "-----BEGIN KEY-----\nAbCdEf0123\n-----END KEY-----";
    let mut f = MemFiles::new();
    f.put("k.pem", MemNode::File(format!("head\n{key}\ntail\n").into_bytes()));
    let mut pcfg = policy_cfg();
    pcfg.env_allow = vec![("KEY".into(), Some(key.into()))];
    let mut s = Session::new(Config::new("t"), pcfg, f);
    s.req(1, "fs.grep", json!({"pattern": ".", "paths": ["k.pem"]}));
    let lines: Vec<(u64, String)> = s.last()["result"]["matches"][0]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["line_number"].as_u64().unwrap(), l["content"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(lines, vec![(1, "head".into()), (2, "[REDACTED]".into()), (3, "tail".into())]);
    for (id, pattern) in [(2, "AbC"), (3, "^-----BEGIN"), (4, "0123$"), (5, "KEY")] {
        s.req(id, "fs.grep", json!({"pattern": pattern, "paths": ["k.pem"]}));
        assert_eq!(s.last()["result"]["matches"], json!([]), "{pattern} matched the secret");
    }
    s.req(6, "fs.read", json!({"path": "k.pem"}));
    assert_eq!(s.last()["result"]["content"], "head\n[REDACTED]\ntail\n");
}

/// `http.get` is sent to the normalized URL it was allowed as, and a
/// `Host` header cannot send it to another virtual host.
#[test]
fn http_goes_to_the_url_as_allowed() {
    let mut s = Session::new(Config::new("t"), policy_cfg(), MemFiles::new());
    s.req(
        1,
        "http.get",
        json!({"url": "http://127.0.0.1:9/api/x", "headers": [{"name": "HOST", "value": "admin"}]}),
    );
    assert_eq!(s.last()["error"]["code"], -32001, "{}", s.last());
    s.req(2, "http.get", json!({"url": "http://127.0.0.1:9/api/%2e%2e%2fadmin"}));
    assert_eq!(s.last()["error"]["code"], -32001, "{}", s.last());
    assert!(s.held.is_empty());
    s.req(3, "http.get", json!({"url": "HTTP://127.0.0.1:9/api/a/../%62"}));
    let Some((_, Effect::Http(r))) = s.held.first() else { panic!("no http effect: {}", s.last()) };
    assert_eq!(r.url, "http://127.0.0.1:9/api/b");
}

#[test]
fn refused_http_requests_are_held_for_the_audit_log_and_bounded() {
    let mut pcfg = policy_cfg();
    pcfg.allow_host = vec!["127.0.0.1:9".into(), "example.com".into()];
    pcfg.deny_host = vec!["example.com".into()];
    let mut s = Session::new(Config::new("t"), pcfg, files());
    s.req(1, "http.get", json!({"url": "http://127.0.0.1:9/api/x"}));
    s.req(2, "http.post", json!({"url": "https://example.com/api"}));
    s.req(3, "http.get", json!({"url": "http://127.0.0.1:9/other"}));
    s.req(4, "fs.read", json!({"path": ".env"}));
    let (refused, dropped) = s.host.take_net_refusals();
    assert_eq!(dropped, 0);
    let refusal = |method: &str, url: &str, host: &str, port: u16| NetRefusal {
        method: method.into(),
        url: url.into(),
        host: Some(host.into()),
        port: Some(port),
        rule: "it is under no --allow-url prefix".into(),
    };
    assert_eq!(
        refused,
        [
            refusal("http.post", "https://example.com/api", "example.com", 443),
            refusal("http.get", "http://127.0.0.1:9/other", "127.0.0.1", 9),
        ]
    );
    assert_eq!(s.host.take_net_refusals(), (vec![], 0), "taken once");
    let long = format!("http://127.0.0.1:9/{}é", "x".repeat(MAX_AUDITED_URL - 20));
    for _ in 0..MAX_NET_REFUSALS_HELD + 3 {
        s.host.note_net_refusal("http.get", &long, "url \"…\" denied: it is under no --allow-url prefix");
    }
    let (refused, dropped) = s.host.take_net_refusals();
    assert_eq!((refused.len(), dropped), (MAX_NET_REFUSALS_HELD, 3));
    // Cut at a character's boundary (the `é` straddles the limit).
    assert!(refused.iter().all(|r| r.url.len() == MAX_AUDITED_URL - 1), "{}", refused[0].url.len());
    assert_eq!(refused[0].rule, "it is under no --allow-url prefix");
}
