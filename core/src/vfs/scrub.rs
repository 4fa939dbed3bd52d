//! Secret scrubbing (L429-431): every `--env-allow` value of
//! [`super::MIN_SECRET_LEN`] bytes or more becomes `[REDACTED]` in
//! anything handed to the tool. Raw bytes are scrubbed before they are
//! base64-encoded, so an encoded secret never slips through.

use regex::bytes::Regex;
use serde_json::Value;
use std::borrow::Cow;

pub const REDACTED: &str = "[REDACTED]";

#[derive(Clone, Debug, Default)]
pub struct Scrubber {
    /// Longest secrets first: at a position where two match, the longer
    /// one is replaced whole.
    re: Option<Regex>,
    secrets: Vec<Vec<u8>>,
}

impl Scrubber {
    pub fn new<I, S>(secrets: I, min_len: usize) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut secrets: Vec<Vec<u8>> =
            secrets.into_iter().map(|s| s.as_ref().to_vec()).filter(|s| s.len() >= min_len).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        secrets.dedup();
        if secrets.is_empty() {
            return Scrubber::default();
        }
        let alternation: Vec<String> = secrets.iter().map(|s| escape_bytes(s)).collect();
        // Secrets are literal bytes; the pattern is built from escapes only,
        // so it always compiles unless it is absurdly large.
        let re = regex::bytes::RegexBuilder::new(&alternation.join("|"))
            .unicode(false)
            .size_limit(64 << 20)
            .build()
            .ok();
        Scrubber { re, secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn secrets(&self) -> &[Vec<u8>] {
        &self.secrets
    }

    pub fn bytes<'a>(&self, data: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.re {
            Some(re) => re.replace_all(data, REDACTED.as_bytes()),
            None if self.secrets.is_empty() => Cow::Borrowed(data),
            // A pattern too large to compile: redact by plain search.
            None => {
                let mut out = data.to_vec();
                for s in &self.secrets {
                    out = replace_plain(&out, s);
                }
                Cow::Owned(out)
            }
        }
    }

    pub fn string(&self, s: &str) -> String {
        match self.bytes(s.as_bytes()) {
            Cow::Borrowed(_) => s.to_owned(),
            // Replacing whole UTF-8 sequences with ASCII keeps UTF-8 valid
            // only if a secret never starts or ends inside a character;
            // lossy conversion covers secrets that do.
            Cow::Owned(b) => String::from_utf8_lossy(&b).into_owned(),
        }
    }

    /// Every string (and object key) of `v`.
    pub fn value(&self, v: &mut Value) {
        if self.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(b) = self.bytes(s.as_bytes()) {
                    *s = String::from_utf8_lossy(&b).into_owned();
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.value(x)),
            Value::Object(o) => {
                let entries = std::mem::take(o);
                for (k, mut x) in entries {
                    self.value(&mut x);
                    o.insert(self.string(&k), x);
                }
            }
            _ => {}
        }
    }

    /// Whether `data` holds a secret (for checkers).
    pub fn finds(&self, data: &[u8]) -> bool {
        self.secrets.iter().any(|s| data.windows(s.len()).any(|w| w == s.as_slice()))
    }
}

fn escape_bytes(s: &[u8]) -> String {
    s.iter().map(|b| format!("\\x{b:02x}")).collect()
}

fn replace_plain(data: &[u8], s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(s) {
            out.extend_from_slice(REDACTED.as_bytes());
            i += s.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn longest_first_short_ignored_bytes_and_values() {
        let s = Scrubber::new(["abcd", "abcdefgh", "xyz"], 4);
        assert_eq!(&*s.bytes(b"--abcdefgh--abcd--xyz"), b"--[REDACTED]--[REDACTED]--xyz");
        let mut v = serde_json::json!({"k abcd": ["abcd", 1, {"x": "abcdefgh"}]});
        s.value(&mut v);
        assert_eq!(v, serde_json::json!({"k [REDACTED]": ["[REDACTED]", 1, {"x": "[REDACTED]"}]}));
        assert!(Scrubber::new(["ab"], 4).is_empty());
        // Bytes that are not UTF-8 and regex metacharacters are literal.
        let s = Scrubber::new([&b"\xff.*\n"[..]], 4);
        assert_eq!(&*s.bytes(b"a\xff.*\nb.."), b"a[REDACTED]b..");
    }

    #[test]
    fn secrets_are_kept_longest_first_once_each_and_short_ones_dropped() {
        let s = Scrubber::new(["bbbb", "abc", "aaaa", "bbbb", "cccccc"], 4);
        assert_eq!(s.secrets(), [&b"cccccc"[..], b"aaaa", b"bbbb"]);
        assert!(!s.is_empty());
        assert!(Scrubber::new(Vec::<&str>::new(), 0).is_empty());
    }

    #[test]
    fn the_plain_fallback_replaces_every_occurrence_and_keeps_the_rest() {
        assert_eq!(replace_plain(b"axxbxxx", b"xx"), b"a[REDACTED]b[REDACTED]x");
        assert_eq!(replace_plain(b"", b"xx"), b"");
        assert_eq!(replace_plain(b"x", b"xx"), b"x");
        let plain = Scrubber { re: None, secrets: vec![b"secret-1".to_vec(), b"pw12".to_vec()] };
        assert_eq!(&*plain.bytes(b"[secret-1 pw12]"), b"[[REDACTED] [REDACTED]]");
        assert_eq!(plain.string("é secret-1"), "é [REDACTED]");
        let none = Scrubber::default();
        assert!(matches!(none.bytes(b"pw12"), Cow::Borrowed(b"pw12")));
    }

    proptest! {
        /// Multi-line secrets (a PEM key) among content that holds them
        /// whole, in pieces, and across line breaks: none survives, and
        /// content without one is unchanged.
        #[test]
        fn multi_line_secrets_are_redacted_whole(
            secrets in proptest::collection::vec("[a-z0-9+/=\n-]{4,30}", 1..4),
            parts in proptest::collection::vec((0..8usize, "[a-z0-9+/=\n-]{0,12}"), 0..12),
        ) {
            let s = Scrubber::new(&secrets, 4);
            let mut content = String::new();
            for (pick, filler) in &parts {
                match secrets.get(*pick) {
                    Some(secret) => content.push_str(secret),
                    None => content.push_str(filler),
                }
            }
            // The plain search a pattern too large to compile falls back
            // to keeps the same promise.
            let plain = Scrubber { re: None, secrets: s.secrets().to_vec() };
            for s in [&s, &plain] {
                let out = s.bytes(content.as_bytes());
                // `[REDACTED]` shares no byte with the alphabet: nothing can
                // survive, not even across a replacement.
                prop_assert!(!s.finds(&out), "{content:?} -> {:?}", String::from_utf8_lossy(&out));
                if !s.finds(content.as_bytes()) {
                    prop_assert_eq!(&*out, content.as_bytes());
                }
            }
        }

        /// The fuzz target's reference check, on any bytes.
        #[test]
        fn scrubber_matches_its_reference(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            crate::vfs::fuzzing::scrubber(&data);
        }

        #[test]
        fn no_secret_survives(secrets in proptest::collection::vec("[ab]{4,6}", 1..4), data in "[ab]{0,40}") {
            let s = Scrubber::new(&secrets, 4);
            let out = s.bytes(data.as_bytes());
            // `[REDACTED]` holds neither a nor b, so no secret can be
            // formed across a replacement.
            prop_assert!(!s.finds(&out));
        }
    }
}
