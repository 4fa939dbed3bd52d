//! The adversary scenario finds each class of confinement bug on its own:
//! every one, planted back into the core, is found within 1,000 seeds,
//! shrunk to a short trace, and that trace replays.
//!
//! `AIRLOCK_KEEP_PLANTED_TRACES=1` copies the traces into `traces/planted/`,
//! where `tests/traces.rs` replays them and checks their worlds still fail.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_core::trace::replay;
use airlock_sim::{run_seed_with_bug, Scenario, SimOptions};
use std::path::{Path, PathBuf};

fn found(bug: PlantedBug, name: &str) {
    found_as(bug, name, "confinement");
}

fn found_as(bug: PlantedBug, name: &str, invariant: &str) {
    let dir = std::env::temp_dir().join(format!("airlock-adversary-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = SimOptions {
        seeds: 0..1,
        steps: None,
        clients: None,
        scenario: Scenario::Adversary,
        jobs: 1,
        trace_dir: Some(dir.clone()),
    };
    let res = (0..1000)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 1000 adversary seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, invariant, "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().unwrap();
    assert!(shrunk.clients <= 2, "not shrunk: {}", res.swarm_description());
    let path = res.trace.clone().expect("a failing seed writes its trace");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines = text.lines().count();
    assert!(lines < 2_000, "trace of {lines} lines: {}", res.swarm_description());
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    assert_eq!(report.header.meta.as_ref().unwrap()["failure"]["invariant"], invariant);
    if std::env::var_os("AIRLOCK_KEEP_PLANTED_TRACES").is_some() {
        let keep =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/planted").join(format!("{name}.jsonl"));
        std::fs::write(&keep, &text).unwrap();
    }
    eprintln!("{bug:?}: seed {} shrunk to {}, {lines} trace lines", res.seed, shrunk.describe());
    let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
}

#[test]
fn a_lexical_read_only_check_is_found() {
    found(PlantedBug::LexicalReadOnly, "lexical-read-only");
}

#[test]
fn a_lexical_single_file_root_check_is_found() {
    found(PlantedBug::LexicalFileRoot, "lexical-file-root");
}

#[test]
fn forwarding_a_nested_relative_name_upstream_is_found() {
    found(PlantedBug::ForwardVirtualUpstream, "forward-virtual-upstream");
}

#[test]
fn a_nested_level_that_does_not_narrow_is_found() {
    found(PlantedBug::NestedSkipsNarrow, "nested-skips-narrow");
}

/// DESIGN.md invariants 13 and 14: a nested level's grants of protected
/// paths and secret files must meet the top's, never replace them.
#[test]
fn a_nested_level_whose_grants_replace_the_top_s_is_found() {
    found_any(PlantedBug::GuardNestedReplaces, "guard-nested-replaces", &["protected_paths", "secret_files"]);
}

fn found_any(bug: PlantedBug, name: &str, invariants: &[&str]) {
    let o = SimOptions {
        seeds: 0..1,
        steps: None,
        clients: None,
        scenario: Scenario::Adversary,
        jobs: 1,
        trace_dir: None,
    };
    let res = (0..1000)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 1000 adversary seeds"));
    let invariant = res.failure.clone().unwrap().invariant;
    assert!(invariants.contains(&invariant.as_str()), "{invariant}: {}", res.swarm_description());
    found_as(bug, name, &invariant);
}
