//! The session's bounds on the host: its cgroups made, set, swept when a
//! dead session left them, and removed at the end; the host's size and the
//! user's tasks read. What to make, where, and what each outcome means is
//! decided in `airlock_core::sandbox::bounds`; this only probes and
//! writes, and a step the system refuses makes the bound fall back.

use airlock_core::sandbox::bounds::{self, Bound, Group, GroupPlan, Host, Limits, SessionBounds, Version};
use airlock_core::sandbox::sweep;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the processes left in a group may take to die and the group
/// to go.
const REMOVE_WITHIN: Duration = Duration::from_secs(2);

/// The host's memory and the CPUs this process may use. `sysinfo(2)`,
/// not `/proc/meminfo`: a nested airlock's view has no `/proc` to read.
pub fn host() -> Host {
    // SAFETY: sysinfo fills the struct we own; zeroed is a valid value.
    let memory = unsafe {
        let mut info: libc::sysinfo = std::mem::zeroed();
        if libc::sysinfo(&mut info) == 0 {
            // `c_ulong`: 32 bits on some targets.
            #[allow(clippy::useless_conversion)]
            let total = u64::from(info.totalram);
            total.saturating_mul(u64::from(info.mem_unit.max(1)))
        } else {
            0
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    Host { memory, cpus }
}

/// Tasks (threads included) whose real uid is `uid`, counted now.
fn user_tasks(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0u64;
    for e in entries.flatten() {
        if !e.file_name().as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else { continue };
        let field =
            |k: &str| status.lines().find_map(|l| l.strip_prefix(k).map(str::trim).map(str::to_owned));
        let real =
            field("Uid:").and_then(|u| u.split_whitespace().next().and_then(|x| x.parse::<u32>().ok()));
        if real == Some(uid) {
            n += field("Threads:").and_then(|t| t.parse().ok()).unwrap_or(1);
        }
    }
    n
}

/// The session's bounds for the stage: `limits`, and the groups that
/// could be made for them, which the returned guard removes (call
/// [`Groups::finish`] to learn what was reached first).
pub(super) fn session(limits: Limits) -> (SessionBounds, Groups) {
    // SAFETY: getuid takes nothing.
    let uid = unsafe { libc::getuid() };
    let groups = make(&limits);
    let guard = Groups(groups.clone());
    (SessionBounds { limits, groups, root: uid == 0, user_tasks: user_tasks(uid) }, guard)
}

/// Bound a process airlock starts with the default limits for this host:
/// `airlock tool`'s tool and its programs, `toolexec serve`'s tools. Keep
/// the guard as long as the process runs.
pub(super) fn bound(plan: &mut airlock_core::sandbox::Confinement) -> Groups {
    let Ok(limits) = bounds::limits(&bounds::Asked::default(), &host()) else { return Groups::default() };
    let (b, guard) = session(limits);
    plan.bounds = Some(b);
    guard
}

/// A session's cgroups: removed, with whatever still runs in them, when
/// dropped.
#[derive(Debug, Default)]
pub struct Groups(Vec<Group>);

impl Groups {
    /// The bounds the session reached; the groups are gone afterwards.
    pub fn finish(&mut self) -> Vec<Bound> {
        finish(&std::mem::take(&mut self.0))
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        self.finish();
    }
}

fn make(limits: &Limits) -> Vec<Group> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else { return Vec::new() };
    let mounts = bounds::cgroup_mounts(&mountinfo);
    let v2 = mounts
        .iter()
        .find(|m| m.version == Version::V2)
        .and_then(|m| std::fs::read_to_string(m.point.join("cgroup.controllers")).ok());
    let placements = bounds::placements(&mounts, &own, v2.as_deref());
    bounds::group_plans(&placements, limits).iter().filter_map(make_one).collect()
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The group for `plan` under the first parent where every step works.
fn make_one(plan: &GroupPlan) -> Option<Group> {
    let me = super::sweep::me();
    for parent in &plan.parents {
        sweep_parent(parent);
        if plan.version == Version::V2 && !enable(parent, &plan.enable) {
            continue;
        }
        let dir = parent.join(sweep::name(me, &format!("{:x}", NEXT.fetch_add(1, Ordering::Relaxed))));
        if std::fs::create_dir(&dir).is_err() {
            continue;
        }
        let set =
            plan.settings.iter().all(|s| std::fs::write(dir.join(s.file), &s.value).is_ok() || !s.required);
        // The stage must be able to enter it, which the system decides
        // for the writer: an ordinary user needs the group's and the
        // common ancestor's `cgroup.procs` writable.
        if set && writable(&dir.join("cgroup.procs")) {
            return Some(Group { dir, version: plan.version, bounds: plan.bounds.clone() });
        }
        let _ = std::fs::remove_dir(&dir);
    }
    None
}

fn writable(p: &Path) -> bool {
    rustix::fs::access(p, rustix::fs::Access::WRITE_OK).is_ok()
}

/// v2: switch `controllers` on for the children of `parent` (those it
/// lacks); refused where `parent` holds processes (not the root) or is
/// not ours.
fn enable(parent: &Path, controllers: &[&str]) -> bool {
    let file = parent.join("cgroup.subtree_control");
    let on = std::fs::read_to_string(&file).unwrap_or_default();
    controllers
        .iter()
        .all(|c| on.split_whitespace().any(|x| x == *c) || std::fs::write(&file, format!("+{c}")).is_ok())
}

/// Remove the groups in `parent` that dead sessions left (a SIGKILLed
/// airlock cleans nothing up), killing what still runs in them.
fn sweep_parent(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for e in entries.flatten() {
        let Some(owner) = e.file_name().to_str().and_then(sweep::owner) else { continue };
        if sweep::is_stale(owner, super::sweep::running_start(owner.pid)) && remove(&e.path()) {
            tracing::debug!("removed the cgroup {}, left by a session that is gone", e.path().display());
        }
    }
}

/// Kill what runs in `dir` and remove it; whether it went.
fn remove(dir: &Path) -> bool {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + REMOVE_WITHIN;
    loop {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill(2) takes integers; the pid is in the session's group.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if std::fs::remove_dir(dir).is_ok() {
            return true;
        }
        if Instant::now() > deadline {
            tracing::warn!("the cgroup {} could not be removed", dir.display());
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// At the session's end: which bounds it reached, then its groups killed
/// and removed.
fn finish(groups: &[Group]) -> Vec<Bound> {
    let mut hit = Vec::new();
    for g in groups {
        for b in &g.bounds {
            let (file, _) = bounds::event_counter(g.version, *b);
            let text = std::fs::read_to_string(g.dir.join(file)).unwrap_or_default();
            if bounds::was_hit(g.version, *b, &text) {
                hit.push(*b);
            }
        }
        remove(&g.dir);
    }
    hit.sort();
    hit
}
