//! The tool scenario: a VFS tool host against a hostile simulated tool.
//! A seed reproduces its run byte for byte, and a bug planted in the host
//! for each checker class is found by that checker. Its seed sweep is in
//! `tests/seeds.rs` with every scenario's.

// The heap is counted, so every step's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_core::trace::vfs::replay;
use airlock_sim::{record_trace, rerun_vfs, run_seed, run_seed_with_bug, Scenario, SimOptions};

fn opts(seeds: std::ops::Range<u64>, jobs: usize) -> SimOptions {
    SimOptions { seeds, steps: None, clients: None, scenario: Scenario::Tool, jobs, trace_dir: None }
}

#[test]
fn a_tool_seed_reproduces_its_run_byte_for_byte() {
    for seed in [1, 7, 42] {
        let (a, ta) = record_trace(seed, &opts(seed..seed + 1, 1));
        let (b, tb) = record_trace(seed, &opts(seed..seed + 1, 1));
        assert!(ta.len() > 1000, "seed {seed}: a trace of {} bytes", ta.len());
        assert_eq!(ta, tb, "seed {seed}: two runs differ");
        assert_eq!(a, b);
    }
    let (_, t1) = record_trace(1, &opts(1..2, 1));
    let (_, t2) = record_trace(2, &opts(2..3, 1));
    assert_ne!(t1, t2, "different seeds, different runs");
}

/// A tool world's trace replays against the host alone, output for output,
/// and its header reruns the world.
#[test]
fn tool_traces_replay_against_the_host_and_rerun_their_world() {
    for seed in 0..40 {
        let (res, trace) = record_trace(seed, &opts(seed..seed + 1, 1));
        assert!(res.passed(), "seed {seed}: {}", res.swarm_description());
        let report = match replay(trace.as_slice()) {
            Ok(r) => r,
            Err(e) => panic!("seed {seed}: {e}"),
        };
        assert!(report.inputs > 0 && report.outputs > 0, "seed {seed}");
        assert!(report.host.is_finished(), "seed {seed}: the replayed host did not finish");
        let again = rerun_vfs(&report.header).unwrap();
        assert!(again.passed() && again.steps == res.steps, "seed {seed}");
    }
}

