//! The pager machine driven step by step: each file operation it asks for
//! and each answer, exactly, through streams, aborts, file jobs that fail
//! or run out of room, departures, and the heap each limit allows.

use super::error::{FdError, FdErrorKind};
use super::machine::{
    Access, FileOp, FileResult, JobId, Pager, PagerInput, PagerOutput, PagerStats, MAX_STREAMS_PER_CLIENT,
};
use super::store::{Builder, Encoding};
use super::wire::{FdRequest, Selection, View, WriteMode};
use super::PagerConfig;
use crate::fsproxy::bounds::HeapShare;
use crate::fsproxy::wire::ErrorCode;
use crate::fsproxy::FsErrorKind;
use crate::handles::ClientId;
use serde_json::{json, Map, Value};

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);
const FRAME: usize = 1 << 20;
/// The part budget `FRAME` gives: half of what a frame leaves past 1 KiB.
const BUDGET: u64 = 523_776;
/// `FILE_CHUNK`, as the embedder sees it.
const CHUNK: usize = 65_536;

fn config(max_total_bytes: u64) -> PagerConfig {
    PagerConfig {
        max_direct_output_chars: 8,
        default_page_size: 4000,
        max_input_chars: 6,
        page_user_input: true,
        max_total_bytes,
    }
}

fn pager(max_total_bytes: u64) -> Pager {
    Pager::new(config(max_total_bytes), FRAME)
}

fn send(p: &mut Pager, client: ClientId, req: FdRequest) -> Vec<PagerOutput> {
    p.handle(PagerInput::Request { client, id: "r".into(), req });
    drain(p)
}

fn feed(p: &mut Pager, job: JobId, result: FileResult) -> Vec<PagerOutput> {
    p.handle(PagerInput::FileDone { job, result });
    drain(p)
}

fn drain(p: &mut Pager) -> Vec<PagerOutput> {
    std::iter::from_fn(|| p.poll_output()).collect()
}

/// The one answer a request gets at once.
fn ask(p: &mut Pager, client: ClientId, req: FdRequest) -> Result<Map<String, Value>, FdError> {
    match send(p, client, req).as_slice() {
        [PagerOutput::Reply { client: c, id, outcome }] if *c == client && id == "r" => outcome.clone(),
        other => panic!("expected one reply to {client}, got {other:?}"),
    }
}

/// The outcome of the one reply in `out`.
fn answer(out: Vec<PagerOutput>) -> Result<Map<String, Value>, FdError> {
    match <[PagerOutput; 1]>::try_from(out) {
        Ok([PagerOutput::Reply { outcome, .. }]) => outcome,
        other => panic!("expected one reply, got {other:?}"),
    }
}

fn reply(client: ClientId, outcome: Result<Map<String, Value>, FdError>) -> PagerOutput {
    PagerOutput::Reply { client, id: "r".into(), outcome }
}

fn file(job: u64, client: ClientId, op: FileOp) -> PagerOutput {
    PagerOutput::File { job: JobId(job), client, op }
}

fn map(v: Value) -> Map<String, Value> {
    let Value::Object(m) = v else { panic!("an object") };
    m
}

fn wrap(bytes: &[u8]) -> FdRequest {
    FdRequest::Wrap { stream: None, data: bytes.to_vec(), more: false, offset: None, source: None }
}

fn chunk(stream: &str, bytes: &[u8], more: bool, offset: Option<u64>) -> FdRequest {
    FdRequest::Wrap { stream: Some(stream.into()), data: bytes.to_vec(), more, offset, source: None }
}

fn wrap_path(path: &str) -> FdRequest {
    FdRequest::WrapPath { path: path.into(), source: None }
}

fn to_file(path: &str, mode: WriteMode) -> FdRequest {
    FdRequest::ToFile { fd: "fd:1".into(), path: path.into(), mode, selection: Selection::Whole }
}

fn read(fd: &str, view: View) -> FdRequest {
    FdRequest::Read { fd: fd.into(), view, cursor: None }
}

fn data(bytes: &[u8], eof: bool) -> FileResult {
    FileResult::Data { data: bytes.to_vec(), eof }
}

fn failed(kind: FsErrorKind, message: &str) -> FileResult {
    FileResult::Failed { kind, message: message.into() }
}

fn error(kind: FdErrorKind, fd: Option<&str>, message: &str, code: ErrorCode) -> FdError {
    FdError { kind, fd: fd.map(str::to_owned), message: message.into(), details: None, code }
}

