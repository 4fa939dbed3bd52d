//! A request a level forwards grows on the way (a longer id, a path made
//! absolute). The level above takes frames up to the same limit, so a
//! child's request that fits here but not once forwarded must fail alone:
//! sent as is, the level above would refuse the frame and drop the whole
//! connection, and every sibling's file operations with it.

use airlock_core::codec::frame;
use airlock_core::fsproxy::{Config, Input, StdioRole};
use airlock_core::fuzzing::{test_fs, test_policy, Event, Shell};
use airlock_core::handles::ClientId;
use serde_json::{json, Value};

const A: ClientId = ClientId(0);
const B: ClientId = ClientId(1);
const UP: ClientId = ClientId(100);
const MAX_FRAME: usize = 200;

struct Chain {
    mid: Shell,
    top: Shell,
}

impl Chain {
    fn new() -> Self {
        let mut config = Config::new(test_policy(), StdioRole::Local);
        config.upstream = true;
        config.max_frame = MAX_FRAME;
        let mut mid = Shell::new(config, test_fs());
        mid.connect(A);
        mid.connect(B);
        let mut config = Config::new(test_policy(), StdioRole::Reject);
        config.max_frame = MAX_FRAME;
        let mut top = Shell::new(config, test_fs());
        top.connect(UP);
        Chain { mid, top }
    }

    fn pump(&mut self) {
        loop {
            let up = self.mid.take_upstream();
            let down = self.top.take_sent(UP);
            if up.is_empty() && down.is_empty() {
                return;
            }
            for f in up {
                assert!(f.len() <= frame::HEADER_LEN + MAX_FRAME, "a {}-byte frame went upstream", f.len());
                self.top.input(Input::Bytes { client: UP, data: f });
            }
            for p in down {
                self.mid.input(Input::UpstreamBytes { data: frame::encode(&p) });
            }
        }
    }

    fn last_response(&self, client: ClientId) -> Value {
        self.mid.responses(client).pop().unwrap_or_default()
    }
}

/// An open of a `/rw` path padded so the request is exactly `len` bytes
/// with an empty id.
fn open_of_len(len: usize) -> Vec<u8> {
    let head = r#"{"id":"","op":"open","params":{"path":"/rw/"#;
    let tail = r#"","mode":"w"}}"#;
    let name = "x".repeat(len - head.len() - tail.len());
    format!("{head}{name}{tail}").into_bytes()
}

#[test]
fn a_request_too_big_once_forwarded_fails_alone() {
    let mut c = Chain::new();
    let big = open_of_len(MAX_FRAME);
    assert_eq!(big.len(), MAX_FRAME);
    c.mid.send(A, &big);
    c.pump();
    let resp = c.last_response(A);
    assert_eq!(resp["ok"], json!(false), "{resp}");
    assert_eq!(resp["error"]["code"], json!("E_RANGE"), "{resp}");
    assert!(!c.top.events.contains(&Event::Closed(UP)), "the top dropped the connection");

    // The connection still serves everyone.
    c.mid.send_json(B, &json!({"id": "b", "op": "open", "params": {"path": "/rw/notes.txt", "mode": "r"}}));
    c.pump();
    assert_eq!(c.last_response(B)["ok"], json!(true), "{}", c.last_response(B));
    // One that still fits once forwarded goes through.
    c.mid.send(A, &open_of_len(MAX_FRAME - 40));
    c.pump();
    assert_eq!(c.last_response(A)["ok"], json!(true), "{}", c.last_response(A));
    assert_eq!(c.mid.proxy.stats().upstream_errors, 0);
}
