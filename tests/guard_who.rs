//! Protected paths as both users (root, and uid/gid 65534) and in both
//! modes (namespaces, and the forced fallback), against the real binary:
//! through the proxy, and in a direct `--sandbox-rw` view, where what
//! exists is kept read-only and what does not is held by a placeholder
//! (made before the view, gone after it, and swept by the next airlock
//! when a SIGKILL left it).

mod common;
mod confine_common;
mod confine_who;

use confine_common::Mode;
use confine_who::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// git on the host, as the test's user, in a tree another may own.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "safe.directory=*"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The fixture's project made a git checkout with one commit, owned by
/// the fixture's user.
fn checkout(f: &Fixture) {
    let p = &f.project;
    git(p, &["init", "-q"]);
    std::fs::write(p.join("f.txt"), "x\n").unwrap();
    std::fs::write(p.join(".env"), "S=secret\n").unwrap();
    git(p, &["add", "f.txt"]);
    git(p, &["-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "init"]);
    let (uid, gid) = f.who.ids();
    let status = Command::new("chown").arg("-R").arg(format!("{uid}:{gid}")).arg(p).status().unwrap();
    assert!(status.success(), "chown {}", p.display());
}

struct Ran {
    output: Output,
    report: Value,
}

impl Ran {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
}

fn run(f: &Fixture, mode: Mode, args: &[&str], script: &str) -> Ran {
    let report = f.report_path();
    let output = f
        .run_command(mode, args, &report, &["sh".into(), "-c".into(), script.into()])
        .output()
        .expect("airlock starts");
    let report = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    Ran { output, report }
}

fn ctx(mode: Mode, who: Who) -> String {
    format!("{mode:?} as {who:?}")
}

/// Every attempt through the proxy on git's executable configuration is
/// refused, whoever runs airlock and however it confines: the host's next
/// `git status` runs nothing the child wrote, and the rest of `.git`
/// stays writable.
#[test]
fn the_proxy_refuses_every_change_to_a_protected_path_as_each_user_in_each_mode() {
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        checkout(&f);
        let config = std::fs::read(f.project.join(".git/config")).unwrap();
        let ran = run(
            &f,
            mode,
            &["--allow-rw", "."],
            r#"
            printf '[core]\n\tfsmonitor = touch pwned\n' | "$AIRLOCK" fs append .git/config && echo APPENDED
            "$AIRLOCK" fs rename .git/config .git/config.old && echo RENAMED
            printf '[core]\n' | "$AIRLOCK" fs write .git/config.worktree && echo WORKTREE-CONFIG
            printf '#!/bin/sh\ntouch pwned\n' | "$AIRLOCK" fs write .git/hooks/pre-commit && echo HOOKED
            "$AIRLOCK" fs mkdir .vscode && echo VSCODE
            printf 'touch pwned\n' | "$AIRLOCK" fs write .envrc && echo ENVRC
            printf 'ok\n' | "$AIRLOCK" fs write .git/notes.txt && echo REST-OF-GIT-WRITABLE
            true
        "#,
        );
        let c = ctx(mode, who);
        assert_eq!(ran.output.status.code(), Some(0), "{c}: {}", ran.stderr());
        assert_eq!(ran.stdout(), "REST-OF-GIT-WRITABLE\n", "{c}: {}", ran.stderr());
        for rule in ["git_config", "shell_hook"] {
            assert!(ran.report["guarded"].to_string().contains(rule), "{c}: {rule}: {}", ran.report);
        }
        assert_eq!(std::fs::read(f.project.join(".git/config")).unwrap(), config, "{c}");
        for gone in [".git/config.worktree", ".git/hooks/pre-commit", ".vscode", ".envrc"] {
            assert!(!f.project.join(gone).exists(), "{c}: {gone}");
        }
        git(&f.project, &["status", "--short"]);
        assert!(!f.project.join("pwned").exists(), "{c}: git ran what the child wrote");
    }
}

/// The names a `--sandbox-rw` child tries to create that git, an editor
/// or an agent would run, each printing its label when it got through.
const CREATE: &str = r#"
    mkdir -p .vscode && echo '{"tasks":[]}' > .vscode/tasks.json && echo VSCODE
    mkdir -p .claude && echo '{}' > .claude/settings.json && echo CLAUDE
    echo '{}' > .mcp.json && echo MCP
    printf 'touch pwned\n' > .envrc && echo ENVRC
    printf '[core]\n\tfsmonitor = touch pwned\n' > .git/config.worktree && echo WORKTREE-CONFIG
    mkdir -p .git/modules/m && echo x > .git/modules/m/config && echo MODULE-CONFIG
    printf '#!/bin/sh\ntouch pwned\n' > .git/hooks/post-checkout && echo HOOKED
    mkdir -p deep && mkdir deep/.vscode && echo '{}' > deep/.vscode/tasks.json && echo DEEP
"#;

/// In a direct `--sandbox-rw` checkout, git commits as before; the
/// protected names that exist stay read-only and those that do not are
/// held, so none can be made, except beneath a directory the child made,
/// which the session's end reports and renames aside. The placeholders go
/// with the session.
/// Without a mount namespace such a view is refused outright.
#[test]
fn a_sandbox_rw_checkout_cannot_gain_executable_configuration_as_each_user_in_each_mode() {
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        checkout(&f);
        let config = std::fs::read(f.project.join(".git/config")).unwrap();
        let script = format!(
            "cat .env; echo y > g.txt && git add g.txt && git -c user.email=t@example.com -c user.name=t \
             commit -qm two && echo COMMITTED\n{CREATE}\ntrue"
        );
        let ran = run(&f, mode, &["--sandbox-rw", f.project.to_str().unwrap()], &script);
        let c = ctx(mode, who);
        if mode == Mode::Fallback {
            // Nothing could mask `.env` or keep git's configuration
            // read-only: refused, naming the flag that accepts it.
            assert_eq!(ran.output.status.code(), Some(125), "{c}: {}", ran.stderr());
            assert!(ran.stderr().contains("takes a mount namespace"), "{c}: {}", ran.stderr());
            assert!(ran.stderr().contains("pass --allow-"), "{c}: {}", ran.stderr());
            assert_eq!(ran.stdout(), "", "{c}");
            // Accepted on purpose, git works as before.
            let git_dir = f.project.join(".git");
            let commit = "echo z > h.txt && git add h.txt && git -c user.email=t@example.com -c user.name=t \
                          commit -qm three && echo COMMITTED";
            let args = [
                "--sandbox-rw",
                f.project.to_str().unwrap(),
                "--allow-protected",
                git_dir.to_str().unwrap(),
                "--allow-secret",
                ".env",
            ];
            let ran = run(&f, mode, &args, commit);
            assert_eq!(ran.stdout(), "COMMITTED\n", "{c}: {}", ran.stderr());
            assert_eq!(git(&f.project, &["log", "-1", "--format=%s"]), "three\n", "{c}");
            continue;
        }
        assert_eq!(ran.output.status.code(), Some(0), "{c}: {}", ran.stderr());
        assert_eq!(ran.stdout(), "COMMITTED\nDEEP\n", "{c}: {}", ran.stderr());
        assert_eq!(git(&f.project, &["log", "--format=%s"]), "two\ninit\n", "{c}");
        assert_eq!(std::fs::read(f.project.join(".git/config")).unwrap(), config, "{c}");
        let covered = ran.report["direct_covered"].to_string();
        assert!(covered.contains("\"hold\""), "{c}: {}", ran.report);
        // The one made beneath a directory the child made is renamed
        // aside at the end, kept for the user, where nothing runs it.
        let deep = f.project.join("deep/.vscode");
        let aside = f.project.join("deep/.vscode.airlock-refused");
        assert_eq!(ran.report["protected_created"], serde_json::json!([deep]), "{c}: {}", ran.report);
        assert_eq!(
            ran.report["protected_set_aside"],
            serde_json::json!([{"path": deep, "to": aside}]),
            "{c}: {}",
            ran.report
        );
        assert!(!deep.exists(), "{c}: deep/.vscode stays where an editor runs it");
        assert_eq!(std::fs::read_to_string(aside.join("tasks.json")).unwrap(), "{}\n", "{c}");
        // The placeholders are gone, and git sees only what the child
        // wrote on purpose.
        for gone in
            [".vscode", ".claude", ".mcp.json", ".envrc", ".git/config.worktree", ".git/modules", ".cursor"]
        {
            assert!(!f.project.join(gone).exists(), "{c}: {gone} stays on the host");
        }
        assert!(!f.project.join(".git/hooks/post-checkout").exists(), "{c}");
        let status = git(&f.project, &["status", "--short", "--untracked-files=all"]);
        let status: Vec<&str> = status.lines().filter(|l| !l.starts_with("?? report-")).collect();
        assert_eq!(status, ["?? .env", "?? deep/.vscode.airlock-refused/tasks.json"], "{c}");
        assert!(!f.project.join("pwned").exists(), "{c}: git ran what the child wrote");
    }
}