fn limit(max_total_bytes: u64) -> FdError {
    let message = format!(
        "File descriptors would hold more than {max_total_bytes} bytes (max_total_bytes); nothing was stored"
    );
    error(FdErrorKind::Limit, None, &message, ErrorCode::Range)
}

fn file_error(fd: Option<&str>, message: &str, details: &str, code: ErrorCode) -> FdError {
    FdError { details: Some(details.into()), ..error(FdErrorKind::FileOperation, fd, message, code) }
}

/// What a fresh builder holds after taking `bytes` with room to spare.
fn builder_held(bytes: &[u8]) -> u64 {
    let mut b = Builder::new(4000);
    b.push(bytes, u64::MAX).unwrap();
    b.held()
}

const READ: FileOp = FileOp::Read { max: CHUNK as u32 };

#[test]
fn stats_count_fds_direct_answers_and_limit_refusals() {
    let mut p = pager(100);
    assert_eq!(p.config(), &config(100));
    assert_eq!(ask(&mut p, A, wrap(b"short")), Ok(map(json!({"direct": true, "data": "c2hvcnQ="}))));
    assert_eq!(ask(&mut p, A, wrap(b"123456789")).unwrap()["fd"], "fd:1");
    assert_eq!(ask(&mut p, A, wrap(&[b'x'; 200])), Err(limit(100)));
    // Other errors are not limit refusals.
    assert_eq!(ask(&mut p, A, read("fd:9", View::All)).unwrap_err().kind, FdErrorKind::NotFound);
    assert_eq!(p.stats(), &PagerStats { fds: 1, direct: 1, limit_refusals: 1 });
}

#[test]
fn held_is_what_the_stored_fds_hold() {
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    ask(&mut p, A, wrap(b"abcdefghij\nkl")).unwrap();
    let fds: Vec<(u64, &[u8])> = p.fds().map(|(n, d)| (n, d.raw())).collect();
    assert_eq!(fds, [(1, b"0123456789".as_slice()), (2, b"abcdefghij\nkl".as_slice())]);
    let held: u64 = p.fds().map(|(_, d)| d.held()).sum();
    assert!(held > 23, "content and indexes: {held}");
    assert_eq!((p.held(), p.held_total()), (held, held));
}

#[test]
fn an_abort_drops_only_the_client_s_own_stream() {
    let mut p = pager(1 << 20);
    assert_eq!(ask(&mut p, A, chunk("s", b"abc", true, None)), Ok(map(json!({"received": 3}))));
    let abort = || FdRequest::WrapAbort { stream: "s".into() };
    assert_eq!(ask(&mut p, B, abort()), Ok(map(json!({"aborted": false}))));
    assert_eq!(p.busy(), (1, 0));
    assert_eq!(ask(&mut p, A, abort()), Ok(map(json!({"aborted": true}))));
    assert_eq!(p.busy(), (0, 0));
    assert_eq!(ask(&mut p, A, abort()), Ok(map(json!({"aborted": false}))));
}

#[test]
fn a_chunk_whose_offset_is_not_the_stream_s_length_drops_the_stream() {
    let mut p = pager(1 << 20);
    let dropped = |have, off| {
        let m = format!("the stream holds {have} bytes, not {off}: it was dropped");
        error(FdErrorKind::InvalidArgument, None, &m, ErrorCode::Arg)
    };
    assert_eq!(ask(&mut p, A, chunk("s", b"abc", true, Some(0))), Ok(map(json!({"received": 3}))));
    assert_eq!(ask(&mut p, A, chunk("s", b"de", true, Some(2))), Err(dropped(3, 2)));
    assert_eq!(p.busy(), (0, 0));
    assert_eq!(ask(&mut p, A, chunk("s", b"de", true, Some(3))), Err(dropped(0, 3)));
    // Offsets that match carry the stream on to its fd.
    assert_eq!(ask(&mut p, A, chunk("s", b"ab", true, Some(0))), Ok(map(json!({"received": 2}))));
    assert_eq!(ask(&mut p, A, chunk("s", b"cd", true, Some(2))), Ok(map(json!({"received": 4}))));
    assert_eq!(ask(&mut p, A, chunk("s", b"efghi", false, Some(4))).unwrap()["fd"], "fd:1");
    assert_eq!(p.document(1).unwrap().raw(), b"abcdefghi");
    // Without a stream, the offset is checked against nothing held.
    let plain =
        |offset| FdRequest::Wrap { stream: None, data: b"x".to_vec(), more: false, offset, source: None };
    assert_eq!(ask(&mut p, A, plain(Some(0))).unwrap()["direct"], true);
    assert_eq!(ask(&mut p, A, plain(Some(1))), Err(dropped(0, 1)));
}

