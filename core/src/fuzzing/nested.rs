//! The `fsproxy_nested` fuzz target: FS proxies stacked as airlock stacks
//! them when a child runs `airlock run` itself. The top level serves files
//! (and runs the broker); each level below forwards what is not its own
//! upstream, over a connection that is one client of the level above.
//! Frames cross each connection in whatever chunks the fuzzer picks, when
//! it picks; clients at every level send what they like, leave, die and
//! attach; connections break and whole levels die.

use super::{
    broker_request, broker_setup, pass_descriptor, provider_command, single_frame, template, test_fs,
    test_policy, Event, Shell,
};
use crate::codec::frame;
use crate::fsproxy::{Config, Input, PlantedBug, StdioRole, ATTACHED_CLIENT_BASE};
use crate::handles::ClientId;
use crate::policy::{Access, Policy, Root};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The client id a level's upstream connection has on the level above;
/// clients the fuzzer connects count up from 0 and stay far below it.
const UP: ClientId = ClientId(ATTACHED_CLIENT_BASE - 1);

/// Rounds of delivery at the end before the levels must have gone quiet.
const MAX_SETTLE_ROUNDS: usize = 10_000;

/// The connection from a level to the level above it.
#[derive(Debug, Default)]
struct Link {
    /// Frames the lower level sent and the upper has not yet read.
    up: Vec<u8>,
    /// Frames the upper level sent and the lower has not yet read.
    down: Vec<u8>,
    /// The connection is closed: nothing more goes up; the lower level
    /// reads what is left in `down`, then EOF.
    closed: bool,
    eof_delivered: bool,
    /// Every request id the lower level sent up.
    sent: BTreeSet<String>,
    /// Those not answered yet.
    outstanding: BTreeSet<String>,
}

#[derive(Debug)]
struct Level {
    shell: Shell,
    alive: bool,
    /// The two clients the fuzzer drives.
    slots: [ClientId; 2],
    /// Every client connected or attached, for the final EOFs.
    clients: Vec<ClientId>,
    next_client: u64,
    /// Clients whose slot moves to the client they attach.
    switch_on_attach: BTreeSet<ClientId>,
    /// To the level above; `None` for the top.
    link: Option<Link>,
}

/// The policy of a level below the top, by `sel`: the top's, a writable
/// `/rw` only, both roots read-only, or no root at all (only virtual
/// files).
fn lower_policy(sel: u8) -> Policy {
    let roots = match sel % 4 {
        0 => return test_policy(),
        1 => vec![Root { path: "/rw".into(), access: Access::ReadWrite }],
        2 => vec![
            Root { path: "/ro".into(), access: Access::ReadOnly },
            Root { path: "/rw".into(), access: Access::ReadOnly },
        ],
        _ => vec![],
    };
    Policy::new(PathBuf::from("/home/agent"), roots)
}

/// Small tables, so full ones are reachable. Frames keep their default
/// limit on every level: a level reads its upstream's answers under its
/// own frame limit, and answers (a quota, an error naming a long path)
/// can be longer than the request they answer, so with small frames the
/// first long answer would end the connection between levels (issue 7,
/// item 11). That the requests a level forwards stay under the limit is
/// checked in `core/tests/forward_frame_limit.rs`.
fn small_limits(config: &mut Config) {
    config.max_open_handles = 4;
    config.max_queued_requests = 4;
    config.max_virtual_bytes = 64;
}

/// The request id of an upstream frame, checked to be one well-formed
/// request a level may forward: never a response, never `attach` (a
/// descriptor cannot travel in a frame), never on handles 0..2 (stdio is
/// each level's own).
fn check_upstream_frame(data: &[u8]) -> String {
    let payload = single_frame(data);
    let v: Value = match serde_json::from_slice(&payload) {
        Ok(v) => v,
        Err(e) => panic!("upstream frame is not JSON ({e}): {}", String::from_utf8_lossy(&payload)),
    };
    assert!(v.get("ok").is_none(), "a response went upstream: {v}");
    let Some(id) = v.get("id").and_then(Value::as_str) else { panic!("upstream request without id: {v}") };
    let Some(op) = v.get("op").and_then(Value::as_str) else { panic!("upstream request without op: {v}") };
    assert_ne!(op, "attach", "attach went upstream: {v}");
    if let Some(h) = v.pointer("/params/h") {
        assert!(h.as_u64().is_some_and(|h| h > 2), "handle {h} went upstream: {v}");
    } else {
        assert!(!matches!(op, "read" | "write" | "close"), "{op} without a handle went upstream: {v}");
    }
    id.to_owned()
}

