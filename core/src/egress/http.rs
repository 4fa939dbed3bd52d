//! The HTTP proxy's request head: `CONNECT host:port` (a tunnel, for TLS)
//! or a plain request in absolute form (`GET http://host/path`), read from
//! a bounded buffer (split at any byte, pipelined with what follows), and
//! the head sent on to the origin for the latter.
//!
//! A plain request is forwarded once: its head is rewritten into origin
//! form with `Host` set to the target, the hop-by-hop headers dropped
//! (`Connection` and what it names, `Proxy-*`, `Keep-Alive`, `TE`,
//! `Trailer`, `Upgrade`) and `Connection: close` added; everything after
//! the head goes to that origin as it comes. A second request pipelined
//! behind the first therefore reaches only the first's origin (which the
//! policy allowed), never a host of its own choosing.

use super::host::{parse_host, Host, HostError};
use std::fmt;

/// The most header lines a request head may have.
pub const MAX_HEADERS: usize = 100;

/// A request head, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `CONNECT host:port`: a tunnel.
    Connect { host: Host, port: u16 },
    /// A plain `http://` request: `head` is what the origin is sent.
    Forward { method: String, host: Host, port: u16, head: Vec<u8> },
}

impl Request {
    pub fn target(&self) -> (&Host, u16) {
        match self {
            Request::Connect { host, port } | Request::Forward { host, port, .. } => (host, *port),
        }
    }
}

/// Why a head is refused (answered 400, or 431 for [`HeadError::TooLarge`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// No complete head within the limit.
    TooLarge {
        limit: usize,
    },
    /// More header lines than [`MAX_HEADERS`].
    TooManyHeaders,
    /// Not HTTP/1.x as httparse reads it (the reason).
    Malformed(String),
    /// A target in origin form (`GET /path`): this is a proxy.
    OriginForm,
    /// `https://` in absolute form: a client must use CONNECT for TLS.
    HttpsAbsolute,
    /// A scheme other than `http`.
    Scheme(String),
    /// Credentials in the target (`http://user@host/`).
    Userinfo,
    BadHost(HostError),
    BadPort,
    /// A CONNECT target that is not `host:port`.
    BadAuthority,
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::TooLarge { limit } => write!(f, "the request head is larger than {limit} bytes"),
            HeadError::TooManyHeaders => write!(f, "the request has more than {MAX_HEADERS} header lines"),
            HeadError::Malformed(why) => write!(f, "not an HTTP/1 request ({why})"),
            HeadError::OriginForm => f.write_str(
                "a request in origin form: this is a proxy; send `CONNECT host:port` or an absolute \
                 `http://` URL (set HTTP_PROXY/HTTPS_PROXY)",
            ),
            HeadError::HttpsAbsolute => {
                f.write_str("an https:// URL in a plain request: use CONNECT for TLS (HTTPS_PROXY)")
            }
            HeadError::Scheme(s) => {
                write!(f, "the scheme {s:?} is not proxied (http only; CONNECT for the rest)")
            }
            HeadError::Userinfo => f.write_str("credentials in the request target are not forwarded"),
            HeadError::BadHost(e) => write!(f, "{e}"),
            HeadError::BadPort => f.write_str("the port is not a number from 1 to 65535"),
            HeadError::BadAuthority => f.write_str("a CONNECT target must be host:port"),
        }
    }
}

/// What a buffer holds so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<T, E> {
    /// A head not yet whole: read more.
    Partial,
    /// A whole message of `consumed` bytes; what follows is the client's
    /// next bytes.
    Done {
        value: T,
        consumed: usize,
    },
    Error(E),
}

/// Hop-by-hop headers, never forwarded (compared ignoring case).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Whether `buf` may hold a complete head: the blank line that ends one.
/// Cheap, so a head arriving a byte at a time is parsed once, not once per
/// byte.
pub fn may_be_complete(buf: &[u8]) -> bool {
    memchr::memmem::find(buf, b"\n\r\n").is_some() || memchr::memmem::find(buf, b"\n\n").is_some()
}

