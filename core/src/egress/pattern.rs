//! `--allow-host` and `--deny-host` patterns: a name (`pypi.org`), a
//! wildcard (`*.githubusercontent.com`: every name beneath, not the name
//! itself), `*` (every host), an IP address or a CIDR range, each
//! optionally with `:PORT` (`[v6]:PORT` for IPv6). Hosts are normalized as
//! requests are ([`super::host::parse_host`]), so `PyPI.org.` and
//! `pypi.org` are one pattern and `0x7f.1` is `127.0.0.1`.

use super::host::{canonical_ip, parse_host, Host};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// What a pattern says of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// `*`: any name or address (an address still needs naming if special).
    Any,
    /// One name.
    Name(String),
    /// `*.SUFFIX`: every name strictly beneath `SUFFIX`.
    Below(String),
    /// One address.
    Ip(IpAddr),
    /// A CIDR range.
    Net(IpNet),
}

/// One pattern, as normalized; `Display` writes it back in that form,
/// which is also how it travels in configs and traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    pub host: HostPattern,
    /// `None`: every port.
    pub port: Option<u16>,
}

/// Why a pattern's text is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternError {
    Empty,
    BadPort(String),
    BadHost(String),
    BadWildcard,
    BadPrefix(String),
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PatternError::Empty => f.write_str("an empty pattern"),
            PatternError::BadPort(p) => write!(f, "{p:?} is not a port (1-65535)"),
            PatternError::BadHost(why) => write!(f, "{why}"),
            PatternError::BadWildcard => f.write_str(
                "a wildcard is `*` alone or `*.` before a name (`*.example.com`), never inside one",
            ),
            PatternError::BadPrefix(p) => write!(f, "{p:?} is not a prefix length for this address"),
        }
    }
}

impl std::error::Error for PatternError {}

fn parse_port(text: &str) -> Result<u16, PatternError> {
    let bad = || PatternError::BadPort(text.to_owned());
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.len() > 5 {
        return Err(bad());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(p) => Ok(p),
    }
}

/// An address or range: `ADDR` or `ADDR/LEN`.
fn parse_ip_part(text: &str) -> Result<HostPattern, PatternError> {
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (text, None),
    };
    let host = parse_host(addr).map_err(|e| PatternError::BadHost(format!("{addr:?}: {e}")))?;
    let Host::Ip(ip) = host else {
        return Err(PatternError::BadPrefix(text.to_owned()));
    };
    let Some(len) = len else { return Ok(HostPattern::Ip(ip)) };
    let bad = || PatternError::BadPrefix(len.to_owned());
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let mut len: u8 = len.parse().map_err(|_| bad())?;
    // `::ffff:10.0.0.0/104` is the IPv4 range it maps.
    if addr.contains(':') && ip.is_ipv4() {
        len = len.checked_sub(96).ok_or_else(bad)?;
    }
    let net = IpNet::new(ip, len).map_err(|_| bad())?;
    Ok(HostPattern::Net(net.trunc()))
}

fn parse_host_part(text: &str) -> Result<HostPattern, PatternError> {
    if text == "*" {
        return Ok(HostPattern::Any);
    }
    if let Some(rest) = text.strip_prefix("*.") {
        if rest.contains('*') {
            return Err(PatternError::BadWildcard);
        }
        return match parse_host(rest) {
            Ok(Host::Name(n)) => Ok(HostPattern::Below(n)),
            Ok(Host::Ip(_)) => Err(PatternError::BadWildcard),
            Err(e) => Err(PatternError::BadHost(format!("{rest:?}: {e}"))),
        };
    }
    if text.contains('*') {
        return Err(PatternError::BadWildcard);
    }
    if text.contains('/') {
        return parse_ip_part(text);
    }
    match parse_host(text) {
        Ok(Host::Name(n)) => Ok(HostPattern::Name(n)),
        Ok(Host::Ip(ip)) => Ok(HostPattern::Ip(ip)),
        Err(e) => Err(PatternError::BadHost(format!("{text:?}: {e}"))),
    }
}

impl FromStr for Pattern {
    type Err = PatternError;

    fn from_str(text: &str) -> Result<Self, PatternError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(PatternError::Empty);
        }
        if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| PatternError::BadHost(format!("{text:?}: a `[` without its `]`")))?;
            let port = match after {
                "" => None,
                p => {
                    Some(parse_port(p.strip_prefix(':').ok_or_else(|| PatternError::BadPort(p.to_owned()))?)?)
                }
            };
            let host = parse_ip_part(inner)?;
            if matches!(host, HostPattern::Ip(IpAddr::V4(_))) && !inner.contains(':') {
                return Err(PatternError::BadHost(format!("{text:?}: brackets hold IPv6 addresses")));
            }
            return Ok(Pattern { host, port });
        }
        // Two colons or more: a bare IPv6 address or range, no port.
        if text.matches(':').count() >= 2 {
            return Ok(Pattern { host: parse_ip_part(text)?, port: None });
        }
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(parse_port(p)?)),
            None => (text, None),
        };
        Ok(Pattern { host: parse_host_part(host)?, port })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(&self.host, HostPattern::Ip(IpAddr::V6(_)) | HostPattern::Net(IpNet::V6(_)));
        let host = match &self.host {
            HostPattern::Any => "*".to_owned(),
            HostPattern::Name(n) => n.clone(),
            HostPattern::Below(n) => format!("*.{n}"),
            HostPattern::Ip(ip) => ip.to_string(),
            HostPattern::Net(net) => net.to_string(),
        };
        match (self.port, v6) {
            (None, _) => f.write_str(&host),
            (Some(p), true) => write!(f, "[{host}]:{p}"),
            (Some(p), false) => write!(f, "{host}:{p}"),
        }
    }
}

