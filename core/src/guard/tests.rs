use super::*;
use proptest::prelude::*;

fn plain() -> Guard {
    Guard::new(Grants::default(), Grants::default(), None, [PathBuf::from("/u/me")])
}

fn rule(g: &Guard, path: &str, act: Act) -> Option<Rule> {
    g.matched(path.as_bytes(), act, false)
}

#[test]
fn the_env_family_and_its_editor_copies_are_secret_in_any_case() {
    let g = plain();
    for name in [
        ".env",
        ".ENV",
        ".Env",
        ".env.local",
        ".env.production",
        ".env_local",
        ".env-prod",
        "prod.env",
        ".prod.env",
        ".env~",
        "#.env#",
        ".#.env",
        "..env.swp",
        "..env.swo",
        ".env.swp",
        ".env.bak",
        "prod.env.orig",
        ".envrc",
        ".ENVRC~",
        ".env.example",
    ] {
        let path = format!("/p/{name}");
        assert_eq!(rule(&g, &path, Act::Read), Some(Rule::EnvFile), "{name}");
        assert!(g.check(Path::new(&path), Act::Read, false).is_err(), "{name}");
        assert!(g.check(Path::new(&path), Act::Write, false).is_err(), "{name}");
    }
    // Beneath a directory of the family: everything in it.
    assert_eq!(rule(&g, "/p/.env.d/db", Act::Read), Some(Rule::EnvFile));
    for name in
        ["env", "venv", ".venv", "environment.txt", "dotenv", "config.env.js", "x.environment", "envrc"]
    {
        assert_eq!(rule(&g, &format!("/p/{name}"), Act::Read), None, "{name}");
    }
}

/// `.envrc` holds keys and is a script direnv runs: reading it meets the
/// secret rule, changing it the protected one, so each grant lifts only
/// its own half.
#[test]
fn envrc_is_a_secret_to_read_and_protected_to_change() {
    let g = plain();
    for path in ["/p/.envrc", "/p/sub/.ENVRC"] {
        assert_eq!(rule(&g, path, Act::Read), Some(Rule::EnvFile), "{path}");
        for act in [Act::Write, Act::Create, Act::Truncate, Act::Remove, Act::RenameFrom, Act::MakeDir] {
            let hit = g.check(Path::new(path), act, false).unwrap_err();
            assert_eq!((hit.rule, hit.class), (Rule::ShellHook, Class::Protected), "{path} {act:?}");
        }
    }
    // Its editor copies are secrets only: direnv runs none of them.
    assert_eq!(rule(&g, "/p/.envrc~", Act::Write), Some(Rule::EnvFile));
    let to = |grants: &[&str]| Grants::new(grants.iter().map(PathBuf::from));
    let write_granted = Guard::new(to(&["/p/.envrc"]), Grants::default(), None, []);
    assert!(write_granted.check(Path::new("/p/.envrc"), Act::Write, false).unwrap().is_some());
    assert!(write_granted.check(Path::new("/p/.envrc"), Act::Read, false).is_err());
    let read_granted = Guard::new(Grants::default(), to(&["/p/.envrc"]), None, []);
    assert!(read_granted.check(Path::new("/p/.envrc"), Act::Read, false).unwrap().is_some());
    assert!(read_granted.check(Path::new("/p/.envrc"), Act::Write, false).is_err());
}

#[test]
fn credentials_and_keys_are_secret() {
    let g = plain();
    for (path, want) in [
        ("/u/me/.ssh/id_rsa", Rule::SshKey),
        ("/u/me/.ssh/id_ed25519", Rule::SshKey),
        ("/u/me/.ssh/id_work_github", Rule::SshKey),
        ("/p/deploy/id_rsa", Rule::SshKey),
        ("/p/deploy/id_rsa~", Rule::SshKey),
        ("/u/me/.netrc", Rule::Credentials),
        ("/p/.pgpass", Rule::Credentials),
        ("/p/.npmrc", Rule::Credentials),
        ("/p/.pypirc", Rule::Credentials),
        ("/u/me/.git-credentials", Rule::Credentials),
        ("/u/me/.aws/credentials", Rule::Credentials),
        ("/u/me/.aws/sso/cache/x.json", Rule::Credentials),
        ("/u/me/.config/gcloud/credentials.db", Rule::Credentials),
        ("/u/me/.kube/config", Rule::Credentials),
        ("/u/me/.docker/config.json", Rule::Credentials),
        ("/u/me/.config/gh/hosts.yml", Rule::Credentials),
        ("/u/me/.cargo/credentials.toml", Rule::Credentials),
        ("/u/me/.gnupg/private-keys-v1.d/x.key", Rule::Credentials),
        ("/u/me/.azure/msal_token_cache.json", Rule::Credentials),
    ] {
        assert_eq!(rule(&g, path, Act::Read), Some(want), "{path}");
    }
    for path in
        ["/u/me/.ssh/id_rsa.pub", "/u/me/.ssh/known_hosts", "/u/me/.aws/config", "/p/src/credentials.rs"]
    {
        assert_eq!(rule(&g, path, Act::Read), None, "{path}");
    }
}

