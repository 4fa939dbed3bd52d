//! The provider client's way through an HTTP proxy: a CONNECT tunnel to
//! the proxy the environment names (`HTTPS_PROXY`/`https_proxy` for an
//! https provider, `HTTP_PROXY`/`http_proxy` for http, `NO_PROXY`/`no_proxy`
//! exempting hosts), TLS then running end to end inside it.
//!
//! hyper-util's own tunnel (`client-proxy`) needs a base64 release newer
//! than the one the lockfile holds, so this is the small part of it airlock
//! needs: one CONNECT, its status line checked, its header bounded.

use base64::Engine as _;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest CONNECT response header read from a proxy.
pub const MAX_CONNECT_RESPONSE_BYTES: usize = 8 << 10;

/// A proxy to reach the provider through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proxy {
    host: String,
    port: u16,
    /// `Proxy-Authorization` from the proxy URL's user and password.
    auth: Option<String>,
}

impl Proxy {
    /// The proxy for `target` according to `var` (the environment).
    pub fn for_target(target: &Uri, var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Proxy>> {
        let first = |names: &[&str]| names.iter().find_map(|n| var(n).filter(|v| !v.trim().is_empty()));
        let setting = match target.scheme_str() {
            Some("https") => first(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]),
            _ => first(&["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]),
        };
        let Some(setting) = setting else { return Ok(None) };
        let host = target.host().unwrap_or_default();
        if let Some(no) = first(&["NO_PROXY", "no_proxy"]) {
            if exempt(&no, host) {
                return Ok(None);
            }
        }
        Proxy::parse(setting.trim()).map(Some)
    }

    /// `http://[user:pass@]host[:port]` (scheme optional, port 80 by default).
    fn parse(setting: &str) -> anyhow::Result<Proxy> {
        let with_scheme =
            if setting.contains("://") { setting.to_owned() } else { format!("http://{setting}") };
        let uri: Uri = with_scheme.parse().map_err(|e| anyhow::anyhow!("proxy {setting:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            anyhow::bail!("proxy {setting:?}: only http:// proxies (CONNECT) are supported");
        }
        let authority = uri.authority().ok_or_else(|| anyhow::anyhow!("proxy {setting:?}: no host"))?;
        let auth = authority.as_str().rsplit_once('@').map(|(userinfo, _)| {
            let decoded: String = percent_decode(userinfo);
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(decoded))
        });
        Ok(Proxy { host: authority.host().to_owned(), port: authority.port_u16().unwrap_or(80), auth })
    }

    /// `host:port`, for messages (never the credentials).
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Whether `NO_PROXY`'s list exempts `host`: `*`, the host itself, or a
/// domain it lies under (`example.com` and `.example.com` both cover
/// `api.example.com`). Ports in entries are ignored.
fn exempt(list: &str, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    list.split(',').map(str::trim).filter(|e| !e.is_empty()).any(|entry| {
        if entry == "*" {
            return true;
        }
        let entry = entry.trim_start_matches('[');
        let entry = match entry.split_once(']') {
            Some((ip6, _)) => ip6,
            None => {
                entry.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(entry, |(h, _)| h)
            }
        };
        let entry = entry.trim_start_matches('.').to_ascii_lowercase();
        host == entry || host.ends_with(&format!(".{entry}"))
    })
}

/// A connector (for hyper-rustls to wrap) that opens a CONNECT tunnel to
/// the destination through `proxy`.
#[derive(Clone, Debug)]
pub struct Tunnel {
    proxy: Proxy,
}

impl Tunnel {
    pub fn new(proxy: Proxy) -> Self {
        Tunnel { proxy }
    }
}

impl tower_service::Service<Uri> for Tunnel {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let proxy = self.proxy.clone();
        Box::pin(async move { connect(&proxy, &dst).await.map(TokioIo::new) })
    }
}

async fn connect(proxy: &Proxy, dst: &Uri) -> io::Result<TcpStream> {
    let host = dst.host().ok_or_else(|| io::Error::other("destination has no host"))?;
    let port = dst.port_u16().unwrap_or(if dst.scheme_str() == Some("https") { 443 } else { 80 });
    let target = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut stream = TcpStream::connect((proxy.host.as_str(), proxy.port))
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("proxy {}: {e}", proxy.address())))?;
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = &proxy.auth {
        request.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    // Read byte by byte up to the blank line: nothing of the tunnelled
    // stream may be consumed here.
    let mut header = Vec::with_capacity(256);
    while !header.ends_with(b"\r\n\r\n") {
        if header.len() >= MAX_CONNECT_RESPONSE_BYTES {
            return Err(io::Error::other(format!(
                "proxy {}: CONNECT response header too large",
                proxy.address()
            )));
        }
        let byte = stream.read_u8().await.map_err(|e| {
            io::Error::new(e.kind(), format!("proxy {}: closed during CONNECT: {e}", proxy.address()))
        })?;
        header.push(byte);
    }
    let status_line =
        String::from_utf8_lossy(header.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned();
    let status = status_line.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with('2') || status.len() != 3 {
        return Err(io::Error::other(format!(
            "proxy {} refused CONNECT {target}: {status_line}",
            proxy.address()
        )));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    fn pick(target: &str, pairs: &[(&str, &str)]) -> Option<String> {
        Proxy::for_target(&target.parse().unwrap(), env(pairs)).unwrap().map(|p| p.address())
    }

    #[test]
    fn the_proxy_follows_the_scheme_and_no_proxy() {
        let vars = [
            ("HTTPS_PROXY", "http://127.0.0.1:3128"),
            ("http_proxy", "proxy.local:3129"),
            ("NO_PROXY", "internal.example, .corp:443,10.1.2.3"),
        ];
        assert_eq!(pick("https://api.openai.com/v1", &vars).as_deref(), Some("127.0.0.1:3128"));
        assert_eq!(pick("http://llm.example/v1", &vars).as_deref(), Some("proxy.local:3129"));
        assert_eq!(pick("https://internal.example/v1", &vars), None);
        assert_eq!(pick("https://api.internal.example/v1", &vars), None);
        assert_eq!(pick("https://x.corp/v1", &vars), None);
        assert_eq!(pick("http://10.1.2.3:8080/v1", &vars), None);
        assert_eq!(pick("https://notinternal.example/v1", &vars).as_deref(), Some("127.0.0.1:3128"));
        assert_eq!(
            pick("https://api.openai.com/v1", &[("NO_PROXY", "*"), ("HTTPS_PROXY", "http://p:1")]),
            None
        );
        assert_eq!(pick("https://api.openai.com/v1", &[("HTTPS_PROXY", " ")]), None);
        assert_eq!(pick("https://api.openai.com/v1", &[]), None);
    }

    #[test]
    fn credentials_become_basic_auth_and_other_schemes_are_refused() {
        let p = Proxy::parse("http://us%40er:p%3Ass@proxy:8080").unwrap();
        let expected = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("us@er:p:ss"));
        assert_eq!((p.address(), p.auth), ("proxy:8080".to_owned(), Some(expected)));
        assert!(Proxy::parse("socks5://proxy:1080").is_err());
        assert!(Proxy::parse("https://proxy:443").is_err());
    }
}
