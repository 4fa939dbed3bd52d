//! The `egress_parse` fuzz target's check, shared with the corpus replay
//! (`core/tests/fuzz_corpus.rs`): the proxies' request parsers and the
//! egress machine against independent readings of the same bytes.
//!
//! An input is a mode byte (even: the HTTP listener, odd: SOCKS5), a
//! split byte (the chunk size the client's bytes arrive in: 1 + b % 13),
//! then the client's bytes. Checked:
//!
//! - Whatever host and port the core reads from a request, an independent
//!   reader reads the same: the `url` crate (a WHATWG parser, what
//!   browsers and most clients follow) for an HTTP target, a plain
//!   RFC 1928 reading written here for SOCKS5 (its domain through `url`
//!   too). The core may refuse what they accept, never read another
//!   destination.
//! - A plain request's head for its origin is one well-formed HTTP/1
//!   request (httparse), in origin form, with one `Host` naming the target,
//!   `Connection: close`, and no `Proxy-*` header.
//! - The machine reaches the same outputs however the bytes are split;
//!   nothing reaches a destination unless an oracle of the patterns below
//!   (written here, not the core's) allows the host and the address; every
//!   HTTP answer before a tunnel is a complete response; after `Shutdown`
//!   nothing is open, and every `Close` has its audit record.

use airlock_core::egress::host::Host;
use airlock_core::egress::http::{self, Parsed, Request};
use airlock_core::egress::socks;
use airlock_core::egress::{Config, ConnId, Egress, Input, Listener, Output, Rules};
use airlock_core::time::Instant;
use std::net::{IpAddr, SocketAddr};

/// The patterns the machine is run with, and the oracle's reading of them.
const ALLOW: &[&str] = &["a.example", "*.b.example:443", "127.0.0.1:8080", "localhost:8080"];
const DENY: &[&str] = &["x.b.example"];
/// What the simulated resolver answers for every name.
const RESOLVED: &[&str] = &["93.184.216.34", "127.0.0.1"];

/// The oracle's own policy: exact names, `*.` suffixes, one address.
fn oracle_allows(host: &str, port: u16) -> bool {
    let denied = host == "x.b.example";
    let allowed = host == "a.example"
        || (port == 443 && host.ends_with(".b.example"))
        || (port == 8080 && (host == "127.0.0.1" || host == "localhost"));
    allowed && !denied
}

/// Whether the oracle lets a request for `host` reach `addr`: a public
/// address for any allowed name; 127.0.0.1:8080 only as named.
fn oracle_reaches(addr: SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(a) if a.is_loopback() => addr == "127.0.0.1:8080".parse().unwrap(),
        IpAddr::V4(a) => !(a.is_private() || a.is_link_local() || a.is_unspecified()),
        IpAddr::V6(_) => false,
    }
}

/// A host as the `url` crate reads it in `http://HOST/`: its text
/// (brackets for IPv6, IPv4-mapped as IPv4), one trailing dot dropped.
fn url_host(host: &str) -> Option<String> {
    let u = url::Url::parse(&format!("http://{host}/")).ok()?;
    match u.host()? {
        url::Host::Domain(d) => Some(d.strip_suffix('.').unwrap_or(d).to_owned()),
        url::Host::Ipv4(a) => Some(a.to_string()),
        url::Host::Ipv6(a) => Some(match a.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{a}]"),
        }),
    }
}

fn core_host(h: &Host) -> String {
    h.to_string()
}

/// The request line's target, read plainly (empty lines before it
/// skipped, as RFC 9112 lets a server do).
fn request_target(mut buf: &[u8]) -> Option<(String, String)> {
    while let Some(rest) = buf.strip_prefix(b"\r\n").or_else(|| buf.strip_prefix(b"\n")) {
        buf = rest;
    }
    let line_end = buf.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&buf[..line_end]).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    Some((method, target))
}

