//! The session's bounds: defaults, what the user may ask, where each bound
//! is enforced on the systems airlock meets, and what is reported.

use super::bounds::*;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

const GIB: u64 = 1 << 30;

fn host() -> Host {
    Host { memory: 24 * GIB, cpus: 2 }
}

#[test]
fn defaults_keep_a_host_usable() {
    let l = limits(&Asked::default(), &host()).unwrap();
    assert_eq!(l, Limits { processes: 1024, memory: 12 * GIB, cpu_percent: 100 });
    assert_eq!(default_cpu_percent(1), 100);
    assert_eq!(default_cpu_percent(8), 700);
    // A host too small for half its memory still gets the least.
    let tiny = limits(&Asked::default(), &Host { memory: 0, cpus: 1 }).unwrap();
    assert_eq!(tiny.memory, MIN_MEMORY);
}

#[test]
fn bounds_too_small_to_run_anything_are_refused_naming_the_flag() {
    let h = host();
    let err = limits(&Asked { processes: Some(2), ..Asked::default() }, &h).unwrap_err();
    assert!(err.to_string().contains("--max-processes 2"), "{err}");
    let err = limits(&Asked { memory: Some(1 << 20), ..Asked::default() }, &h).unwrap_err();
    assert!(err.to_string().contains("--max-memory"), "{err}");
    let err = limits(&Asked { cpu_percent: Some(0), ..Asked::default() }, &h).unwrap_err();
    assert!(err.to_string().contains("--max-cpu 0"), "{err}");
}

#[test]
fn byte_counts_take_units() {
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert_eq!(parse_bytes("512M"), Ok(512 << 20));
    assert_eq!(parse_bytes("4GiB"), Ok(4 * GIB));
    assert_eq!(parse_bytes(" 2g "), Ok(2 * GIB));
    assert_eq!(parse_bytes("1T"), Ok(1 << 40));
    for bad in ["", "M", "4X", "-1", "1.5G", "99999999999999999999", "20000000T"] {
        assert!(parse_bytes(bad).is_err(), "{bad}");
    }
}

proptest! {
    #[test]
    fn any_text_parses_or_is_refused_without_panicking(t in ".{0,24}") {
        let _ = parse_bytes(&t);
    }

    #[test]
    fn a_count_with_a_unit_is_that_many_units(n in 0u64..1_000_000, unit in 0usize..5) {
        let (suffix, shift) = [("", 0), ("K", 10), ("M", 20), ("G", 30), ("T", 40)][unit];
        prop_assert_eq!(parse_bytes(&format!("{n}{suffix}")), Ok(n << shift));
    }
}

/// This project's machine: v1 controllers each at /sys/fs/cgroup/<ctrl>
/// (cpu and cpuacct apart), memory in a nested group, and a cgroup2 mount
/// at /sys/fs/cgroup/unified with none of them.
const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/b06b
2:cpuacct:/
1:cpu:/
0::/
";

