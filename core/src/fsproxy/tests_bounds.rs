//! Unit tests of the bounded resources (issue 7, items 6–9 and 11): each
//! bound refuses with E_RANGE naming its flag, and memory held follows.

use super::*;
use crate::fuzzing::{test_fs, test_policy, Event, Shell};
use serde_json::{json, Value};

const A: ClientId = ClientId(1);

fn shell_with(config: Config) -> Shell {
    let mut s = Shell::new(config, test_fs());
    s.connect(A);
    s
}

fn code(r: &Value) -> String {
    r["error"]["code"].as_str().unwrap_or("ok").to_owned()
}

fn message(r: &Value) -> String {
    r["error"]["message"].as_str().unwrap_or_default().to_owned()
}

fn quota(id: &str, pad: usize) -> Value {
    json!({"id": id, "op": "QUOTA", "params": {"pad": "x".repeat(pad)}})
}

#[test]
fn queued_bytes_are_bounded_per_client() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_queued_bytes = 10_000;
    let mut s = shell_with(config);
    s.auto = false;
    // The first waits on its open; QUOTAs of 4 KB queue behind it.
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
    for i in 0..4 {
        s.send_json(A, &quota(&format!("q{i}"), 4000));
    }
    let refused = s.responses(A);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0]["id"], json!("q2"));
    assert_eq!(code(&refused[0]), "E_RANGE");
    assert!(message(&refused[0]).contains("--max-queued-bytes"), "{}", message(&refused[0]));
    let held = s.proxy.usage().queued_bytes;
    assert!(held > 8000 && held <= 10_000, "{held}");
    s.settle();
    // Everything answered, nothing held.
    assert_eq!(s.responses(A).len(), 5);
    assert_eq!(s.proxy.usage().queued_bytes, 0);
}

#[test]
fn queued_bytes_are_bounded_per_session() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_session_queued_bytes = 10_000;
    let b = ClientId(2);
    let mut s = shell_with(config);
    s.connect(b);
    s.auto = false;
    for c in [A, b] {
        s.send_json(c, &json!({"id": "o", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
        s.send_json(c, &quota("q0", 4000));
    }
    s.send_json(b, &quota("q1", 4000));
    let r = s.responses(b);
    assert_eq!(r.len(), 1);
    assert!(message(&r[0]).contains("--max-session-queued-bytes"), "{r:?}");
    // A client that leaves gives its bytes back.
    s.input(Input::Died { client: A });
    assert!(s.proxy.usage().queued_bytes < 5000);
}

#[test]
fn a_response_is_never_answered() {
    let mut s = shell_with(Config::new(test_policy(), StdioRole::Local));
    for r in [
        json!({"id": "1", "ok": true}),
        json!({"id": null, "ok": false, "error": {"code": "E_ARG", "message": "x"}}),
        json!({"id": "2", "ok": true, "result": {"handle": 3}}),
    ] {
        s.send_json(A, &r);
    }
    assert!(s.responses(A).is_empty());
    assert_eq!(s.proxy.stats().responses_ignored, 3);
    assert_eq!(s.proxy.stats().requests, 0);
    // The connection still serves requests.
    s.send_json(A, &json!({"id": "3", "op": "open", "params": {"path": "v", "mode": "w"}}));
    assert_eq!(s.responses(A).len(), 1);
}

/// Both ends of one socketpair attached: everything each is sent arrives
/// on the other. Without the rule above, this never ends.
#[test]
fn a_self_loop_goes_quiet() {
    let mut s = shell_with(Config::new(test_policy(), StdioRole::Local));
    s.input(Input::Descriptor { client: A });
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "a", "op": "attach"}));
    s.send_json(A, &json!({"id": "b", "op": "attach"}));
    let attached: Vec<ClientId> =
        s.events.iter().filter_map(|e| if let Event::Attached(_, n) = e { Some(*n) } else { None }).collect();
    assert_eq!(attached.len(), 2);
    let (x, y) = (attached[0], attached[1]);
    for _ in 0..10 {
        let mut moved = false;
        for (from, to) in [(x, y), (y, x)] {
            for f in s.take_sent(from) {
                moved = true;
                s.input(Input::Bytes { client: to, data: frame::encode(&f) });
            }
        }
        if !moved {
            break;
        }
    }
    assert!(s.take_sent(x).is_empty() && s.take_sent(y).is_empty(), "still echoing");
    assert_eq!(s.proxy.stats().responses_ignored, 2);
}

#[test]
fn attaches_are_capped_by_max_clients() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_clients = 2;
    let mut s = shell_with(config);
    s.input(Input::Descriptor { client: A });
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "a", "op": "attach"}));
    s.send_json(A, &json!({"id": "b", "op": "attach"}));
    let r = s.responses(A);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["id"], json!("b"));
    assert!(message(&r[0]).contains("--max-clients"), "{r:?}");
    assert_eq!(s.proxy.usage().clients, 2);
    assert_eq!(s.proxy.usage().descriptors, 2, "the refused socket is dropped");
}

