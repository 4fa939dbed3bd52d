//! The confinement of one process, whole: what the shell's confinement
//! stage (a fresh airlock process between the spawner and the payload)
//! is handed, serialized, and applies in order: namespaces and the mount
//! view, then in the payload capabilities, `no_new_privs`, Landlock,
//! seccomp, and the descriptors closed before exec.

use super::{
    private_dirs, seccomp_policy, view, Applied, Grant, Namespace, NsMode, PathRule, Ruleset, SeccompInputs,
    Source, SyscallRule, View, ViewInputs,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    /// The egress proxies' listeners, for `--allow-host`
    /// ([`Confinement::with_egress`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<super::EgressListen>,
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

    /// The Landlock rules for what was applied: inside the mount view, the
    /// private tmpfs mounts are granted read-write (they exist only there;
    /// without the view, `/tmp` is the host's and stays out of reach).
    pub fn ruleset_for(&self, applied: &Applied) -> Ruleset {
        let mut r = self.ruleset.clone();
        if applied.has(Namespace::Mount) {
            let abi = r.abi;
            for path in private_dirs(&self.view) {
                let rights = Grant::ReadWrite.rights().into_iter().filter(|x| x.since() <= abi).collect();
                r.paths.push(PathRule { path, grant: Grant::ReadWrite, rights, source: Source::Private });
            }
        }
        r
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
            // Bound writable: a connect needs write access to the socket.
            Source::Session => inputs.read_write.push(rule.path.clone()),
            Source::Default | Source::Private => {}
        }
    }
    view(&inputs)
}
