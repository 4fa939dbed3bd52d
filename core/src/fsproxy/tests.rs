//! Unit and property tests of the FS proxy machine, driven only through
//! `handle` / `poll_output` by the in-memory shell of `crate::fuzzing`.

use super::*;
use crate::fuzzing::{parse_response_json, test_fs, test_policy, Event, Shell};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);

fn shell_with(config: Config) -> Shell {
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    s.connect(B);
    s
}

fn shell() -> Shell {
    shell_with(Config::new(test_policy(), StdioRole::Local))
}

/// Send `req` as `client` and return the one response it gets.
fn call(s: &mut Shell, client: ClientId, req: Value) -> Value {
    let before = s.responses(client).len();
    s.send_json(client, &req);
    let mut got = s.responses(client).split_off(before);
    assert_eq!(got.len(), 1, "{req} got {got:?}");
    got.remove(0)
}

fn open(s: &mut Shell, client: ClientId, path: &str, mode: &str) -> Value {
    call(s, client, json!({"id": "o", "op": "open", "params": {"path": path, "mode": mode}}))
}

fn read(s: &mut Shell, client: ClientId, h: u64, max: u64) -> Value {
    call(s, client, json!({"id": "r", "op": "read", "params": {"h": h, "max": max}}))
}

fn write(s: &mut Shell, client: ClientId, h: u64, data: &[u8]) -> Value {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(data);
    call(s, client, json!({"id": "w", "op": "write", "params": {"h": h, "data": data}}))
}

fn close(s: &mut Shell, client: ClientId, h: u64) -> Value {
    call(s, client, json!({"id": "c", "op": "close", "params": {"h": h}}))
}

fn handle_of(resp: &Value) -> u64 {
    match resp.pointer("/result/handle").and_then(Value::as_u64) {
        Some(h) => h,
        None => panic!("not an open success: {resp}"),
    }
}

fn code(resp: &Value) -> &str {
    match resp.pointer("/error/code").and_then(Value::as_str) {
        Some(c) => c,
        None => panic!("not an error: {resp}"),
    }
}

fn data_of(resp: &Value) -> (Vec<u8>, bool) {
    use base64::Engine as _;
    let d = resp.pointer("/result/data").and_then(Value::as_str).unwrap_or_else(|| panic!("{resp}"));
    let eof = resp.pointer("/result/eof").and_then(Value::as_bool).unwrap_or_else(|| panic!("{resp}"));
    (base64::engine::general_purpose::STANDARD.decode(d).unwrap_or_else(|e| panic!("{e}: {resp}")), eof)
}

/// Contents of `path` wherever the policy puts it.
fn contents(s: &Shell, path: &str) -> Option<Vec<u8>> {
    match test_policy().resolve(path, false) {
        Ok(Resolved::Host { root, rel }) => s.fs.files.get(&(root, rel)).cloned(),
        Ok(Resolved::Virtual { name }) => s.proxy.virtual_file(&name).map(<[u8]>::to_vec),
        Err(d) => panic!("{path}: {d}"),
    }
}

fn effects_of(s: &Shell) -> Vec<Effect> {
    s.effects.iter().map(|(_, e)| e.clone()).collect()
}

#[test]
fn seed_examples_round_trip_for_virtual_and_host_files() {
    for path in ["test.txt", "/rw/test.txt"] {
        let mut s = shell();
        let h = handle_of(&open(&mut s, A, path, "w"));
        let resp = call(
            &mut s,
            A,
            json!({"id": "4", "op": "write", "params": {"h": h, "data": "aGVsbG8=", "final": false}}),
        );
        assert_eq!(resp, json!({"id": "4", "ok": true, "result": {"written": 5}}));
        let resp = call(&mut s, A, json!({"id": "5", "op": "close", "params": {"h": h}}));
        assert_eq!(resp, json!({"id": "5", "ok": true}));
        assert_eq!(contents(&s, path).as_deref(), Some(&b"hello"[..]));

        let h = handle_of(&open(&mut s, A, path, "r"));
        let resp = call(&mut s, A, json!({"id": "2", "op": "read", "params": {"h": h, "max": 4096}}));
        assert_eq!(resp, json!({"id": "2", "ok": true, "result": {"data": "aGVsbG8=", "eof": false}}));
        let resp = call(&mut s, A, json!({"id": "3", "op": "read", "params": {"h": h, "max": 4096}}));
        assert_eq!(resp, json!({"id": "3", "ok": true, "result": {"data": "", "eof": true}}));
        assert_eq!(close(&mut s, A, h)["ok"], json!(true));
        assert_eq!(s.proxy.open_handles(), 0);
        assert_eq!(s.fs.open_files(), 0);
    }
}

#[test]
fn open_response_carries_only_the_handle() {
    let mut s = shell();
    let resp = call(&mut s, A, json!({ "id":"1", "op":"open", "params": { "path":"test.txt", "mode":"w" } }));
    assert_eq!(resp, json!({"id": "1", "ok": true, "result": {"handle": 3}}));
}

#[test]
fn mode_semantics_match_the_seed_for_host_and_virtual_files() {
    for path in ["m.txt", "sub/m.txt", "/rw/m.txt"] {
        let mut s = shell();
        assert_eq!(code(&open(&mut s, A, path, "r")), "E_NOENT", "{path}: r needs an existing file");

        // w creates.
        let w = handle_of(&open(&mut s, A, path, "w"));
        assert_eq!(write(&mut s, A, w, b"abc")["result"]["written"], json!(3));
        assert_eq!(code(&read(&mut s, A, w, 10)), "E_PERM", "{path}: w is write-only");
        close(&mut s, A, w);

        // rw neither truncates nor appends: it writes from the start.
        let rw = handle_of(&open(&mut s, A, path, "rw"));
        assert_eq!(contents(&s, path).as_deref(), Some(&b"abc"[..]), "{path}: rw truncated");
        write(&mut s, A, rw, b"X");
        assert_eq!(data_of(&read(&mut s, A, rw, 10)), (b"bc".to_vec(), false));
        close(&mut s, A, rw);
        assert_eq!(contents(&s, path).as_deref(), Some(&b"Xbc"[..]));

        // a appends and cannot read.
        let a = handle_of(&open(&mut s, A, path, "a"));
        write(&mut s, A, a, b"de");
        assert_eq!(code(&read(&mut s, A, a, 10)), "E_PERM", "{path}: a is write-only");
        close(&mut s, A, a);
        assert_eq!(contents(&s, path).as_deref(), Some(&b"Xbcde"[..]));

        // r reads from the start and cannot write.
        let r = handle_of(&open(&mut s, A, path, "r"));
        assert_eq!(code(&write(&mut s, A, r, b"no")), "E_PERM", "{path}: r is read-only");
        assert_eq!(data_of(&read(&mut s, A, r, 2)), (b"Xb".to_vec(), false));
        assert_eq!(data_of(&read(&mut s, A, r, 4096)), (b"cde".to_vec(), false));
        assert_eq!(data_of(&read(&mut s, A, r, 4096)), (Vec::new(), true));
        close(&mut s, A, r);

        // w on an existing file truncates.
        let w = handle_of(&open(&mut s, A, path, "w"));
        assert_eq!(contents(&s, path).as_deref(), Some(&b""[..]), "{path}: w did not truncate");
        close(&mut s, A, w);

        // a and rw create an absent file.
        for (mode, p) in [("a", format!("{path}.a")), ("rw", format!("{path}.rw"))] {
            let h = handle_of(&open(&mut s, A, &p, mode));
            assert_eq!(contents(&s, &p).as_deref(), Some(&b""[..]), "{p}: {mode} did not create");
            close(&mut s, A, h);
        }
        assert_eq!(s.proxy.open_handles(), 0);
        assert_eq!(s.fs.open_files(), 0);
    }
}

#[test]
fn invalid_open_params_are_e_arg() {
    let mut s = shell();
    for params in [
        json!({"mode": "r"}),
        json!({"path": "x"}),
        json!({"path": "x", "mode": "rwx"}),
        json!({"path": 7, "mode": "r"}),
        json!({"path": "x", "mode": 1}),
        json!({"path": "", "mode": "w"}),
    ] {
        let resp = call(&mut s, A, json!({"id": "p", "op": "open", "params": params}));
        assert_eq!(code(&resp), "E_ARG", "{params}");
        assert_eq!(resp["id"], json!("p"));
    }
    let resp = call(&mut s, A, json!({"id": "p", "op": "open", "params": [1]}));
    assert_eq!(code(&resp), "E_ARG");
    assert!(s.effects.is_empty());
}

#[test]
fn read_max_is_bounded() {
    let mut s = shell();
    let h = handle_of(&open(&mut s, A, "/ro/hello.txt", "r"));
    assert_eq!(code(&read(&mut s, A, h, 0)), "E_ARG");
    assert_eq!(code(&read(&mut s, A, h, 4097)), "E_RANGE");
    let resp = call(&mut s, A, json!({"id": "r", "op": "read", "params": {"h": h}}));
    assert_eq!(code(&resp), "E_ARG");
    let resp = call(&mut s, A, json!({"id": "r", "op": "read", "params": {"h": h, "max": -1}}));
    assert_eq!(code(&resp), "E_ARG");
    assert_eq!(data_of(&read(&mut s, A, h, 4096)), (b"hello".to_vec(), false));
}

#[test]
fn write_params_are_checked() {
    let mut s = shell();
    let h = handle_of(&open(&mut s, A, "v.txt", "w"));
    for params in [
        json!({"h": h}),
        json!({"h": h, "data": "not base64!"}),
        json!({"h": h, "data": 5}),
        json!({"h": h, "data": "", "final": "yes"}),
        json!({"data": ""}),
        json!({"h": "3", "data": ""}),
    ] {
        let resp = call(&mut s, A, json!({"id": "w", "op": "write", "params": params}));
        assert_eq!(code(&resp), "E_ARG", "{params}");
    }
    let resp =
        call(&mut s, A, json!({"id": "w", "op": "write", "params": {"h": h, "data": "", "final": true}}));
    assert_eq!(resp["result"]["written"], json!(0));
}

#[test]
fn closed_unknown_and_foreign_handles() {
    let mut s = shell();
    let h = handle_of(&open(&mut s, A, "/ro/hello.txt", "r"));
    // Another client cannot see it: no such handle, for every op.
    assert_eq!(code(&read(&mut s, B, h, 1)), "E_NOENT");
    assert_eq!(code(&close(&mut s, B, h)), "E_NOENT");
    assert_eq!(close(&mut s, A, h), json!({"id": "c", "ok": true}));
    assert_eq!(code(&close(&mut s, A, h)), "E_CLOSED");
    assert_eq!(code(&read(&mut s, A, h, 1)), "E_CLOSED");
    assert_eq!(code(&write(&mut s, A, h, b"x")), "E_CLOSED");
    assert_eq!(code(&read(&mut s, A, 99, 1)), "E_NOENT");
    assert_eq!(code(&close(&mut s, A, 99)), "E_NOENT");
    assert_eq!(code(&write(&mut s, A, u64::MAX, b"x")), "E_NOENT");
    assert_eq!(s.fs.open_files(), 0);
}

