//! The simulator's own tests: runs are deterministic, traces replay, and a
//! planted bug is found, shrunk, traced and replayed. The seed sweeps
//! themselves are `tests/seeds.rs`.

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_core::fsproxy::PlantedBug;
use airlock_core::handles::ClientId;
use airlock_core::trace::{replay, ReplayError};
use airlock_sim::{
    record_trace, run_many, run_seed_with_bug, swarm_for, FaultKind, Scenario, SeedResult, SimOptions, Swarm,
};
use std::path::PathBuf;
use std::sync::Mutex;

fn opts(scenario: Scenario, seeds: std::ops::Range<u64>, jobs: usize) -> SimOptions {
    SimOptions { seeds, steps: None, clients: None, scenario, jobs, trace_dir: None }
}

fn all_results(opts: &SimOptions) -> Vec<SeedResult> {
    let seen = Mutex::new(Vec::new());
    run_many(opts, |r| seen.lock().unwrap().push(r.clone()));
    let mut v = seen.into_inner().unwrap();
    v.sort_by_key(|r| r.seed);
    v
}

/// `--clients` turns one knob: the rest of each seed's swarm is what the
/// seed draws without it, and the bigger worlds still hold every invariant.
#[test]
fn the_clients_knob_changes_only_the_client_count() {
    for scenario in [Scenario::Default, Scenario::Nested] {
        let base = opts(scenario, 0..6, 2);
        let more = SimOptions { clients: Some(12), ..base.clone() };
        for seed in base.seeds.clone() {
            let (own, wide) = (swarm_for(seed, &base), swarm_for(seed, &more));
            assert_eq!(wide.clients, 12);
            assert_eq!(Swarm { clients: own.clients, ..wide }, own, "seed {seed} [{scenario}]");
        }
        let summary = run_many(&more, |_| {});
        assert!(
            summary.failed.is_empty(),
            "{:?}",
            summary.failed.iter().map(SeedResult::swarm_description).collect::<Vec<_>>()
        );
    }
}

#[test]
fn broker_worlds_exercise_the_broker() {
    let summary = run_many(&opts(Scenario::Broker, 0..40, 2), |_| {});
    assert!(
        summary.failed.is_empty(),
        "{:?}",
        summary.failed.iter().map(SeedResult::swarm_description).collect::<Vec<_>>()
    );
    for kind in [
        FaultKind::ProviderHang,
        FaultKind::ProviderError,
        FaultKind::ProviderMalformed,
        FaultKind::CancelStorm,
    ] {
        assert!(
            summary.faults.get(&kind).is_some_and(|n| *n > 0),
            "{kind} never injected: {:?}",
            summary.faults
        );
    }
}

#[test]
fn broker_same_seed_same_trace_byte_for_byte() {
    for seed in [1, 2, 7] {
        let o = opts(Scenario::Broker, 0..1, 1);
        let (a, ta) = record_trace(seed, &o);
        let (b, tb) = record_trace(seed, &o);
        assert_eq!(a, b);
        assert!(ta == tb, "seed {seed}: traces differ");
        let text = String::from_utf8(ta).unwrap();
        assert!(text.contains("start_provider"), "seed {seed} made no provider call");
        let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(report.machines[0].broker().is_some());
    }
}

#[test]
fn planted_broker_bug_is_caught() {
    let o = opts(Scenario::Broker, 0..1, 1);
    let res = (0..10)
        .map(|seed| run_seed_with_bug(seed, &o, PlantedBug::BrokerReplyTwice))
        .find(|r| !r.passed())
        .expect("a doubled LLMCMD answer goes unnoticed for 10 seeds");
    assert_eq!(res.failure.unwrap().invariant, "one_response_per_request");
}

