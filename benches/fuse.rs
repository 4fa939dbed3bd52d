//! The served filesystem (issue 41) against direct access, in the same
//! run: one `airlock run` per configuration, whose child sees the same
//! content twice, served (`--allow served`, a FUSE mount) and direct
//! (`--sandbox-ro direct`, a copy the sandbox lets it read itself). A
//! driver in the child (Python) times each operation on either side with
//! `time.perf_counter` and answers the bench over its stdout, so airlock's
//! start-up is outside every figure (`iter_custom`).
//!
//! - `cat`: a whole file read through a 128 KiB buffer (as `cat` reads),
//!   with passthrough (airlock's default as root) and without
//!   (`--no-fuse-passthrough`, every read served by airlock); the served
//!   file both as the mount's page cache keeps it between reads and with
//!   that cache dropped before each (`posix_fadvise(DONTNEED)` on the
//!   mount's file; the host's page cache, which the direct copy reads
//!   from, is warm for both);
//! - `git_status`: `git status --porcelain` of a clean checkout, with the
//!   kernel's lookup and attribute cache as by default (1 s), kept
//!   throughout (`--fuse-cache-ms 60000`) and with none (`0`);
//! - `stat`, `open_close`: one file's, with the kernel's lookup and
//!   attribute cache as by default (1 s) and with none
//!   (`--fuse-cache-ms 0`: each one asks airlock).
//!
//! Sizes: 64 MiB and 10,000 files under `cargo bench` (`--bench`); small
//! ones when the bench runs as a test (`cargo test --all-targets`), which
//! runs each routine once.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The child's driver: `OP SIDE N` on each line of its stdin, one JSON
/// answer a line. It first says whether each side is on an anonymous
/// device (a FUSE mount) or the host's disk, so a fallback to the proxy
/// alone fails the bench (the fixture must be on a disk).
const DRIVER: &str = r#"
import json, os, subprocess, sys, time
roots = {"served": sys.argv[1], "direct": sys.argv[2]}
# A FUSE mount has an anonymous device (major 0); the host's disk does not.
kinds = {side: "fuse" if os.major(os.stat(root).st_dev) == 0 else "disk" for side, root in roots.items()}
print(json.dumps({"ready": kinds}), flush=True)
buf = bytearray(128 * 1024)
def cat(root, n, cold=False):
    path, total, secs = os.path.join(root, "data"), 0, 0.0
    for _ in range(n):
        if cold:
            # The mount's page cache of the file dropped (the host's stays):
            # every byte is asked of the filesystem again.
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while True:
                got = f.readinto(buf)
                if not got:
                    break
                total += got
        secs += time.perf_counter() - t
    return secs, total // n
def cat_cold(root, n):
    return cat(root, n, cold=(root == roots["served"]))
