//! Bounds on what the child takes (issue 39): a process flood is refused
//! at `--max-processes`, a memory hog stopped at `--max-memory`, a CPU
//! burner held to `--max-cpu`; airlock survives each, says which bound
//! was reached (stderr and the report, where a cgroup counts it), and
//! removes the session's cgroups, a SIGKILLed airlock's at the next start.
//! Both modes; as root (cgroups: v1 on this machine) and as uid 65534
//! (no cgroup is delegated to it here: rlimits, with what they leave
//! listed in `not_enforced`).

mod common;
mod confine_common;
mod confine_who;

use confine_common::Mode;
use confine_who::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

struct Ran {
    out: Output,
    report: Value,
    ctx: String,
}

impl Ran {
    fn lines(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn bounds(&self) -> &Value {
        &self.report["sandbox"]["bounds"]
    }
    fn by(&self, bound: &str) -> &str {
        self.bounds()[bound]["by"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no bounds.{bound}: {}", self.ctx, self.report))
    }
    fn hit(&self) -> Vec<String> {
        self.bounds()["hit"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }
    fn gaps(&self) -> Vec<String> {
        self.report["sandbox"]["not_enforced"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }
}

fn run(f: &Fixture, mode: Mode, args: &[&str], script: &str, script_args: &[String]) -> Ran {
    let ctx = format!("{mode:?} as {:?} {args:?}", f.who);
    let report = f.report_path();
    let out = f.run_command(mode, args, &report, &f.attack(script, script_args)).output().unwrap();
    let report = read_report(&report, &ctx, &String::from_utf8_lossy(&out.stderr));
    Ran { out, report, ctx }
}

/// The process bound: with a cgroup (root) it is exact and counted; for
/// an ordinary user `RLIMIT_NPROC` is exact in its own user namespace and
/// shared with its other processes without one (listed).
#[test]
fn a_process_flood_is_refused_at_the_bound_and_airlock_survives() {
    const MAX: u64 = 40;
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        let r = run(&f, mode, &["--max-processes", &MAX.to_string()], "flood.py", &["300".into()]);
        let ctx = &r.ctx;
        assert_eq!(r.out.status.code(), Some(0), "{ctx}: {}", r.stderr());
        let line = r.lines().into_iter().find(|l| l.get("started").is_some()).expect("the flood's count");
        let started = line["started"].as_u64().unwrap();
        // Shared with the user's other processes, the bound moves as they
        // come and go (other tests run as this user too): the flood is
        // still stopped, and the report says the bound is not the
        // session's own.
        let shared = (who, mode) == (Who::Nobody, Mode::Fallback);
        let most = if shared { 300 } else { MAX };
        assert!(started < most, "{ctx}: {started} processes started past --max-processes {MAX}");
        assert_eq!(line["refused"], libc::EAGAIN, "{ctx}: {line}");
        assert_eq!(r.bounds()["processes"]["max"], MAX, "{ctx}");
        match (who, mode) {
            (Who::Root, _) => {
                assert_eq!(r.by("processes"), "cgroup_v1", "{ctx}");
                assert!(r.hit().contains(&"processes".to_owned()), "{ctx}: {}", r.report);
                assert!(r.stderr().contains("--max-processes 40"), "{ctx}: {}", r.stderr());
            }
            (Who::Nobody, Mode::Namespaces) => assert_eq!(r.by("processes"), "rlimit_session", "{ctx}"),
            (Who::Nobody, Mode::Fallback) => {
                assert_eq!(r.by("processes"), "rlimit_user", "{ctx}");
                assert!(r.gaps().contains(&"max_processes_per_session".to_owned()), "{ctx}: {:?}", r.gaps());
            }
        }
    }
}

/// The memory bound: with a cgroup the kernel kills the hog (airlock
/// exits as the child did, 128+9, after its report and a message); with
/// `RLIMIT_AS` its allocation fails. Either way it never holds more than
/// the bound.
#[test]
fn a_memory_hog_is_stopped_at_the_bound_and_airlock_survives() {
    const MIB: u64 = 64;
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        let r = run(&f, mode, &["--max-memory", "64M"], "hog.py", &["400".into()]);
        let ctx = &r.ctx;
        let held = r.lines().iter().filter_map(|l| l["held"].as_u64()).max().unwrap_or(0);
        assert!(
            held > 0 && held < MIB,
            "{ctx}: the hog held {held} MiB under --max-memory 64M: {}",
            r.stderr()
        );
        assert_eq!(r.bounds()["memory"]["max"], MIB << 20, "{ctx}");
        match who {
            Who::Root => {
                assert_eq!(r.by("memory"), "cgroup_v1", "{ctx}");
                assert_eq!(r.out.status.code(), Some(128 + libc::SIGKILL), "{ctx}: {}", r.stderr());
                assert_eq!(r.report["child_exit"]["signal"], libc::SIGKILL, "{ctx}: {}", r.report);
                assert!(r.hit().contains(&"memory".to_owned()), "{ctx}: {}", r.report);
                assert!(r.stderr().contains("--max-memory"), "{ctx}: {}", r.stderr());
            }
            Who::Nobody => {
                assert_eq!(r.by("memory"), "rlimit_process", "{ctx}");
                assert_eq!(
                    r.out.status.code(),
                    Some(3),
                    "{ctx}: the hog did not meet MemoryError: {}",
                    r.stderr()
                );
                assert!(r.gaps().contains(&"max_memory_per_session".to_owned()), "{ctx}: {:?}", r.gaps());
            }
        }
    }
}

/// The CPU bound: two processes burning CPU for a second get about 30 %
/// of one CPU between them under `--max-cpu 30` (a cgroup's quota); an
/// ordinary user has no CPU bound here, and the report lists `max_cpu`.
#[test]
fn a_cpu_burner_is_held_to_the_bound() {
    for (mode, who) in cases() {
        let f = Fixture::new(who);
        let r = run(&f, mode, &["--max-cpu", "30"], "spin.py", &["2".into(), "1.5".into()]);
        let ctx = &r.ctx;
        assert_eq!(r.out.status.code(), Some(0), "{ctx}: {}", r.stderr());
        let line = r.lines().into_iter().find(|l| l.get("cpu").is_some()).expect("the burner's account");
        let share = line["cpu"].as_f64().unwrap() / line["wall"].as_f64().unwrap();
        assert_eq!(r.bounds()["cpu"]["max"], 30, "{ctx}");
        match who {
            Who::Root => {
                assert_eq!(r.by("cpu"), "cgroup_v1", "{ctx}");
                assert!(share < 0.5, "{ctx}: the burners took {share:.2} CPUs under --max-cpu 30");
                assert!(r.hit().contains(&"cpu".to_owned()), "{ctx}: {}", r.report);
            }
            Who::Nobody => {
                assert_eq!(r.by("cpu"), "none", "{ctx}");
                assert!(r.gaps().contains(&"max_cpu".to_owned()), "{ctx}: {:?}", r.gaps());
            }
        }
    }
}

/// Without flags every session is bounded: 1,024 processes, half the
/// host's memory, every CPU but one (at least one).
#[test]
fn every_session_is_bounded_by_default() {
    let total = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")
                .map(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap())
        })
        .unwrap()
        * 1024;
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let f = Fixture::new(Who::Root);
    for mode in confine_common::MODES {
        let r = run(&f, mode, &[], "flood.py", &["1".into()]);
        assert_eq!(r.bounds()["processes"]["max"], 1024, "{}", r.report);
        assert_eq!(r.bounds()["memory"]["max"], total / 2, "{}", r.report);
        assert_eq!(r.bounds()["cpu"]["max"], cpus.saturating_sub(1).max(1) * 100, "{}", r.report);
        assert!(r.hit().is_empty(), "{}", r.report);
    }
}

