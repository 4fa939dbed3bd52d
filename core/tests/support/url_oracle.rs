//! The `vfs_url` fuzz target's check, shared with the corpus replay
//! (`core/tests/fuzz_corpus.rs`) and a proptest (`core/tests/vfs_url.rs`):
//! whatever URL the VFS tool host allows, two independent readings of it
//! stay under the `--allow-url` prefix that allowed it:
//!
//! - the `url` crate's (a WHATWG parser, what browsers and many clients
//!   do): same scheme, host and port, and its path, escapes of unreserved
//!   characters decoded and the rest's hex uppercased, equal to the
//!   host's normalized path;
//! - an ordinary web server's: the path the host sends, wholly
//!   percent-decoded (`%2f` and `%5c` included) and its dot segments then
//!   removed, under the prefix's path read the same way.
//!
//! And the URL the host sends is a fixed point: normalized again, it is
//! itself, and allowed by the same prefix.
//!
//! Where the counting allocator is installed (the fuzz target, the corpus
//! replay), normalizing keeps nothing on the heap but its result, and
//! holds at most [`NORMALIZE_PEAK_PER_BYTE`] times the text plus
//! [`NORMALIZE_PEAK_SLACK`] at once.

use airlock_core::heapcount::{self, Tag};
use airlock_core::vfs::url::{normalize, path_extends};
use airlock_core::vfs::{PolicyConfig, ToolPolicy};

pub const PREFIXES: &[&str] = &[
    "http://h.example/pub/",
    "http://h.example/api",
    "https://h.example:8443/a/b/",
    "http://127.0.0.1:8080/",
    "http://[::1]/x/",
];

pub fn policy() -> ToolPolicy {
    let cfg = PolicyConfig {
        project: "/p".into(),
        allow_url: PREFIXES.iter().map(|p| p.to_string()).collect(),
        ..PolicyConfig::default()
    };
    ToolPolicy::new(&cfg).expect("the oracle's prefixes are valid")
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Escapes of unreserved characters decoded, the others' hex uppercased.
fn canonical_escapes(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(h), Some(l)) =
                (b.get(i + 1).and_then(|&x| hex(x)), b.get(i + 2).and_then(|&x| hex(x)))
            {
                let v = h * 16 + l;
                if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') {
                    out.push(v as char);
                } else {
                    out.push_str(&format!("%{v:02X}"));
                }
                i += 3;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// What a server that decodes, then resolves dot segments, serves.
pub fn server_view(path: &str) -> String {
    let b = path.as_bytes();
    let mut dec = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if let (Some(h), Some(l)) =
                (b.get(i + 1).and_then(|&x| hex(x)), b.get(i + 2).and_then(|&x| hex(x)))
            {
                dec.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        dec.push(b[i]);
        i += 1;
    }
    let dec = String::from_utf8_lossy(&dec).into_owned();
    // Empty segments merged, as many servers do; a trailing `/` is lost,
    // which only makes the prefix comparison coarser.
    let mut out: Vec<&str> = Vec::new();
    for s in dec.split(['/', '\\']) {
        match s {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// Normalizing holds at most this many times the text at once: its
/// lowercased host, its decoded and re-encoded copies of the path, an
/// error quoting a part (escaped `"` and `\\` double it; a growing string
/// briefly holds two buffers). Nothing scales with the count of labels or
/// segments: a host of many dots once held a 16-byte slice per label and
/// peaked past 30 times its text; measured over the corpus, 3.1 for texts
/// past the slack…
pub const NORMALIZE_PEAK_PER_BYTE: u64 = 8;
/// …plus this.
pub const NORMALIZE_PEAK_SLACK: u64 = 4 << 10;

/// The check on one input: the URL is the input's text (invalid UTF-8 is
/// read lossily, so every input checks something).
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let normalized = || match normalize(&text) {
        Ok(u) => u.to_string(),
        Err(e) => e.to_string(),
    };
    // Measured the second time, once whatever a thread keeps for good is
    // set up; charged to a tag of its own.
    let first = normalized();
    let pure = Tag::new(heapcount::MAX_TAGS - 1);
    let (result, cost) = heapcount::cost(pure, normalized);
    assert_eq!(result, first, "{text:?}: normalized twice, two results");
    if let Some(c) = cost {
        let kept = result.capacity() as u64;
        assert_eq!(
            c.kept,
            kept,
            "{text:?}: normalizing kept {} bytes beside its result",
            c.kept.saturating_sub(kept)
        );
        let bound = NORMALIZE_PEAK_PER_BYTE * text.len() as u64 + NORMALIZE_PEAK_SLACK;
        assert!(
            c.peak <= bound,
            "bounded_memory: normalizing {} bytes peaked at {} bytes, over {bound} \
             (NORMALIZE_PEAK_PER_BYTE, NORMALIZE_PEAK_SLACK)",
            text.len(),
            c.peak
        );
    }
    drop(result);
    check_url(&policy(), &text);
}

pub fn check_url(policy: &ToolPolicy, text: &str) {
    let Ok(u) = policy.check_url(text) else { return };
    let sent = u.to_string();
    let parsed =
        url::Url::parse(text).unwrap_or_else(|e| panic!("{text:?} allowed, the url crate refuses it: {e}"));
    assert_eq!(parsed.scheme(), u.scheme, "{text:?}");
    assert_eq!(parsed.host_str(), Some(u.host.as_str()), "{text:?}");
    assert_eq!(parsed.port_or_known_default(), Some(u.port), "{text:?}");
    // The url crate keeps a segment shaped like a Windows drive letter
    // (`p:`) that a `..` follows, whatever the scheme; the URL standard
    // ("shorten a URL's path") keeps it only for `file:`, and RFC 3986
    // never. Where the url crate's path holds one, the decoding server's
    // view is the oracle alone.
    let crate_agrees = !parsed.path().split('/').any(drive_letter);
    if crate_agrees {
        assert_eq!(
            canonical_escapes(parsed.path()),
            u.path,
            "{text:?}: the url crate reads the path otherwise"
        );
    }
    assert_eq!(parsed.query().is_some(), u.query.is_some(), "{text:?}");
    let under = PREFIXES.iter().any(|p| {
        let pu = url::Url::parse(p).expect("a valid prefix");
        pu.scheme() == parsed.scheme()
            && pu.host_str() == parsed.host_str()
            && pu.port_or_known_default() == parsed.port_or_known_default()
            && (!crate_agrees
                || path_extends(&canonical_escapes(parsed.path()), &canonical_escapes(pu.path())))
            && path_extends(&server_view(&u.path), &server_view(pu.path()))
    });
    assert!(
        under,
        "{text:?} allowed as {sent:?}, outside every prefix to the url crate or a decoding server"
    );
    let again =
        normalize(&sent).unwrap_or_else(|e| panic!("{text:?} sent as {sent:?}, which is refused: {e}"));
    assert_eq!(again.to_string(), sent, "{text:?}: normalizing is not idempotent");
    assert!(policy.check_url(&sent).is_ok(), "{text:?}: the URL sent is not allowed");
}

/// A segment the url crate treats as a Windows drive letter: one ASCII
/// letter and `:` or `|`.
fn drive_letter(seg: &str) -> bool {
    let b = seg.as_bytes();
    b.len() == 2 && b[0].is_ascii_alphabetic() && matches!(b[1], b':' | b'|')
}