fn check_http_parse(buf: &[u8]) {
    let Parsed::Done { value, consumed } = http::parse_request(buf, 4096) else { return };
    assert!(consumed <= buf.len());
    let (method, target) = request_target(buf).expect("an accepted head has a request line");
    match &value {
        Request::Connect { host, port } => {
            assert_eq!(method, "CONNECT");
            let u = url::Url::parse(&format!("http://{target}/")).expect("url reads what the core read");
            let want = url_host(&target[..target.rfind(':').unwrap()]).expect("url reads the host");
            assert_eq!(core_host(host), want, "{target:?}");
            assert_eq!(
                u.port_or_known_default(),
                Some(*port).filter(|p| *p != 80).or(Some(80)),
                "{target:?}"
            );
        }
        Request::Forward { method: m, host, port, head } => {
            assert_eq!(&method, m);
            let u = url::Url::parse(&target).expect("url reads what the core read");
            assert_eq!(u.scheme(), "http");
            assert!(u.username().is_empty() && u.password().is_none(), "{target:?}: userinfo forwarded");
            let want = url_host(u.host_str().expect("a host")).expect("url reads the host");
            assert_eq!(core_host(host), want, "{target:?}");
            assert_eq!(u.port_or_known_default(), Some(*port), "{target:?}");
            let mut headers = [httparse::EMPTY_HEADER; 128];
            let mut req = httparse::Request::new(&mut headers);
            let n = match req.parse(head) {
                Ok(httparse::Status::Complete(n)) => n,
                other => panic!("{target:?}: the head sent on is not a request: {other:?}"),
            };
            assert_eq!(n, head.len(), "{target:?}: bytes after the head sent on");
            assert!(req.path.is_some_and(|p| p.starts_with('/')), "{target:?}: not origin form");
            let hosts: Vec<_> = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("host")).collect();
            assert_eq!(hosts.len(), 1, "{target:?}: Host headers");
            assert_eq!(hosts[0].value, http::host_header(host, *port).as_bytes());
            assert!(req.headers.iter().all(|h| !h.name.to_ascii_lowercase().starts_with("proxy-")));
            assert!(req
                .headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("connection") && h.value == b"close"));
        }
    }
}

/// RFC 1928's request, read plainly: `Some((host, port, consumed))` for a
/// whole CONNECT, `None` otherwise.
fn oracle_socks_request(b: &[u8]) -> Option<(String, u16, usize)> {
    if b.len() < 4 || b[0] != 5 || b[1] != 1 || b[2] != 0 {
        return None;
    }
    let (host, at) = match b[3] {
        1 if b.len() >= 8 => (std::net::Ipv4Addr::new(b[4], b[5], b[6], b[7]).to_string(), 8),
        3 if b.len() >= 5 && b[4] > 0 && b.len() >= 5 + b[4] as usize => {
            let end = 5 + b[4] as usize;
            // A name holding `:` is an IPv6 address written out, as a
            // resolver reads it (`getaddrinfo("::1")`); `url` wants it
            // in brackets.
            let text = std::str::from_utf8(&b[5..end]).ok()?;
            let text = if text.contains(':') && !text.starts_with('[') {
                format!("[{text}]")
            } else {
                text.to_owned()
            };
            (url_host(&text)?, end)
        }
        4 if b.len() >= 20 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[4..20]);
            (url_host(&format!("[{}]", std::net::Ipv6Addr::from(o)))?, 20)
        }
        _ => return None,
    };
    let p = b.get(at..at + 2)?;
    let port = u16::from_be_bytes([p[0], p[1]]);
    (port != 0).then_some((host, port, at + 2))
}

fn check_socks_parse(buf: &[u8]) {
    let Parsed::Done { consumed, .. } = socks::parse_greeting(buf) else { return };
    let rest = &buf[consumed..];
    if let Parsed::Done { value: (host, port), consumed } = socks::parse_request(rest) {
        let (want, want_port, want_consumed) =
            oracle_socks_request(rest).unwrap_or_else(|| panic!("{rest:02x?}: the oracle reads no request"));
        assert_eq!((core_host(&host), port, consumed), (want, want_port, want_consumed));
    }
}