#[test]
fn same_seed_same_trace_byte_for_byte() {
    for scenario in [Scenario::Default, Scenario::Nested, Scenario::Adversary] {
        let o = opts(scenario, 0..1, 1);
        for seed in 0..15 {
            let (a, ta) = record_trace(seed, &o);
            let (b, tb) = record_trace(seed, &o);
            assert_eq!(a, b, "seed {seed}");
            assert!(ta.len() > 1000, "seed {seed}: trace of {} bytes", ta.len());
            assert!(ta == tb, "seed {seed} [{scenario}]: traces differ");
        }
    }
}

#[test]
fn results_do_not_depend_on_jobs() {
    for scenario in [Scenario::Default, Scenario::Nested, Scenario::Broker] {
        let one = all_results(&opts(scenario, 100..140, 1));
        let two = all_results(&opts(scenario, 100..140, 2));
        assert_eq!(one.len(), 40);
        assert_eq!(one, two, "[{scenario}]");
    }
}

#[test]
fn recorded_traces_replay() {
    for scenario in [Scenario::Default, Scenario::Nested] {
        for seed in 0..10 {
            let (res, trace) = record_trace(seed, &opts(scenario, 0..1, 1));
            assert!(res.passed(), "{}", res.swarm_description());
            let report = replay(trace.as_slice()).unwrap_or_else(|e| panic!("seed {seed} [{scenario}]: {e}"));
            assert!(report.inputs > 10 && report.outputs > 10);
            assert_eq!(report.header.seed, Some(seed));
            assert_eq!(report.machines.len(), if scenario == Scenario::Nested { 2 } else { 1 });
        }
    }
}