#[test]
fn a_client_streams_at_most_max_streams_per_client_at_once() {
    assert_eq!(MAX_STREAMS_PER_CLIENT, 16);
    let mut p = pager(1 << 20);
    for i in 0..16 {
        assert!(ask(&mut p, A, chunk(&format!("s{i}"), b"a", true, None)).is_ok(), "stream {i}");
    }
    let too_many = error(FdErrorKind::Limit, None, "more than 16 wraps streaming at once", ErrorCode::Range);
    assert_eq!(ask(&mut p, A, chunk("s16", b"a", true, None)), Err(too_many));
    assert_eq!(p.stats().limit_refusals, 1);
    // Its open streams go on, a wrap without a stream is no stream, and
    // another client has streams of its own.
    assert_eq!(ask(&mut p, A, chunk("s0", b"b", true, None)), Ok(map(json!({"received": 2}))));
    assert_eq!(ask(&mut p, A, wrap(b"x")).unwrap()["direct"], true);
    assert!(ask(&mut p, B, chunk("t", b"a", true, None)).is_ok());
    assert_eq!(p.busy(), (17, 0));
    // A departure drops that client's streams only.
    p.handle(PagerInput::ClientGone { client: A });
    assert_eq!(p.busy(), (1, 0));
    assert_eq!(
        ask(&mut p, B, FdRequest::WrapAbort { stream: "t".into() }),
        Ok(map(json!({"aborted": true})))
    );
}

#[test]
fn render_answers_reads_and_searches_and_nothing_else() {
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(b"one\ntwo\nthree\n")).unwrap();
    let search = FdRequest::Search { fd: "fd:1".into(), query: "t".into(), ignore_case: false, cursor: None };
    for req in [read("fd:1", View::Lines(2, 3)), read("fd:7", View::All), search] {
        let rendered = p.render(&req);
        assert_eq!(drain(&mut p), [], "a rendering queues nothing");
        assert_eq!(rendered, Some(ask(&mut p, A, req)));
    }
    for req in [
        wrap(b"x"),
        wrap_path("/p"),
        to_file("/o", WriteMode::Write),
        FdRequest::WrapAbort { stream: "s".into() },
    ] {
        assert_eq!(p.render(&req), None, "{req:?}");
    }
    assert_eq!(p.busy(), (0, 0));
}

#[test]
fn a_preview_read_is_the_wrap_s_answer_again() {
    let mut p = pager(1 << 20);
    let text = "line\n".repeat(1000);
    let wrapped = ask(&mut p, A, wrap(text.as_bytes())).unwrap();
    let preview = ask(&mut p, A, read("fd:1", View::Preview)).unwrap();
    assert_eq!(preview, map(json!({"xml": wrapped["xml"], "next": null})));
    assert!(preview["xml"].as_str().unwrap().starts_with("<fd_result fd=\"fd:1\""), "{preview:?}");
}

#[test]
fn the_heap_allowance_counts_fds_streams_and_jobs() {
    let mut p = pager(1 << 20);
    let empty = |limit| HeapShare { limit, bytes: 0, per_byte: limit != "fds, streams and jobs" };
    let shares = ["max_total_bytes", "max_frame (answers held for file jobs)", "fds, streams and jobs"];
    assert_eq!(p.heap_allowance(), shares.map(empty));
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    ask(&mut p, A, wrap(b"abcdefghij")).unwrap();
    ask(&mut p, A, chunk("s", b"abc", true, None)).unwrap();
    // A wrap of a path, and an insert, each part read.
    assert_eq!(
        send(&mut p, A, wrap_path("/w")),
        [file(0, A, FileOp::Open { path: "/w".into(), access: Access::Read })]
    );
    feed(&mut p, JobId(0), FileResult::Opened);
    assert_eq!(feed(&mut p, JobId(0), data(b"hello", false)), [file(0, A, READ)]);
    let insert = to_file("/f", WriteMode::Insert { at: 1 });
    assert_eq!(
        send(&mut p, B, insert),
        [file(1, B, FileOp::Open { path: "/f".into(), access: Access::ReadForWrite })]
    );
    feed(&mut p, JobId(1), FileResult::Opened);
    assert_eq!(feed(&mut p, JobId(1), data(b"xyz\n", false)), [file(1, B, READ)]);
    assert_eq!(p.busy(), (1, 2));
    let total = p.held() + builder_held(b"abc") + builder_held(b"hello") + 4;
    assert_eq!(p.held_total(), total);
    let allowance = [2 * total, 2 * 2 * BUDGET, 5 * 1024];
    let want: Vec<HeapShare> =
        shares.iter().zip(allowance).map(|(&limit, bytes)| HeapShare { bytes, ..empty(limit) }).collect();
    assert_eq!(p.heap_allowance(), want);
    let allowed = 65_536 + allowance.iter().sum::<u64>();
    assert_eq!(p.heap_check(allowed), Ok(()));
    let over = format!(
        "holds {} bytes on the heap, 1 over the {allowed} its limits allow (breaks max_frame (answers held for file jobs); \
         shares: max_total_bytes {}, max_frame (answers held for file jobs) {}, fds, streams and jobs 5120; slack 65536)",
        allowed + 1,
        allowance[0],
        allowance[1],
    );
    assert_eq!(p.heap_check(allowed + 1), Err(over));
}

