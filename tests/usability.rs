//! What the command line tells a user: a one-seed run's verdict, a
//! replay of several traces reporting each, a missing root's meaning, a
//! directory root read as a file, a client command outside airlock.

mod common;

use common::*;
use std::process::Command;

#[test]
fn one_seed_ends_with_its_verdict() {
    let out = Command::new(airlock()).args(["sim", "--seed", "3"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("seed 3 passed"), "{stdout}");
}

#[test]
fn replay_reports_every_trace_and_refuses_one_without_records() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.jsonl");
    let rec = Command::new(airlock()).args(["sim", "--seed", "5", "--record"]).arg(&good).output().unwrap();
    assert_eq!(rec.status.code(), Some(0), "{}", String::from_utf8_lossy(&rec.stdout));
    let header = std::fs::read_to_string(&good).unwrap().lines().next().unwrap().to_owned();
    let empty = dir.path().join("header-only.jsonl");
    std::fs::write(&empty, format!("{header}\n")).unwrap();
    let missing = dir.path().join("missing.jsonl");
    let out = Command::new(airlock()).arg("replay").args([&empty, &missing, &good]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].ends_with("header-only.jsonl: line 2: trace has a header and no records"), "{stdout}");
    assert!(lines[1].contains("missing.jsonl: cannot open:"), "{stdout}");
    assert!(lines[2].contains("good.jsonl: ok ("), "{stdout}");
    assert_eq!(lines[3], "3 traces: 1 reproduced, 2 failed", "{stdout}");
}

#[test]
fn a_missing_root_without_extension_is_named_a_file_root_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "build", "--allow-rw", "out.txt", "--allow", "."],
        &sh(r#"echo x | "$AIRLOCK" fs write build && "$AIRLOCK" fs cat build"#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let notes: Vec<&str> = run
        .output
        .stderr
        .split(|b| *b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .filter(|l| l.starts_with("airlock: note:"))
        .collect();
    assert_eq!(
        notes,
        ["airlock: note: --allow-rw build: does not exist; taken as a file root (that one file, created on first write), not a directory"],
        "{}",
        run.stderr()
    );
    assert_eq!(run.stdout(), "x\n");
    assert!(dir.path().join("build").is_file());
}

/// A root whose directory does not exist could never be created: refused
/// before the child starts, naming the flag, with no note calling it a
/// file root.
#[test]
fn a_root_whose_directory_is_missing_is_refused_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("child-ran");
    for (flag, root) in [("--allow", "nope/x"), ("--allow-rw", "/nope/x"), ("--allow", "file.txt/x")] {
        std::fs::write(dir.path().join("file.txt"), "a file, not a directory").unwrap();
        let out = Command::new(airlock())
            .args(["run", flag, root, "--no-sandbox", "--", "touch"])
            .arg(&marker)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert!(
            stderr.starts_with(&format!("airlock: {flag} {root}: does not exist, and its directory ")),
            "{stderr}"
        );
        assert!(stderr.contains("is not an existing directory"), "{stderr}");
        assert!(!stderr.contains("taken as a file root"), "{stderr}");
        assert!(!marker.exists(), "the child ran for {flag} {root}");
    }
}

/// The root directory itself is a directory: said so, not called a path
/// outside every root.
#[test]
fn fs_cat_of_a_directory_root_says_it_is_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let root_arg = root.display().to_string();
    let script = format!(
        r#""$AIRLOCK" fs cat {root_arg}; echo "root=$?"; "$AIRLOCK" fs cat {root_arg}/; echo "slash=$?""#
    );
    let run = run_in(dir.path(), &["--allow", &root_arg], &sh(&script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "root=1\nslash=1\n");
    let stderr = run.stderr();
    for shown in [root_arg.clone(), format!("{root_arg}/")] {
        let want = format!("airlock fs: {shown}: E_PERM: is a directory, not a regular file");
        assert!(stderr.lines().any(|l| l == want), "want {want:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("outside every allowed root"), "{stderr}");
    run.assert_no_leaks();
}

/// Outside airlock, a client command fails like any of its errors (exit
/// 1, saying why), not as airlock failing to start (125).
#[test]
fn client_commands_outside_airlock_exit_1() {
    for args in [&["fs", "cat", "x"][..], &["fs", "write", "x"], &["fd", "read", "fd:1"]] {
        let out = Command::new(airlock())
            .args(args)
            .env_remove("AIRLOCK_FD")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("airlock {}: ", args[0])), "{args:?}: {stderr}");
        assert!(stderr.contains("connecting to the airlock proxy"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_missing_pricing_file_is_named_by_its_resolved_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/airlock.toml"),
        "[broker]\nbase_url = \"http://127.0.0.1:9/v1\"\npricing = \"pricing.json\"\n",
    )
    .unwrap();
    let out = Command::new(airlock())
        .args(["run", "--config", "conf/airlock.toml", "--", "true"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    let resolved = dir.path().canonicalize().unwrap().join("conf/pricing.json");
    assert!(stderr.contains(&format!("broker.pricing: reading {}:", resolved.display())), "{stderr}");
}

#[test]
fn airlock_log_writes_no_colour_codes_to_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(airlock())
        .args(["run", "--allow-rw", ".", "--", "sh", "-c", r#"echo x | "$AIRLOCK" fs write f"#])
        .current_dir(dir.path())
        .env("AIRLOCK_LOG", "debug")
        .env_remove("AIRLOCK_FD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("DEBUG"), "AIRLOCK_LOG=debug logged nothing: {stderr}");
    assert!(!stderr.contains('\x1b'), "colour codes in a non-terminal's log: {stderr:?}");
}
