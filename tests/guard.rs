//! The guard (protected paths, secret files, `--deny`) against the real
//! binary under the default sandbox, at every door of `airlock run`: the
//! proxy's opens and path operations, the grants that lift it, the
//! report and the audit log (the direct `--sandbox-rw` view, and both
//! users and modes, are tests/guard_who.rs; the served filesystem's door
//! is tests/fuse.rs).

mod common;

use common::{airlock, run_in, sh};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").current_dir(dir).args(args).output().expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git checkout with one commit, and the `.env` family beside it.
fn checkout() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    git(d.path(), &["init", "-q"]);
    git(d.path(), &["config", "user.email", "t@example.com"]);
    git(d.path(), &["config", "user.name", "t"]);
    std::fs::write(d.path().join("f.txt"), "x\n").unwrap();
    git(d.path(), &["add", "f.txt"]);
    git(d.path(), &["commit", "-qm", "init"]);
    for name in SECRETS {
        std::fs::write(d.path().join(name), "S=secret\n").unwrap();
    }
    d
}

const SECRETS: [&str; 6] = [".env", ".ENV", "prod.env", ".env~", "#.env#", ".envrc"];

/// Every attempt on a protected path through the proxy is refused, naming
/// the rule, and leaves git's configuration as it was: the host's next
/// `git status` runs nothing the child wrote.
#[test]
fn the_repositorys_executable_configuration_is_never_changed_through_the_proxy() {
    let d = checkout();
    let config = std::fs::read(d.path().join(".git/config")).unwrap();
    let run = run_in(
        d.path(),
        &["--allow-rw", "."],
        &sh(r#"
            printf '[core]\n\tfsmonitor = touch pwned\n' | "$AIRLOCK" fs append .git/config && echo APPENDED
            printf '[core]\n' | "$AIRLOCK" fs write .git/config && echo WRITTEN
            "$AIRLOCK" fs rename .git/config .git/config.old && echo RENAMED
            "$AIRLOCK" fs remove .git/hooks && echo REMOVED
            printf '#!/bin/sh\ntouch pwned\n' | "$AIRLOCK" fs write .git/hooks/pre-commit && echo HOOKED
            "$AIRLOCK" fs mkdir .vscode && printf '{}' | "$AIRLOCK" fs write .vscode/tasks.json && echo TASKS
            printf 'ok\n' | "$AIRLOCK" fs write .git/notes.txt && echo REST-OF-GIT-WRITABLE
            true
        "#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "REST-OF-GIT-WRITABLE\n", "stderr: {}", run.stderr());
    for rule in ["git_config", "git_hooks"] {
        assert!(run.report["guarded"].to_string().contains(rule), "{rule}: {}", run.report);
    }
    assert!(run.stderr().contains("is a protected path"), "{}", run.stderr());
    assert!(run.stderr().contains("--allow-protected"), "{}", run.stderr());
    assert_eq!(std::fs::read(d.path().join(".git/config")).unwrap(), config);
    assert!(d.path().join(".git/hooks").is_dir());
    assert!(!d.path().join(".git/hooks/pre-commit").exists());
    assert!(!d.path().join(".vscode/tasks.json").exists());
    git(d.path(), &["status", "--short"]);
    assert!(!d.path().join("pwned").exists(), "git ran what the child wrote");
}

/// The `.env` family, in any case and as editors copy it, is refused by
/// name through the proxy, each counted with its rule and written to the
/// audit log; `--allow-secret` shares the one file named, and
/// `--allow-protected` lifts the one path named.
#[test]
fn secret_files_are_refused_and_grants_lift_one_path_each() {
    let d = checkout();
    let audit = d.path().join("audit.jsonl");
    let mut script = String::new();
    for name in SECRETS {
        script.push_str(&format!("\"$AIRLOCK\" fs cat '{name}' && echo 'READ {name}'\n"));
    }
    script.push_str("true\n");
    let run = run_in(d.path(), &["--allow-rw", ".", "--audit", audit.to_str().unwrap()], &sh(&script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "", "stderr: {}", run.stderr());
    let guarded = run.report["guarded"].as_object().expect("the report lists guarded paths");
    for name in SECRETS {
        let path = std::fs::canonicalize(d.path()).unwrap().join(name).to_string_lossy().into_owned();
        assert_eq!(guarded[&path]["class"], "secret", "{name}: {}", run.report);
        assert_eq!(guarded[&path]["refused"], 1, "{name}: {}", run.report);
    }
    let records: Vec<Value> =
        std::fs::read_to_string(&audit).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let refusals = records.iter().filter(|r| r["op"] == "guard" && r["allowed"] == false).count();
    assert_eq!(refusals, SECRETS.len(), "{records:?}");

    let run = run_in(
        d.path(),
        &["--allow-rw", ".", "--allow-secret", ".env", "--allow-protected", ".git/config"],
        &sh(r#"
            "$AIRLOCK" fs cat .env
            "$AIRLOCK" fs cat .envrc && echo READ-ENVRC
            printf '# lifted\n' | "$AIRLOCK" fs append .git/config && echo APPENDED
            printf 'x' | "$AIRLOCK" fs write .git/hooks/post-commit && echo HOOKED
            true
        "#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "S=secret\nAPPENDED\n", "stderr: {}", run.stderr());
    assert!(std::fs::read_to_string(d.path().join(".git/config")).unwrap().ends_with("# lifted\n"));
    assert!(!d.path().join(".git/hooks/post-commit").exists());
}

/// `--deny GLOB` on `run` refuses what it matches, as on `tool`.
#[test]
fn a_deny_glob_refuses_what_it_matches() {
    let d = checkout();
    std::fs::create_dir(d.path().join("notes")).unwrap();
    std::fs::write(d.path().join("notes/a.md"), "private\n").unwrap();
    let run = run_in(
        d.path(),
        &["--allow-rw", ".", "--deny", "notes/*"],
        &sh(r#""$AIRLOCK" fs cat notes/a.md && echo READ; "$AIRLOCK" fs cat f.txt"#),
    );
    assert_eq!(run.stdout(), "x\n", "stderr: {}", run.stderr());
    assert!(run.stderr().contains("--deny"), "{}", run.stderr());
}

/// Without a mount namespace nothing can be masked or kept read-only in a
/// direct view: airlock refuses to start rather than hand it over whole.
#[test]
fn without_namespaces_a_direct_view_that_needs_covering_is_refused() {
    let d = checkout();
    let repo = std::fs::canonicalize(d.path()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(airlock())
        .current_dir(work.path())
        .args(["run", "--sandbox-rw", repo.to_str().unwrap(), "--", "sh", "-c", "cat .env; echo STARTED"])
        .env("AIRLOCK_NO_NAMESPACES", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("takes a mount namespace"), "{stderr}");
}
