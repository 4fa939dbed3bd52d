//! `--audit FILE`: one JSON line per file operation and policy decision,
//! from a real child's operations.

mod common;

use common::*;
use serde_json::Value;

fn records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no audit file: {e}"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad audit line {l:?}: {e}")))
        .collect()
}

#[test]
fn every_file_operation_and_refusal_is_recorded_with_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::create_dir(dir.path().join("ro")).unwrap();
    std::fs::write(dir.path().join("ro/r.txt"), "read me\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("data/link")).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "data", "--allow", "ro", "--audit", &audit_arg],
        &sh(r#"
            echo hello | "$AIRLOCK" fs write data/a.txt
            "$AIRLOCK" fs cat ro/r.txt
            "$AIRLOCK" fs cat /etc/passwd || true
            echo x | "$AIRLOCK" fs write ro/new.txt || true
            "$AIRLOCK" fs cat data/link || true
        "#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    run.assert_no_leaks();
    let recs = records(&audit);
    for r in &recs {
        assert!(r["ts"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
        assert_eq!(r["allowed"].as_bool(), Some(r.get("code").is_none()), "{r}");
    }
    let opens: Vec<(String, String, bool)> = recs
        .iter()
        .filter(|r| r["op"] == "open")
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_owned(),
                r["mode"].as_str().unwrap().to_owned(),
                r["allowed"] == true,
            )
        })
        .collect();
    assert_eq!(
        opens,
        [
            ("data/a.txt".to_owned(), "w".to_owned(), true),
            ("ro/r.txt".to_owned(), "r".to_owned(), true),
            ("/etc/passwd".to_owned(), "r".to_owned(), false),
            ("ro/new.txt".to_owned(), "w".to_owned(), false),
            ("data/link".to_owned(), "r".to_owned(), false),
        ],
        "{recs:#?}"
    );
    let refusal = |path: &str| {
        let r = recs.iter().find(|r| r["op"] == "open" && r["path"] == path).unwrap();
        (r["code"].as_str().unwrap().to_owned(), r["reason"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        refusal("/etc/passwd"),
        ("E_PERM".to_owned(), "path is outside every allowed root".to_owned())
    );
    // Each refusal names the rule that decided it.
    let ro_root = std::fs::canonicalize(dir.path().join("ro")).unwrap();
    assert_eq!(refusal("ro/new.txt").1, format!("path is under read-only root {}", ro_root.display()));
    let data = std::fs::canonicalize(dir.path().join("data")).unwrap();
    assert_eq!(
        refusal("data/link").1,
        format!(
            "symlink {}/link leads outside root {}: it resolves to /etc/passwd, outside every allowed root",
            data.display(),
            data.display()
        )
    );
    // Reads and writes name the file their handle was opened on.
    let written: u64 = recs
        .iter()
        .filter(|r| r["op"] == "write" && r["path"] == "data/a.txt")
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(written, 6);
    let read: u64 = recs
        .iter()
        .filter(|r| r["op"] == "read" && r["path"] == "ro/r.txt")
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(read, 8);
    let closes = recs.iter().filter(|r| r["op"] == "close" && r["allowed"] == true).count();
    assert_eq!(closes, 2, "{recs:#?}");
}

#[test]
fn without_audit_nothing_is_written_and_a_nested_level_audits_through_its_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner-audit.jsonl");
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &[
            airlock().to_owned(),
            "run".into(),
            "--allow-rw".into(),
            ".".into(),
            "--audit".into(),
            inner.display().to_string(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            r#"echo deep | "$AIRLOCK" fs write deep.txt"#.into(),
        ],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let recs = records(&inner);
    assert!(
        recs.iter().any(|r| r["op"] == "open" && r["path"] == "deep.txt" && r["allowed"] == true),
        "{recs:#?}"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("deep.txt")).unwrap(), "deep\n");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().filter(|n| n.contains("audit")).count() == 1, "{names:?}");
}

/// A write outside every root (only a subdirectory granted) lands in the
/// session's virtual namespace: it says so once on stderr, naming the
/// file, every audit record of it is marked `"virtual": true`, a write
/// inside the root is not, and nothing reaches the disk.
#[test]
fn a_write_outside_every_root_says_it_is_virtual() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.display().to_string();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "sub", "--audit", &audit_arg],
        &sh(r#"
            echo report | "$AIRLOCK" fs write REPORT.md
            echo notes | "$AIRLOCK" fs write notes.md
            echo real | "$AIRLOCK" fs write sub/real.md
            "$AIRLOCK" fs cat REPORT.md
        "#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "report\n");
    assert!(!dir.path().join("REPORT.md").exists() && !dir.path().join("notes.md").exists());
    assert_eq!(std::fs::read_to_string(dir.path().join("sub/real.md")).unwrap(), "real\n");
    let stderr = run.stderr();
    assert_eq!(stderr.matches("never written to disk").count(), 1, "said once: {stderr}");
    assert!(stderr.contains("REPORT.md is outside every allowed root"), "{stderr}");
    let recs = records(&audit);
    for r in recs.iter().filter(|r| r.get("path").is_some()) {
        let path = r["path"].as_str().unwrap();
        let want = !path.starts_with("sub/");
        assert_eq!(r.get("virtual") == Some(&Value::Bool(true)), want, "{r}");
    }
    let virtual_ops: Vec<&str> =
        recs.iter().filter(|r| r["path"] == "REPORT.md").map(|r| r["op"].as_str().unwrap()).collect();
    assert!(["open", "write", "close", "read"].iter().all(|o| virtual_ops.contains(o)), "{virtual_ops:?}");
}