/// `max_processes`, `max_memory` and `max_cpu` in the config file set the
/// bounds as the flags do; a flag wins over its key.
#[test]
fn the_config_file_sets_the_bounds_and_a_flag_wins() {
    let f = Fixture::new(Who::Root);
    let config = f.project.join("airlock.toml");
    std::fs::write(&config, "max_processes = 30\nmax_memory = \"96M\"\nmax_cpu = 50\n").unwrap();
    let c = config.display().to_string();
    let r = run(&f, Mode::Namespaces, &["--config", &c, "--max-cpu", "70"], "flood.py", &["1".into()]);
    assert_eq!(r.bounds()["processes"]["max"], 30, "{}", r.report);
    assert_eq!(r.bounds()["memory"]["max"], 96 << 20, "{}", r.report);
    assert_eq!(r.bounds()["cpu"]["max"], 70, "{}", r.report);
    let out =
        f.airlock(Mode::Namespaces).args(["run", "--max-processes", "2", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-processes 2"));
}

/// The session's cgroups (one per v1 hierarchy here) while it runs.
fn groups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("airlock-{pid}.");
    let mut found = Vec::new();
    let mut todo = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(ty) = e.file_type() else { continue };
            if !ty.is_dir() || ty.is_symlink() {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(e.path());
            } else if d.components().count() < 8 {
                todo.push(e.path());
            }
        }
    }
    found
}

