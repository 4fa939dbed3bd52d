//! Bounded resources: the limits that keep what one session holds under
//! control whatever its clients send (DESIGN.md, invariants 11 and 12),
//! and the small decisions they need.
//!
//! Every limit counts bytes as well as items: queued request bytes per
//! client and per session, partial-frame bytes of all connections, virtual
//! names and contents, and the descriptors connections may take before the
//! reserve kept for host files and provider calls.

use super::{Client, ErrorCode, Failure, FsProxy, Output, PlantedBug};
use crate::handles::ClientId;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of queued requests one client may have waiting by default.
pub const DEFAULT_MAX_QUEUED_BYTES: u64 = 4 << 20;
/// Bytes of queued requests all clients of a session may have waiting.
pub const DEFAULT_MAX_SESSION_QUEUED_BYTES: u64 = 32 << 20;
/// Clients a session serves at once (the first one and every attached one).
pub const DEFAULT_MAX_CLIENTS: usize = 64;
/// Bytes of partial frames all connections of a session may hold.
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 16 << 20;
/// Largest frame a nested level accepts from its upstream: larger than
/// what it accepts from children, since the top's answers (an LLM reply)
/// may be; a frame above it is skipped, failing the one request it answers.
pub const DEFAULT_MAX_UPSTREAM_FRAME: usize = 64 << 20;
/// Descriptors the session may hold when the shell does not say
/// (the usual soft `RLIMIT_NOFILE`).
pub const DEFAULT_MAX_DESCRIPTORS: usize = 1024;
/// Passed descriptors a client may have waiting for an attach, dropped
/// ones included, that the machine remembers in order.
const MAX_REMEMBERED_DROPS: usize = 64;
/// Descriptors connections (clients and passed sockets) must leave free,
/// for host files and provider calls.
pub const DEFAULT_DESCRIPTOR_RESERVE: usize = 64;
/// Descriptors host opens must leave free, for provider calls and the
/// shell's own needs.
pub const PROVIDER_DESCRIPTOR_RESERVE: usize = 8;

pub(crate) fn default_max_queued_bytes() -> u64 {
    DEFAULT_MAX_QUEUED_BYTES
}
pub(crate) fn default_max_session_queued_bytes() -> u64 {
    DEFAULT_MAX_SESSION_QUEUED_BYTES
}
pub(crate) fn default_max_clients() -> usize {
    DEFAULT_MAX_CLIENTS
}
pub(crate) fn default_max_buffered_bytes() -> u64 {
    DEFAULT_MAX_BUFFERED_BYTES
}
pub(crate) fn default_max_virtual_files() -> usize {
    super::virtual_fs::DEFAULT_MAX_VIRTUAL_FILES
}
pub(crate) fn default_max_upstream_frame() -> usize {
    DEFAULT_MAX_UPSTREAM_FRAME
}
pub(crate) fn default_max_descriptors() -> usize {
    DEFAULT_MAX_DESCRIPTORS
}
pub(crate) fn default_descriptor_reserve() -> usize {
    DEFAULT_DESCRIPTOR_RESERVE
}

/// Whether a frame is a response rather than a request: a JSON object
/// with `ok`, `result` or `error` and no `op`. A peer looping airlock's
/// answers back (both ends of one socketpair attached) sends nothing
/// else, and answering it would start the loop again.
///
/// It must be JSON as the request parse reads it, every member checked:
/// a frame it refuses (a byte that is not UTF-8 in a string, a lone
/// surrogate, a number out of range) is answered with that refusal, not
/// dropped, or its sender would wait for an answer forever.
pub fn is_response(payload: &[u8]) -> bool {
    shape(payload, true)
}

/// `is_response`, checking members only when `checked` (unchecked is
/// `PlantedBug::UncheckedResponseShape`).
pub(super) fn shape(payload: &[u8], checked: bool) -> bool {
    let mut de = serde_json::Deserializer::from_slice(payload);
    match de.deserialize_map(Members { checked }).and_then(|s| de.end().map(|()| s)) {
        Ok(s) => !s.op && (s.ok || s.result || s.error),
        Err(_) => false,
    }
}

