//! airlock-sim: the deterministic simulator of the FS proxy core and the
//! LLM broker it runs.
//!
//! A world is built from a seed alone: the seed picks a swarm (which faults
//! are on and how often, how many clients, how many requests each), and
//! seeded RNGs drive the clients, the pipes, the host filesystem and the
//! scheduler. Checkers run after every step; a failing seed is shrunk by
//! turning the swarm's knobs down, and the smallest failing run is written
//! as a trace (`airlock_core::trace`) that `airlock replay` reproduces.
//!
//! ```no_run
//! let opts = airlock_sim::SimOptions {
//!     seeds: 0..100,
//!     steps: None,
//!     clients: None,
//!     scenario: airlock_sim::Scenario::Default,
//!     jobs: 2,
//!     trace_dir: None,
//! };
//! let summary = airlock_sim::run_many(&opts, |r| {
//!     if let Some(f) = &r.failure {
//!         eprintln!("seed {} failed {}: {}", r.seed, f.invariant, f.message);
//!     }
//! });
//! assert!(summary.failed.is_empty());
//! ```

mod fs;
pub mod swarm;
mod world;

pub use swarm::{FaultKind, Swarm};

use airlock_core::fsproxy::PlantedBug;
use airlock_model::seeds::SeedQueue;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant as WallInstant};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// One FS proxy serving its clients directly, as `airlock serve`.
    #[default]
    Default,
    /// An intermediate proxy forwarding its clients' requests to a top-level
    /// one, which may also have clients of its own.
    Nested,
    /// One FS proxy running the session's LLM broker: clients interleave
    /// LLMCMD, CANCEL and QUOTA with file ops, against a simulated
    /// provider.
    Broker,
    /// A nested level with a wider, narrower or empty policy, clients
    /// aiming at every way out of it, and symlinks created and swapped
    /// inside the roots between requests (`world/adversary.rs`).
    Adversary,
    /// The nested tree with the session's fd pager at the top: children
    /// on both levels wrap, stream, read, search and export fds.
    Pager,
    /// A VFS tool host and a hostile simulated tool over an in-memory
    /// project whose symlinks are swapped (`world/tool.rs`).
    Tool,
    /// One ToolExec server: clients of both protocol versions, bad
    /// requests, slow and stalled readers, disconnects at every stage,
    /// tools that flood, hang, ignore SIGTERM, leave grandchildren or die
    /// by a signal, connection floods and clock jumps (`world/toolexec.rs`).
    Toolexec,
    /// The egress proxies of one session: hostile clients (split, pipelined,
    /// oversized and garbage requests, CONNECTs to refused hosts, names
    /// rebinding to private addresses on a later lookup, slow and abandoned
    /// tunnels) against a simulated internet (`world/egress.rs`).
    Egress,
    /// One mount of the served filesystem and a hostile kernel client:
    /// lookups, opens, renames over open files, unlinks of open files,
    /// forgets out of order, symlinks swapped inside the root
    /// (`world/fuse.rs`).
    Fuse,
}

impl Scenario {
    /// Every scenario, in the order the seed harness lists them.
    pub const ALL: &'static [Scenario] = &[
        Scenario::Default,
        Scenario::Nested,
        Scenario::Broker,
        Scenario::Adversary,
        Scenario::Pager,
        Scenario::Tool,
        Scenario::Toolexec,
        Scenario::Egress,
        Scenario::Fuse,
    ];
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scenario::Default => "default",
            Scenario::Nested => "nested",
            Scenario::Broker => "broker",
            Scenario::Adversary => "adversary",
            Scenario::Pager => "pager",
            Scenario::Tool => "tool",
            Scenario::Toolexec => "toolexec",
            Scenario::Egress => "egress",
            Scenario::Fuse => "fuse",
        })
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Scenario::Default),
            "nested" => Ok(Scenario::Nested),
            "broker" => Ok(Scenario::Broker),
            "adversary" => Ok(Scenario::Adversary),
            "pager" => Ok(Scenario::Pager),
            "tool" => Ok(Scenario::Tool),
            "toolexec" => Ok(Scenario::Toolexec),
            "egress" => Ok(Scenario::Egress),
            "fuse" => Ok(Scenario::Fuse),
            other => Err(format!(
                "unknown scenario {other:?} (want default, nested, broker, adversary, pager, tool, toolexec, egress or fuse)"
            )),
        }
    }
}