#[test]
fn handles_start_at_three_and_are_never_reused() {
    let mut s = shell();
    let mut seen = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 { A } else { B };
        let path = if i % 3 == 0 { "/ro/hello.txt" } else { "v.txt" };
        let mode = if i % 3 == 0 { "r" } else { "a" };
        let h = handle_of(&open(&mut s, client, path, mode));
        seen.push(h);
        if i % 2 == 1 {
            close(&mut s, client, h);
        }
    }
    assert_eq!(seen, vec![3, 4, 5, 6, 7, 8]);
}

#[test]
fn malformed_frames_get_e_arg_and_the_session_continues() {
    let mut s = shell();
    let bad: [&[u8]; 9] = [
        b"",
        b"not json",
        b"\xff\xfe\x00garbage",
        b"[1,2,3]",
        b"\"open\"",
        b"null",
        br#"{"op":"open","params":{"path":"x","mode":"r"}}"#,
        br#"{"id":7,"op":"open","params":{"path":"x","mode":"r"}}"#,
        br#"{"id":"1","op":"open""#,
    ];
    for payload in bad {
        s.send(A, payload);
        let resp = s.responses(A).pop().unwrap_or_else(|| panic!("no response"));
        assert_eq!(resp["id"], Value::Null, "{}", String::from_utf8_lossy(payload));
        assert_eq!(code(&resp), "E_ARG");
    }
    assert_eq!(s.responses(A).len(), bad.len());
    // Readable id, bad envelope: the error carries the id.
    for req in
        [json!({"id": "x"}), json!({"id": "x", "op": 3}), json!({"id": "x", "op": "close", "params": 1})]
    {
        let resp = call(&mut s, A, req.clone());
        assert_eq!(resp["id"], json!("x"), "{req}");
        assert_eq!(code(&resp), "E_ARG");
    }
    assert_eq!(handle_of(&open(&mut s, A, "/ro/hello.txt", "r")), 3);
    assert!(!s.events.iter().any(|e| matches!(e, Event::Closed(_))));
}

#[test]
fn unknown_and_reserved_ops_are_unsupported() {
    let mut s = shell();
    for op in ["chmod", "OPEN", "unlink", "QUOTA", "LLMCMD", "CANCEL"] {
        let resp = call(&mut s, A, json!({"id": op, "op": op, "params": {"prompt": "hi"}}));
        assert_eq!(resp["id"], json!(op));
        assert_eq!(code(&resp), "E_UNSUPPORTED", "{op}");
    }
    let resp = call(&mut s, A, json!({"id": "q", "op": "QUOTA"}));
    assert_eq!(code(&resp), "E_UNSUPPORTED");
}

fn pipelined_requests() -> Vec<Value> {
    let mut reqs = vec![
        json!({"id": "1", "op": "open", "params": {"path": "/rw/p.txt", "mode": "w"}}),
        json!({"id": "2", "op": "open", "params": {"path": "p.txt", "mode": "w"}}),
        json!({"id": "3", "op": "bogus"}),
    ];
    for i in 0..10 {
        reqs.push(json!({"id": format!("w{i}"), "op": "write", "params": {"h": 3 + i % 2, "data": "aGk="}}));
    }
    reqs.push(json!({"id": "4", "op": "read", "params": {"h": 3, "max": 0}}));
    reqs.push(json!({"id": "5", "op": "close", "params": {"h": 3}}));
    reqs.push(json!({"id": "6", "op": "close", "params": {"h": 4}}));
    reqs.push(json!({"id": "7", "op": "open", "params": {"path": "/rw/p.txt", "mode": "r"}}));
    reqs.push(json!({"id": "8", "op": "read", "params": {"h": 5, "max": 4096}}));
    reqs
}

fn stream(reqs: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in reqs {
        frame::encode_into(r.to_string().as_bytes(), &mut out);
    }
    out
}

#[test]
fn pipelined_requests_get_one_response_each_in_order() {
    let reqs = pipelined_requests();
    let mut s = shell();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    let ids: Vec<Value> = s.responses(A).iter().map(|r| r["id"].clone()).collect();
    let want: Vec<Value> = reqs.iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, want);
    let last = s.responses(A).pop().unwrap_or_default();
    assert_eq!(data_of(&last), (b"hihihihihi".to_vec(), false));
    assert_eq!(s.proxy.virtual_file("p.txt"), Some(&b"hihihihihi"[..]));
}

#[test]
fn pipelined_host_requests_wait_for_each_other() {
    // With effects left pending, only the first request is being served;
    // the rest, even those answerable at once, queue behind it.
    let reqs = pipelined_requests();
    let mut s = shell();
    s.auto = false;
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    assert!(s.responses(A).is_empty());
    assert_eq!(s.effects.len(), 1);
    s.settle();
    assert_eq!(s.responses(A).len(), reqs.len());
}

#[test]
fn byte_at_a_time_gives_the_same_transcript() {
    let reqs = pipelined_requests();
    let bytes = stream(&reqs);
    let mut whole = shell();
    whole.input(Input::Bytes { client: A, data: bytes.clone() });
    let mut split = shell();
    for b in &bytes {
        split.input(Input::Bytes { client: A, data: vec![*b] });
    }
    assert_eq!(whole.events, split.events);
    assert_eq!(whole.responses(A).len(), reqs.len());
}

#[test]
fn oversized_prefix_answers_once_then_closes_and_cleans_up() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_frame = 1000;
    let mut s = shell_with(config);
    handle_of(&open(&mut s, A, "/rw/notes.txt", "rw"));
    handle_of(&open(&mut s, A, "v.txt", "w"));
    let other = handle_of(&open(&mut s, B, "/ro/hello.txt", "r"));
    s.auto = false;
    let before = s.events.len();
    let mut bytes = 1001u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(b"{\"id\":\"never\"}");
    s.input(Input::Bytes { client: A, data: bytes });
    let new = s.events[before..].to_vec();
    assert_eq!(new.len(), 2, "{new:?}");
    let Event::Sent(c, payload) = &new[0] else { panic!("{new:?}") };
    assert_eq!(*c, A);
    let resp = parse_response_json(payload);
    assert_eq!(resp["id"], Value::Null);
    assert_eq!(code(&resp), "E_RANGE");
    assert_eq!(new[1], Event::Closed(A));
    assert!(matches!(effects_of(&s)[..], [Effect::Close { .. }]), "{:?}", s.effects);
    s.settle();
    assert_eq!(s.proxy.stats().frames_rejected, 1);
    assert_eq!(s.proxy.stats().handles_cleaned_up, 2);
    assert_eq!(s.proxy.handles_of(A), 0);
    // The other client is untouched.
    assert_eq!(s.fs.open_files(), 1);
    s.auto = true;
    assert_eq!(data_of(&read(&mut s, B, other, 5)).0, b"hello");
    // Nothing more reaches the closed client.
    s.send_json(A, &json!({"id": "late", "op": "QUOTA"}));
    assert_eq!(s.responses(A).len(), 3);
}

fn departure_cleans_everything(depart: Input) {
    let mut s = shell();
    for path in ["/rw/notes.txt", "/ro/hello.txt"] {
        handle_of(&open(&mut s, A, path, "r"));
    }
    handle_of(&open(&mut s, A, "/rw/new.txt", "w"));
    handle_of(&open(&mut s, A, "v.txt", "w"));
    handle_of(&open(&mut s, B, "/ro/hello.txt", "r"));
    assert_eq!(s.fs.open_files(), 4);
    s.auto = false;
    s.input(depart);
    let closes = effects_of(&s).iter().filter(|e| matches!(e, Effect::Close { .. })).count();
    assert_eq!(closes, 3, "{:?}", s.effects);
    assert_eq!(s.effects.len(), 3);
    assert_eq!(s.proxy.stats().handles_cleaned_up, 4);
    assert_eq!(s.proxy.handles_of(A), 0);
    assert_eq!(s.proxy.open_handles(), 1);
    assert!(s.events.contains(&Event::Closed(A)));
    s.settle();
    assert_eq!(s.fs.open_files(), 1);
    assert_eq!(s.proxy.tracked_clients(), 1);
    s.input(Input::Eof { client: B });
    s.settle();
    assert_eq!(s.proxy.open_handles(), 0);
    assert_eq!(s.proxy.tracked_clients(), 0);
    assert_eq!(s.fs.open_files(), 0);
    assert!(s.proxy.quiescent());
    assert_eq!(s.proxy.stats().handles_cleaned_up, 5);
    // The virtual file outlives its handle.
    assert_eq!(s.proxy.virtual_file("v.txt"), Some(&b""[..]));
}

#[test]
fn eof_with_open_handles_closes_every_host_file() {
    departure_cleans_everything(Input::Eof { client: A });
}

#[test]
fn death_with_open_handles_closes_every_host_file() {
    departure_cleans_everything(Input::Died { client: A });
}

#[test]
fn eof_then_death_cleans_up_once() {
    let mut s = shell();
    handle_of(&open(&mut s, A, "/ro/hello.txt", "r"));
    s.input(Input::Eof { client: A });
    s.input(Input::Died { client: A });
    assert_eq!(s.events.iter().filter(|e| **e == Event::Closed(A)).count(), 1);
    assert_eq!(s.proxy.stats().handles_cleaned_up, 1);
    assert_eq!(s.fs.open_files(), 0);
}

#[test]
fn eof_mid_frame_counts_a_truncated_frame() {
    let mut s = shell();
    s.input(Input::Bytes { client: A, data: vec![0, 0, 0, 9, b'{'] });
    s.input(Input::Eof { client: A });
    assert_eq!(s.proxy.stats().truncated_frames, 1);
    assert!(s.responses(A).is_empty());
    s.input(Input::Eof { client: B });
    assert_eq!(s.proxy.stats().truncated_frames, 1);
}

#[test]
fn death_while_an_effect_is_in_flight_waits_then_closes() {
    let mut s = shell();
    let h = handle_of(&open(&mut s, A, "/rw/notes.txt", "rw"));
    s.auto = false;
    s.send_json(A, &json!({"id": "w", "op": "write", "params": {"h": h, "data": "TkVX"}}));
    s.send_json(A, &json!({"id": "q", "op": "read", "params": {"h": h, "max": 9}}));
    assert!(matches!(effects_of(&s)[..], [Effect::Write { .. }]));
    let responses = s.responses(A).len();
    s.input(Input::Died { client: A });
    // The close must not overtake the write.
    assert!(matches!(effects_of(&s)[..], [Effect::Write { .. }]), "{:?}", s.effects);
    assert_eq!(s.proxy.open_handles(), 1);
    s.complete(0, false);
    assert!(matches!(effects_of(&s)[..], [Effect::Close { .. }]), "{:?}", s.effects);
    assert_eq!(s.proxy.open_handles(), 0);
    s.settle();
    assert_eq!(s.responses(A).len(), responses, "answered a dead client");
    assert_eq!(s.fs.open_files(), 0);
    assert_eq!(s.proxy.tracked_clients(), 1);
    // The acknowledged-or-not write still landed before the close.
    assert_eq!(s.fs.files[&(RootId(1), "notes.txt".into())], b"NEW notes");
}