/// A plain directory (no repository) given writable: a repository, or
/// an editor's or agent's configuration, cannot be started in it under
/// namespaces; in the fallback, where no mount holds them, the report
/// says so (`protected_create` not enforced), names what was made, and
/// each is renamed aside at the end.
#[test]
fn a_plain_writable_tree_holds_its_absent_protected_names_as_each_user_in_each_mode() {
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        let script = "git init -q . 2>/dev/null && echo GIT-INIT
            mkdir .vscode 2>/dev/null && echo VSCODE
            mkdir .idea 2>/dev/null && echo IDEA
            echo '{}' > .mcp.json 2>/dev/null && echo MCP
            echo 'touch pwned' > .envrc 2>/dev/null && echo ENVRC
            echo plain > notes.txt && echo PLAIN";
        let ran = run(&f, mode, &["--sandbox-rw", f.project.to_str().unwrap()], script);
        let c = ctx(mode, who);
        assert_eq!(ran.output.status.code(), Some(0), "{c}: {}", ran.stderr());
        let gaps = ran.report["sandbox"]["not_enforced"].to_string();
        let made = ran.report["protected_created"].to_string();
        match mode {
            Mode::Namespaces => {
                assert_eq!(ran.stdout(), "PLAIN\n", "{c}: {}", ran.stderr());
                assert!(!gaps.contains("protected_create"), "{c}: {gaps}");
                for gone in [".git", ".vscode", ".idea", ".mcp.json", ".envrc"] {
                    assert!(!f.project.join(gone).exists(), "{c}: {gone}");
                }
            }
            Mode::Fallback => {
                assert_eq!(
                    ran.stdout(),
                    "GIT-INIT\nVSCODE\nIDEA\nMCP\nENVRC\nPLAIN\n",
                    "{c}: {}",
                    ran.stderr()
                );
                assert!(gaps.contains("protected_create"), "{c}: {gaps}");
                // What no mount could stop is renamed aside at the end.
                for name in [".git", ".vscode", ".idea", ".mcp.json", ".envrc"] {
                    assert!(made.contains(&format!("/{name}\"")), "{c}: {name} not reported: {made}");
                    assert!(!f.project.join(name).exists(), "{c}: {name} stays where it runs");
                    assert!(
                        f.project.join(format!("{name}.airlock-refused")).exists(),
                        "{c}: {name} is lost"
                    );
                }
                assert!(f.project.join(".git.airlock-refused/config").is_file(), "{c}");
                assert!(ran.stderr().contains("created the protected path"), "{c}: {}", ran.stderr());
            }
        }
        assert_eq!(std::fs::read_to_string(f.project.join("notes.txt")).unwrap(), "plain\n", "{c}");
    }
}