/// Which of the members that tell a response from a request a frame has.
#[derive(Default)]
struct Shape {
    op: bool,
    ok: bool,
    result: bool,
    error: bool,
}

struct Members {
    checked: bool,
}

impl<'de> Visitor<'de> for Members {
    type Value = Shape;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut s = Shape::default();
        // A repeated key is JSON the tree reads (its last value wins): it
        // is there either way.
        while let Some(key) = map.next_key::<Key>()? {
            if self.checked {
                map.next_value::<Checked>()?;
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
            match key {
                Key::Op => s.op = true,
                Key::Ok => s.ok = true,
                Key::Result => s.result = true,
                Key::Error => s.error = true,
                Key::Other => {}
            }
        }
        Ok(s)
    }
}

enum Key {
    Op,
    Ok,
    Result,
    Error,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "op" => Key::Op,
                    "ok" => Key::Ok,
                    "result" => Key::Result,
                    "error" => Key::Error,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(Name)
    }
}

/// Any JSON value, read and checked as a `Value` would be but kept
/// nowhere: a huge frame costs no tree. (serde's `IgnoredAny` skips a
/// string's bytes and a number's range unchecked.)
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> Visitor<'de> for Any {
            type Value = Checked;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
                while seq.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
                while map.next_entry::<Checked, Checked>()?.is_some() {}
                Ok(Checked)
            }
        }
        d.deserialize_any(Any)
    }
}

/// The id an upstream response carries, read from its first bytes: the
/// top (an airlock) writes `id` first, so a skipped frame's head tells
/// which request it answered.
pub fn id_from_head(head: &[u8]) -> Option<String> {
    const KEY: &[u8] = br#""id""#;
    let at = head.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let skip_ws = |mut i: usize| {
        while head.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let colon = skip_ws(at);
    if head.get(colon) != Some(&b':') {
        return None;
    }
    let quote = skip_ws(colon + 1);
    if head.get(quote) != Some(&b'"') {
        return None;
    }
    let rest = &head[quote + 1..];
    let end = rest.iter().position(|&b| b == b'"')?;
    let id = std::str::from_utf8(&rest[..end]).ok()?;
    // The machine's own upstream ids are `u` and digits: anything else is
    // not one of ours (or was escaped, and then not ours either).
    (id.starts_with('u') && id.len() > 1 && id[1..].bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.to_owned())
}

/// What a session holds against its bounds (see [`FsProxy::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub queued_bytes: u64,
    pub buffered_bytes: u64,
    pub virtual_bytes: u64,
    pub virtual_files: usize,
    pub clients: usize,
    pub descriptors: usize,
}

impl FsProxy {
    /// What the session holds now, against its bounds (for reports and
    /// tests; the simulator recomputes these on its own).
    pub fn usage(&self) -> Usage {
        Usage {
            queued_bytes: self.queued_total,
            buffered_bytes: self.buffered_total,
            virtual_bytes: self.virt.bytes(),
            virtual_files: self.virt.files(),
            clients: self.live_clients(),
            descriptors: self.descriptors_held(),
        }
    }

    pub(super) fn live_clients(&self) -> usize {
        self.clients.values().filter(|c| c.alive).count()
    }

    /// Descriptors the shell holds for this machine: one per live
    /// connection, one per passed descriptor not yet claimed, one per
    /// host file.
    pub(super) fn descriptors_held(&self) -> usize {
        let passed: usize = self.clients.values().map(|c| c.passed.iter().filter(|h| **h).count()).sum();
        self.live_clients() + passed + self.host_fds
    }

    /// Whether one more connection descriptor would eat into the reserve.
    pub(super) fn connections_full(&self) -> bool {
        self.descriptors_held() + 1 + self.config.descriptor_reserve > self.config.max_descriptors
    }

