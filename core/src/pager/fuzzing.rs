//! The pager's fuzz entry point, shared by `fuzz/fuzz_targets/pager.rs`
//! and the corpus replay in `core/tests/fuzz_corpus.rs`.
//!
//! The input is a small command language over one [`Pager`]: wraps whole
//! and streamed from three clients, reads, searches, exports to an
//! in-memory file map whose operations may fail, and departures. After
//! every command the laws hold ([`check_pager`]); every request gets
//! exactly one answer unless its client left; every rendering continued
//! by its cursors ends; no file stays open; what the pager holds on the
//! heap stays within what its limits allow (`Pager::heap_check`), when
//! the counting allocator is installed. Panics on a violation.

use super::check::check_pager;
use super::machine::{Access, FileOp, FileResult, JobId, PagerInput, PagerOutput};
use super::wire::{self, FdOp};
use super::{Pager, PagerConfig};
use crate::fsproxy::FsErrorKind;
use crate::handles::ClientId;
use crate::heapcount::{self, Tag};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

#[derive(Default)]
struct Files {
    files: BTreeMap<String, Vec<u8>>,
    open: BTreeMap<JobId, (String, usize)>,
}

const PATHS: [&str; 3] = ["/a", "/b", "/refused"];

/// The pager's heap tag (0 is the harness's).
const PAGER: Tag = Tag::new(1);

fn fd_name(b: u8) -> String {
    match b % 8 {
        7 => "fd:zz".into(),
        n => format!("fd:{n}"),
    }
}

/// Fuzz the pager machine.
pub fn pager_session(data: &[u8]) {
    let mut input = Bytes(data);
    let page = u64::from(input.byte().unwrap_or(7) % 16) + 1;
    let threshold = u64::from(input.byte().unwrap_or(9) % 40) + 1;
    let total = 256 + 64 * u64::from(input.byte().unwrap_or(64));
    let config = PagerConfig {
        max_direct_output_chars: threshold,
        default_page_size: page,
        max_input_chars: threshold / 2 + 1,
        page_user_input: true,
        max_total_bytes: total,
    };
    // A small frame: renderings come in several parts.
    let heap = heapcount::live(PAGER).unwrap_or(0);
    let mut p = PAGER.scope(|| Pager::new(config, 2048));
    let mut fs = Files::default();
    let mut gone = BTreeSet::new();
    let mut fail_next = false;
    let mut next_id = 0u64;
    while let Some(cmd) = input.byte() {
        let client = ClientId(u64::from(cmd >> 6));
        let arg = input.byte().unwrap_or(0);
        let kind = (cmd & 0x3f) % 9;
        let params = match kind {
            0 => {
                let n = usize::from(input.byte().unwrap_or(0));
                json!({"data": STANDARD.encode(input.take(n)), "source": if arg & 1 == 1 { "user_input" } else { "tool" }})
            }
            1 => {
                let n = usize::from(input.byte().unwrap_or(0));
                let more = arg & 1 == 1;
                json!({"stream": format!("s{}", (arg >> 1) % 3), "data": STANDARD.encode(input.take(n)), "more": more})
            }
            2 => json!({"fd": fd_name(arg), "page": u64::from(input.byte().unwrap_or(1) % 8)}),
            3 => {
                let a = u64::from(input.byte().unwrap_or(1) % 10);
                json!({"fd": fd_name(arg), "start_line": a, "end_line": a + u64::from(arg % 4)})
            }
            4 => json!({"fd": fd_name(arg), "all": true}),
            5 => {
                let n = usize::from(input.byte().unwrap_or(1) % 4);
                let q = String::from_utf8_lossy(input.take(n)).into_owned();
                json!({"fd": fd_name(arg), "query": q, "ignore_case": arg & 8 != 0})
            }
            6 => {
                let mode = ["write", "append", "insert"][usize::from(arg % 3)];
                let mut m =
                    json!({"fd": fd_name(arg >> 2), "path": PATHS[usize::from(arg >> 5) % 3], "mode": mode});
                if mode == "insert" {
                    m["insert_at_line"] = json!(input.byte().unwrap_or(1) % 5);
                }
                if arg & 0x80 != 0 {
                    m["page"] = json!(1);
                }
                m
            }
            7 => {
                gone.insert(client);
                PAGER.scope(|| p.handle(PagerInput::ClientGone { client }));
                drain(&mut p, &mut fs, &gone, &mut fail_next, None);
                check(&p, heap);
                continue;
            }
            _ => {
                fail_next = arg & 1 == 1;
                continue;
            }
        };
        let op = match kind {
            0 | 1 => FdOp::Wrap,
            2..=4 => FdOp::Read,
            5 => FdOp::Search,
            _ => FdOp::ToFile,
        };
        let Value::Object(params) = params else { continue };
        if gone.contains(&client) {
            continue;
        }
        let req = match wire::parse(op, &params) {
            Ok(r) => r,
            Err(e) => {
                assert!(e.to_xml().starts_with("<fd_error"), "{e:?}");
                continue;
            }
        };
        let id = next_id.to_string();
        next_id += 1;
        PAGER.scope(|| p.handle(PagerInput::Request { client, id: id.clone(), req }));
        let answer = drain(&mut p, &mut fs, &gone, &mut fail_next, Some((client, &id)));
        if let Some(Ok(m)) = answer {
            follow(&p, op, &params, m);
        }
        check(&p, heap);
    }
    // Whatever is left finishes and closes.
    for c in 0..4 {
        PAGER.scope(|| p.handle(PagerInput::ClientGone { client: ClientId(c) }));
    }
    drain(
        &mut p,
        &mut fs,
        &BTreeSet::from([ClientId(0), ClientId(1), ClientId(2), ClientId(3)]),
        &mut false,
        None,
    );
    assert_eq!(p.busy(), (0, 0), "streams or jobs left at the end");
    assert!(fs.open.is_empty(), "files left open");
}