/// The most clients [`SimOptions::clients`] may ask for: client ids must
/// stay below the intermediate's own connection id at the top level.
pub const MAX_CLIENTS: usize = 256;

#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seeds: Range<u64>,
    /// Steps before each world winds down; `None` keeps the swarm's choice.
    pub steps: Option<usize>,
    /// Clients per world (of the level clients talk to, as
    /// [`Swarm::clients`]); `None` keeps the swarm's choice. For measuring
    /// how a world's cost grows with its clients: every other draw of the
    /// seed stays as it was. At most [`MAX_CLIENTS`].
    pub clients: Option<usize>,
    pub scenario: Scenario,
    /// Worker threads; results do not depend on it.
    pub jobs: usize,
    /// Where failing seeds write their (shrunk) traces.
    pub trace_dir: Option<PathBuf>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            seeds: 0..100,
            steps: None,
            clients: None,
            scenario: Scenario::Default,
            jobs: 1,
            trace_dir: None,
        }
    }
}

/// The first invariant a run broke.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub invariant: String,
    pub step: u64,
    pub message: String,
    /// The machine level and client concerned, when one is.
    pub level: Option<usize>,
    pub client: Option<u64>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at step {}", self.invariant, self.step)?;
        if let (Some(l), Some(c)) = (self.level, self.client) {
            write!(f, " (level {l}, client {c})")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedResult {
    pub seed: u64,
    pub scenario: Scenario,
    pub swarm: Swarm,
    pub steps: u64,
    /// Simulated time at the end of the run, in microseconds.
    pub sim_time_us: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub failure: Option<Failure>,
    /// For a failure: the smallest swarm that still fails the same way.
    pub shrunk: Option<Swarm>,
    /// For a failure with a trace directory: the trace of the shrunk run.
    pub trace: Option<PathBuf>,
}

impl SeedResult {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }

    pub fn swarm_description(&self) -> String {
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
        let mut s = format!(
            "seed {} [{}] {}\n  steps={} sim_time={:.3}s injected[{}]",
            self.seed,
            self.scenario,
            self.swarm.describe(),
            self.steps,
            self.sim_time_us as f64 / 1e6,
            faults.join(" ")
        );
        if let Some(f) = &self.failure {
            s.push_str(&format!("\n  FAILED {f}"));
        }
        if let Some(shrunk) = &self.shrunk {
            s.push_str(&format!("\n  shrunk to {}", shrunk.describe()));
        }
        if let Some(t) = &self.trace {
            s.push_str(&format!("\n  trace {}", t.display()));
        }
        s
    }
}

#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub seeds: u64,
    pub passed: u64,
    /// Failing seeds, by seed.
    pub failed: Vec<SeedResult>,
    pub steps: u64,
    pub sim_time_us: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub wall: Duration,
}

/// Run one seed: build its world, run it with checkers, and on failure
/// shrink it and write the trace of the smallest failing run.
pub fn run_seed(seed: u64, opts: &SimOptions) -> SeedResult {
    run_seed_inner(seed, opts, None)
}

/// [`run_seed`] with a bug planted in every machine, for the tests that
/// prove the checkers can fail.
#[doc(hidden)]
pub fn run_seed_with_bug(seed: u64, opts: &SimOptions, bug: PlantedBug) -> SeedResult {
    run_seed_inner(seed, opts, Some(bug))
}

/// One toolexec seed with a bug planted between the machine and the world,
/// for the tests that prove each checker can fail.
#[doc(hidden)]
pub fn run_toolexec_with_bug(seed: u64, bug: world::toolexec::ToolexecBug) -> Option<Failure> {
    world::toolexec::run(seed, Some(bug), false).failure
}

