use super::*;
use crate::policy::{Access, Root};
use proptest::prelude::*;

fn policy(roots: &[(&str, Access)]) -> Policy {
    Policy::new(
        PathBuf::from("/work/project"),
        roots.iter().map(|(p, access)| Root { path: PathBuf::from(p), access: *access }),
    )
}

fn confined(inputs: &Inputs<'_>) -> Ruleset {
    match plan(inputs) {
        Ok(Plan::Confined(r)) => r,
        other => panic!("not confined: {other:?}"),
    }
}

fn inputs<'a>(policy: &'a Policy, options: &'a Options, abi: u32) -> Inputs<'a> {
    Inputs { policy, options, abi, airlock: Some(PathBuf::from("/opt/airlock/bin/airlock")) }
}

#[test]
fn abi_0_is_refused_naming_no_sandbox_and_no_sandbox_runs_unconfined() {
    let p = policy(&[]);
    let on = Options::default();
    let err = plan(&inputs(&p, &on, 0)).unwrap_err();
    assert_eq!(err, Refusal::NoLandlock { abi: 0 });
    assert!(err.to_string().contains("--no-sandbox"), "{err}");
    let off = Options { disabled: true, ..Options::default() };
    let plan0 = plan(&inputs(&p, &off, 0)).unwrap();
    assert_eq!(plan0, Plan::Unconfined { abi: 0 });
    let f = plan0.in_force();
    assert_eq!((f.landlock_abi, f.fs, f.net), (0, "unconfined", "unconfined"));
    assert!(f.scoped.is_empty());
}

#[test]
fn abi_7_enforces_everything_it_knows() {
    let p = policy(&[("/work/project", Access::ReadWrite)]);
    let o = Options::default();
    let r = confined(&inputs(&p, &o, 7));
    assert_eq!(r.abi, 7);
    assert!(r.handled_fs.contains(&FsRight::IoctlDev));
    assert!(!r.handled_fs.contains(&FsRight::ResolveUnix));
    assert_eq!(r.handled_net, [NetRight::BindTcp, NetRight::ConnectTcp].into_iter().collect());
    assert_eq!(r.scoped, ScopeKind::ALL.into_iter().collect());
    let f = Plan::Confined(r).in_force();
    assert_eq!(f.landlock_abi, 7);
    assert_eq!((f.fs, f.net), ("confined", "denied"));
    assert_eq!(f.scoped, vec![ScopeKind::AbstractUnixSocket, ScopeKind::Signal]);
    assert_eq!(f.not_enforced, vec!["udp"]);
}

/// Each ABI degrades exactly as the module's table says.
#[test]
fn older_abis_degrade_as_documented() {
    let p = policy(&[]);
    let o = Options::default();
    let gaps = |abi| Plan::Confined(confined(&inputs(&p, &o, abi))).in_force();
    let all = ["truncate", "ioctl_dev", "tcp", "udp", "scope_abstract_unix_socket", "scope_signal"];
    assert_eq!(gaps(1).not_enforced, all.to_vec());
    assert_eq!(gaps(1).net, "unconfined");
    assert!(!confined(&inputs(&p, &o, 1)).handled_fs.contains(&FsRight::Refer));
    assert!(confined(&inputs(&p, &o, 2)).handled_fs.contains(&FsRight::Refer));
    assert_eq!(gaps(2).not_enforced, all.to_vec());
    assert!(!gaps(3).not_enforced.contains(&"truncate"));
    assert_eq!(gaps(3).net, "unconfined");
    assert_eq!(gaps(4).net, "denied");
    assert!(!gaps(4).not_enforced.contains(&"tcp"));
    assert!(gaps(4).not_enforced.contains(&"ioctl_dev"));
    assert!(!gaps(5).not_enforced.contains(&"ioctl_dev"));
    assert!(gaps(5).scoped.is_empty());
    assert_eq!(gaps(6).scoped.len(), 2);
    assert_eq!(gaps(6).not_enforced, vec!["udp"]);
    assert_eq!(gaps(9).not_enforced, vec!["udp"]);
    // Named unix sockets: seccomp before ABI 9, Landlock from it on.
    for abi in 1..=10 {
        assert_eq!(confined(&inputs(&p, &o, abi)).deny_unix_socket_create, abi < 9, "ABI {abi}");
    }
    assert!(gaps(10).not_enforced.is_empty());
    let r10 = confined(&inputs(&p, &o, 10));
    assert_eq!(r10.handled_net.len(), 4);
    assert_eq!(r10.handled_fs.len(), FsRight::ALL.len());
}