#[test]
fn open_completing_after_death_is_closed_at_once() {
    for depart in [Input::Died { client: A }, Input::Eof { client: A }] {
        let mut s = shell();
        s.auto = false;
        s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/new.txt", "mode": "w"}}));
        assert!(matches!(effects_of(&s)[..], [Effect::Open { .. }]));
        s.input(depart.clone());
        assert_eq!(s.effects.len(), 1, "nothing to close yet");
        s.complete(0, false);
        assert!(matches!(effects_of(&s)[..], [Effect::Close { .. }]), "{:?}", s.effects);
        s.settle();
        assert!(s.responses(A).is_empty());
        assert_eq!(s.proxy.open_handles(), 0);
        assert_eq!(s.fs.open_files(), 0);
        assert_eq!(s.proxy.tracked_clients(), 1);
        assert_eq!(s.proxy.stats().handles_opened, 0);
    }
}

#[test]
fn failed_open_after_death_needs_no_close() {
    let mut s = shell();
    s.auto = false;
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/new.txt", "mode": "w"}}));
    s.input(Input::Died { client: A });
    s.complete(0, true);
    assert!(s.effects.is_empty());
    assert_eq!(s.proxy.tracked_clients(), 1);
    assert!(s.responses(A).is_empty());
}

#[test]
fn effect_failures_map_to_error_codes() {
    let mut s = shell();
    s.auto = false;
    let cases =
        [(FsErrorKind::NotFound, "E_NOENT"), (FsErrorKind::Denied, "E_PERM"), (FsErrorKind::Other, "E_IO")];
    for (kind, want) in cases {
        s.send_json(A, &json!({"id": want, "op": "open", "params": {"path": "/rw/x", "mode": "w"}}));
        let (id, _) = s.effects.remove(0);
        s.input(Input::EffectDone { id, result: EffectResult::Failed { kind, message: "no".into() } });
        let resp = s.responses(A).pop().unwrap_or_default();
        assert_eq!(resp["id"], json!(want));
        assert_eq!(code(&resp), want);
    }
    assert_eq!(s.proxy.open_handles(), 0);
    // A completion nobody waits for is ignored.
    s.input(Input::EffectDone { id: EffectId(999), result: EffectResult::Closed });
    assert_eq!(s.responses(A).len(), 3);
}

#[test]
fn reject_role_refuses_stdio_handles() {
    let mut s = shell_with(Config::new(test_policy(), StdioRole::Reject));
    for h in 0..3 {
        assert_eq!(code(&read(&mut s, A, h, 1)), "E_PERM");
        assert_eq!(code(&write(&mut s, A, h, b"x")), "E_PERM");
        assert_eq!(code(&close(&mut s, A, h)), "E_PERM");
    }
    assert!(s.effects.is_empty());
    assert!(s.fs.stdout.is_empty());
}

#[test]
fn local_role_serves_stdio_itself() {
    for upstream in [false, true] {
        let mut config = Config::new(test_policy(), StdioRole::Local);
        config.upstream = upstream;
        let mut s = shell_with(config);
        assert_eq!(data_of(&read(&mut s, A, 0, 5)), (b"typed".to_vec(), false));
        assert_eq!(write(&mut s, A, 1, b"out")["result"]["written"], json!(3));
        assert_eq!(write(&mut s, A, 2, b"err")["result"]["written"], json!(3));
        assert_eq!(code(&read(&mut s, A, 1, 5)), "E_PERM");
        assert_eq!(code(&read(&mut s, A, 2, 5)), "E_PERM");
        assert_eq!(code(&write(&mut s, A, 0, b"in")), "E_PERM");
        for h in 0..3 {
            assert_eq!(close(&mut s, A, h), json!({"id": "c", "ok": true}));
            // Closing stdio is a no-op: it can be closed again.
            assert_eq!(close(&mut s, A, h)["ok"], json!(true));
        }
        assert_eq!(data_of(&read(&mut s, A, 0, 4096)), (b" on stdin\n".to_vec(), false));
        assert_eq!(s.fs.stdout, b"out");
        assert_eq!(s.fs.stderr, b"err");
        assert!(s.take_upstream().is_empty(), "stdio went upstream");
        assert_eq!(s.proxy.open_handles(), 0);
    }
}

#[test]
fn stdio_read_pending_does_not_hold_up_cleanup() {
    let mut s = shell();
    handle_of(&open(&mut s, A, "/ro/hello.txt", "r"));
    s.auto = false;
    s.send_json(A, &json!({"id": "in", "op": "read", "params": {"h": 0, "max": 10}}));
    assert!(matches!(effects_of(&s)[..], [Effect::ReadStdin { max: 10 }]));
    assert!(s.proxy.quiescent());
    s.input(Input::Died { client: A });
    assert!(effects_of(&s).iter().any(|e| matches!(e, Effect::Close { .. })));
    s.settle();
    assert_eq!(s.fs.open_files(), 0);
    assert_eq!(s.proxy.tracked_clients(), 1);
}

#[test]
fn policy_refusals_never_reach_the_filesystem() {
    let mut s = shell();
    s.auto = false;
    for (path, mode) in [
        ("../outside.txt", "r"),
        ("a/../../b", "w"),
        ("/etc/passwd", "r"),
        ("/ro/../etc/passwd", "r"),
        ("/rwx/file", "w"),
        ("a\0b", "w"),
        ("/ro/hello.txt", "w"),
        ("/ro/hello.txt", "a"),
        ("/ro/hello.txt", "rw"),
        ("/ro/new.txt", "w"),
    ] {
        let resp = open(&mut s, A, path, mode);
        assert_eq!(code(&resp), "E_PERM", "{path:?} {mode}");
    }
    assert!(s.effects.is_empty());
    assert_eq!(s.proxy.stats().errors_by_code.get(&ErrorCode::Perm), Some(&10));
    // Escapes stay refused when they only look inside.
    assert_eq!(code(&open(&mut s, A, "/rw/../ro/hello.txt", "w")), "E_PERM");
    s.auto = true;
    assert_eq!(handle_of(&open(&mut s, A, "/rw/../ro/./hello.txt", "r")), 3);
}