/// Read the request head at the start of `buf`, which holds at most
/// `max_head` bytes.
pub fn parse_request(buf: &[u8], max_head: usize) -> Parsed<Request, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let consumed = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= max_head => n,
        Ok(_) if buf.len() >= max_head => return Parsed::Error(HeadError::TooLarge { limit: max_head }),
        Ok(httparse::Status::Complete(_)) => return Parsed::Error(HeadError::TooLarge { limit: max_head }),
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => return Parsed::Error(HeadError::TooManyHeaders),
        Err(e) => return Parsed::Error(HeadError::Malformed(e.to_string())),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::Error(HeadError::Malformed("incomplete request line".into()));
    };
    let result = if method == "CONNECT" {
        connect_target(target).map(|(host, port)| Request::Connect { host, port })
    } else {
        absolute_target(target).map(|(host, port, path)| {
            let head = forward_head(method, &path, version, &host, port, req.headers);
            Request::Forward { method: method.to_owned(), host, port, head }
        })
    };
    match result {
        Ok(value) => Parsed::Done { value, consumed },
        Err(e) => Parsed::Error(e),
    }
}

fn parse_port(text: &str) -> Result<u16, HeadError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HeadError::BadPort);
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(HeadError::BadPort),
        Ok(p) => Ok(p),
    }
}