#[test]
fn an_unknown_newer_abi_is_used_as_the_newest_known() {
    let p = policy(&[]);
    let o = Options::default();
    let r = confined(&inputs(&p, &o, 42));
    assert_eq!(r.abi, KNOWN_ABI);
    assert_eq!(r.kernel_abi, 42);
    let mut r10 = confined(&inputs(&p, &o, KNOWN_ABI));
    r10.kernel_abi = 42;
    assert_eq!(r, r10);
    assert_eq!(Plan::Confined(r).in_force().landlock_abi, 42);
}

#[test]
fn sandbox_net_leaves_the_network_unhandled() {
    let p = policy(&[]);
    let o = Options { net: true, ..Options::default() };
    let r = confined(&inputs(&p, &o, 7));
    assert!(r.handled_net.is_empty());
    assert_eq!(Plan::Confined(r).in_force().net, "allowed");
}

#[test]
fn the_default_list_is_read_only_but_for_sinks() {
    let p = policy(&[]);
    let o = Options::default();
    let r = confined(&inputs(&p, &o, 7));
    let names: Vec<_> = r.paths.iter().map(|p| p.path.to_str().unwrap()).collect();
    for want in
        ["/usr", "/bin", "/lib", "/etc/ld.so.cache", "/dev/null", "/dev/tty", "/opt/airlock/bin/airlock"]
    {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for absent in ["/", "/etc", "/proc", "/tmp", "/home", "/root", "/dev", "/dev/shm", "/run"] {
        assert!(!names.contains(&absent), "{absent} must not be in {names:?}");
    }
    for rule in &r.paths {
        let writes = rule.rights.iter().any(|x| x.writes());
        assert_eq!(writes, rule.grant == Grant::Sink, "{rule:?}");
        assert!(!rule.rights_for(false).contains(&FsRight::IoctlDev), "{rule:?}");
    }
    let null = r.paths.iter().find(|p| p.path == Path::new("/dev/null")).unwrap();
    // `>/dev/null` opens with O_TRUNC.
    assert_eq!(null.rights_for(false), [FsRight::WriteFile, FsRight::ReadFile, FsRight::Truncate].into());
    let usr = r.paths.iter().find(|p| p.path == Path::new("/usr")).unwrap();
    assert_eq!(usr.rights_for(true), [FsRight::Execute, FsRight::ReadFile, FsRight::ReadDir].into());
    assert_eq!(usr.rights_for(false), [FsRight::Execute, FsRight::ReadFile].into());
}

#[test]
fn sandbox_ro_paths_resolve_against_the_working_directory() {
    let p = policy(&[("out", Access::ReadWrite)]);
    let o =
        Options { read_only: vec![PathBuf::from("tools/../bin"), "/opt/sdk".into()], ..Options::default() };
    let r = confined(&inputs(&p, &o, 7));
    for want in ["/work/project/bin", "/opt/sdk"] {
        let rule = r.paths.iter().find(|x| x.path == Path::new(want)).unwrap();
        assert_eq!((rule.grant, rule.source), (Grant::ReadExec, Source::User));
    }
}

#[test]
fn sandbox_ro_overlapping_a_root_is_refused() {
    let p = policy(&[("/data/in", Access::ReadOnly), ("/data/out", Access::ReadWrite)]);
    for (ro, root) in [("/data/in", "/data/in"), ("/data", "/data/in"), ("/data/out", "/data/out")] {
        let o = Options { read_only: vec![PathBuf::from(ro)], ..Options::default() };
        let err = plan(&inputs(&p, &o, 7)).unwrap_err();
        assert_eq!(err, Refusal::OverlapsRoot { path: ro.into(), root: root.into() });
        assert!(err.to_string().contains("only through airlock"), "{err}");
    }
    let o = Options { read_only: vec!["/".into()], ..Options::default() };
    assert_eq!(plan(&inputs(&p, &o, 7)).unwrap_err(), Refusal::BadPath { path: "/".into() });
    let o = Options { read_only: vec!["/data/other".into()], ..Options::default() };
    confined(&inputs(&p, &o, 7));
}

#[test]
fn a_tool_runner_gets_its_work_dir_and_no_network_unless_asked() {
    let r = tool_ruleset(7, Path::new("/work/tool"), false).unwrap();
    let w = r.paths.iter().find(|p| p.path == Path::new("/work/tool")).unwrap();
    assert_eq!(w.grant, Grant::ReadWrite);
    assert!(w.rights.contains(&FsRight::MakeReg) && w.rights.contains(&FsRight::Truncate));
    assert!(!w.rights.contains(&FsRight::ResolveUnix), "ABI 7 has no resolve_unix");
    assert_eq!(r.handled_net.len(), 2);
    assert!(tool_ruleset(7, Path::new("/work/tool"), true).unwrap().handled_net.is_empty());
    assert_eq!(tool_ruleset(0, Path::new("/w"), false).unwrap_err(), Refusal::NoLandlock { abi: 0 });
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("usr".to_string()),
        Just("bin".to_string()),
        Just("lib".to_string()),
        Just("tmp".to_string()),
        Just("home".to_string()),
        Just("..".to_string()),
        Just(".".to_string()),
        "[a-c]{1,2}",
    ]
}

