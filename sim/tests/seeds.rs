//! The seed sweeps: every scenario's seeds, one test per block of seeds.
//!
//! Each block is a test of its own (`default::seeds_00000000_00000099`), so
//! a test runner that shards by test shards the seed range:
//! `cargo nextest run -p airlock-sim --test seeds --partition hash:K/N` runs
//! every block in exactly one of the N shards, and a failing seed is
//! reported (with its trace, under `AIRLOCK_SIM_TRACE_DIR`) by the shard
//! that ran it and no other. Plain `cargo test` runs every block.
//!
//! Environment (all optional):
//! - `AIRLOCK_SIM_SEEDS` — seeds per scenario (default 300);
//! - `AIRLOCK_SIM_FIRST_SEED` — the first seed (default 0);
//! - `AIRLOCK_SIM_BLOCK` — seeds per test (default 100);
//! - `AIRLOCK_SIM_TRACE_DIR` — where failing seeds write their traces;
//! - `AIRLOCK_SIM_PLANT=SCENARIO:SEED:BUG` — run that one seed with a
//!   planted bug (a `PlantedBug` in snake case), to see a shard find it.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_sim::{run_seed, run_seed_with_bug, FaultKind, Scenario, SeedResult, SimOptions};
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;

const DEFAULT_SEEDS: u64 = 300;
const DEFAULT_BLOCK: u64 = 100;
/// Fault kinds a block of at least `DEFAULT_BLOCK` seeds must have injected:
/// a swarm that stopped drawing faults would pass everything. The tool
/// worlds draw from a smaller set of their own.
fn min_fault_kinds(scenario: Scenario) -> usize {
    match scenario {
        Scenario::Tool => 8,
        // Its world records its faults under the shared kinds it uses.
        Scenario::Toolexec => 4,
        _ => 9,
    }
}

fn var(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// The planted seed, if any: (scenario, seed, bug).
fn planted() -> Result<Option<(Scenario, u64, PlantedBug)>, String> {
    let Ok(spec) = std::env::var("AIRLOCK_SIM_PLANT") else { return Ok(None) };
    let bad = || format!("AIRLOCK_SIM_PLANT={spec:?}: want SCENARIO:SEED:BUG");
    let mut parts = spec.splitn(3, ':');
    let (Some(scenario), Some(seed), Some(bug)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let scenario = scenario.parse::<Scenario>()?;
    let seed = seed.parse::<u64>().map_err(|_| bad())?;
    let bug = serde_json::from_value::<PlantedBug>(serde_json::Value::String(bug.to_owned()))
        .map_err(|e| format!("AIRLOCK_SIM_PLANT: unknown bug {bug:?}: {e}"))?;
    Ok(Some((scenario, seed, bug)))
}

/// One block: run its seeds, fail with every failing seed's description.
fn run_block(
    scenario: Scenario,
    seeds: Range<u64>,
    plant: Option<(Scenario, u64, PlantedBug)>,
) -> Result<(), Failed> {
    let opts = SimOptions {
        seeds: seeds.clone(),
        steps: None,
        clients: None,
        scenario,
        jobs: 1,
        trace_dir: std::env::var_os("AIRLOCK_SIM_TRACE_DIR").map(PathBuf::from),
    };
    let mut failed: Vec<SeedResult> = Vec::new();
    let mut faults: BTreeMap<FaultKind, u64> = BTreeMap::new();
    for seed in seeds.clone() {
        let res = match plant {
            Some((s, p, bug)) if s == scenario && p == seed => run_seed_with_bug(seed, &opts, bug),
            _ => run_seed(seed, &opts),
        };
        for (k, n) in &res.faults {
            *faults.entry(*k).or_default() += n;
        }
        if !res.passed() {
            failed.push(res);
        }
    }
    if !failed.is_empty() {
        let report: Vec<String> = failed
            .iter()
            .map(|r| match &r.trace {
                Some(t) => format!("{} (trace {})", r.swarm_description(), t.display()),
                None => r.swarm_description(),
            })
            .collect();
        return Err(format!("{} seeds failed:\n{}", failed.len(), report.join("\n")).into());
    }
    if seeds.end - seeds.start >= DEFAULT_BLOCK && faults.len() < min_fault_kinds(scenario) {
        return Err(format!("too few fault kinds injected: {faults:?}").into());
    }
    Ok(())
}

fn trials() -> Result<Vec<Trial>, String> {
    let first = var("AIRLOCK_SIM_FIRST_SEED", 0)?;
    let count = var("AIRLOCK_SIM_SEEDS", DEFAULT_SEEDS)?;
    let block = var("AIRLOCK_SIM_BLOCK", DEFAULT_BLOCK)?.max(1);
    let end = first.checked_add(count).ok_or("AIRLOCK_SIM_FIRST_SEED + AIRLOCK_SIM_SEEDS overflows")?;
    let plant = planted()?;
    let mut trials = Vec::new();
    for &scenario in Scenario::ALL {
        let mut start = first;
        while start < end {
            let stop = end.min(start.saturating_add(block));
            let name = format!("{scenario}::seeds_{start:08}_{:08}", stop - 1);
            trials.push(Trial::test(name, move || run_block(scenario, start..stop, plant)));
            start = stop;
        }
    }
    Ok(trials)
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    match trials() {
        Ok(trials) => libtest_mimic::run(&args, trials).exit_code(),
        Err(e) => {
            eprintln!("seeds: {e}");
            ExitCode::from(2)
        }
    }
}