#[test]
fn a_tampered_trace_fails_replay_at_its_line() {
    let (_, trace) = record_trace(3, &opts(Scenario::Default, 0..1, 1));
    let text = String::from_utf8(trace).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let idx = lines.iter().rposition(|l| l.contains(r#""output":"send""#)).expect("a send output");
    lines[idx] = lines[idx].replacen(r#""data":""#, r#""data":"AAAA"#, 1);
    match replay(lines.join("\n").as_bytes()) {
        Err(ReplayError::Differs { line, .. }) => assert_eq!(line, idx + 1),
        other => panic!("expected a difference at line {}, got {other:?}", idx + 1),
    }
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airlock-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn strip_bug(header: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(header).unwrap();
    v["config"].as_object_mut().unwrap().remove("planted_bug");
    if let Some(levels) = v.get_mut("levels").and_then(|l| l.as_array_mut()) {
        for l in levels {
            l.as_object_mut().unwrap().remove("planted_bug");
        }
    }
    v.to_string()
}

fn planted_bug_is_caught(scenario: Scenario) {
    let dir = scratch_dir(&format!("planted-{scenario}"));
    let o = SimOptions { trace_dir: Some(dir.clone()), ..opts(scenario, 0..1, 1) };
    let res = (0..30)
        .map(|seed| run_seed_with_bug(seed, &o, PlantedBug::CleanupForgetsLastHandle))
        .find(|r| !r.passed())
        .expect("the planted leak goes unnoticed for 30 seeds");
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, "no_leaked_handles", "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().expect("a failure is shrunk");
    assert!(shrunk.clients <= res.swarm.clients && shrunk.ops_per_client <= res.swarm.ops_per_client);
    assert!(shrunk.max_steps as u64 <= failure.step);

    let path = res.trace.clone().expect("a failing seed writes its trace");
    let text = std::fs::read_to_string(&path).unwrap();
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(PlantedBug::CleanupForgetsLastHandle));
    assert_eq!(report.header.meta.as_ref().unwrap()["failure"]["invariant"], "no_leaked_handles");
    let (level, client) = (failure.level.unwrap(), ClientId(failure.client.unwrap()));
    assert!(report.machines[level].handles_of(client) > 0, "replay does not reproduce the leak");

    // Against the correct machine the same inputs either yield other
    // outputs or leave nothing behind.
    let (header, rest) = text.split_once('\n').unwrap();
    let fixed = format!("{}\n{rest}", strip_bug(header));
    if let Ok(report) = replay(fixed.as_bytes()) {
        assert_eq!(report.machines[level].handles_of(client), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn planted_bug_is_found_shrunk_traced_and_replayed() {
    planted_bug_is_caught(Scenario::Default);
}

#[test]
fn planted_bug_is_found_in_nested_worlds() {
    planted_bug_is_caught(Scenario::Nested);
}

/// Seeds with attach on pass descriptors, get clients attached (whose ids
/// are fresh), and their traces replay. The checkers see to the rest: the
/// attach answered first on the new client, E_ARG without a descriptor.
#[test]
fn attach_worlds_attach_clients() {
    let (mut descriptors, mut attached, mut worlds) = (0, 0, 0);
    for scenario in [Scenario::Default, Scenario::Nested] {
        let o = opts(scenario, 0..1, 1);
        for seed in 0..40 {
            if airlock_sim::swarm_for(seed, &o).rate(FaultKind::Attach) == 0 {
                continue;
            }
            worlds += 1;
            let (res, trace) = record_trace(seed, &o);
            assert!(res.passed(), "{}", res.swarm_description());
            replay(trace.as_slice()).unwrap_or_else(|e| panic!("seed {seed} [{scenario}]: {e}"));
            let text = String::from_utf8(trace).unwrap();
            descriptors += text.matches(r#""input":"descriptor""#).count();
            for line in text.lines().filter(|l| l.contains(r#""output":"attach""#)) {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let new = v["output"]["client"].as_u64().unwrap();
                assert!(new >= airlock_core::fsproxy::ATTACHED_CLIENT_BASE, "{line}");
                attached += 1;
            }
        }
    }
    assert!(worlds >= 10, "only {worlds} worlds attach");
    assert!(attached >= 10 && descriptors >= attached, "{attached} attached, {descriptors} descriptors");
}

/// The broker's planted bugs — a queue bound that counts calls but not
/// bytes, a key scrubbed from the raw reply only, `enforce_budget`
/// ignored — are each found by the broker scenario within 1,000 seeds,
/// under the invariant that names them, shrunk, and traced; the trace
/// replays against the broken machine.
fn broker_planted_bug_is_found(bug: PlantedBug, invariant: &str) -> u64 {
    let dir = scratch_dir(&format!("planted-broker-{bug:?}"));
    let o = SimOptions { trace_dir: Some(dir.clone()), ..opts(Scenario::Broker, 0..1, 1) };
    let res = (0..1000)
        .map(|seed| run_seed_with_bug(seed, &o, bug))
        .find(|r| !r.passed())
        .unwrap_or_else(|| panic!("{bug:?} goes unnoticed for 1,000 seeds"));
    let failure = res.failure.clone().unwrap();
    assert_eq!(failure.invariant, invariant, "{}", res.swarm_description());
    let shrunk = res.shrunk.clone().expect("a failure is shrunk");
    assert!(shrunk.clients <= res.swarm.clients && shrunk.ops_per_client <= res.swarm.ops_per_client);
    let path = res.trace.clone().expect("a failing seed writes its trace");
    let text = std::fs::read_to_string(&path).unwrap();
    let report = replay(text.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(report.header.config.planted_bug, Some(bug));
    // The correct machine passes the same world.
    assert!(airlock_sim::run_seed(res.seed, &opts(Scenario::Broker, 0..1, 1)).passed());
    // `AIRLOCK_PLANTED_TRACE_DIR=traces/planted` refreshes the kept copies.
    if let Some(keep) = std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR") {
        let name = format!("{bug:?}-seed-{}-broker.jsonl", res.seed);
        std::fs::write(PathBuf::from(keep).join(name), &text).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    res.seed
}

#[test]
fn planted_missing_queue_byte_bound_is_found() {
    broker_planted_bug_is_found(PlantedBug::BrokerNoPendingByteBound, "bounded_resources");
}

#[test]
fn planted_scrub_before_decode_only_is_found() {
    broker_planted_bug_is_found(PlantedBug::BrokerScrubBeforeDecodeOnly, "secret_leaked");
}

#[test]
fn planted_ignored_enforce_budget_is_found() {
    broker_planted_bug_is_found(PlantedBug::BrokerIgnoresEnforceBudget, "budget");
}

#[test]
fn planted_lock_release_during_backoff_is_found() {
    broker_planted_bug_is_found(PlantedBug::BrokerReleasesLockDuringBackoff, "lock_held");
}

/// A cancelled or timed-out call whose usage never comes, released unpaid
/// under `enforce_budget`: the provider, which bills what it generated,
/// then bills past the budget (invariant 15).
#[test]
fn planted_reserve_release_on_cancel_is_found() {
    broker_planted_bug_is_found(PlantedBug::BrokerReleasesReserveOnCancel, "budget_bound");
}

/// Broker worlds answer attempts 429/5xx with every kind of `Retry-After`,
/// and the broker retries some of them (the same call started again after
/// a record announcing its back-off) and gives up on others; the traces
/// replay.
#[test]
fn broker_worlds_retry() {
    let o = opts(Scenario::Broker, 0..1, 1);
    let (mut announced, mut restarted, mut given_up) = (0, 0, 0);
    for seed in 0..40 {
        let (res, trace) = record_trace(seed, &o);
        assert!(res.passed(), "{}", res.swarm_description());
        replay(trace.as_slice()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let text = String::from_utf8(trace).unwrap();
        announced += text.matches("\"retry_delay_ms\"").count();
        // A last record after a 429/5xx: no more attempts allowed, or
        // none that could start before the deadline.
        given_up += text
            .lines()
            .filter(|l| l.contains(r#""output":"telemetry""#) && l.contains(r#""http_status""#))
            .filter(|l| !l.contains("retry_delay_ms"))
            .count();
        let mut starts = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| l.contains(r#""output":"start_provider""#)) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            *starts.entry(v["output"]["call"].as_u64().unwrap()).or_insert(0) += 1;
        }
        restarted += starts.values().filter(|n| **n > 1).count();
    }
    assert!(announced >= 10 && restarted >= 10, "{announced} back-offs announced, {restarted} calls retried");
    assert!(given_up >= 3, "retries never ran out: {given_up}");
}

#[test]
fn broker_worlds_flood_and_lie() {
    let summary = run_many(&opts(Scenario::Broker, 0..60, 2), |_| {});
    assert!(summary.failed.is_empty());
    for kind in [
        FaultKind::QueueFlood,
        FaultKind::ProviderLeak,
        FaultKind::ProviderHuge,
        FaultKind::ProviderRetryable,
    ] {
        assert!(
            summary.faults.get(&kind).is_some_and(|n| *n > 0),
            "{kind} never injected: {:?}",
            summary.faults
        );
    }
}

#[test]
fn planted_pager_bug_is_caught() {
    // A session that forgets max_total_bytes: the checker holds the
    // world's own limit, so the first wrap past it is found.
    let o = opts(Scenario::Pager, 0..1, 1);
    let res = (0..20)
        .map(|seed| run_seed_with_bug(seed, &o, PlantedBug::PagerIgnoresLimit))
        .find(|r| !r.passed())
        .expect("a pager past its limit goes unnoticed for 20 seeds");
    assert_eq!(res.failure.unwrap().invariant, "bounded_resources");
}

#[test]
fn pager_worlds_are_deterministic_and_make_fds() {
    let o = opts(Scenario::Pager, 0..1, 1);
    let mut fds = 0;
    for seed in 0..5 {
        let (a, ta) = record_trace(seed, &o);
        let (b, tb) = record_trace(seed, &o);
        assert_eq!(a, b, "seed {seed}");
        assert!(ta == tb, "seed {seed}: traces differ");
        let report = replay(ta.as_slice()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let pager = report.machines[0].pager().expect("the top runs the pager");
        fds += pager.fds().count();
    }
    assert!(fds >= 5, "pager worlds made {fds} fds in 5 seeds");
}