def git(root, n):
    t = time.perf_counter()
    for _ in range(n):
        out = subprocess.run(["git", "-c", "safe.directory=*", "status", "--porcelain"], cwd=os.path.join(root, "repo"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
        if out.stdout:
            raise RuntimeError("not clean: " + out.stdout[:200].decode(errors="replace"))
    return time.perf_counter() - t, 0
def stat(root, n):
    path = os.path.join(root, "small.txt")
    t = time.perf_counter()
    for _ in range(n):
        os.stat(path)
    return time.perf_counter() - t, 0
def open_close(root, n):
    path = os.path.join(root, "small.txt")
    t = time.perf_counter()
    for _ in range(n):
        os.close(os.open(path, os.O_RDONLY))
    return time.perf_counter() - t, 0
ops = {"cat": cat, "cat_cold": cat_cold, "git": git, "stat": stat, "open_close": open_close}
for line in sys.stdin:
    op, side, n = line.split()
    try:
        secs, size = ops[op](roots[side], int(n))
        print(json.dumps({"secs": secs, "size": size}), flush=True)
    except Exception as e:
        print(json.dumps({"error": repr(e)}), flush=True)
"#;

/// Whether criterion measures (`cargo bench`) rather than runs each
/// routine once as a test.
fn measuring() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

#[path = "support/driver.rs"]
mod driver;
use driver::Driver;

/// One `airlock run` and its driver.
struct Session(Driver);

impl Session {
    /// `airlock run FLAGS --allow served --sandbox-ro direct` in `dir`.
    fn start(dir: &Path, flags: &[&str]) -> Session {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
        cmd.current_dir(dir)
            .arg("run")
            .args(flags)
            .args(["--allow", "served", "--sandbox-ro", "direct", "--", "/usr/bin/python3", "-c", DRIVER])
            .arg(dir.join("served"))
            .arg(dir.join("direct"));
        let (d, ready) = Driver::start(cmd);
        assert_eq!(ready["ready"]["served"], "fuse", "not served as a filesystem: {ready}");
        assert_ne!(ready["ready"]["direct"], "fuse", "the direct copy is served: {ready}");
        Session(d)
    }

    /// The time the driver took for `n` of `op` on `side`; `size`, when
    /// given, the bytes each must have read.
    fn time(&mut self, op: &str, side: &str, n: u64, size: Option<u64>) -> Duration {
        let a = self.0.ask(&format!("{op} {side} {n}"));
        let secs = a["secs"].as_f64().unwrap_or_else(|| panic!("{op} {side}: {a}"));
        if let Some(size) = size {
            assert_eq!(a["size"].as_u64(), Some(size), "{op} {side}: {a}");
        }
        Duration::from_secs_f64(secs)
    }
}

/// A fresh directory holding `served/` and `direct/`, each made by `fill`.
fn fixture(fill: impl Fn(&Path)) -> tempfile::TempDir {
    let tmp = tempfile::Builder::new().prefix("airlock-fuse-bench").tempdir().expect("a temporary directory");
    for side in ["served", "direct"] {
        let d = tmp.path().join(side);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("small.txt"), b"small\n").unwrap();
        fill(&d);
    }
    tmp
}

fn cat(c: &mut Criterion) {
    let size: u64 = if measuring() { 64 << 20 } else { 1 << 20 };
    let tmp = fixture(|d| {
        // Incompressible and different at every offset.
        let mut data = Vec::with_capacity(size as usize);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        while (data.len() as u64) < size {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(d.join("data"), &data).unwrap();
    });
    let mut g = c.benchmark_group(format!("fuse_cat_{}MiB", size >> 20));
    g.sample_size(10);
    for (config, flags) in [("passthrough", &[][..]), ("no_passthrough", &["--no-fuse-passthrough"][..])] {
        let mut s = Session::start(tmp.path(), flags);
        let mut bench = |id: String, op: &'static str, side: &'static str| {
            g.bench_function(BenchmarkId::new(id, config), |b| {
                b.iter_custom(|n| s.time(op, side, n, Some(size)))
            });
        };
        bench("direct".into(), "cat", "direct");
        // The mount's page cache kept from the last read (a read-only
        // open keeps it), and dropped before each read.
        bench("served_cached".into(), "cat", "served");
        bench("served_uncached".into(), "cat_cold", "served");
    }
    g.finish();
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "safe.directory=*", "-c", "user.name=Bench", "-c", "user.email=bench@example.com"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn git_status(c: &mut Criterion) {
    let files: usize = if measuring() { 10_000 } else { 200 };
    let tmp = fixture(|d| {
        let repo = d.join("repo");
        // 100 files a directory, as a source tree spreads them.
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        for i in 0..files {
            let sub = repo.join(format!("d{}", i / 100));
            std::fs::create_dir_all(&sub).unwrap();
            let p = sub.join(format!("f{i}.txt"));
            std::fs::write(&p, format!("file {i}\n")).unwrap();
            // Older than the index, so no entry is racily clean and
            // re-read by every status.
            std::fs::File::options().write(true).open(&p).unwrap().set_modified(old).unwrap();
        }
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-qm", "init"]);
        git(&repo, &["update-index", "--refresh"]);
    });
    let mut g = c.benchmark_group(format!("fuse_git_status_{files}_files"));
    g.sample_size(10);
    // The default keeps lookups for 1 s, so back-to-back runs find some
    // of theirs kept and some not; a long cache keeps all (once a first
    // run has made them), none keeps none.
    for (config, flags) in [
        ("default", &[][..]),
        ("cached_60s", &["--fuse-cache-ms", "60000"][..]),
        ("uncached", &["--fuse-cache-ms", "0"][..]),
    ] {
        let mut s = Session::start(tmp.path(), flags);
        // The first run, uncounted, reads the index and fills the caches.
        s.time("git", "served", 1, None);
        for side in ["direct", "served"] {
            g.bench_function(BenchmarkId::new(side, config), |b| {
                b.iter_custom(|n| s.time("git", side, n, None))
            });
        }
    }
    g.finish();
}

fn per_op(c: &mut Criterion) {
    let tmp = fixture(|_| {});
    for op in ["stat", "open_close"] {
        let mut g = c.benchmark_group(format!("fuse_{op}"));
        g.sample_size(20);
        for (config, flags) in [("cached", &[][..]), ("uncached", &["--fuse-cache-ms", "0"][..])] {
            let mut s = Session::start(tmp.path(), flags);
            for side in ["direct", "served"] {
                g.bench_function(BenchmarkId::new(side, config), |b| {
                    b.iter_custom(|n| s.time(op, side, n, None))
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, cat, git_status, per_op);
criterion_main!(benches);