#[test]
fn an_idle_pager_may_hold_its_slack_and_no_more() {
    let p = pager(1 << 20);
    assert_eq!(p.heap_check(0), Ok(()));
    assert_eq!(p.heap_check(65_536), Ok(()));
    let over =
        "holds 65537 bytes on the heap, 1 over the 65536 its limits allow (breaks fds, streams and jobs; \
                shares: ; slack 65536)";
    assert_eq!(p.heap_check(65_537), Err(over.into()));
}

/// A wrap of `/p` read as far as "abc", then a failed read.
fn fail_mid_read(p: &mut Pager) {
    assert_eq!(
        send(p, A, wrap_path("/p")),
        [file(0, A, FileOp::Open { path: "/p".into(), access: Access::Read })]
    );
    assert_eq!(feed(p, JobId(0), FileResult::Opened), [file(0, A, READ)]);
    assert_eq!(feed(p, JobId(0), data(b"abc", false)), [file(0, A, READ)]);
    assert_eq!(feed(p, JobId(0), failed(FsErrorKind::Other, "disk gone")), [file(0, A, FileOp::Close)]);
    assert!(p.has_job(A));
}

fn disk_gone() -> FdError {
    file_error(None, "Cannot read from file: disk gone", "Operation: read, Path: /p", ErrorCode::Io)
}

#[test]
fn a_read_that_fails_mid_file_closes_it_then_answers_the_failure() {
    let mut p = pager(1 << 20);
    fail_mid_read(&mut p);
    assert_eq!(feed(&mut p, JobId(0), FileResult::Closed), [reply(A, Err(disk_gone()))]);
    assert_eq!((p.busy(), p.has_job(A), p.held_total()), ((0, 0), false, 0));
}

#[test]
fn a_wrap_whose_client_departs_mid_read_closes_its_file_and_stores_nothing() {
    let mut p = pager(1 << 20);
    send(&mut p, A, wrap_path("/p"));
    assert_eq!(feed(&mut p, JobId(0), FileResult::Opened), [file(0, A, READ)]);
    p.handle(PagerInput::ClientGone { client: A });
    // The read under way comes back; the job reads no further.
    assert_eq!(feed(&mut p, JobId(0), data(b"abc", false)), [file(0, A, FileOp::Close)]);
    assert_eq!(feed(&mut p, JobId(0), FileResult::Closed), []);
    assert_eq!((p.busy(), p.fds().count(), p.held_total()), ((0, 0), 0, 0));
    // The next wrap is fd:1: the abandoned one took no number.
    assert_eq!(ask(&mut p, B, wrap(&[b'x'; 40])).unwrap()["fd"], "fd:1");
}

#[test]
fn a_failed_close_after_a_failure_keeps_the_first_failure() {
    let mut p = pager(1 << 20);
    fail_mid_read(&mut p);
    let close = failed(FsErrorKind::Other, "close failed");
    assert_eq!(feed(&mut p, JobId(0), close), [reply(A, Err(disk_gone()))]);
    assert_eq!(p.busy(), (0, 0));
}

