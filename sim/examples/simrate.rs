//! Measures the simulator's throughput: `cargo run --release -p airlock-sim
//! --example simrate -- [seeds] [default|nested] [jobs]`.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_sim::{run_many, Scenario, SimOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let scenario: Scenario = args.next().and_then(|a| a.parse().ok()).unwrap_or_default();
    let jobs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let opts = SimOptions { seeds: 0..n, steps: None, clients: None, scenario, jobs, trace_dir: None };
    let summary = run_many(&opts, |r| {
        if !r.passed() {
            println!("{}", r.swarm_description());
        }
    });
    let wall = summary.wall.as_secs_f64();
    println!(
        "{scenario}: {} seeds, {} failed, {:.1} seeds/s, {:.0} steps/s, sim/wall time {:.1}x",
        summary.seeds,
        summary.failed.len(),
        summary.seeds as f64 / wall,
        summary.steps as f64 / wall,
        summary.sim_time_us as f64 / 1e6 / wall
    );
    println!("faults: {:?}", summary.faults);
}