#[doc(hidden)]
pub use world::toolexec::ToolexecBug;

/// One toolexec seed with `bug` planted, traced. A failure is written into
/// the header's meta beside the bug, as the other worlds write theirs, so
/// the trace says what its rerun must find.
#[doc(hidden)]
pub fn toolexec_trace_with_bug(seed: u64, bug: ToolexecBug) -> (Option<Failure>, Vec<u8>) {
    use airlock_core::trace::toolexec as t;
    let o = world::toolexec::run(seed, Some(bug), true);
    let text = String::from_utf8(o.trace.unwrap_or_default()).unwrap_or_default();
    let Some(failure) = o.failure else { return (None, text.into_bytes()) };
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let mut header: t::Header = match serde_json::from_str(first) {
        Ok(h) => h,
        Err(_) => return (Some(failure), text.into_bytes()),
    };
    if let Some(meta) = header.meta.as_mut() {
        meta["failure"] = serde_json::to_value(&failure).unwrap_or_default();
    }
    let mut out = t::header_line(&header);
    out.push_str(rest);
    (Some(failure), out.into_bytes())
}

/// Re-run the toolexec world a trace came from (its seed, and the bug its
/// meta names, if any) with every checker on: the failure it finds now.
pub fn rerun_toolexec(header: &airlock_core::trace::toolexec::Header) -> Result<Option<Failure>, String> {
    let seed = header.seed.ok_or("trace has no seed: not written by the simulator")?;
    let bug = match header.meta.as_ref().and_then(|m| m.get("planted")) {
        Some(b) => Some(
            serde_json::from_value::<ToolexecBug>(b.clone())
                .map_err(|e| format!("trace header's planted bug: {e}"))?,
        ),
        None => None,
    };
    Ok(world::toolexec::run(seed, bug, false).failure)
}

pub use airlock_core::egress::EgressBug;

/// One egress seed with `bug` planted in the egress machine: its result
/// (the failure shrunk, the swarm it shrank to) and, on a failure, the
/// trace of the shrunk run, whose header's config carries the bug and
/// whose meta names the failure.
#[doc(hidden)]
pub fn egress_with_bug(seed: u64, bug: EgressBug) -> (SeedResult, Option<Vec<u8>>) {
    let opts = SimOptions { scenario: Scenario::Egress, ..SimOptions::default() };
    let swarm = swarm_for(seed, &opts);
    let out = world::egress::run(seed, swarm.clone(), Some(bug), None);
    let mut res = result(seed, Scenario::Egress, swarm.clone(), out);
    let Some(failure) = res.failure.clone() else { return (res, None) };
    let (small, small_failure) =
        shrink_with(swarm, failure, |cand| world::egress::run(seed, cand.clone(), Some(bug), None).failure);
    let note = serde_json::to_value(&small_failure).ok();
    let out = world::egress::run(seed, small.clone(), Some(bug), Some(note));
    res.failure = Some(small_failure);
    res.shrunk = Some(small);
    (res, out.trace)
}

/// Re-run the egress world a trace came from (its seed, its swarm from the
/// meta, the bug its config plants, if any) with every checker on.
pub fn rerun_egress(header: &airlock_core::trace::egress::Header) -> Result<SeedResult, String> {
    let seed = header.seed.ok_or("trace has no seed: not written by the simulator")?;
    let meta = header.meta.as_ref().ok_or("trace header has no meta")?;
    let swarm: Swarm = serde_json::from_value(meta.get("swarm").cloned().ok_or("trace header has no swarm")?)
        .map_err(|e| format!("trace header's swarm: {e}"))?;
    let out = world::egress::run(seed, swarm.clone(), header.config.planted_bug, None);
    Ok(result(seed, Scenario::Egress, swarm, out))
}

