//! `http.get` / `http.post` effects: one request with hyper over rustls,
//! redirects not followed (hyper's client never follows them), the body
//! read frame by frame and abandoned at `max_body` bytes. The deadline is
//! the core's (`--op-timeout`): the shell drops this future when the core
//! cancels the effect, which closes the connection.

use crate::provider::chain;
use airlock_core::vfs::{Header, HttpMethod, HttpRequest, HttpResponse, OpError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub struct HttpClient {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpClient {
    pub fn new() -> anyhow::Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
            .https_or_http()
            .enable_http1()
            .build();
        // No idle pool: each request is the tool's own, and a kept
        // connection would outlive the effect that opened it.
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(https);
        Ok(HttpClient { client })
    }

    pub async fn run(&self, req: HttpRequest) -> Result<HttpResponse, OpError> {
        let method = match req.method {
            HttpMethod::Get => hyper::Method::GET,
            HttpMethod::Post => hyper::Method::POST,
        };
        let mut builder = hyper::Request::builder().method(method).uri(req.url.as_str());
        for h in &req.headers {
            let name = hyper::header::HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|e| OpError::invalid(format!("header name {:?}: {e}", h.name)))?;
            let value = hyper::header::HeaderValue::from_bytes(&h.value).map_err(|_| {
                OpError::invalid(format!("header {:?}: the value is not a valid header value", h.name))
            })?;
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(req.body)))
            .map_err(|e| OpError::invalid(format!("building the request to {}: {e}", req.url)))?;
        let resp = self
            .client
            .request(request)
            .await
            .map_err(|e| OpError::io(format!("request to {} failed: {}", req.url, chain(&e))))?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| Header { name: n.as_str().to_owned(), value: v.as_bytes().to_vec() })
            .collect();
        let mut body_stream = resp.into_body();
        let mut body = Vec::new();
        while let Some(frame) = body_stream.frame().await {
            let frame = frame
                .map_err(|e| OpError::io(format!("reading the response of {}: {}", req.url, chain(&e))))?;
            if let Some(data) = frame.data_ref() {
                if body.len() + data.len() > req.max_body {
                    return Err(OpError::too_large("the response body", req.max_body));
                }
                body.extend_from_slice(data);
            }
        }
        Ok(HttpResponse { status, headers, body })
    }
}
