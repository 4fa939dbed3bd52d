//! Replays the `toolexec_http` fuzz corpus (`fuzz/corpus/toolexec_http/`)
//! through the same check the fuzz target runs: raw bytes through hyper
//! into the ToolExec service with a fake runner.

// The heap is counted, so every input's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

#[path = "support/toolexec_http_check.rs"]
mod toolexec_http_check;

use std::path::Path;

/// Fewer files than this and the replay would prove little: the seed
/// corpus alone has more.
const MIN_CORPUS_FILES: usize = 8;

#[test]
fn toolexec_http_corpus_replays_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/toolexec_http");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= MIN_CORPUS_FILES,
        "{} holds {} files, expected at least {MIN_CORPUS_FILES}",
        dir.display(),
        files.len()
    );
    for file in &files {
        let input = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        eprintln!("replaying {}", file.display());
        toolexec_http_check::check(&input);
    }
}

/// The check can fail: an authorized request to an allowed tool runs it
/// and answers 200 with its exit code, and a wrong token spawns nothing.
#[test]
fn seed_requests_reach_the_fake_runner() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/toolexec_http");
    let valid = std::fs::read(dir.join("v1_valid")).expect("v1_valid seed");
    let outcome = toolexec_http_check::serve(&valid);
    assert_eq!(outcome.spawns.len(), 1, "{:?}", String::from_utf8_lossy(&outcome.wire));
    let code = toolexec_http_check::fake_exit_code(&outcome.spawns[0]);
    let text = String::from_utf8_lossy(&outcome.wire);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains(&format!("X-Exit-Code: {code}\r\n")), "{text}");
    assert!(text.ends_with("echo\nhello\nworld\n"), "{text}");

    let streamed =
        toolexec_http_check::serve(&std::fs::read(dir.join("v2_trailers")).expect("v2_trailers seed"));
    let text = String::from_utf8_lossy(&streamed.wire);
    assert!(text.contains("Transfer-Encoding: chunked\r\n"), "{text}");
    assert_eq!(streamed.spawns.len(), 1, "{text}");

    let bad = std::fs::read(dir.join("bad_token")).expect("bad_token seed");
    let outcome = toolexec_http_check::serve(&bad);
    assert!(outcome.spawns.is_empty());
    assert!(String::from_utf8_lossy(&outcome.wire).starts_with("HTTP/1.1 401"));
}

/// Only hyper's own bodiless answer to what is not HTTP may lack
/// `X-Exit-Code`: the same status with the service's one-line body, or
/// after a spawn, still fails the check.
#[test]
fn only_http_layer_answers_may_lack_the_exit_code() {
    use toolexec_http_check::{judge, Outcome};
    let input = b"POST /exec HTTP/1.1\r\nX-Junk: a\0b\r\n\r\n";
    let answer = |wire: &str| Outcome { wire: wire.as_bytes().to_vec(), spawns: Vec::new() };
    let hyper = answer("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(judge(input, &hyper), Ok(()));
    let body = "toolexec: bad form\n";
    let service =
        answer(&format!("HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{body}", body.len()));
    assert!(judge(input, &service).unwrap_err().contains("without X-Exit-Code"));
    let teapot = answer("HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n");
    assert!(judge(input, &teapot).is_err());
}