fn any_path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(segment(), 0..5)).prop_map(|(abs, segs)| {
        let body = segs.join("/");
        if abs {
            format!("/{body}")
        } else {
            body
        }
    })
}

proptest! {
    /// Whatever the policy and options: no `--allow`/`--allow-rw` root is
    /// ever in the ruleset, nor anything beneath or above one but the
    /// fixed system defaults and the airlock binary; no rule grants a
    /// write but a sink; nothing is handled that the ABI does not have;
    /// and ABI 0 confines nothing.
    #[test]
    fn no_root_is_ever_reachable_directly(
        roots in prop::collection::vec((any_path(), any::<bool>()), 0..4),
        read_only in prop::collection::vec(any_path(), 0..4),
        abi in 0u32..14,
        net in any::<bool>(),
        disabled in any::<bool>(),
    ) {
        let p = Policy::new(
            PathBuf::from("/work/project"),
            roots.iter().map(|(path, rw)| Root {
                path: PathBuf::from(path),
                access: if *rw { Access::ReadWrite } else { Access::ReadOnly },
            }),
        );
        let o = Options { disabled, read_only: read_only.iter().map(PathBuf::from).collect(), net, read_write: Vec::new() };
        let result = plan(&inputs(&p, &o, abi));
        match result {
            Ok(Plan::Unconfined { .. }) => prop_assert!(disabled),
            Err(Refusal::NoLandlock { .. }) => prop_assert!(!disabled && abi == 0),
            Err(Refusal::BadPath { .. }) | Err(Refusal::OverlapsRoot { .. }) => prop_assert!(!disabled && abi > 0),
            Err(Refusal::WriteOverlapsRoot { .. }) => prop_assert!(false, "no --sandbox-rw was given"),
            Ok(Plan::Confined(r)) => {
                prop_assert!(!disabled && abi > 0);
                prop_assert_eq!(r.abi, abi.min(KNOWN_ABI));
                for rule in &r.paths {
                    prop_assert!(rule.path.is_absolute());
                    prop_assert!(rule.rights.iter().all(|x| r.handled_fs.contains(x)));
                    prop_assert!(rule.rights.iter().all(|x| x.since() <= r.abi));
                    let writes = rule.rights.iter().any(|x| x.writes());
                    prop_assert_eq!(writes, rule.grant == Grant::Sink, "{:?}", rule);
                    prop_assert!(rule.grant != Grant::ReadWrite);
                    if rule.source == Source::User {
                        for root in p.roots() {
                            prop_assert!(!within(&root.path, &rule.path), "{:?} over {:?}", rule, root);
                            if within(&rule.path, &root.path) {
                                prop_assert!(r.direct_read.contains(&rule.path), "{:?} not listed", rule);
                            }
                        }
                    } else {
                        prop_assert!(rule.source == Source::Default || rule.source == Source::Airlock);
                    }
                }
                prop_assert!(r.handled_fs.iter().all(|x| x.since() <= r.abi));
                prop_assert!(r.handled_net.iter().all(|x| x.since() <= r.abi));
                prop_assert_eq!(r.handled_net.is_empty(), net || r.abi < 4);
                prop_assert_eq!(r.scoped.is_empty(), r.abi < 6);
                let f = Plan::Confined(r.clone()).in_force();
                prop_assert_eq!(f.landlock_abi, abi);
                prop_assert_eq!(f.net == "denied", !net && r.abi >= 4);
            }
        }
    }
}