#[test]
fn handle_limit_counts_opens_under_way() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_open_handles = 2;
    let mut s = shell_with(config);
    s.auto = false;
    s.send_json(A, &json!({"id": "1", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
    s.send_json(B, &json!({"id": "2", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
    let c = ClientId(3);
    s.connect(c);
    assert_eq!(code(&open(&mut s, c, "v.txt", "w")), "E_RANGE");
    s.settle();
    s.auto = true;
    assert_eq!(s.proxy.open_handles(), 2);
    assert_eq!(code(&open(&mut s, c, "v.txt", "w")), "E_RANGE");
    close(&mut s, A, 3);
    assert_eq!(handle_of(&open(&mut s, c, "v.txt", "w")), 5);
}

#[test]
fn queue_limit_refuses_excess_requests() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_queued_requests = 2;
    let mut s = shell_with(config);
    s.auto = false;
    let reqs: Vec<Value> = (0..5)
        .map(|i| json!({"id": i.to_string(), "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}))
        .collect();
    s.input(Input::Bytes { client: A, data: stream(&reqs) });
    // One being served, two waiting behind it, two refused at once.
    let refused: Vec<Value> = s.responses(A).iter().map(|r| r["id"].clone()).collect();
    assert_eq!(refused, vec![json!("3"), json!("4")]);
    assert!(s.responses(A).iter().all(|r| code(r) == "E_RANGE"));
    s.settle();
    assert_eq!(s.responses(A).len(), 5);
}

#[test]
fn virtual_byte_limit_is_e_range() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    // The name's five bytes count too.
    config.max_virtual_bytes = 13;
    let mut s = shell_with(config);
    let h = handle_of(&open(&mut s, A, "v.txt", "w"));
    assert_eq!(write(&mut s, A, h, b"12345678")["result"]["written"], json!(8));
    assert_eq!(code(&write(&mut s, A, h, b"9")), "E_RANGE");
    // Truncating frees the space again.
    let h2 = handle_of(&open(&mut s, A, "v.txt", "w"));
    assert_eq!(write(&mut s, A, h2, b"abc")["result"]["written"], json!(3));
}

// ---- the forwarding role -------------------------------------------------

#[test]
fn attach_without_a_descriptor_is_e_arg() {
    let mut s = shell();
    let r = call(&mut s, A, json!({"id": "a", "op": "attach"}));
    assert_eq!(code(&r), "E_ARG");
    assert!(!s.events.iter().any(|e| matches!(e, Event::Attached(..))));
}

#[test]
fn attach_serves_the_passed_descriptor_as_a_client_of_its_own() {
    let mut s = shell();
    s.input(Input::Descriptor { client: A });
    let before = s.responses(A).len();
    s.send_json(A, &json!({"id": "a", "op": "attach"}));
    // Answered on the new connection, never on the shared one.
    assert_eq!(s.responses(A).len(), before);
    let new = match s.events.iter().rev().find(|e| matches!(e, Event::Attached(..))) {
        Some(Event::Attached(from, new)) => {
            assert_eq!(*from, A);
            *new
        }
        _ => panic!("no attach in {:?}", s.events),
    };
    assert!(new.0 >= ATTACHED_CLIENT_BASE);
    assert_eq!(s.responses(new), vec![json!({"id": "a", "ok": true})]);
    // Its handles are its own: the sharer cannot use them, and they are
    // cleaned up when it leaves while the sharer carries on.
    let h = handle_of(&open(&mut s, new, "/rw/att.txt", "w"));
    assert_eq!(code(&write(&mut s, A, h, b"x")), "E_NOENT");
    assert_eq!(write(&mut s, new, h, b"mine")["ok"], true);
    s.input(Input::Died { client: new });
    assert_eq!(s.proxy.handles_of(new), 0);
    assert_eq!(contents(&s, "/rw/att.txt").as_deref(), Some(&b"mine"[..]));
    assert_eq!(s.proxy.stats().handles_cleaned_up, 1);
    let h2 = handle_of(&open(&mut s, A, "v", "w"));
    assert!(h2 > h, "handles are never reused across clients");
    // One descriptor, one attach.
    let r = call(&mut s, A, json!({"id": "b", "op": "attach"}));
    assert_eq!(code(&r), "E_ARG");
}

fn intermediate() -> Shell {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.upstream = true;
    shell_with(config)
}

/// What the intermediate sent upstream, its own `narrow` answered (and
/// left out) on the way: what it held back for the answer follows.
fn upstream_requests(s: &mut Shell) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let frames = s.take_upstream();
        if frames.is_empty() {
            return out;
        }
        for f in frames {
            assert_eq!(u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize, f.len() - 4);
            let v: Value = serde_json::from_slice(&f[4..]).unwrap_or_else(|e| panic!("{e}"));
            if v["op"] == "narrow" {
                reply_upstream(s, json!({"id": v["id"], "ok": true, "result": {}}));
            } else {
                out.push(v);
            }
        }
    }
}

fn reply_upstream(s: &mut Shell, resp: Value) {
    s.input(Input::UpstreamBytes { data: frame::encode(resp.to_string().as_bytes()) });
}

#[test]
fn forwarding_maps_ids_and_handles() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a1", "op": "open", "params": {"path": "/rw/notes.txt", "mode": "rw"}}));
    s.send_json(B, &json!({"id": "b1", "op": "open", "params": {"path": "/rw/scratch", "mode": "w"}}));
    let up = upstream_requests(&mut s);
    assert_eq!(
        up,
        vec![
            json!({"id": "u1", "op": "open", "params": {"path": "/rw/notes.txt", "mode": "rw"}}),
            json!({"id": "u2", "op": "open", "params": {"path": "/rw/scratch", "mode": "w"}}),
        ]
    );
    assert!(s.effects.is_empty(), "a forwarding proxy touched files itself");
    // Answers may come back in any order.
    reply_upstream(&mut s, json!({"id": "u2", "ok": true, "result": {"handle": 41}}));
    reply_upstream(&mut s, json!({"id": "u1", "ok": true, "result": {"handle": 40}}));
    assert_eq!(s.responses(B), vec![json!({"id": "b1", "ok": true, "result": {"handle": 3}})]);
    assert_eq!(s.responses(A), vec![json!({"id": "a1", "ok": true, "result": {"handle": 4}})]);

    s.send_json(A, &json!({"id": "a2", "op": "read", "params": {"h": 4, "max": 10}}));
    s.send_json(A, &json!({"id": "a3", "op": "write", "params": {"h": 4, "data": "aGk="}}));
    // A's second request waits for its first.
    let up = upstream_requests(&mut s);
    assert_eq!(up, vec![json!({"id": "u3", "op": "read", "params": {"h": 40, "max": 10}})]);
    reply_upstream(&mut s, json!({"id": "u3", "ok": true, "result": {"data": "aGVsbG8=", "eof": false}}));
    let up = upstream_requests(&mut s);
    assert_eq!(up, vec![json!({"id": "u4", "op": "write", "params": {"h": 40, "data": "aGk="}})]);
    reply_upstream(&mut s, json!({"id": "u4", "ok": false, "error": {"code": "E_IO", "message": "disk"}}));
    let got = s.responses(A);
    assert_eq!(got[1], json!({"id": "a2", "ok": true, "result": {"data": "aGVsbG8=", "eof": false}}));
    assert_eq!(got[2], json!({"id": "a3", "ok": false, "error": {"code": "E_IO", "message": "disk"}}));
    // Handles of this level are checked here, not upstream.
    assert_eq!(code(&read(&mut s, A, 3, 1)), "E_NOENT");
    assert_eq!(code(&open(&mut s, A, "../x", "r")), "E_PERM");
    assert!(upstream_requests(&mut s).is_empty());

    // Death: a close goes upstream for each handle A held.
    s.input(Input::Died { client: A });
    let up = upstream_requests(&mut s);
    assert_eq!(up, vec![json!({"id": "u5", "op": "close", "params": {"h": 40}})]);
    assert_eq!(s.proxy.open_handles(), 1);
    assert_eq!(s.proxy.tracked_clients(), 1);
    reply_upstream(&mut s, json!({"id": "u5", "ok": true}));
    // Garbage and unknown ids from upstream are counted, not fatal.
    reply_upstream(&mut s, json!({"id": "u100", "ok": true}));
    s.input(Input::UpstreamBytes { data: frame::encode(b"nope") });
    assert_eq!(s.proxy.stats().upstream_errors, 2);
    assert_eq!(code(&read(&mut s, B, 99, 1)), "E_NOENT");
}

#[test]
fn bad_upstream_response_is_e_io() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a", "op": "open", "params": {"path": "/rw/x", "mode": "w"}}));
    reply_upstream(&mut s, json!({"id": "u1", "ok": true, "result": {"nohandle": 1}}));
    let resp = s.responses(A).pop().unwrap_or_default();
    assert_eq!(resp["id"], json!("a"));
    assert_eq!(code(&resp), "E_IO");
    assert_eq!(s.proxy.open_handles(), 0);
}

#[test]
fn forwarded_read_data_is_checked_before_it_is_passed_on() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a", "op": "open", "params": {"path": "/rw/x", "mode": "r"}}));
    upstream_requests(&mut s);
    reply_upstream(&mut s, json!({"id": "u1", "ok": true, "result": {"handle": 7}}));
    assert_eq!(handle_of(&s.responses(A)[0]), 3);
    // Each answer as a hostile upstream might send it, for a read of at
    // most 4 bytes: none may reach the client.
    let bad = [
        ("aGVsbG8=", "exceeds the 4 bytes asked for"),
        ("aGk", "not base64"),
        ("aGk==", "not base64"),
        ("aGl=", "not base64"),
        ("aG!=", "not base64"),
        ("aGk=\n", "not base64"),
    ];
    let mut next = 2;
    for (i, (data, why)) in bad.iter().enumerate() {
        let id = format!("r{i}");
        s.send_json(A, &json!({"id": id, "op": "read", "params": {"h": 3, "max": 4}}));
        assert_eq!(upstream_requests(&mut s).len(), 1);
        reply_upstream(
            &mut s,
            json!({"id": format!("u{next}"), "ok": true, "result": {"data": data, "eof": false}}),
        );
        next += 1;
        let resp = s.responses(A).pop().unwrap_or_default();
        assert_eq!(resp["id"], json!(id));
        assert_eq!(code(&resp), "E_IO", "{data} passed: {resp}");
        let msg = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(why), "{data}: {msg}");
    }
    assert_eq!(s.proxy.stats().upstream_errors, bad.len() as u64);
    // Exactly the asked-for size, and the empty read at EOF, pass.
    for (data, eof) in [("aGVsbA==", false), ("", true)] {
        s.send_json(A, &json!({"id": "ok", "op": "read", "params": {"h": 3, "max": 4}}));
        upstream_requests(&mut s);
        reply_upstream(
            &mut s,
            json!({"id": format!("u{next}"), "ok": true, "result": {"data": data, "eof": eof}}),
        );
        next += 1;
        let resp = s.responses(A).pop().unwrap_or_default();
        assert_eq!(resp, json!({"id": "ok", "ok": true, "result": {"data": data, "eof": eof}}));
    }
    assert_eq!(s.proxy.stats().upstream_errors, bad.len() as u64);
}

#[test]
fn upstream_eof_answers_pending_requests_with_e_io() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a1", "op": "open", "params": {"path": "/rw/notes.txt", "mode": "r"}}));
    reply_upstream(&mut s, json!({"id": "u1", "ok": true, "result": {"handle": 9}}));
    s.send_json(A, &json!({"id": "a2", "op": "read", "params": {"h": 3, "max": 1}}));
    s.send_json(A, &json!({"id": "a3", "op": "read", "params": {"h": 3, "max": 1}}));
    s.send_json(B, &json!({"id": "b1", "op": "open", "params": {"path": "/rw/y", "mode": "w"}}));
    assert_eq!(upstream_requests(&mut s).len(), 3);
    s.input(Input::UpstreamEof);
    let a: Vec<(Value, String)> = s.responses(A).iter().map(|r| (r["id"].clone(), code_or_ok(r))).collect();
    assert_eq!(
        a,
        vec![(json!("a1"), "ok".into()), (json!("a2"), "E_IO".into()), (json!("a3"), "E_IO".into())]
    );
    let b = s.responses(B);
    assert_eq!((b[0]["id"].clone(), code(&b[0])), (json!("b1"), "E_IO"));
    // Later requests fail at once; close of a handle upstream already
    // dropped succeeds; stdio still works.
    assert_eq!(code(&open(&mut s, B, "/rw/z", "w")), "E_IO");
    assert_eq!(close(&mut s, A, 3)["ok"], json!(true));
    assert_eq!(write(&mut s, A, 1, b"x")["ok"], json!(true));
    assert!(upstream_requests(&mut s).is_empty());
    assert_eq!(s.proxy.open_handles(), 0);
}

fn code_or_ok(r: &Value) -> String {
    if r["ok"] == json!(true) {
        "ok".into()
    } else {
        code(r).to_owned()
    }
}

/// An intermediate proxy wired to a top-level server.
struct Chain {
    mid: Shell,
    top: Shell,
}

const UP: ClientId = ClientId(100);

impl Chain {
    fn new() -> Self {
        let mut top = Shell::new(Config::new(test_policy(), StdioRole::Reject), test_fs());
        top.connect(UP);
        Chain { mid: intermediate(), top }
    }

    /// Carry frames both ways until neither side has anything to say.
    fn pump(&mut self) {
        loop {
            let up = self.mid.take_upstream();
            let down = self.top.take_sent(UP);
            if up.is_empty() && down.is_empty() {
                return;
            }
            for f in up {
                self.top.input(Input::Bytes { client: UP, data: f });
            }
            for p in down {
                self.mid.input(Input::UpstreamBytes { data: frame::encode(&p) });
            }
        }
    }

    fn call(&mut self, client: ClientId, req: Value) -> Value {
        let before = self.mid.responses(client).len();
        self.mid.send_json(client, &req);
        self.pump();
        let mut got = self.mid.responses(client).split_off(before);
        assert_eq!(got.len(), 1, "{req}: {got:?}");
        got.remove(0)
    }
}

