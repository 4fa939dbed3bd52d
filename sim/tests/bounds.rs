//! The adversary's floods find each class of unbounded resource by
//! themselves: with a bound taken out of the machine (a planted bug), a
//! seed among the first 1,000 fails the matching invariant, is shrunk to a
//! short run, and its trace replays exactly.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_core::trace::replay;
use airlock_sim::{run_seed_with_bug, swarm_for, FaultKind, Scenario, SeedResult, SimOptions};
use std::path::PathBuf;

/// The first of seeds 0..1000 whose world (with `flood` on) fails under
/// `bug`, shrunk and traced.
fn found(bug: PlantedBug, flood: FaultKind, scenario: Scenario, name: &str) -> SeedResult {
    // `AIRLOCK_PLANTED_TRACE_DIR=traces/planted` re-records the traces
    // kept in the repository (see traces/README.md).
    let dir = std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR").map_or_else(
        || std::env::temp_dir().join(format!("airlock-bounds-{}", std::process::id())),
        PathBuf::from,
    );
    let dir = dir.join(name);
    let o = SimOptions { seeds: 0..1, steps: None, clients: None, scenario, jobs: 1, trace_dir: Some(dir) };
    (0..1000)
        .filter(|&seed| swarm_for(seed, &o).rate(flood) > 0)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 1,000 seeds"))
}

fn check(bug: PlantedBug, flood: FaultKind, scenario: Scenario, invariant: &str) {
    let name = format!("{bug:?}-{scenario}");
    let res = found(bug, flood, scenario, &name);
    let failure = res.failure.clone().expect("failed");
    assert_eq!(failure.invariant, invariant, "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().expect("shrunk");
    assert!(shrunk.clients <= res.swarm.clients && shrunk.ops_per_client <= res.swarm.ops_per_client);
    assert!(failure.step <= 20_000, "a long trace: {}", res.swarm_description());
    let path = res.trace.clone().expect("traced");
    let text = std::fs::read_to_string(&path).unwrap();
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    assert_eq!(report.header.meta.as_ref().unwrap()["failure"]["invariant"], invariant);
    if std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR").is_none() {
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn queued_bytes_without_a_bound_are_found() {
    check(PlantedBug::NoQueuedByteBound, FaultKind::QueuedFlood, Scenario::Default, "bounded_queue_bytes");
}

#[test]
fn attaches_without_a_cap_are_found() {
    check(PlantedBug::NoClientCap, FaultKind::AttachFlood, Scenario::Default, "bounded_clients");
}

#[test]
fn answered_responses_are_found() {
    check(PlantedBug::AnswerResponses, FaultKind::SelfLoop, Scenario::Default, "no_answer_to_response");
}

#[test]
fn responses_that_are_not_json_dropped_unanswered_are_found() {
    check(PlantedBug::UncheckedResponseShape, FaultKind::SelfLoop, Scenario::Default, "liveness");
}

#[test]
fn free_virtual_names_are_found() {
    check(PlantedBug::VirtualNamesFree, FaultKind::HugeNames, Scenario::Default, "bounded_virtual_bytes");
}

#[test]
fn free_virtual_names_are_found_through_a_nested_level() {
    check(PlantedBug::VirtualNamesFree, FaultKind::HugeNames, Scenario::Nested, "bounded_virtual_bytes");
}

#[test]
fn partial_frames_without_a_total_bound_are_found() {
    check(PlantedBug::NoBufferedBound, FaultKind::PartialFlood, Scenario::Default, "bounded_buffer");
}

#[test]
fn an_upstream_link_cut_by_one_big_answer_is_found() {
    check(
        PlantedBug::UpstreamOversizeCutsLink,
        FaultKind::UpstreamOversize,
        Scenario::Nested,
        "upstream_link_kept",
    );
}

#[test]
fn a_buffer_allocated_but_not_counted_is_found() {
    check(PlantedBug::UncountedBuffer, FaultKind::SplitDelivery, Scenario::Default, "bounded_memory");
}
