//! Every trace under `traces/` is replayed exactly; a simulator trace's world
//! is also re-run with its checkers on (see traces/README.md).

// The heap is counted, so the bounded-memory checker (invariant 11 against
// the real allocation) runs in every world.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

mod common;

use airlock_core::trace;
use std::io::BufReader;
use std::path::{Path, PathBuf};

fn traces_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            traces_under(&p, out);
        } else if p.extension().is_some_and(|e| e == "jsonl") {
            out.push(p);
        }
    }
}

#[test]
fn every_checked_in_trace_replays_and_its_world_still_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    let mut paths = Vec::new();
    traces_under(&root, &mut paths);
    let sessions = paths.iter().filter(|p| p.starts_with(root.join("sessions"))).count();
    let sims = paths.iter().filter(|p| p.starts_with(root.join("sim"))).count();
    let planted = paths.iter().filter(|p| p.starts_with(root.join("planted"))).count();
    assert!(planted >= 4, "expected the planted bugs' traces under {}", root.join("planted").display());
    assert!(
        sessions >= 3 && sims >= 2,
        "expected recorded sessions and simulator traces under {}",
        root.display()
    );
    let tools = paths.iter().filter(|p| machine_of(p) == "vfs").count();
    assert!(tools >= 2, "expected tool-scenario traces (machine vfs), a planted one among them");
    let mut failures = Vec::new();
    for path in &paths {
        let file = std::fs::File::open(path).unwrap();
        if machine_of(path) == "toolexec" {
            if let Err(e) = toolexec_trace(path) {
                failures.push(format!("{}: {e}", path.display()));
            }
            continue;
        }
        if machine_of(path) == "egress" {
            if let Err(e) = egress_trace(path) {
                failures.push(format!("{}: {e}", path.display()));
            }
            continue;
        }
        if machine_of(path) == "vfs" {
            if let Err(e) = tool_trace(BufReader::new(file)) {
                failures.push(format!("{}: {e}", path.display()));
            }
            continue;
        }
        match trace::replay(BufReader::new(file)) {
            Err(e) => failures.push(format!("{}: {e}", path.display())),
            Ok(report) if report.header.config.planted_bug.is_some() => {
                // A planted bug's trace (traces/planted/): its world, with
                // the bug, must still fail the way the header says — the
                // simulator still finds it.
                let want = report.header.meta.as_ref().and_then(|m| m["failure"]["invariant"].as_str());
                match airlock_sim::rerun(&report.header) {
                    Ok(r) if r.failure.as_ref().map(|f| f.invariant.as_str()) == want && want.is_some() => {}
                    Ok(r) => failures.push(format!(
                        "{}: planted bug no longer found as {want:?}: {}",
                        path.display(),
                        r.swarm_description()
                    )),
                    Err(e) => failures.push(format!("{}: {e}", path.display())),
                }
            }
            Ok(report) => {
                if report.header.seed.is_some() {
                    match airlock_sim::rerun(&report.header) {
                        Ok(r) if r.passed() => {}
                        Ok(r) => failures.push(format!(
                            "{}: world fails again: {}",
                            path.display(),
                            r.swarm_description()
                        )),
                        Err(e) => failures.push(format!("{}: {e}", path.display())),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The `machine` a trace's header names.
fn machine_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or_default()).unwrap();
    header["machine"].as_str().unwrap_or_default().to_owned()
}

/// A tool-scenario trace replays exactly against the VFS host; its world,
/// rerun, passes, or fails with the invariant its header names when a bug
/// was planted.
fn tool_trace(reader: impl std::io::BufRead) -> Result<(), String> {
    let report = trace::vfs::replay(reader).map_err(|e| e.to_string())?;
    let want = report.header.meta.as_ref().and_then(|m| m["failure"]["invariant"].as_str());
    let r = airlock_sim::rerun_vfs(&report.header)?;
    let got = r.failure.as_ref().map(|f| f.invariant.as_str());
    match (report.header.config.planted_bug, got) {
        (Some(_), Some(got)) if Some(got) == want => Ok(()),
        (None, None) => Ok(()),
        _ => Err(format!("world rerun: {got:?}, header says {want:?}: {}", r.swarm_description())),
    }
}

/// A toolexec trace replays exactly against the server machine; its world,
/// rerun with the bug its meta names, fails with the invariant the meta
/// names, or passes when none was planted.
fn toolexec_trace(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    trace::replay_any(text.as_bytes())?;
    let header: trace::toolexec::Header =
        serde_json::from_str(text.lines().next().unwrap_or_default()).map_err(|e| e.to_string())?;
    let meta = header.meta.as_ref();
    let want = meta.and_then(|m| m["failure"]["invariant"].as_str());
    let planted = meta.is_some_and(|m| m.get("planted").is_some());
    let got = airlock_sim::rerun_toolexec(&header)?;
    match (planted, got.as_ref().map(|f| f.invariant.as_str())) {
        (true, Some(got)) if Some(got) == want => Ok(()),
        (false, None) => Ok(()),
        (_, got) => Err(format!("world rerun: {got:?}, header says {want:?}")),
    }
}

/// An egress trace replays exactly against the egress machine; its world,
/// rerun (with the bug its config plants), fails with the invariant its
/// meta names, or passes when none was planted.
fn egress_trace(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let report = trace::egress::replay(text.as_bytes()).map_err(|e| e.to_string())?;
    let want = report.header.meta.as_ref().and_then(|m| m["failure"]["invariant"].as_str());
    let r = airlock_sim::rerun_egress(&report.header)?;
    let got = r.failure.as_ref().map(|f| f.invariant.as_str());
    match (report.header.config.planted_bug, got) {
        (Some(_), Some(got)) if Some(got) == want => Ok(()),
        (None, None) => Ok(()),
        _ => Err(format!("world rerun: {got:?}, header says {want:?}: {}", r.swarm_description())),
    }
}
