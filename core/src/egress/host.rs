//! Host names and IP literals as a resolver reads them, normalized once so
//! that a pattern and a request compare as the same text.
//!
//! A request names its destination in text a hostile child chooses. What
//! counts is what the host's resolver and the clients would make of it:
//! `PyPI.org.` is `pypi.org`, `ｐｙｐｉ.org` (fullwidth) is `pypi.org` after
//! IDNA mapping, and `0x7f.1`, `2130706433`, `0177.0.0.1` and `127.1` are
//! all `127.0.0.1` to `inet_aton`, which glibc's `getaddrinfo` falls back
//! to. So a name is mapped (UTS 46, as browsers and the `url` crate do),
//! lowercased, its one trailing dot dropped; then, if it reads as an IPv4
//! address in any of `inet_aton`'s forms, it *is* that address. A name
//! whose last label looks numeric but is no address (`1.2.3.256`,
//! `0x1g`) is refused rather than guessed at, as the WHATWG URL standard
//! does. An IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4
//! address it maps: the socket it opens reaches that address.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest host text looked at, before any mapping (a DNS name is at
/// most 253 octets; IDNA may lengthen or shorten a little).
pub const MAX_HOST_TEXT: usize = 1024;

/// A normalized destination host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Host {
    /// An ASCII DNS name: lowercase, labels of `a-z0-9-_`, no trailing dot.
    Name(String),
    /// An IP address; an IPv4-mapped IPv6 address is held as IPv4.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// Why a host text is no host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    Empty,
    TooLong,
    /// IDNA mapping refused it (a forbidden code point, a bad label).
    Idna,
    /// A label is empty, longer than 63, or holds a character no DNS name has.
    BadLabel,
    /// The last label is a number (decimal, octal or hex) but the whole is
    /// no IPv4 address.
    NumericNotAddress,
    /// Bracketed text that is no IPv6 address, or one with a zone.
    BadIpv6,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostError::Empty => "the host is empty",
            HostError::TooLong => "the host is too long",
            HostError::Idna => "the host is not a valid internationalized name",
            HostError::BadLabel => "the host has an empty, overlong or invalid label",
            HostError::NumericNotAddress => "the host ends in a number but is not an IPv4 address",
            HostError::BadIpv6 => "the host is not a valid IPv6 address",
        })
    }
}

impl std::error::Error for HostError {}

/// An address as the checks see it: IPv4-mapped IPv6 becomes IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Read `text` (a URL's or CONNECT's host, a SOCKS domain, a pattern's
/// host) as a resolver would: an IPv6 literal in brackets (or bare, with a
/// colon), an IPv4 literal in any `inet_aton` form, or a DNS name.
pub fn parse_host(text: &str) -> Result<Host, HostError> {
    if text.is_empty() {
        return Err(HostError::Empty);
    }
    if text.len() > MAX_HOST_TEXT {
        return Err(HostError::TooLong);
    }
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadIpv6)?;
        return parse_ipv6(inner);
    }
    if text.contains(':') {
        return parse_ipv6(text);
    }
    // UTS 46 mapping, as `url` and browsers apply it: case folded,
    // fullwidth forms and other compatibility characters mapped, punycode
    // for the rest, and `xn--` labels checked to be punycode indeed.
    let mapped = idna::domain_to_ascii(text).map_err(|_| HostError::Idna)?;
    let name = match mapped.strip_suffix('.') {
        Some(rest) if !rest.is_empty() => rest,
        Some(_) => return Err(HostError::Empty),
        None => mapped.as_str(),
    };
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if ends_in_number(name) {
        return parse_ipv4_any(name).map(|a| Host::Ip(IpAddr::V4(a))).ok_or(HostError::NumericNotAddress);
    }
    if name.len() > 253 {
        return Err(HostError::TooLong);
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(HostError::BadLabel);
        }
    }
    Ok(Host::Name(name.to_owned()))
}

fn parse_ipv6(text: &str) -> Result<Host, HostError> {
    // A zone (`fe80::1%eth0`) names an interface of the host: never ours
    // to pick for a child.
    let a: Ipv6Addr = text.parse().map_err(|_| HostError::BadIpv6)?;
    Ok(Host::Ip(canonical_ip(IpAddr::V6(a))))
}

