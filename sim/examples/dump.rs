use airlock_sim::{record_trace, Scenario, SimOptions};
fn main() {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let scenario: Scenario = args.next().and_then(|a| a.parse().ok()).unwrap_or_default();
    let out = args.next().unwrap_or("/tmp/dbg/trace.jsonl".into());
    let opts =
        SimOptions { seeds: seed..seed + 1, steps: None, clients: None, scenario, jobs: 1, trace_dir: None };
    let (r, trace) = record_trace(seed, &opts);
    println!("{}", r.swarm_description());
    std::fs::write(out, trace).unwrap();
}
