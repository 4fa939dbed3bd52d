//! `http.get` / `http.post` effects: one request with hyper over rustls,
//! redirects not followed (hyper's client never follows them), the body
//! read frame by frame and abandoned at `max_body` bytes. The deadline is
//! the core's (`--op-timeout`): the shell drops this future when the core
//! cancels the effect, which closes the connection.
//!
//! The network goes by the egress core's rules, as `airlock run`'s proxies
//! do (`airlock_core::egress::Rules`, from the tool's policy): the core
//! checked the URL's host and port; the connector ([`Guarded`]) resolves
//! the name itself (or takes `--resolve`'s answer), checks every address
//! before connecting and the peer actually connected to after, so a name
//! that resolves to a private address reaches it only when a pattern names
//! that address, and DNS rebinding gets nothing. Each request is one line
//! of `--audit` (`op: egress`, `proto: tool_http`), those the core refused
//! before any connection too ([`audit_refusal`]).

use crate::audit::AuditWriter;
use crate::provider::chain;
use airlock_core::egress::{parse_host, Host as NetHost, Rule, Rules};
use airlock_core::vfs::{Header, HttpMethod, HttpRequest, HttpResponse, OpError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// How long one address may take to answer a connect (as the egress
/// proxies allow).
pub const CONNECT_ATTEMPT: Duration = crate::egress::service::CONNECT_ATTEMPT;

/// The network policy of `http.*`: the rules and `--resolve`'s answers.
#[derive(Clone, Debug, Default)]
pub struct Net {
    pub rules: Arc<Rules>,
    pub hosts: Arc<BTreeMap<String, Vec<IpAddr>>>,
}

pub struct HttpClient {
    net: Net,
    audit: Option<AuditWriter>,
}

/// A connection refused by a rule: the request fails as denied, naming it.
#[derive(Debug)]
struct Refused {
    host: String,
    port: u16,
    rule: Rule,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "connecting to {}:{} refused: {}", self.host, self.port, self.rule)
    }
}

impl std::error::Error for Refused {}

/// What the connector did, for the audit line.
#[derive(Debug, Default)]
struct Seen {
    addr: Option<SocketAddr>,
    rule: Option<String>,
}

/// The connector: this request's one TCP connection, made under the rules.
#[derive(Clone)]
struct Guarded {
    net: Net,
    seen: Arc<Mutex<Seen>>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<hyper::Uri> for Guarded {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: hyper::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.connect(uri).await })
    }
}

