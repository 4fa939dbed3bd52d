//! The egress decision: a request's host and port against the patterns
//! (deny first), then each address it would reach against the deny
//! patterns and the special ranges (see [`super::addr`]).

use super::addr::{classify, AddrClass};
use super::host::{canonical_ip, Host};
use super::pattern::Pattern;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// A session's network policy: `--allow-host` and `--deny-host`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    #[serde(default)]
    pub allow: Vec<Pattern>,
    #[serde(default)]
    pub deny: Vec<Pattern>,
}

/// The rule that decided, as refusals and audit lines name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// `--allow-host PATTERN` let it through.
    Allow(Pattern),
    /// `--deny-host PATTERN` refused it.
    Deny(Pattern),
    /// No `--allow-host` pattern matches the host and port.
    NoAllow,
    /// The address is loopback, private, link-local, metadata…, and no
    /// `--allow-host` address or range names it.
    Special { class: AddrClass, addr: IpAddr },
    /// A limit of the session (the flag that sets it).
    Limit { flag: String },
    /// The request could not be read (what was wrong with it).
    BadRequest { reason: String },
    /// The destination could not be reached (why).
    Unreachable { reason: String },
    /// The session ended while the connection was open.
    SessionEnded,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Allow(p) => write!(f, "--allow-host {p}"),
            Rule::Deny(p) => write!(f, "--deny-host {p}"),
            Rule::NoAllow => f.write_str("no --allow-host pattern matches"),
            Rule::Special { class, addr } => {
                write!(f, "{class} address {addr} not named by an --allow-host address or range")
            }
            Rule::Limit { flag } => write!(f, "limit {flag}"),
            Rule::BadRequest { reason } => write!(f, "bad request: {reason}"),
            Rule::Unreachable { reason } => write!(f, "unreachable: {reason}"),
            Rule::SessionEnded => f.write_str("the session ended"),
        }
    }
}

impl Rules {
    /// No `--allow-host`: no egress at all (the child's private loopback).
    pub fn is_off(&self) -> bool {
        self.allow.is_empty()
    }

    /// A request for `host`:`port`: the first deny pattern that matches
    /// refuses it; otherwise the first allow pattern that matches allows
    /// it; otherwise it is refused.
    pub fn check_request(&self, host: &Host, port: u16) -> Result<Rule, Rule> {
        if let Some(p) = self.deny.iter().find(|p| p.matches_request(host, port)) {
            return Err(Rule::Deny(p.clone()));
        }
        match self.allow.iter().find(|p| p.matches_request(host, port)) {
            Some(p) => Ok(Rule::Allow(p.clone())),
            None => Err(Rule::NoAllow),
        }
    }

    /// An address a request would reach: refused when a deny address or
    /// range names it, or when it is special and no allow address or
    /// range names it. Made on every address before connecting and again
    /// on the address actually connected to.
    pub fn check_address(&self, ip: IpAddr, port: u16) -> Result<(), Rule> {
        let ip = canonical_ip(ip);
        if let Some(p) = self.deny.iter().find(|p| p.names_address(ip, port)) {
            return Err(Rule::Deny(p.clone()));
        }
        let class = classify(ip);
        if class.is_special() && !self.allow.iter().any(|p| p.names_address(ip, port)) {
            return Err(Rule::Special { class, addr: ip });
        }
        Ok(())
    }

    /// Whether any allow pattern could send loopback through airlock to
    /// the host's loopback (then `NO_PROXY` must not exempt it).
    pub fn grants_loopback(&self) -> bool {
        self.allow.iter().any(Pattern::mentions_loopback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::host::parse_host;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        Rules {
            allow: allow.iter().map(|p| p.parse().unwrap()).collect(),
            deny: deny.iter().map(|p| p.parse().unwrap()).collect(),
        }
    }

    fn host(s: &str) -> Host {
        parse_host(s).unwrap()
    }

    #[test]
    fn deny_is_checked_first() {
        let r = rules(&["*.example.com"], &["secret.example.com"]);
        assert_eq!(
            r.check_request(&host("a.example.com"), 443),
            Ok(Rule::Allow("*.example.com".parse().unwrap()))
        );
        assert_eq!(
            r.check_request(&host("SECRET.example.com."), 443),
            Err(Rule::Deny("secret.example.com".parse().unwrap()))
        );
        assert_eq!(r.check_request(&host("example.org"), 443), Err(Rule::NoAllow));
    }

    #[test]
    fn a_name_alone_reaches_no_special_address() {
        let r = rules(&["localhost:8080"], &[]);
        assert!(r.check_request(&host("localhost"), 8080).is_ok());
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(r.check_address(lo, 8080), Err(Rule::Special { class: AddrClass::Loopback, addr: lo }));
        let r = rules(&["localhost:8080", "127.0.0.1"], &[]);
        assert_eq!(r.check_address(lo, 8080), Ok(()));
        assert_eq!(r.check_address("::ffff:127.0.0.1".parse().unwrap(), 8080), Ok(()));
        assert!(r.check_address("10.0.0.1".parse().unwrap(), 8080).is_err());
        assert!(r.check_address("169.254.169.254".parse().unwrap(), 80).is_err());
        assert_eq!(r.check_address("8.8.8.8".parse().unwrap(), 443), Ok(()));
    }

    #[test]
    fn deny_ranges_refuse_addresses_allowed_names_resolve_to() {
        let r = rules(&["*"], &["8.8.0.0/16"]);
        assert_eq!(
            r.check_address("8.8.8.8".parse().unwrap(), 443),
            Err(Rule::Deny("8.8.0.0/16".parse().unwrap()))
        );
        assert_eq!(r.check_address("1.1.1.1".parse().unwrap(), 443), Ok(()));
    }

    #[test]
    fn rules_name_themselves_readably() {
        assert_eq!(Rule::Allow("pypi.org:443".parse().unwrap()).to_string(), "--allow-host pypi.org:443");
        assert_eq!(
            Rule::Special { class: AddrClass::Metadata, addr: "169.254.169.254".parse().unwrap() }
                .to_string(),
            "metadata address 169.254.169.254 not named by an --allow-host address or range"
        );
    }
}
