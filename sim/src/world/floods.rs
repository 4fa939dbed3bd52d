//! The adversary's floods (issue 7, items 6–9): a client that queues big
//! frames behind a request that waits, creates virtual files with huge
//! names, sends responses back as frames (a self-loop), or attaches a
//! burst of connections. Each is a swarm fault (`swarm::FLOODS`), on in
//! every scenario but the broker's; `bounds` checks what they cost.

use super::{frame, next_id, request, send, send_raw, Class, FileModel, Kind, Loc, World};
use crate::swarm::{FaultKind, PPM};
use airlock_core::fsproxy::wire::Mode;
use rand::Rng;
use serde_json::json;
use std::collections::BTreeSet;

/// Attaches an attach flood may add to a world, in all.
const FLOOD_ATTACH_BUDGET: usize = 10;
/// Largest frame a flood sends: enough to press on the small bounds of
/// `swarm::Bounds::SMALL`, small enough to keep worlds quick.
const FLOOD_FRAME: usize = 12 << 10;

/// What the floods of one client left for the checkers.
#[derive(Debug, Default)]
pub(super) struct ClientFloods {
    /// Ids of the responses this client sent as frames: none may be answered.
    pub echoes: BTreeSet<String>,
    /// Where the partial frame of a partial flood starts in the stream.
    pub partial: Option<u64>,
    next: u64,
}

/// The world's side of the floods.
#[derive(Debug)]
pub(super) struct WorldFloods {
    attach_budget: usize,
    /// The floods on in this world's swarm, in the order they are tried,
    /// with their rates: a swarm does not change while its world runs.
    on: Vec<(FaultKind, u32)>,
}

impl WorldFloods {
    pub fn new(swarm: &crate::swarm::Swarm) -> Self {
        let on = crate::swarm::FLOODS
            .iter()
            .chain(&[FaultKind::PartialFlood])
            .filter_map(|k| Some((*k, swarm.rate(*k))).filter(|(_, r)| *r > 0))
            .collect();
        WorldFloods { attach_budget: FLOOD_ATTACH_BUDGET, on }
    }
}

impl World {
    /// Maybe send a flood instead of client `i`'s next request; true if
    /// one was sent. Draws nothing when no flood is on, so other worlds
    /// run as before.
    pub(super) fn issue_flood(&mut self, i: usize) -> bool {
        for k in 0..self.floods.on.len() {
            let (kind, rate) = self.floods.on[k];
            if self.clients[i].rng.gen_range(0..PPM) >= rate {
                continue;
            }
            let sent = match kind {
                FaultKind::QueuedFlood => self.queued_flood(i),
                FaultKind::HugeNames => self.huge_names(i),
                FaultKind::SelfLoop => self.self_loop(i),
                FaultKind::AttachFlood => self.attach_flood(i),
                FaultKind::PartialFlood => self.partial_flood(i),
                _ => false,
            };
            if sent {
                self.count(kind);
                return true;
            }
        }
        false
    }

    fn flood_frame(&self) -> usize {
        (self.swarm.max_frame.saturating_sub(200)).clamp(256, FLOOD_FRAME)
    }

    /// A request that waits (an open of a host file), then a burst of big
    /// frames behind it, each one a write on a handle no one holds (which
    /// must fail, or be refused unserved by a bound).
    fn queued_flood(&mut self, i: usize) -> bool {
        let size = self.flood_frame();
        let c = &mut self.clients[i];
        let id = next_id(c);
        let key = "/data/ro/a.txt".to_owned();
        let payload = request::open(&id, &key, "r");
        send(c, id, payload, Kind::Open { key: Some(key), mode: Mode::Read, host: true }, None);
        let n = c.rng.gen_range(4..=16);
        for _ in 0..n {
            let id = next_id(c);
            let len = c.rng.gen_range(size / 2..=size) * 3 / 4;
            // Drawn as the i32 it always was, so that worlds stay as they were.
            let h = 900_000 + c.rng.gen_range(0..1000i32);
            let payload = request::write(&id, h.unsigned_abs().into(), &vec![b'q'; len], None);
            send(c, id, payload, Kind::Invalid, Some("must_fail"));
        }
        true
    }

