//! Wire transcripts of the FS proxy, pinned with insta: every request as
//! the client sent it (`->`), every response as the machine framed it
//! (`<-`), one per line. A change to any byte a client sees shows up here.

use airlock_core::broker::{BrokerSetup, CallId, Money, ProviderResult, Usage};
use airlock_core::codec::frame;
use airlock_core::fsproxy::{Config, Input, StdioRole};
use airlock_core::fuzzing::{test_fs, test_policy, Event, Shell};
use airlock_core::handles::ClientId;

const C: ClientId = ClientId(1);

enum Step<'a> {
    /// One request frame, as text.
    Req(&'a str),
    /// Raw bytes as they arrive on the pipe.
    Raw(&'a [u8]),
    Eof,
    /// The provider finishes call N: `ok` with this usage (prompt, cached,
    /// completion), or an error carrying it.
    Provider(u64, bool, (u64, u64, u64)),
    /// The machine's next timer fires.
    Timer,
}

fn transcript(config: Config, steps: &[Step]) -> String {
    let mut s = Shell::new(config, test_fs());
    s.connect(C);
    let mut out = String::new();
    for step in steps {
        let seen = s.events.len();
        let (started, cancelled, telemetry) = (s.started.len(), s.cancelled.len(), s.telemetry.len());
        match step {
            Step::Req(text) => {
                out += &format!("-> {text}\n");
                s.send(C, text.as_bytes());
            }
            Step::Raw(bytes) => {
                out += &format!("-> raw {}\n", bytes.escape_ascii());
                s.input(Input::Bytes { client: C, data: bytes.to_vec() });
            }
            Step::Eof => {
                out += "-> EOF\n";
                s.input(Input::Eof { client: C });
            }
            Step::Provider(call, ok, (prompt, cached, completion)) => {
                out +=
                    &format!("-> provider done call-{call} ok={ok} usage={prompt}/{cached}/{completion}\n");
                let usage = Some(Usage {
                    prompt_tokens: *prompt,
                    cached_tokens: *cached,
                    completion_tokens: *completion,
                    total_tokens: prompt + completion,
                });
                let result = if *ok {
                    ProviderResult::Ok {
                        messages: airlock_core::broker::RawJson::from_value(
                            &serde_json::json!([{"role": "assistant", "content": "4"}]),
                        ),
                        usage,
                        model: "gpt-4o-mini".into(),
                    }
                } else {
                    ProviderResult::error(usage, "HTTP 500")
                };
                s.provider_done(CallId(*call), result);
            }
            Step::Timer => {
                let at = s.proxy.poll_timeout().map(|t| t.as_micros());
                out += &format!("-> timer at {at:?} us\n");
                s.fire_timer();
            }
        }
        for (call, request, deadline) in
            s.provider_calls.iter().filter(|(c, _, _)| s.started[started..].contains(c))
        {
            let request = serde_json::to_string(request).unwrap_or_default();
            out += &format!("<> start {call} deadline {} us: {request}\n", deadline.as_micros());
        }
        for call in &s.cancelled[cancelled..] {
            out += &format!("<> cancel {call}\n");
        }
        for record in &s.telemetry[telemetry..] {
            out += &format!("<> telemetry {}\n", serde_json::to_string(record).unwrap_or_default());
        }
        for e in &s.events[seen..] {
            match e {
                Event::Sent(_, payload) => out += &format!("<- {}\n", String::from_utf8_lossy(payload)),
                Event::Closed(_) => out += "<- (connection closed)\n",
                Event::Attached(from, new) => out += &format!("<- (attached {new} from {from})\n"),
                Event::Upstream(data) => out += &format!("^^ {}\n", String::from_utf8_lossy(&data[4..])),
                Event::Admitted(new) => out += &format!("<- (admitted {new} from the session socket)\n"),
                Event::Refused(payload) => out += &format!("<x {}\n", String::from_utf8_lossy(payload)),
                Event::Dismissed => out += "<x (closed unanswered: an unknown secret)\n",
            }
        }
    }
    let st = s.proxy.stats();
    out += &format!(
        "== open handles {}, files open {}, cleaned up {}\n",
        s.proxy.open_handles(),
        s.fs.open_files(),
        st.handles_cleaned_up
    );
    out
}

fn local() -> Config {
    Config::new(test_policy(), StdioRole::Local)
}

#[test]
fn seed_examples_virtual() {
    insta::assert_snapshot!(transcript(
        local(),
        &[
            Step::Req(r#"{ "id":"1", "op":"open", "params": { "path":"test.txt", "mode":"w" } }"#),
            Step::Req(r#"{ "id":"4", "op":"write", "params": { "h":3, "data":"aGVsbG8=", "final":false } }"#),
            Step::Req(r#"{ "id":"5", "op":"close", "params": { "h":3 } }"#),
            Step::Req(r#"{ "id":"6", "op":"open", "params": { "path":"test.txt", "mode":"r" } }"#),
            Step::Req(r#"{ "id":"2", "op":"read", "params": { "h":4, "max":4096 } }"#),
            Step::Req(r#"{ "id":"3", "op":"read", "params": { "h":4, "max":4096 } }"#),
            Step::Req(r#"{ "id":"7", "op":"close", "params": { "h":4 } }"#),
        ],
    ));
}

#[test]
fn seed_examples_host() {
    insta::assert_snapshot!(transcript(
        local(),
        &[
            Step::Req(r#"{"id":"1","op":"open","params":{"path":"/rw/test.txt","mode":"w"}}"#),
            Step::Req(r#"{"id":"2","op":"write","params":{"h":3,"data":"aGVsbG8=","final":false}}"#),
            Step::Req(r#"{"id":"3","op":"open","params":{"path":"/rw/test.txt","mode":"a"}}"#),
            Step::Req(r#"{"id":"4","op":"write","params":{"h":4,"data":"IHdvcmxk"}}"#),
            Step::Req(r#"{"id":"5","op":"close","params":{"h":3}}"#),
            Step::Req(r#"{"id":"6","op":"close","params":{"h":4}}"#),
            Step::Req(r#"{"id":"7","op":"open","params":{"path":"/rw/test.txt","mode":"rw"}}"#),
            Step::Req(r#"{"id":"8","op":"read","params":{"h":5,"max":6}}"#),
            Step::Req(r#"{"id":"9","op":"read","params":{"h":5,"max":4096}}"#),
            Step::Req(r#"{"id":"10","op":"read","params":{"h":5,"max":4096}}"#),
            Step::Req(r#"{"id":"11","op":"open","params":{"path":"/ro/hello.txt","mode":"r"}}"#),
            Step::Eof,
        ],
    ));
}

#[test]
fn error_cases() {
    insta::assert_snapshot!(transcript(
        local(),
        &[
            Step::Req(r#"{"id":"1","op":"open","params":{"path":"/ro/hello.txt","mode":"r"}}"#),
            Step::Req(r#"{"id":"2","op":"read","params":{"h":3,"max":0}}"#),
            Step::Req(r#"{"id":"3","op":"read","params":{"h":3,"max":4097}}"#),
            Step::Req(r#"{"id":"4","op":"write","params":{"h":3,"data":"aGk="}}"#),
            Step::Req(r#"{"id":"5","op":"open","params":{"path":"w.txt","mode":"w"}}"#),
            Step::Req(r#"{"id":"6","op":"read","params":{"h":4,"max":1}}"#),
            Step::Req(r#"{"id":"7","op":"open","params":{"path":"w.txt","mode":"a"}}"#),
            Step::Req(r#"{"id":"8","op":"read","params":{"h":5,"max":1}}"#),
            Step::Req(r#"{"id":"9","op":"close","params":{"h":3}}"#),
            Step::Req(r#"{"id":"10","op":"close","params":{"h":3}}"#),
            Step::Req(r#"{"id":"11","op":"read","params":{"h":42,"max":1}}"#),
            Step::Req(r#"{"id":"12","op":"open","params":{"path":"missing.txt","mode":"r"}}"#),
            Step::Req(r#"{"id":"13","op":"open","params":{"path":"/ro/missing","mode":"r"}}"#),
            Step::Req(r#"{"id":"14","op":"open","params":{"path":"x"}}"#),
            Step::Req(r#"{"id":"15","op":"open","params":{"path":"x","mode":"rwx"}}"#),
            Step::Req(r#"{"id":"16","op":"write","params":{"h":4,"data":"***"}}"#),
            Step::Req(r#"{"id":"17","op":"stat","params":{"path":"x"}}"#),
            Step::Req(r#"{"id":"18","op":"QUOTA"}"#),
            Step::Req(r#"{"id":"19","op":"LLMCMD","params":{"prompt":"hi"}}"#),
            Step::Req(r#"not json"#),
            Step::Req(r#"[1,2,3]"#),
            Step::Req(r#"{"op":"open","params":{"path":"x","mode":"r"}}"#),
            Step::Req(r#"{"id":1,"op":"open"}"#),
            Step::Req(r#"{"id":"20"}"#),
            Step::Req(r#"{"id":"21","op":"open","params":"x"}"#),
            Step::Raw(b"\x00\x00\x00\x04\xff\xfe\xfd\xfc"),
            Step::Req(r#"{"id":"22","op":"open","params":{"path":"../escape","mode":"r"}}"#),
            Step::Req(r#"{"id":"23","op":"open","params":{"path":"/etc/passwd","mode":"r"}}"#),
            Step::Req(r#"{"id":"24","op":"open","params":{"path":"a\u0000b","mode":"w"}}"#),
            Step::Req(r#"{"id":"25","op":"open","params":{"path":"/ro/hello.txt","mode":"w"}}"#),
            Step::Req(r#"{"id":"26","op":"open","params":{"path":"","mode":"w"}}"#),
            Step::Req(r#"{"id":"27","op":"close","params":{"h":0}}"#),
            Step::Req(r#"{"id":"28","op":"read","params":{"h":1,"max":1}}"#),
            Step::Eof,
        ],
    ));
}

#[test]
fn stdio_on_the_upstream_server() {
    insta::assert_snapshot!(transcript(
        Config::new(test_policy(), StdioRole::Reject),
        &[
            Step::Req(r#"{"id":"1","op":"read","params":{"h":0,"max":16}}"#),
            Step::Req(r#"{"id":"2","op":"write","params":{"h":1,"data":"aGk="}}"#),
            Step::Req(r#"{"id":"3","op":"close","params":{"h":2}}"#),
        ],
    ));
}

#[test]
fn stdio_on_the_parent_side_mux() {
    insta::assert_snapshot!(transcript(
        local(),
        &[
            Step::Req(r#"{"id":"1","op":"read","params":{"h":0,"max":16}}"#),
            Step::Req(r#"{"id":"2","op":"write","params":{"h":1,"data":"aGk="}}"#),
            Step::Req(r#"{"id":"3","op":"write","params":{"h":2,"data":"b29wcw=="}}"#),
            Step::Req(r#"{"id":"4","op":"close","params":{"h":2}}"#),
        ],
    ));
}

#[test]
fn oversized_prefix_ends_the_session() {
    // Frames ahead of the bad prefix are served as far as they can be
    // without waiting on the filesystem; the session then ends at once.
    let mut config = local();
    config.max_frame = 80;
    let mut pipelined = frame::encode(br#"{"id":"1","op":"open","params":{"path":"v","mode":"w"}}"#);
    pipelined
        .extend(frame::encode(br#"{"id":"2","op":"open","params":{"path":"/rw/notes.txt","mode":"r"}}"#));
    pipelined.extend(81u32.to_be_bytes());
    pipelined.extend(br#"{"id":"3"}"#);
    insta::assert_snapshot!(transcript(
        config,
        &[Step::Raw(&pipelined), Step::Req(r#"{"id":"4","op":"QUOTA"}"#)]
    ));
}

#[test]
fn broker_ops() {
    let mut config = local();
    // A small budget, so the soft trim shows.
    config.broker = Some(BrokerSetup::new(Money::from_pico(600_000_000), "sess-7"));
    insta::assert_snapshot!(transcript(
        config,
        &[
            Step::Req(r#"{"id":"1","op":"QUOTA"}"#),
            Step::Req(
                r#"{"id":"2","op":"LLMCMD","params":{"messages":[{"role":"user","content":"2+2?"}],"max_tokens":5000,"cancel_token":"a"}}"#
            ),
            Step::Req(
                r#"{"id":"3","op":"LLMCMD","params":{"messages":[{"role":"user","content":"again"}],"cancel_token":"b"}}"#
            ),
            Step::Req(
                r#"{"id":"4","op":"LLMCMD","params":{"messages":[{"role":"user","content":"x"}],"model":"gpt-5"}}"#
            ),
            Step::Req(r#"{"id":"5","op":"CANCEL","params":{"cancel_token":"b"}}"#),
            Step::Req(r#"{"id":"6","op":"open","params":{"path":"v.txt","mode":"w"}}"#),
            Step::Provider(0, true, (20, 8, 1)),
            Step::Req(r#"{"id":"7","op":"QUOTA"}"#),
            Step::Timer,
            Step::Provider(2, false, (3, 0, 0)),
            Step::Req(
                r#"{"id":"8","op":"LLMCMD","params":{"messages":[{"role":"user","content":"y"}],"model":"nope"}}"#
            ),
            Step::Req(r#"{"id":"9","op":"CANCEL","params":{"cancel_token":"zzz"}}"#),
            Step::Req(
                r#"{"id":"10","op":"LLMCMD","params":{"messages":[{"role":"user","content":"z"}],"cancel_token":"c"}}"#
            ),
            Step::Req(r#"{"id":"11","op":"CANCEL","params":{"cancel_token":"c"}}"#),
            Step::Provider(6, false, (2, 0, 1)),
            Step::Req(r#"{"id":"12","op":"LLMCMD","params":{"messages":[{"role":"user","content":"w"}]}}"#),
            Step::Eof,
        ],
    ));
}