#[test]
fn a_failed_close_after_writing_turns_success_into_the_failure() {
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    let open = FileOp::Open { path: "/o".into(), access: Access::Append };
    assert_eq!(send(&mut p, A, to_file("/o", WriteMode::Append)), [file(0, A, open)]);
    let write = FileOp::Write { data: b"0123456789".to_vec() };
    assert_eq!(feed(&mut p, JobId(0), FileResult::Opened), [file(0, A, write)]);
    assert_eq!(feed(&mut p, JobId(0), FileResult::Written), [file(0, A, FileOp::Close)]);
    let e = file_error(
        Some("fd:1"),
        "Cannot write to file: quota",
        "Operation: append, Path: /o",
        ErrorCode::Perm,
    );
    assert_eq!(feed(&mut p, JobId(0), failed(FsErrorKind::Denied, "quota")), [reply(A, Err(e))]);
}

#[test]
fn an_unexpected_result_ends_the_job_naming_it() {
    let mut p = pager(1 << 20);
    send(&mut p, A, wrap_path("/p"));
    assert_eq!(feed(&mut p, JobId(0), FileResult::Opened), [file(0, A, READ)]);
    // The file is open: closed before the answer.
    assert_eq!(feed(&mut p, JobId(0), FileResult::Written), [file(0, A, FileOp::Close)]);
    let e = file_error(
        None,
        "Cannot read from file: unexpected result Written",
        "Operation: read, Path: /p",
        ErrorCode::Io,
    );
    assert_eq!(feed(&mut p, JobId(0), FileResult::Closed), [reply(A, Err(e))]);
    // Not open: answered at once.
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    send(&mut p, A, to_file("/o", WriteMode::Write));
    let e = file_error(
        Some("fd:1"),
        "Cannot write to file: unexpected result Data { data: [], eof: true }",
        "Operation: write, Path: /o",
        ErrorCode::Io,
    );
    assert_eq!(feed(&mut p, JobId(1), data(b"", true)), [reply(A, Err(e))]);
    assert_eq!(p.busy(), (0, 0));
}

#[test]
fn a_wrap_of_a_missing_file_is_a_file_operation_error() {
    let mut p = pager(1 << 20);
    send(&mut p, A, wrap_path("/none"));
    let e = file_error(
        None,
        "Cannot read from file: No such file",
        "Operation: read, Path: /none",
        ErrorCode::Io,
    );
    assert_eq!(feed(&mut p, JobId(0), failed(FsErrorKind::NotFound, "No such file")), [reply(A, Err(e))]);
}

#[test]
fn a_file_read_ends_at_eof_or_at_an_empty_chunk() {
    for (last, eof) in [(b"ab".as_slice(), true), (b"".as_slice(), false)] {
        let mut p = pager(1 << 20);
        send(&mut p, A, wrap_path("/p"));
        feed(&mut p, JobId(0), FileResult::Opened);
        assert_eq!(feed(&mut p, JobId(0), data(b"0123456789", false)), [file(0, A, READ)]);
        assert_eq!(feed(&mut p, JobId(0), data(last, eof)), [file(0, A, FileOp::Close)], "eof {eof}");
        assert_eq!(answer(feed(&mut p, JobId(0), FileResult::Closed)).unwrap()["fd"], "fd:1");
        assert_eq!(p.document(1).unwrap().raw(), [b"0123456789".as_slice(), last].concat());
    }
}

#[test]
fn a_wrapped_file_is_counted_against_the_limit_chunk_by_chunk() {
    // Two chunks that fit only if the first is counted once.
    let mut p = pager(1000);
    send(&mut p, A, wrap_path("/p"));
    feed(&mut p, JobId(0), FileResult::Opened);
    assert_eq!(feed(&mut p, JobId(0), data(&[b'x'; 300], false)), [file(0, A, READ)]);
    assert_eq!(feed(&mut p, JobId(0), data(&[b'x'; 300], false)), [file(0, A, READ)]);
    assert_eq!(feed(&mut p, JobId(0), data(b"", true)), [file(0, A, FileOp::Close)]);
    assert_eq!(answer(feed(&mut p, JobId(0), FileResult::Closed)).unwrap()["fd"], "fd:1");
    assert_eq!(p.document(1).unwrap().raw(), [b'x'; 600]);
}

