//! The pager scenario: children of an intermediate proxy and of the top
//! wrap content (whole, streamed in chunks, or a file by path), read,
//! search and export fds, while the world kills them, the intermediate,
//! and fails their file effects.
//!
//! The checkers keep their own model of what every fd must hold — the
//! bytes its client sent, or the fixture file it named — and after every
//! step compare it with what the top level stores, along with the pager
//! laws (DESIGN.md invariant 7: pages concatenate back to the content,
//! flags and line ranges agree with the text), and the session's bound on
//! the bytes its fds hold (invariant 11), against the limit the world
//! configured rather than the one the machine believes.

use super::response::Response;
use super::{next_id, req, request, send, violation, Check, Kind, World};
use airlock_core::pager::check::{check_accounting, check_document};
use airlock_core::pager::PagerConfig;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::collections::BTreeMap;

/// A pager op, as the checkers follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum POp {
    /// A whole wrap, or the last chunk of a stream: `content` is all of it.
    Wrap { content: Vec<u8> },
    /// A chunk that more follow.
    Chunk,
    /// Page 1 of an fd the model knows.
    ReadKnown { fd: u64 },
    /// An fd that never existed.
    ReadUnknown,
    /// Search, export, or wrap of a path: any single answer.
    Other,
}

#[derive(Debug)]
pub(super) struct PagerSim {
    /// The limit the world set, whatever the machine holds.
    limit: u64,
    /// What each fd must hold.
    fds: BTreeMap<u64, Vec<u8>>,
    /// fds of the model not yet compared with the store.
    unchecked: Vec<u64>,
    /// The top's fds below this number obey the laws (stored content
    /// never changes, and fds are numbered in order).
    checked: u64,
    next_stream: u64,
}

/// The pager a pager world's top level runs: small pages and thresholds
/// (so most content pages), and a limit that the clients reach.
pub(super) fn setup(rng: &mut ChaCha8Rng) -> PagerConfig {
    PagerConfig {
        max_direct_output_chars: rng.gen_range(16..600),
        default_page_size: rng.gen_range(8..400),
        max_input_chars: rng.gen_range(16..600),
        page_user_input: rng.gen_bool(0.5),
        max_total_bytes: [4_000, 40_000, 400_000][rng.gen_range(0..3)],
    }
}

impl PagerSim {
    pub(super) fn new(config: &PagerConfig) -> Self {
        PagerSim {
            limit: config.max_total_bytes,
            fds: BTreeMap::new(),
            unchecked: Vec::new(),
            checked: 0,
            next_stream: 0,
        }
    }
}

/// Text lines of mixed lengths, now and then XML specials, CRLF, a long
/// line, or bytes that are not text at all.
fn content(rng: &mut ChaCha8Rng, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let target = rng.gen_range(0..max);
    while out.len() < target {
        match rng.gen_range(0..20) {
            0 => out.extend((0..rng.gen_range(1..8)).map(|_| rng.gen::<u8>())),
            1 => out.extend_from_slice("<&>\"'é😀\r\n".as_bytes()),
            2 => {
                let n = rng.gen_range(100..900);
                out.resize(out.len() + n, b'L');
            }
            _ => {
                let n = rng.gen_range(0..60);
                out.extend((0..n).map(|_| b'a' + rng.gen_range(0..26u8)));
                out.push(b'\n');
            }
        }
    }
    out.truncate(max);
    out
}

impl World {
    /// Perhaps send a pager op for client `i`; false: send a file op.
    pub(super) fn pager_issue(&mut self, i: usize) -> bool {
        let Some(p) = self.pager.as_mut() else { return false };
        let known: Vec<u64> = p.fds.keys().copied().collect();
        let stream = p.next_stream;
        let c = &mut self.clients[i];
        let roll = c.rng.gen_range(0..100);
        if roll >= 60 {
            return false;
        }
        let fd = |c: &mut ChaCha8Rng| known.get(c.gen_range(0..known.len().max(1))).copied();
        match roll {
            0..15 => {
                let data = content(&mut c.rng, 3000);
                let source = if c.rng.gen_bool(0.2) { "user_input" } else { "tool" };
                let id = next_id(c);
                let payload = request::wrap(&id, &data, source);
                send(c, id.clone(), payload, Kind::Pager(POp::Wrap { content: data }), None);
            }
            15..25 => {
                // A stream of a few chunks, pipelined.
                let name = format!("s{stream}");
                let mut all = Vec::new();
                let chunks = c.rng.gen_range(1..5);
                for k in 0..chunks {
                    let data = content(&mut c.rng, 2500);
                    let more = k + 1 < chunks;
                    let offset = all.len() as u64;
                    all.extend_from_slice(&data);
                    let id = next_id(c);
                    let payload = request::wrap_chunk(&id, &name, &data, more, offset);
                    let op = if more { POp::Chunk } else { POp::Wrap { content: all.clone() } };
                    send(c, id.clone(), payload, Kind::Pager(op), None);
                }
                if let Some(p) = self.pager.as_mut() {
                    p.next_stream += 1;
                }
            }
            25..32 => {
                let id = next_id(c);
                let params = json!({ "path": "/data/ro/a.txt" });
                let content = self.fixture.clone();
                send(c, id.clone(), req(&id, "FD_WRAP", params), Kind::Pager(POp::Wrap { content }), None);
            }
            32..45 => {
                let id = next_id(c);
                let (params, op) = match fd(&mut c.rng) {
                    Some(n) => (json!({ "fd": format!("fd:{n}") }), POp::ReadKnown { fd: n }),
                    None => (json!({ "fd": "fd:999999" }), POp::ReadUnknown),
                };
                send(c, id.clone(), req(&id, "FD_READ", params), Kind::Pager(op), None);
            }
            45..50 => {
                let id = next_id(c);
                let n = fd(&mut c.rng).unwrap_or(1);
                let params = json!({ "fd": format!("fd:{n}"), "query": "a", "ignore_case": true });
                send(c, id.clone(), req(&id, "FD_SEARCH", params), Kind::Pager(POp::Other), None);
            }
            _ => {
                let id = next_id(c);
                let n = fd(&mut c.rng).unwrap_or(1);
                let path = ["/data/rw/pager.out", "/data/ro/refused", "/etc/passwd", "pager-virtual"]
                    [c.rng.gen_range(0..4)];
                let mode = ["write", "append", "insert"][c.rng.gen_range(0..3)];
                let mut params = json!({ "fd": format!("fd:{n}"), "path": path, "mode": mode });
                if mode == "insert" {
                    params["insert_at_line"] = c.rng.gen_range(0..4).into();
                }
                send(c, id.clone(), req(&id, "FD_TO_FILE", params), Kind::Pager(POp::Other), None);
            }
        }
        true
    }

