//! The session's socket in the confinement: the socket alone, read-only,
//! outside the private `/tmp`, and named to the payload where it is.

use super::*;
use std::path::Path;

fn confinement(abi: u32) -> Confinement {
    let r = system_ruleset(abi, false).unwrap();
    let view = view_for(&r, PathBuf::from("/work/project"));
    Confinement {
        namespaces: NsMode::Try,
        net: false,
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

fn with_socket(abi: u32) -> Confinement {
    let mut c = confinement(abi);
    c.session_socket(PathBuf::from("/tmp/airlock-1.2-ab/session"), "AIRLOCK_SOCKET");
    c
}

fn in_view() -> Applied {
    Applied { namespaces: Namespace::ALL.to_vec(), seccomp: true, proc: true, ..Applied::default() }
}

#[test]
fn only_the_socket_is_bound_read_only_outside_the_private_tmp() {
    let c = with_socket(9);
    let sockets: Vec<_> = c.view.mounts.iter().filter(|m| matches!(m, Mount::Socket { .. })).collect();
    assert_eq!(
        sockets,
        vec![&Mount::Socket {
            source: PathBuf::from("/tmp/airlock-1.2-ab/session"),
            path: PathBuf::from(SESSION_SOCKET_IN_VIEW),
        }]
    );
    assert!(!Path::new(SESSION_SOCKET_IN_VIEW).starts_with("/tmp"));
    // Nothing of the host's directory is bound, and nothing writable
    // covers the socket.
    assert!(!c
        .view
        .mounts
        .iter()
        .any(|m| m.path().starts_with("/tmp/airlock-1.2-ab") && !matches!(m, Mount::Socket { .. })));
    // Where the payload reaches it (in the view, or at its host path
    // without one), no rule lets it write.
    for (applied, at) in [
        (in_view(), SESSION_SOCKET_IN_VIEW),
        (Applied { seccomp: true, ..Applied::default() }, "/tmp/airlock-1.2-ab/session"),
    ] {
        let r = c.ruleset_for(&applied);
        for rule in r.paths.iter().filter(|rule| Path::new(at).starts_with(&rule.path)) {
            assert!(rule.rights.iter().all(|x| !x.writes() || *x == FsRight::ResolveUnix), "{rule:?}");
        }
    }
    // Adding it twice binds it once.
    let mut twice = with_socket(9);
    twice.session_socket(PathBuf::from("/tmp/airlock-1.2-ab/session"), "AIRLOCK_SOCKET");
    assert_eq!(twice.view.mounts.iter().filter(|m| matches!(m, Mount::Socket { .. })).count(), 1);
}

#[test]
fn the_payload_is_told_where_the_socket_is_and_may_connect_there() {
    let c = with_socket(9);
    assert_eq!(c.session_env(&in_view()), Some(("AIRLOCK_SOCKET", Path::new(SESSION_SOCKET_IN_VIEW))));
    let fallback = Applied { seccomp: true, ..Applied::default() };
    assert_eq!(c.session_env(&fallback), None, "the host path the spawner gave stands");
    let connect = |r: &Ruleset| -> Vec<PathBuf> {
        r.paths.iter().filter(|p| p.grant == Grant::Connect).map(|p| p.path.clone()).collect()
    };
    assert_eq!(connect(&c.ruleset_for(&in_view())), vec![PathBuf::from("/run/airlock")]);
    assert_eq!(connect(&c.ruleset_for(&fallback)), vec![PathBuf::from("/tmp/airlock-1.2-ab")]);
    // Before ABI 9 the grant holds no right (no rule is made of it).
    assert!(with_socket(7)
        .ruleset_for(&in_view())
        .paths
        .iter()
        .all(|p| p.grant != Grant::Connect || p.rights.is_empty()));
    assert_eq!(confinement(9).session_env(&in_view()), None);
}

#[test]
fn devices_are_bound_as_devices_and_grants_as_binds() {
    let c = confinement(7);
    for d in DEVICES {
        assert!(c.view.mounts.contains(&Mount::Device { path: PathBuf::from(d) }), "{d}");
    }
    assert!(!c.view.mounts.iter().any(|m| matches!(m, Mount::Bind { writable: true, .. })));
}
