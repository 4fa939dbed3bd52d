//! The toolexec scenario: a seed replays byte for byte, and every checker
//! finds the class of bug it exists for. Its seed sweep is in
//! `tests/seeds.rs` with every scenario's.

// The heap is counted, so every step's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use airlock_sim::{record_trace, run_toolexec_with_bug, Scenario, SimOptions, ToolexecBug};

fn opts(seeds: std::ops::Range<u64>) -> SimOptions {
    SimOptions { seeds, steps: None, clients: None, scenario: Scenario::Toolexec, jobs: 2, trace_dir: None }
}

#[test]
fn a_toolexec_seed_replays_byte_for_byte() {
    for seed in [0, 7, 123] {
        let (_, a) = record_trace(seed, &opts(seed..seed + 1));
        let (_, b) = record_trace(seed, &opts(seed..seed + 1));
        assert!(!a.is_empty(), "seed {seed}: no trace");
        assert!(a == b, "seed {seed}: traces differ");
    }
}

/// A recorded seed replays against the machine with `airlock replay`'s
/// reader: every input fed, every output the one recorded.
#[test]
fn a_toolexec_seeds_trace_replays_against_the_machine() {
    for seed in 0..40 {
        let (r, trace) = record_trace(seed, &opts(seed..seed + 1));
        assert!(r.passed(), "seed {seed}: {:?}", r.failure);
        let replayed = airlock_core::trace::replay_any(trace.as_slice())
            .unwrap_or_else(|e| panic!("seed {seed}: the trace does not replay: {e}"));
        assert_eq!(replayed.machine, "toolexec");
        assert!(replayed.inputs > 0 && replayed.outputs > 0, "seed {seed}: {replayed:?}");
    }
}

/// A trace whose recorded output is not what the machine yields fails,
/// naming the line: the replay compares, it does not just read.
#[test]
fn a_toolexec_trace_with_a_changed_output_fails_its_replay() {
    let (_, trace) = record_trace(5, &opts(5..6));
    let text = String::from_utf8(trace).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let idx = lines.iter().position(|l| l.contains("\"status\":401")).expect("seed 5 answers a 401");
    lines[idx] = lines[idx].replace("\"status\":401", "\"status\":200");
    let err = airlock_core::trace::replay_any(lines.join("\n").as_bytes()).unwrap_err();
    assert!(err.starts_with(&format!("line {}: level 0 output differs", idx + 1)), "{err}");
}

/// The first seed under 200 on which `bug` is caught, and by which checker.
fn found(bug: ToolexecBug) -> (u64, String) {
    for seed in 0..200 {
        if let Some(f) = run_toolexec_with_bug(seed, bug) {
            return (seed, f.invariant);
        }
    }
    panic!("{bug:?} was never caught in 200 seeds");
}

#[test]
fn every_planted_bug_is_caught_by_its_checker() {
    for (bug, checker) in [
        (ToolexecBug::DropChunk, "bytes"),
        (ToolexecBug::DoubleRespond, "one_response"),
        (ToolexecBug::SpawnOnReject, "no_spawn_on_rejection"),
        (ToolexecBug::AuthLate, "auth_first"),
        (ToolexecBug::NoTerm, "term_at_once"),
        (ToolexecBug::NoKill, "kill_by_grace"),
        (ToolexecBug::OverCredit, "stream_window"),
        (ToolexecBug::NoCap, "connections_cap"),
        (ToolexecBug::UncountedBuffer, "bounded_memory"),
    ] {
        let (seed, invariant) = found(bug);
        assert_eq!(invariant, checker, "{bug:?} (seed {seed}) was caught by {invariant}, not {checker}");
    }
}

/// The heap check names the limit an uncounted buffer grows beside, and
/// the failing seed's trace replays exactly and, rerun, fails again.
#[test]
fn an_uncounted_buffer_is_reported_against_max_buffered() {
    let bug = ToolexecBug::UncountedBuffer;
    let (seed, _) = found(bug);
    let f = run_toolexec_with_bug(seed, bug).unwrap();
    assert!(f.message.contains("breaks max_buffered"), "seed {seed}: {}", f.message);
    let res = airlock_sim::run_seed(seed, &opts(seed..seed + 1));
    assert!(res.passed(), "seed {seed} fails without the bug: {:?}", res.failure);
    let (failure, trace) = airlock_sim::toolexec_trace_with_bug(seed, bug);
    assert_eq!(failure.as_ref(), Some(&f), "seed {seed}: tracing changed the run");
    let replayed =
        airlock_core::trace::replay_any(trace.as_slice()).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert!(replayed.inputs > 0 && replayed.outputs > 0);
    let text = String::from_utf8(trace.clone()).unwrap();
    let header: airlock_core::trace::toolexec::Header =
        serde_json::from_str(text.lines().next().unwrap_or_default()).unwrap();
    let meta = header.meta.clone().unwrap();
    assert_eq!(meta["planted"], "uncounted_buffer");
    assert_eq!(meta["failure"]["invariant"], "bounded_memory");
    let again = airlock_sim::rerun_toolexec(&header).unwrap();
    assert_eq!(again.map(|f| f.invariant), Some("bounded_memory".to_string()));
    // `AIRLOCK_PLANTED_TRACE_DIR=$PWD/traces/planted` refreshes the kept copy.
    if let Some(keep) = std::env::var_os("AIRLOCK_PLANTED_TRACE_DIR") {
        let name = format!("{bug:?}-seed-{seed}-toolexec.jsonl");
        std::fs::write(std::path::PathBuf::from(keep).join(name), &trace).unwrap();
    }
}

/// Seed 414: the tool exits while a stalled client holds the stream window
/// full. Its last bytes are still in the pipe, and reach the client once it
/// reads again: the server's drain grace runs only while it reads the pipe.
#[test]
fn a_tool_exiting_behind_a_full_window_loses_no_byte() {
    let res = airlock_sim::run_seed(414, &opts(414..415));
    assert!(res.passed(), "{:?}", res.failure);
}

/// Seeds where the drain grace after the tool's exit runs out with the
/// tool's last bytes still in the pipe: slow reads used the grace up, or a
/// clock jump fired the timer before the pending read. What the pipe holds
/// then is read at once, never cut; 31303 holds the answer's deadline.
#[test]
fn a_drain_grace_that_runs_out_still_reads_what_the_pipe_holds() {
    for seed in [4719, 15756, 27466, 31303, 33707, 35096, 35489, 37078, 43907, 57321, 59031] {
        let res = airlock_sim::run_seed(seed, &opts(seed..seed + 1));
        assert!(res.passed(), "seed {seed}: {:?}", res.failure);
    }
}
