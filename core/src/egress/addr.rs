//! Which addresses a child may reach only when a pattern names them: the
//! host's own (loopback), its networks (private, shared, link-local), the
//! clouds' metadata services, and whatever no public host can be
//! (unspecified, multicast, reserved). An IPv6 address that carries an
//! IPv4 one (mapped, NAT64, 6to4) is judged by the IPv4 address inside,
//! since that is where its packets go.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What kind of destination an address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddrClass {
    /// Reachable on the internet: allowed by a name alone.
    Public,
    Loopback,
    /// RFC 1918, unique local IPv6, site-local.
    Private,
    /// Carrier-grade NAT (100.64.0.0/10) and benchmarking (198.18.0.0/15),
    /// both used inside networks.
    Shared,
    LinkLocal,
    /// A cloud instance metadata service.
    Metadata,
    /// `0.0.0.0/8`, `::`: a connect there reaches the host itself.
    Unspecified,
    Multicast,
    /// Reserved, documentation, discard, Teredo and other ranges no public
    /// server has.
    Reserved,
}

impl AddrClass {
    /// A class a name alone may not reach.
    pub fn is_special(self) -> bool {
        self != AddrClass::Public
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Public => "public",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private",
            AddrClass::Shared => "shared",
            AddrClass::LinkLocal => "link-local",
            AddrClass::Metadata => "metadata",
            AddrClass::Unspecified => "unspecified",
            AddrClass::Multicast => "multicast",
            AddrClass::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddrClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Cloud metadata services (AWS, GCP, Azure, OpenStack, DigitalOcean and
/// Oracle at 169.254.169.254; ECS task metadata; Alibaba; Azure's wire
/// server, a public address; AWS's IPv6 endpoint).
pub const METADATA_V4: &[Ipv4Addr] = &[
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
];
pub const METADATA_V6: &[Ipv6Addr] = &[Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254)];

fn in_v4(a: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(a) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

pub fn classify_v4(a: Ipv4Addr) -> AddrClass {
    if METADATA_V4.contains(&a) {
        return AddrClass::Metadata;
    }
    let ranges: &[([u8; 4], u32, AddrClass)] = &[
        ([0, 0, 0, 0], 8, AddrClass::Unspecified),
        ([127, 0, 0, 0], 8, AddrClass::Loopback),
        ([10, 0, 0, 0], 8, AddrClass::Private),
        ([172, 16, 0, 0], 12, AddrClass::Private),
        ([192, 168, 0, 0], 16, AddrClass::Private),
        ([100, 64, 0, 0], 10, AddrClass::Shared),
        ([198, 18, 0, 0], 15, AddrClass::Shared),
        ([169, 254, 0, 0], 16, AddrClass::LinkLocal),
        ([192, 0, 0, 0], 24, AddrClass::Reserved),
        ([192, 0, 2, 0], 24, AddrClass::Reserved),
        ([198, 51, 100, 0], 24, AddrClass::Reserved),
        ([203, 0, 113, 0], 24, AddrClass::Reserved),
        ([192, 88, 99, 0], 24, AddrClass::Reserved),
        ([224, 0, 0, 0], 4, AddrClass::Multicast),
        ([240, 0, 0, 0], 4, AddrClass::Reserved),
    ];
    ranges.iter().find(|(net, len, _)| in_v4(a, *net, *len)).map_or(AddrClass::Public, |(_, _, c)| *c)
}

pub fn classify_v6(a: Ipv6Addr) -> AddrClass {
    if METADATA_V6.contains(&a) {
        return AddrClass::Metadata;
    }
    let s = a.segments();
    if let Some(v4) = embedded_v4(a) {
        // The deprecated IPv4-compatible form routes nowhere public.
        let compatible = s[..6] == [0; 6];
        return match classify_v4(v4) {
            AddrClass::Public if compatible => AddrClass::Reserved,
            c => c,
        };
    }
    if a.is_unspecified() {
        return AddrClass::Unspecified;
    }
    if a.is_loopback() {
        return AddrClass::Loopback;
    }
    match s[0] {
        x if x & 0xfe00 == 0xfc00 => AddrClass::Private,
        x if x & 0xffc0 == 0xfe80 => AddrClass::LinkLocal,
        x if x & 0xffc0 == 0xfec0 => AddrClass::Private,
        x if x & 0xff00 == 0xff00 => AddrClass::Multicast,
        // Teredo hides its IPv4 server and client; discard; documentation;
        // the rest of the IPv4-compatible space and ORCHID.
        0x2001 if s[1] == 0 || s[1] == 0x0db8 || s[1] & 0xfff0 == 0x0010 || s[1] & 0xfff0 == 0x0020 => {
            AddrClass::Reserved
        }
        0x0100 if s[1] == 0 && s[2] == 0 && s[3] == 0 => AddrClass::Reserved,
        0x3fff if s[1] & 0xf000 == 0 => AddrClass::Reserved,
        0x0000..=0x00ff => AddrClass::Reserved,
        _ => AddrClass::Public,
    }
}

/// The IPv4 address an IPv6 one sends its packets to: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::a.b.c.d`, and the local-use `64:ff9b:1::/48`), 6to4
/// (`2002:aabb:ccdd::`).
pub fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let low = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || (s[5] == 0 && (s[6] != 0 || s[7] > 1))) {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6] == [0, 0, 0, 0] || s[2] == 1) {
        return Some(low(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return Some(low(s[1], s[2]));
    }
    None
}

pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(a) => classify_v4(a),
        IpAddr::V6(a) => classify_v6(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> AddrClass {
        classify(s.parse().unwrap())
    }

    #[test]
    fn the_host_and_its_networks_are_special() {
        assert_eq!(c("127.0.0.1"), AddrClass::Loopback);
        assert_eq!(c("127.255.0.9"), AddrClass::Loopback);
        assert_eq!(c("::1"), AddrClass::Loopback);
        assert_eq!(c("::ffff:127.0.0.1"), AddrClass::Loopback);
        assert_eq!(c("64:ff9b::7f00:1"), AddrClass::Loopback);
        assert_eq!(c("2002:7f00:1::"), AddrClass::Loopback);
        assert_eq!(c("10.1.2.3"), AddrClass::Private);
        assert_eq!(c("172.31.255.255"), AddrClass::Private);
        assert_eq!(c("192.168.1.1"), AddrClass::Private);
        assert_eq!(c("fd12::1"), AddrClass::Private);
        assert_eq!(c("100.64.0.1"), AddrClass::Shared);
        assert_eq!(c("169.254.1.1"), AddrClass::LinkLocal);
        assert_eq!(c("fe80::1"), AddrClass::LinkLocal);
        assert_eq!(c("169.254.169.254"), AddrClass::Metadata);
        assert_eq!(c("::ffff:169.254.169.254"), AddrClass::Metadata);
        assert_eq!(c("168.63.129.16"), AddrClass::Metadata);
        assert_eq!(c("fd00:ec2::254"), AddrClass::Metadata);
        assert_eq!(c("0.0.0.0"), AddrClass::Unspecified);
        assert_eq!(c("::"), AddrClass::Unspecified);
        assert_eq!(c("224.0.0.1"), AddrClass::Multicast);
        assert_eq!(c("ff02::1"), AddrClass::Multicast);
        assert_eq!(c("255.255.255.255"), AddrClass::Reserved);
        assert_eq!(c("2001::1"), AddrClass::Reserved);
        assert_eq!(c("::8.8.8.8"), AddrClass::Reserved);
    }

    #[test]
    fn public_addresses_are_public() {
        for a in [
            "8.8.8.8",
            "151.101.0.223",
            "172.32.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::",
        ] {
            assert_eq!(c(a), AddrClass::Public, "{a}");
        }
    }
}
