//! How a simulated client of the FS-proxy world picks its next request and
//! writes it: valid requests on the files and handles it models, invalid
//! ones that must fail, and the frames no parser should accept.

use super::frames::frame;
use super::request::{self, req};
use super::{cat, draw, oracle_id, pick, Class, Client, Kind, Queued, Sent, World};
use crate::swarm::{FaultKind, PPM};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::StdioRole;
use rand::Rng;
use serde_json::{json, Value};

impl World {
    pub(super) fn issue(&mut self, i: usize) {
        let stdio_local = self.levels[self.clients[i].level].m.config().stdio == StdioRole::Local;
        let invalid_ppm = self.swarm.invalid_ppm;
        let max_frame = self.swarm.max_frame;
        let c = &mut self.clients[i];
        if c.ops_left == 0 || self.step > self.swarm.max_steps as u64 {
            // Tidying up before exit.
            if let Some(h) = c.handles.nth_usable(0) {
                c.handles.set_closing(&h, true);
                let id = next_id(c);
                let payload = request::close(&id, h);
                send(c, id, payload, Kind::Close { h }, None);
            }
            return;
        }
        c.ops_left -= 1;
        let kinds = [FaultKind::OversizedFrame, FaultKind::CorruptFrame, FaultKind::NonUtf8Frame];
        let rates = kinds.map(|k| self.rates.get(k));
        let c = &mut self.clients[i];
        let roll = c.rng.gen_range(0..PPM);
        if roll < rates[0] {
            *self.faults.entry(FaultKind::OversizedFrame).or_default() += 1;
            let len = (max_frame as u64 + 1 + c.rng.gen_range(0..1000)).min(u64::from(u32::MAX)) as u32;
            let mut bytes = len.to_be_bytes().to_vec();
            bytes.extend((0..c.rng.gen_range(0..64)).map(|_| b'x'));
            c.out.push(bytes);
            c.null_expected += 1;
            c.stream_ended = true;
            return;
        }
        if roll < rates[0] + rates[1] {
            *self.faults.entry(FaultKind::CorruptFrame).or_default() += 1;
            let id = next_id(c);
            let data = draw::bytes(&mut c.rng, 0..40);
            let good = request::write(&id, 3, &data, None);
            let mut bad = good.clone();
            for _ in 0..c.rng.gen_range(1..=4) {
                let at = c.rng.gen_range(0..bad.len());
                bad[at] = c.rng.gen();
            }
            if serde_json::from_slice::<Value>(&bad).is_ok() {
                // Still JSON: it could still be a request. A proper prefix
                // of an object never is.
                bad = good[..c.rng.gen_range(1..good.len())].to_vec();
            }
            send_raw(c, bad);
            return;
        }
        if roll < rates[0] + rates[1] + rates[2] {
            *self.faults.entry(FaultKind::NonUtf8Frame).or_default() += 1;
            let id = next_id(c);
            let mut p = format!(r#"{{"id":"{id}","op":"open","params":{{"path":"v/"#).into_bytes();
            p.extend([0xff, 0xfe, 0xc3]);
            p.extend_from_slice(br#"","mode":"r"}}"#);
            send_raw(c, p);
            return;
        }
        if self.broker.is_some() {
            self.broker_issue(i);
            return;
        }
        if self.pager_issue(i) {
            return;
        }
        if self.issue_flood(i) {
            return;
        }
        if self.adversary.is_some() {
            self.adversary_issue(i);
            return;
        }
        // Drawn only when attach is on, so worlds without it draw as before.
        let attach = self.rates.get(FaultKind::Attach);
        if attach > 0 && self.clients[i].rng.gen_range(0..PPM) < attach && self.issue_attach(i) {
            return;
        }
        let c = &mut self.clients[i];
        if c.rng.gen_range(0..PPM) < invalid_ppm {
            invalid(c, stdio_local);
        } else {
            valid(c);
        }
        // Log chunks are known from the moment they are sent: any of them
        // may end up in the file, acknowledged or not.
        let c = &self.clients[i];
        if let Some((_, Sent { kind: Kind::Write { h, data }, .. })) = c.order.back() {
            let key = c.handles.get(h).and_then(|hm| hm.key.as_ref());
            if let Some(mut f) = key.and_then(|k| self.files.get_mut(k)).filter(|f| f.class == Class::Log) {
                f.log.send(data.clone());
            }
        }
    }

    /// Client `i` asks to attach, passing a descriptor with the request
    /// (a child process getting a connection of its own) or, now and then,
    /// without one (which must fail). The two never overlap, so which
    /// attach claims which descriptor stays known. False: nothing sent.
    pub(super) fn issue_attach(&mut self, i: usize) -> bool {
        let budget = self.attach_budget;
        let c = &mut self.clients[i];
        let with_fd = budget > 0 && c.rng.gen_bool(0.8);
        let (mut has_fd, mut has_bare) = (false, false);
        for s in c.order.records() {
            match s.kind {
                Kind::Attach { fd: true } => has_fd = true,
                Kind::Attach { fd: false } => has_bare = true,
                _ => {}
            }
        }
        let must_fail = if with_fd && !has_bare {
            self.attach_budget -= 1;
            c.dpending.push_back(c.out.pushed);
            None
        } else if !with_fd && !has_fd && !c.stray_fd && c.fds_unclaimed == 0 {
            Some("attach_needs_descriptor")
        } else {
            return false;
        };
        let id = next_id(c);
        let payload = serde_json::to_vec(&json!({ "id": id, "op": "attach" })).unwrap_or_default();
        send(c, id, payload, Kind::Attach { fd: must_fail.is_none() }, must_fail);
        self.count(FaultKind::Attach);
        true
    }
}

pub(super) fn next_id(c: &mut Client) -> String {
    c.next_req += 1;
    let (mut idx, mut req) = (itoa::Buffer::new(), itoa::Buffer::new());
    cat(&["c", idx.format(c.idx), "-", req.format(c.next_req)])
}

pub(super) fn send(
    c: &mut Client,
    id: String,
    payload: Vec<u8>,
    kind: Kind,
    must_fail: Option<&'static str>,
) {
    let in_line = !matches!(kind, Kind::Broker(_) | Kind::Attach { .. } | Kind::Attached);
    send_held(c, id, payload, kind, must_fail, in_line);
}

/// `send`, saying whether the request holds the client's others while it
/// is served.
pub(super) fn send_held(
    c: &mut Client,
    id: String,
    payload: Vec<u8>,
    kind: Kind,
    must_fail: Option<&'static str>,
    in_line: bool,
) {
    let len = payload.len() as u64;
    c.out.push(frame(payload));
    if matches!(kind, Kind::Open { .. }) {
        c.pending_opens += 1;
    }
    let close = matches!(kind, Kind::Close { .. });
    c.order
        .push_back(Queued { id, frame: Some((c.out.pushed, len)), in_line, close }, Sent { kind, must_fail });
}

/// A frame whose answer only the oracle can tell; it must fail. With an
/// id the oracle reads, the machine holds it in line like any other until
/// it is served and refused. Without one, its `id: null` answer does not
/// say which frame it answers: refused on arrival past a bound, or served
/// in turn, so it is left out of `order` (its bytes uncounted, never
/// miscounted).
pub(super) fn send_raw(c: &mut Client, payload: Vec<u8>) {
    let len = payload.len() as u64;
    let id = oracle_id(&payload);
    c.out.push(frame(payload));
    match id {
        Some(id) => {
            c.order.push_back(
                Queued { id, frame: Some((c.out.pushed, len)), in_line: true, close: false },
                Sent { kind: Kind::Invalid, must_fail: Some("must_fail") },
            );
        }
        None => c.null_expected += 1,
    }
}

pub(super) const MODES: [Mode; 4] = [Mode::Read, Mode::Write, Mode::Append, Mode::ReadWrite];

pub(super) fn valid(c: &mut Client) {
    let mut idx_text = itoa::Buffer::new();
    let idx = idx_text.format(c.idx);
    let usable = c.handles.usable_count();
    let open = usable == 0 || usable < 4 && c.rng.gen_bool(0.3);
    if open {
        let (key, path, mode, host) = match c.rng.gen_range(0..100) {
            0..30 => {
                let key = cat(&["/data/rw/c", idx, ".dat"]);
                // As `pick` over the four spellings, building only the one.
                let path = match c.rng.gen_range(0..4usize) {
                    0 => key.clone(),
                    1 => cat(&["/data/rw/./c", idx, ".dat"]),
                    2 => cat(&["/data/ro/../rw/c", idx, ".dat"]),
                    _ => cat(&["/data/rw/sub/../c", idx, ".dat"]),
                };
                (key, path, *pick(&mut c.rng, &MODES), true)
            }
            30..45 => {
                let path = match c.rng.gen_range(0..3usize) {
                    0 => cat(&["scratch/c", idx, ".log"]),
                    1 => cat(&["./scratch/c", idx, ".log"]),
                    _ => cat(&["/work/proj/scratch/c", idx, ".log"]),
                };
                (cat(&["/work/proj/scratch/c", idx, ".log"]), path, *pick(&mut c.rng, &MODES), true)
            }
            45..60 => {
                let path = match c.rng.gen_range(0..3usize) {
                    0 => cat(&["v/c", idx, ".txt"]),
                    1 => cat(&["./v/c", idx, ".txt"]),
                    _ => cat(&["v/../v/c", idx, ".txt"]),
                };
                (cat(&["v/c", idx, ".txt"]), path, *pick(&mut c.rng, &MODES), false)
            }
            60..75 => {
                let mode = if c.rng.gen_bool(0.8) { Mode::Append } else { Mode::Read };
                ("/data/rw/shared.log".to_owned(), "/data/rw/shared.log".to_owned(), mode, true)
            }
            75..82 => {
                let key = "/work/proj/scratch/chaos.bin".to_owned();
                (key, "scratch/chaos.bin".to_owned(), *pick(&mut c.rng, &MODES), true)
            }
            _ => {
                let key =
                    pick(&mut c.rng, &["/data/ro/a.txt", "/data/ro/a.txt", "/data/ro/empty"]).to_string();
                (key.clone(), key, Mode::Read, true)
            }
        };
        let id = next_id(c);
        let payload = request::open(&id, &path, mode.as_str());
        send(c, id, payload, Kind::Open { key: Some(key), mode, host }, None);
        return;
    }
    // As `pick` over the usable handles, without collecting them (a kept
    // count out of step with the handles is the count checker's to report).
    let Some(h) = c.handles.nth_usable(c.rng.gen_range(0..usable)) else { return };
    let hm = &c.handles[&h];
    let (mode, shared) = (hm.mode, hm.key.as_deref() == Some("/data/rw/shared.log"));
    let close = c.rng.gen_bool(if usable > 3 { 0.3 } else { 0.1 });
    let id = next_id(c);
    if close {
        c.handles.set_closing(&h, true);
        let payload = request::close(&id, h);
        send(c, id, payload, Kind::Close { h }, None);
    } else if mode.writable() && (!mode.readable() || c.rng.gen_bool(0.5)) {
        let data: Vec<u8> = if shared {
            let n = c.rng.gen_range(0..40);
            let letters: String = (0..n).map(|_| char::from(c.rng.gen_range(b'a'..=b'z'))).collect();
            format!("[{id}:{letters}]").into_bytes()
        } else {
            match c.rng.gen_range(0..100) {
                0..70 => draw::bytes(&mut c.rng, 0..64),
                70..95 => draw::bytes(&mut c.rng, 64..512),
                _ => draw::bytes(&mut c.rng, 512..=2048),
            }
        };
        let payload = request::write(&id, h, &data, Some(c.rng.gen_bool(0.1)));
        send(c, id, payload, Kind::Write { h, data }, None);
    } else {
        let max = match c.rng.gen_range(0..100) {
            0..70 => c.rng.gen_range(1..64),
            70..90 => c.rng.gen_range(64..1024),
            _ => c.rng.gen_range(1024..=4096),
        };
        let payload = request::read(&id, h, max);
        send(c, id, payload, Kind::Read { h, max }, None);
    }
}

pub(super) fn invalid(c: &mut Client, stdio_local: bool) {
    let idx = c.idx;
    let id = next_id(c);
    let own = c.handles.usable();
    match c.rng.gen_range(0..13) {
        0 => {
            let path = *pick(
                &mut c.rng,
                &[
                    "../escape.txt",
                    "/etc/passwd",
                    "/data/ro/../../etc/shadow",
                    "scratch/../../outside",
                    "",
                    "a\u{0}b",
                    ".",
                    "/",
                    "/data",
                    "/data/rw",
                    "/work/proj/notes.txt",
                    "v/../../x",
                ],
            );
            let mode = *pick(&mut c.rng, &MODES);
            let payload = request::open(&id, path, mode.as_str());
            send(c, id, payload, Kind::Open { key: None, mode, host: true }, Some("policy"));
        }
        1 => {
            let path = *pick(&mut c.rng, &["/data/ro/a.txt", "/data/rw/sub/x", "/data/ro/new"]);
            let mode = *pick(&mut c.rng, &[Mode::Write, Mode::Append, Mode::ReadWrite]);
            let payload = request::open(&id, path, mode.as_str());
            send(c, id, payload, Kind::Open { key: None, mode, host: true }, Some("policy"));
        }
        2 => {
            let path = if c.rng.gen_bool(0.5) {
                format!("/data/rw/missing-{idx}-{}", c.next_req)
            } else {
                format!("v/missing-{idx}")
            };
            let payload = request::open(&id, &path, "r");
            send(
                c,
                id,
                payload,
                Kind::Open { key: None, mode: Mode::Read, host: true },
                Some("fs_semantics"),
            );
        }
        3 => {
            let h = match c.rng.gen_range(0..3) {
                0 if !c.closed.is_empty() => c.closed[c.rng.gen_range(0..c.closed.len())],
                1 if c.pending_opens == 0 => {
                    let h = c.rng.gen_range(3..64);
                    if c.handles.contains_key(&h) {
                        1_000_000
                    } else {
                        h
                    }
                }
                _ => 1_000_000 + c.rng.gen_range(0..1000),
            };
            let (payload, kind) = match c.rng.gen_range(0..3) {
                0 => (request::read(&id, h, 16), Kind::Read { h, max: 16 }),
                1 => (
                    req(&id, "write", json!({ "h": h, "data": "aGk=" })),
                    Kind::Write { h, data: b"hi".to_vec() },
                ),
                _ => (request::close(&id, h), Kind::Close { h }),
            };
            send(c, id, payload, kind, Some("must_fail"));
        }
        4 => {
            let h = c.rng.gen_range(0..3u64);
            let (payload, kind, ok) = match c.rng.gen_range(0..3) {
                0 => (request::read(&id, h, 100), Kind::Stdio { write_len: None }, h == 0),
                1 => {
                    let data = draw::bytes(&mut c.rng, 0..100);
                    let len = data.len();
                    (request::write(&id, h, &data, None), Kind::Stdio { write_len: Some(len) }, h != 0)
                }
                _ => (request::close(&id, h), Kind::Stdio { write_len: None }, true),
            };
            let must_fail = if stdio_local && ok { None } else { Some("must_fail") };
            send(c, id, payload, kind, must_fail);
        }
        5 => {
            let h = own.first().copied().unwrap_or(3);
            let max = pick(
                &mut c.rng,
                &[json!(0), json!(4097), json!(1 << 20), json!("12"), json!(-1), json!(1.5), Value::Null],
            )
            .clone();
            let payload = req(&id, "read", json!({ "h": h, "max": max }));
            send(c, id, payload, Kind::Invalid, Some("must_fail"));
        }
        6 if !own.is_empty() => {
            let h = own[c.rng.gen_range(0..own.len())];
            let mode = c.handles[&h].mode;
            let (payload, kind) = if !mode.readable() {
                (request::read(&id, h, 8), Kind::Read { h, max: 8 })
            } else if !mode.writable() {
                (
                    req(&id, "write", json!({ "h": h, "data": "aGk=" })),
                    Kind::Write { h, data: b"hi".to_vec() },
                )
            } else {
                (request::read(&id, h, 0), Kind::Invalid)
            };
            send(c, id, payload, kind, Some("must_fail"));
        }
        7 => {
            let op = *pick(&mut c.rng, &["stat", "QUOTA", "LLMCMD", "OPEN", ""]);
            let payload = req(&id, op, json!({}));
            // A nested level passes `QUOTA` on to the top, where a
            // session's broker is, and serves the client's next request
            // meanwhile.
            let passed_up = op == "QUOTA" && c.level > 0;
            send_held(c, id, payload, Kind::Invalid, Some("must_fail"), !passed_up);
        }
        8 => {
            let payload = pick(
                &mut c.rng,
                &[
                    json!({ "id": id, "op": "open", "params": [1, 2] }),
                    json!({ "id": id, "op": "open", "params": { "path": "v/x" } }),
                    json!({ "id": id, "op": "open", "params": { "mode": "r" } }),
                    json!({ "id": id, "op": "open", "params": { "path": "v/x", "mode": "x" } }),
                    json!({ "id": id, "op": "open", "params": { "path": 5, "mode": "r" } }),
                    json!({ "id": id, "op": 7 }),
                    json!({ "id": id }),
                    json!({ "id": id, "op": "close", "params": { "h": "three" } }),
                    json!({ "id": id, "op": "close" }),
                ],
            )
            .clone();
            let payload = serde_json::to_vec(&payload).unwrap_or_default();
            send(c, id, payload, Kind::Invalid, Some("must_fail"));
        }
        9 => {
            let h = own.first().copied().unwrap_or(3);
            let params = if c.rng.gen_bool(0.5) {
                json!({ "h": h, "data": "!!not base64!!" })
            } else {
                json!({ "h": h, "data": "aGk=", "final": "yes" })
            };
            send(c, id.clone(), req(&id, "write", params), Kind::Invalid, Some("must_fail"));
        }
        _ => {
            let garbage: [&[u8]; 7] = [
                &b"not json"[..],
                b"[1,2,3]",
                br#"{"id":5,"op":"read"}"#,
                br#"{"op":"read","params":{"h":3,"max":1}}"#,
                b"",
                br#"{"id":"x""#,
                b"\"just a string\"",
            ];
            let text = *pick(&mut c.rng, &garbage);
            send_raw(c, text.to_vec());
        }
    }
}
