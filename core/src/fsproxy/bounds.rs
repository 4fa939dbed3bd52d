//! Bounded resources: the limits that keep what one session holds under
//! control whatever its clients send (DESIGN.md, invariants 11 and 12),
//! and the small decisions they need.
//!
//! Every limit counts bytes as well as items: queued request bytes per
//! client and per session, partial-frame bytes of all connections, virtual
//! names and contents, and the descriptors connections may take before the
//! reserve kept for host files and provider calls.

use serde::de::IgnoredAny;
use serde::Deserialize;

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
pub fn is_response(payload: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Shape {
        op: Option<IgnoredAny>,
        ok: Option<IgnoredAny>,
        result: Option<IgnoredAny>,
        error: Option<IgnoredAny>,
    }
    // Fields are skipped, not built: a huge frame costs no tree.
    match serde_json::from_slice::<Shape>(payload) {
        Ok(s) => s.op.is_none() && (s.ok.is_some() || s.result.is_some() || s.error.is_some()),
        Err(_) => false,
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

#[cfg(test)]
mod tests {
    use super::*;

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