#[test]
fn the_repository_s_executable_configuration_is_protected_and_the_rest_of_git_is_not() {
    let g = plain();
    for (path, want) in [
        ("/p/.git", Rule::GitDir),
        ("/p/sub/.git", Rule::GitDir),
        ("/p/.git/config", Rule::GitConfig),
        ("/p/.GIT/CONFIG", Rule::GitConfig),
        ("/p/.git/config.worktree", Rule::GitConfig),
        ("/p/.git/commondir", Rule::GitConfig),
        ("/p/.git/hooks", Rule::GitHooks),
        ("/p/.git/hooks/pre-commit", Rule::GitHooks),
        ("/p/.git/modules", Rule::GitDir),
        ("/p/.git/modules/lib", Rule::GitDir),
        ("/p/.git/modules/lib/config", Rule::GitConfig),
        ("/p/.git/modules/lib/hooks/post-checkout", Rule::GitHooks),
        ("/p/.git/modules/a/b/config", Rule::GitConfig),
        ("/p/.git/modules/a/modules/b/hooks/x", Rule::GitHooks),
        ("/p/.git/worktrees", Rule::GitDir),
        ("/p/.git/worktrees/wt", Rule::GitDir),
        ("/p/.git/worktrees/wt/config.worktree", Rule::GitConfig),
        ("/p/.git/worktrees/wt/commondir", Rule::GitConfig),
        ("/p/repo.git/config", Rule::GitConfig),
        ("/p/repo.git/hooks/post-receive", Rule::GitHooks),
        ("/p/.vscode", Rule::EditorConfig),
        ("/p/.vscode/tasks.json", Rule::EditorConfig),
        ("/p/a/.idea/workspace.xml", Rule::EditorConfig),
        ("/p/.devcontainer/devcontainer.json", Rule::EditorConfig),
        ("/p/.claude/settings.json", Rule::AgentConfig),
        ("/p/.cursor/mcp.json", Rule::AgentConfig),
        ("/p/.mcp.json", Rule::AgentConfig),
        ("/u/me/.claude.json", Rule::AgentConfig),
        ("/u/me/.bashrc", Rule::HomeStartup),
        ("/root/.profile", Rule::HomeStartup),
        ("/home/x/.zshrc", Rule::HomeStartup),
        ("/u/me/.gitconfig", Rule::HomeStartup),
        ("/u/me/.ssh/config", Rule::HomeStartup),
        ("/u/me/.ssh/authorized_keys", Rule::HomeStartup),
        ("/u/me/.config/git/config", Rule::HomeStartup),
        ("/u/me/.config/fish/conf.d/x.fish", Rule::HomeStartup),
    ] {
        assert_eq!(rule(&g, path, Act::Write), Some(want), "{path}");
        // Read freely.
        assert_eq!(rule(&g, path, Act::Read), None, "{path}");
        let hit = g.check(Path::new(path), Act::Create, false).unwrap_err();
        assert_eq!((hit.rule, hit.class, hit.granted), (want, Class::Protected, false));
        assert!(hit.to_string().contains("--allow-protected"), "{hit}");
    }
    // What `git add` and `git commit` write.
    for path in [
        "/p/.git/index",
        "/p/.git/index.lock",
        "/p/.git/HEAD",
        "/p/.git/ORIG_HEAD",
        "/p/.git/COMMIT_EDITMSG",
        "/p/.git/objects/ab/cdef0123",
        "/p/.git/objects/pack/pack-1.pack",
        "/p/.git/refs/heads/main",
        "/p/.git/refs/heads/config",
        "/p/.git/refs/heads/hooks/x",
        "/p/.git/logs/HEAD",
        "/p/.git/logs/refs/heads/config",
        "/p/.git/packed-refs",
        "/p/.git/modules/lib/index",
        "/p/.git/modules/lib/objects/ab/cd",
        "/p/.git/info/exclude",
        "/p/.gitignore",
        "/p/.github/workflows/ci.yml",
        "/p/src/.bashrc",
        "/p/src/config",
        "/u/me/proj/.profile",
        "/home/x/y/.bashrc",
    ] {
        assert_eq!(rule(&g, path, Act::Write), None, "{path}");
    }
}

