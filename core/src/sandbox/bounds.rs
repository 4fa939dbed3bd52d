//! What the session's processes may take: how many processes (threads
//! count), how much memory, how much CPU. Decided here from the user's
//! flags, the host's size and what the system offers; the shell probes and
//! writes, the confinement stage joins.
//!
//! The strongest means first: a cgroup per session (v2 where the
//! controller is attached to it, v1 otherwise), found from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`, made beneath the
//! airlock's own cgroup or the nearest ancestor where the system lets this
//! user make one (root always can; a systemd user session delegates its
//! own subtree). A bound with no cgroup falls back to an rlimit where one
//! means something: `RLIMIT_NPROC` counts the tasks of one user in one
//! user namespace, so with namespaces it bounds the session exactly, and
//! without them only together with the user's other processes (and never
//! root's); `RLIMIT_AS` bounds each process, not their sum; nothing
//! bounds CPU. What is weaker than asked is listed in the report's
//! `not_enforced` by name.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// `--max-processes`, by default.
pub const DEFAULT_MAX_PROCESSES: u64 = 1024;
/// The fewest processes a session may be given: the confinement stage,
/// its init, the child and a few of its own.
pub const MIN_PROCESSES: u64 = 8;
/// The least memory a session may be given: the stage and a shell.
pub const MIN_MEMORY: u64 = 16 << 20;
/// The share of the host's memory a session gets by default: half.
pub const DEFAULT_MEMORY_SHARE: u64 = 2;
/// The CPU quota's period, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// One kind of bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    Processes,
    Memory,
    Cpu,
}

impl Bound {
    pub const ALL: [Bound; 3] = [Bound::Processes, Bound::Memory, Bound::Cpu];

    /// The cgroup controller that enforces it (the same name in v1 and v2).
    pub fn controller(self) -> &'static str {
        match self {
            Bound::Processes => "pids",
            Bound::Memory => "memory",
            Bound::Cpu => "cpu",
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Bound::Processes => "--max-processes",
            Bound::Memory => "--max-memory",
            Bound::Cpu => "--max-cpu",
        }
    }
}

/// The bounds in force for one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Processes and threads at once.
    pub processes: u64,
    /// Bytes of memory (swap included where the system accounts it).
    pub memory: u64,
    /// Percent of one CPU (200: two CPUs' worth).
    pub cpu_percent: u32,
}

/// What the user asked for; `None` takes the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub processes: Option<u64>,
    pub memory: Option<u64>,
    pub cpu_percent: Option<u32>,
}

/// The host's size, as the shell reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    /// Bytes of physical memory.
    pub memory: u64,
    /// CPUs this process may run on.
    pub cpus: u32,
}

/// A bound that cannot be honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundError {
    TooFewProcesses { asked: u64 },
    TooLittleMemory { asked: u64 },
    NoCpu,
}

impl fmt::Display for BoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundError::TooFewProcesses { asked } => {
                write!(f, "--max-processes {asked}: at least {MIN_PROCESSES} (airlock's own stage counts)")
            }
            BoundError::TooLittleMemory { asked } => {
                write!(f, "--max-memory {asked}: at least {MIN_MEMORY} bytes")
            }
            BoundError::NoCpu => write!(f, "--max-cpu 0: at least 1 (percent of one CPU)"),
        }
    }
}

impl std::error::Error for BoundError {}

/// The default CPU bound: every CPU but one, and at least one.
pub fn default_cpu_percent(cpus: u32) -> u32 {
    cpus.saturating_sub(1).max(1).saturating_mul(100)
}

/// The limits for `asked` on `host`.
pub fn limits(asked: &Asked, host: &Host) -> Result<Limits, BoundError> {
    let processes = asked.processes.unwrap_or(DEFAULT_MAX_PROCESSES);
    if processes < MIN_PROCESSES {
        return Err(BoundError::TooFewProcesses { asked: processes });
    }
    let memory = asked.memory.unwrap_or((host.memory / DEFAULT_MEMORY_SHARE).max(MIN_MEMORY));
    if memory < MIN_MEMORY {
        return Err(BoundError::TooLittleMemory { asked: memory });
    }
    let cpu_percent = asked.cpu_percent.unwrap_or_else(|| default_cpu_percent(host.cpus));
    if cpu_percent == 0 {
        return Err(BoundError::NoCpu);
    }
    Ok(Limits { processes, memory, cpu_percent })
}