/// Run one seed (no shrinking) and return its full trace.
pub fn record_trace(seed: u64, opts: &SimOptions) -> (SeedResult, Vec<u8>) {
    let swarm = swarm_for(seed, opts);
    let out = world::run(seed, opts.scenario, swarm.clone(), None, Some(None));
    let trace = out.trace.clone().unwrap_or_default();
    (result(seed, opts.scenario, swarm, out), trace)
}

/// Where a failing seed's trace goes in the trace directory.
pub fn trace_file_name(seed: u64, scenario: Scenario) -> String {
    match scenario {
        Scenario::Default => format!("seed-{seed}.jsonl"),
        other => format!("seed-{seed}-{other}.jsonl"),
    }
}

/// Re-run the world a simulator trace came from — its seed, scenario and
/// swarm, read from the header — with every checker on, against the code
/// as it is now. The trace of a bug since fixed passes; a regression fails
/// again. (An exact replay of such a trace would diverge once the fix
/// changes an output, which is why regressions are checked this way.)
pub fn rerun(header: &airlock_core::trace::Header) -> Result<SeedResult, String> {
    rerun_from(header.seed, header.meta.as_ref(), header.config.planted_bug)
}

/// [`rerun`] for a trace of the tool scenario.
pub fn rerun_vfs(header: &airlock_core::trace::vfs::Header) -> Result<SeedResult, String> {
    rerun_from(header.seed, header.meta.as_ref(), header.config.planted_bug)
}

fn rerun_from(
    seed: Option<u64>,
    meta: Option<&serde_json::Value>,
    bug: Option<PlantedBug>,
) -> Result<SeedResult, String> {
    let seed = seed.ok_or("trace has no seed: not written by the simulator")?;
    let meta = meta.ok_or("trace header has no meta")?;
    let scenario: Scenario = meta
        .get("scenario")
        .and_then(serde_json::Value::as_str)
        .ok_or("trace header names no scenario")?
        .parse()?;
    let swarm: Swarm = serde_json::from_value(meta.get("swarm").cloned().ok_or("trace header has no swarm")?)
        .map_err(|e| format!("trace header's swarm: {e}"))?;
    let out = world::run(seed, scenario, swarm.clone(), bug, None);
    Ok(result(seed, scenario, swarm, out))
}

/// The swarm `seed` picks under `opts`.
pub fn swarm_for(seed: u64, opts: &SimOptions) -> Swarm {
    let mut swarm = Swarm::from_seed(seed, opts.scenario);
    if let Some(steps) = opts.steps {
        swarm.max_steps = steps;
    }
    // Set after the swarm is drawn, so the seed's other knobs are the same
    // whatever the count.
    if let Some(clients) = opts.clients {
        swarm.clients = clients.clamp(1, MAX_CLIENTS);
    }
    swarm
}

fn result(seed: u64, scenario: Scenario, swarm: Swarm, out: world::Outcome) -> SeedResult {
    SeedResult {
        seed,
        scenario,
        swarm,
        steps: out.steps,
        sim_time_us: out.now,
        faults: out.faults,
        failure: out.failure,
        shrunk: None,
        trace: None,
    }
}

fn run_seed_inner(seed: u64, opts: &SimOptions, bug: Option<PlantedBug>) -> SeedResult {
    let swarm = swarm_for(seed, opts);
    let out = world::run(seed, opts.scenario, swarm.clone(), bug, None);
    let mut res = result(seed, opts.scenario, swarm.clone(), out);
    let Some(failure) = res.failure.clone() else { return res };
    let (small, small_failure) = shrink(seed, opts.scenario, bug, swarm, failure);
    if let Some(dir) = &opts.trace_dir {
        // The shrunk run is replayed with tracing on; being deterministic, it
        // fails the same way, so the header can already say how.
        let note = serde_json::to_value(&small_failure).ok();
        let out = world::run(seed, opts.scenario, small.clone(), bug, Some(note));
        if let Some(trace) = out.trace {
            let path = dir.join(trace_file_name(seed, opts.scenario));
            if std::fs::create_dir_all(dir).is_ok() && std::fs::write(&path, &trace).is_ok() {
                res.trace = Some(path);
            }
        }
    }
    res.failure = Some(small_failure);
    res.shrunk = Some(small);
    res
}