    /// The partial frames of every connection together stay under
    /// `max_buffered_bytes`: the client whose bytes would cross it is
    /// refused and its connection ended.
    pub(super) fn check_buffered(&mut self, client: ClientId) {
        let max = self.config.max_buffered_bytes;
        let held = self.clients.get(&client).map_or(0, |c| c.decoder.buffered());
        let planted = self.config.planted_bug == Some(PlantedBug::NoBufferedBound);
        if held == 0 || self.buffered_total <= max || planted {
            return;
        }
        self.stats.bounds_refused += 1;
        let msg = format!(
            "partial frames of all connections would exceed {max} bytes (--max-buffered-bytes); \
             this connection held {held}"
        );
        self.respond(client, None, Err(Failure::new(ErrorCode::Range, msg)));
        self.depart(client);
    }

    /// A descriptor passed by `client`: kept for an `attach` to claim,
    /// unless holding it would eat into the descriptor reserve.
    pub(super) fn on_descriptor(&mut self, client: ClientId) {
        let full = self.connections_full();
        // A departed client's descriptors are the shell's to close.
        let Some(c) = self.clients.get_mut(&client).filter(|c| c.alive) else { return };
        if full {
            self.outputs.push_back(Output::DropDescriptor { client, newest: true });
        }
        // A dropped one is remembered (for its attach's E_RANGE) only up
        // to a point: past it, its attach finds no socket (E_ARG).
        if !full || c.passed.len() < MAX_REMEMBERED_DROPS {
            c.passed.push_back(!full);
        }
    }