#[test]
fn a_wrapped_file_over_the_limit_is_refused_and_its_bytes_let_go() {
    let mut p = pager(100);
    send(&mut p, A, wrap_path("/p"));
    feed(&mut p, JobId(0), FileResult::Opened);
    assert_eq!(feed(&mut p, JobId(0), data(&[b'x'; 50], false)), [file(0, A, READ)]);
    assert!(p.held_total() >= 50);
    assert_eq!(feed(&mut p, JobId(0), data(&[b'x'; 60], false)), [file(0, A, FileOp::Close)]);
    assert_eq!(p.held_total(), 0, "nothing held while the file closes");
    assert_eq!(feed(&mut p, JobId(0), FileResult::Closed), [reply(A, Err(limit(100)))]);
    assert_eq!((p.stats().limit_refusals, p.busy()), (1, (0, 0)));
}

/// An insert of fd:1 (`0123456789`) at line 1 of `/f`, through reading
/// `/f`'s first chunk: the job's id.
fn insert_reading(p: &mut Pager, job: u64, first: &[u8]) -> JobId {
    let open = FileOp::Open { path: "/f".into(), access: Access::ReadForWrite };
    assert_eq!(send(p, A, to_file("/f", WriteMode::Insert { at: 1 })), [file(job, A, open)]);
    assert_eq!(feed(p, JobId(job), FileResult::Opened), [file(job, A, READ)]);
    assert_eq!(feed(p, JobId(job), data(first, false)), [file(job, A, READ)]);
    JobId(job)
}

#[test]
fn an_insert_reads_the_existing_file_up_to_exactly_the_room_left() {
    let mut p = pager(200);
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    let room = (200 - p.held_total()) as usize;
    let existing = vec![b'e'; room];
    let job = insert_reading(&mut p, 0, &existing);
    assert_eq!(p.held_total(), 200);
    assert_eq!(feed(&mut p, job, data(b"", true)), [file(0, A, FileOp::Close)]);
    let open = FileOp::Open { path: "/f".into(), access: Access::Write };
    assert_eq!(feed(&mut p, job, FileResult::Closed), [file(0, A, open)]);
    let write = |d: &[u8]| file(0, A, FileOp::Write { data: d.to_vec() });
    assert_eq!(feed(&mut p, job, FileResult::Opened), [write(b"0123456789")]);
    assert_eq!(feed(&mut p, job, FileResult::Written), [write(&existing)]);
    assert_eq!(feed(&mut p, job, FileResult::Written), [file(0, A, FileOp::Close)]);
    let xml = "<fd_write fd=\"fd:1\" file_path=\"/f\" success=\"true\" mode=\"insert\">\n  \
               <message>Content from fd:1 successfully inserted into /f at line 1</message>\n  \
               <stats>\n    <bytes>10</bytes>\n    <lines>1</lines>\n  </stats>\n</fd_write>";
    assert_eq!(feed(&mut p, job, FileResult::Closed), [reply(A, Ok(map(json!({"xml": xml}))))]);
}

#[test]
fn an_insert_whose_existing_file_passes_the_room_left_is_refused_and_let_go() {
    let mut p = pager(200);
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    let held = p.held();
    let room = (200 - held) as usize;
    let job = insert_reading(&mut p, 0, &[b'e'; 10]);
    assert_eq!(p.held_total(), held + 10);
    assert_eq!(feed(&mut p, job, data(&vec![b'e'; room - 10 + 1], false)), [file(0, A, FileOp::Close)]);
    assert_eq!(p.held_total(), held, "the existing file's bytes are let go");
    assert_eq!(feed(&mut p, job, FileResult::Closed), [reply(A, Err(limit(200)))]);
}

#[test]
fn writes_go_in_file_chunks() {
    let mut p = pager(1 << 20);
    let content: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    ask(&mut p, A, wrap(&content)).unwrap();
    send(&mut p, A, to_file("/big", WriteMode::Write));
    let write = |d: &[u8]| file(0, A, FileOp::Write { data: d.to_vec() });
    assert_eq!(feed(&mut p, JobId(0), FileResult::Opened), [write(&content[..CHUNK])]);
    assert_eq!(feed(&mut p, JobId(0), FileResult::Written), [write(&content[CHUNK..])]);
    assert_eq!(feed(&mut p, JobId(0), FileResult::Written), [file(0, A, FileOp::Close)]);
    let m = answer(feed(&mut p, JobId(0), FileResult::Closed)).unwrap();
    assert!(m["xml"].as_str().unwrap().contains("<bytes>100000</bytes>"), "{m:?}");
}

