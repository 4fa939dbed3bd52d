//! The SOCKS5 proxy's two messages (RFC 1928): the greeting (version and
//! offered methods, answered with "no authentication" or "none
//! acceptable") and the request (CONNECT to an IPv4 address, a domain name
//! or an IPv6 address, and a port), and the replies. Only CONNECT is
//! served; BIND and UDP ASSOCIATE are answered "command not supported".

use super::host::{canonical_ip, parse_host, Host, HostError};
use super::http::Parsed;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The SOCKS version served.
pub const VERSION: u8 = 5;
/// Method "no authentication required".
pub const NO_AUTH: u8 = 0x00;
/// Method reply "no acceptable methods".
pub const NO_ACCEPTABLE: u8 = 0xff;

/// A reply code (RFC 1928, section 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    NetworkUnreachable = 0x03,
    HostUnreachable = 0x04,
    ConnectionRefused = 0x05,
    TtlExpired = 0x06,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

impl Reply {
    /// The ten bytes of a reply; the bound address is always `0.0.0.0:0`
    /// (the host's own addresses are none of the child's business).
    pub fn bytes(self) -> [u8; 10] {
        [VERSION, self as u8, 0, 1, 0, 0, 0, 0, 0, 0]
    }
}

/// The greeting: whether "no authentication" was offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub no_auth: bool,
}

/// Why a message is refused, and the reply it earns (none for a client
/// that does not speak SOCKS5 at all).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocksError {
    /// The first byte is not 5 (4 for SOCKS4, which gets its own refusal).
    Version(u8),
    /// A reserved byte that is not zero.
    Reserved,
    Command(u8),
    AddressType(u8),
    EmptyDomain,
    BadHost(HostError),
    PortZero,
}

impl SocksError {
    /// The reply for this error, when the client can be answered in SOCKS5.
    pub fn reply(&self) -> Option<Reply> {
        match self {
            SocksError::Version(_) => None,
            SocksError::Command(_) => Some(Reply::CommandNotSupported),
            SocksError::AddressType(_) => Some(Reply::AddressTypeNotSupported),
            SocksError::Reserved
            | SocksError::EmptyDomain
            | SocksError::BadHost(_)
            | SocksError::PortZero => Some(Reply::GeneralFailure),
        }
    }
}

impl fmt::Display for SocksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SocksError::Version(4) => f.write_str("SOCKS4 is not served: use SOCKS5 (socks5h://)"),
            SocksError::Version(v) => write!(f, "not SOCKS5 (first byte {v:#04x})"),
            SocksError::Reserved => f.write_str("a reserved byte is not zero"),
            SocksError::Command(c) => write!(f, "command {c} is not served (CONNECT only)"),
            SocksError::AddressType(t) => write!(f, "address type {t} is unknown"),
            SocksError::EmptyDomain => f.write_str("an empty domain name"),
            SocksError::BadHost(e) => write!(f, "{e}"),
            SocksError::PortZero => f.write_str("port 0"),
        }
    }
}

/// The SOCKS4 refusal (`request rejected or failed`), for a SOCKS4 client.
pub const SOCKS4_REJECTED: [u8; 8] = [0, 0x5b, 0, 0, 0, 0, 0, 0];

/// The greeting at the start of `buf`: `VER NMETHODS METHODS…`.
pub fn parse_greeting(buf: &[u8]) -> Parsed<Greeting, SocksError> {
    let Some(&ver) = buf.first() else { return Parsed::Partial };
    if ver != VERSION {
        return Parsed::Error(SocksError::Version(ver));
    }
    let Some(&n) = buf.get(1) else { return Parsed::Partial };
    let consumed = 2 + n as usize;
    let Some(methods) = buf.get(2..consumed) else { return Parsed::Partial };
    Parsed::Done { value: Greeting { no_auth: methods.contains(&NO_AUTH) }, consumed }
}

