//! What the report says is in force: each layer, and every class no layer
//! closes on this kernel, by name. Computed from the plan and from what the
//! confinement stage says it actually applied ([`Applied`]), never from
//! what was merely asked for.

use super::{FsRight, Namespace, NetRight, Plan, Ruleset, ScopeKind};
use serde::{Deserialize, Serialize};

/// What the confinement stage applied, as it tells airlock over its status
/// pipe just before the exec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The namespaces the payload runs in (empty: the fallback).
    pub namespaces: Vec<Namespace>,
    /// Whether the seccomp filter is installed.
    pub seccomp: bool,
    /// Whether the mount view has a fresh `/proc` (a container may refuse
    /// one).
    #[serde(default)]
    pub proc: bool,
    /// The bounds whose cgroups the stage joined.
    #[serde(default)]
    pub cgroups: Vec<super::bounds::Bound>,
    /// The roots mounted as filesystems in the view (see `sandbox::fuse`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fuse: Vec<std::path::PathBuf>,
    /// Why a root wanted as a filesystem is not one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse_error: Option<String>,
}

impl Applied {
    pub fn has(&self, ns: Namespace) -> bool {
        self.namespaces.contains(&ns)
    }
}

/// The `sandbox` section of the report: what is in force, stated plainly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InForce {
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: u32,
    /// `confined` (only the listed locations, read-only, and sinks) or
    /// `unconfined` (`--no-sandbox`).
    pub fs: &'static str,
    /// `denied` (no TCP bind or connect), `allowed` (`--sandbox-net`),
    /// `unconfined` (`--no-sandbox`, or a kernel before ABI 4 without a
    /// network namespace).
    pub net: &'static str,
    /// Scopes in force: `abstract_unix_socket`, `signal`.
    pub scoped: Vec<ScopeKind>,
    /// The namespaces in force: `user`, `pid`, `ipc`, `net`, `uts`, `mount`.
    pub namespaces: Vec<Namespace>,
    /// Whether the seccomp filter is in force.
    pub seccomp: bool,
    /// `dropped` (bounding, ambient, inheritable, effective and permitted
    /// sets emptied, `no_new_privs`) or `kept` (`--no-sandbox`).
    pub capabilities: &'static str,
    /// Every class no layer closes, by name: `ns_*` for a namespace not in
    /// force, the Landlock rights a newer kernel would add otherwise.
    pub not_enforced: Vec<&'static str>,
    /// `--sandbox-ro` paths inside an allowed root, which the child reads
    /// directly: the audit log does not see those reads.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub direct_read: Vec<std::path::PathBuf>,
    /// What airlock granted read-only on its own, each with its reason:
    /// the interpreter chain of the program the user named, and files
    /// named as arguments inside a root.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub granted: Vec<super::program::AutoGrant>,
    /// What the session's processes may take, how each bound is enforced
    /// and which were reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bounds: Option<super::bounds::BoundsInForce>,
    /// The roots served as filesystems in the child's view (their mount
    /// points); `fuse` is under `not_enforced` when a directory root is
    /// reachable through the proxy alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fuse: Vec<std::path::PathBuf>,
    /// Why the roots are not served as filesystems, when they are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fuse_reason: Option<String>,
}

impl InForce {
    /// Add the bounds' account: their gaps join `not_enforced`.
    pub fn with_bounds(mut self, bounds: Option<(super::bounds::BoundsInForce, Vec<&'static str>)>) -> Self {
        if let Some((b, gaps)) = bounds {
            self.not_enforced.extend(gaps);
            self.bounds = Some(b);
        }
        self
    }
}

/// The report's name for a namespace not in force.
pub fn ns_gap(ns: Namespace) -> &'static str {
    match ns {
        Namespace::User => "ns_user",
        Namespace::Pid => "ns_pid",
        Namespace::Ipc => "ns_ipc",
        Namespace::Net => "ns_net",
        Namespace::Uts => "ns_uts",
        Namespace::Mount => "ns_mount",
    }
}

