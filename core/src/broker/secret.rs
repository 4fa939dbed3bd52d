//! Keeping the provider's API key from the children.
//!
//! A provider may echo the key back (an "invalid key sk-…" error, a model
//! that repeats its headers), and it may do so in any encoding JSON
//! allows: verbatim, `\u`-escaped, half escaped (`sk-\u0061bc…`), or
//! escaped once more inside a string that itself holds JSON (a tool call's
//! `arguments`), or in any other derived form. The [`Redactor`] finds the
//! key with the core's one scrubber ([`crate::scrub`]): JSON escapes after
//! any run of backslashes and percent escapes are decoded as it reads,
//! and hex, base64 (each alignment) and UTF-16 forms are searched as they
//! are. So one pass finds the key in a decoded string, in the JSON text
//! that holds it, and in JSON nested in a string, and replaces the whole
//! span with [`REDACTED`].
//!
//! The redactor is handed to the core at run time
//! (`FsProxy::set_redactor`, `openai::parse_response`) and is never
//! serialized: no config, trace or report holds the key. A trace records
//! provider results after the codec has scrubbed them, so replaying it
//! without the redactor yields the same outputs.
//!
//! What it cannot do: find a key the provider transformed in other ways
//! (reversed, encrypted, split across two JSON values). Those need a
//! provider that is actively hostile *and* knows the key.

use super::raw::RawJson;
use super::ProviderResult;
use crate::scrub::SecretSet;
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

/// Finds and replaces secrets in text a child could see. Cheap to clone;
/// its `Debug` never shows a secret.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The keys as given.
    secrets: Vec<String>,
    set: SecretSet,
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
        self.secrets.push(secret.to_owned());
        self.set = SecretSet::new(&self.secrets);
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
            let needle = s.as_bytes();
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

    /// Spans to replace, sorted and merged, each widened to whole
    /// characters (a UTF-16 form may start inside one).
    fn spans(&self, text: &str) -> Vec<Range<usize>> {
        let mut spans = self.set.spans(text.as_bytes());
        for r in &mut spans {
            while !text.is_char_boundary(r.start) {
                r.start -= 1;
            }
            while !text.is_char_boundary(r.end) {
                r.end += 1;
            }
        }
        let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
        for r in spans {
            match merged.last_mut() {
                Some(last) if r.start < last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        merged
    }

    /// Whether `text` holds a secret, in any form this redactor finds.
    pub fn reveals(&self, text: &str) -> bool {
        self.set.reveals(text.as_bytes())
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
            // Derived forms: hex, base64 at an alignment, percent escapes.
            ("hex 736b2D746573742d53656372657434320a", "hex [redacted]0a"),
            ("b64 c2stdGVzdC1TZWNyZXQ0Mg==", "b64 [redacted]g=="),
            ("b64 eHNrLXRlc3QtU2VjcmV0NDI=", "b64 eH[redacted]I="),
            ("url sk%2Dtest%2dSecret42", "url [redacted]"),
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
    }
}