#[test]
fn a_directory_moved_into_a_git_directory_is_refused() {
    let g = plain();
    let into = Act::RenameTo { dir: true };
    for path in ["/p/.git/refs/x", "/p/.git/modules/new", "/p/.git/modules/a/b", "/p/.git/newdir"] {
        assert!(g.matched(path.as_bytes(), into, true).is_some(), "{path}");
    }
    // A file may land where git's own files do.
    assert_eq!(g.matched(b"/p/.git/refs/x", Act::RenameTo { dir: false }, false), None);
    assert_eq!(g.matched(b"/p/src/new", into, true), None);
}

#[test]
fn grants_lift_one_path_and_what_lies_beneath() {
    let g = Guard::new(
        Grants::new([PathBuf::from("/p/.git/hooks")]),
        Grants::new([PathBuf::from("/p/.env.example")]),
        None,
        [],
    );
    let hit = g.check(Path::new("/p/.git/hooks/pre-commit"), Act::Write, false).unwrap().unwrap();
    assert!(hit.granted && hit.rule == Rule::GitHooks);
    assert!(g.check(Path::new("/p/.git/config"), Act::Write, false).is_err());
    assert!(g.check(Path::new("/p/.env.example"), Act::Read, false).unwrap().is_some());
    assert!(g.check(Path::new("/p/.env"), Act::Read, false).is_err());
    assert_eq!(g.check(Path::new("/p/src/main.rs"), Act::Write, false), Ok(None));
}

#[test]
fn deny_globs_match_beneath_their_base_and_bare_names_anywhere() {
    let deny =
        DenySet::new("/p".into(), vec!["*.key".into(), "secret/".into(), "/build/out".into()]).unwrap();
    let g = Guard::new(Grants::all(), Grants::all(), Some(deny), []);
    let denied = |p: &str, dir: bool| g.matched(p.as_bytes(), Act::Read, dir) == Some(Rule::DenyGlob);
    assert!(denied("/p/a/b.key", false));
    assert!(denied("/data/x.key", false));
    assert!(denied("/p/secret", true));
    assert!(denied("/p/a/secret/f", false));
    assert!(!denied("/p/secret", false));
    assert!(denied("/p/build/out", false));
    assert!(!denied("/p/a/build/out", false));
    assert!(!denied("/q/build/out", false));
    assert!(!denied("/p", true));
    assert!(!denied("/", true));
    // A grant never lifts a deny glob.
    assert!(g.check(Path::new("/p/x.key"), Act::Read, false).is_err());
    assert!(DenySet::new("/p".into(), vec!["a\0".into()]).is_err());
    assert!(DenySet::new("rel".into(), vec![]).is_err());
}

#[test]
fn wire_round_trip_and_refusals() {
    let deny = DenySet::new("/p".into(), vec!["*.key".into()]).unwrap();
    let g = Guard::new(
        Grants::new([PathBuf::from("/p/.vscode")]),
        Grants::new([PathBuf::from("/p/.env")]),
        Some(deny),
        [PathBuf::from("/u/me")],
    );
    assert_eq!(Guard::from_wire(&g.to_wire()), Ok(g.clone()));
    let text = serde_json::to_string(&g).unwrap();
    assert_eq!(serde_json::from_str::<Guard>(&text).unwrap(), g);
    assert_eq!(Guard::from_wire(&serde_json::json!({})), Ok(Guard::default()));
    for bad in [
        serde_json::json!([]),
        serde_json::json!({"protected": ["rel"]}),
        serde_json::json!({"secret": ["/a/../b"]}),
        serde_json::json!({"homes": "/x"}),
        serde_json::json!({"deny": [{"base": "/p", "globs": ["[z-a"]}]}),
        serde_json::json!({"deny": [{"base": "p", "globs": []}]}),
    ] {
        assert!(Guard::from_wire(&bad).is_err(), "{bad}");
    }
    let many: Vec<String> = (0..=MAX_GUARD_GRANTS).map(|i| format!("/{i}")).collect();
    assert!(Guard::from_wire(&serde_json::json!({ "protected": many })).is_err());
    let globs: Vec<String> = (0..=MAX_GUARD_DENY).map(|i| format!("g{i}")).collect();
    assert!(Guard::from_wire(&serde_json::json!({"deny": [{"base": "/", "globs": globs}]})).is_err());
}