/// A byte count as a user writes it: digits, optionally followed by `K`,
/// `M`, `G` or `T` (powers of 1024, with or without `i` and `B`), or `B`.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || format!("{text:?}: want a number of bytes, such as 4294967296, 512M or 4G");
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

// ------------------------------------------------------------ cgroups

/// A cgroup hierarchy's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Version {
    V1,
    V2,
}

/// A cgroup file system mounted on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    pub version: Version,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The cgroup the mount shows as its root (`/` unless a container
    /// mounted a subtree).
    pub root: PathBuf,
    /// v1: the controllers of the hierarchy (`cpu`, `cpuacct`, a `name=`).
    pub controllers: Vec<String>,
}

/// The cgroup mounts in a `/proc/self/mountinfo` text.
pub fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        let version = match r[0] {
            "cgroup2" => Version::V2,
            "cgroup" => Version::V1,
            _ => continue,
        };
        let controllers = match version {
            Version::V2 => Vec::new(),
            Version::V1 => r[2].split(',').filter(|o| *o != "rw" && *o != "ro").map(str::to_owned).collect(),
        };
        out.push(CgroupMount {
            version,
            point: PathBuf::from(unescape(l[4])),
            root: PathBuf::from(unescape(l[3])),
            controllers,
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = b[i + 1..i + 4].iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where this process is in one hierarchy: the hierarchy, its own cgroup
/// there (absolute), and the bounds airlock may use it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub version: Version,
    pub mount: PathBuf,
    /// This process's cgroup directory.
    pub own: PathBuf,
    pub bounds: Vec<Bound>,
}

/// Where each bound would be enforced: from the mounts, the text of
/// `/proc/self/cgroup`, and the controllers the v2 hierarchy's root offers
/// (its `cgroup.controllers`, `None` without one). A controller attached
/// to v2 is used there; else in the v1 hierarchy that has it.
pub fn placements(mounts: &[CgroupMount], proc_cgroup: &str, v2_controllers: Option<&str>) -> Vec<Placement> {
    let mut out: Vec<Placement> = Vec::new();
    let v2_has: Vec<&str> = v2_controllers.map(|t| t.split_whitespace().collect()).unwrap_or_default();
    let mut taken: Vec<Bound> = Vec::new();
    // v2 first.
    if let (Some(m), Some(path)) = (
        mounts.iter().find(|m| m.version == Version::V2),
        proc_cgroup.lines().find_map(|l| l.strip_prefix("0::")),
    ) {
        let bounds: Vec<Bound> =
            Bound::ALL.into_iter().filter(|b| v2_has.contains(&b.controller())).collect();
        if !bounds.is_empty() {
            taken.extend(&bounds);
            out.push(Placement {
                version: Version::V2,
                mount: m.point.clone(),
                own: own_dir(m, path),
                bounds,
            });
        }
    }
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(list), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if list.is_empty() {
            continue;
        }
        let names: Vec<&str> = list.split(',').collect();
        let Some(m) = mounts.iter().find(|m| {
            m.version == Version::V1
                && names.iter().all(|n| m.controllers.iter().any(|c| c == n))
                && m.controllers.len() == names.len()
        }) else {
            continue;
        };
        let bounds: Vec<Bound> = Bound::ALL
            .into_iter()
            .filter(|b| names.contains(&b.controller()) && !taken.contains(b))
            .collect();
        if bounds.is_empty() {
            continue;
        }
        taken.extend(&bounds);
        out.push(Placement { version: Version::V1, mount: m.point.clone(), own: own_dir(m, path), bounds });
    }
    out.sort_by_key(|p| p.bounds.first().copied());
    out
}