#[test]
fn a_path_named_twice_gets_one_rule() {
    let p = policy(&[("out", Access::ReadWrite)]);
    let o = Options {
        read_only: vec!["/opt/sdk".into(), "/opt/sdk".into(), "/opt/x/../sdk".into()],
        ..Options::default()
    };
    let r = confined(&inputs(&p, &o, 7));
    let mut seen = BTreeSet::new();
    for rule in &r.paths {
        assert!(seen.insert((rule.path.clone(), rule.grant)), "{} twice", rule.path.display());
    }
    assert_eq!(r.paths.iter().filter(|x| x.path == Path::new("/opt/sdk")).count(), 1);
}

// The confinement's description: namespaces, view, seccomp, report.

fn all_ns() -> Applied {
    Applied { namespaces: Namespace::ALL.to_vec(), seccomp: true, proc: true, ..Applied::default() }
}

#[test]
fn under_every_namespace_abi_7_has_no_gap() {
    let p = policy(&[]);
    let o = Options::default();
    let plan = Plan::Confined(confined(&inputs(&p, &o, 7)));
    let f = plan.in_force_with(&all_ns(), false);
    assert!(f.not_enforced.is_empty(), "{:?}", f.not_enforced);
    assert_eq!(f.namespaces.len(), 6);
    assert_eq!((f.seccomp, f.capabilities, f.net), (true, "dropped", "denied"));
}

#[test]
fn the_fallback_lists_each_namespace_and_the_abstract_bind() {
    let p = policy(&[]);
    let o = Options::default();
    let plan = Plan::Confined(confined(&inputs(&p, &o, 7)));
    let applied = Applied { seccomp: true, ..Applied::default() };
    let f = plan.in_force_with(&applied, false);
    assert_eq!(
        f.not_enforced,
        vec!["ns_user", "ns_pid", "ns_ipc", "ns_net", "ns_uts", "ns_mount", "abstract_unix_bind"]
    );
    // UDP: seccomp refuses UDP sockets there, so it is not listed…
    assert!(!f.not_enforced.contains(&"udp"));
    // …but with the network allowed it is open, and listed.
    let o = Options { net: true, ..Options::default() };
    let plan = Plan::Confined(confined(&inputs(&p, &o, 7)));
    let f = plan.in_force_with(&applied, true);
    assert!(f.not_enforced.contains(&"udp"));
    assert!(!f.not_enforced.contains(&"ns_net"), "the network namespace is not wanted with --sandbox-net");
}

#[test]
fn an_old_abi_under_namespaces_lists_only_what_no_namespace_closes() {
    let p = policy(&[]);
    let o = Options::default();
    let plan = Plan::Confined(confined(&inputs(&p, &o, 3)));
    let f = plan.in_force_with(&all_ns(), false);
    assert_eq!(f.not_enforced, vec!["ioctl_dev"]);
    assert_eq!(f.net, "denied");
}

proptest! {
    #[test]
    fn every_missing_namespace_is_listed_and_udp_only_when_open(
        abi in 1u32..=12,
        mask in 0u8..64,
        net in any::<bool>(),
        seccomp in any::<bool>(),
    ) {
        let p = policy(&[]);
        let o = Options { net, ..Options::default() };
        let plan = Plan::Confined(confined(&inputs(&p, &o, abi)));
        let namespaces: Vec<Namespace> =
            Namespace::ALL.into_iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, n)| n).collect();
        let applied = Applied { namespaces: namespaces.clone(), seccomp, proc: true, ..Applied::default() };
        let f = plan.in_force_with(&applied, net);
        for ns in Namespace::ALL {
            let wanted = !(net && ns == Namespace::Net);
            prop_assert_eq!(f.not_enforced.contains(&ns_gap(ns)), wanted && !namespaces.contains(&ns));
        }
        let net_ns = namespaces.contains(&Namespace::Net);
        let udp_open = abi < 10 && !net_ns && (net || !seccomp);
        prop_assert_eq!(f.not_enforced.contains(&"udp"), udp_open);
        prop_assert_eq!(f.not_enforced.contains(&"seccomp"), !seccomp);
    }
}