impl Plan {
    /// What Landlock alone enforces (no namespaces, no seccomp beyond the
    /// unix-socket filter): the view of a kernel where nothing else applies.
    pub fn in_force(&self) -> InForce {
        match self {
            Plan::Unconfined { abi } => InForce {
                landlock_abi: *abi,
                fs: "unconfined",
                net: "unconfined",
                scoped: Vec::new(),
                namespaces: Vec::new(),
                seccomp: false,
                capabilities: "kept",
                not_enforced: vec!["fs", "net", "scopes"],
                direct_read: Vec::new(),
                granted: Vec::new(),
                bounds: None,
                fuse: Vec::new(),
                fuse_reason: None,
            },
            Plan::Confined(r) => landlock_view(r),
        }
    }

    /// What is in force once the stage has applied `applied`: a class a
    /// namespace closes is not listed even when Landlock cannot close it
    /// on this kernel; each namespace missing is listed.
    pub fn in_force_with(&self, applied: &Applied, net_allowed: bool) -> InForce {
        let Plan::Confined(r) = self else { return self.in_force() };
        let mut f = landlock_view(r);
        f.namespaces = applied.namespaces.clone();
        f.seccomp = applied.seccomp;
        f.capabilities = "dropped";
        let net_ns = applied.has(Namespace::Net);
        let mount_ns = applied.has(Namespace::Mount);
        let pid_ns = applied.has(Namespace::Pid);
        // In the fallback without `--sandbox-net`, no IPv4 or IPv6 socket
        // is created at all (Landlock alone would leave a Fast Open
        // `sendto` and a `listen` without `bind`).
        let inet_by_seccomp = !net_ns && !net_allowed && applied.seccomp;
        let closed_by = |gap: &str| -> bool {
            match gap {
                // A private network namespace has loopback only; without
                // one, seccomp refuses every internet socket unless the
                // network is allowed.
                "tcp" | "udp" => net_ns || inet_by_seccomp,
                // Abstract names live in the network namespace.
                "scope_abstract_unix_socket" => net_ns,
                // Nothing outside the PID namespace can be named.
                "scope_signal" => pid_ns,
                // Every host location in the view is a read-only mount.
                "truncate" => mount_ns,
                _ => false,
            }
        };
        let mut gaps: Vec<&'static str> = f.not_enforced.iter().copied().filter(|g| !closed_by(g)).collect();
        if (net_ns || inet_by_seccomp) && f.net == "unconfined" {
            f.net = "denied";
        }
        for ns in Namespace::ALL {
            if !applied.has(ns) && (ns != Namespace::Net || !net_allowed) {
                gaps.push(ns_gap(ns));
            }
        }
        if !applied.seccomp {
            gaps.push("seccomp");
        }
        if !net_ns {
            // Abstract names belong to the network namespace: without a
            // private one, a socket may still bind a host-wide name
            // (Landlock's scope covers connecting only).
            gaps.push("abstract_unix_bind");
        }
        f.not_enforced = gaps;
        f
    }
}

fn landlock_view(r: &Ruleset) -> InForce {
    let has_fs = |x: FsRight| r.handled_fs.contains(&x);
    let tcp = r.handled_net.contains(&NetRight::ConnectTcp);
    let mut gaps = Vec::new();
    if !has_fs(FsRight::Truncate) {
        gaps.push("truncate");
    }
    if !has_fs(FsRight::IoctlDev) {
        gaps.push("ioctl_dev");
    }
    if !has_fs(FsRight::ResolveUnix) && !r.deny_unix_socket_create {
        gaps.push("unix_socket_connect");
    }
    if r.abi < NetRight::ConnectTcp.since() {
        gaps.push("tcp");
    }
    if r.abi < NetRight::ConnectSendUdp.since() {
        gaps.push("udp");
    }
    for s in ScopeKind::ALL {
        if !r.scoped.contains(&s) {
            gaps.push(match s {
                ScopeKind::AbstractUnixSocket => "scope_abstract_unix_socket",
                ScopeKind::Signal => "scope_signal",
            });
        }
    }
    let net = match (tcp, r.abi >= NetRight::ConnectTcp.since()) {
        (true, _) => "denied",
        (false, true) => "allowed",
        (false, false) => "unconfined",
    };
    InForce {
        landlock_abi: r.kernel_abi,
        fs: "confined",
        net,
        scoped: r.scoped.iter().copied().collect(),
        namespaces: Vec::new(),
        seccomp: false,
        capabilities: "dropped",
        not_enforced: gaps,
        direct_read: r.direct_read.clone(),
        granted: r.granted.clone(),
        bounds: None,
        fuse: Vec::new(),
        fuse_reason: None,
    }
}