/// The request at the start of `buf`: `VER CMD RSV ATYP ADDR PORT`.
pub fn parse_request(buf: &[u8]) -> Parsed<(Host, u16), SocksError> {
    if buf.len() < 4 {
        if let Some(&v) = buf.first().filter(|v| **v != VERSION) {
            return Parsed::Error(SocksError::Version(v));
        }
        return Parsed::Partial;
    }
    let (ver, cmd, rsv, atyp) = (buf[0], buf[1], buf[2], buf[3]);
    if ver != VERSION {
        return Parsed::Error(SocksError::Version(ver));
    }
    let (host, at) = match atyp {
        1 => {
            let Some(b) = buf.get(4..8) else { return Parsed::Partial };
            (Ok(Host::Ip(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])))), 8)
        }
        3 => {
            let Some(&len) = buf.get(4) else { return Parsed::Partial };
            let end = 5 + len as usize;
            let Some(name) = buf.get(5..end) else { return Parsed::Partial };
            let host = if len == 0 {
                Err(SocksError::EmptyDomain)
            } else {
                match std::str::from_utf8(name) {
                    Ok(text) => parse_host(text).map_err(SocksError::BadHost),
                    Err(_) => Err(SocksError::BadHost(HostError::BadLabel)),
                }
            };
            (host, end)
        }
        4 => {
            let Some(b) = buf.get(4..20) else { return Parsed::Partial };
            let mut octets = [0u8; 16];
            octets.copy_from_slice(b);
            (Ok(Host::Ip(canonical_ip(IpAddr::V6(Ipv6Addr::from(octets))))), 20)
        }
        other => return Parsed::Error(SocksError::AddressType(other)),
    };
    let Some(p) = buf.get(at..at + 2) else { return Parsed::Partial };
    let port = u16::from_be_bytes([p[0], p[1]]);
    // Checked once the whole request is in, in the order a reader meets
    // them, so the reply does not depend on how the bytes were split.
    if rsv != 0 {
        return Parsed::Error(SocksError::Reserved);
    }
    if cmd != 1 {
        return Parsed::Error(SocksError::Command(cmd));
    }
    let host = match host {
        Ok(h) => h,
        Err(e) => return Parsed::Error(e),
    };
    if port == 0 {
        return Parsed::Error(SocksError::PortZero);
    }
    Parsed::Done { value: (host, port), consumed: at + 2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_offer_methods() {
        assert_eq!(parse_greeting(b""), Parsed::Partial);
        assert_eq!(parse_greeting(b"\x05\x02\x02"), Parsed::Partial);
        assert_eq!(
            parse_greeting(b"\x05\x02\x02\x00rest"),
            Parsed::Done { value: Greeting { no_auth: true }, consumed: 4 }
        );
        assert_eq!(
            parse_greeting(b"\x05\x01\x02"),
            Parsed::Done { value: Greeting { no_auth: false }, consumed: 3 }
        );
        assert_eq!(
            parse_greeting(b"\x05\x00"),
            Parsed::Done { value: Greeting { no_auth: false }, consumed: 2 }
        );
        assert_eq!(parse_greeting(b"\x04\x01"), Parsed::Error(SocksError::Version(4)));
    }

    #[test]
    fn requests_name_a_host_three_ways() {
        assert_eq!(
            parse_request(b"\x05\x01\x00\x03\x08PyPI.org\x01\xbbextra"),
            Parsed::Done { value: (Host::Name("pypi.org".into()), 443), consumed: 15 }
        );
        assert_eq!(
            parse_request(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x1f\x90"),
            Parsed::Done { value: (Host::Ip("127.0.0.1".parse().unwrap()), 8080), consumed: 10 }
        );
        let mut v6 = b"\x05\x01\x00\x04".to_vec();
        v6.extend_from_slice(&"::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0, 80]);
        assert_eq!(
            parse_request(&v6),
            Parsed::Done { value: (Host::Ip("10.0.0.1".parse().unwrap()), 80), consumed: 22 }
        );
        assert_eq!(parse_request(&v6[..21]), Parsed::Partial);
    }

    #[test]
    fn bad_requests_earn_their_reply() {
        let e = |b: &[u8]| match parse_request(b) {
            Parsed::Error(e) => e,
            other => panic!("{other:?}"),
        };
        assert_eq!(e(b"\x05\x02\x00\x01\x01\x02\x03\x04\x00\x50").reply(), Some(Reply::CommandNotSupported));
        assert_eq!(e(b"\x05\x01\x00\x09").reply(), Some(Reply::AddressTypeNotSupported));
        assert_eq!(e(b"\x05\x01\x00\x03\x00\x00\x50"), SocksError::EmptyDomain);
        assert_eq!(e(b"\x05\x01\x00\x01\x01\x02\x03\x04\x00\x00"), SocksError::PortZero);
        assert_eq!(e(b"\x05\x01\x01\x01\x01\x02\x03\x04\x00\x50"), SocksError::Reserved);
        assert_eq!(e(b"\x05\x01\x00\x03\x03a b\x00\x50"), SocksError::BadHost(HostError::BadLabel));
        assert_eq!(e(b"\x04\x01"), SocksError::Version(4));
    }
}