struct World {
    levels: Vec<Level>,
    next_id: u64,
}

impl World {
    fn new(cfg: u8, planted: Option<PlantedBug>) -> Self {
        let depth = if cfg & 1 == 0 { 2 } else { 3 };
        let mut levels = Vec::new();
        for i in 0..depth {
            let mut config = if i == 0 {
                let stdio = if cfg & 0x80 == 0 { StdioRole::Local } else { StdioRole::Reject };
                let mut c = Config::new(test_policy(), stdio);
                if cfg & 4 != 0 {
                    c.broker = Some(broker_setup(cfg >> 5));
                }
                c
            } else {
                let mut c = Config::new(lower_policy(cfg >> 3), StdioRole::Local);
                c.upstream = true;
                c.planted_bug = planted;
                c
            };
            if cfg & 2 != 0 {
                small_limits(&mut config);
            }
            let mut shell = Shell::new(config, test_fs());
            shell.auto = false;
            let mut level = Level {
                shell,
                alive: true,
                slots: [ClientId(0), ClientId(1)],
                clients: vec![ClientId(0), ClientId(1)],
                next_client: 2,
                switch_on_attach: BTreeSet::new(),
                link: (i > 0).then(Link::default),
            };
            for c in level.slots {
                level.shell.connect(c);
            }
            if i + 1 < depth {
                level.shell.connect(UP);
            }
            levels.push(level);
        }
        World { levels, next_id: 0 }
    }

    /// Move what every level put out onto the links, checking it.
    fn collect(&mut self) {
        for i in 0..self.levels.len() {
            if !self.levels[i].alive {
                continue;
            }
            let events = std::mem::take(&mut self.levels[i].shell.events);
            for event in events {
                match event {
                    Event::Upstream(data) => {
                        let id = check_upstream_frame(&data);
                        let Some(link) = self.levels[i].link.as_mut() else {
                            panic!("the top level sent upstream")
                        };
                        assert!(link.sent.insert(id.clone()), "upstream request id {id} reused");
                        if !link.closed {
                            link.outstanding.insert(id);
                            link.up.extend_from_slice(&data);
                        }
                    }
                    Event::Sent(client, payload) if client == UP => {
                        let Some(link) = self.levels.get_mut(i + 1).and_then(|l| l.link.as_mut()) else {
                            panic!("sent to the upstream client of a level with none below")
                        };
                        // The Shell checked the envelope; here, that it
                        // answers a request really sent, once.
                        let id = super::parse_response_json(&payload)["id"].as_str().map(str::to_owned);
                        let Some(id) = id else {
                            panic!("a level answered its lower level without an id: {payload:?}")
                        };
                        assert!(link.outstanding.remove(&id), "answer to {id}, which is not outstanding");
                        link.down.extend_from_slice(&frame::encode(&payload));
                    }
                    Event::Closed(client) if client == UP => {
                        if let Some(link) = self.levels.get_mut(i + 1).and_then(|l| l.link.as_mut()) {
                            link.closed = true;
                            link.up.clear();
                        }
                    }
                    Event::Attached(from, new) => {
                        let level = &mut self.levels[i];
                        level.clients.push(new);
                        if level.switch_on_attach.remove(&from) {
                            for slot in level.slots.iter_mut().filter(|s| **s == from) {
                                *slot = new;
                            }
                        }
                    }
                    // No level here has a session socket.
                    Event::Sent(..)
                    | Event::Closed(_)
                    | Event::Admitted(_)
                    | Event::Refused(_)
                    | Event::Dismissed => {}
                }
            }
        }
    }

    /// Deliver up to `n` bytes (0: all) from level `i` to the level above.
    /// True if anything moved.
    fn deliver_up(&mut self, i: usize, n: usize) -> bool {
        let (above, below) = self.levels.split_at_mut(i);
        let (Some(upper), Some(lower)) = (above.last_mut(), below.first_mut()) else { return false };
        let Some(link) = lower.link.as_mut() else { return false };
        if link.closed || link.up.is_empty() || !upper.alive {
            return false;
        }
        let n = if n == 0 { link.up.len() } else { n.min(link.up.len()) };
        let data: Vec<u8> = link.up.drain(..n).collect();
        upper.shell.input(Input::Bytes { client: UP, data });
        true
    }

