//! Shared by the integration tests: run the real `airlock` binary with real
//! children and read what it reports.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A PATH of system locations only, for a test that means the system's
/// interpreter. The tests otherwise run with the caller's PATH, as a user
/// would (a version manager's shims first included: airlock resolves them).
pub const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

pub fn airlock() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

pub fn support(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support").join(file)
}

/// A python3 child running `script` with the test client importable.
pub fn python(script: &str) -> Vec<String> {
    let prelude = format!(
        "import sys; sys.path.insert(0, {:?})\nfrom fsclient import *\n",
        support("").display().to_string()
    );
    vec!["python3".into(), "-c".into(), format!("{prelude}{script}")]
}

pub struct Run {
    pub output: Output,
    pub report: serde_json::Value,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The child's JSON lines on stdout.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.stdout()
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}\n{}", self.stderr()))
            })
            .collect()
    }

    pub fn report_u64(&self, key: &str) -> u64 {
        self.report[key].as_u64().unwrap_or_else(|| panic!("report has no {key}: {}", self.report))
    }

    /// The invariant every session must end with.
    pub fn assert_no_leaks(&self) {
        assert_eq!(self.report_u64("handles_leaked"), 0, "report: {}", self.report);
        assert_eq!(self.report_u64("files_leaked"), 0, "report: {}", self.report);
        assert_eq!(
            self.report_u64("handles_opened"),
            self.report_u64("handles_closed"),
            "report: {}",
            self.report
        );
    }
}

/// `airlock run ARGS -- CMD` in `dir`, with a report, stdin from /dev/null.
pub fn run_in(dir: &Path, args: &[&str], cmd: &[String]) -> Run {
    run_with_stdin(dir, args, cmd, Stdio::null())
}

pub fn run_with_stdin(dir: &Path, args: &[&str], cmd: &[String], stdin: Stdio) -> Run {
    run_full(dir, args, cmd, stdin, &[])
}

/// `run_in` with further variables in airlock's environment.
pub fn run_in_env(dir: &Path, args: &[&str], cmd: &[String], envs: &[(&str, &str)]) -> Run {
    run_full(dir, args, cmd, Stdio::null(), envs)
}

fn run_full(dir: &Path, args: &[&str], cmd: &[String], stdin: Stdio, envs: &[(&str, &str)]) -> Run {
    let report = dir.join(format!("report-{}.json", unique()));
    let start = Instant::now();
    let output = Command::new(airlock())
        .current_dir(dir)
        .arg("run")
        // The tests' Python client library, read directly by the child.
        .arg("--sandbox-ro")
        .arg(support(""))
        .args(args)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(cmd)
        .env_remove("AIRLOCK_FD")
        .env("SUPPORT", support(""))
        .env("PYTHONPATH", support(""))
        .envs(envs.iter().copied())
        .stdin(stdin)
        .output()
        .expect("airlock runs");
    let elapsed = start.elapsed();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}); stderr: {}", String::from_utf8_lossy(&output.stderr)));
    let report = serde_json::from_str(&text).expect("report is JSON");
    Run { output, report, elapsed }
}

/// The descriptors `pid` holds: the entries of `/proc/<pid>/fd`, or why
/// they cannot be counted. airlock is not dumpable, so only a caller with
/// CAP_SYS_PTRACE over it (root) may list them; a count that reads nothing
/// must fail the test, not pass as zero.
pub fn try_descriptors(pid: u32) -> Result<u64, String> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    let n = dir.count() as u64;
    // A live process holds at least its stdio: none means nothing was seen.
    if n == 0 {
        return Err(format!("/proc/{pid}/fd lists nothing"));
    }
    Ok(n)
}

/// [`try_descriptors`], failing the test when they cannot be counted.
pub fn descriptors(pid: u32) -> u64 {
    try_descriptors(pid).unwrap_or_else(|e| panic!("cannot count airlock's descriptors: {e}"))
}

pub fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// What a test server reads of a request: up to the end of its head (or
/// the peer's end, or a read error such as the socket's timeout).
pub fn read_head(s: &mut impl std::io::Read) -> Vec<u8> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    head
}
