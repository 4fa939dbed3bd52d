//! The confinement of one process, whole: what the shell's confinement
//! stage (a fresh airlock process between the spawner and the payload)
//! is handed, serialized, and applies in order: namespaces and the mount
//! view, then in the payload capabilities, `no_new_privs`, Landlock,
//! seccomp, and the descriptors closed before exec.

use super::bounds::{BoundsInForce, Rlimit, SessionBounds};
use super::{
    private_dirs, seccomp_policy, view, Applied, Grant, Namespace, NsMode, PathRule, Ruleset, SeccompInputs,
    Source, SyscallRule, View, ViewInputs,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Everything the stage needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    pub namespaces: NsMode,
    /// Leave the network namespace shared (the network is allowed).
    pub net: bool,
    /// The Landlock rules.
    pub ruleset: Ruleset,
    /// The mount view, used when the mount namespace is in force.
    pub view: View,
    /// Descriptors kept open across exec: 0 to `keep_fds` (2, or 3 for
    /// `run`'s proxy).
    pub keep_fds: u32,
    /// Where the stage reports what it applied (a descriptor it inherits).
    pub status_fd: i32,
    /// The session's socket, when the payload is to reach it (`run`'s
    /// child): see [`Confinement::session_socket`].
    #[serde(default)]
    pub session: Option<SessionSocket>,
    /// What the session's processes may take (see [`super::bounds`]).
    #[serde(default)]
    pub bounds: Option<SessionBounds>,
    /// The egress proxies' listeners, for `--allow-host`
    /// ([`Confinement::with_egress`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<super::EgressListen>,
    /// The roots to serve as filesystems inside the view (`run` alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<super::fuse::FusePlan>,
}

/// The session's socket as the payload reaches it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSocket {
    /// The socket on the host.
    pub host: PathBuf,
    /// The environment variable that names it to the payload.
    pub env: String,
}

/// What the stage tells airlock, one JSON line each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Everything is applied; the exec follows.
    Applied(Applied),
    /// The stage could not confine as asked; nothing was started.
    Refused { message: String },
    /// The exec failed with this errno.
    ExecFailed { errno: i32 },
}

impl Confinement {
    /// The namespaces to create: all six, less the network one when the
    /// network is allowed.
    pub fn wanted(&self) -> Vec<Namespace> {
        Namespace::ALL.into_iter().filter(|ns| !(self.net && *ns == Namespace::Net)).collect()
    }

    /// Let the payload reach the session's socket `host`, named to it in
    /// `env`: in the view the socket alone is bound, read-only, at
    /// [`SESSION_SOCKET_IN_VIEW`]; without the view it is reached at its
    /// host path, in a directory Landlock grants nothing but connecting in
    /// (ABI 9).
    pub fn session_socket(&mut self, host: PathBuf, env: &str) {
        self.view.add_session_socket(host.clone());
        self.session = Some(SessionSocket { host, env: env.to_owned() });
    }

    /// Where the payload finds the session's socket once `applied`, when
    /// that is not its host path: the variable and its value.
    pub fn session_env(&self, applied: &Applied) -> Option<(&str, &Path)> {
        let s = self.session.as_ref()?;
        let inside = self.view.session_socket()?;
        applied.has(Namespace::Mount).then_some((s.env.as_str(), inside))
    }

    /// The Landlock rules for what was applied: inside the mount view, the
    /// private tmpfs mounts are granted read-write (they exist only there;
    /// without the view, `/tmp` is the host's and stays out of reach); the
    /// session's socket may be connected to where it is.
    pub fn ruleset_for(&self, applied: &Applied) -> Ruleset {
        let mut r = self.ruleset.clone();
        let in_view = applied.has(Namespace::Mount);
        if in_view {
            let abi = r.abi;
            for path in private_dirs(&self.view) {
                let rights = Grant::ReadWrite.rights().into_iter().filter(|x| x.since() <= abi).collect();
                r.paths.push(PathRule { path, grant: Grant::ReadWrite, rights, source: Source::Private });
            }
        }
        if let Some(s) = &self.session {
            let socket = if in_view { self.view.session_socket() } else { Some(s.host.as_path()) };
            if let Some(dir) = socket.and_then(Path::parent) {
                r.grant_session_dir(dir.to_path_buf());
            }
        }
        super::fuse::grant_mounted(&mut r, self.fuse.as_ref(), applied);
        r
    }

    /// The rlimits the payload sets on itself for the bounds no joined
    /// cgroup enforces.
    pub fn rlimits_for(&self, applied: &Applied) -> Vec<Rlimit> {
        self.bounds
            .as_ref()
            .map_or_else(Vec::new, |b| b.enforcement(&applied.cgroups, applied.has(Namespace::User)).1)
    }

    /// The report's account of the bounds, and their gaps, for what was
    /// applied.
    pub fn bounds_in_force(&self, applied: &Applied) -> Option<(BoundsInForce, Vec<&'static str>)> {
        let (f, _, gaps) = self.bounds.as_ref()?.enforcement(&applied.cgroups, applied.has(Namespace::User));
        Some((f, gaps))
    }

    /// The seccomp rules for what was applied.
    pub fn seccomp_for(&self, applied: &Applied) -> Vec<SyscallRule> {
        seccomp_policy(&SeccompInputs {
            ipc_ns: applied.has(Namespace::Ipc),
            net_ns: applied.has(Namespace::Net),
            mount_ns: applied.has(Namespace::Mount),
            net_allowed: self.net,
            // In the minimal view no host unix socket is in reach but in
            // paths the user granted and the session's own: creating one is
            // no longer a way out, and the session's socket needs it.
            deny_unix_socket_create: self.ruleset.deny_unix_socket_create && !applied.has(Namespace::Mount),
        })
    }
}

/// The mount view for a ruleset: its granted paths bound at their own
/// paths (read-write for a work dir, read-only otherwise), the airlock
/// binary, and `cwd`. The default system list is in every view already.
pub fn view_for(ruleset: &Ruleset, cwd: PathBuf) -> View {
    let mut inputs = ViewInputs::new(cwd);
    for rule in &ruleset.paths {
        match rule.source {
            Source::User => inputs.read_only.push(rule.path.clone()),
            Source::WorkDir => inputs.read_write.push(rule.path.clone()),
            Source::Airlock => inputs.airlock = Some(rule.path.clone()),
            // The session's socket is bound alone (`session_socket`).
            Source::Default | Source::Private | Source::Session | Source::Served => {}
        }
    }
    view(&inputs)
}
