//! Replays the checked-in fuzz corpora through the same entry points the
//! fuzz targets call, so every input that once mattered to a fuzzer is
//! re-checked by a plain `cargo test`, on stable, without cargo-fuzz.

// The heap is counted, so every input's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

#[path = "support/url_oracle.rs"]
mod url_oracle;

#[path = "support/egress_oracle.rs"]
mod egress_oracle;

use std::fs;
use std::path::PathBuf;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {} unreadable: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    // An empty or vanished corpus would make this test pass vacuously.
    assert!(files.len() >= 5, "corpus {} has only {} files", dir.display(), files.len());
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("non-string panic");
            panic!("{} failed: {why}", file.display());
        }
    }
}

#[test]
fn frame_decoder_corpus() {
    replay("frame_decoder", airlock_core::fuzzing::frame_decoder);
}

#[test]
fn fsproxy_request_corpus() {
    replay("fsproxy_request", airlock_core::fuzzing::fsproxy_request);
}

#[test]
fn fsproxy_session_corpus() {
    replay("fsproxy_session", airlock_core::fuzzing::fsproxy_session);
}

#[test]
fn broker_events_corpus() {
    replay("broker_events", airlock_core::fuzzing::broker_events);
}

#[test]
fn fsproxy_nested_corpus() {
    replay("fsproxy_nested", airlock_core::fuzzing::fsproxy_nested);
}

#[test]
fn pager_corpus() {
    replay("pager", airlock_core::pager::fuzzing::pager_session);
}

#[test]
fn vfs_host_corpus() {
    replay("vfs_host", airlock_core::vfs::fuzzing::host_session);
}

#[test]
fn fuse_codec_corpus() {
    replay("fuse_codec", airlock_core::fuse::fuzzing::codec);
}

#[test]
fn toolexec_events_corpus() {
    replay("toolexec_events", airlock_core::fuzzing::toolexec_events);
}

/// The heap check every fuzz input ends with can fail: a machine that
/// reserves a buffer it does not count is caught on the input that makes
/// it.
#[test]
#[should_panic(expected = "bounded_memory")]
fn a_buffer_the_machine_does_not_count_fails_the_heap_check() {
    use airlock_core::fsproxy::{Config, Input, PlantedBug, StdioRole};
    use airlock_core::fuzzing::{test_fs, test_policy, Shell};
    use airlock_core::handles::ClientId;
    let mut config = Config::new(test_policy(), StdioRole::Reject);
    config.planted_bug = Some(PlantedBug::UncountedBuffer);
    let mut shell = Shell::new(config, test_fs());
    shell.connect(ClientId(1));
    // A partial frame: the header and one byte of its payload.
    shell.input(Input::Bytes { client: ClientId(1), data: vec![0, 0, 0, 100, b'{'] });
}

#[test]
fn vfs_url_corpus() {
    replay("vfs_url", url_oracle::check);
}

#[test]
fn vfs_scrub_corpus() {
    replay("vfs_scrub", airlock_core::vfs::fuzzing::scrubber);
}

#[test]
fn egress_parse_corpus() {
    replay("egress_parse", egress_oracle::check);
}
