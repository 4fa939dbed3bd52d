//! The namespaces a confined process runs in, and the minimal mount view
//! it sees there.
//!
//! The view is built on an empty tmpfs: system locations bound read-only
//! at their own paths (what `sh`, `python3`, `git` need to start), a
//! `/dev` holding only a few harmless devices, a fresh `/proc` for the PID
//! namespace, private size-bounded `/tmp` and `/dev/shm`, the airlock
//! binary (so `"$AIRLOCK"` works), the session's socket alone (read-only,
//! at [`SESSION_SOCKET_IN_VIEW`], outside the private `/tmp`), the paths
//! the caller grants, and the working directory's path (an empty
//! directory unless a grant covers it). No host `/run`, no home, no host
//! `/tmp`: no other host unix socket to connect to. Every writable bind
//! is `nosuid,nodev`; every read-only one `nosuid`; devices keep `dev`
//! and lose `suid`. Landlock still applies on top, with the same rules as without the
//! view; the view removes what Landlock cannot name.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One Linux namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Namespace {
    User,
    Pid,
    Ipc,
    Net,
    Uts,
    Mount,
}

impl Namespace {
    pub const ALL: [Namespace; 6] =
        [Namespace::User, Namespace::Pid, Namespace::Ipc, Namespace::Net, Namespace::Uts, Namespace::Mount];
}

/// Whether to use namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NsMode {
    /// Never (`AIRLOCK_NO_NAMESPACES=1`): layers 2-4 only.
    Off,
    /// Where the kernel allows them; the fallback otherwise, reported.
    Try,
    /// `--require-namespaces`: refuse to start without them.
    Require,
}

impl NsMode {
    /// The mode for the user's flag and the environment's override; the
    /// override and the flag together are a contradiction, refused.
    pub fn from_flags(require: bool, disabled_by_env: bool) -> Result<NsMode, &'static str> {
        match (require, disabled_by_env) {
            (true, true) => Err("--require-namespaces, but AIRLOCK_NO_NAMESPACES=1 disables namespaces"),
            (true, false) => Ok(NsMode::Require),
            (false, true) => Ok(NsMode::Off),
            (false, false) => Ok(NsMode::Try),
        }
    }
}

/// The size of the private `/tmp`, in bytes.
pub const DEFAULT_TMP_SIZE: u64 = 64 << 20;
/// The size of the private `/dev/shm` (POSIX shared memory, semaphores:
/// `multiprocessing` needs it), in bytes.
pub const DEFAULT_SHM_SIZE: u64 = 64 << 20;
/// The size of the view's root tmpfs: it holds only mount points and
/// empty directories, and is read-only once built.
pub const ROOT_TMPFS_SIZE: u64 = 1 << 20;
/// The hostname inside the UTS namespace.
pub const HOSTNAME: &str = "airlock";

/// System locations bound read-only (symlinks, as `/bin` on a merged-usr
/// system, are recreated as symlinks). `/etc` is in the view but not in
/// the Landlock rules: Landlock still grants only the loader's cache
/// there.
pub const SYSTEM_BINDS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

/// The devices bound into the private `/dev`.
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/tty"];

/// Where the session's socket is in the view: outside the private `/tmp`
/// (whose Landlock rule grants everything beneath it), in a directory of
/// the read-only root that holds nothing else.
pub const SESSION_SOCKET_IN_VIEW: &str = "/run/airlock/session";

/// The symlinks of a usual `/dev`.
pub const DEV_LINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// One step of building the view, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Mount {
    /// Bind the host's `path` at the same path. A missing path is skipped
    /// unless `required`; a symlink is recreated as a symlink. Writable:
    /// `nosuid,nodev`; read-only: `ro,nosuid`.
    Bind { path: PathBuf, writable: bool, required: bool },
    /// Bind the host's device `path` at the same path, read-write,
    /// `nosuid`; skipped when missing.
    Device { path: PathBuf },
    /// Bind the host's socket `source` alone at `path`, `ro,nosuid,nodev`
    /// (a connect needs no write access to the mount): the session's own.
    Socket { source: PathBuf, path: PathBuf },
    /// A fresh tmpfs of `size` bytes with permission bits `mode`.
    Tmpfs { path: PathBuf, size: u64, mode: u32 },
    /// A fresh procfs for the PID namespace.
    Proc { path: PathBuf },
    /// A symlink to `target`.
    Symlink { path: PathBuf, target: PathBuf },
    /// An empty directory, unless something already lies there.
    Dir { path: PathBuf },
}

impl Mount {
    pub fn path(&self) -> &Path {
        match self {
            Mount::Bind { path, .. }
            | Mount::Device { path }
            | Mount::Socket { path, .. }
            | Mount::Tmpfs { path, .. }
            | Mount::Proc { path }
            | Mount::Symlink { path, .. }
            | Mount::Dir { path } => path,
        }
    }
}