fn own_dir(m: &CgroupMount, path: &str) -> PathBuf {
    let p = Path::new(path);
    // Without a cgroup namespace the path is from the hierarchy's top;
    // a mount of a subtree shows that subtree as its root.
    let rel = p.strip_prefix(&m.root).unwrap_or(p);
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    if rel.as_os_str().is_empty() {
        m.point.clone()
    } else {
        m.point.join(rel)
    }
}

/// One file to write in a session's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub file: &'static str,
    pub value: String,
    /// Without it the bound is not in force (an optional one, such as
    /// swap, may be missing where the system does not account it).
    pub required: bool,
}

/// How the shell makes a session's group in one hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPlan {
    pub version: Version,
    pub bounds: Vec<Bound>,
    /// Parents to try, in order: the own cgroup, then its ancestors up to
    /// the hierarchy's top. The first where every step works is used.
    pub parents: Vec<PathBuf>,
    /// v2: the controllers to switch on in the parent's
    /// `cgroup.subtree_control` first (those it lacks).
    pub enable: Vec<&'static str>,
    /// Written in order once the group exists.
    pub settings: Vec<Setting>,
}

/// The groups to make for `limits`, one per hierarchy used.
pub fn group_plans(placements: &[Placement], limits: &Limits) -> Vec<GroupPlan> {
    placements
        .iter()
        .map(|p| {
            let mut parents = Vec::new();
            let mut at = Some(p.own.as_path());
            while let Some(dir) = at {
                if !dir.starts_with(&p.mount) {
                    break;
                }
                parents.push(dir.to_path_buf());
                at = dir.parent();
            }
            let enable = match p.version {
                Version::V2 => p.bounds.iter().map(|b| b.controller()).collect(),
                Version::V1 => Vec::new(),
            };
            let settings = p.bounds.iter().flat_map(|b| settings(p.version, *b, limits)).collect();
            GroupPlan { version: p.version, bounds: p.bounds.clone(), parents, enable, settings }
        })
        .collect()
}

/// The files that set `bound` to `limits` in a group of `version`.
pub fn settings(version: Version, bound: Bound, limits: &Limits) -> Vec<Setting> {
    let req = |file, value: String| Setting { file, value, required: true };
    let opt = |file, value: String| Setting { file, value, required: false };
    let quota = u64::from(limits.cpu_percent) * CPU_PERIOD_US / 100;
    match (version, bound) {
        (_, Bound::Processes) => vec![req("pids.max", limits.processes.to_string())],
        (Version::V2, Bound::Memory) => {
            vec![req("memory.max", limits.memory.to_string()), opt("memory.swap.max", "0".into())]
        }
        (Version::V1, Bound::Memory) => vec![
            req("memory.limit_in_bytes", limits.memory.to_string()),
            // Memory and swap together: no more than the memory alone.
            opt("memory.memsw.limit_in_bytes", limits.memory.to_string()),
        ],
        (Version::V2, Bound::Cpu) => vec![req("cpu.max", format!("{quota} {CPU_PERIOD_US}"))],
        (Version::V1, Bound::Cpu) => vec![
            req("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
            req("cpu.cfs_quota_us", quota.to_string()),
        ],
    }
}

/// The file whose counter says the bound was reached, and the counter.
pub fn event_counter(version: Version, bound: Bound) -> (&'static str, &'static str) {
    match (version, bound) {
        (_, Bound::Processes) => ("pids.events", "max"),
        (Version::V2, Bound::Memory) => ("memory.events", "oom_kill"),
        (Version::V1, Bound::Memory) => ("memory.oom_control", "oom_kill"),
        (_, Bound::Cpu) => ("cpu.stat", "nr_throttled"),
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
pub fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Whether `bound` was reached, from its event file's text: a fork or
/// clone refused at the process bound, a process the kernel killed at the
/// memory bound, the session held back at the CPU bound.
pub fn was_hit(version: Version, bound: Bound, text: &str) -> bool {
    counter(text, event_counter(version, bound).1).is_some_and(|n| n > 0)
}

// ------------------------------------------------------- the session

/// A group the shell made for the session, and what it bounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub dir: PathBuf,
    pub version: Version,
    pub bounds: Vec<Bound>,
}

/// The session's bounds as the confinement stage receives them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBounds {
    pub limits: Limits,
    /// The groups the stage joins before anything is forked.
    pub groups: Vec<Group>,
    /// The caller is root (uid 0): `RLIMIT_NPROC` does not hold for it.
    pub root: bool,
    /// Tasks the user runs at start: the base of a shared
    /// `RLIMIT_NPROC` without a user namespace.
    pub user_tasks: u64,
}

/// A resource limit the payload sets on itself before exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rlimit {
    /// `RLIMIT_NPROC`.
    Nproc(u64),
    /// `RLIMIT_AS`.
    As(u64),
}