#[test]
fn chained_proxies_clean_up_on_both_levels() {
    let mut c = Chain::new();
    // Burn a top-level handle so the two levels number differently.
    c.top.connect(ClientId(7));
    handle_of(&open(&mut c.top, ClientId(7), "/ro/hello.txt", "r"));

    let h1 = handle_of(
        &c.call(A, json!({"id": "1", "op": "open", "params": {"path": "/rw/notes.txt", "mode": "rw"}})),
    );
    let h2 =
        handle_of(&c.call(A, json!({"id": "2", "op": "open", "params": {"path": "virt.txt", "mode": "w"}})));
    let h3 = handle_of(
        &c.call(B, json!({"id": "3", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}})),
    );
    assert_eq!((h1, h2, h3), (3, 4, 5));
    let resp = c.call(A, json!({"id": "4", "op": "write", "params": {"h": h2, "data": "aGk="}}));
    assert_eq!(resp["result"]["written"], json!(2));
    let resp = c.call(A, json!({"id": "5", "op": "read", "params": {"h": h1, "max": 3}}));
    assert_eq!(data_of(&resp).0, b"old");
    let resp = c.call(B, json!({"id": "6", "op": "read", "params": {"h": 1, "max": 3}}));
    assert_eq!(code(&resp), "E_PERM", "stdio read of stdout");
    let resp = c.call(B, json!({"id": "7", "op": "write", "params": {"h": 1, "data": "aGk="}}));
    assert_eq!(resp["result"]["written"], json!(2));
    assert_eq!(c.mid.fs.stdout, b"hi");
    // The intermediate's virtual namespace is its own.
    assert_eq!(c.mid.proxy.virtual_file("virt.txt"), Some(&b"hi"[..]));
    assert_eq!(c.top.proxy.virtual_file("virt.txt"), None);
    assert_eq!(c.top.proxy.handles_of(UP), 2);
    assert_eq!(c.top.fs.open_files(), 3);

    c.mid.input(Input::Died { client: A });
    c.pump();
    assert_eq!(c.mid.proxy.open_handles(), 1);
    assert_eq!(c.top.proxy.handles_of(UP), 1);
    assert_eq!(c.top.fs.open_files(), 2);

    c.mid.input(Input::Eof { client: B });
    c.pump();
    assert_eq!(c.mid.proxy.open_handles(), 0);
    assert_eq!(c.mid.proxy.tracked_clients(), 0);
    assert_eq!(c.top.proxy.handles_of(UP), 0);
    assert_eq!(c.top.fs.open_files(), 1);
    // Closes sent on behalf of the dead are never answered downstream.
    assert_eq!(c.mid.responses(A).len(), 4);

    c.top.input(Input::Eof { client: ClientId(7) });
    c.top.input(Input::Eof { client: UP });
    assert_eq!(c.top.proxy.open_handles(), 0);
    assert_eq!(c.top.proxy.tracked_clients(), 0);
    assert_eq!(c.top.fs.open_files(), 0);
}

#[test]
fn intermediate_death_closes_everything_on_the_top_level() {
    let mut c = Chain::new();
    for (i, client) in [A, B].into_iter().enumerate() {
        let path = if i == 0 { "/rw/notes.txt" } else { "/ro/hello.txt" };
        handle_of(&c.call(client, json!({"id": "o", "op": "open", "params": {"path": path, "mode": "r"}})));
    }
    assert_eq!(c.top.fs.open_files(), 2);
    // The intermediate itself dies: its pipe to the top hits EOF.
    c.top.input(Input::Died { client: UP });
    assert_eq!(c.top.proxy.open_handles(), 0);
    assert_eq!(c.top.fs.open_files(), 0);
    c.mid.input(Input::UpstreamEof);
    assert_eq!(code(&c.call(A, json!({"id": "r", "op": "read", "params": {"h": 3, "max": 1}}))), "E_IO");
    c.mid.input(Input::Eof { client: A });
    c.mid.input(Input::Eof { client: B });
    assert_eq!(c.mid.proxy.open_handles(), 0);
    assert_eq!(c.mid.proxy.tracked_clients(), 0);
}

#[test]
fn upstream_open_answered_after_death_is_closed_upstream() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a", "op": "open", "params": {"path": "/rw/x", "mode": "w"}}));
    s.input(Input::Eof { client: A });
    assert_eq!(upstream_requests(&mut s).len(), 1);
    reply_upstream(&mut s, json!({"id": "u1", "ok": true, "result": {"handle": 12}}));
    assert_eq!(upstream_requests(&mut s), vec![json!({"id": "u2", "op": "close", "params": {"h": 12}})]);
    assert!(s.responses(A).is_empty());
    assert_eq!(s.proxy.open_handles(), 0);
}

// ---- properties ------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Request { client: u8, kind: u8, arg: u8 },
    Garbage { client: u8 },
    Complete { idx: u8, fail: bool },
    Depart { client: u8, died: bool },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..3, any::<u8>(), any::<u8>()).prop_map(|(client, kind, arg)| Step::Request { client, kind, arg }),
        1 => (0u8..3).prop_map(|client| Step::Garbage { client }),
        4 => (any::<u8>(), prop::bool::weighted(0.1)).prop_map(|(idx, fail)| Step::Complete { idx, fail }),
        1 => (0u8..3, any::<bool>()).prop_map(|(client, died)| Step::Depart { client, died }),
    ]
}

const PATHS: [&str; 7] =
    ["/ro/hello.txt", "/rw/notes.txt", "/rw/a.txt", "v1.txt", "d/v2.txt", "../out", "/etc/shadow"];
const MODES: [&str; 4] = ["r", "w", "a", "rw"];

fn request(id: &str, kind: u8, arg: u8, known: &[u64]) -> Value {
    let h = if known.is_empty() || arg.is_multiple_of(4) {
        u64::from(arg % 12)
    } else {
        known[usize::from(arg) % known.len()]
    };
    match kind % 10 {
        0..=2 => json!({"id": id, "op": "open", "params": {
            "path": PATHS[usize::from(arg) % PATHS.len()], "mode": MODES[usize::from(kind / 10) % 4]}}),
        3 | 4 => {
            let max = [1, 3, 4096, 0, 4097][usize::from(kind / 10) % 5];
            json!({"id": id, "op": "read", "params": {"h": h, "max": max}})
        }
        5 | 6 => json!({"id": id, "op": "write", "params": {"h": h, "data": "YWJj"}}),
        7 | 8 => json!({"id": id, "op": "close", "params": {"h": h}}),
        _ => {
            let op = ["QUOTA", "LLMCMD", "nope"][usize::from(arg) % 3];
            json!({"id": id, "op": op})
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_request_answered_once_and_nothing_leaks(
        steps in proptest::collection::vec(step(), 0..120),
        local in any::<bool>(),
    ) {
        let stdio = if local { StdioRole::Local } else { StdioRole::Reject };
        let mut s = Shell::new(Config::new(test_policy(), stdio), test_fs());
        s.auto = false;
        let clients = [ClientId(0), ClientId(1), ClientId(2)];
        for c in clients {
            s.connect(c);
        }
        // Per client: the ids it sent while connected (None for garbage).
        let mut sent: Vec<Vec<Option<String>>> = vec![Vec::new(); 3];
        let mut gone = [false; 3];
        let mut n = 0;
        for st in steps {
            match st {
                Step::Request { client, kind, arg } => {
                    let c = usize::from(client);
                    n += 1;
                    let id = format!("{c}-{n}");
                    let known: Vec<u64> = s.responses(clients[c]).iter()
                        .filter_map(|r| r.pointer("/result/handle").and_then(Value::as_u64)).collect();
                    let req = request(&id, kind, arg, &known);
                    s.send_json(clients[c], &req);
                    if !gone[c] {
                        sent[c].push(Some(id));
                    }
                }
                Step::Garbage { client } => {
                    let c = usize::from(client);
                    s.send(clients[c], b"{\"op\":");
                    if !gone[c] {
                        sent[c].push(None);
                    }
                }
                Step::Complete { idx, fail } => {
                    let len = s.effects.len().max(1);
                    s.complete(usize::from(idx) % len, fail);
                }
                Step::Depart { client, died } => {
                    let c = usize::from(client);
                    let input = if died { Input::Died { client: clients[c] } } else { Input::Eof { client: clients[c] } };
                    s.input(input);
                    gone[c] = true;
                }
            }
        }
        s.settle();
        let mut handles = BTreeSet::new();
        for (i, c) in clients.iter().enumerate() {
            let resps = s.responses(*c);
            let ids: Vec<Option<String>> = resps.iter().map(|r| r["id"].as_str().map(str::to_owned)).collect();
            if gone[i] {
                // Answers stop at departure, but those given are in order.
                prop_assert!(sent[i].starts_with(&ids), "client {}: {:?} not a prefix of {:?}", i, ids, sent[i]);
            } else {
                prop_assert_eq!(&ids, &sent[i], "client {}", i);
            }
            for r in &resps {
                if let Some(h) = r.pointer("/result/handle").and_then(Value::as_u64) {
                    prop_assert!(h >= 3, "stdio handle {} handed out", h);
                    prop_assert!(handles.insert(h), "handle {} handed out twice", h);
                }
            }
        }
        for c in clients {
            s.input(Input::Eof { client: c });
        }
        s.settle();
        prop_assert_eq!(s.proxy.open_handles(), 0);
        prop_assert_eq!(s.proxy.tracked_clients(), 0);
        prop_assert_eq!(s.fs.open_files(), 0);
        let stats = s.proxy.stats();
        prop_assert_eq!(stats.handles_opened, stats.handles_closed);
        prop_assert_eq!(stats.handles_opened as usize, handles.len());
    }

    #[test]
    fn chunking_never_changes_the_transcript(
        reqs in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..30),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let reqs: Vec<Value> = reqs.iter().enumerate()
            .map(|(i, (k, a))| request(&i.to_string(), *k, *a, &[3, 4, 5])).collect();
        let bytes = stream(&reqs);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.extend([0, bytes.len()]);
        points.sort_unstable();
        let mut whole = shell();
        whole.input(Input::Bytes { client: A, data: bytes.clone() });
        let mut split = shell();
        for w in points.windows(2) {
            split.input(Input::Bytes { client: A, data: bytes[w[0]..w[1]].to_vec() });
        }
        prop_assert_eq!(&whole.events, &split.events);
        prop_assert_eq!(whole.responses(A).len(), reqs.len());
    }
}

// ---------------------------------------------------------------------
// The broker's ops: LLMCMD, QUOTA, CANCEL.

use crate::broker::{BrokerSetup, CallId, Money, ProviderResult, Usage};
use std::time::Duration;

/// One dollar, in the builtin catalog's default model (gpt-4o-mini:
/// input 0.15, cached 0.075, output 0.6 USD per 1M tokens).
fn broker_setup() -> BrokerSetup {
    BrokerSetup::new(Money::from_pico(1_000_000_000_000), "sess-1")
}

fn broker_config() -> Config {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.broker = Some(broker_setup());
    config
}

fn broker_shell() -> Shell {
    shell_with(broker_config())
}

fn llm(id: &str, extra: Value) -> Value {
    let mut params = json!({"messages": [{"role": "user", "content": "hi"}]});
    if let (Some(p), Value::Object(e)) = (params.as_object_mut(), extra) {
        p.extend(e);
    }
    json!({"id": id, "op": "LLMCMD", "params": params})
}

fn cancel(id: &str, token: &str) -> Value {
    json!({"id": id, "op": "CANCEL", "params": {"cancel_token": token}})
}

/// Send without expecting an answer yet.
fn submit(s: &mut Shell, client: ClientId, req: Value) {
    s.send_json(client, &req);
}

/// Send `req` and return its answer, whatever else the send produced.
fn ask(s: &mut Shell, client: ClientId, req: Value) -> Value {
    let id = req["id"].as_str().unwrap_or_default().to_owned();
    submit(s, client, req);
    only_answer(s, client, &id)
}

fn ok_result(prompt: u64, cached: u64, completion: u64) -> ProviderResult {
    ProviderResult::Ok {
        messages: crate::broker::RawJson::from_value(&json!([{"role": "assistant", "content": "hello"}])),
        usage: Some(Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }),
        model: "gpt-4o-mini".into(),
    }
}