/// The whole view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub mounts: Vec<Mount>,
    /// Secret files masked, protected paths kept read-only and git
    /// directories pinned in the trees granted directly (see
    /// [`super::guarded`]), mounted after `mounts`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<super::Cover>,
    /// The working directory inside.
    pub cwd: PathBuf,
    pub hostname: String,
    pub root_size: u64,
}

/// What a view is computed from.
#[derive(Clone, Debug, Default)]
pub struct ViewInputs {
    /// Bound read-only, required (`--sandbox-ro`, a tool's read root).
    pub read_only: Vec<PathBuf>,
    /// Bound read-write, required (a tool runner's work dir).
    pub read_write: Vec<PathBuf>,
    /// The airlock binary.
    pub airlock: Option<PathBuf>,
    /// The working directory (absolute).
    pub cwd: PathBuf,
    pub tmp_size: u64,
    pub shm_size: u64,
}

impl ViewInputs {
    pub fn new(cwd: PathBuf) -> Self {
        ViewInputs { cwd, tmp_size: DEFAULT_TMP_SIZE, shm_size: DEFAULT_SHM_SIZE, ..ViewInputs::default() }
    }
}

/// The view for `inputs`. Order matters and is fixed: system binds, `/dev`
/// and its devices, the private tmpfs mounts, `/proc`, then the granted
/// paths shallowest first (so a grant beneath `/tmp` lands on top of the
/// private `/tmp`, and a read-write path beneath a read-only one stays
/// writable), the airlock binary, and last the working directory.
pub fn view(inputs: &ViewInputs) -> View {
    let mut mounts = Vec::new();
    for p in SYSTEM_BINDS {
        mounts.push(Mount::Bind { path: PathBuf::from(p), writable: false, required: false });
    }
    mounts.push(Mount::Tmpfs { path: PathBuf::from("/dev"), size: ROOT_TMPFS_SIZE, mode: 0o755 });
    for d in DEVICES {
        mounts.push(Mount::Device { path: PathBuf::from(d) });
    }
    for (path, target) in DEV_LINKS {
        mounts.push(Mount::Symlink { path: PathBuf::from(path), target: PathBuf::from(target) });
    }
    mounts.push(Mount::Tmpfs { path: PathBuf::from("/dev/shm"), size: inputs.shm_size, mode: 0o1777 });
    mounts.push(Mount::Tmpfs { path: PathBuf::from("/tmp"), size: inputs.tmp_size, mode: 0o1777 });
    mounts.push(Mount::Proc { path: PathBuf::from("/proc") });
    let mut grants: Vec<(&PathBuf, bool)> = inputs
        .read_only
        .iter()
        .map(|p| (p, false))
        .chain(inputs.read_write.iter().map(|p| (p, true)))
        .collect();
    grants.sort_by_key(|(p, w)| (p.components().count(), (*p).clone(), *w));
    grants.dedup();
    for (path, writable) in grants {
        mounts.push(Mount::Bind { path: path.clone(), writable, required: true });
    }
    if let Some(exe) = &inputs.airlock {
        mounts.push(Mount::Bind { path: exe.clone(), writable: false, required: true });
    }
    mounts.push(Mount::Dir { path: inputs.cwd.clone() });
    View {
        mounts,
        covers: Vec::new(),
        cwd: inputs.cwd.clone(),
        hostname: HOSTNAME.to_owned(),
        root_size: ROOT_TMPFS_SIZE,
    }
}

impl View {
    /// Add the session's socket `source` (a host path), bound alone at
    /// [`SESSION_SOCKET_IN_VIEW`] after the system binds and the private
    /// mounts, before the grants: a grant cannot be beneath `/run`, which
    /// the view does not have.
    pub fn add_session_socket(&mut self, source: PathBuf) {
        let path = PathBuf::from(SESSION_SOCKET_IN_VIEW);
        self.mounts.retain(|m| m.path() != path);
        let at = self.mounts.iter().position(|m| matches!(m, Mount::Proc { .. })).map_or(0, |i| i + 1);
        self.mounts.insert(at, Mount::Socket { source, path });
    }

    /// The session's socket in the view, when it has one.
    pub fn session_socket(&self) -> Option<&Path> {
        self.mounts.iter().find_map(|m| match m {
            Mount::Socket { path, .. } => Some(path.as_path()),
            _ => None,
        })
    }
}

/// The directories a Landlock ruleset must grant read-write inside the
/// view: the private tmpfs mounts, which exist only there.
pub fn private_dirs(view: &View) -> Vec<PathBuf> {
    view.mounts
        .iter()
        .filter_map(|m| match m {
            Mount::Tmpfs { path, mode, .. } if mode & 0o1000 != 0 => Some(path.clone()),
            _ => None,
        })
        .collect()
}