    pub(super) fn on_pager_response(&mut self, id: &str, op: POp, v: &Response<'_>) -> Check {
        let ok = v.ok().unwrap_or(false);
        let (code, message) = (v.code(), v.message());
        let code: &str = &code;
        let result = v.result().unwrap_or_default();
        let bad = |what: &str| Err(violation("pager_answer", format!("{id}: {what}: {v}")));
        // E_IO: the upstream was lost; E_RANGE: a full queue, or the limit.
        let lost = matches!(code, "E_IO" | "E_RANGE");
        if !ok && code != "E_IO" && !message.starts_with("<fd_error") && code != "E_RANGE" {
            return bad("a pager failure without an fd_error");
        }
        let Some(p) = self.pager.as_mut() else { return Ok(()) };
        match op {
            POp::Wrap { content } if ok => {
                if let Some(fd) = result.fd.as_str() {
                    let Some(n) = fd.strip_prefix("fd:").and_then(|n| n.parse::<u64>().ok()) else {
                        return bad("a wrap named no fd");
                    };
                    if p.fds.insert(n, content).is_some() {
                        return bad("an fd handed out twice");
                    }
                    p.unchecked.push(n);
                } else {
                    let data = result.data.as_str().unwrap_or_default();
                    if STANDARD.decode(&*data).ok().as_deref() != Some(content.as_slice()) {
                        return bad("direct content differs from what was wrapped");
                    }
                }
            }
            POp::ReadKnown { fd } => {
                if !ok && !lost {
                    return bad("a read of an fd the session holds failed");
                }
                let xml = result.xml.as_str().unwrap_or_default();
                if ok && !xml.starts_with(&format!("<fd_content fd=\"fd:{fd}\" page=\"1\"")) {
                    return bad("page 1 of a known fd is not its fd_content");
                }
            }
            POp::ReadUnknown if ok => return bad("an fd that never existed was read"),
            _ => {}
        }
        Ok(())
    }

    /// After every step: the top's fds hold exactly what was wrapped, obey
    /// the laws, and stay within the world's limit. Stored content never
    /// changes, so each fd is checked whole once, the bytes every step.
    pub(super) fn pager_check(&mut self) -> Check {
        let Some(p) = &self.pager else { return Ok(()) };
        if !self.levels[0].alive {
            return Ok(());
        }
        let Some(pager) = self.levels[0].m.pager() else {
            return Err(violation("pager", "the top runs no pager".into()));
        };
        check_accounting(pager, p.limit).map_err(|e| violation("bounded_resources", e))?;
        let mut checked = p.checked;
        for (n, d) in pager.fds().filter(|(n, _)| *n >= p.checked) {
            check_document(d).map_err(|e| violation("pager_laws", format!("fd:{n}: {e}")))?;
            checked = n + 1;
        }
        for n in &p.unchecked {
            match (pager.document(*n), p.fds.get(n)) {
                (Some(d), Some(content)) if d.raw() == content.as_slice() => {}
                (Some(_), _) => {
                    return Err(violation("no_data_loss", format!("fd:{n} differs from what was wrapped")))
                }
                (None, _) => return Err(violation("no_data_loss", format!("fd:{n} is gone"))),
            }
        }
        if let Some(p) = self.pager.as_mut() {
            p.checked = checked;
            p.unchecked.clear();
        }
        Ok(())
    }

    /// At the end: no stream, job or file of the pager left on any level.
    pub(super) fn pager_final_check(&self) -> Check {
        if self.pager.is_none() {
            return Ok(());
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.alive && l.m.pager_busy() != (0, 0, 0) {
                return Err(violation(
                    "no_leaked_handles",
                    format!(
                        "level {i}: pager streams, jobs or files left at the end: {:?}",
                        l.m.pager_busy()
                    ),
                ));
            }
        }
        Ok(())
    }
}