fn answer_to(s: &Shell, client: ClientId, id: &str) -> Vec<Value> {
    s.responses(client).into_iter().filter(|r| r["id"] == json!(id)).collect()
}

fn only_answer(s: &Shell, client: ClientId, id: &str) -> Value {
    let mut got = answer_to(s, client, id);
    assert_eq!(got.len(), 1, "{id}: {got:?}");
    got.remove(0)
}

fn remaining_pico(s: &Shell) -> u64 {
    s.proxy.broker().map(|b| b.remaining().as_pico()).unwrap_or_else(|| panic!("no broker"))
}

#[test]
fn llmcmd_round_trip_charges_reported_usage() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("l1", json!({"max_tokens": 100, "cancel_token": "k"})));
    assert!(answer_to(&s, A, "l1").is_empty(), "answered before the provider did");
    assert_eq!(s.started, vec![CallId(0)]);
    let (call, request, deadline) = s.provider_calls[0].clone();
    assert_eq!(request.model, "gpt-4o-mini");
    assert_eq!(request.max_tokens, 100);
    assert_eq!(request.messages.to_value(), json!([{"role": "user", "content": "hi"}]));
    assert_eq!(deadline, s.clock().saturating_add(Duration::from_secs(60)));
    assert_eq!(s.proxy.poll_timeout(), Some(deadline));
    s.provider_done(call, ok_result(1000, 400, 50));
    let r = only_answer(&s, A, "l1");
    assert_eq!(r["ok"], json!(true), "{r}");
    assert_eq!(r["result"]["messages"], json!([{"role": "assistant", "content": "hello"}]));
    assert_eq!(r["result"]["model"], json!("gpt-4o-mini"));
    assert_eq!(r["result"]["usage"]["prompt_tokens"], json!(1000));
    assert_eq!(r["result"]["metadata"], json!({}));
    // 600 uncached × 0.15 + 400 cached × 0.075 + 50 × 0.6 micro-USD… in
    // pico-USD: tokens × price in micro-USD per 1M tokens.
    let delta = 600 * 150_000 + 400 * 75_000 + 50 * 600_000;
    assert_eq!(remaining_pico(&s), 1_000_000_000_000 - delta);
    assert_eq!(s.telemetry.len(), 1);
    assert_eq!(s.telemetry[0].charged.as_pico(), delta);
    assert_eq!(s.telemetry[0].owner, A);
    assert_eq!(s.proxy.poll_timeout(), None);
    assert_eq!(s.proxy.broker_requests_pending(), 0);
}

#[test]
fn quota_reports_the_seed_fields() {
    let mut s = broker_shell();
    let r = call(&mut s, A, json!({"id": "q", "op": "QUOTA"}));
    assert_eq!(
        r,
        json!({"id": "q", "ok": true, "result": {
            "remaining_units": 1.0,
            "weights": {"input": 0.15, "cached": 0.075, "output": 0.6},
            "window": "session",
            "session_id": "sess-1",
            "currency": "USD",
            "unit": "per_1M_tokens",
            "model": "gpt-4o-mini",
        }})
    );
    let r = call(&mut s, A, json!({"id": "q2", "op": "QUOTA", "params": {"model": "gpt-5"}}));
    assert_eq!(r["result"]["weights"], json!({"input": 1.25, "cached": 0.125, "output": 10.0}));
    let r = call(&mut s, A, json!({"id": "q3", "op": "QUOTA", "params": {"model": "nope"}}));
    assert_eq!(code(&r), "E_ARG");
    let r = call(&mut s, A, json!({"id": "q4", "op": "QUOTA", "params": {"modle": "x"}}));
    assert_eq!(code(&r), "E_ARG");
}

#[test]
fn bad_llmcmd_params_and_unknown_models_are_e_arg_and_never_start() {
    let mut s = broker_shell();
    for req in [
        json!({"id": "x", "op": "LLMCMD", "params": {}}),
        json!({"id": "x", "op": "LLMCMD", "params": {"messages": []}}),
        llm("x", json!({"max_token": 5})),
        llm("x", json!({"model": "no-such-model"})),
        json!({"id": "x", "op": "CANCEL", "params": {}}),
    ] {
        assert_eq!(code(&call(&mut s, A, req.clone())), "E_ARG", "{req}");
    }
    assert!(s.started.is_empty());
}

#[test]
fn cancel_before_start_answers_both_and_the_call_never_starts() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("l1", json!({})));
    submit(&mut s, A, llm("l2", json!({"cancel_token": "t"})));
    let r = ask(&mut s, A, cancel("c", "t"));
    assert_eq!(r, json!({"id": "c", "ok": true, "result": {"cancelled": true, "state": "before_start"}}));
    let r = only_answer(&s, A, "l2");
    assert_eq!(code(&r), "cancelled_before_start");
    // Nothing was charged for it, and the token is free again.
    let r = ask(&mut s, A, cancel("c2", "t"));
    assert_eq!(r["result"], json!({"cancelled": false, "state": "not_found"}));
    s.provider_done(CallId(0), ok_result(1, 0, 1));
    assert_eq!(s.started, vec![CallId(0)], "a cancelled waiter started");
    assert_eq!(only_answer(&s, A, "l1")["ok"], json!(true));
}

#[test]
fn queue_timeout_fires_on_tick_and_the_waiter_never_starts() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("l1", json!({})));
    submit(&mut s, B, llm("l2", json!({})));
    let queued_at = s.clock();
    // Nothing is due yet.
    s.tick();
    assert!(answer_to(&s, B, "l2").is_empty());
    assert_eq!(s.proxy.poll_timeout(), Some(queued_at.saturating_add(Duration::from_secs(30))));
    assert!(s.fire_timer());
    assert_eq!(code(&only_answer(&s, B, "l2")), "queue_timeout");
    assert!(answer_to(&s, A, "l1").is_empty());
    s.provider_done(CallId(0), ok_result(10, 0, 10));
    assert_eq!(s.started, vec![CallId(0)]);
    assert_eq!(s.proxy.stats().errors_by_code.get(&ErrorCode::QueueTimeout), Some(&1));
}

#[test]
fn provider_timeout_answers_releases_the_lock_and_charges_late_usage() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("l1", json!({})));
    assert!(s.fire_timer());
    assert_eq!(code(&only_answer(&s, A, "l1")), "provider_timeout");
    assert_eq!(s.cancelled, vec![CallId(0)]);
    // The lock is free at once: the next call starts before the timed-out
    // one has even reported.
    submit(&mut s, B, llm("l2", json!({})));
    assert_eq!(s.started, vec![CallId(0), CallId(1)]);
    let before = remaining_pico(&s);
    s.provider_done(
        CallId(0),
        ProviderResult::error(Some(Usage { prompt_tokens: 10, ..Usage::default() }), "dropped"),
    );
    assert_eq!(answer_to(&s, A, "l1").len(), 1, "answered twice");
    assert_eq!(remaining_pico(&s), before - 10 * 150_000);
    s.provider_done(CallId(1), ProviderResult::error(None, "boom"));
    assert_eq!(code(&only_answer(&s, B, "l2")), "provider_error");
}

#[test]
fn client_death_while_queued_leaves_the_queue_and_in_flight_keeps_the_lock_till_done() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("a1", json!({})));
    submit(&mut s, A, llm("a2", json!({})));
    submit(&mut s, B, llm("b1", json!({})));
    s.input(Input::Died { client: A });
    // a1 still holds the lock (its usage must be charged); a2 is gone.
    assert_eq!(s.started, vec![CallId(0)]);
    let before = remaining_pico(&s);
    // The Shell panics if anything is sent to A from here on.
    s.provider_done(CallId(0), ok_result(100, 0, 0));
    assert_eq!(remaining_pico(&s), before - 100 * 150_000);
    assert_eq!(s.started, vec![CallId(0), CallId(2)], "the departed client's waiter started");
    s.provider_done(CallId(2), ok_result(1, 0, 1));
    assert_eq!(only_answer(&s, B, "b1")["ok"], json!(true));
    assert_eq!(s.proxy.tracked_clients(), 1);
    assert_eq!(s.proxy.broker_requests_pending(), 0);
    let stats = s.proxy.broker().map(|b| b.stats().clone()).unwrap_or_default();
    assert_eq!(stats.dropped_owner_gone, 1);
}

#[test]
fn client_death_in_flight_is_bounded_by_the_provider_timeout() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("a1", json!({})));
    submit(&mut s, B, llm("b1", json!({})));
    s.input(Input::Eof { client: A });
    // The provider hangs: the broker gives up at the deadline, not before.
    // b1's queue wait (30 s) ends first.
    assert!(s.fire_timer());
    assert_eq!(code(&only_answer(&s, B, "b1")), "queue_timeout");
    assert!(s.fire_timer());
    assert_eq!(s.cancelled, vec![CallId(0)]);
    submit(&mut s, B, llm("b2", json!({})));
    assert_eq!(s.started, vec![CallId(0), CallId(2)]);
}

#[test]
fn llmcmd_does_not_hold_up_the_clients_next_requests() {
    let mut s = broker_shell();
    submit(&mut s, A, llm("l1", json!({})));
    submit(&mut s, A, llm("l2", json!({"cancel_token": "tok"})));
    // A file op and a CANCEL from the same client are answered at once,
    // while both calls are still with the broker.
    assert_eq!(open(&mut s, A, "v.txt", "w")["ok"], json!(true));
    let r = ask(&mut s, A, cancel("c", "tok"));
    assert_eq!(r["result"]["state"], json!("before_start"));
    let r = call(&mut s, A, json!({"id": "q", "op": "QUOTA"}));
    assert_eq!(r["ok"], json!(true));
    // Cancelling the running call: answered at once, as is the call.
    submit(&mut s, A, llm("l3", json!({"cancel_token": "run"})));
    s.provider_done(CallId(0), ok_result(1, 0, 1));
    assert_eq!(s.running_call(), Some(CallId(3)));
    let r = ask(&mut s, A, cancel("c2", "run"));
    assert_eq!(r["result"]["state"], json!("after_start"));
    assert_eq!(code(&only_answer(&s, A, "l3")), "cancelled_after_start");
    // Answers came out of request order, one per id.
    let ids: Vec<Value> = s.responses(A).iter().map(|r| r["id"].clone()).collect();
    assert_eq!(
        ids,
        vec![json!("o"), json!("l2"), json!("c"), json!("q"), json!("l1"), json!("l3"), json!("c2")]
    );
}