/// A failing seed's trace, as `--trace-dir` writes it, replays exactly
/// with the bug on, and its rerun fails the same way.
#[test]
fn a_planted_bug_leaves_a_trace_that_replays_and_fails_again() {
    let dir = std::env::temp_dir().join(format!("airlock-tool-trace-{}", std::process::id()));
    let mut o = opts(0..1, 1);
    o.trace_dir = Some(dir.clone());
    let bug = PlantedBug::ToolLexicalOnly;
    let res = (0..500)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 500 seeds"));
    let path = res.trace.clone().expect("the failing seed's trace is written");
    let file = std::fs::File::open(&path).unwrap();
    let report = replay(std::io::BufReader::new(file)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    let again = rerun_vfs(&report.header).unwrap();
    let invariant = |r: &airlock_sim::SeedResult| r.failure.as_ref().map(|f| f.invariant.clone());
    assert_eq!(invariant(&again), invariant(&res));
    assert_eq!(invariant(&res).as_deref(), Some("policy"));
    // `AIRLOCK_PLANTED_TRACE_DIR=$PWD/traces/planted` refreshes the kept copy.
    if let Some(keep) = std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR") {
        let name = format!("{bug:?}-seed-{}-tool.jsonl", res.seed);
        std::fs::copy(&path, std::path::PathBuf::from(keep).join(name)).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each planted bug is found within 500 seeds, by the checker of its
/// class; the correct host passes the same seed.
fn planted(bug: PlantedBug, invariant: &str) -> airlock_sim::SeedResult {
    let o = opts(0..1, 1);
    let res = (0..500)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 500 seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, invariant, "{bug:?}: {}", res.swarm_description());
    assert!(run_seed(res.seed, &o).passed(), "seed {} fails without the bug", res.seed);
    res
}

#[test]
fn planted_late_result_answered_twice_is_found() {
    planted(PlantedBug::ToolAnswersLateResult, "one_response");
}

/// A buffer the host allocates but never counts is found by the heap
/// check, shrunk, and its trace replays and fails the same way again.
#[test]
fn planted_uncounted_buffer_is_found() {
    let failure = found_shrunk_and_replayed(PlantedBug::ToolUncountedBuffer, "bounded_memory", 500);
    // The limit named is the host's byte limit it counts most under then.
    let named = ["max_line", "max_pending", "stderr_tail", "max_stdin_backlog"]
        .iter()
        .any(|l| failure.message.contains(&format!("breaks {l}")));
    assert!(named, "{}", failure.message);
}

/// The first of `seeds` seeds that fails under `bug`, by `invariant`: the
/// correct host passes it, its run is shrunk, and its trace replays
/// exactly and, rerun, fails the same way. Returns the shrunk failure.
fn found_shrunk_and_replayed(bug: PlantedBug, invariant: &str, seeds: u64) -> airlock_sim::Failure {
    let dir = std::env::temp_dir().join(format!("airlock-tool-{bug:?}-{}", std::process::id()));
    let mut o = opts(0..1, 1);
    o.trace_dir = Some(dir.clone());
    let res = (0..seeds)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for {seeds} seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, invariant, "{bug:?}: {}", res.swarm_description());
    let shrunk = res.shrunk.clone().expect("the failing run is shrunk");
    assert!(shrunk.max_steps as u64 <= failure.step, "{}", res.swarm_description());
    assert!(
        run_seed(res.seed, &opts(res.seed..res.seed + 1, 1)).passed(),
        "seed {} fails without the bug",
        res.seed
    );
    let path = res.trace.clone().expect("the failing seed's trace is written");
    let report = replay(std::io::BufReader::new(std::fs::File::open(&path).unwrap()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    let again = rerun_vfs(&report.header).unwrap();
    assert_eq!(again.failure.map(|f| f.invariant), Some(invariant.to_string()));
    // `AIRLOCK_PLANTED_TRACE_DIR=$PWD/traces/planted` refreshes the kept copy.
    if let Some(keep) = std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR") {
        let name = format!("{bug:?}-seed-{}-tool.jsonl", res.seed);
        std::fs::copy(&path, std::path::PathBuf::from(keep).join(name)).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
    failure
}

#[test]
fn planted_lexical_only_policy_is_found() {
    planted(PlantedBug::ToolLexicalOnly, "policy");
}

/// DESIGN.md invariant 13: a rename that skips the guard moves a
/// protected path away, or a file onto one.
#[test]
fn planted_rename_without_the_guard_is_found() {
    found_shrunk_and_replayed(PlantedBug::ToolGuardSkipsRename, "protected_paths", 1000);
}

#[test]
fn planted_scrub_of_text_only_is_found() {
    planted(PlantedBug::ToolScrubTextOnly, "secret");
}

#[test]
fn planted_missing_sigkill_is_found() {
    planted(PlantedBug::ToolNoKill, "reaped");
}

#[test]
fn planted_missing_op_timeout_is_found() {
    planted(PlantedBug::ToolNoOpTimeout, "liveness");
}

#[test]
fn planted_reading_past_max_pending_is_found() {
    planted(PlantedBug::ToolReadsPastPending, "bounded");
}

/// The host ends the run when the tool's stdout ends with everything
/// answered; with its stdin already closed by the tool, only the SIGTERM
/// shows that decision, and the `reaped` check expects it by the grace.
#[test]
fn planted_stdout_end_ignored_is_found() {
    planted(PlantedBug::ToolStdoutEndIgnored, "reaped");
}

/// The worlds reach every outcome of the table (so every ending path is
/// under the checkers), and exercise the tool's own cancel, the host's
/// pause on a full queue, and refusals.
#[test]
fn tool_worlds_reach_every_outcome() {
    let mut statuses = std::collections::BTreeSet::new();
    let (mut cancels, mut refusals, mut timeouts) = (0, 0, 0);
    for seed in 0..300 {
        let (_, trace) = record_trace(seed, &opts(seed..seed + 1, 1));
        let text = String::from_utf8(trace).unwrap();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(s) = v["output"]["finished"]["exit_status"].as_i64() {
                statuses.insert(if s > 128 { 128 } else { s });
            }
            if let Some(b) = v["output"]["tool_stdin"].as_str() {
                let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b).unwrap();
                let s = String::from_utf8_lossy(&bytes);
                cancels += s.matches("cancelled by the tool").count();
                refusals += s.matches("-32001").count();
                timeouts += s.matches("-32004").count();
            }
        }
    }
    assert_eq!(statuses.into_iter().collect::<Vec<_>>(), vec![0, 1, 3, 4, 5, 124, 128]);
    assert!(cancels > 10 && refusals > 100 && timeouts > 5, "{cancels} {refusals} {timeouts}");
}

/// Seeds that once found a bug in a soak: each still passes.
#[test]
fn tool_regression_seeds_pass() {
    // 2452: a queued invalid line lost its answer when the run ended.
    {
        let seed = 2452;
        let r = run_seed(seed, &opts(seed..seed + 1, 1));
        assert!(r.passed(), "{}", r.swarm_description());
    }
}

/// A file operation that decides on the path it resolved and then reaches
/// it again by that path, rather than in the directory it checked, is
/// found by the attacker that swaps a directory for a symlink mid-operation
/// (within 1,000 seeds), and its shrunk trace replays and fails again.
#[test]
fn planted_reopen_by_path_is_found_and_its_trace_replays() {
    found_shrunk_and_replayed(PlantedBug::ToolReopenByPath, "policy", 1000);
}
