//! The world a seed makes is part of the simulator's contract: a seed
//! reported as failing must rerun as it failed on any later build, and a
//! speed-up that takes other random numbers would quietly trade the worlds
//! everyone has run for new ones. Each scenario's first seeds are pinned
//! here by their whole recorded trace (every frame, effect and fault), so a
//! change that makes other worlds shows as a changed snapshot, to be
//! accepted only on purpose.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_sim::{record_trace, Scenario, SimOptions};
use std::fmt::Write as _;
use std::hash::Hasher as _;

/// Seeds pinned per scenario.
const SEEDS: u64 = 6;

fn worlds(scenario: Scenario) -> String {
    let opts = SimOptions { scenario, ..SimOptions::default() };
    let mut out = String::new();
    for seed in 0..SEEDS {
        let (result, trace) = record_trace(seed, &opts);
        assert!(result.passed(), "{scenario} seed {seed} failed: {:?}", result.failure);
        let mut hash = fnv::FnvHasher::default();
        hash.write(&trace);
        let _ = writeln!(
            out,
            "seed {seed}: {} steps, {} µs simulated, trace {} bytes fnv {:016x}",
            result.steps,
            result.sim_time_us,
            trace.len(),
            hash.finish()
        );
    }
    out
}

/// One test per scenario, each with its own snapshot.
macro_rules! pinned {
    ($($test:ident: $scenario:ident),* $(,)?) => {$(
        #[test]
        fn $test() {
            insta::assert_snapshot!(worlds(Scenario::$scenario));
        }
    )*};
}

pinned! {
    default_worlds_are_the_same: Default,
    nested_worlds_are_the_same: Nested,
    broker_worlds_are_the_same: Broker,
    adversary_worlds_are_the_same: Adversary,
    pager_worlds_are_the_same: Pager,
    tool_worlds_are_the_same: Tool,
    toolexec_worlds_are_the_same: Toolexec,
}
