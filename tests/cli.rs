//! `airlock sim`, `airlock replay` and `--record` from the command line.

mod common;

use common::*;
use std::process::Command;

#[test]
fn sim_runs_seeds_and_summarizes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(airlock())
        .args(["sim", "--seeds", "40", "--jobs", "2", "--trace-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("40 seeds (default scenario)"), "{stdout}");
    assert!(stdout.contains("passed 40, failed 0"), "{stdout}");
    assert!(stdout.contains("faults injected: "), "{stdout}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no failure traces expected");
}

/// `airlock sim | head`: the reader is gone before the summary is
/// written. The process ends as SIGPIPE would end it, without a panic.
#[test]
fn sim_whose_reader_is_gone_exits_quietly() {
    let mut child = Command::new(airlock())
        .args(["sim", "--seeds", "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The only read end closes before the simulator has written anything.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn sim_one_seed_describes_its_swarm_and_records_the_same_trace_twice() {
    let dir = tempfile::tempdir().unwrap();
    let record = |name: &str| {
        let path = dir.path().join(name);
        let out = Command::new(airlock())
            .args(["sim", "--seed", "9", "--scenario", "nested", "--record"])
            .arg(&path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        assert!(stdout.starts_with("seed 9 [nested] clients="), "{stdout}");
        std::fs::read(path).unwrap()
    };
    let a = record("a.jsonl");
    let b = record("b.jsonl");
    assert!(a == b, "the same seed gave two different traces");
    let replay = Command::new(airlock()).arg("replay").arg(dir.path().join("a.jsonl")).output().unwrap();
    assert_eq!(replay.status.code(), Some(0), "{}", String::from_utf8_lossy(&replay.stdout));
}

#[test]
fn a_recorded_session_replays_and_a_tampered_one_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("session.jsonl");
    let trace_arg = trace.display().to_string();
    let run = run_in(
        dir.path(),
        &["--allow-rw", ".", "--record", &trace_arg],
        &sh(r#"echo hi | "$AIRLOCK" fs write f && "$AIRLOCK" fs cat f"#),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let replay = |path: &std::path::Path| Command::new(airlock()).arg("replay").arg(path).output().unwrap();
    let ok = replay(&trace);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    // Change the file name of the first open effect: the machine yields
    // the original, so replay must fail at that very line.
    let text = std::fs::read_to_string(&trace).unwrap();
    let (n, _) =
        text.lines().enumerate().find(|(_, l)| l.contains(r#""effect":"open""#)).expect("an open effect");
    let tampered: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i == n { l.replace(r#""rel":"f""#, r#""rel":"g""#) } else { l.to_owned() } + "\n")
        .collect();
    let bad = dir.path().join("tampered.jsonl");
    std::fs::write(&bad, tampered).unwrap();
    let failed = replay(&bad);
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert_eq!(failed.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(&format!("line {}: level 0 output differs", n + 1)), "{stdout}");
}

/// `airlock sim --seed S --scenario X --record FILE`, then `airlock replay
/// FILE`: every scenario's trace reproduces exactly.
fn record_and_replay(scenario: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join(format!("{scenario}.jsonl"));
    let rec = Command::new(airlock())
        .args(["sim", "--seed", &seed.to_string(), "--scenario", scenario, "--record"])
        .arg(&trace)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&rec.stdout);
    assert_eq!(rec.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&rec.stderr));
    assert!(stdout.contains(&format!("seed {seed} passed")), "{stdout}");
    let replay = Command::new(airlock()).arg("replay").arg(&trace).output().unwrap();
    let out = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(0), "{scenario}: {out}");
    assert!(out.contains(": ok ("), "{scenario}: {out}");
    // Something was checked: the counts of a real session, not of a header alone.
    assert!(!out.contains("(0 inputs, 0 outputs)"), "{scenario}: {out}");
}

macro_rules! every_scenario_replays {
    ($($name:ident: $scenario:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            for seed in [3, 11] {
                record_and_replay($scenario, seed);
            }
        }
    )*};
}

every_scenario_replays! {
    the_default_scenarios_recorded_trace_replays: "default",
    the_nested_scenarios_recorded_trace_replays: "nested",
    the_broker_scenarios_recorded_trace_replays: "broker",
    the_adversary_scenarios_recorded_trace_replays: "adversary",
    the_pager_scenarios_recorded_trace_replays: "pager",
    the_tool_scenarios_recorded_trace_replays: "tool",
    the_toolexec_scenarios_recorded_trace_replays: "toolexec",
}

/// `airlock sim --help` names every scenario the simulator has.
#[test]
fn sim_help_names_every_scenario() {
    let out = Command::new(airlock()).args(["sim", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    for scenario in airlock_sim::Scenario::ALL {
        assert!(help.contains(&format!("`{scenario}`")), "--help lacks `{scenario}`:\n{help}");
    }
    assert!(!help.contains("not for `airlock replay`"), "{help}");
}