#[test]
fn a_bad_broker_setup_is_refused_by_try_new_and_left_out_by_new() {
    let mut config = broker_config();
    if let Some(b) = config.broker.as_mut() {
        b.config.default_model = "unpriced".into();
    }
    assert!(matches!(
        FsProxy::try_new(config.clone()),
        Err(crate::broker::ConfigError::DefaultModelNotPriced(_))
    ));
    assert!(FsProxy::try_new(broker_config()).is_ok_and(|m| m.broker().is_some()));
    let mut s = shell_with(config);
    assert!(s.proxy.broker().is_none());
    assert_eq!(code(&call(&mut s, A, llm("l", json!({})))), "E_UNSUPPORTED");
}

#[test]
fn config_without_broker_serializes_as_before() {
    let text = serde_json::to_string(&Config::new(test_policy(), StdioRole::Local)).unwrap_or_default();
    assert!(!text.contains("broker"), "{text}");
    let text = serde_json::to_string(&broker_config()).unwrap_or_default();
    let back: Config = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(back, broker_config());
}

fn broker_intermediate() -> Shell {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.upstream = true;
    // Ignored below the top: serialization happens there.
    config.broker = Some(broker_setup());
    shell_with(config)
}

#[test]
fn nested_forwards_broker_ops_with_its_own_cancel_tokens() {
    let mut s = broker_intermediate();
    assert!(s.proxy.broker().is_none());
    submit(&mut s, A, llm("a1", json!({"cancel_token": "x"})));
    submit(&mut s, B, llm("b1", json!({"cancel_token": "x"})));
    submit(&mut s, B, llm("b2", json!({})));
    // Not busy: the next request goes upstream at once too.
    submit(&mut s, A, json!({"id": "a2", "op": "QUOTA"}));
    let up = upstream_requests(&mut s);
    let tokens: Vec<&Value> = up.iter().map(|r| &r["params"]["cancel_token"]).collect();
    assert_eq!(tokens, vec![&json!("t0"), &json!("t1"), &json!("t2"), &Value::Null]);
    assert_eq!(up[0]["op"], json!("LLMCMD"));
    assert_eq!(up[0]["params"]["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(up[3], json!({"id": "u4", "op": "QUOTA", "params": {}}));
    assert!(s.started.is_empty(), "a forwarding level called the provider");
    // B cancels its "x": the top hears B's token, not A's.
    submit(&mut s, B, cancel("bc", "x"));
    let up = upstream_requests(&mut s);
    assert_eq!(up, vec![json!({"id": "u5", "op": "CANCEL", "params": {"cancel_token": "t1"}})]);
    // A token no live call of the client carries is answered here.
    assert_eq!(call(&mut s, A, cancel("ac", "nope"))["result"]["state"], json!("not_found"));
    // Answers come back with their codes, broker codes included.
    reply_upstream(
        &mut s,
        json!({"id": "u5", "ok": true, "result": {"cancelled": true, "state": "before_start"}}),
    );
    reply_upstream(
        &mut s,
        json!({"id": "u2", "ok": false, "error": {"code": "cancelled_before_start", "message": "m"}}),
    );
    reply_upstream(&mut s, json!({"id": "u4", "ok": true, "result": {"remaining_units": 0.5}}));
    assert_eq!(only_answer(&s, B, "bc")["result"]["state"], json!("before_start"));
    assert_eq!(code(&only_answer(&s, B, "b1")), "cancelled_before_start");
    assert_eq!(only_answer(&s, A, "a2")["result"], json!({"remaining_units": 0.5}));
    // B's token is free again once its call is over.
    submit(&mut s, B, llm("b3", json!({"cancel_token": "x"})));
    assert_eq!(upstream_requests(&mut s)[0]["params"]["cancel_token"], json!("t3"));
    // A departs: its outstanding call is cancelled at the top.
    s.input(Input::Died { client: A });
    let up = upstream_requests(&mut s);
    assert_eq!(up, vec![json!({"id": "u7", "op": "CANCEL", "params": {"cancel_token": "t0"}})]);
    reply_upstream(
        &mut s,
        json!({"id": "u1", "ok": false, "error": {"code": "cancelled_after_start", "message": "m"}}),
    );
    reply_upstream(
        &mut s,
        json!({"id": "u7", "ok": true, "result": {"cancelled": true, "state": "after_start"}}),
    );
    assert_eq!(s.proxy.tracked_clients(), 1);
    // Upstream lost: pending broker ops fail with E_IO, B stays served.
    s.input(Input::UpstreamEof);
    assert_eq!(code(&only_answer(&s, B, "b2")), "E_IO");
    assert_eq!(code(&only_answer(&s, B, "b3")), "E_IO");
    assert_eq!(code(&call(&mut s, B, llm("b4", json!({})))), "E_IO");
    // Answered at once: B is not left busy by its broker ops; its
    // virtual files are this level's own and still served.
    assert_eq!(code(&open(&mut s, B, "/rw/v.txt", "w")), "E_IO");
    assert_eq!(open(&mut s, B, "v.txt", "w")["ok"], json!(true));
    assert!(s.proxy.quiescent());
}

#[test]
fn chained_llmcmd_is_served_by_the_top_broker() {
    let mut top = Shell::new(broker_config(), test_fs());
    top.connect(UP);
    let mut c = Chain { mid: broker_intermediate(), top };
    c.mid.send_json(A, &llm("a1", json!({"cancel_token": "k", "max_tokens": 7})));
    c.pump();
    assert_eq!(c.top.started, vec![CallId(0)]);
    assert_eq!(c.top.provider_calls[0].1.max_tokens, 7);
    // The file ops of the same child are not held up.
    let r = c.call(A, json!({"id": "o", "op": "open", "params": {"path": "v.txt", "mode": "w"}}));
    assert_eq!(r["ok"], json!(true));
    let r = c.call(A, json!({"id": "q", "op": "QUOTA"}));
    assert_eq!(r["result"]["session_id"], json!("sess-1"));
    c.top.provider_done(CallId(0), ok_result(3, 0, 4));
    c.pump();
    let r = only_answer(&c.mid, A, "a1");
    assert_eq!(r["result"]["usage"]["completion_tokens"], json!(4));
    // A second child's call, cancelled through the chain.
    c.mid.send_json(B, &llm("b1", json!({"cancel_token": "k"})));
    c.pump();
    c.mid.send_json(B, &cancel("bc", "k"));
    c.pump();
    let r = only_answer(&c.mid, B, "bc");
    assert_eq!(r["result"]["state"], json!("after_start"));
    assert_eq!(code(&only_answer(&c.mid, B, "b1")), "cancelled_after_start");
    assert_eq!(c.top.cancelled, vec![CallId(1)]);
}

#[test]
fn a_trace_with_a_broker_replays() {
    use crate::trace::{replay, Header, TraceWriter};
    let config = broker_config();
    let mut w =
        TraceWriter::new(Vec::new(), &Header::fsproxy(config.clone())).unwrap_or_else(|e| panic!("{e}"));
    let mut m = FsProxy::new(config);
    let frame_of = |v: Value| frame::encode(v.to_string().as_bytes());
    let mut inputs = vec![
        Input::Connected { client: A },
        Input::Bytes { client: A, data: frame_of(llm("1", json!({"cancel_token": "t"}))) },
        Input::Bytes { client: A, data: frame_of(llm("2", json!({"temperature": 0.7}))) },
        Input::Bytes { client: A, data: frame_of(json!({"id": "3", "op": "QUOTA"})) },
        Input::ProviderDone { call: CallId(0), result: ok_result(5, 2, 3) },
        Input::Tick,
    ];
    inputs.push(Input::Eof { client: A });
    let mut clock = 0;
    for input in inputs {
        clock += 1_000_000;
        let now = Instant::from_micros(clock);
        // The tick lands on the provider deadline of call 1.
        let now = if matches!(input, Input::Tick) { m.poll_timeout().unwrap_or(now) } else { now };
        w.input(0, now, &input).unwrap_or_else(|e| panic!("{e}"));
        m.handle(now, input);
        while let Some(o) = m.poll_output() {
            w.output(0, &o).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let trace = w.into_inner().unwrap_or_default();
    let text = String::from_utf8_lossy(&trace);
    assert!(
        text.contains("start_provider") && text.contains("cancel_provider") && text.contains("telemetry")
    );
    let report = replay(trace.as_slice()).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.machines[0].broker().is_some());
    // Without the broker in the header the same trace no longer replays.
    let stripped = text.replacen("\"broker\"", "\"ignored\"", 1);
    assert!(replay(stripped.as_bytes()).is_err());
}

// ---- confinement across levels ----------------------------------------------

fn narrow_req(id: &str, rules: Value) -> Value {
    json!({"id": id, "op": "narrow", "params": {"rules": rules}})
}

fn open_scope(s: &Shell) -> Scope {
    match s.effects.iter().rev().find_map(|(_, e)| match e {
        Effect::Open { scope, .. } => Some(scope.clone()),
        _ => None,
    }) {
        Some(sc) => sc,
        None => panic!("no open effect"),
    }
}

#[test]
fn narrow_intersects_every_open_on_the_connection_and_its_attachments() {
    use std::path::Path;
    let mut s = shell();
    let r = call(
        &mut s,
        A,
        narrow_req("n", json!([{"path": "/rw/sub", "access": "rw"}, {"path": "/ro", "access": "rw"}])),
    );
    assert_eq!((r["id"].clone(), r["ok"].clone()), (json!("n"), json!(true)), "{r}");
    assert_eq!(r["result"]["secret"].as_str().map(str::len), Some(SECRET_LEN), "{r}");
    // Lexically outside the narrowing: refused here, no effect, and the
    // refusal says which rule decided.
    let r = open(&mut s, A, "/rw/other.txt", "r");
    assert_eq!(code(&r), "E_PERM");
    assert_eq!(
        r["error"]["message"],
        json!("path is outside the roots a nested level narrowed this connection to")
    );
    // The top's read-only root stays read-only whatever the narrowing says.
    let r = open(&mut s, A, "/ro/hello.txt", "w");
    assert_eq!(r["error"], json!({"code": "E_PERM", "message": "path is under read-only root /ro"}));
    // Inside: the effect carries the intersection, to be checked on the
    // resolved file.
    s.auto = false;
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/sub/f", "mode": "w"}}));
    let sc = open_scope(&s);
    s.auto = true;
    s.settle();
    assert!(sc.permits(Path::new("/rw/sub/f"), true));
    assert!(!sc.permits(Path::new("/rw/other.txt"), false));
    assert!(sc.permits(Path::new("/ro/x"), false) && !sc.permits(Path::new("/ro/x"), true));
    // A second narrow only narrows further.
    call(&mut s, A, narrow_req("n2", json!([{"path": "/", "access": "rw"}])));
    assert_eq!(code(&open(&mut s, A, "/rw/other.txt", "r")), "E_PERM");
    // A request's own scope narrows that request.
    let r = call(
        &mut s,
        A,
        json!({"id": "o2", "op": "open", "params": {"path": "/rw/sub/g", "mode": "w",
            "scope": {"rules": [{"path": "/rw/sub/f", "access": "rw"}]}}}),
    );
    assert_eq!(code(&r), "E_PERM");
    // Attached from a narrowed connection: just as narrow.
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "at", "op": "attach"}));
    let new = ClientId(ATTACHED_CLIENT_BASE);
    assert_eq!(code(&open(&mut s, new, "/rw/other.txt", "r")), "E_PERM");
    // B never narrowed.
    assert_eq!(open(&mut s, B, "/rw/other.txt", "w")["ok"], json!(true));
    // Bad narrows are E_ARG and change nothing.
    for bad in [json!([{"path": "rel", "access": "r"}]), json!("x"), json!([{"path": "/a", "access": "w"}])] {
        assert_eq!(code(&call(&mut s, B, narrow_req("b", bad))), "E_ARG");
    }
    assert_eq!(open(&mut s, B, "/rw/other.txt", "r")["ok"], json!(true));
}

