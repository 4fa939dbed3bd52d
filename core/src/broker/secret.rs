//! Keeping the provider's API key from the children.
//!
//! A provider may echo the key back (an "invalid key sk-…" error, a model
//! that repeats its headers), and it may do so in any encoding JSON
//! allows: verbatim, `\u`-escaped, half escaped (`sk-\u0061bc…`), or
//! escaped once more inside a string that itself holds JSON (a tool call's
//! `arguments`). The [`Redactor`] finds the key in all of these: it reads
//! text as a stream of *units*, where a unit is a character or a JSON
//! escape preceded by any number of backslashes (`s`, `\u0073`,
//! `\\u0073`, `\/`), and matches the key against the decoded units. So one
//! pass finds the key in a decoded string, in the JSON text that holds it,
//! and in JSON nested in a string, and replaces the whole span with
//! [`REDACTED`].
//!
//! The redactor is handed to the core at run time
//! (`FsProxy::set_redactor`, `openai::parse_response`) and is never
//! serialized: no config, trace or report holds the key. A trace records
//! provider results after the codec has scrubbed them, so replaying it
//! without the redactor yields the same outputs.
//!
//! What it cannot do: find a key the provider transformed in other ways
//! (base64, reversed, split across two JSON values). Those need a
//! provider that is actively hostile *and* knows the key; the promise is
//! about the encodings a JSON reader undoes.

use super::raw::RawJson;
use super::ProviderResult;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// What every occurrence of a secret is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Secrets shorter than this are refused: replacing a short string
/// everywhere would mangle replies and protect nothing.
pub const MIN_SECRET_CHARS: usize = 8;

/// Why a secret cannot be guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretError {
    TooShort,
    /// `"`, `\` or a control character: a match could then span JSON
    /// syntax, and replacing it would break the text around it.
    UnguardableChar,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::TooShort => write!(f, "shorter than {MIN_SECRET_CHARS} characters"),
            SecretError::UnguardableChar => f.write_str("contains '\"', '\\' or a control character"),
        }
    }
}

impl std::error::Error for SecretError {}

#[derive(Clone)]
struct Secret {
    chars: Vec<char>,
    /// KMP failure function over `chars`.
    fail: Vec<usize>,
    text: String,
}

impl Secret {
    fn new(text: &str) -> Self {
        let chars: Vec<char> = text.chars().collect();
        let mut fail = vec![0; chars.len()];
        let mut k = 0;
        for i in 1..chars.len() {
            while k > 0 && chars[i] != chars[k] {
                k = fail[k - 1];
            }
            if chars[i] == chars[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Secret { chars, fail, text: text.to_owned() }
    }

    /// Spans of `text` whose decoded units spell the secret.
    fn spans(&self, text: &str, out: &mut Vec<Range<usize>>) {
        // Without a backslash every unit is a character, and the units
        // spell the secret exactly where its text occurs: a substring
        // search finds the same spans as the walk, many times faster.
        if !text.as_bytes().contains(&b'\\') {
            let n = self.text.len();
            out.extend(text.match_indices(self.text.as_str()).map(|(at, _)| at..at + n));
            return;
        }
        self.spans_by_units(text, out);
    }

    /// [`Self::spans`] unit by unit: every text.
    fn spans_by_units(&self, text: &str, out: &mut Vec<Range<usize>>) {
        let n = self.chars.len();
        // Start offsets of the last `n` units, as a ring.
        let mut starts = vec![0usize; n];
        let (mut state, mut count, mut i) = (0usize, 0usize, 0usize);
        while i < text.len() {
            let (c, end) = next_unit(text, i);
            starts[count % n] = i;
            count += 1;
            while state > 0 && self.chars[state] != c {
                state = self.fail[state - 1];
            }
            if self.chars[state] == c {
                state += 1;
            }
            if state == n {
                out.push(starts[(count - n) % n]..end);
                state = 0;
            }
            i = end;
        }
    }
}

/// The unit of `text` starting at byte `i` (a char boundary): its decoded
/// character and where it ends.
fn next_unit(text: &str, i: usize) -> (char, usize) {
    let b = text.as_bytes();
    if b[i] != b'\\' {
        let c = text[i..].chars().next().unwrap_or('\u{fffd}');
        return (c, i + c.len_utf8());
    }
    let mut j = i;
    while j < b.len() && b[j] == b'\\' {
        j += 1;
    }
    if j < b.len() {
        if b[j] == b'u' && j + 5 <= b.len() && b[j + 1..j + 5].iter().all(u8::is_ascii_hexdigit) {
            // ASCII hex digits, so the slice is on char boundaries.
            let code = u32::from_str_radix(&text[j + 1..j + 5], 16).ok().and_then(char::from_u32);
            if let Some(c) = code {
                return (c, j + 5);
            }
        }
        if b[j] == b'/' {
            return ('/', j + 1);
        }
    }
    // A run of backslashes (escaped or not) before anything else: one
    // unit that no secret contains.
    ('\\', j)
}

/// Finds and replaces secrets in text a child could see. Cheap to clone;
/// its `Debug` never shows a secret.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<Secret>,
    /// The planted bug `BrokerScrubBeforeDecodeOnly`: the old design,
    /// where the raw reply body was scrubbed as written and nothing after
    /// JSON decoding was.
    raw_only: bool,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor").field("secrets", &self.secrets.len()).finish()
    }
}

