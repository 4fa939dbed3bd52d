//! The OpenAI-compatible chat-completions wire: the request body the
//! provider is sent and how its reply becomes a [`ProviderResult`]. Pure,
//! so what counts as a malformed reply — and what a failed one is charged —
//! is decided once, here, for the shell and anything that drives the core.

use super::raw::{RawJson, ReadLimits};
use super::secret::Redactor;
use super::{ProviderRequest, ProviderResult, Usage};
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::fmt;

/// How much of a non-JSON error body is quoted in the error message.
pub const ERROR_SNIPPET_CHARS: usize = 200;
/// Longest provider error message passed on, in characters.
pub const MAX_ERROR_MESSAGE_CHARS: usize = 4096;
/// Choices read from one reply; a chat completion asks for one.
pub const MAX_CHOICES: usize = 128;
/// Largest `usage` or `error` object read, in bytes of JSON: both are a
/// handful of fields, and they are the only parts parsed into a tree.
pub const MAX_SMALL_OBJECT_BYTES: usize = 64 << 10;

/// A provider answer's `Retry-After` (RFC 9110 §10.2.3) as a delay in
/// milliseconds from `now`, the wall-clock time the answer arrived (the
/// caller reads the clock; this only compares): delay-seconds (digits
/// only; too many for a `u64` saturate) or an HTTP-date (one already past
/// is no delay). Anything else — negative, fractional, garbage — is `None`,
/// as if the header were absent.
pub fn retry_after_ms(value: &str, now: std::time::SystemTime) -> Option<u64> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(secs.saturating_mul(1_000));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let ahead = at.duration_since(now).unwrap_or_default();
    Some(u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX))
}

fn error(message: String) -> ProviderResult {
    ProviderResult::error(None, message)
}

/// The chat-completions request, as JSON text: `{model, messages,
/// max_tokens | max_completion_tokens (the model's field), temperature?,
/// tools?, top_p?, stop?, seed?, response_format?, tool_choice?, n?,
/// user?}`. The messages, tools and options are spliced in as held. The
/// child's `metadata` stays with airlock: the OpenAI API accepts
/// `metadata` only with `store: true`, and other compatible servers
/// refuse unknown fields.
pub fn request_body(request: &ProviderRequest) -> String {
    let mut head = Map::new();
    head.insert("model".into(), request.model.clone().into());
    head.insert(request.max_tokens_field.as_str().into(), request.max_tokens.into());
    if let Some(t) = request.temperature {
        head.insert("temperature".into(), json!(t));
    }
    let head = Value::Object(head).to_string();
    let head = head.strip_suffix('}').unwrap_or(&head);
    let mut body = String::with_capacity(head.len() + request.prompt_bytes() as usize + 32);
    body.push_str(head);
    body.push_str(",\"messages\":");
    body.push_str(request.messages.as_str());
    if let Some(tools) = &request.tools {
        body.push_str(",\"tools\":");
        body.push_str(tools.as_str());
    }
    // A non-empty object held as compact text: its members go in as they are.
    if let Some(inner) =
        request.options.as_ref().and_then(|o| o.as_str().strip_prefix('{')?.strip_suffix('}'))
    {
        if !inner.is_empty() {
            body.push(',');
            body.push_str(inner);
        }
    }
    body.push('}');
    body
}

/// The top of a reply. Only what is used is kept: unknown fields are
/// skipped without being built, the messages are borrowed as text.
#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(default, borrow, deserialize_with = "choices")]
    choices: Option<Vec<Option<&'a RawValue>>>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
}

/// `choices`: each one's `message`, at most [`MAX_CHOICES`] of them.
fn choices<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Option<&'de RawValue>>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Vec<Option<&'de RawValue>>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of choices")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(c) = seq.next_element::<Choice<'de>>()? {
                if out.len() == MAX_CHOICES {
                    return Err(de::Error::custom(format!("more than {MAX_CHOICES} choices")));
                }
                out.push(c.message);
            }
            Ok(Some(out))
        }
        // Anything else is "no choices array", as before.
        fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(V)
}

/// A small JSON value parsed into a tree, or `None` when it is larger
/// than [`MAX_SMALL_OBJECT_BYTES`].
fn small(raw: Option<&RawValue>) -> Option<Value> {
    raw.filter(|r| r.get().len() <= MAX_SMALL_OBJECT_BYTES).and_then(|r| serde_json::from_str(r.get()).ok())
}