#[test]
fn seccomp_always_refuses_the_dangerous_calls_and_ipc_only_without_its_namespace() {
    let fallback = seccomp_policy(&SeccompInputs::default());
    let inside = seccomp_policy(&SeccompInputs {
        ipc_ns: true,
        net_ns: true,
        mount_ns: true,
        ..SeccompInputs::default()
    });
    for rules in [&fallback, &inside] {
        for call in ALWAYS_DENIED {
            let r = rules.iter().find(|r| r.call == *call).unwrap();
            assert!(r.when.is_empty() && r.errno == Errno::Perm, "{call}");
        }
        let clone3 = rules.iter().find(|r| r.call == "clone3").unwrap();
        assert_eq!(clone3.errno, Errno::Nosys);
        let calls: Vec<_> = rules.iter().map(|r| r.call).collect();
        let mut unique = calls.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), calls.len(), "one rule per call");
        for call in ["clone", "unshare"] {
            assert_eq!(rules.iter().find(|r| r.call == call).unwrap().when.len(), NAMESPACE_FLAGS.len());
        }
    }
    for call in HOST_IPC {
        assert!(fallback.iter().any(|r| r.call == *call), "{call}");
        assert!(!inside.iter().any(|r| r.call == *call), "{call}");
    }
    let socket = |rules: &[SyscallRule]| rules.iter().find(|r| r.call == "socket").unwrap().when.clone();
    let inet = vec![Cond { arg: 0, dword: true, op: Op::Eq, value: AF_INET }];
    assert!(socket(&fallback).contains(&inet));
    assert!(!socket(&inside).contains(&inet));
    let mptcp = vec![Cond { arg: 2, dword: true, op: Op::Eq, value: IPPROTO_MPTCP }];
    assert!(socket(&fallback).contains(&mptcp) && socket(&inside).contains(&mptcp));
}

#[test]
fn the_view_puts_grants_on_top_of_the_private_tmpfs_and_the_cwd_last() {
    let mut inputs = ViewInputs::new(PathBuf::from("/tmp/project"));
    inputs.read_only = vec![PathBuf::from("/tmp/project/agent.py"), PathBuf::from("/opt/tool")];
    inputs.read_write = vec![PathBuf::from("/tmp/work")];
    inputs.airlock = Some(PathBuf::from("/opt/airlock/bin/airlock"));
    let v = view(&inputs);
    let at = |p: &str| v.mounts.iter().position(|m| m.path() == Path::new(p)).unwrap();
    assert!(at("/tmp") < at("/tmp/project/agent.py"));
    assert!(at("/tmp") < at("/tmp/work"));
    assert!(at("/dev") < at("/dev/null") && at("/dev") < at("/dev/shm"));
    assert_eq!(v.mounts.last(), Some(&Mount::Dir { path: PathBuf::from("/tmp/project") }));
    assert!(matches!(v.mounts[at("/tmp/work")], Mount::Bind { writable: true, required: true, .. }));
    assert!(matches!(v.mounts[at("/opt/tool")], Mount::Bind { writable: false, required: true, .. }));
    assert!(matches!(v.mounts[at("/etc")], Mount::Bind { writable: false, required: false, .. }));
    assert_eq!(private_dirs(&v), vec![PathBuf::from("/dev/shm"), PathBuf::from("/tmp")]);
    assert!(!v.mounts.iter().any(|m| m.path().starts_with("/run") || m.path().starts_with("/home")));
}

#[test]
fn private_dirs_are_granted_read_write_only_inside_the_view() {
    let p = policy(&[]);
    let o = Options::default();
    let r = confined(&inputs(&p, &o, 7));
    let v = view_for(&r, PathBuf::from("/work/project"));
    let c = Confinement {
        namespaces: NsMode::Try,
        net: false,
        ruleset: r.clone(),
        view: v,
        keep_fds: 3,
        status_fd: 4,
        session: None,
        bounds: None,
        fuse: None,
        egress: None,
    };
    assert_eq!(c.ruleset_for(&Applied::default()), r);
    let inside = c.ruleset_for(&all_ns());
    let private: Vec<_> =
        inside.paths.iter().filter(|p| p.source == Source::Private).map(|p| p.path.clone()).collect();
    assert_eq!(private, vec![PathBuf::from("/dev/shm"), PathBuf::from("/tmp")]);
    // The plan survives the trip to the stage.
    let text = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Confinement>(&text).unwrap(), c);
}

#[test]
fn the_namespace_flag_and_the_environment_override_do_not_mix() {
    assert_eq!(NsMode::from_flags(false, false), Ok(NsMode::Try));
    assert_eq!(NsMode::from_flags(true, false), Ok(NsMode::Require));
    assert_eq!(NsMode::from_flags(false, true), Ok(NsMode::Off));
    assert!(NsMode::from_flags(true, true).is_err());
}