    /// Why a request of `len` bytes that has to wait cannot be queued for
    /// `c`: its client's or the session's queued bytes would cross their
    /// bound.
    pub(super) fn queued_bytes_refusal(&self, c: &Client, len: u64) -> Option<String> {
        if self.config.planted_bug == Some(PlantedBug::NoQueuedByteBound) {
            return None;
        }
        if c.queued_bytes + len > self.config.max_queued_bytes {
            return Some(format!(
                "queued requests of this client would exceed {} bytes (--max-queued-bytes); \
                 read responses before sending more",
                self.config.max_queued_bytes
            ));
        }
        if self.queued_total + len > self.config.max_session_queued_bytes {
            return Some(format!(
                "queued requests of all clients would exceed {} bytes (--max-session-queued-bytes)",
                self.config.max_session_queued_bytes
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn responses_are_told_from_requests() {
        assert!(is_response(br#"{"id":"1","ok":true}"#));
        assert!(is_response(br#"{"id":null,"ok":false,"error":{"code":"E_ARG","message":"x"}}"#));
        assert!(is_response(br#"{"result":{"handle":3}}"#));
        assert!(!is_response(br#"{"id":"1","op":"open","ok":true}"#));
        assert!(!is_response(br#"{"id":"1","op":"read","params":{"h":3,"max":1}}"#));
        assert!(!is_response(b"not json"));
        assert!(!is_response(b"[1,2]"));
        assert!(!is_response(br#"{"id":"1"}"#));
        // A repeated key is still JSON.
        assert!(is_response(br#"{"ok":true,"ok":false}"#));
    }

    /// Frames the request parse refuses as JSON: each is answered, so none
    /// may pass for a response however response-like its members.
    #[test]
    fn a_frame_that_is_not_json_is_no_response() {
        let frames: [&[u8]; 6] = [
            b"{\"id\":\"c1-236\",\"ok\":\"write\",\"params\":{\"data\":\"Wl\xdcQ\"}}",
            br#"{"ok":true,"p":"\ud800"}"#,
            br#"{"ok":true,"p":["\udc00x"]}"#,
            br#"{"ok":true,"p":{"q":1e999}}"#,
            b"{\"ok\":true,\"p\":{\"\xff\":1}}",
            b"{\"ok\":true,\"p\":\"a\x01\"}",
        ];
        for f in frames {
            assert!(serde_json::from_slice::<serde_json::Value>(f).is_err(), "{f:?} is not JSON");
            assert!(!is_response(f), "{:?} passed for a response", String::from_utf8_lossy(f));
        }
    }

    /// Members a response might carry, some of them JSON the tree refuses.
    fn member() -> impl Strategy<Value = Vec<u8>> {
        let values: Vec<&'static [u8]> = vec![
            b"true",
            b"null",
            br#""op""#,
            br#"{"code":"E_ARG","message":"x"}"#,
            br#"[1,-2.5e3,{"a":[]}]"#,
            br#""\ud83d\ude00""#,
            br#""\ud800""#,
            br#""\udc00""#,
            b"1e999",
            b"-1e400",
            b"\"\xc3\x28\"",
            b"\"\xed\xa0\x80\"",
            b"\"\x7f\x01\"",
            br#""\q""#,
        ];
        let keys = prop::sample::select(vec!["id", "op", "ok", "result", "error", "params", "x"]);
        (keys, prop::sample::select(values)).prop_map(|(k, v)| [format!("{k:?}:").as_bytes(), v].concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// Exactly the frames the tree reads as a response object are
        /// responses: no frame it refuses, however it is broken.
        #[test]
        fn a_response_is_what_the_tree_reads_as_one(
            members in prop::collection::vec(member(), 0..5),
            nested in any::<bool>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let mut frame = b"{".to_vec();
            for (i, m) in members.iter().enumerate() {
                if i > 0 {
                    frame.push(b',');
                }
                if nested && i == 0 {
                    frame.extend_from_slice(b"\"result\":{");
                    frame.extend_from_slice(m);
                    frame.push(b'}');
                } else {
                    frame.extend_from_slice(m);
                }
            }
            frame.push(b'}');
            for (at, b) in flips {
                let at = at.index(frame.len());
                frame[at] = b;
            }
            let tree = crate::fuzzing::response_by_tree(&frame);
            prop_assert_eq!(is_response(&frame), tree, "frame {:?}", String::from_utf8_lossy(&frame));
        }
    }

    #[test]
    fn ids_are_read_from_a_head() {
        assert_eq!(id_from_head(br#"{"id":"u17","ok":true,"result":{"messages":[{"#), Some("u17".into()));
        assert_eq!(id_from_head(br#"{"id":"x1","ok":true}"#), None);
        assert_eq!(id_from_head(br#"{"ok":true,"result":"#), None);
        assert_eq!(id_from_head(br#"{"id":"u12"#), None);
        assert_eq!(id_from_head(br#"{"id" : "u3", "ok": true}"#), Some("u3".into()));
    }
}

/// What a machine holds on the heap whatever its clients do: its tables,
/// its decoders' and encoders' scratch, the broker's and pager's fixed
/// state. The constant a heap check adds to [`FsProxy::heap_allowance`].
#[doc(hidden)]
pub const HEAP_SLACK: u64 = 256 << 10;
/// Counted bytes may be held in vectors up to this many times their
/// length while they grow (doubling).
#[doc(hidden)]
pub const HEAP_GROWTH: u64 = 2;
/// Held per live client: its connection's state, decoder and queue.
#[doc(hidden)]
pub const HEAP_PER_CLIENT: u64 = 4 << 10;
/// Held per open handle: the table entry and its path.
#[doc(hidden)]
pub const HEAP_PER_HANDLE: u64 = 1 << 10;
/// Held per request waiting or in flight, beyond its counted bytes: its
/// record, an upstream request or effect in flight.
#[doc(hidden)]
pub const HEAP_PER_REQUEST: u64 = 1 << 10;
/// Held per virtual file, beyond its counted bytes.
#[doc(hidden)]
pub const HEAP_PER_VIRTUAL_FILE: u64 = 256;
/// Held per descriptor.
#[doc(hidden)]
pub const HEAP_PER_DESCRIPTOR: u64 = 64;

/// One limit's share of the heap a machine may hold.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapShare {
    pub limit: &'static str,
    pub bytes: u64,
    /// A limit on bytes, not on a count of items.
    pub per_byte: bool,
}

impl FsProxy {
    /// What each limit lets the machine hold on the heap now, for the
    /// harnesses that count what it really holds (the simulator's and the
    /// fuzz targets' `bounded_memory` check): what it counts against each
    /// byte limit at up to [`HEAP_GROWTH`] times, each counted item at its
    /// per-item cost, none above what the limit itself allows. `requests`:
    /// requests waiting or in flight, as the harness knows them (`u64::MAX`
    /// when it does not: the limits then bound them).
    #[doc(hidden)]
    pub fn heap_allowance(&self, requests: u64) -> Vec<HeapShare> {
        let c = &self.config;
        let u = self.usage();
        let bytes = |limit: &'static str, counted: u64, max: u64| HeapShare {
            limit,
            bytes: HEAP_GROWTH.saturating_mul(counted.min(max)),
            per_byte: true,
        };
        let items = |limit: &'static str, n: u64, max: u64, each: u64| HeapShare {
            limit,
            bytes: n.min(max).saturating_mul(each),
            per_byte: false,
        };
        let clients = u.clients as u64 + 1;
        let mut shares = vec![
            bytes("max_session_queued_bytes", u.queued_bytes, c.max_session_queued_bytes),
            // Partial frames, each under `max_frame` (from a child) or
            // `max_upstream_frame` (from above): one may cross the total.
            bytes(
                "max_buffered_bytes",
                u.buffered_bytes,
                c.max_buffered_bytes.saturating_add(c.max_frame.max(c.max_upstream_frame) as u64),
            ),
            bytes("max_virtual_bytes", u.virtual_bytes, c.max_virtual_bytes),
            items(
                "max_virtual_files",
                u.virtual_files as u64,
                c.max_virtual_files as u64,
                HEAP_PER_VIRTUAL_FILE,
            ),
            items("max_clients", u.clients as u64, c.max_clients as u64 + 1, HEAP_PER_CLIENT),
            items("max_open_handles", self.open_handles() as u64, c.max_open_handles as u64, HEAP_PER_HANDLE),
            items(
                "max_queued_requests",
                requests,
                clients.saturating_mul(c.max_queued_requests as u64 + 1),
                HEAP_PER_REQUEST,
            ),
            items("max_descriptors", u.descriptors as u64, c.max_descriptors as u64, HEAP_PER_DESCRIPTOR),
        ];
        if let (Some(p), Some(pc)) = (self.pager(), &c.pager) {
            shares.push(bytes("pager max_total_bytes", p.held_total(), pc.max_total_bytes));
        }
        if let (Some(b), Some(bs)) = (self.broker(), &c.broker) {
            shares.push(bytes("broker max_pending_bytes", b.pending_bytes(), bs.config.max_pending_bytes));
        }
        shares
    }

    /// `held` bytes on the heap against [`FsProxy::heap_allowance`] plus
    /// [`HEAP_SLACK`]; over it, what the check reports, naming the limit
    /// broken: the byte limit the machine counts most under (a buffer it
    /// does not count grows beside one it does), else the largest share.
    #[doc(hidden)]
    pub fn heap_check(&self, held: u64, requests: u64) -> Result<(), String> {
        // Every allowance is at least the slack: most steps need no more
        // (a harness checks every step, so this is its hot path).
        if held <= HEAP_SLACK {
            return Ok(());
        }
        heap_verdict(held, HEAP_SLACK, &self.heap_allowance(requests))
    }
}

/// `held` bytes on the heap against `slack` plus every share; over it,
/// what a heap check reports, naming the limit broken: the byte limit the
/// machine counts most under (a buffer it does not count grows beside one
/// it does), else the largest share. Shared by every machine's
/// `heap_check` (the FS proxy's, the VFS host's, ToolExec's).
#[doc(hidden)]
pub fn heap_verdict(held: u64, slack: u64, shares: &[HeapShare]) -> Result<(), String> {
    let allowed = shares.iter().fold(slack, |a, s| a.saturating_add(s.bytes));
    if held <= allowed {
        return Ok(());
    }
    let broken = shares
        .iter()
        .filter(|s| s.per_byte && s.bytes > 0)
        .max_by_key(|s| s.bytes)
        .or_else(|| shares.iter().max_by_key(|s| s.bytes))
        .map_or("none", |s| s.limit);
    let listed: Vec<String> =
        shares.iter().filter(|s| s.bytes > 0).map(|s| format!("{} {}", s.limit, s.bytes)).collect();
    Err(format!(
        "holds {held} bytes on the heap, {} over the {allowed} its limits allow (breaks {broken}; \
         shares: {}; slack {slack})",
        held - allowed,
        listed.join(", ")
    ))
}