impl Redactor {
    /// A redactor guarding nothing.
    pub fn new() -> Self {
        Redactor::default()
    }

    /// A redactor guarding `secret`.
    pub fn with_secret(secret: &str) -> Result<Self, SecretError> {
        let mut r = Redactor::new();
        r.add(secret)?;
        Ok(r)
    }

    pub fn add(&mut self, secret: &str) -> Result<(), SecretError> {
        if secret.chars().count() < MIN_SECRET_CHARS {
            return Err(SecretError::TooShort);
        }
        if secret.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
            return Err(SecretError::UnguardableChar);
        }
        self.secrets.push(Secret::new(secret));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Reintroduce the old bug: scrub the raw reply body verbatim, and
    /// nothing decoded from it (for the simulator's planted-bug tests).
    #[doc(hidden)]
    pub fn planted_raw_only(mut self) -> Self {
        self.raw_only = true;
        self
    }

    /// The raw reply body, before decoding. The design scrubs decoded
    /// strings instead, so this is the identity, except under the planted
    /// bug, which replaces verbatim copies here and nowhere else.
    pub fn scrub_raw_body<'b>(&self, body: &'b [u8]) -> Cow<'b, [u8]> {
        if !self.raw_only || self.secrets.is_empty() {
            return Cow::Borrowed(body);
        }
        let mut out = body.to_vec();
        for s in &self.secrets {
            let needle = s.text.as_bytes();
            let mut i = 0;
            let mut next = Vec::with_capacity(out.len());
            while i < out.len() {
                if out[i..].starts_with(needle) {
                    next.extend_from_slice(REDACTED.as_bytes());
                    i += needle.len();
                } else {
                    next.push(out[i]);
                    i += 1;
                }
            }
            out = next;
        }
        Cow::Owned(out)
    }

    /// Spans to replace, sorted and merged.
    fn spans(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans = Vec::new();
        for s in &self.secrets {
            s.spans(text, &mut spans);
        }
        spans.sort_by_key(|r| (r.start, r.end));
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
        for r in spans {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }

    /// Whether `text` holds a secret, in any encoding this redactor reads.
    pub fn reveals(&self, text: &str) -> bool {
        if !text.as_bytes().contains(&b'\\') {
            // As in `Secret::spans`: without a backslash, the secret's
            // text itself or nothing.
            return self.secrets.iter().any(|s| text.contains(s.text.as_str()));
        }
        !self.spans(text).is_empty()
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.secrets.is_empty() || self.raw_only {
            return Cow::Borrowed(text);
        }
        let spans = self.spans(text);
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for r in spans {
            out.push_str(&text[at..r.start]);
            out.push_str(REDACTED);
            at = r.end;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    fn scrub_owned(&self, text: String) -> String {
        match self.scrub(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(s) => s,
        }
    }

    /// JSON text with every secret replaced; since no secret contains JSON
    /// syntax, a match lies inside one string literal and the text stays
    /// valid JSON.
    pub fn scrub_json(&self, raw: RawJson) -> Result<RawJson, String> {
        match self.scrub(raw.as_str()) {
            Cow::Borrowed(_) => Ok(raw),
            Cow::Owned(text) => RawJson::from_text(text),
        }
    }

    /// A provider result with every string a child could see scrubbed:
    /// the messages (every decoded string in them), the model, the error
    /// message.
    pub fn scrub_result(&self, result: ProviderResult) -> ProviderResult {
        if self.secrets.is_empty() {
            return result;
        }
        match result {
            ProviderResult::Ok { messages, usage, model } => match self.scrub_json(messages) {
                Ok(messages) => ProviderResult::Ok { messages, usage, model: self.scrub_owned(model) },
                Err(e) => ProviderResult::error(usage, format!("reply withheld: {e}")),
            },
            ProviderResult::Err { usage, message, status, retry_after_ms } => {
                ProviderResult::Err { usage, message: self.scrub_owned(message), status, retry_after_ms }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "sk-test-Secret42";

    fn r() -> Redactor {
        Redactor::with_secret(KEY).unwrap()
    }

    #[test]
    fn short_or_syntax_keys_are_refused() {
        assert_eq!(Redactor::with_secret("short").unwrap_err(), SecretError::TooShort);
        assert_eq!(Redactor::with_secret("abc\"defghi").unwrap_err(), SecretError::UnguardableChar);
        assert_eq!(Redactor::with_secret("abc\\defghi").unwrap_err(), SecretError::UnguardableChar);
        assert!(!format!("{:?}", r()).contains("Secret42"));
    }

    #[test]
    fn every_encoding_is_found_and_replaced() {
        let cases = [
            ("bad key sk-test-Secret42!", "bad key [redacted]!"),
            (r"bad key \u0073k-test-Secret42", "bad key [redacted]"),
            (r"sk-test-\u0053ecret\u00342", "[redacted]"),
            (r"sk-test-\U0053ecret42", r"sk-test-\U0053ecret42"),
            (r#"{\"k\": \"sk-test-S\\u0065cret42\"}"#, r#"{\"k\": \"[redacted]\"}"#),
            ("x sk-test-Secret42 y sk-test-Secret42", "x [redacted] y [redacted]"),
            ("sk-test-Secret4", "sk-test-Secret4"),
            ("sk-sk-test-Secret42", "sk-[redacted]"),
        ];
        for (text, want) in cases {
            assert_eq!(r().scrub(text), want, "{text}");
            assert_eq!(r().reveals(text), want != text, "{text}");
        }
    }

    #[test]
    fn the_planted_raw_only_scrub_misses_escapes() {
        let bug = r().planted_raw_only();
        assert_eq!(&bug.scrub_raw_body(b"a sk-test-Secret42")[..], b"a [redacted]");
        assert_eq!(&bug.scrub_raw_body(br"a \u0073k-test-Secret42")[..], br"a \u0073k-test-Secret42");
        assert_eq!(bug.scrub("sk-test-Secret42"), "sk-test-Secret42");
        assert_eq!(&r().scrub_raw_body(b"sk-test-Secret42")[..], b"sk-test-Secret42");
    }

    #[test]
    fn json_stays_json() {
        let raw = RawJson::from_text(
            r#"[{"content":"\u0073k-test-Secret42 and sk-test-Secret42","role":"x"}]"#.into(),
        )
        .unwrap();
        let out = r().scrub_json(raw).unwrap();
        assert_eq!(out.as_str(), r#"[{"content":"[redacted] and [redacted]","role":"x"}]"#);
    }

    proptest! {
        /// Whatever surrounds it and however its characters are escaped,
        /// the key does not survive a scrub, and the scrub never panics.
        #[test]
        fn no_encoding_survives(pre in "\\PC{0,8}", post in "\\PC{0,8}", mask in any::<u16>(), noise in "\\PC{0,40}") {
            let mut enc = String::new();
            for (i, c) in KEY.chars().enumerate() {
                if mask & (1 << (i % 16)) != 0 {
                    enc.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    enc.push(c);
                }
            }
            let text = format!("{pre}{enc}{post}");
            let out = r().scrub(&text);
            prop_assert!(!r().reveals(&out), "{text:?} -> {out:?}");
            let _ = r().scrub(&noise);
        }

        /// The substring search finds the spans the unit walk finds, on
        /// texts made of the key's pieces, repeats and overlaps.
        #[test]
        fn the_search_finds_what_the_walk_finds(parts in proptest::collection::vec(
            prop_oneof![Just(KEY.to_owned()), Just(KEY[..5].to_owned()), Just("sk-sk-test-Secret42".to_owned()), "\\PC{0,6}"],
            0..8,
        )) {
            let text: String = parts.concat();
            let secret = Secret::new(KEY);
            let (mut fast, mut walk) = (Vec::new(), Vec::new());
            secret.spans(&text, &mut fast);
            secret.spans_by_units(&text, &mut walk);
            prop_assert_eq!(fast, walk, "{:?}", text);
        }
    }
}
