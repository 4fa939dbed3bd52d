//! Start-up cost of the confinement: `airlock run -- true` under the
//! default confinement (namespaces, mount view, seccomp, capabilities,
//! Landlock), under the fallback without namespaces, and with
//! `--no-sandbox`. The target: confined within 2x (+5 ms) of unconfined.

use criterion::{criterion_group, criterion_main, Criterion};
use std::process::{Command, Stdio};

fn run(extra: &[&str], no_namespaces: bool) {
    let dir = std::env::temp_dir();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
    cmd.current_dir(&dir).arg("run").args(extra).args(["--", "true"]);
    cmd.env_remove("AIRLOCK_FD").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    if no_namespaces {
        cmd.env("AIRLOCK_NO_NAMESPACES", "1");
    }
    let status = cmd.status().expect("airlock runs");
    assert!(status.success());
}

fn startup(c: &mut Criterion) {
    let mut g = c.benchmark_group("run_true");
    g.sample_size(30);
    g.bench_function("no_sandbox", |b| b.iter(|| run(&["--no-sandbox"], false)));
    g.bench_function("confined", |b| b.iter(|| run(&[], false)));
    g.bench_function("confined_without_namespaces", |b| b.iter(|| run(&[], true)));
    g.finish();
}

criterion_group!(benches, startup);
criterion_main!(benches);