/// `heap`: what the pager's tag held before the pager was built.
fn check(p: &Pager, heap: u64) {
    if let Err(e) = check_pager(p) {
        panic!("pager law broken: {e}");
    }
    if let Some(live) = heapcount::live(PAGER) {
        if let Err(m) = p.heap_check(live.wrapping_sub(heap)) {
            panic!("bounded_memory: the pager {m}");
        }
    }
}

/// Continue a rendering by its cursors to the end: it must end, and
/// never repeat a cursor.
fn follow(p: &Pager, op: FdOp, params: &Map<String, Value>, first: Map<String, Value>) {
    let mut m = first;
    let mut seen = BTreeSet::new();
    let (op, mut q) = match m.get("fd") {
        Some(fd) if op == FdOp::Wrap => {
            let mut q = Map::new();
            q.insert("fd".into(), fd.clone());
            q.insert("preview".into(), true.into());
            (FdOp::Read, q)
        }
        _ => (op, params.clone()),
    };
    while let Some(next) = m.get("next").and_then(Value::as_u64) {
        assert!(seen.insert(next), "cursor {next} repeats");
        q.insert("cursor".into(), next.into());
        let req = wire::parse(op, &q).unwrap_or_else(|e| panic!("continuation refused: {e:?}"));
        m = match p.render(&req) {
            Some(Ok(m)) => m,
            other => panic!("a continuation failed: {other:?}"),
        };
    }
}

/// Run the pager's file jobs until it is idle; the answer to `want`.
fn drain(
    p: &mut Pager,
    fs: &mut Files,
    gone: &BTreeSet<ClientId>,
    fail_next: &mut bool,
    want: Option<(ClientId, &str)>,
) -> Option<Result<Map<String, Value>, super::FdError>> {
    let mut answer = None;
    while let Some(out) = PAGER.scope(|| p.poll_output()) {
        match out {
            PagerOutput::Reply { client, id, outcome } => {
                assert!(!gone.contains(&client), "answered {client}, which has left");
                assert_eq!(Some((client, id.as_str())), want, "an answer nobody asked for");
                assert!(answer.is_none(), "two answers to {id}");
                if let Err(e) = &outcome {
                    assert!(e.to_xml().starts_with("<fd_error"), "{e:?}");
                }
                answer = Some(outcome);
            }
            PagerOutput::File { job, op, .. } => {
                let result = if std::mem::take(fail_next) && op != FileOp::Close {
                    FileResult::Failed { kind: FsErrorKind::Other, message: "injected".into() }
                } else {
                    perform(fs, job, op)
                };
                if matches!(result, FileResult::Closed) {
                    fs.open.remove(&job);
                }
                // A file's bytes are the pager's once handed in.
                if let FileResult::Data { data, .. } = &result {
                    heapcount::retag(data, PAGER);
                }
                PAGER.scope(|| p.handle(PagerInput::FileDone { job, result }));
            }
        }
    }
    if let Some((c, _)) = want {
        let busy = p.has_job(c);
        assert!(answer.is_some() || busy, "a request got no answer");
    }
    answer
}

fn perform(fs: &mut Files, job: JobId, op: FileOp) -> FileResult {
    match op {
        FileOp::Open { path, access } => {
            if path == "/refused" {
                return FileResult::Failed { kind: FsErrorKind::Denied, message: "refused".into() };
            }
            let exists = fs.files.contains_key(&path);
            if matches!(access, Access::Read | Access::ReadForWrite) && !exists {
                return FileResult::Failed { kind: FsErrorKind::NotFound, message: "absent".into() };
            }
            let f = fs.files.entry(path.clone()).or_default();
            if access == Access::Write {
                f.clear();
            }
            let pos = if access == Access::Append { f.len() } else { 0 };
            assert!(fs.open.insert(job, (path, pos)).is_none(), "job opened twice");
            FileResult::Opened
        }
        FileOp::Read { max } => {
            let Some((path, pos)) = fs.open.get_mut(&job) else { panic!("read of a file not open") };
            let f = &fs.files[path.as_str()];
            let end = (*pos + max as usize).min(f.len());
            let data = f[*pos..end].to_vec();
            *pos = end;
            FileResult::Data { eof: data.is_empty(), data }
        }
        FileOp::Write { data } => {
            let Some((path, pos)) = fs.open.get_mut(&job) else { panic!("write to a file not open") };
            let f = fs.files.entry(path.clone()).or_default();
            f.truncate(*pos);
            f.extend_from_slice(&data);
            *pos += data.len();
            FileResult::Written
        }
        FileOp::Close => {
            assert!(fs.open.contains_key(&job), "close of a file not open");
            FileResult::Closed
        }
    }
}
