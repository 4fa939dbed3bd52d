//! The provider client: an OpenAI-compatible chat-completions call over
//! hyper, with rustls (ring) and the webpki root set for TLS — no system
//! OpenSSL, no platform verifier.
//!
//! It makes the HTTP call the broker asks for (`Output::StartProvider`) and
//! turns whatever comes back into a [`ProviderResult`]. It keeps no timer
//! of its own: the broker gives up at the call's deadline and the session
//! then drops the task, which drops the request and its connection.

use airlock_core::broker::{ProviderRequest, ProviderResult, Usage};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::pin::Pin;

/// Largest response body read from a provider: a hostile or broken
/// provider cannot make airlock buffer more than this.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// How much of a non-JSON error body is quoted in the error message.
const ERROR_SNIPPET_CHARS: usize = 200;
/// Keys shorter than this are not scrubbed from replies (replacing a
/// one-letter "key" everywhere would mangle the text and protect nothing).
const MIN_SCRUBBED_KEY_LEN: usize = 8;

/// Something that answers provider calls: the HTTP client in production,
/// a scripted one in tests.
pub trait Provider: Send + Sync + 'static {
    fn complete(&self, request: ProviderRequest)
        -> Pin<Box<dyn Future<Output = ProviderResult> + Send + '_>>;
}

/// An OpenAI-compatible endpoint: `POST {base_url}/chat/completions`.
pub struct HttpProvider {
    url: hyper::Uri,
    api_key: Option<String>,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("HttpProvider")
            .field("url", &self.url)
            .field("api_key", &self.api_key.is_some())
            .finish()
    }
}

impl HttpProvider {
    /// `base_url` without a trailing slash; `api_key` sent as a bearer
    /// token when present.
    pub fn new(base_url: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        let url: hyper::Uri = format!("{}/chat/completions", base_url.trim_end_matches('/'))
            .parse()
            .map_err(|e| anyhow::anyhow!("broker.base_url {base_url:?}: {e}"))?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(HttpProvider { url, api_key: api_key.filter(|k| !k.is_empty()), client })
    }

    async fn call(&self, request: &ProviderRequest) -> ProviderResult {
        let body = request_body(request);
        let mut req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(key) = &self.api_key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = match req.body(Full::new(Bytes::from(body.to_string()))) {
            Ok(r) => r,
            Err(e) => return error(format!("building the request: {e}")),
        };
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) => return error(format!("request to {} failed: {}", self.url, chain(&e))),
        };
        let status = resp.status();
        let bytes = match Limited::new(resp.into_body(), MAX_RESPONSE_BYTES).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return error(format!("reading the response (HTTP {status}): {e}")),
        };
        let bytes = scrub(bytes, self.api_key.as_deref());
        parse_response(status.as_u16(), &bytes, &request.model)
    }
}

impl Provider for HttpProvider {
    fn complete(
        &self,
        request: ProviderRequest,
    ) -> Pin<Box<dyn Future<Output = ProviderResult> + Send + '_>> {
        Box::pin(async move { self.call(&request).await })
    }
}

fn error(message: String) -> ProviderResult {
    ProviderResult::Err { usage: None, message }
}

/// An error with its sources (hyper's top-level messages say little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// A provider that echoes the key back (an "invalid key sk-…" message, say)
/// must not hand it to a child: every occurrence is replaced before the
/// body is read.
fn scrub(body: Bytes, key: Option<&str>) -> Bytes {
    let Some(key) = key.filter(|k| k.len() >= MIN_SCRUBBED_KEY_LEN) else { return body };
    let needle = key.as_bytes();
    if !body.windows(needle.len()).any(|w| w == needle) {
        return body;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i..].starts_with(needle) {
            out.extend_from_slice(b"[redacted]");
            i += needle.len();
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    Bytes::from(out)
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
    fn https_and_http_urls_build_a_client() {
        for url in ["https://api.openai.com/v1", "http://127.0.0.1:8080/v1/"] {
            let p = HttpProvider::new(url, Some("k".into())).unwrap();
            assert!(p.url.path().ends_with("/v1/chat/completions"), "{p:?}");
        }
        assert!(HttpProvider::new("http://bad host/v1", None).is_err());
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

    #[test]
    fn the_key_is_scrubbed_from_replies() {
        let key = "sk-secret-123456";
        let out = scrub(Bytes::from_static(b"bad key sk-secret-123456, sk-secret-123456!"), Some(key));
        assert_eq!(&out[..], b"bad key [redacted], [redacted]!");
        let short = scrub(Bytes::from_static(b"abc"), Some("a"));
        assert_eq!(&short[..], b"abc");
    }
}