#[test]
fn jobs_run_side_by_side_and_a_departure_abandons_only_its_own() {
    let mut p = pager(1 << 20);
    let open = |path: &str| FileOp::Open { path: path.into(), access: Access::Read };
    assert_eq!(send(&mut p, A, wrap_path("/a")), [file(0, A, open("/a"))]);
    assert_eq!(send(&mut p, B, wrap_path("/b")), [file(1, B, open("/b"))]);
    assert_eq!((p.has_job(A), p.has_job(B), p.has_job(ClientId(3))), (true, true, false));
    p.handle(PagerInput::ClientGone { client: B });
    assert_eq!(p.busy(), (0, 2));
    // B's job ends unanswered when its open fails; A's is answered.
    assert_eq!(feed(&mut p, JobId(1), failed(FsErrorKind::Denied, "no")), []);
    assert_eq!((p.busy(), p.has_job(B)), ((0, 1), false));
    let e = file_error(None, "Cannot read from file: gone", "Operation: read, Path: /a", ErrorCode::Io);
    assert_eq!(feed(&mut p, JobId(0), failed(FsErrorKind::NotFound, "gone")), [reply(A, Err(e))]);
    assert_eq!((p.busy(), p.has_job(A)), ((0, 0), false));
}

// ---- what the answers are made of: escaping, encodings, cursors, folding ----

fn bad_cursor() -> FdError {
    error(
        FdErrorKind::InvalidArgument,
        Some("fd:1"),
        "cursor does not continue this rendering",
        ErrorCode::Arg,
    )
}

fn part(xml: &str, next: Option<u64>) -> Result<Map<String, Value>, FdError> {
    Ok(map(json!({"xml": xml, "next": next})))
}

#[test]
fn a_path_is_escaped_as_an_attribute_and_as_text() {
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(b"0123456789")).unwrap();
    send(&mut p, A, to_file("/a\tb\nc\"<\u{1}", WriteMode::Write));
    feed(&mut p, JobId(0), FileResult::Opened);
    feed(&mut p, JobId(0), FileResult::Written);
    let xml = "<fd_write fd=\"fd:1\" file_path=\"/a&#9;b&#10;c&quot;&lt;\u{FFFD}\" success=\"true\" mode=\"write\">\n  \
               <message>Content from fd:1 successfully written to /a\tb\nc&quot;&lt;\u{FFFD}</message>\n  \
               <stats>\n    <bytes>10</bytes>\n    <lines>1</lines>\n  </stats>\n</fd_write>";
    assert_eq!(feed(&mut p, JobId(0), FileResult::Closed), [reply(A, Ok(map(json!({"xml": xml}))))]);
}

#[test]
fn a_part_never_ends_inside_a_character() {
    // A 3 KiB frame: parts of 1 KiB.
    let mut p = Pager::new(config(1 << 20), 3072);
    let head = "<fd_content fd=\"fd:1\" lines=\"1-1\" total_lines=\"1\">";
    let room = 1024 - head.len();
    // `é` starts on the part's last byte.
    let text = format!("{}é{}", "x".repeat(room - 1), "y".repeat(10));
    ask(&mut p, A, wrap(text.as_bytes())).unwrap();
    let first = format!("{head}{}", "x".repeat(room - 1));
    assert_eq!(ask(&mut p, A, read("fd:1", View::All)), part(&first, Some(room as u64 - 1)));
    let rest = FdRequest::Read { fd: "fd:1".into(), view: View::All, cursor: Some(room as u64 - 1) };
    assert_eq!(ask(&mut p, A, rest), part("éyyyyyyyyyy</fd_content>", None));
}

#[test]
fn a_cursor_at_the_end_of_the_content_gives_just_the_tail() {
    for content in [b"0123456789".as_slice(), &[0xff; 12]] {
        let mut p = pager(1 << 20);
        ask(&mut p, A, wrap(content)).unwrap();
        let end = p.document(1).unwrap().text_len();
        let at = |cursor| FdRequest::Read { fd: "fd:1".into(), view: View::All, cursor: Some(cursor) };
        assert_eq!(ask(&mut p, A, at(end)), part("</fd_content>", None), "{content:?}");
        assert_eq!(ask(&mut p, A, at(end + 1)), Err(bad_cursor()), "{content:?}");
    }
}