    /// Deliver up to `n` bytes (0: all) from the level above to level `i`,
    /// then its EOF once the connection is closed and drained.
    fn deliver_down(&mut self, i: usize, n: usize) -> bool {
        let Some(level) = self.levels.get_mut(i) else { return false };
        let Some(link) = level.link.as_mut() else { return false };
        if !level.alive {
            return false;
        }
        if !link.down.is_empty() {
            let n = if n == 0 { link.down.len() } else { n.min(link.down.len()) };
            let data: Vec<u8> = link.down.drain(..n).collect();
            level.shell.input(Input::UpstreamBytes { data });
            return true;
        }
        if link.closed && !link.eof_delivered {
            link.eof_delivered = true;
            level.shell.input(Input::UpstreamEof);
            return true;
        }
        false
    }

    /// Level `i`'s connection upward breaks: the level above sees EOF
    /// (unread bytes are lost), the level below reads what was sent to it,
    /// then EOF.
    fn cut(&mut self, i: usize) {
        let Some(link) = self.levels.get_mut(i).and_then(|l| l.link.as_mut()) else { return };
        if link.closed {
            return;
        }
        link.closed = true;
        link.up.clear();
        link.outstanding.clear();
        if let Some(upper) = self.levels.get_mut(i.wrapping_sub(1)).filter(|l| l.alive) {
            upper.shell.input(Input::Eof { client: UP });
        }
    }

    /// Level `i`'s process dies: the level above sees it die, the level
    /// below its upstream close; its own clients lose their server.
    fn kill(&mut self, i: usize) {
        if i == 0 || !self.levels.get(i).is_some_and(|l| l.alive) {
            return;
        }
        self.cut(i);
        if let Some(upper) = self.levels.get_mut(i - 1).filter(|l| l.alive) {
            upper.shell.input(Input::Died { client: UP });
        }
        self.levels[i].alive = false;
        if let Some(link) = self.levels.get_mut(i + 1).and_then(|l| l.link.as_mut()) {
            link.closed = true;
            link.up.clear();
        }
    }

    /// Deliver everything on every link until nothing moves; true if
    /// anything did.
    fn pump(&mut self) -> bool {
        let mut moved = false;
        loop {
            self.collect();
            let mut now = false;
            for i in 1..self.levels.len() {
                now |= self.deliver_up(i, 0);
                now |= self.deliver_down(i, 0);
            }
            if !now {
                return moved;
            }
            moved = true;
        }
    }

    /// Complete every effect and deliver every frame until the levels go
    /// quiet.
    fn settle_all(&mut self) {
        for _ in 0..MAX_SETTLE_ROUNDS {
            let mut moved = false;
            for level in self.levels.iter_mut().filter(|l| l.alive) {
                moved |= !level.shell.effects.is_empty();
                level.shell.settle();
            }
            moved |= self.pump();
            if !moved {
                return;
            }
        }
        panic!("the levels never went quiet");
    }

