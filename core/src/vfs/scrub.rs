//! Secret scrubbing (L429-431): every `--env-allow` value of
//! [`super::MIN_SECRET_LEN`] bytes or more becomes `[REDACTED]` in
//! anything handed to the tool, in every form the core's scrubber finds
//! ([`crate::scrub`]): as it is, percent-encoded, JSON-escaped, in hex, in
//! base64 at each alignment, in UTF-16. Raw bytes are scrubbed before they
//! are base64-encoded for the tool, so an encoded copy never slips
//! through either.

use crate::scrub::SecretSet;
use serde_json::Value;
use std::borrow::Cow;

pub const REDACTED: &str = "[REDACTED]";

#[derive(Clone, Debug, Default)]
pub struct Scrubber {
    set: SecretSet,
    /// Longest first, each once.
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
        let set = SecretSet::new(&secrets);
        Scrubber { set, secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn secrets(&self) -> &[Vec<u8>] {
        &self.secrets
    }

    /// `data` with every span holding a secret, in any form, replaced by
    /// [`REDACTED`]; overlapping spans become one.
    pub fn bytes<'a>(&self, data: &'a [u8]) -> Cow<'a, [u8]> {
        self.set.replace(data, REDACTED.as_bytes())
    }

    pub fn string(&self, s: &str) -> String {
        match self.bytes(s.as_bytes()) {
            Cow::Borrowed(_) => s.to_owned(),
            // A span may start or end inside a character (a secret's
            // UTF-16 form, say); lossy conversion keeps the text UTF-8.
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

    /// Whether `data` holds a secret, in any form the scrubber finds.
    pub fn finds(&self, data: &[u8]) -> bool {
        self.set.reveals(data)
    }
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
    fn overlapping_copies_are_one_span_and_none_borrows() {
        let s = Scrubber::new(["xxxx", "pw12"], 4);
        assert_eq!(&*s.bytes(b"axxxxxxb pw12"), b"a[REDACTED]b [REDACTED]");
        assert_eq!(s.string("é pw12"), "é [REDACTED]");
        assert_eq!(s.string("é 70773132"), "é [REDACTED]");
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
            {
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