/// The WHATWG "ends in a number" test: the last label is all digits, or
/// `0x`/`0X` and hex digits.
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// One part of an `inet_aton` address: decimal, octal with a leading 0,
/// hex with `0x`. `None` when malformed or past `u32`.
fn ipv4_part(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (h, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if part.is_empty() {
        return None;
    }
    if digits.is_empty() {
        // "0x" is 0 to inet_aton and to WHATWG alike.
        return Some(0);
    }
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)? as u64;
        v = v.checked_mul(radix as u64)?.checked_add(d)?;
        if v > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(v)
}

/// An IPv4 address in any form `inet_aton` accepts: one to four parts,
/// the last filling the bytes the others leave.
pub fn parse_ipv4_any(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        values.push(ipv4_part(p)?);
    }
    let (last, init) = values.split_last()?;
    let mut addr: u64 = 0;
    for (i, v) in init.iter().enumerate() {
        if *v > 255 {
            return None;
        }
        addr |= v << (8 * (3 - i));
    }
    let room = 8 * (4 - init.len());
    if room < 64 && *last >= (1u64 << room) {
        return None;
    }
    addr |= last;
    Some(Ipv4Addr::from(u32::try_from(addr).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn every_inet_aton_form_of_loopback_is_loopback() {
        for text in [
            "127.0.0.1",
            "0x7f.1",
            "0x7F.0.0.1",
            "2130706433",
            "0177.0.0.1",
            "0177.1",
            "127.1",
            "127.0.1",
            "0x7f000001",
            "017700000001",
            "127.0.0.1.",
            "[::ffff:127.0.0.1]",
            "::ffff:7f00:1",
            "１２７.０.０.１",
        ] {
            assert_eq!(parse_host(text), Ok(ip("127.0.0.1")), "{text}");
        }
    }

    #[test]
    fn names_are_lowercased_mapped_and_lose_one_trailing_dot() {
        assert_eq!(parse_host("PyPI.org."), Ok(Host::Name("pypi.org".into())));
        assert_eq!(parse_host("ｐｙｐｉ.org"), Ok(Host::Name("pypi.org".into())));
        assert_eq!(parse_host("bücher.example"), Ok(Host::Name("xn--bcher-kva.example".into())));
        assert_eq!(parse_host("_srv.example"), Ok(Host::Name("_srv.example".into())));
        assert_eq!(parse_host("localhost"), Ok(Host::Name("localhost".into())));
    }

    #[test]
    fn malformed_hosts_are_refused() {
        assert_eq!(parse_host(""), Err(HostError::Empty));
        assert_eq!(parse_host("."), Err(HostError::Empty));
        assert_eq!(parse_host("a..b"), Err(HostError::BadLabel));
        assert_eq!(parse_host("a.b.."), Err(HostError::BadLabel));
        assert_eq!(parse_host("1.2.3.256"), Err(HostError::NumericNotAddress));
        assert_eq!(parse_host("1.2.3.4.5"), Err(HostError::NumericNotAddress));
        assert_eq!(parse_host("08.1"), Err(HostError::NumericNotAddress));
        assert_eq!(parse_host("evil.com 127.0.0.1"), Err(HostError::NumericNotAddress));
        assert_eq!(parse_host("a b.com"), Err(HostError::BadLabel));
        assert_eq!(parse_host("a%2e.com"), Err(HostError::BadLabel));
        assert_eq!(parse_host("[fe80::1%eth0]"), Err(HostError::BadIpv6));
        assert_eq!(parse_host("[::1"), Err(HostError::BadIpv6));
        assert_eq!(parse_host(&"a".repeat(64)), Err(HostError::BadLabel));
        assert_eq!(parse_host(&"a.".repeat(200)), Err(HostError::TooLong));
    }

    #[test]
    fn ipv4_parts_fill_the_bytes_they_leave() {
        assert_eq!(parse_ipv4_any("1.2.3"), Some(Ipv4Addr::new(1, 2, 0, 3)));
        assert_eq!(parse_ipv4_any("1.65535"), Some(Ipv4Addr::new(1, 0, 255, 255)));
        assert_eq!(parse_ipv4_any("1.16777216"), None);
        assert_eq!(parse_ipv4_any("4294967295"), Some(Ipv4Addr::new(255, 255, 255, 255)));
        assert_eq!(parse_ipv4_any("4294967296"), None);
        assert_eq!(parse_ipv4_any("0x"), Some(Ipv4Addr::new(0, 0, 0, 0)));
        assert_eq!(parse_ipv4_any("0x100.1"), None);
    }
}