fn clip(mut s: String) -> String {
    if let Some((i, _)) = s.char_indices().nth(MAX_ERROR_MESSAGE_CHARS) {
        s.truncate(i);
        s.push('…');
    }
    s
}

/// [`parse_response_with`] under the default [`ReadLimits`].
pub fn parse_response(status: u16, body: &[u8], asked_model: &str, redactor: &Redactor) -> ProviderResult {
    parse_response_with(status, body, asked_model, redactor, ReadLimits::default())
}

/// Read a response: `choices[*].message` are the messages, `usage` is read
/// with [`Usage::from_openai`], `model` is the provider's (or the one asked
/// for). A non-2xx status is an error with the body's `error.message` and
/// any usage it reports; a body that is not the expected JSON is an error.
///
/// Nothing is built as a tree but the small `usage` and `error` objects:
/// the messages are re-encoded as text within `limits`, so what a reply
/// costs is about its size whatever its shape. Every string a child can
/// see — each decoded string of the messages (keys too), the model, the
/// error message — goes through `redactor`, and the result is checked by
/// it once more as a whole.
pub fn parse_response_with(
    status: u16,
    body: &[u8],
    asked_model: &str,
    redactor: &Redactor,
    limits: ReadLimits,
) -> ProviderResult {
    let body = redactor.scrub_raw_body(body);
    redactor.scrub_result(read(status, &body, asked_model, redactor, limits))
}