/// `host:port`, `[v6]:port`; `port` may be omitted only where `default`.
fn authority(text: &str, default: Option<u16>) -> Result<(Host, u16), HeadError> {
    if text.contains('@') {
        return Err(HeadError::Userinfo);
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(HeadError::BadAuthority)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(HeadError::BadAuthority)?),
        };
        (&text[..inner.len() + 2], port)
    } else {
        match text.rsplit_once(':') {
            // An IPv6 address in an authority is bracketed (RFC 3986):
            // `a::f2:8080` has no one reading, so it gets none.
            Some((h, _)) if h.contains(':') => return Err(HeadError::BadAuthority),
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let port = match (port, default) {
        (Some(""), Some(d)) | (None, Some(d)) => d,
        (Some(p), _) => parse_port(p)?,
        (None, None) => return Err(HeadError::BadAuthority),
    };
    let host = parse_host(host).map_err(HeadError::BadHost)?;
    Ok((host, port))
}

fn connect_target(target: &str) -> Result<(Host, u16), HeadError> {
    if target.contains('/') || target.contains('?') || target.contains('#') {
        return Err(HeadError::BadAuthority);
    }
    authority(target, None)
}

/// `http://authority[/path][?query]`: the host, port and origin-form path.
fn absolute_target(target: &str) -> Result<(Host, u16, String), HeadError> {
    let Some((scheme, rest)) = target.split_once("://") else {
        if target.starts_with('/') || target == "*" {
            return Err(HeadError::OriginForm);
        }
        return Err(HeadError::Malformed(format!("request target {:?}", truncated(target))));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(HeadError::HttpsAbsolute);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HeadError::Scheme(truncated(scheme)));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, tail) = rest.split_at(end);
    let (host, port) = authority(auth, Some(80))?;
    let tail = tail.split('#').next().unwrap_or("");
    let path = match tail.chars().next() {
        None => "/".to_owned(),
        Some('?') => format!("/{tail}"),
        Some(_) => tail.to_owned(),
    };
    Ok((host, port, path))
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `Host`'s value for `host`:`port` (the port only when not 80).
pub fn host_header(host: &Host, port: u16) -> String {
    if port == 80 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

fn forward_head(
    method: &str,
    path: &str,
    version: u8,
    host: &Host,
    port: u16,
    headers: &[httparse::Header<'_>],
) -> Vec<u8> {
    // Headers the client's Connection header names are hop-by-hop too.
    let named: Vec<String> = headers
        .iter()
        .filter(|h| {
            h.name.eq_ignore_ascii_case("connection") || h.name.eq_ignore_ascii_case("proxy-connection")
        })
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(if version == 0 { b" HTTP/1.0\r\n" } else { b" HTTP/1.1\r\n" });
    out.extend_from_slice(b"Host: ");
    out.extend_from_slice(host_header(host, port).as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in headers {
        let lower = h.name.to_ascii_lowercase();
        // Every `Proxy-*` header is for this hop alone, whatever its name.
        if HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower) || lower.starts_with("proxy-") {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The reason phrase for the statuses the proxy answers with.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "Connection established",
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// The answer to a CONNECT once the tunnel is up.
pub const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// A refusal: `status`, a header naming the rule and the host for
/// programs, and the same line as the body for people and agents. Every
/// value is airlock's own text (normalized hosts, patterns, fixed
/// messages): no byte of the client's reaches a header. `Connection:
/// close`: the connection ends after it.
pub fn refusal(status: u16, target: Option<&str>, rule: &str, body: &str) -> Vec<u8> {
    let clean =
        |s: &str| -> String { s.chars().map(|c| if c.is_control() || c == '"' { ' ' } else { c }).collect() };
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    head.push_str("Content-Type: text/plain; charset=utf-8\r\n");
    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    head.push_str("Connection: close\r\n");
    head.push_str("X-Proxy-Error: blocked-by-airlock\r\n");
    match target {
        Some(t) => {
            head.push_str(&format!("X-Airlock-Refused: host={}; rule=\"{}\"\r\n", clean(t), clean(rule)))
        }
        None => head.push_str(&format!("X-Airlock-Refused: rule=\"{}\"\r\n", clean(rule))),
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(buf: &[u8]) -> (Request, usize) {
        match parse_request(buf, 16 << 10) {
            Parsed::Done { value, consumed } => (value, consumed),
            other => panic!("{other:?}"),
        }
    }

    fn err(buf: &[u8]) -> HeadError {
        match parse_request(buf, 16 << 10) {
            Parsed::Error(e) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connect_reads_host_and_port_and_leaves_what_follows() {
        let (r, n) = done(b"CONNECT PyPI.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n\x16\x03\x01");
        assert_eq!(r, Request::Connect { host: Host::Name("pypi.org".into()), port: 443 });
        assert_eq!(n, 53);
        let (r, _) = done(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n");
        assert_eq!(r, Request::Connect { host: Host::Ip("::1".parse().unwrap()), port: 8443 });
        assert_eq!(err(b"CONNECT pypi.org HTTP/1.1\r\n\r\n"), HeadError::BadAuthority);
        assert_eq!(err(b"CONNECT a@pypi.org:443 HTTP/1.1\r\n\r\n"), HeadError::Userinfo);
        assert_eq!(err(b"CONNECT pypi.org:0 HTTP/1.1\r\n\r\n"), HeadError::BadPort);
        // An IPv6 address unbracketed: no reading is the one meant.
        assert_eq!(err(b"CONNECT a::f2:8080 HTTP/1.1\r\n\r\n"), HeadError::BadAuthority);
        assert_eq!(err(b"GET http://::1:80/ HTTP/1.1\r\n\r\n"), HeadError::BadAuthority);
    }

    #[test]
    fn a_plain_request_is_rewritten_for_its_origin() {
        let (r, _) = done(
            b"GET http://Example.com:8080/a?b=1#frag HTTP/1.1\r\nHost: evil.com\r\nUser-Agent: t\r\n\
              Proxy-Connection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\nProxy-Authorization: x\r\n\r\n",
        );
        let Request::Forward { method, host, port, head } = r else { panic!() };
        assert_eq!((method.as_str(), port), ("GET", 8080));
        assert_eq!(host, Host::Name("example.com".into()));
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );
        let (r, _) = done(b"GET http://h.example?q HTTP/1.0\r\n\r\n");
        let Request::Forward { head, port, .. } = r else { panic!() };
        assert_eq!(port, 80);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /?q HTTP/1.0\r\nHost: h.example\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn what_a_proxy_cannot_serve_is_refused_with_a_reason() {
        assert_eq!(err(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), HeadError::OriginForm);
        assert_eq!(err(b"GET https://a/ HTTP/1.1\r\n\r\n"), HeadError::HttpsAbsolute);
        assert_eq!(err(b"GET ftp://a/ HTTP/1.1\r\n\r\n"), HeadError::Scheme("ftp".into()));
        assert_eq!(err(b"GET http://u:p@a/ HTTP/1.1\r\n\r\n"), HeadError::Userinfo);
        assert_eq!(err(b"GET http://a.com@evil.com/ HTTP/1.1\r\n\r\n"), HeadError::Userinfo);
        assert!(matches!(
            err(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
            HeadError::Malformed(_)
        ));
        assert!(matches!(err(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), HeadError::Malformed(_)));
    }

    #[test]
    fn a_head_past_the_limit_is_too_large() {
        let mut big = b"GET http://a/ HTTP/1.1\r\n".to_vec();
        big.extend(std::iter::repeat_n(b"X-A: b\r\n".as_slice(), 200).flatten());
        assert_eq!(parse_request(&big[..100], 100), Parsed::Error(HeadError::TooLarge { limit: 100 }));
        assert_eq!(parse_request(&big[..99], 100), Parsed::Partial);
        big.extend_from_slice(b"\r\n");
        assert_eq!(parse_request(&big, 1 << 20), Parsed::Error(HeadError::TooManyHeaders));
    }
}
