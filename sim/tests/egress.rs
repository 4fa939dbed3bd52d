//! The egress scenario: seeds pass with every checker on and replay byte
//! for byte, and the planted bug (the address check made on a first
//! lookup, not on the address connected to) is found across ordinary
//! seeds, shrunk, traced, and its trace replays. The seed sweep is in
//! `tests/seeds.rs` with every scenario's.
//!
//! `AIRLOCK_KEEP_PLANTED_TRACES=1` copies the planted bug's trace into
//! `traces/planted/`, where `tests/traces.rs` replays it and checks that
//! its world still fails.

// The heap is counted, so every step's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::trace::egress::{replay, Header};
use airlock_sim::{egress_with_bug, record_trace, rerun_egress, run_seed, EgressBug, Scenario, SimOptions};
use std::path::Path;

fn opts(seeds: std::ops::Range<u64>) -> SimOptions {
    SimOptions { seeds, steps: None, clients: None, scenario: Scenario::Egress, jobs: 1, trace_dir: None }
}

#[test]
fn egress_seeds_pass_and_inject_their_faults() {
    let mut faults = std::collections::BTreeMap::new();
    for seed in 0..60 {
        let r = run_seed(seed, &opts(seed..seed + 1));
        assert!(r.passed(), "{}", r.swarm_description());
        assert!(r.steps > 20, "seed {seed} did nothing: {}", r.swarm_description());
        for (k, n) in r.faults {
            *faults.entry(k).or_insert(0) += n;
        }
    }
    assert!(faults.len() >= 9, "too few fault kinds: {faults:?}");
}

#[test]
fn an_egress_seed_replays_byte_for_byte_against_the_machine() {
    for seed in [0, 7, 123] {
        let (r, a) = record_trace(seed, &opts(seed..seed + 1));
        let (_, b) = record_trace(seed, &opts(seed..seed + 1));
        assert!(r.passed(), "{}", r.swarm_description());
        assert!(a == b, "seed {seed}: traces differ");
        let report = replay(a.as_slice()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(report.inputs > 10 && report.outputs > 10, "seed {seed}: {} inputs", report.inputs);
        assert_eq!(report.open, 0, "seed {seed}: the trace ends with connections open");
    }
}

#[test]
fn checking_the_first_lookup_only_is_found_shrunk_and_traced() {
    let bug = EgressBug::CheckFirstLookupOnly;
    let (res, trace) = (0..200)
        .map(|seed| egress_with_bug(seed, bug))
        .find(|(r, _)| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 200 egress seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, "egress_destination", "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().unwrap();
    assert!(shrunk.clients <= res.swarm.clients && shrunk.faults.len() <= res.swarm.faults.len());
    assert!(shrunk != res.swarm, "nothing was shrunk: {}", res.swarm_description());
    let text = String::from_utf8(trace.expect("a failing seed's trace")).unwrap();
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("the planted trace does not replay: {e}"));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    let header: Header = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header.meta.as_ref().unwrap()["failure"]["invariant"], "egress_destination");
    let again = rerun_egress(&header).unwrap();
    assert_eq!(again.failure.map(|f| f.invariant).as_deref(), Some("egress_destination"));
    if std::env::var_os("AIRLOCK_KEEP_PLANTED_TRACES").is_some() {
        let name = format!("CheckFirstLookupOnly-seed-{}-egress.jsonl", res.seed);
        let keep = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/planted").join(name);
        std::fs::write(&keep, &text).unwrap();
    }
    eprintln!(
        "{bug:?}: seed {} shrunk to {}, {} trace lines",
        res.seed,
        shrunk.describe(),
        text.lines().count()
    );
}