impl Serialize for Pattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Pattern {
    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether a request for `host`:`port` is this pattern's: a name
    /// pattern matches names, an address or range matches IP literals,
    /// `*` both.
    pub fn matches_request(&self, host: &Host, port: u16) -> bool {
        if !self.port_matches(port) {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Name(p), Host::Name(n)) => p == n,
            (HostPattern::Below(p), Host::Name(n)) => is_below(n, p),
            (HostPattern::Ip(p), Host::Ip(ip)) => canonical_ip(*p) == canonical_ip(*ip),
            (HostPattern::Net(net), Host::Ip(ip)) => net.contains(&canonical_ip(*ip)),
            _ => false,
        }
    }

    /// Whether this pattern names the address `ip`:`port` itself: only an
    /// address or a range does (a name or `*` never does).
    pub fn names_address(&self, ip: IpAddr, port: u16) -> bool {
        if !self.port_matches(port) {
            return false;
        }
        match &self.host {
            HostPattern::Ip(p) => canonical_ip(*p) == canonical_ip(ip),
            HostPattern::Net(net) => net.contains(&canonical_ip(ip)),
            _ => false,
        }
    }

    /// Whether the pattern could match a loopback destination (a name the
    /// host maps to loopback, or a loopback address).
    pub fn mentions_loopback(&self) -> bool {
        match &self.host {
            HostPattern::Any => false,
            HostPattern::Name(n) => n == "localhost" || n.ends_with(".localhost"),
            HostPattern::Below(n) => n == "localhost",
            HostPattern::Ip(ip) => canonical_ip(*ip).is_loopback(),
            HostPattern::Net(net) => match net {
                IpNet::V4(n) => n.contains(&std::net::Ipv4Addr::LOCALHOST) || n.network().is_loopback(),
                IpNet::V6(n) => n.contains(&std::net::Ipv6Addr::LOCALHOST),
            },
        }
    }
}

/// `name` lies strictly beneath `suffix` (`a.b.c` beneath `b.c`).
pub fn is_below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn patterns_read_back_normalized() {
        for (text, shown) in [
            ("pypi.org", "pypi.org"),
            ("PyPI.org.:443", "pypi.org:443"),
            ("*.GitHubUserContent.com", "*.githubusercontent.com"),
            ("*", "*"),
            ("*:443", "*:443"),
            ("0x7f.1", "127.0.0.1"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("10.1.2.3/8", "10.0.0.0/8"),
            ("::1", "::1"),
            ("[::1]:8080", "[::1]:8080"),
            ("fd00::/8", "fd00::/8"),
            ("[fd00::/8]:443", "[fd00::/8]:443"),
            ("[::ffff:10.0.0.0/104]", "10.0.0.0/8"),
            ("localhost:8080", "localhost:8080"),
        ] {
            assert_eq!(p(text).to_string(), shown, "{text}");
        }
    }

    #[test]
    fn bad_patterns_say_why() {
        for text in [
            "",
            "a.*.com",
            "*foo.com",
            "pypi.org:0",
            "pypi.org:70000",
            "pypi.org:x",
            "10.0.0.0/33",
            "a.com/8",
            "*.1.2.3.4",
            "[1.2.3.4]",
            "[::1",
            "[::1]8080",
            "::1/200",
        ] {
            assert!(text.parse::<Pattern>().is_err(), "{text:?} was accepted");
        }
    }

    #[test]
    fn names_match_exactly_or_strictly_beneath_a_wildcard() {
        assert!(p("pypi.org").matches_request(&name("pypi.org"), 443));
        assert!(!p("pypi.org").matches_request(&name("files.pypi.org"), 443));
        assert!(p("*.pypi.org").matches_request(&name("files.pypi.org"), 443));
        assert!(p("*.pypi.org").matches_request(&name("a.b.pypi.org"), 443));
        assert!(!p("*.pypi.org").matches_request(&name("pypi.org"), 443));
        assert!(!p("*.pypi.org").matches_request(&name("evilpypi.org"), 443));
        assert!(!p("pypi.org:443").matches_request(&name("pypi.org"), 80));
        assert!(p("*").matches_request(&name("anything.example"), 1));
        assert!(!p("pypi.org").matches_request(&Host::Ip("1.2.3.4".parse().unwrap()), 443));
    }

    #[test]
    fn addresses_and_ranges_match_ip_literals_and_name_addresses() {
        let lo = Host::Ip("127.0.0.1".parse().unwrap());
        assert!(p("127.0.0.1").matches_request(&lo, 8080));
        assert!(p("127.0.0.0/8").matches_request(&lo, 8080));
        assert!(p("::ffff:127.0.0.1").matches_request(&lo, 8080));
        assert!(!p("127.0.0.1").matches_request(&name("localhost"), 8080));
        assert!(p("127.0.0.1").names_address("127.0.0.1".parse().unwrap(), 8080));
        assert!(p("127.0.0.1").names_address("::ffff:127.0.0.1".parse().unwrap(), 8080));
        assert!(!p("127.0.0.1:80").names_address("127.0.0.1".parse().unwrap(), 8080));
        assert!(!p("*").names_address("127.0.0.1".parse().unwrap(), 8080));
        assert!(!p("localhost").names_address("127.0.0.1".parse().unwrap(), 8080));
    }
}
