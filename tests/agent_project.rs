//! An agent run from its own project directory, under the default
//! sandbox: its code is granted with `--sandbox-ro` inside the allowed
//! root (a direct read, listed in the report and the audit log), its data
//! still goes through airlock, and a file or program the child could not
//! use directly is refused before starting, naming the flag.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Reads its data through `"$AIRLOCK" fs` from a subprocess (which closes
/// descriptor 3), and shows that a direct read of it is refused.
const AGENT: &str = r#"
import os, subprocess, sys
out = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, text=True)
print("via airlock:", out.returncode, out.stdout.strip())
try:
    open("data.txt").read()
    print("direct: read")
except OSError as e:
    print("direct: refused", e.errno)
"#;

fn project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("agent.py"), AGENT).unwrap();
    std::fs::write(project.join("data.txt"), "the data\n").unwrap();
    (dir, project)
}

fn run(cwd: &Path, args: &[&str], path_env: Option<&str>) -> Output {
    Command::new(airlock())
        .current_dir(cwd)
        .arg("run")
        .args(args)
        .env_remove("AIRLOCK_FD")
        .env("PATH", path_env.unwrap_or(SYSTEM_PATH))
        .output()
        .expect("airlock runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn an_agent_runs_from_its_project_and_its_direct_read_is_listed() {
    let (dir, project) = project();
    let report = dir.path().join("report.json");
    let audit = dir.path().join("audit.jsonl");
    let out = run(
        &project,
        &[
            "--allow-rw",
            ".",
            "--sandbox-ro",
            "agent.py",
            "--report",
            report.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
            "--",
            "python3",
            "agent.py",
        ],
        None,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("via airlock: 0 the data"), "{stdout}{stderr}");
    // Only agent.py was granted: the rest of the root is still reached
    // through airlock alone.
    assert!(stdout.contains("direct: refused"), "{stdout}{stderr}");
    let agent = std::fs::canonicalize(project.join("agent.py")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["sandbox"]["fs"], "confined", "{report}");
    assert_eq!(report["sandbox"]["direct_read"], serde_json::json!([agent.to_str().unwrap()]), "{report}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    let first: serde_json::Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    assert_eq!(first["op"], "direct_read", "{audit}");
    assert_eq!(first["path"], agent.to_str().unwrap(), "{audit}");
    // The proxied read is in the log too, after it.
    assert!(audit.lines().skip(1).any(|l| l.contains("data.txt")), "{audit}");
}

#[test]
fn an_argument_the_child_cannot_read_is_refused_before_starting() {
    let (dir, project) = project();
    let marker = dir.path().join("started");
    let out = run(
        &project,
        &[
            "--allow-rw",
            ".",
            "--",
            "sh",
            "-c",
            &format!("touch {}; python3 agent.py", marker.display()),
            "agent.py",
        ],
        None,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("--sandbox-ro agent.py"), "{stderr}");
    assert!(stderr.contains("may not read"), "{stderr}");
    assert!(!marker.exists(), "the child started: {stderr}");

    let out = run(&project, &["--allow-rw", ".", "--", "python3", "agent.py"], None);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("agent.py") && stderr.contains("--sandbox-ro agent.py"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn a_program_first_on_path_the_child_cannot_run_is_refused_naming_it() {
    let (dir, project) = project();
    // A version manager's shim: first on PATH, outside every grant.
    let shims = dir.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let shim = shims.join("python3");
    let marker = dir.path().join("shim-ran");
    std::fs::write(&shim, format!("#!/bin/sh\ntouch {}\nexec /usr/bin/python3 \"$@\"\n", marker.display()))
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", shims.display());
    let args = ["--allow-rw", ".", "--sandbox-ro", "agent.py", "--", "python3", "agent.py"];
    let out = run(&project, &args, Some(&path));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(shim.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("--sandbox-ro"), "{stderr}");
    assert!(out.stdout.is_empty(), "another python3 ran: {}", text(&out.stdout));

    // Granted, it is no longer refused, and the agent runs.
    let shims_arg = shims.to_str().unwrap();
    let args = [
        "--allow-rw",
        ".",
        "--sandbox-ro",
        "agent.py",
        "--sandbox-ro",
        shims_arg,
        "--",
        "python3",
        "agent.py",
    ];
    let out = run(&project, &args, Some(&path));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("via airlock: 0 the data"), "{stdout}{stderr}");
    // Whatever the shim writes stays inside the sandbox: no host file.
    assert!(!marker.exists());
}

#[test]
fn sandbox_ro_of_the_root_or_above_it_is_refused_naming_the_root() {
    let (_dir, project) = project();
    let root = std::fs::canonicalize(&project).unwrap();
    for ro in [".", ".."] {
        let out = run(&project, &["--allow-rw", ".", "--sandbox-ro", ro, "--", "python3", "agent.py"], None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{ro}: {stderr}");
        assert!(stderr.contains(root.to_str().unwrap()), "{ro}: {stderr}");
        assert!(stderr.contains("expose the whole root"), "{ro}: {stderr}");
        assert!(out.stdout.is_empty(), "{ro}: {}", text(&out.stdout));
    }
}

/// `--sandbox-rw PATH` outside every root (a toolchain's cache): the child
/// writes there directly, and the file is on the host afterwards; the same
/// flag on the root itself, inside it or above it is refused naming the
/// root, before anything starts.
#[test]
fn sandbox_rw_outside_the_roots_is_written_directly_and_over_a_root_is_refused() {
    let (dir, project) = project();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cache_arg = cache.to_str().unwrap();
    let out = run(
        &project,
        &[
            "--allow-rw",
            ".",
            "--sandbox-rw",
            cache_arg,
            "--",
            "sh",
            "-c",
            &format!("echo built > {cache_arg}/out"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(cache.join("out")).unwrap(), "built\n");
    for over in [".", "sub", ".."] {
        std::fs::create_dir_all(project.join("sub")).unwrap();
        let marker = dir.path().join("started");
        let script = format!("touch {}", marker.display());
        let out = run(&project, &["--allow-rw", ".", "--sandbox-rw", over, "--", "sh", "-c", &script], None);
        assert_eq!(out.status.code(), Some(125), "--sandbox-rw {over}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("--sandbox-rw") && err.contains("overlaps the allowed root"), "{over}: {err}");
        assert!(!marker.exists(), "--sandbox-rw {over}: the child started");
    }
}