/// Turn the swarm's knobs down while the same invariant still fails.
fn shrink(
    seed: u64,
    scenario: Scenario,
    bug: Option<PlantedBug>,
    swarm: Swarm,
    failure: Failure,
) -> (Swarm, Failure) {
    if scenario == Scenario::Toolexec {
        // Its world draws its own knobs from the seed; the swarm has none to turn.
        return (swarm, failure);
    }
    shrink_with(swarm, failure, |cand| world::run(seed, scenario, cand.clone(), bug, None).failure)
}

/// Turn the swarm's knobs down while `run` still fails the same invariant.
fn shrink_with(swarm: Swarm, failure: Failure, run: impl Fn(&Swarm) -> Option<Failure>) -> (Swarm, Failure) {
    let invariant = failure.invariant.clone();
    let attempt = |cand: &Swarm| -> Option<Failure> { run(cand).filter(|f| f.invariant == invariant) };
    let mut best = swarm;
    let mut best_failure = failure;
    // A run is the same up to its failing step whatever comes after.
    best.max_steps = best.max_steps.min(best_failure.step as usize);
    let accept = |cand: Swarm, best: &mut Swarm, best_failure: &mut Failure| -> bool {
        match attempt(&cand) {
            Some(f) => {
                *best = cand;
                best.max_steps = best.max_steps.min(f.step as usize);
                *best_failure = f;
                true
            }
            None => false,
        }
    };
    let unlimited = |s: &Swarm| Swarm { max_steps: 200_000.max(s.max_steps), ..s.clone() };
    for clients in 1..best.clients {
        if accept(Swarm { clients, ..unlimited(&best) }, &mut best, &mut best_failure) {
            break;
        }
    }
    if best.top_clients > 0 {
        accept(Swarm { top_clients: 0, ..unlimited(&best) }, &mut best, &mut best_failure);
    }
    for div in [16, 8, 4, 2] {
        let ops = (best.ops_per_client / div).max(1);
        if ops < best.ops_per_client
            && accept(Swarm { ops_per_client: ops, ..unlimited(&best) }, &mut best, &mut best_failure)
        {
            break;
        }
    }
    let kinds: Vec<FaultKind> = best.faults.keys().copied().collect();
    for kind in kinds {
        let mut cand = unlimited(&best);
        cand.faults.remove(&kind);
        accept(cand, &mut best, &mut best_failure);
    }
    if best.pipeline > 1 {
        accept(Swarm { pipeline: 1, ..unlimited(&best) }, &mut best, &mut best_failure);
    }
    (best, best_failure)
}

/// Run every seed of `opts.seeds` on `opts.jobs` threads. `progress` sees
/// each result as it completes (in completion order); the summary is in
/// seed order and does not depend on `jobs`.
pub fn run_many(opts: &SimOptions, progress: impl Fn(&SeedResult) + Sync) -> Summary {
    let start = WallInstant::now();
    let queue = SeedQueue::new(opts.seeds.clone());
    std::thread::scope(|s| {
        for _ in 0..opts.jobs.max(1) {
            s.spawn(|| {
                while let Some(seed) = queue.claim() {
                    let r = run_seed(seed, opts);
                    progress(&r);
                    queue.finish(r);
                }
            });
        }
    });
    let mut results = queue.into_results();
    results.sort_by_key(|r| r.seed);
    let mut summary = Summary { wall: start.elapsed(), ..Summary::default() };
    for r in results {
        summary.seeds += 1;
        summary.steps += r.steps;
        summary.sim_time_us += r.sim_time_us;
        for (k, n) in &r.faults {
            *summary.faults.entry(*k).or_default() += n;
        }
        if r.passed() {
            summary.passed += 1;
        } else {
            summary.failed.push(r);
        }
    }
    summary
}