/// A connection through the session socket is a client like an attached
/// one: it counts against `--max-clients` with the attached ones, gets the
/// greeting on its own connection, and has the session's policy, no more.
#[test]
fn socket_connections_share_the_client_cap_and_the_policy() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_clients = 3;
    let mut s = shell_with(config);
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "a", "op": "attach"}));
    s.input(Input::Accepted { secret: None });
    s.input(Input::Accepted { secret: None });
    let admitted: Vec<ClientId> =
        s.events.iter().filter_map(|e| if let Event::Admitted(c) = e { Some(*c) } else { None }).collect();
    let refused: Vec<Value> = s
        .events
        .iter()
        .filter_map(|e| if let Event::Refused(p) = e { serde_json::from_slice(p).ok() } else { None })
        .collect();
    assert_eq!(admitted.len(), 1, "{:?}", s.events);
    assert_eq!(refused.len(), 1, "{:?}", s.events);
    assert_eq!(refused[0]["id"], json!(wire::SOCKET_GREETING_ID));
    assert!(message(&refused[0]).contains("--max-clients"), "{refused:?}");
    let c = admitted[0];
    let greeting = s.responses(c);
    assert_eq!(greeting.len(), 1, "{greeting:?}");
    assert_eq!(
        (greeting[0]["id"].clone(), code(&greeting[0])),
        (json!(wire::SOCKET_GREETING_ID), "ok".into())
    );
    // The session's policy: outside every root is refused, inside served.
    s.send_json(c, &json!({"id": "x", "op": "open", "params": {"path": "/etc/passwd", "mode": "r"}}));
    s.send_json(c, &json!({"id": "w", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "w"}}));
    s.send_json(c, &json!({"id": "o", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
    let r = s.responses(c);
    assert_eq!(r.iter().map(code).collect::<Vec<_>>(), ["ok", "E_PERM", "E_PERM", "ok"], "{r:?}");
    s.input(Input::Unauthenticated);
    let stats = s.proxy.stats();
    assert_eq!((stats.socket_clients, stats.socket_unauthenticated, stats.bounds_refused), (1, 1, 1));
    // Its handles go when it does.
    s.input(Input::Eof { client: c });
    s.settle();
    assert_eq!(s.proxy.handles_of(c), 0);
    assert_eq!(s.proxy.usage().clients, 2);
}

/// A connection through the session socket never eats the descriptor
/// reserve either.
#[test]
fn socket_connections_never_eat_the_reserve() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_descriptors = 18;
    config.descriptor_reserve = 16;
    let mut s = shell_with(config);
    s.input(Input::Accepted { secret: None });
    s.input(Input::Accepted { secret: None });
    let refused: Vec<Value> = s
        .events
        .iter()
        .filter_map(|e| if let Event::Refused(p) = e { serde_json::from_slice(p).ok() } else { None })
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", s.events);
    assert!(message(&refused[0]).contains("--max-descriptors"), "{refused:?}");
    assert_eq!(s.proxy.usage().descriptors, 2);
}

#[test]
fn passed_descriptors_never_eat_the_reserve() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_descriptors = 20;
    config.descriptor_reserve = 16;
    let mut s = shell_with(config);
    for _ in 0..6 {
        s.input(Input::Descriptor { client: A });
    }
    // One connection and three passed: the fourth would eat the reserve.
    assert_eq!(s.proxy.usage().descriptors, 4);
    for i in 0..6 {
        s.send_json(A, &json!({"id": format!("a{i}"), "op": "attach"}));
    }
    let r = s.responses(A);
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(r.iter().all(|x| message(x).contains("--max-descriptors")), "{r:?}");
    // Files may still be opened, from the reserve.
    let c = ClientId(ATTACHED_CLIENT_BASE);
    s.send_json(c, &json!({"id": "o", "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}));
    assert_eq!(s.responses(c).last().map(code), Some("ok".to_owned()));
}

#[test]
fn host_opens_keep_descriptors_for_provider_calls() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_descriptors = 12;
    config.descriptor_reserve = 0;
    config.max_open_handles = 100;
    let mut s = shell_with(config);
    let mut codes = Vec::new();
    for i in 0..6 {
        s.send_json(
            A,
            &json!({"id": format!("{i}"), "op": "open", "params": {"path": "/ro/hello.txt", "mode": "r"}}),
        );
        codes.push(code(s.responses(A).last().unwrap_or(&Value::Null)));
    }
    // 1 connection + 3 files + 8 kept = 12.
    assert_eq!(codes, ["ok", "ok", "ok", "E_RANGE", "E_RANGE", "E_RANGE"]);
}

#[test]
fn partial_frames_are_bounded_in_total() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_buffered_bytes = 3000;
    let mut s = shell_with(config);
    let b = ClientId(2);
    s.connect(b);
    let partial = |n: usize| {
        let mut f = (1_000_000u32).to_be_bytes().to_vec();
        f.extend(vec![b' '; n]);
        f
    };
    s.input(Input::Bytes { client: A, data: partial(2000) });
    assert!(s.responses(A).is_empty());
    s.input(Input::Bytes { client: b, data: partial(2000) });
    let r = s.responses(b);
    assert_eq!(r.len(), 1);
    assert!(message(&r[0]).contains("--max-buffered-bytes"), "{r:?}");
    assert!(s.events.iter().any(|e| matches!(e, Event::Closed(c) if *c == b)));
    assert_eq!(s.proxy.usage().buffered_bytes, 2004);
}

/// The intermediate's first frame upstream is its `narrow` (u0): answer
/// it, and take the one request it held back for the answer.
fn narrowed(s: &mut Shell) {
    let up = s.take_upstream();
    assert_eq!(up.len(), 1);
    s.input(Input::UpstreamBytes { data: frame::encode(br#"{"id":"u0","ok":true,"result":{}}"#) });
    assert_eq!(s.take_upstream().len(), 1);
}

#[test]
fn an_oversized_upstream_answer_fails_one_request_only() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.upstream = true;
    config.max_upstream_frame = 1000;
    let mut s = shell_with(config);
    s.send_json(A, &json!({"id": "q", "op": "QUOTA", "params": {}}));
    narrowed(&mut s);
    let big = json!({"id": "u1", "ok": true, "result": {"text": "y".repeat(5000)}}).to_string();
    // Delivered in pieces, as a pipe would.
    for chunk in frame::encode(big.as_bytes()).chunks(700) {
        s.input(Input::UpstreamBytes { data: chunk.to_vec() });
    }
    let r = s.responses(A);
    assert_eq!(r.len(), 1);
    assert_eq!(code(&r[0]), "E_RANGE");
    assert!(message(&r[0]).contains("--max-upstream-frame"), "{r:?}");
    assert_eq!(s.proxy.stats().upstream_oversized, 1);
    // The link is still up: the next request goes upstream and is answered.
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/v", "mode": "w"}}));
    assert_eq!(s.take_upstream().len(), 1);
    s.input(Input::UpstreamBytes { data: frame::encode(br#"{"id":"u2","ok":true,"result":{"handle":7}}"#) });
    assert_eq!(s.responses(A).last().map(code), Some("ok".to_owned()));
}

#[test]
fn planted_link_cut_is_what_the_fix_prevents() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.upstream = true;
    config.planted_bug = Some(PlantedBug::UpstreamOversizeCutsLink);
    config.max_frame = 1000;
    let mut s = shell_with(config);
    s.send_json(A, &json!({"id": "q", "op": "QUOTA", "params": {}}));
    narrowed(&mut s);
    let big = json!({"id": "u1", "ok": true, "result": {"text": "y".repeat(5000)}}).to_string();
    s.input(Input::UpstreamBytes { data: frame::encode(big.as_bytes()) });
    s.send_json(A, &json!({"id": "o", "op": "open", "params": {"path": "/rw/v", "mode": "w"}}));
    assert_eq!(s.responses(A).last().map(code), Some("E_IO".to_owned()));
}

#[test]
fn idle_connections_give_big_buffers_back() {
    let mut d = frame::FrameDecoder::new(1 << 20);
    d.push(&frame::encode(&vec![b'x'; 500_000]));
    assert!(d.next_frame().unwrap().is_some());
    assert!(d.held() < 64 * 1024, "{}", d.held());
}

/// A socket dropped for the reserve, then one kept once room was made:
/// each attach claims the socket sent with it, in order.
#[test]
fn attaches_claim_their_own_sockets_in_order() {
    let mut config = Config::new(test_policy(), StdioRole::Local);
    config.max_descriptors = 20;
    config.descriptor_reserve = 18;
    let mut s = shell_with(config);
    let b = ClientId(2);
    s.connect(b);
    // Two connections: the next descriptor would leave fewer than 18.
    s.input(Input::Descriptor { client: A });
    s.input(Input::Died { client: b });
    s.input(Input::Descriptor { client: A });
    s.send_json(A, &json!({"id": "first", "op": "attach"}));
    s.send_json(A, &json!({"id": "second", "op": "attach"}));
    let r = s.responses(A);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["id"], json!("first"));
    assert!(message(&r[0]).contains("--max-descriptors"), "{r:?}");
    let attached: Vec<ClientId> =
        s.events.iter().filter_map(|e| if let Event::Attached(_, n) = e { Some(*n) } else { None }).collect();
    assert_eq!(attached.len(), 1);
    assert_eq!(s.responses(attached[0]), vec![json!({"id": "second", "ok": true})]);
}