fn read(
    status: u16,
    body: &[u8],
    asked_model: &str,
    redactor: &Redactor,
    limits: ReadLimits,
) -> ProviderResult {
    let parsed: Result<Reply<'_>, _> = serde_json::from_slice(body);
    if !(200..300).contains(&status) {
        let (detail, usage) = match &parsed {
            Ok(r) => {
                let error = small(r.error);
                let msg = error
                    .as_ref()
                    .and_then(|e| e.pointer("/message").and_then(Value::as_str).or_else(|| e.as_str()))
                    .map(str::to_string)
                    .or_else(|| small(r.message).and_then(|m| m.as_str().map(str::to_string)))
                    .unwrap_or_else(|| snippet(body));
                (msg, small(r.usage).and_then(|u| Usage::from_openai(&u).ok()))
            }
            Err(_) => (snippet(body), None),
        };
        let detail = redactor.scrub(&detail).into_owned();
        return ProviderResult::Err {
            usage,
            message: clip(format!("HTTP {status}: {detail}")),
            status: Some(status),
            retry_after_ms: None,
        };
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match parsed {
            Err(e) => error(format!("malformed response: {e}")),
            Ok(_) => error("malformed response: not a JSON object".into()),
        };
    }
    // Error texts may quote the body; the caller scrubs them with the rest.
    let reply = match parsed {
        Ok(r) => r,
        Err(e) => return error(format!("malformed response: {e}")),
    };
    let usage = match reply.usage {
        None => None,
        Some(u) if u.get() == "null" => None,
        Some(u) => match small(Some(u)) {
            Some(v) => match Usage::from_openai(&v) {
                Ok(u) => Some(u),
                Err(e) => return error(format!("malformed response: {e}")),
            },
            None => return error("malformed response: usage is not a small JSON object".into()),
        },
    };
    let Some(choices) = reply.choices else {
        return ProviderResult::error(usage, "malformed response: no choices array");
    };
    let mut text = String::from("[");
    let mut room = limits;
    for (i, m) in choices.iter().enumerate() {
        match m {
            Some(m) if m.get().starts_with('{') => {
                match RawJson::read_counted(m.get(), room, Some(redactor)) {
                    Ok((raw, used)) => {
                        room.max_values = room.max_values.saturating_sub(used);
                        if i > 0 {
                            text.push(',');
                        }
                        text.push_str(raw.as_str());
                    }
                    Err(e) => {
                        return ProviderResult::error(
                            usage,
                            format!("malformed response: choices[{i}].message: {e}"),
                        )
                    }
                }
            }
            _ => {
                return ProviderResult::error(
                    usage,
                    format!("malformed response: choices[{i}] has no message object"),
                )
            }
        }
    }
    text.push(']');
    let messages = match RawJson::from_text(text) {
        Ok(m) => m,
        Err(e) => return ProviderResult::error(usage, format!("malformed response: {e}")),
    };
    let model = small(reply.model)
        .and_then(|m| m.as_str().map(str::to_string))
        .unwrap_or_else(|| asked_model.to_string());
    let model = redactor.scrub(&model).into_owned();
    ProviderResult::Ok { messages, usage, model }
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".into();
    }
    let mut s: String = text.chars().take(ERROR_SNIPPET_CHARS).collect();
    if text.chars().count() > ERROR_SNIPPET_CHARS {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req() -> ProviderRequest {
        ProviderRequest {
            model: "m".into(),
            messages: RawJson::from_value(&json!([{"role": "user", "content": "hi"}])),
            max_tokens: 7,
            temperature: Some(0.5),
            tools: None,
            metadata: Some(RawJson::from_value(&json!({"k": "v"}))),
            options: None,
            max_tokens_field: Default::default(),
            media_parts: 0,
        }
    }

    /// The body for an o-series model with every pass-through parameter,
    /// byte for byte: what a real server parses.
    #[test]
    fn body_with_every_parameter_for_a_max_completion_tokens_model() {
        let params = json!({
            "messages": [{"role": "user", "content": "hi"}],
            "model": "o4-mini",
            "max_completion_tokens": 9,
            "temperature": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "auto",
            "top_p": 0.5,
            "stop": ["\n\n", "END"],
            "seed": -3,
            "response_format": {"type": "json_object"},
            "n": 1,
            "user": "u-1",
        });
        let Value::Object(params) = params else { unreachable!() };
        let p = crate::broker::wire::parse_llmcmd(&params).expect("valid params");
        let catalog = crate::broker::PricingCatalog::builtin();
        let weights = catalog.get("o4-mini").expect("o4-mini is priced");
        let request = ProviderRequest {
            model: "o4-mini".into(),
            messages: p.request.messages,
            max_tokens: p.request.max_tokens.unwrap_or(0),
            temperature: p.request.temperature,
            tools: p.request.tools,
            metadata: None,
            options: p.request.options,
            max_tokens_field: weights.max_tokens_field,
            media_parts: 0,
        };
        insta::assert_snapshot!(request_body(&request));
    }
    #[test]
    fn body_has_the_openai_fields_and_not_metadata() {
        let b: Value = serde_json::from_str(&request_body(&req())).unwrap();
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "temperature": 0.5})
        );
    }

    #[test]
    fn success_is_read() {
        let body = br#"{"model":"m-2024","choices":[{"index":0,"message":{"role":"assistant","content":"yo"}}],
            "usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        match parse_response(200, body, "m", &Redactor::new()) {
            ProviderResult::Ok { messages, usage, model } => {
                assert_eq!(messages.to_value(), json!([{"role": "assistant", "content": "yo"}]));
                assert_eq!(model, "m-2024");
                let u = usage.unwrap();
                assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (10, 4, 3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_drops_the_rest() {
        use std::time::{Duration, UNIX_EPOCH};
        // Sun, 06 Nov 1994 08:49:37 GMT
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(retry_after_ms("0", now), Some(0));
        assert_eq!(retry_after_ms(" 2 ", now), Some(2_000));
        assert_eq!(retry_after_ms("99999999999999999999999", now), Some(u64::MAX));
        assert_eq!(retry_after_ms("Sun, 06 Nov 1994 08:49:40 GMT", now), Some(3_000));
        assert_eq!(retry_after_ms("Sunday, 06-Nov-94 08:49:38 GMT", now), Some(1_000));
        assert_eq!(retry_after_ms("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(0), "a date past is no delay");
        for bad in ["", "-1", "1.5", "+3", "soon", "0x10", "Sun, 06 Nov 1994 25:00:00 GMT"] {
            assert_eq!(retry_after_ms(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn errors_carry_status_message_and_usage() {
        let body = br#"{"error":{"message":"rate limited","type":"x"},"usage":{"prompt_tokens":5,"completion_tokens":0}}"#;
        match parse_response(429, body, "m", &Redactor::new()) {
            ProviderResult::Err { usage, message, status, retry_after_ms } => {
                assert_eq!(message, "HTTP 429: rate limited");
                assert_eq!((status, retry_after_ms), (Some(429), None));
                assert_eq!(usage.unwrap().prompt_tokens, 5);
            }
            other => panic!("{other:?}"),
        }
        match parse_response(502, b"<html>bad gateway</html>", "m", &Redactor::new()) {
            ProviderResult::Err { usage: None, message, status: Some(502), .. } => {
                assert_eq!(message, "HTTP 502: <html>bad gateway</html>")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            &b"not json"[..],
            b"[1]",
            b"{}",
            br#"{"choices":[{"nope":1}]}"#,
            br#"{"choices":[],"usage":"x"}"#,
        ] {
            assert!(
                matches!(parse_response(200, body, "m", &Redactor::new()), ProviderResult::Err { .. }),
                "{body:?}"
            );
        }
    }

    const KEY: &str = "sk-live-0123456789abcdef";

    fn key() -> Redactor {
        Redactor::with_secret(KEY).unwrap()
    }

    /// Every string of a result, decoded, and its error message.
    fn visible(r: &ProviderResult) -> String {
        match r {
            ProviderResult::Ok { messages, model, .. } => {
                format!("{} {} {model}", messages.as_str(), messages.to_value())
            }
            ProviderResult::Err { message, .. } => message.clone(),
        }
    }

    #[test]
    fn the_key_never_survives_a_reply_in_any_encoding() {
        let esc: String = KEY.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        let half = "sk-live-\\u0030123456789abcdef";
        let bodies = [
            (200, format!(r#"{{"choices":[{{"message":{{"role":"assistant","content":"{KEY}"}}}}]}}"#)),
            (200, format!(r#"{{"choices":[{{"message":{{"role":"assistant","content":"{esc}"}}}}]}}"#)),
            (200, format!(r#"{{"choices":[{{"message":{{"role":"assistant","content":"x{half}y"}}}}]}}"#)),
            (
                200,
                format!(r#"{{"model":"{esc}","choices":[{{"message":{{"{esc}":1,"role":"assistant"}}}}]}}"#),
            ),
            (
                200,
                format!(
                    r#"{{"choices":[{{"message":{{"role":"assistant","tool_calls":[{{"function":{{"arguments":"{{\"k\":\"{}\"}}"}}}}]}}}}]}}"#,
                    esc.replace('\\', "\\\\")
                ),
            ),
            (401, format!(r#"{{"error":{{"message":"invalid key {esc}"}}}}"#)),
            (401, format!("Incorrect API key provided: {KEY}")),
            (200, format!(r#"{{"choices":[{{"message":{{"role":"assistant"}}}}],"usage":"{esc}"}}"#)),
        ];
        for (status, body) in bodies {
            let r = parse_response(status, body.as_bytes(), "m", &key());
            let seen = visible(&r);
            assert!(!key().reveals(&seen) && !seen.contains(KEY), "{body} -> {seen}");
            // The same reply without the redactor shows the key (the test is not vacuous).
            let bare = visible(&parse_response(status, body.as_bytes(), "m", &Redactor::new()));
            assert!(key().reveals(&bare), "{body} -> {bare}");
        }
    }

    #[test]
    fn a_many_valued_reply_is_refused_by_count_and_never_built() {
        let many = format!(
            r#"{{"choices":[{{"message":{{"role":"assistant","content":[{}0]}}}}]}}"#,
            "0,".repeat(5000)
        );
        let limits = ReadLimits { max_values: 1000, max_depth: 8 };
        match parse_response_with(200, many.as_bytes(), "m", &Redactor::new(), limits) {
            ProviderResult::Err { message, .. } => assert!(message.contains("more than 1000"), "{message}"),
            other => panic!("{other:?}"),
        }
        let choices = format!(r#"{{"choices":[{}{{}}]}}"#, "{},".repeat(MAX_CHOICES));
        match parse_response(200, choices.as_bytes(), "m", &Redactor::new()) {
            ProviderResult::Err { message, .. } => assert!(message.contains("choices"), "{message}"),
            other => panic!("{other:?}"),
        }
        // Unknown fields of any size are skipped.
        let skipped = format!(
            r#"{{"junk":[{}0],"choices":[{{"message":{{"role":"assistant"}}}}]}}"#,
            "[0],".repeat(5000)
        );
        assert!(matches!(
            parse_response_with(200, skipped.as_bytes(), "m", &Redactor::new(), limits),
            ProviderResult::Ok { .. }
        ));
    }

    proptest! {
        /// Whatever a provider sends, reading it never panics.
        #[test]
        fn any_reply_is_read_without_panic(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_response(status, &body, "m", &Redactor::new());
        }
    }
}