#[test]
fn sandbox_ro_inside_a_root_is_a_listed_direct_read() {
    let p = policy(&[("/work/project", Access::ReadWrite), ("/data/in", Access::ReadOnly)]);
    let o = Options {
        read_only: vec![PathBuf::from("agent.py"), PathBuf::from("/data/in/lib"), PathBuf::from("/opt/sdk")],
        ..Options::default()
    };
    let r = confined(&inputs(&p, &o, 7));
    assert_eq!(r.direct_read, vec![PathBuf::from("/work/project/agent.py"), PathBuf::from("/data/in/lib")]);
    let rule = r.paths.iter().find(|x| x.path == Path::new("/work/project/agent.py")).unwrap();
    assert_eq!((rule.grant, rule.source), (Grant::ReadExec, Source::User));
    // The view binds it read-only at its own path, before the working
    // directory's empty placeholder (which then finds it in place).
    let view = view_for(&r, PathBuf::from("/work/project"));
    let bind = view
        .mounts
        .iter()
        .position(|m| {
            *m == Mount::Bind { path: "/work/project/agent.py".into(), writable: false, required: true }
        })
        .unwrap();
    let cwd = view.mounts.iter().position(|m| *m == Mount::Dir { path: "/work/project".into() }).unwrap();
    assert!(bind < cwd);
}

#[test]
fn sandbox_ro_of_a_root_or_above_one_names_the_root() {
    let p = policy(&[("/work/project", Access::ReadWrite)]);
    for ro in [".", "/work/project", "/work", "/"] {
        let o = Options { read_only: vec![PathBuf::from(ro)], ..Options::default() };
        match plan(&inputs(&p, &o, 7)) {
            Err(Refusal::OverlapsRoot { root, .. }) => assert_eq!(root, Path::new("/work/project")),
            Err(Refusal::BadPath { .. }) if ro == "/" => {}
            other => panic!("{ro}: {other:?}"),
        }
    }
    let o = Options { read_only: vec![PathBuf::from("/work")], ..Options::default() };
    let msg = plan(&inputs(&p, &o, 7)).unwrap_err().to_string();
    assert!(msg.contains("/work/project") && msg.contains("--sandbox-ro /work"), "{msg}");
}

#[test]
fn permits_follows_the_rules_rights() {
    let p = policy(&[("/work/project", Access::ReadWrite)]);
    let o = Options { read_only: vec![PathBuf::from("agent.py")], ..Options::default() };
    let r = confined(&inputs(&p, &o, 7));
    assert!(r.permits(Path::new("/usr/bin/python3"), Use::Execute));
    assert!(r.permits(Path::new("/work/project/agent.py"), Use::Read));
    assert!(r.permits(Path::new("/work/project/agent.py"), Use::Execute));
    // Read but not execute: the loader's cache.
    assert!(r.permits(Path::new("/etc/ld.so.cache"), Use::Read));
    assert!(!r.permits(Path::new("/etc/ld.so.cache"), Use::Execute));
    // Not granted: the rest of the root, a home's toolchain, a sibling
    // whose name merely starts like a granted one.
    for path in
        ["/work/project/data.txt", "/root/.pyenv/shims/python3", "/usr2/bin/x", "/work/project/agent.pyc"]
    {
        assert!(!r.permits(Path::new(path), Use::Read), "{path}");
        assert!(!r.permits(Path::new(path), Use::Execute), "{path}");
    }
    // A sink is no read grant for a program.
    assert!(!r.permits(Path::new("/dev/null"), Use::Execute));
}

#[test]
fn sandbox_rw_grants_a_path_outside_every_root_and_refuses_one_overlapping_a_root() {
    let p = policy(&[("data", Access::ReadOnly)]);
    let o = Options { read_write: vec!["/opt/cache".into()], ..Options::default() };
    let r = confined(&inputs(&p, &o, 7));
    let rule = r.paths.iter().find(|x| x.path == Path::new("/opt/cache")).expect("granted");
    assert_eq!((rule.grant, rule.source), (Grant::ReadWrite, Source::WorkDir));
    assert!(rule.rights.contains(&FsRight::WriteFile));
    let root = p.roots()[0].path.clone();
    for inside in [root.join("sub"), root.clone(), root.parent().unwrap().to_path_buf()] {
        let o = Options { read_write: vec![inside.clone()], ..Options::default() };
        match plan(&inputs(&p, &o, 7)) {
            Err(Refusal::WriteOverlapsRoot { root: r, .. }) => assert_eq!(r, root),
            other => panic!("--sandbox-rw {} was not refused: {other:?}", inside.display()),
        }
    }
}

