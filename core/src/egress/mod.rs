//! Network egress by host name, sans-I/O (`--allow-host`, `--deny-host`).
//!
//! A confined child's network namespace holds nothing but loopback and
//! airlock's two proxy listeners (HTTP and SOCKS5); airlock accepts their
//! connections from outside the namespace, reads each request, decides it
//! against the session's patterns, resolves the name, checks every address
//! it would reach, connects from the host and relays, counting every byte.
//! This module is all of that but the I/O:
//!
//! - [`host`]: a host as resolvers read it (case, trailing dot, IDNA, IP
//!   literals in every `inet_aton` form, IPv4-mapped IPv6);
//! - [`addr`]: which addresses are special (loopback, private, link-local,
//!   metadata, …) and reachable only when a pattern names them;
//! - [`pattern`] and [`decide`]: the patterns and the decision, deny
//!   first;
//! - [`http`] and [`socks`]: the two proxies' request parsers and answers;
//! - [`machine`]: one machine per session, every connection's state.

pub mod addr;
pub mod decide;
pub mod host;
pub mod http;
pub mod machine;
pub mod pattern;
pub mod socks;

#[cfg(test)]
mod tests;

pub use decide::{Rule, Rules};
pub use host::{parse_host, Host, HostError};
pub use machine::*;
pub use pattern::{Pattern, PatternError};

/// The HTTP proxy's port on the child's loopback.
pub const HTTP_PROXY_PORT: u16 = 3128;
/// The SOCKS5 proxy's port on the child's loopback.
pub const SOCKS_PROXY_PORT: u16 = 1080;
