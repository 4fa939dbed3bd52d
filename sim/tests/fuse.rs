//! The `fuse` scenario: the served filesystem under a hostile kernel
//! client holds every invariant across ordinary seeds, and a bug planted
//! in it (a released file left open on the host) is found, shrunk, and
//! written as a trace that replays.
//!
//! `AIRLOCK_KEEP_PLANTED_TRACES=1` copies the trace into `traces/planted/`,
//! where `tests/traces.rs` replays it and checks its world still fails.

// The heap is counted, so the bounded-memory checker runs as in the
// other worlds.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_core::trace::replay;
use airlock_sim::{record_trace, run_many, run_seed_with_bug, Scenario, SimOptions};
use std::path::Path;

fn opts(seeds: std::ops::Range<u64>, trace_dir: Option<std::path::PathBuf>) -> SimOptions {
    SimOptions { seeds, steps: None, clients: None, scenario: Scenario::Fuse, jobs: 2, trace_dir }
}

#[test]
fn every_seed_holds_every_invariant() {
    let summary = run_many(&opts(0..60, None), |_| {});
    let failed: Vec<String> = summary.failed.iter().map(|r| r.swarm_description()).collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(summary.steps > 10_000, "the worlds did little: {} steps", summary.steps);
}

/// A seed's trace is the same twice, byte for byte, and replays (passing
/// seeds too, kernel deaths and huge names among them, not only the
/// planted failure below).
#[test]
fn a_seed_records_the_same_trace_twice_and_it_replays() {
    for seed in 0..12 {
        let (a, ta) = record_trace(seed, &opts(seed..seed + 1, None));
        let (b, tb) = record_trace(seed, &opts(seed..seed + 1, None));
        assert_eq!(a, b, "seed {seed}");
        assert!(ta.len() > 1000, "seed {seed}: a trace of {} bytes", ta.len());
        assert!(ta == tb, "seed {seed}: two runs of one seed differ");
        assert!(a.passed(), "{}", a.swarm_description());
        let report = replay(ta.as_slice()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(report.inputs > 10 && report.outputs > 10, "seed {seed}");
        assert_eq!(report.header.seed, Some(seed));
    }
    let (_, t1) = record_trace(1, &opts(1..2, None));
    let (_, t2) = record_trace(2, &opts(2..3, None));
    assert_ne!(t1, t2, "different seeds, different runs");
}

#[test]
fn a_released_file_left_open_is_found_and_shrunk() {
    let bug = PlantedBug::FuseReleaseKeepsFile;
    let dir = std::env::temp_dir().join(format!("airlock-fuse-planted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = opts(0..1, Some(dir.clone()));
    let res = (0..100)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 100 fuse seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, "open_released", "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().unwrap();
    // Smaller in every knob, and strictly in one: fewer clients, steps
    // or faults (the failing step comes early, so operations may stay).
    assert!(
        shrunk.clients <= res.swarm.clients
            && shrunk.ops_per_client <= res.swarm.ops_per_client
            && shrunk.faults.len() <= res.swarm.faults.len()
            && (shrunk.clients < res.swarm.clients
                || shrunk.ops_per_client < res.swarm.ops_per_client
                || shrunk.faults.len() < res.swarm.faults.len()
                || shrunk.max_steps < res.swarm.max_steps),
        "not shrunk: {}",
        res.swarm_description()
    );
    let path = res.trace.clone().expect("a failing seed writes its trace");
    let text = std::fs::read_to_string(&path).unwrap();
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    assert_eq!(report.header.meta.as_ref().unwrap()["failure"]["invariant"], "open_released");
    if std::env::var_os("AIRLOCK_KEEP_PLANTED_TRACES").is_some() {
        let keep =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/planted/FuseReleaseKeepsFile-fuse.jsonl");
        std::fs::write(&keep, &text).unwrap();
    }
    eprintln!(
        "{bug:?}: seed {} shrunk to {}, {} trace lines",
        res.seed,
        shrunk.describe(),
        text.lines().count()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Passthrough's registrations: one kept after its node's last release is
/// found (`open_released`, checked once the kernel gave back every file)
/// and shrunk.
#[test]
fn a_backing_registration_kept_after_its_last_release_is_found_and_shrunk() {
    let bug = PlantedBug::FuseBackingKept;
    let o = opts(0..1, None);
    let res = (0..300)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 300 fuse seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, "open_released", "{}", res.swarm_description());
    assert!(failure.message.contains("backing"), "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().unwrap();
    assert!(shrunk.ops_per_client <= res.swarm.ops_per_client, "{}", res.swarm_description());
}