/// A SIGKILLed airlock removes nothing; the next one of the same user
/// removes the placeholders the dead one's ledger names, and only those.
#[test]
fn placeholders_left_by_a_killed_session_go_with_the_next_start() {
    for who in WHOS {
        let f = Fixture::new(who);
        std::fs::create_dir(f.project.join(".idea")).unwrap();
        chown(&f.project.join(".idea"), who.ids());
        let mut child = f
            .run_command(
                Mode::Namespaces,
                &["--sandbox-rw", f.project.to_str().unwrap()],
                &f.report_path(),
                &["sh".into(), "-c".into(), "echo up; exec sleep 60".into()],
            )
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
            .unwrap();
        assert_eq!(line, "up\n", "{who:?}");
        assert!(f.project.join(".vscode").is_dir(), "{who:?}: no placeholder while the session runs");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(f.project.join(".vscode").is_dir(), "{who:?}: a SIGKILLed airlock removed its placeholders");
        // Any later start of the same user sweeps them.
        let out =
            f.airlock(Mode::Namespaces).args(["run", "--", "true"]).env("TMPDIR", "/tmp").output().unwrap();
        assert!(out.status.success(), "{who:?}: {out:?}");
        assert!(!f.project.join(".vscode").exists(), "{who:?}: the dead session's placeholder stays");
        assert!(f.project.join(".idea").is_dir(), "{who:?}: the user's own directory went");
    }
}

