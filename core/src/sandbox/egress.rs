//! What `--allow-host` changes in a confinement: the child's network
//! namespace gets airlock's two proxy listeners (created there by PID 1 and
//! handed to airlock over a socket the stage inherits), Landlock lets the
//! child connect to those two ports and no other, and the mount view holds
//! the system's CA certificates (TLS through a CONNECT tunnel is the
//! child's own, end to end, and needs them) and the files naming the OS
//! release (network clients put it in their User-Agent: pip fails without).

use super::{Confinement, Grant, Mount, NetRight, PathRule, Ruleset, Source};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the system keeps CA certificates (Debian, Red Hat, Arch, SUSE);
/// missing ones are skipped. `/usr/share/ca-certificates` and the like are
/// under `/usr` already.
pub const CA_PATHS: &[&str] = &["/etc/ssl", "/etc/pki", "/etc/ca-certificates"];

/// The files naming the OS release, read (never written) by network
/// clients for their User-Agent: pip's (its vendored `distro`) stops with
/// a `PermissionError` when `/etc/debian_version` exists but cannot be
/// read. Missing ones are skipped. `/etc/os-release` is not here: it is a
/// link into `/usr` (readable already), and the view's `/etc` holds the
/// link, so binding it again fails.
pub const OS_RELEASE_PATHS: &[&str] = &["/etc/debian_version", "/etc/lsb-release"];

/// The proxy listeners a confinement's PID 1 creates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressListen {
    /// The descriptor (in the stage) of the socket the listeners are sent
    /// over, with `SCM_RIGHTS`.
    pub fd: i32,
    /// The HTTP proxy's port, then the SOCKS5 proxy's, on 127.0.0.1.
    pub http_port: u16,
    pub socks_port: u16,
}

impl Ruleset {
    /// Let the child connect to TCP `port` (on any address: inside a
    /// network namespace of its own only loopback exists). Nothing when
    /// the network is not handled (no Landlock TCP, or the network allowed).
    pub fn grant_connect_port(&mut self, port: u16) {
        if self.handled_net.contains(&NetRight::ConnectTcp) {
            self.connect_ports.insert(port);
        }
    }
}

impl Confinement {
    /// Ask PID 1 for the proxy listeners: the network namespace becomes
    /// required (never shared, never the fallback), the child may connect
    /// to the two ports, and the CA certificates are in its view.
    pub fn with_egress(&mut self, listen: EgressListen) {
        self.net = false;
        self.ruleset.grant_connect_port(listen.http_port);
        self.ruleset.grant_connect_port(listen.socks_port);
        let abi = self.ruleset.abi;
        let at = self.view.mounts.iter().position(|m| matches!(m, Mount::Tmpfs { .. })).unwrap_or(0);
        for (i, p) in CA_PATHS.iter().chain(OS_RELEASE_PATHS).enumerate() {
            let path = PathBuf::from(p);
            self.view
                .mounts
                .insert(at + i, Mount::Bind { path: path.clone(), writable: false, required: false });
            let rights = Grant::Read.rights().into_iter().filter(|r| r.since() <= abi).collect();
            self.ruleset.paths.push(PathRule { path, grant: Grant::Read, rights, source: Source::Default });
        }
        self.egress = Some(listen);
    }
}
