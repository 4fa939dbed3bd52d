//! The provider client: an OpenAI-compatible chat-completions call over
//! hyper, with rustls (ring) and the webpki root set for TLS — no system
//! OpenSSL, no platform verifier.
//!
//! It makes the HTTP call the broker asks for (`Output::StartProvider`) and
//! turns whatever comes back into a [`ProviderResult`], with the answer's
//! HTTP status and `Retry-After` for the broker's retries (which it makes
//! by asking again: this client never retries on its own). It keeps no timer
//! of its own: the broker gives up at the call's deadline and the session
//! then drops the task, which drops the request and its connection.

use crate::proxy::{Proxy, Tunnel};
use airlock_core::broker::openai::{parse_response, request_body, retry_after_ms};
use airlock_core::broker::{ProviderRequest, ProviderResult, Redactor};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::pin::Pin;

/// Largest response body read from a provider: a hostile or broken
/// provider cannot make airlock buffer more than this.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

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
    /// Guards the key: every result is scrubbed by the core's rules
    /// before it leaves this client (and so before a trace records it).
    redactor: Redactor,
    client: Clients,
    /// The proxy the calls go through, when the environment names one.
    proxy: Option<Proxy>,
}

type Direct = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;
type Tunnelled = Client<hyper_rustls::HttpsConnector<Tunnel>, Full<Bytes>>;

/// Straight to the provider, or through a CONNECT tunnel of the proxy the
/// environment names for its URL (`HTTPS_PROXY`/`https_proxy` for https,
/// `HTTP_PROXY`/`http_proxy` for http, `NO_PROXY` exempting hosts, as curl
/// reads them): TLS then runs end to end inside the tunnel.
enum Clients {
    Direct(Direct),
    Tunnelled(Tunnelled),
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("HttpProvider")
            .field("url", &self.url)
            .field("api_key", &self.api_key.is_some())
            .field("proxy", &self.proxy)
            .finish()
    }
}

impl HttpProvider {
    /// `base_url` without a trailing slash; `api_key` sent as a bearer
    /// token when present, and kept from every result by `redactor`.
    pub fn new(base_url: &str, api_key: Option<String>, redactor: Redactor) -> anyhow::Result<Self> {
        let url: hyper::Uri = format!("{}/chat/completions", base_url.trim_end_matches('/'))
            .parse()
            .map_err(|e| anyhow::anyhow!("broker.base_url {base_url:?}: {e}"))?;
        let proxy = Proxy::for_target(&url, |name| std::env::var(name).ok())?;
        Self::with_proxy(url, api_key, redactor, proxy)
    }

    fn with_proxy(
        url: hyper::Uri,
        api_key: Option<String>,
        redactor: Redactor,
        proxy: Option<Proxy>,
    ) -> anyhow::Result<Self> {
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
                .map(|b| b.https_or_http().enable_http1())
        };
        let client = match &proxy {
            None => Clients::Direct(Client::builder(TokioExecutor::new()).build(builder()?.build())),
            Some(p) => Clients::Tunnelled(
                Client::builder(TokioExecutor::new())
                    .build(builder()?.wrap_connector(Tunnel::new(p.clone()))),
            ),
        };
        Ok(HttpProvider { url, api_key: api_key.filter(|k| !k.is_empty()), redactor, client, proxy })
    }

    /// The proxy calls go through.
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    async fn call(&self, request: &ProviderRequest) -> ProviderResult {
        // Errors made here (hyper's, say) are scrubbed like replies.
        self.redactor.scrub_result(self.exchange(request).await)
    }

    async fn exchange(&self, request: &ProviderRequest) -> ProviderResult {
        let body = request_body(request);
        let mut req = hyper::Request::post(self.url.clone())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(key) = &self.api_key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = match req.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return error(format!("building the request: {e}")),
        };
        let sent = match &self.client {
            Clients::Direct(c) => c.request(req).await,
            Clients::Tunnelled(c) => c.request(req).await,
        };
        let resp = match sent {
            Ok(r) => r,
            Err(e) => return error(format!("request to {} failed: {}", self.url, chain(&e))),
        };
        let status = resp.status();
        // Read against the wall clock when the answer came; a header that
        // is not text counts as absent.
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after_ms(v, std::time::SystemTime::now()));
        let bytes = match Limited::new(resp.into_body(), MAX_RESPONSE_BYTES).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return error(format!("reading the response (HTTP {status}): {e}")),
        };
        parse_response(status.as_u16(), &bytes, &request.model, &self.redactor).with_retry_after(retry_after)
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
    ProviderResult::error(None, message)
}

/// An error with its sources (hyper's top-level messages say little).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_and_http_urls_build_a_client() {
        for url in ["https://api.openai.com/v1", "http://127.0.0.1:8080/v1/"] {
            let p = HttpProvider::new(url, Some("k".into()), Redactor::new()).unwrap();
            assert!(p.url.path().ends_with("/v1/chat/completions"), "{p:?}");
        }
        assert!(HttpProvider::new("http://bad host/v1", None, Redactor::new()).is_err());
    }
}