/// A path of the default list may be missing on a host (`/lib64` on some
/// distributions) and is skipped; every path a user, a tool or airlock
/// itself names must exist, or the start is refused.
#[test]
fn only_the_default_list_may_be_missing() {
    assert!(!Source::Default.required());
    for s in [Source::Airlock, Source::User, Source::WorkDir, Source::Private, Source::Session] {
        assert!(s.required(), "{s:?}");
    }
}

#[test]
fn sandbox_rw_of_the_root_directory_is_refused() {
    let p = policy(&[]);
    for raw in ["/", "/..", "../../../../.."] {
        let o = Options { read_write: vec![raw.into()], ..Options::default() };
        assert_eq!(
            plan(&inputs(&p, &o, 7)),
            Err(Refusal::BadPath { path: raw.into() }),
            "--sandbox-rw {raw}"
        );
    }
}

#[test]
fn the_lowest_supported_abi_is_enough_for_every_ruleset_and_the_one_below_is_not() {
    let work = Path::new("/tmp/work");
    for abi in [MIN_ABI, 4, KNOWN_ABI, KNOWN_ABI + 1] {
        assert_eq!(tool_ruleset(abi, work, false).map(|r| r.abi), Ok(abi.min(KNOWN_ABI)));
        assert_eq!(system_ruleset(abi, false).map(|r| r.abi), Ok(abi.min(KNOWN_ABI)));
    }
    let below = MIN_ABI - 1;
    assert_eq!(tool_ruleset(below, work, false), Err(Refusal::NoLandlock { abi: below }));
    assert_eq!(system_ruleset(below, false), Err(Refusal::NoLandlock { abi: below }));
    assert!(system_ruleset(7, false).is_ok_and(|r| !r.handled_net.is_empty()));
    assert!(system_ruleset(7, true).is_ok_and(|r| r.handled_net.is_empty()));
}

#[test]
fn each_grant_after_the_plan_adds_its_own_kind_of_rule() {
    let Ok(mut r) = system_ruleset(7, false) else { panic!("abi 7 is supported") };
    let before = r.paths.len();
    r.grant_read_exec(PathBuf::from("/opt/tool/bin/run"));
    r.grant_session_dir(PathBuf::from("/tmp/airlock-session"));
    r.grant_read_write(PathBuf::from("/opt/cache"));
    let added: Vec<_> =
        r.paths[before..].iter().map(|p| (p.path.to_str().unwrap_or(""), p.grant, p.source)).collect();
    assert_eq!(
        added,
        vec![
            ("/opt/tool/bin/run", Grant::ReadExec, Source::User),
            ("/tmp/airlock-session", Grant::Connect, Source::Session),
            ("/opt/cache", Grant::ReadWrite, Source::WorkDir),
        ]
    );
    assert!(r.permits(Path::new("/opt/tool/bin/run"), Use::Execute));
    assert!(r.permits(Path::new("/opt/cache/x"), Use::Read));
    let cache = r.paths.iter().find(|p| p.path == Path::new("/opt/cache")).expect("granted");
    assert!(cache.rights.contains(&FsRight::WriteFile));
    let session = r.paths.iter().find(|p| p.source == Source::Session).expect("granted");
    assert!(!session.rights.contains(&FsRight::WriteFile) && !session.rights.contains(&FsRight::ReadFile));
}

fn confinement(net: bool) -> Confinement {
    let p = policy(&[]);
    let o = Options { net, ..Options::default() };
    let r = confined(&inputs(&p, &o, 7));
    let view = view_for(&r, PathBuf::from("/work/project"));
    Confinement {
        namespaces: NsMode::Try,
        net,
        ruleset: r,
        view,
        keep_fds: 3,
        status_fd: 4,
        session: None,
        bounds: None,
        fuse: None,
        egress: None,
    }
}

#[test]
fn every_namespace_is_wanted_but_the_network_one_when_the_network_is_allowed() {
    assert_eq!(confinement(false).wanted(), Namespace::ALL.to_vec());
    let with_net = confinement(true).wanted();
    assert_eq!(with_net, Namespace::ALL.into_iter().filter(|n| *n != Namespace::Net).collect::<Vec<_>>());
}