/// What the end of a writable view cannot be talked out of: a protected
/// name made as a symlink (`deep/.envrc -> payload.sh`, which direnv and
/// an editor follow) and more protected names than a view may cover
/// (`MAX_COVERS`, 4096) are each renamed aside, links as links; stderr
/// names the first few and counts the rest, the report lists them all.
#[test]
fn links_and_thousands_of_protected_names_are_set_aside_as_each_user_in_each_mode() {
    const MANY: usize = 4200;
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        let script = format!(
            "mkdir -p deep/payload && echo 'touch pwned' > deep/payload.sh && ln -s payload.sh deep/.envrc \
             && ln -s payload deep/.vscode && echo LINKS\n\
             seq {MANY} | sed 's|.*|m/&/.claude|' | xargs mkdir -p && echo MANY"
        );
        let ran = run(&f, mode, &["--sandbox-rw", f.project.to_str().unwrap()], &script);
        let c = ctx(mode, who);
        assert_eq!(ran.output.status.code(), Some(0), "{c}: {}", ran.stderr());
        assert_eq!(ran.stdout(), "LINKS\nMANY\n", "{c}: {}", ran.stderr());
        let aside = ran.report["protected_set_aside"].as_array().map_or(0, Vec::len);
        assert_eq!(aside, MANY + 2, "{c}: {}", ran.stderr());
        for link in ["deep/.envrc", "deep/.vscode"] {
            assert!(std::fs::symlink_metadata(f.project.join(link)).is_err(), "{c}: {link} stays");
            let to = std::fs::symlink_metadata(f.project.join(format!("{link}.airlock-refused")));
            assert!(to.is_ok_and(|m| m.file_type().is_symlink()), "{c}: {link} not set aside as a link");
        }
        assert!(!f.project.join(format!("m/{MANY}/.claude")).exists(), "{c}");
        assert!(f.project.join(format!("m/{MANY}/.claude.airlock-refused")).is_dir(), "{c}");
        let said = ran.stderr().matches("created the protected path").count();
        assert_eq!(said, 16, "{c}: {}", ran.stderr());
        let more = format!("{} more protected paths", MANY + 2 - 16);
        assert!(ran.stderr().contains(&more), "{c}: {}", ran.stderr());
    }
}
