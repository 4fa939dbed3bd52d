//! The OpenAI-compatible chat-completions wire: the request body the
//! provider is sent and how its reply becomes a [`ProviderResult`]. Pure,
//! so what counts as a malformed reply — and what a failed one is charged —
//! is decided once, here, for the shell and anything that drives the core.

use super::{ProviderRequest, ProviderResult, Usage};
use serde_json::{json, Map, Value};

/// How much of a non-JSON error body is quoted in the error message.
pub const ERROR_SNIPPET_CHARS: usize = 200;

fn error(message: String) -> ProviderResult {
    ProviderResult::Err { usage: None, message }
}

/// The chat-completions request: `{model, messages, max_tokens,
/// temperature?, tools?}`. The child's `metadata` stays with airlock: the
/// OpenAI API accepts `metadata` only with `store: true`, and other
/// compatible servers refuse unknown fields.
pub fn request_body(request: &ProviderRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), request.model.clone().into());
    body.insert("messages".into(), Value::Array(request.messages.clone()));
    body.insert("max_tokens".into(), request.max_tokens.into());
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(tools) = &request.tools {
        body.insert("tools".into(), Value::Array(tools.clone()));
    }
    Value::Object(body)
}

/// Read a response: `choices[*].message` are the messages, `usage` is read
/// with [`Usage::from_openai`], `model` is the provider's (or the one asked
/// for). A non-2xx status is an error with the body's `error.message` and
/// any usage it reports; a body that is not the expected JSON is an error.
pub fn parse_response(status: u16, body: &[u8], asked_model: &str) -> ProviderResult {
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    if !(200..300).contains(&status) {
        let (detail, usage) = match &parsed {
            Ok(v) => {
                let msg = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .or_else(|| v.get("error").and_then(Value::as_str))
                    .or_else(|| v.get("message").and_then(Value::as_str))
                    .map(str::to_string)
                    .unwrap_or_else(|| snippet(body));
                (msg, v.get("usage").and_then(|u| Usage::from_openai(u).ok()))
            }
            Err(_) => (snippet(body), None),
        };
        return ProviderResult::Err { usage, message: format!("HTTP {status}: {detail}") };
    }
    let v = match parsed {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return error("malformed response: not a JSON object".into()),
        Err(e) => return error(format!("malformed response: {e}")),
    };
    let usage = match v.get("usage") {
        None | Some(Value::Null) => None,
        Some(u) => match Usage::from_openai(u) {
            Ok(u) => Some(u),
            Err(e) => return error(format!("malformed response: {e}")),
        },
    };
    let Some(choices) = v.get("choices").and_then(Value::as_array) else {
        return ProviderResult::Err { usage, message: "malformed response: no choices array".into() };
    };
    let mut messages = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        match c.get("message") {
            Some(m @ Value::Object(_)) => messages.push(m.clone()),
            _ => {
                return ProviderResult::Err {
                    usage,
                    message: format!("malformed response: choices[{i}] has no message object"),
                }
            }
        }
    }
    let model = v.get("model").and_then(Value::as_str).unwrap_or(asked_model).to_string();
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
            messages: vec![json!({"role": "user", "content": "hi"})],
            max_tokens: 7,
            temperature: Some(0.5),
            tools: None,
            metadata: Some(Map::from_iter([("k".to_string(), json!("v"))])),
        }
    }
    #[test]
    fn body_has_the_openai_fields_and_not_metadata() {
        let b = request_body(&req());
        assert_eq!(
            b,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "temperature": 0.5})
        );
    }

    #[test]
    fn success_is_read() {
        let body = br#"{"model":"m-2024","choices":[{"index":0,"message":{"role":"assistant","content":"yo"}}],
            "usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        match parse_response(200, body, "m") {
            ProviderResult::Ok { messages, usage, model } => {
                assert_eq!(messages, vec![json!({"role": "assistant", "content": "yo"})]);
                assert_eq!(model, "m-2024");
                let u = usage.unwrap();
                assert_eq!((u.prompt_tokens, u.cached_tokens, u.completion_tokens), (10, 4, 3));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_carry_status_message_and_usage() {
        let body = br#"{"error":{"message":"rate limited","type":"x"},"usage":{"prompt_tokens":5,"completion_tokens":0}}"#;
        match parse_response(429, body, "m") {
            ProviderResult::Err { usage, message } => {
                assert_eq!(message, "HTTP 429: rate limited");
                assert_eq!(usage.unwrap().prompt_tokens, 5);
            }
            other => panic!("{other:?}"),
        }
        match parse_response(502, b"<html>bad gateway</html>", "m") {
            ProviderResult::Err { usage: None, message } => {
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
            assert!(matches!(parse_response(200, body, "m"), ProviderResult::Err { .. }), "{body:?}");
        }
    }

    proptest! {
        /// Whatever a provider sends, reading it never panics.
        #[test]
        fn any_reply_is_read_without_panic(status in 100u16..600, body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_response(status, &body, "m");
        }
    }
}