/// Run the machine over `data` arriving `chunk` bytes at a time: its
/// outputs (reads left out) and whether they held the checks above.
fn run_machine(listener: Listener, data: &[u8], chunk: usize) -> Vec<Output> {
    let rules = Rules {
        allow: ALLOW.iter().map(|p| p.parse().unwrap()).collect(),
        deny: DENY.iter().map(|p| p.parse().unwrap()).collect(),
    };
    let mut config = Config::new(rules);
    config.max_head = 4096;
    let mut m = Egress::new(config);
    let conn = ConnId(7);
    let mut outs = Vec::new();
    let mut pending = vec![Input::Accepted { conn, listener }];
    let mut offset = 0;
    let mut target: Option<(String, u16)> = None;
    let mut reached: Option<SocketAddr> = None;
    let mut step = 0u64;
    while let Some(input) = pending.pop() {
        step += 1;
        m.handle(Instant::from_micros(step), input);
        while let Some(o) = m.poll_output() {
            match &o {
                Output::ReadClient { max, .. } => {
                    let end = (offset + chunk.min(*max)).min(data.len());
                    if offset < data.len() {
                        pending.push(Input::ClientBytes { conn, data: data[offset..end].to_vec() });
                        offset = end;
                    } else {
                        pending.push(Input::ClientGone { conn });
                    }
                    continue;
                }
                Output::Resolve { name, port, .. } => {
                    target = Some((name.clone(), *port));
                    let addrs = RESOLVED.iter().map(|a| a.parse().unwrap()).collect();
                    pending.push(Input::Resolved { conn, result: Ok(addrs) });
                }
                Output::Connect { addrs, .. } => {
                    assert!(!addrs.is_empty());
                    for a in addrs {
                        assert!(oracle_reaches(*a), "offered {a}");
                    }
                    reached = Some(addrs[0]);
                    pending.push(Input::Connected { conn, result: Ok(addrs[0]) });
                }
                Output::SendUpstream { .. } | Output::Relay { .. } => {
                    let addr = reached.expect("bytes for a destination before a connect");
                    assert!(oracle_reaches(addr), "{addr}");
                    if let Some((host, port)) = &target {
                        assert!(oracle_allows(host, *port), "{host}:{port} reached");
                    }
                }
                Output::Send { data: answer, .. } if listener == Listener::Http => {
                    let mut headers = [httparse::EMPTY_HEADER; 16];
                    let mut resp = httparse::Response::new(&mut headers);
                    match resp.parse(answer) {
                        Ok(httparse::Status::Complete(_)) => {}
                        other => panic!("an answer that is no response: {other:?}"),
                    }
                }
                _ => {}
            }
            outs.push(o);
        }
    }
    m.handle(Instant::from_micros(step + 1), Input::Shutdown);
    outs.extend(std::iter::from_fn(|| m.poll_output()));
    assert_eq!(m.open(), 0, "a connection outlived the session");
    let closes = outs.iter().filter(|o| matches!(o, Output::Close { .. })).count();
    let audits = outs.iter().filter(|o| matches!(o, Output::Audit { .. })).count();
    assert_eq!((closes, audits), (1, 1), "{outs:?}");
    // Durations depend on how many steps the split took.
    for o in &mut outs {
        if let Output::Audit { record } = o {
            record.duration_ms = 0;
        }
    }
    outs
}

pub fn check(data: &[u8]) {
    let (Some(&mode), Some(&split)) = (data.first(), data.get(1)) else { return };
    let payload = &data[2..];
    let listener = if mode % 2 == 0 { Listener::Http } else { Listener::Socks };
    match listener {
        Listener::Http => check_http_parse(payload),
        Listener::Socks => check_socks_parse(payload),
    }
    let chunk = 1 + split as usize % 13;
    let mut whole = run_machine(listener, payload, 4096);
    let mut split = run_machine(listener, payload, chunk);
    // Bytes behind the head are what the last read brought: a prefix of
    // what one read of everything brings, counted in `up`.
    let upstream = |outs: &mut Vec<Output>| -> Vec<u8> {
        let mut bytes = Vec::new();
        outs.retain(|o| match o {
            Output::SendUpstream { data, .. } => {
                bytes.extend_from_slice(data);
                false
            }
            _ => true,
        });
        for o in outs.iter_mut() {
            if let Output::Audit { record } = o {
                record.up = 0;
            }
        }
        bytes
    };
    let (a, b) = (upstream(&mut whole), upstream(&mut split));
    assert!(a.starts_with(&b), "split delivery sent other bytes upstream");
    assert_eq!(whole, split, "split into {chunk}-byte chunks, the machine answered otherwise");
}