fn secret_of(answer: &Value) -> Secret {
    let text = answer["result"]["secret"].as_str().unwrap_or_default();
    match Secret::parse(text.as_bytes()) {
        Some(s) => s,
        None => panic!("no secret in {answer}"),
    }
}

/// The admitted clients and dismissals since `from` in the shell's events.
fn socket_events(s: &Shell, from: usize) -> (Vec<ClientId>, usize) {
    let mut admitted = Vec::new();
    let mut dismissed = 0;
    for e in &s.events[from..] {
        match e {
            crate::fuzzing::Event::Admitted(c) => admitted.push(*c),
            crate::fuzzing::Event::Dismissed => dismissed += 1,
            _ => {}
        }
    }
    (admitted, dismissed)
}

/// Issue 40: a connection narrowed to read-only gets a secret of its own;
/// the session socket admits that secret under the narrowed scope and
/// nothing wider, while the session's secret keeps the session's policy.
/// The secret goes with the last client under its scope, and one that
/// was never issued is dismissed unanswered.
#[test]
fn a_narrowed_scopes_secret_admits_only_that_scope() {
    let mut s = shell();
    // A attaches a connection of its own and narrows it, as a parent does
    // before starting a child on it.
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "at", "op": "attach"}));
    let narrowed = ClientId(ATTACHED_CLIENT_BASE);
    let r = call(&mut s, narrowed, narrow_req("n", json!([{"path": "/rw", "access": "r"}])));
    let secret = secret_of(&r);
    assert_eq!(code(&open(&mut s, narrowed, "/rw/x", "w")), "E_PERM");

    // The child closed its descriptor and came back with the secret it has.
    let mark = s.events.len();
    s.input(Input::Accepted { secret: Some(secret.clone()) });
    let (admitted, dismissed) = socket_events(&s, mark);
    assert_eq!((admitted.len(), dismissed), (1, 0), "{:?}", s.events);
    let child = admitted[0];
    assert_eq!(code(&open(&mut s, child, "/rw/x", "w")), "E_PERM");
    assert_eq!(code(&open(&mut s, child, "/ro/hello.txt", "r")), "E_PERM");
    assert_eq!(open(&mut s, child, "/rw/notes.txt", "r")["ok"], json!(true));
    // It can narrow further, never widen.
    call(&mut s, child, narrow_req("w", json!([{"path": "/", "access": "rw"}])));
    assert_eq!(code(&open(&mut s, child, "/rw/y", "w")), "E_PERM");

    // The session's secret still has the session's policy; A never narrowed.
    let mark = s.events.len();
    s.input(Input::Accepted { secret: None });
    let (admitted, _) = socket_events(&s, mark);
    assert_eq!(open(&mut s, admitted[0], "/rw/z", "w")["ok"], json!(true));
    assert_eq!(open(&mut s, A, "/rw/z", "w")["ok"], json!(true));

    // A secret never issued: closed unanswered, counted.
    let mark = s.events.len();
    let forged = Secret::parse(&[b'f'; SECRET_LEN]).unwrap_or_else(|| panic!("hex"));
    s.input(Input::Accepted { secret: Some(forged) });
    assert_eq!(socket_events(&s, mark), (vec![], 1));
    assert_eq!(s.proxy.stats().socket_unauthenticated, 1);

    // The child narrowed further, so only the narrowed connection holds
    // the first scope now; when it goes, the secret stops working.
    s.input(Input::Eof { client: narrowed });
    s.settle();
    let mark = s.events.len();
    s.input(Input::Accepted { secret: Some(secret) });
    assert_eq!(socket_events(&s, mark), (vec![], 1), "{:?}", s.events);
}

/// The live scope secrets are bounded: a narrow past the bound is refused
/// with E_RANGE and leaves the connection as it was.
#[test]
fn narrowings_past_the_bound_are_refused() {
    // Room for more clients than secrets, so the secrets' bound is the one met.
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_clients = MAX_SCOPE_SECRETS + 8;
    config.max_descriptors = 4 * MAX_SCOPE_SECRETS;
    let mut s = shell_with(config);
    for n in 0..MAX_SCOPE_SECRETS {
        s.input(Input::Descriptor { client: A });
        s.send_json(A, &json!({"id": "at", "op": "attach"}));
        let c = ClientId(ATTACHED_CLIENT_BASE + n as u64);
        let r = call(&mut s, c, narrow_req("n", json!([{"path": "/rw", "access": "r"}])));
        assert_eq!(r["ok"], json!(true), "{r}");
    }
    let r = call(&mut s, A, narrow_req("n", json!([{"path": "/rw", "access": "r"}])));
    assert_eq!(code(&r), "E_RANGE");
    assert!(
        r["error"]["message"].as_str().unwrap_or_default().contains(&MAX_SCOPE_SECRETS.to_string()),
        "{r}"
    );
    assert_eq!(open(&mut s, A, "/rw/x", "w")["ok"], json!(true));
    // One ending makes room.
    s.input(Input::Eof { client: ClientId(ATTACHED_CLIENT_BASE) });
    s.settle();
    assert_eq!(call(&mut s, A, narrow_req("n", json!([{"path": "/rw", "access": "r"}])))["ok"], json!(true));
}

#[test]
fn intermediate_holds_everything_until_its_narrow_is_answered() {
    let mut s = intermediate();
    s.send_json(A, &json!({"id": "a", "op": "open", "params": {"path": "/rw/x", "mode": "w"}}));
    let frames = s.take_upstream();
    assert_eq!(frames.len(), 1, "only the narrow goes before its answer");
    let v: Value = serde_json::from_slice(&frames[0][4..]).unwrap_or_default();
    assert_eq!(
        v,
        json!({"id": "u0", "op": "narrow", "params": {"rules": [
            {"path": "/ro", "access": "r"}, {"path": "/rw", "access": "rw"}]}})
    );
    // An upstream that does not know narrow: nothing is ever forwarded.
    reply_upstream(
        &mut s,
        json!({"id": "u0", "ok": false, "error": {"code": "E_UNSUPPORTED", "message": "unknown op"}}),
    );
    assert!(s.take_upstream().is_empty());
    assert_eq!(code(&s.responses(A)[0]), "E_IO");
    assert_eq!(code(&open(&mut s, A, "/rw/y", "r")), "E_IO");
    // Its own virtual files still work.
    assert_eq!(open(&mut s, A, "notes", "w")["ok"], json!(true));
}

#[test]
fn intermediate_with_no_roots_never_forwards_a_name() {
    let mut config = Config::new(Policy::new("/home/agent".into(), []), StdioRole::Local);
    config.upstream = true;
    let mut s = shell_with(config);
    for path in ["notes.txt", "rw/x", "./ro/hello.txt"] {
        assert_eq!(open(&mut s, A, path, "w")["ok"], json!(true), "{path}");
    }
    assert_eq!(code(&open(&mut s, A, "/rw/x", "r")), "E_PERM");
    assert!(s.take_upstream().is_empty());
    assert_eq!(s.proxy.virtual_file("rw/x"), Some(&b""[..]));
}

/// Three levels: a grandchild airlock narrowed at the middle; the middle
/// forwards its narrowing with each open, and the top's effect carries the
/// intersection of all three.
#[test]
fn three_levels_intersect_at_the_top() {
    use std::path::Path;
    let mut c = Chain::new();
    let r = c.call(A, narrow_req("n", json!([{"path": "/rw/a/sub", "access": "rw"}])));
    assert_eq!(r["ok"], json!(true));
    assert_eq!(
        code(&c.call(A, json!({"id": "1", "op": "open", "params": {"path": "/rw/a/other", "mode": "r"}}))),
        "E_PERM"
    );
    // A first forward, so the middle's own narrow (whose secret the top
    // draws with an effect) is answered before the top's effects are held.
    c.call(A, json!({"id": "0", "op": "open", "params": {"path": "/rw/a/sub/g", "mode": "r"}}));
    c.top.auto = false;
    c.mid.send_json(A, &json!({"id": "2", "op": "open", "params": {"path": "/rw/a/sub/f", "mode": "w"}}));
    c.pump();
    let sc = open_scope(&c.top);
    assert!(sc.permits(Path::new("/rw/a/sub/f"), true));
    assert!(!sc.permits(Path::new("/rw/a/other"), false), "{sc:?}");
    // B at the middle is not narrowed beyond the middle's own policy.
    c.top.auto = true;
    c.top.settle();
    c.pump();
    c.top.auto = false;
    c.mid.send_json(B, &json!({"id": "3", "op": "open", "params": {"path": "/rw/a/other", "mode": "w"}}));
    c.pump();
    assert!(open_scope(&c.top).permits(Path::new("/rw/a/other"), true));
}

#[test]
fn a_narrowing_refusal_names_the_rule_that_decided() {
    let mut s = shell();
    let rules = json!([{"path": "/rw", "access": "rw"}, {"path": "/rw/sub", "access": "r"}, {"path": "/rw/sub/x", "access": "none"}]);
    call(&mut s, A, narrow_req("n", rules));
    let r = open(&mut s, A, "/rw/sub/f", "w");
    assert_eq!(
        r["error"]["message"],
        json!("path is under /rw/sub, which a nested level narrowed to read-only")
    );
    let r = open(&mut s, A, "/rw/sub/x/f", "r");
    assert_eq!(r["error"]["message"], json!("path is under /rw/sub/x, which a nested level denies"));
}