impl Guarded {
    fn note(&self, f: impl FnOnce(&mut Seen)) {
        f(&mut self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    fn refuse(&self, host: &str, port: u16, rule: Rule) -> BoxError {
        self.note(|s| s.rule = Some(rule.to_string()));
        Box::new(Refused { host: host.to_owned(), port, rule })
    }

    async fn connect(self, uri: hyper::Uri) -> Result<TokioIo<TcpStream>, BoxError> {
        let text = uri.host().ok_or("the URL has no host")?;
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        let bare = text.trim_start_matches('[').trim_end_matches(']');
        let host = parse_host(bare).map_err(|e| format!("host {text:?}: {e}"))?;
        // The core checked the URL; once more here, on the host the
        // connection is made for, so nothing reaches the network unchecked.
        if let Err(rule) = self.net.rules.check_request(&host, port) {
            return Err(self.refuse(text, port, rule));
        }
        let ips: Vec<IpAddr> = match &host {
            NetHost::Ip(ip) => vec![*ip],
            NetHost::Name(name) => match self.net.hosts.get(name) {
                Some(given) => given.clone(),
                None => {
                    let mut ips = Vec::new();
                    for a in tokio::net::lookup_host((name.as_str(), port))
                        .await
                        .map_err(|e| format!("resolving {name}: {e}"))?
                    {
                        if !ips.contains(&a.ip()) {
                            ips.push(a.ip());
                        }
                    }
                    ips
                }
            },
        };
        let mut refused = None;
        let mut failed = None;
        for ip in ips {
            if let Err(rule) = self.net.rules.check_address(ip, port) {
                refused.get_or_insert(rule);
                continue;
            }
            match tokio::time::timeout(CONNECT_ATTEMPT, TcpStream::connect((ip, port))).await {
                Ok(Ok(s)) => {
                    // The address actually connected to decides.
                    let peer = s.peer_addr()?;
                    if let Err(rule) = self.net.rules.check_address(peer.ip(), peer.port()) {
                        refused.get_or_insert(rule);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    self.note(|seen| seen.addr = Some(peer));
                    return Ok(TokioIo::new(s));
                }
                Ok(Err(e)) => failed = Some(format!("{ip}: {e}")),
                Err(_) => failed = Some(format!("{ip}: no answer in {} s", CONNECT_ATTEMPT.as_secs())),
            }
        }
        if let Some(rule) = refused {
            return Err(self.refuse(text, port, rule));
        }
        let why = failed.unwrap_or_else(|| "no address".into());
        self.note(|s| s.rule = Some(Rule::Unreachable { reason: why.clone() }.to_string()));
        Err(format!("connecting to {text}:{port}: {why}").into())
    }
}

/// One request's audit line: the egress proxies' fields.
#[derive(serde::Serialize)]
struct Audited<'a> {
    proto: &'static str,
    method: &'static str,
    url: &'a str,
    host: Option<String>,
    port: Option<u16>,
    addr: Option<SocketAddr>,
    allowed: bool,
    rule: String,
    /// The response's status.
    answer: Option<u16>,
    /// Request body bytes sent, response body bytes read.
    up: u64,
    down: u64,
    duration_ms: u64,
}

/// The audit line of a request the policy refused before any connection
/// (the core's `take_net_refusals`).
pub fn audit_refusal(audit: &AuditWriter, r: &airlock_core::vfs::NetRefusal) {
    let line = Audited {
        proto: "tool_http",
        method: if r.method == "http.post" { "POST" } else { "GET" },
        url: &r.url,
        host: r.host.clone(),
        port: r.port,
        addr: None,
        allowed: false,
        rule: r.rule.clone(),
        answer: None,
        up: 0,
        down: 0,
        duration_ms: 0,
    };
    audit.clone().egress(&line);
}

/// The refusal found in a client error's causes, if a rule refused it.
fn refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refused>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

impl HttpClient {
    pub fn new(net: Net, audit: Option<AuditWriter>) -> anyhow::Result<Self> {
        Ok(HttpClient { net, audit })
    }

    pub async fn run(&self, req: HttpRequest) -> Result<HttpResponse, OpError> {
        let started = std::time::Instant::now();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let up = req.body.len() as u64;
        let method = match req.method {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
        };
        let url = req.url.clone();
        let result = self.send(req, seen.clone()).await;
        if let Some(audit) = &self.audit {
            let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            let uri: Option<hyper::Uri> = url.parse().ok();
            let port = uri.as_ref().and_then(|u| {
                u.port_u16().or(match u.scheme_str() {
                    Some("https") => Some(443),
                    Some("http") => Some(80),
                    _ => None,
                })
            });
            let allowed = seen.addr.is_some();
            let rule = match (&seen.rule, &result) {
                (Some(r), _) => r.clone(),
                (None, _) if allowed => self.allowing(&url, port),
                (None, Err(e)) => Rule::Unreachable { reason: e.message.clone() }.to_string(),
                (None, Ok(_)) => String::new(),
            };
            let line = Audited {
                proto: "tool_http",
                method,
                url: &url,
                host: uri.as_ref().and_then(|u| u.host().map(str::to_owned)),
                port,
                addr: seen.addr,
                allowed,
                rule,
                answer: result.as_ref().ok().map(|r| r.status),
                up: if allowed { up } else { 0 },
                down: result.as_ref().map(|r| r.body.len() as u64).unwrap_or(0),
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            };
            audit.clone().egress(&line);
        }
        result
    }

    /// The allow rule a request that reached its host went by.
    fn allowing(&self, url: &str, port: Option<u16>) -> String {
        let uri: Option<hyper::Uri> = url.parse().ok();
        let host =
            uri.as_ref().and_then(|u| u.host()).map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        match (host.and_then(|h| parse_host(h).ok()), port) {
            (Some(h), Some(p)) => match self.net.rules.check_request(&h, p) {
                Ok(rule) | Err(rule) => rule.to_string(),
            },
            _ => String::new(),
        }
    }

    async fn send(&self, req: HttpRequest, seen: Arc<Mutex<Seen>>) -> Result<HttpResponse, OpError> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| OpError::io(format!("TLS: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(Guarded { net: self.net.clone(), seen });
        // A client of this request's own, without an idle pool: a kept
        // connection would outlive the effect that opened it, and the
        // connector reports this request's connection alone.
        let client: Client<_, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(https);
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
        let resp = client.request(request).await.map_err(|e| match refusal(&e) {
            Some(r) => OpError::denied(format!("url {:?} denied: {r}", req.url)),
            None => OpError::io(format!("request to {} failed: {}", req.url, chain(&e))),
        })?;
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