/// How one bound is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// A cgroup of the session's own: exact, for all of it.
    CgroupV1,
    CgroupV2,
    /// `RLIMIT_NPROC` in the session's own user namespace: exact.
    RlimitSession,
    /// `RLIMIT_NPROC` without a user namespace: the session together
    /// with every other process of the user.
    RlimitUser,
    /// `RLIMIT_AS`: each process alone.
    RlimitProcess,
    /// Nothing.
    None,
}

/// One bound in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Enforced {
    pub max: u64,
    pub by: By,
}

/// The report's `sandbox.bounds`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BoundsInForce {
    pub processes: Enforced,
    /// Bytes.
    pub memory: Enforced,
    /// Percent of one CPU.
    pub cpu: Enforced,
    /// The bounds the session reached (known where a cgroup counts it).
    pub hit: Vec<Bound>,
}

impl SessionBounds {
    /// How each bound is enforced once the stage joined `joined` (the
    /// bounds of the groups it could enter) with or without a user
    /// namespace, the rlimits the payload sets for the rest, and the
    /// report's names for what is weaker than asked.
    pub fn enforcement(
        &self,
        joined: &[Bound],
        user_ns: bool,
    ) -> (BoundsInForce, Vec<Rlimit>, Vec<&'static str>) {
        let by_group = |b: Bound| {
            self.groups.iter().find(|g| g.bounds.contains(&b) && joined.contains(&b)).map(|g| {
                match g.version {
                    Version::V1 => By::CgroupV1,
                    Version::V2 => By::CgroupV2,
                }
            })
        };
        let l = self.limits;
        let mut rlimits = Vec::new();
        let mut gaps = Vec::new();
        let processes = match by_group(Bound::Processes) {
            Some(by) => by,
            // The kernel never holds root to RLIMIT_NPROC.
            None if self.root => {
                gaps.push("max_processes");
                By::None
            }
            None if user_ns => {
                rlimits.push(Rlimit::Nproc(l.processes));
                By::RlimitSession
            }
            None => {
                rlimits.push(Rlimit::Nproc(l.processes.saturating_add(self.user_tasks)));
                gaps.push("max_processes_per_session");
                By::RlimitUser
            }
        };
        let memory = match by_group(Bound::Memory) {
            Some(by) => by,
            None => {
                rlimits.push(Rlimit::As(l.memory));
                gaps.push("max_memory_per_session");
                By::RlimitProcess
            }
        };
        let cpu = match by_group(Bound::Cpu) {
            Some(by) => by,
            None => {
                gaps.push("max_cpu");
                By::None
            }
        };
        let f = BoundsInForce {
            processes: Enforced { max: l.processes, by: processes },
            memory: Enforced { max: l.memory, by: memory },
            cpu: Enforced { max: u64::from(l.cpu_percent), by: cpu },
            hit: Vec::new(),
        };
        (f, rlimits, gaps)
    }
}

/// What airlock says on stderr for a bound the session reached.
pub fn hit_message(bound: Bound, limits: &Limits) -> String {
    match bound {
        Bound::Processes => format!(
            "airlock: the session reached {} {}: a fork or clone past it was refused",
            bound.flag(),
            limits.processes
        ),
        Bound::Memory => format!(
            "airlock: the session reached {} {} bytes: the kernel killed a process of it that wanted more",
            bound.flag(),
            limits.memory
        ),
        Bound::Cpu => format!(
            "airlock: the session reached {} {}: it was held back to that share of the CPU",
            bound.flag(),
            limits.cpu_percent
        ),
    }
}