#[test]
fn a_search_continues_from_any_place_in_a_matching_line() {
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(b"ab\ncab\nx\n")).unwrap();
    let search =
        |cursor| FdRequest::Search { fd: "fd:1".into(), query: "ab".into(), ignore_case: false, cursor };
    let cases = [
        // The newline of line 1: its match closes.
        (2, "</match>\n  <match line=\"2\">cab</match>\n</fd_search>"),
        (3, "  <match line=\"2\">cab</match>\n</fd_search>"),
        (4, "ab</match>\n</fd_search>"),
        (9, "</fd_search>"),
    ];
    for (cursor, xml) in cases {
        assert_eq!(ask(&mut p, A, search(Some(cursor))), part(xml, None), "cursor {cursor}");
    }
    assert_eq!(ask(&mut p, A, search(Some(10))), Err(bad_cursor()));
}

#[test]
fn a_long_matching_line_takes_as_many_parts_as_it_needs() {
    let text = format!("ab{}\nab\n", "x<".repeat(1500));
    let search =
        |cursor| FdRequest::Search { fd: "fd:1".into(), query: "ab".into(), ignore_case: false, cursor };
    let mut whole = pager(1 << 20);
    ask(&mut whole, A, wrap(text.as_bytes())).unwrap();
    let want = ask(&mut whole, A, search(None)).unwrap();
    // 1 KiB parts.
    let mut p = Pager::new(config(1 << 20), 3072);
    ask(&mut p, A, wrap(text.as_bytes())).unwrap();
    let (mut xml, mut cursor, mut parts) = (String::new(), None, 0);
    loop {
        let m = ask(&mut p, A, search(cursor)).unwrap();
        let x = m["xml"].as_str().unwrap();
        assert!(x.len() <= 1024, "part {parts}: {} bytes", x.len());
        xml.push_str(x);
        parts += 1;
        match m["next"].as_u64() {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert!(xml == want["xml"].as_str().unwrap(), "the parts join to the whole answer");
    assert_eq!(parts, 8);
}

#[test]
fn an_ignore_case_search_folds_one_character_to_one() {
    let lines = ["ı", "i", "I", "İ", "ß", "ss", "Σ", "ς", "σ", "\u{212A}", "k", "é", "É"];
    let mut p = pager(1 << 20);
    ask(&mut p, A, wrap(lines.join("\n").as_bytes())).unwrap();
    let cases: [(&str, &[usize]); 8] = [
        ("ı", &[1]),
        ("I", &[2, 3]),
        ("İ", &[4]),
        ("ß", &[5]),
        ("SS", &[6]),
        ("σ", &[7, 8, 9]),
        ("K", &[10, 11]),
        ("é", &[12, 13]),
    ];
    for (query, want) in cases {
        let req =
            FdRequest::Search { fd: "fd:1".into(), query: query.into(), ignore_case: true, cursor: None };
        let m = ask(&mut p, A, req).unwrap();
        let doc = roxmltree::Document::parse(m["xml"].as_str().unwrap()).unwrap();
        let got: Vec<usize> =
            doc.descendants().filter_map(|n| n.attribute("line")).map(|l| l.parse().unwrap()).collect();
        assert_eq!(got, want, "{query}");
    }
}

#[test]
fn text_with_a_character_xml_cannot_carry_is_stored_as_its_base64() {
    // U+FFFE and U+FFFF (EF BF BE, EF BF BF) against their neighbours.
    let cases = [
        ('\u{FFFE}', true),
        ('\u{FFFF}', true),
        ('\u{FFFD}', false),
        ('\u{FFBE}', false),
        ('\u{CFFE}', false),
    ];
    let mut p = pager(1 << 20);
    for (n, (c, base64)) in (1..).zip(cases) {
        let text = format!("abcdefgh{c}");
        ask(&mut p, A, wrap(text.as_bytes())).unwrap();
        let doc = p.document(n).unwrap();
        let want = if base64 { (Encoding::Base64, 16) } else { (Encoding::Utf8, 9) };
        assert_eq!((doc.encoding(), doc.chars()), want, "{c:?}");
    }
}

#[test]
fn a_wrap_is_refused_once_its_indexes_would_pass_the_limit() {
    // 10 bytes, then one 4-byte entry each for the line and the page index.
    assert!(ask(&mut pager(18), A, wrap(b"0123456789")).is_ok());
    for max in [17, 13, 10] {
        assert_eq!(ask(&mut pager(max), A, wrap(b"0123456789")), Err(limit(max)), "{max}");
    }
}

#[test]
fn a_builder_is_empty_until_it_takes_a_byte() {
    let mut b = Builder::new(4);
    assert!(b.is_empty());
    b.push(b"", 100).unwrap();
    assert!(b.is_empty());
    b.push(b"a", 100).unwrap();
    assert!(!b.is_empty());
}