/// A session's cgroups go at its end; a SIGKILLed airlock's stay, with
/// whatever still ran in them (in the fallback, a daemon the subreaper
/// could not reap), until the next airlock starts: then the processes are
/// killed and the groups removed.
#[test]
fn a_killed_sessions_cgroups_go_when_the_next_airlock_starts() {
    let f = Fixture::new(Who::Root);
    for mode in confine_common::MODES {
        let report = f.report_path();
        let script = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\n    os._exit(0)\nprint('ready', flush=True)\ntime.sleep(120)\n";
        let cmd = ["python3".to_owned(), "-c".to_owned(), script.to_owned()];
        let mut airlock = f.run_command(mode, &[], &report, &cmd).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(airlock.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{mode:?}");
        let groups = groups_of(airlock.id());
        assert_eq!(groups.len(), 3, "{mode:?}: pids, memory, cpu: {groups:?}");
        airlock.kill().unwrap();
        airlock.wait().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            groups.iter().all(|g| g.exists()),
            "{mode:?}: a SIGKILLed airlock's groups went by themselves?"
        );
        let out = f.airlock(mode).args(["run", "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let deadline = Instant::now() + Duration::from_secs(5);
        while groups.iter().any(|g| g.exists()) {
            assert!(Instant::now() < deadline, "{mode:?}: stale groups stay: {groups:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        // And a normal end leaves none of its own.
        let r = run(&f, mode, &[], "flood.py", &["3".into()]);
        assert_eq!(r.out.status.code(), Some(0));
    }
    assert!(groups_of(std::process::id()).is_empty());
}

/// `airlock tool`'s tool runs in cgroups of its own, bounded by the
/// defaults, and they are gone when it ends.
#[test]
fn the_vfs_tool_is_bounded_too() {
    let script = r#"
import json, sys
sys.stdin.readline()
text = open("/proc/self/cgroup").read()
print(json.dumps({"jsonrpc": "2.0", "method": "result", "params": {"content": text}}), flush=True)
"#;
    let project = tempfile::tempdir().unwrap();
    for mode in confine_common::MODES {
        let mut c = std::process::Command::new(common::airlock());
        c.current_dir(project.path())
            .args(["tool", "--sandbox-ro", "/proc", "--", "python3", "-c", script])
            .stdin(Stdio::null());
        if mode == Mode::Fallback {
            c.env(confine_common::NO_NAMESPACES, "1");
        }
        let out = c.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let j: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{mode:?}: {e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
        let text = j["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{mode:?}: {j}"));
        let groups: Vec<&str> = text
            .lines()
            .filter(|l| ["pids", "memory", "cpu"].iter().any(|c| l.split(':').nth(1) == Some(*c)))
            .filter(|l| l.contains("/airlock-"))
            .collect();
        assert_eq!(groups.len(), 3, "{mode:?}: the tool is not in a group of its own for each bound: {text}");
        // The group's path on the host, for the pids hierarchy.
        let pids = groups.iter().find(|l| l.contains(":pids:")).unwrap().splitn(3, ':').nth(2).unwrap();
        let dir = PathBuf::from(format!("/sys/fs/cgroup/pids{pids}"));
        assert!(!dir.exists(), "{mode:?}: {} stays after the tool ended", dir.display());
    }
}