    /// Virtual files with names of kilobytes, created empty: each name
    /// costs its bytes, and the files their number.
    fn huge_names(&mut self, i: usize) -> bool {
        let size = self.flood_frame();
        let n = self.clients[i].rng.gen_range(1..=4);
        let level = self.clients[i].level;
        for _ in 0..n {
            let c = &mut self.clients[i];
            c.floods.next += 1;
            let len = c.rng.gen_range(1024.min(size)..=size.saturating_sub(64).max(1024.min(size)));
            let name = format!("h{}-{}-{}", c.idx, c.floods.next, "n".repeat(len));
            self.files
                .insert_new(name.clone(), FileModel::new(Class::Private, Loc::Virtual(name.clone(), level)));
            let c = &mut self.clients[i];
            let id = next_id(c);
            let payload = request::open(&id, &name, "w");
            send(c, id, payload, Kind::Open { key: Some(name), mode: Mode::Write, host: false }, None);
        }
        true
    }

    /// Responses sent back as frames, as both ends of one socketpair
    /// attached would: nothing may answer them. Among them, frames shaped
    /// like a response that are not JSON (a byte that is not UTF-8, a lone
    /// surrogate, a number out of range, each where a lax skip would not
    /// look): those must be refused like any frame that is not JSON.
    fn self_loop(&mut self, i: usize) -> bool {
        let c = &mut self.clients[i];
        let n = c.rng.gen_range(1..=6);
        for _ in 0..n {
            c.floods.next += 1;
            let id = format!("echo-{}-{}", c.idx, c.floods.next);
            let v = match c.rng.gen_range(0..7) {
                0 => json!({ "id": id, "ok": true }),
                1 => json!({ "id": id, "ok": true, "result": { "handle": 3 } }),
                2 => json!({ "id": id, "ok": false, "error": { "code": "E_ARG", "message": "loop" } }),
                3 => json!({ "id": id, "ok": true, "result": { "data": "aGk=", "eof": false } }),
                broken => {
                    let bad: &[u8] = match broken {
                        4 => b"\"aG\xffk=\"",
                        5 => br#""\ud800""#,
                        _ => b"1e999",
                    };
                    let head = format!(r#"{{"id":"{id}","ok":true,"result":{{"data":"#);
                    send_raw(c, [head.as_bytes(), bad, b"}}"].concat());
                    continue;
                }
            };
            let payload = serde_json::to_vec(&v).unwrap_or_default();
            c.out.push(frame(payload));
            c.floods.echoes.insert(id);
        }
        true
    }

    /// Most of a big frame, and never the rest: the client sends nothing
    /// more and, its other requests answered, leaves mid-frame.
    fn partial_flood(&mut self, i: usize) -> bool {
        let max = self.swarm.max_frame.min(40 << 10);
        let c = &mut self.clients[i];
        let len = c.rng.gen_range(max / 2..=max);
        let sent = c.rng.gen_range(len / 2..len);
        let mut bytes = (len as u32).to_be_bytes().to_vec();
        bytes.resize(bytes.len() + sent, b' ');
        c.floods.partial = Some(c.out.pushed);
        c.out.push(bytes);
        c.stream_ended = true;
        true
    }

    /// A burst of attaches, each with its descriptor, past whatever
    /// `max_clients` allows.
    fn attach_flood(&mut self, i: usize) -> bool {
        let c = &self.clients[i];
        let bare = c.order.records().any(|s| matches!(s.kind, Kind::Attach { fd: false }));
        if bare || self.floods.attach_budget == 0 {
            return false;
        }
        let n = self.clients[i].rng.gen_range(2..=6).min(self.floods.attach_budget);
        self.floods.attach_budget -= n;
        let c = &mut self.clients[i];
        for _ in 0..n {
            c.dpending.push_back(c.out.pushed);
            let id = next_id(c);
            let payload = serde_json::to_vec(&json!({ "id": id, "op": "attach" })).unwrap_or_default();
            send(c, id, payload, Kind::Attach { fd: true }, None);
        }
        true
    }

    /// Now and then the top's answer is followed by a frame above the
    /// intermediate's upstream limit, answering nothing it asked: it must
    /// be skipped, and the link kept.
    pub(super) fn maybe_oversize_upstream(&mut self) {
        if !self.fires(FaultKind::UpstreamOversize) {
            return;
        }
        self.count(FaultKind::UpstreamOversize);
        let limit = self.swarm.bounds.max_upstream_frame.max(self.swarm.max_frame);
        let len = limit + 1 + self.rng.gen_range(0..4096);
        let text = "t".repeat(len);
        let payload = serde_json::to_vec(&json!({ "id": "flood", "ok": true, "result": { "text": text } }))
            .unwrap_or_default();
        if let Some(link) = self.link.as_mut() {
            link.down.push(frame(payload));
        }
    }
}