    fn step(&mut self, cmd: u8, arg: u8, script: &mut &[u8]) {
        let i = usize::from(cmd >> 6) % self.levels.len();
        let slot = usize::from(cmd >> 5 & 1);
        let take = |script: &mut &[u8], n: usize| -> Vec<u8> {
            let n = n.min(script.len());
            let (head, tail) = script.split_at(n);
            *script = tail;
            head.to_vec()
        };
        let kind = cmd & 0x1f;
        // Link and death commands name a level with a link.
        let lower = i.max(1);
        if !self.levels[i].alive && !matches!(kind, 13..=17 | 24..) {
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        let level = &mut self.levels[i];
        let client = level.slots[slot];
        match kind {
            0 => {
                let data = take(script, usize::from(arg));
                level.shell.input(Input::Bytes { client, data });
            }
            1 => {
                let payload = take(script, usize::from(arg));
                level.shell.send(client, &payload);
            }
            2..=4 | 19..=23 => {
                let sel = take(script, 1).first().copied().unwrap_or(0);
                level.shell.send(client, &template(sel, arg, id));
            }
            5 => match broker_request(arg, id) {
                Some(req) => level.shell.send_json(client, &req),
                None => provider_command(&mut self.levels[0].shell, arg),
            },
            6 | 7 => {
                let n = level.shell.effects.len().max(1);
                level.shell.complete(usize::from(arg) % n, kind == 7);
            }
            8 => level.shell.settle(),
            9 => level.shell.input(Input::Eof { client }),
            10 => level.shell.input(Input::Died { client }),
            11 => {
                let new = ClientId(level.next_client);
                level.next_client += 1;
                level.slots[slot] = new;
                level.clients.push(new);
                level.shell.connect(new);
            }
            12 => {
                if arg & 2 != 0 {
                    level.switch_on_attach.insert(client);
                }
                pass_descriptor(&mut level.shell, client, arg & 1, id);
            }
            13 => {
                self.deliver_up(lower, usize::from(arg));
            }
            14 => {
                self.deliver_down(lower, usize::from(arg));
            }
            15 => {
                self.pump();
            }
            16 => self.cut(lower),
            17 => self.kill(lower),
            18 => level.shell.fs.stdin.extend_from_slice(&take(script, usize::from(arg))),
            _ => {
                self.deliver_up(lower, usize::from(arg));
                self.deliver_down(lower, usize::from(arg));
            }
        }
        self.collect();
    }

    /// Every client leaves, everything is delivered and completed, and
    /// then nothing may be left on any level.
    fn finish(&mut self) {
        for level in self.levels.iter_mut().filter(|l| l.alive) {
            for client in level.clients.clone() {
                level.shell.input(Input::Eof { client });
            }
        }
        self.settle_all();
        // Provider calls still running end; timers fire.
        if self.levels[0].alive {
            let top = &mut self.levels[0].shell;
            while let Some((call, _, _)) = top.provider_calls.first().cloned() {
                top.provider_done(call, crate::broker::ProviderResult::error(None, "end"));
            }
            while top.fire_timer() {}
        }
        self.settle_all();
        // The levels below have closed upstream everything their clients
        // held, before any connection between levels closes (which would
        // clean up on its own and hide a leak).
        for (i, level) in self.levels.iter().enumerate().filter(|(_, l)| l.alive) {
            let p = &level.shell.proxy;
            assert_eq!(p.open_handles(), 0, "level {i}: handles left after every client left");
            assert_eq!(p.broker_requests_pending(), 0, "level {i}: broker answers still owed");
            assert_eq!(level.shell.fs.open_files(), 0, "level {i}: host files left open");
            assert!(p.quiescent(), "level {i}: work left after every client left");
            if let Some(b) = p.broker() {
                assert!(b.is_idle(), "level {i}: broker work left after every client left");
            }
            if let Some(link) = &level.link {
                if !link.closed {
                    assert!(link.outstanding.is_empty(), "level {i}: upstream requests never answered");
                }
            }
        }
        for i in 1..self.levels.len() {
            self.cut(i);
        }
        self.settle_all();
        for (i, level) in self.levels.iter().enumerate().filter(|(_, l)| l.alive) {
            let p = &level.shell.proxy;
            assert_eq!(p.tracked_clients(), 0, "level {i}: clients still tracked");
            assert_eq!(p.open_handles(), 0, "level {i}: handles left");
            let stats = p.stats();
            assert_eq!(
                stats.handles_opened, stats.handles_closed,
                "level {i}: opened and closed counts differ"
            );
            assert_eq!(stats.upstream_errors, 0, "level {i}: upstream answers it could not match");
        }
    }
}

/// Fuzz two or three FS proxies stacked. The first byte picks the world:
/// bit 0 three levels (else two), bit 1 small limits on every level,
/// bit 2 a broker at the top (bits 5..6 its budget), bits 3..4 the policy
/// of the levels below (the top's, `/rw` only, both roots read-only, no
/// roots), bit 7 the top refuses stdio. The rest is a script of commands,
/// a command byte and an argument byte each: bits 6..7 pick the level,
/// bit 5 the client slot, bits 0..4 the kind:
///
/// | kind | command |
/// | --- | --- |
/// | 0 | `arg` raw bytes from the client |
/// | 1 | `arg` bytes, framed |
/// | 2..4, 19..23 | a templated request (`arg`, then a selector byte) |
/// | 5 | a broker request, or for `arg % 8` 5..7 a provider result or timer at the top |
/// | 6, 7 | complete (7: fail) the level's effect `arg % n` |
/// | 8 | complete all the level's effects |
/// | 9, 10 | the client's EOF, death |
/// | 11 | a new client in the slot |
/// | 12 | the client passes a descriptor (`arg` bit 0: and attaches it; bit 1: the slot drives the attached client) |
/// | 13, 14 | deliver `arg` bytes (0: all) up from, down to, the level (the top: level 1) |
/// | 15 | deliver everything on every connection |
/// | 16 | the level's connection upward breaks |
/// | 17 | the level's process dies |
/// | 18 | `arg` bytes appended to the level's stdin |
/// | 24.. | deliver `arg` bytes each way |
///
/// Checked after every step: every frame to a client (a lower level
/// included) is one well-formed response, nothing goes to a departed
/// client, every frame upstream is a request with a fresh id and never on
/// handles 0..2, every answer from above matches a request sent once. At
/// the end, after every client has left: no handle, client, file, broker
/// answer or unanswered request is left on any level.
pub fn fsproxy_nested(data: &[u8]) {
    run(data, None);
}

/// [`fsproxy_nested`], with `planted` on the levels below the top.
fn run(data: &[u8], planted: Option<PlantedBug>) {
    let Some((&cfg, mut script)) = data.split_first() else { return };
    let mut world = World::new(cfg, planted);
    while let Some((&cmd, rest)) = script.split_first() {
        let (arg, rest) = match rest.split_first() {
            Some((&a, r)) => (a, r),
            None => (0, rest),
        };
        script = rest;
        world.step(cmd, arg, &mut script);
    }
    world.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panic_message(data: &[u8], planted: Option<PlantedBug>) -> Option<String> {
        let err = std::panic::catch_unwind(|| run(data, planted)).err()?;
        Some(err.downcast_ref::<String>().cloned().unwrap_or_else(|| "non-string panic".into()))
    }

    /// A client of the middle level opens two files through it, then
    /// leaves.
    fn two_opens_then_eof() -> Vec<u8> {
        let open = |id: &str, path: &str| {
            let p = serde_json::json!({"id": id, "op": "open", "params": {"path": path, "mode": "r"}});
            let p = p.to_string().into_bytes();
            let mut out = vec![1 << 6 | 1, u8::try_from(p.len()).unwrap_or(0)];
            out.extend(p);
            out.extend([15, 0, 8, 0, 15, 0]); // pump, settle the top, pump
            out
        };
        let mut data = vec![0];
        data.extend(open("1", "/rw/notes.txt"));
        data.extend(open("2", "/ro/hello.txt"));
        data.extend([1 << 6 | 9, 0, 15, 0]); // EOF, pump
        data
    }

    #[test]
    fn the_script_holds_every_check() {
        assert_eq!(panic_message(&two_opens_then_eof(), None), None);
    }

    #[test]
    fn a_handle_a_lower_level_forgets_to_close_upstream_is_found() {
        let msg = panic_message(&two_opens_then_eof(), Some(PlantedBug::CleanupForgetsLastHandle));
        let msg = msg.unwrap_or_default();
        assert!(msg.contains("handles left"), "{msg}");
    }

    #[test]
    fn stdio_handles_going_upstream_are_found() {
        for h in 0..3 {
            let req = serde_json::json!({"id": "u0", "op": "read", "params": {"h": h, "max": 1}});
            let data = frame::encode(req.to_string().as_bytes());
            assert!(std::panic::catch_unwind(|| check_upstream_frame(&data)).is_err(), "h {h}");
        }
        let ok = serde_json::json!({"id": "u0", "op": "read", "params": {"h": 3, "max": 1}});
        assert_eq!(check_upstream_frame(&frame::encode(ok.to_string().as_bytes())), "u0");
        let resp = serde_json::json!({"id": "u0", "ok": true});
        assert!(std::panic::catch_unwind(|| check_upstream_frame(&frame::encode(
            resp.to_string().as_bytes()
        )))
        .is_err());
    }
}