#[test]
fn the_private_dirs_get_every_write_right_the_abi_has_and_no_newer_one() {
    for abi in [1, 2, 3, 7] {
        let mut c = confinement(false);
        c.ruleset = confined(&inputs(&policy(&[]), &Options::default(), abi));
        let r = c.ruleset_for(&all_ns());
        let tmp = r.paths.iter().find(|p| p.source == Source::Private).expect("a private dir");
        let want: BTreeSet<FsRight> =
            Grant::ReadWrite.rights().into_iter().filter(|x| x.since() <= abi).collect();
        assert_eq!(tmp.rights, want, "abi {abi}");
        assert!(tmp.rights.contains(&FsRight::WriteFile) && tmp.rights.contains(&FsRight::MakeReg));
    }
}

#[test]
fn the_seccomp_rules_follow_what_was_applied() {
    let c = confinement(false);
    let socket = |rules: &[SyscallRule]| rules.iter().find(|r| r.call == "socket").map(|r| r.when.clone());
    let unix = vec![Cond { arg: 0, dword: true, op: Op::Eq, value: AF_UNIX }];
    let mut fallback = c.clone();
    fallback.ruleset.deny_unix_socket_create = true;
    let outside = fallback.seccomp_for(&Applied { seccomp: true, ..Applied::default() });
    let inside = fallback.seccomp_for(&all_ns());
    assert_eq!(
        outside,
        seccomp_policy(&SeccompInputs { deny_unix_socket_create: true, ..SeccompInputs::default() })
    );
    assert!(socket(&outside).is_some_and(|w| w.contains(&unix)), "no mount view: no unix socket");
    assert!(socket(&inside).is_some_and(|w| !w.contains(&unix)), "in the view a unix socket reaches nothing");
    assert!(inside.iter().any(|r| r.call == "keyctl"));
    assert!(!inside.iter().any(|r| r.call == "shmget") && outside.iter().any(|r| r.call == "shmget"));
}

/// The sizes docs/run.md promises: a 64 MiB `/tmp` and `/dev/shm`, and a
/// 1 MiB root that holds only mount points.
#[test]
fn the_private_tmpfs_sizes_are_the_documented_ones() {
    const MIB: u64 = 1024 * 1024;
    let v = view(&ViewInputs::new(PathBuf::from("/work/project")));
    let size = |at: &str| {
        v.mounts.iter().find_map(|m| match m {
            Mount::Tmpfs { path, size, .. } if path == Path::new(at) => Some(*size),
            _ => None,
        })
    };
    assert_eq!((size("/tmp"), size("/dev/shm")), (Some(64 * MIB), Some(64 * MIB)));
    assert_eq!(v.root_size, MIB);
}

/// Before ABI 3 Landlock cannot refuse truncate: under the mount view
/// every host location is a read-only mount, so it is closed there and
/// listed only in the fallback. Before ABI 4 it cannot refuse TCP: the
/// network namespace denies it, and without one seccomp refuses every
/// internet socket; without seccomp either, it is unconfined.
#[test]
fn the_view_closes_truncate_and_the_network_namespace_tcp_on_old_abis() {
    let p = policy(&[]);
    let o = Options::default();
    let fallback = Applied { seccomp: true, ..Applied::default() };
    let old = Plan::Confined(confined(&inputs(&p, &o, 2)));
    assert!(!old.in_force_with(&all_ns(), false).not_enforced.contains(&"truncate"));
    assert!(old.in_force_with(&fallback, false).not_enforced.contains(&"truncate"));
    let pre_tcp = Plan::Confined(confined(&inputs(&p, &o, 3)));
    assert_eq!(pre_tcp.in_force_with(&all_ns(), false).net, "denied");
    let f = pre_tcp.in_force_with(&fallback, false);
    assert_eq!(f.net, "denied");
    assert!(!f.not_enforced.contains(&"tcp"));
    let f = pre_tcp.in_force_with(&Applied::default(), false);
    assert_eq!(f.net, "unconfined");
    assert!(f.not_enforced.contains(&"tcp"));
}

/// A datagram socketpair's `sendto` reaches a named host socket before
/// Landlock ABI 9: refused where unix sockets are, unless the mount view
/// leaves no host socket to reach.
#[test]
fn datagram_socketpairs_are_refused_only_outside_the_view_where_unix_sockets_are() {
    let has_rule = |mount_ns, deny_unix_socket_create| {
        seccomp_policy(&SeccompInputs { mount_ns, deny_unix_socket_create, ..SeccompInputs::default() })
            .iter()
            .any(|r| r.call == "socketpair")
    };
    assert!(has_rule(false, true));
    assert!(!has_rule(true, true));
    assert!(!has_rule(false, false));
    assert!(!has_rule(true, false));
}