fn arb_path() -> impl Strategy<Value = PathBuf> {
    proptest::collection::vec(
        prop_oneof![
            Just("p"),
            Just(".git"),
            Just("config"),
            Just("hooks"),
            Just(".env"),
            Just(".vscode"),
            Just("a"),
            Just("x.key")
        ],
        0..5,
    )
    .prop_map(|parts| PathBuf::from(format!("/{}", parts.join("/"))))
}

fn arb_guard() -> impl Strategy<Value = Guard> {
    (
        proptest::collection::vec(arb_path(), 0..3),
        proptest::collection::vec(arb_path(), 0..3),
        proptest::option::of(proptest::sample::select(vec!["*.key", "a/", "/p/config"])),
    )
        .prop_map(|(p, s, deny)| {
            let deny = deny.map(|g| DenySet::new("/p".into(), vec![g.to_string()]).unwrap());
            Guard::new(Grants::new(p), Grants::new(s), deny, [])
        })
}

fn arb_act() -> impl Strategy<Value = Act> {
    prop_oneof![
        Just(Act::Read),
        Just(Act::List),
        Just(Act::Write),
        Just(Act::Create),
        Just(Act::Remove),
        Just(Act::RenameFrom),
        Just(Act::RenameTo { dir: false }),
        Just(Act::RenameTo { dir: true }),
        Just(Act::MakeDir),
    ]
}

proptest! {
    /// Two levels' guards met permit exactly what both permit, whatever
    /// their grants and globs and however they are grouped.
    #[test]
    fn intersection_permits_what_every_level_permits(
        levels in proptest::collection::vec(arb_guard(), 1..4),
        p in arb_path(),
        act in arb_act(),
        dir in any::<bool>(),
    ) {
        let each = levels.iter().all(|g| g.permits(&p, act, dir));
        let folded = levels.iter().fold(Guard::everything(), |acc, g| acc.intersect(g));
        prop_assert_eq!(folded.permits(&p, act, dir), each);
        let rev = levels.iter().rev().fold(Guard::everything(), |acc, g| acc.intersect(g));
        prop_assert_eq!(rev.permits(&p, act, dir), each);
        prop_assert_eq!(Guard::from_wire(&folded.to_wire()), Ok(folded));
    }

    /// A grant set met with another covers exactly what both cover.
    #[test]
    fn grants_intersect_exactly(a in proptest::collection::vec(arb_path(), 0..4), b in proptest::collection::vec(arb_path(), 0..4), p in arb_path()) {
        let (a, b) = (Grants::new(a), Grants::new(b));
        let pb = bytes::bytes(&p);
        prop_assert_eq!(a.intersect(&b).covers(pb), a.covers(pb) && b.covers(pb));
    }

    /// Nothing that reads is refused for being protected, and every act
    /// that changes a protected path is refused without a grant.
    #[test]
    fn protected_paths_are_readable_and_never_changed(p in arb_path(), act in arb_act()) {
        let g = plain();
        let b = bytes::bytes(&p);
        let secret = names::secret(b).is_some();
        match g.check(&p, act, false) {
            Ok(_) => prop_assert!(!secret && (!act.changes() || names::protected(b, &[], false).is_none())),
            Err(hit) => prop_assert!(secret || (act.changes() && hit.class == Class::Protected)),
        }
    }

    /// Any name, however long or decorated, is classified in bounded work.
    #[test]
    fn any_name_is_classified(name in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut path = b"/p/".to_vec();
        path.extend(name.iter().filter(|b| **b != b'/' && **b != 0));
        let _ = names::secret(&path);
        let _ = names::protected(&path, &[b"/p"], true);
    }
}
