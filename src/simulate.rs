//! `airlock sim` and `airlock replay`: the simulator's and the traces'
//! command-line faces.

use airlock_core::trace;
use airlock_sim::{Scenario, SeedResult, SimOptions};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufReader, Write};
use std::path::PathBuf;

/// `println!`, except that a reader gone from stdout (`airlock sim | head`)
/// ends the process quietly with the status SIGPIPE would give, rather
/// than a panic.
macro_rules! say {
    ($($t:tt)*) => { say_line(format_args!($($t)*)) };
}

fn say_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("airlock: cannot write to stdout: {e}");
        std::process::exit(74);
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Run this many seeds (from --seed, or from 0).
    #[arg(long, value_name = "N")]
    pub seeds: Option<u64>,
    /// The first seed; alone, run just this one and describe its swarm.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// The world: `default` (one proxy, several clients), `nested` (an
    /// intermediate proxy in front of the top one), `broker` (LLM calls
    /// through the broker with a simulated provider), `adversary`
    /// (symlinks swapped inside the roots, nested levels with wider,
    /// narrower and empty policies), `pager` (the fd pager at the top of a
    /// nested tree), `tool` (a VFS tool host against a hostile tool),
    /// `toolexec` (a ToolExec server against hostile clients and tools),
    /// `egress` (the egress proxies against hostile clients and a
    /// simulated internet) or `fuse` (one served filesystem's mount against
    /// a hostile kernel client).
    /// Every scenario's `--record` trace replays with `airlock replay`.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub scenario: Scenario,
    /// Steps before each world winds down (default: the seed's choice).
    #[arg(long, value_name = "K")]
    pub steps: Option<usize>,
    /// Clients per world (default: the seed's choice, 2 to 5 in `default`;
    /// the intermediate's clients when nested). Every other knob of the
    /// seed is kept, so this measures how a world's cost grows with its
    /// clients. Not used by `tool`, `toolexec`, `egress` and `fuse`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=airlock_sim::MAX_CLIENTS as i64))]
    pub clients: Option<u16>,
    /// Where failing seeds' traces go.
    #[arg(long, value_name = "DIR", default_value = "traces/failures")]
    pub trace_dir: PathBuf,
    /// Worker threads (results do not depend on it).
    #[arg(long, value_name = "J")]
    pub jobs: Option<usize>,
    /// With --seed alone: write that seed's whole trace to FILE.
    #[arg(long, value_name = "FILE", requires = "seed", conflicts_with = "seeds")]
    pub record: Option<PathBuf>,
}

/// Exit status 0 only when every seed held every invariant.
pub fn sim(args: &SimArgs) -> anyhow::Result<i32> {
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let start = args.seed.unwrap_or(0);
    let count = match (args.seeds, args.seed) {
        (Some(n), _) => n,
        (None, Some(_)) => 1,
        (None, None) => 1000,
    };
    let opts = SimOptions {
        seeds: start..start.saturating_add(count),
        steps: args.steps,
        clients: args.clients.map(usize::from),
        scenario: args.scenario,
        jobs,
        trace_dir: Some(args.trace_dir.clone()),
    };
    if let Some(path) = &args.record {
        let (r, trace) = airlock_sim::record_trace(start, &opts);
        std::fs::write(path, trace).with_context(|| format!("writing {}", path.display()))?;
        say!("{}\n  trace {}", r.swarm_description(), path.display());
        say!("{}", verdict(&r));
        return Ok(if r.passed() { 0 } else { 1 });
    }
    if args.seeds.is_none() && args.seed.is_some() {
        let r = airlock_sim::run_seed(start, &opts);
        say!("{}", r.swarm_description());
        report_failure(&r, &opts);
        say!("{}", verdict(&r));
        return Ok(if r.passed() { 0 } else { 1 });
    }
    // Hidden when stderr is not a terminal.
    let bar = ProgressBar::new(count);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} seeds {per_sec} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let summary = airlock_sim::run_many(&opts, |r| {
        bar.inc(1);
        if !r.passed() {
            bar.println(format!("seed {} FAILED", r.seed));
        }
    });
    bar.finish_and_clear();
    let secs = summary.wall.as_secs_f64();
    say!(
        "{} seeds ({} scenario) in {:.2}s: {:.0} seeds/s, {} steps ({:.0} steps/s), {:.1}s simulated ({:.0}x wall)",
        summary.seeds,
        args.scenario,
        secs,
        summary.seeds as f64 / secs.max(1e-9),
        summary.steps,
        summary.steps as f64 / secs.max(1e-9),
        summary.sim_time_us as f64 / 1e6,
        summary.sim_time_us as f64 / 1e6 / secs.max(1e-9),
    );
    let faults: Vec<String> = summary.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
    say!("faults injected: {}", faults.join(" "));
    say!("passed {}, failed {}", summary.passed, summary.failed.len());
    for r in &summary.failed {
        report_failure(r, &opts);
    }
    Ok(if summary.failed.is_empty() { 0 } else { 1 })
}

/// The last line of a one-seed run, so a rerun's outcome needs no
/// knowledge of exit statuses.
fn verdict(r: &SeedResult) -> String {
    format!("seed {} {}", r.seed, if r.passed() { "passed" } else { "failed" })
}

fn report_failure(r: &SeedResult, opts: &SimOptions) {
    let Some(f) = &r.failure else { return };
    say!("seed {} broke {}", r.seed, f);
    // The knobs that change the world are part of the rerun.
    let mut knobs = String::new();
    if let Some(k) = opts.steps {
        knobs.push_str(&format!(" --steps {k}"));
    }
    if let Some(n) = opts.clients {
        knobs.push_str(&format!(" --clients {n}"));
    }
    say!("  rerun:  airlock sim --seed {} --scenario {}{knobs}", r.seed, opts.scenario);
    if let Some(t) = &r.trace {
        say!("  replay: airlock replay {}", t.display());
    }
}

/// Replay every trace, reporting each (one that cannot be opened too);
/// exit status 0 only when all reproduce exactly.
pub fn replay(paths: &[PathBuf]) -> anyhow::Result<i32> {
    let mut failed = 0;
    for path in paths {
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) => {
                failed += 1;
                say!("{}: cannot open: {e}", path.display());
                continue;
            }
        };
        match trace::replay_any(BufReader::new(file)) {
            Ok(r) => say!("{}: ok ({} inputs, {} outputs)", path.display(), r.inputs, r.outputs),
            Err(e) => {
                failed += 1;
                say!("{}: {e}", path.display());
            }
        }
    }
    if paths.len() > 1 {
        say!("{} traces: {} reproduced, {failed} failed", paths.len(), paths.len() - failed);
    }
    Ok(if failed == 0 { 0 } else { 1 })
}