#[test]
fn a_hybrid_host_uses_each_v1_hierarchy() {
    let mounts = cgroup_mounts(HYBRID_MOUNTINFO);
    assert_eq!(mounts.len(), 6);
    let p = placements(&mounts, HYBRID_CGROUP, Some("hugetlb\n"));
    assert_eq!(
        p,
        vec![
            Placement {
                version: Version::V1,
                mount: PathBuf::from("/sys/fs/cgroup/pids"),
                own: PathBuf::from("/sys/fs/cgroup/pids"),
                bounds: vec![Bound::Processes],
            },
            Placement {
                version: Version::V1,
                mount: PathBuf::from("/sys/fs/cgroup/memory"),
                own: PathBuf::from("/sys/fs/cgroup/memory/process_api/b06b"),
                bounds: vec![Bound::Memory],
            },
            Placement {
                version: Version::V1,
                mount: PathBuf::from("/sys/fs/cgroup/cpu"),
                own: PathBuf::from("/sys/fs/cgroup/cpu"),
                bounds: vec![Bound::Cpu],
            },
        ]
    );
    let l = Limits { processes: 40, memory: 64 << 20, cpu_percent: 30 };
    let plans = group_plans(&p, &l);
    assert_eq!(
        plans[1].parents,
        vec![
            PathBuf::from("/sys/fs/cgroup/memory/process_api/b06b"),
            PathBuf::from("/sys/fs/cgroup/memory/process_api"),
            PathBuf::from("/sys/fs/cgroup/memory"),
        ]
    );
    assert!(plans.iter().all(|g| g.enable.is_empty()));
    let files: Vec<_> = plans[2].settings.iter().map(|s| (s.file, s.value.as_str())).collect();
    assert_eq!(files, vec![("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "30000")]);
}

/// An ordinary distribution: one cgroup2 mount with every controller,
/// airlock in a systemd user session's scope (which holds processes: the
/// delegated `app.slice` above it is where a group can be made).
#[test]
fn a_pure_v2_host_uses_one_group_and_walks_up_from_the_scope() {
    let mountinfo = "25 21 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    let own = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n";
    let p = placements(&cgroup_mounts(mountinfo), own, Some("cpuset cpu io memory hugetlb pids rdma misc\n"));
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].bounds, Bound::ALL.to_vec());
    let l = Limits { processes: 1024, memory: GIB, cpu_percent: 150 };
    let plan = &group_plans(&p, &l)[0];
    assert_eq!(
        plan.parents.first().unwrap(),
        Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope")
    );
    assert_eq!(
        plan.parents[1],
        Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice")
    );
    assert_eq!(plan.parents.last().unwrap(), Path::new("/sys/fs/cgroup"));
    assert_eq!(plan.enable, vec!["pids", "memory", "cpu"]);
    let files: Vec<_> = plan.settings.iter().map(|s| (s.file, s.value.as_str(), s.required)).collect();
    assert_eq!(
        files,
        vec![
            ("pids.max", "1024", true),
            ("memory.max", "1073741824", true),
            ("memory.swap.max", "0", false),
            ("cpu.max", "150000 100000", true),
        ]
    );
}

#[test]
fn a_container_mounting_a_subtree_and_escaped_names_are_understood() {
    let mountinfo = "30 25 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup ro\n\
                     31 25 0:27 / /mnt/with\\040space rw - cgroup cgroup rw,pids\n";
    let mounts = cgroup_mounts(mountinfo);
    assert_eq!(mounts[1].point, Path::new("/mnt/with space"));
    let p = placements(&mounts, "0::/docker/abc/inner\n3:pids:/x\n", Some("pids memory"));
    assert_eq!(p[0].own, Path::new("/sys/fs/cgroup/inner"));
    assert_eq!(p[0].bounds, vec![Bound::Processes, Bound::Memory]);
    // pids is v2's; cpu is nowhere.
    assert_eq!(p.len(), 1);
    assert!(placements(&[], "garbage", None).is_empty());
    assert!(cgroup_mounts("garbage\n - \n1 2 3").is_empty());
}

#[test]
fn counters_say_what_was_reached() {
    assert!(was_hit(Version::V2, Bound::Processes, "max 3\n"));
    assert!(!was_hit(Version::V2, Bound::Processes, "max 0\n"));
    assert!(was_hit(Version::V2, Bound::Memory, "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n"));
    assert!(!was_hit(Version::V2, Bound::Memory, "max 9\noom_kill 0\n"));
    assert!(was_hit(Version::V1, Bound::Memory, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"));
    assert!(was_hit(Version::V1, Bound::Cpu, "nr_periods 10\nnr_throttled 4\nthrottled_time 5\n"));
    assert!(!was_hit(Version::V1, Bound::Cpu, ""));
}

proptest! {
    /// Every bound is enforced by exactly one means, and is listed as not
    /// enforced exactly when that means is weaker than a cgroup of its
    /// own (or there is none); root never relies on RLIMIT_NPROC.
    #[test]
    fn every_bound_is_enforced_or_listed(
        joined_mask in 0u8..8, group_mask in 0u8..8, v2 in any::<bool>(),
        root in any::<bool>(), user_ns in any::<bool>(), tasks in 0u64..10_000,
    ) {
        let l = Limits { processes: 100, memory: GIB, cpu_percent: 50 };
        let pick = |m: u8| -> Vec<Bound> { Bound::ALL.into_iter().enumerate().filter(|(i, _)| m & (1 << i) != 0).map(|(_, b)| b).collect() };
        let version = if v2 { Version::V2 } else { Version::V1 };
        let groups = vec![Group { dir: PathBuf::from("/g"), version, bounds: pick(group_mask) }];
        let s = SessionBounds { limits: l, groups, root, user_tasks: tasks };
        let joined = pick(joined_mask);
        let (f, rlimits, gaps) = s.enforcement(&joined, user_ns);
        for (b, e) in [(Bound::Processes, f.processes), (Bound::Memory, f.memory), (Bound::Cpu, f.cpu)] {
            let cgroup = pick(group_mask).contains(&b) && joined.contains(&b);
            prop_assert_eq!(matches!(e.by, By::CgroupV1 | By::CgroupV2), cgroup);
            let listed = gaps.iter().any(|g| g.starts_with(&format!("max_{}", match b { Bound::Processes => "processes", Bound::Memory => "memory", Bound::Cpu => "cpu" })));
            let exact = cgroup || e.by == By::RlimitSession;
            prop_assert_eq!(listed, !exact, "{:?} {:?} {:?}", b, e, gaps);
        }
        prop_assert_eq!(rlimits.iter().any(|r| matches!(r, Rlimit::Nproc(_))), matches!(f.processes.by, By::RlimitSession | By::RlimitUser));
        prop_assert!(!(root && matches!(f.processes.by, By::RlimitSession | By::RlimitUser)));
        if f.processes.by == By::RlimitUser {
            prop_assert!(rlimits.contains(&Rlimit::Nproc(100 + tasks)));
        }
        prop_assert_eq!(rlimits.contains(&Rlimit::As(GIB)), f.memory.by == By::RlimitProcess);
    }
}

#[test]
fn the_messages_name_the_flag_and_the_bound() {
    let l = Limits { processes: 40, memory: 64 << 20, cpu_percent: 30 };
    assert!(hit_message(Bound::Processes, &l).contains("--max-processes 40"));
    assert!(hit_message(Bound::Memory, &l).contains("--max-memory 67108864"));
    assert!(hit_message(Bound::Cpu, &l).contains("--max-cpu 30"));
}
