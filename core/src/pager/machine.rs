//! The pager machine: the session's fd table, wraps streamed by clients,
//! and the file jobs (`wrap PATH`, `to-file`) it runs through the file
//! operations of whoever embeds it.

use super::error::{FdError, FdErrorKind};
use super::search::{self, Query};
use super::store::{count_lines, Builder, Document};
use super::wire::{parse_fd, FdRequest, Selection, View, WriteMode};
use super::xml::{self, attr, text, BadCursor, Part};
use super::PagerConfig;
use crate::b64;
use crate::fsproxy::bounds::{heap_verdict, HeapShare, HEAP_GROWTH};
use crate::fsproxy::FsErrorKind;
use crate::handles::ClientId;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

/// Streams one client may have open at once.
pub const MAX_STREAMS_PER_CLIENT: usize = 16;
/// Bytes asked for per file read, and given per file write.
pub const FILE_CHUNK: u32 = 64 * 1024;
/// `source` that marks user input (the seed's `max_input_chars`).
pub const USER_INPUT_SOURCE: &str = "user_input";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

/// How a job opens its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Create or truncate.
    Write,
    Append,
    /// Read a file that is about to be written: checked as a write.
    ReadForWrite,
}

/// A file operation for the embedder to carry out, then report with
/// [`PagerInput::FileDone`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileOp {
    Open { path: String, access: Access },
    Read { max: u32 },
    Write { data: Vec<u8> },
    Close,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileResult {
    Opened,
    Data { data: Vec<u8>, eof: bool },
    Written,
    Closed,
    Failed { kind: FsErrorKind, message: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PagerInput {
    Request {
        client: ClientId,
        id: String,
        req: FdRequest,
    },
    FileDone {
        job: JobId,
        result: FileResult,
    },
    /// The client is gone: its streams are dropped, its jobs end without
    /// an answer once their file is closed.
    ClientGone {
        client: ClientId,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PagerOutput {
    Reply { client: ClientId, id: String, outcome: Result<Map<String, Value>, FdError> },
    File { job: JobId, client: ClientId, op: FileOp },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    OpenRead,
    Reading,
    CloseRead,
    OpenWrite,
    Writing,
    Closing,
}

#[derive(Debug)]
enum Work {
    Wrap {
        builder: Builder,
        source: Option<String>,
    },
    ToFile {
        fd: String,
        num: u64,
        span: Range<u64>,
        mode: WriteMode,
        /// The existing file, for insert.
        existing: Vec<u8>,
        /// What is left to write: pieces of `existing` and of the fd.
        plan: VecDeque<Piece>,
    },
}

#[derive(Debug, Clone)]
enum Piece {
    Existing(Range<usize>),
    Fd(Range<usize>),
}

#[derive(Debug)]
struct Job {
    client: ClientId,
    id: String,
    path: String,
    stage: Stage,
    /// The file is open (an open succeeded and no close was asked).
    open: bool,
    abandoned: bool,
    /// The answer, once known, given after the file is closed.
    answer: Option<Result<Map<String, Value>, FdError>>,
    work: Work,
}

/// What a pager holds on the heap whatever its clients do: its tables and
/// one step's scratch. The constant a heap check adds to
/// [`Pager::heap_allowance`].
#[doc(hidden)]
pub const HEAP_SLACK: u64 = 64 << 10;
/// Held per fd, stream or file job beyond its counted bytes: its entry,
/// its name, its job's path.
#[doc(hidden)]
pub const HEAP_PER_ITEM: u64 = 1 << 10;

/// Counters for reports and checkers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PagerStats {
    pub fds: u64,
    pub direct: u64,
    pub limit_refusals: u64,
}

#[derive(Debug)]
pub struct Pager {
    config: PagerConfig,
    /// XML bytes per response part.
    budget: usize,
    docs: BTreeMap<u64, Stored>,
    next_fd: u64,
    held: u64,
    streams: BTreeMap<(ClientId, String), Builder>,
    jobs: BTreeMap<JobId, Job>,
    next_job: u64,
    outputs: VecDeque<PagerOutput>,
    stats: PagerStats,
}

/// An fd's content and what it was made from, which its preview names
/// every time it is read, not only in the wrap's answer.
#[derive(Debug)]
struct Stored {
    doc: Document,
    origin: Origin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Output,
    /// Paged under `max_input_chars` (`source = "user_input"`).
    UserInput,
}

fn ok(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn part(p: Part) -> Map<String, Value> {
    ok([("xml", p.xml.into()), ("next", p.next.map_or(Value::Null, Value::from))])
}

fn bad_cursor(fd: &str) -> impl Fn(BadCursor) -> FdError + '_ {
    move |_| FdError::arg(Some(fd), "cursor does not continue this rendering")
}

impl Pager {
    /// `max_frame`: the largest frame a response may take.
    pub fn new(config: PagerConfig, max_frame: usize) -> Self {
        Pager {
            config,
            budget: (max_frame.saturating_sub(1024) / 2).max(1024),
            docs: BTreeMap::new(),
            next_fd: 1,
            held: 0,
            streams: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job: 0,
            outputs: VecDeque::new(),
            stats: PagerStats::default(),
        }
    }

    pub fn config(&self) -> &PagerConfig {
        &self.config
    }

    pub fn stats(&self) -> &PagerStats {
        &self.stats
    }

    /// Bytes held by stored fds.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Bytes held by stored fds, streams and jobs under way.
    pub fn held_total(&self) -> u64 {
        let streams: u64 = self.streams.values().map(Builder::held).sum();
        let jobs: u64 = self
            .jobs
            .values()
            .map(|j| match &j.work {
                Work::Wrap { builder, .. } => builder.held(),
                Work::ToFile { existing, .. } => existing.len() as u64,
            })
            .sum();
        self.held + streams + jobs
    }

    /// What each limit lets the pager hold on the heap now, for the
    /// harnesses that count what it really holds (the fuzz target's
    /// `bounded_memory` check; the FS proxy's adds the same share to its
    /// own): what it counts against `max_total_bytes` (capacities, index
    /// included) at up to [`HEAP_GROWTH`] times, each fd, stream and file
    /// job at [`HEAP_PER_ITEM`], and each job's answer, held until its
    /// file is closed, at twice the part budget `max_frame` gives.
    #[doc(hidden)]
    pub fn heap_allowance(&self) -> Vec<HeapShare> {
        let items = (self.docs.len() + self.streams.len() + self.jobs.len()) as u64;
        vec![
            HeapShare {
                limit: "max_total_bytes",
                bytes: HEAP_GROWTH.saturating_mul(self.held_total().min(self.config.max_total_bytes)),
                per_byte: true,
            },
            HeapShare {
                limit: "max_frame (answers held for file jobs)",
                bytes: (self.jobs.len() as u64).saturating_mul(2 * self.budget as u64),
                per_byte: true,
            },
            HeapShare {
                limit: "fds, streams and jobs",
                bytes: items.saturating_mul(HEAP_PER_ITEM),
                per_byte: false,
            },
        ]
    }

    /// `held` bytes on the heap against [`Pager::heap_allowance`] plus
    /// [`HEAP_SLACK`]; over it, what the check reports, naming the limit
    /// broken.
    #[doc(hidden)]
    pub fn heap_check(&self, held: u64) -> Result<(), String> {
        if held <= HEAP_SLACK {
            return Ok(());
        }
        heap_verdict(held, HEAP_SLACK, &self.heap_allowance())
    }

    fn available(&self) -> u64 {
        self.config.max_total_bytes.saturating_sub(self.held_total())
    }

    pub fn document(&self, fd: u64) -> Option<&Document> {
        self.docs.get(&fd).map(|s| &s.doc)
    }

    pub fn fds(&self) -> impl Iterator<Item = (u64, &Document)> {
        self.docs.iter().map(|(k, v)| (*k, &v.doc))
    }

    /// Streams and jobs still under way.
    pub fn busy(&self) -> (usize, usize) {
        (self.streams.len(), self.jobs.len())
    }

    /// Does `client` have a job under way?
    pub fn has_job(&self, client: ClientId) -> bool {
        self.jobs.values().any(|j| j.client == client)
    }

    pub fn poll_output(&mut self) -> Option<PagerOutput> {
        self.outputs.pop_front()
    }

    pub fn handle(&mut self, input: PagerInput) {
        match input {
            PagerInput::Request { client, id, req } => self.request(client, id, req),
            PagerInput::FileDone { job, result } => self.file_done(job, result),
            PagerInput::ClientGone { client } => {
                self.streams.retain(|(c, _), _| *c != client);
                let ids: Vec<JobId> =
                    self.jobs.iter().filter(|(_, j)| j.client == client).map(|(k, _)| *k).collect();
                for id in ids {
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.abandoned = true;
                    }
                }
            }
        }
    }

    fn reply(&mut self, client: ClientId, id: String, outcome: Result<Map<String, Value>, FdError>) {
        if matches!(&outcome, Err(e) if e.kind == FdErrorKind::Limit) {
            self.stats.limit_refusals += 1;
        }
        self.outputs.push_back(PagerOutput::Reply { client, id, outcome });
    }

    fn lookup(&self, fd: &str) -> Result<(u64, &Document), FdError> {
        self.stored(fd).map(|(n, s)| (n, &s.doc))
    }

    fn stored(&self, fd: &str) -> Result<(u64, &Stored), FdError> {
        parse_fd(fd).and_then(|n| self.docs.get(&n).map(|s| (n, s))).ok_or_else(|| FdError::not_found(fd))
    }

    fn limit_error(&self) -> FdError {
        FdError::new(
            FdErrorKind::Limit,
            None,
            format!(
                "File descriptors would hold more than {} bytes (max_total_bytes); nothing was stored",
                self.config.max_total_bytes
            ),
        )
    }

    fn request(&mut self, client: ClientId, id: String, req: FdRequest) {
        let outcome = match req {
            FdRequest::Wrap { stream, data, more, offset, source } => {
                self.wrap(client, stream, &data, more, offset, source)
            }
            FdRequest::WrapAbort { stream } => {
                let gone = self.streams.remove(&(client, stream)).is_some();
                Ok(ok([("aborted", gone.into())]))
            }
            FdRequest::WrapPath { path, source } => {
                let work = Work::Wrap { builder: Builder::new(self.config.default_page_size), source };
                self.start_job(client, id, path, Stage::OpenRead, Access::Read, work);
                return;
            }
            FdRequest::Read { fd, view, cursor } => self.read(&fd, view, cursor),
            FdRequest::Search { fd, query, ignore_case, cursor } => {
                self.search(&fd, &query, ignore_case, cursor)
            }
            FdRequest::ToFile { fd, path, mode, selection } => {
                match self.to_file_plan(&fd, mode, selection) {
                    Ok(work) => {
                        let (stage, access) = match mode {
                            WriteMode::Write => (Stage::OpenWrite, Access::Write),
                            WriteMode::Append => (Stage::OpenWrite, Access::Append),
                            WriteMode::Insert { .. } => (Stage::OpenRead, Access::ReadForWrite),
                        };
                        self.start_job(client, id, path, stage, access, work);
                        return;
                    }
                    Err(e) => Err(e),
                }
            }
        };
        self.reply(client, id, outcome);
    }

    fn wrap(
        &mut self,
        client: ClientId,
        stream: Option<String>,
        data: &[u8],
        more: bool,
        offset: Option<u64>,
        source: Option<String>,
    ) -> Result<Map<String, Value>, FdError> {
        let key = stream.map(|s| (client, s));
        if let Some(off) = offset {
            let have = key.as_ref().and_then(|k| self.streams.get(k)).map_or(0, Builder::len);
            if off != have {
                if let Some(k) = &key {
                    self.streams.remove(k);
                }
                return Err(FdError::arg(
                    None,
                    format!("the stream holds {have} bytes, not {off}: it was dropped"),
                ));
            }
        }
        let mut builder = match key.as_ref().and_then(|k| self.streams.remove(k)) {
            Some(b) => b,
            None => {
                let open = self.streams.keys().filter(|(c, _)| *c == client).count();
                if key.is_some() && open >= MAX_STREAMS_PER_CLIENT {
                    return Err(FdError::new(
                        FdErrorKind::Limit,
                        None,
                        format!("more than {MAX_STREAMS_PER_CLIENT} wraps streaming at once"),
                    ));
                }
                Builder::new(self.config.default_page_size)
            }
        };
        // The builder is out of the map, so `available` leaves it out.
        let limit = self.available();
        if builder.push(data, limit).is_err() {
            return Err(self.limit_error());
        }
        if more {
            let received = builder.len();
            if let Some(k) = key {
                self.streams.insert(k, builder);
            }
            return Ok(ok([("received", received.into())]));
        }
        self.finish_wrap(builder, source.as_deref())
    }

    /// The threshold for `source`, and the origin its fd records.
    fn threshold(&self, source: Option<&str>) -> (u64, Origin) {
        if source == Some(USER_INPUT_SOURCE) && self.config.page_user_input {
            (self.config.max_input_chars, Origin::UserInput)
        } else {
            (self.config.max_direct_output_chars, Origin::Output)
        }
    }

    /// The message a preview of an fd made from `origin` carries.
    fn message(&self, origin: Origin) -> String {
        match origin {
            Origin::UserInput => "Large user input has been stored in a file descriptor.".into(),
            Origin::Output => {
                let n = self.config.max_direct_output_chars;
                format!("Output exceeds {n} characters. Use `airlock fd read` to read more pages.")
            }
        }
    }

    fn finish_wrap(&mut self, builder: Builder, source: Option<&str>) -> Result<Map<String, Value>, FdError> {
        let (threshold, origin) = self.threshold(source);
        if builder.chars() <= threshold {
            self.stats.direct += 1;
            let doc = builder.finish();
            return Ok(ok([("direct", true.into()), ("data", b64::encode(doc.raw()).into())]));
        }
        let doc = builder.finish();
        let n = self.next_fd;
        self.next_fd += 1;
        self.held += doc.held();
        self.stats.fds += 1;
        let fd = format!("fd:{n}");
        let (head, tail) = xml::result_head(&fd, &doc, &self.message(origin));
        let span = doc.page(1).map_or(0..0, |p| p.span);
        let p = xml::render_span(&doc, &head, span, &tail, None, self.budget).map_err(bad_cursor(&fd))?;
        self.docs.insert(n, Stored { doc, origin });
        let mut m = part(p);
        m.insert("fd".into(), fd.into());
        Ok(m)
    }

    /// Answer a read or a search, which change nothing and need no client
    /// (`None` for other requests).
    pub fn render(&self, req: &FdRequest) -> Option<Result<Map<String, Value>, FdError>> {
        match req {
            FdRequest::Read { fd, view, cursor } => Some(self.read(fd, *view, *cursor)),
            FdRequest::Search { fd, query, ignore_case, cursor } => {
                Some(self.search(fd, query, *ignore_case, *cursor))
            }
            _ => None,
        }
    }

    fn read(&self, fd: &str, view: View, cursor: Option<u64>) -> Result<Map<String, Value>, FdError> {
        let (_, Stored { doc, origin }) = self.stored(fd)?;
        let (head, span, tail) = match view {
            View::Preview => {
                let (head, tail) = xml::result_head(fd, doc, &self.message(*origin));
                (head, doc.page(1).map_or(0..0, |p| p.span), tail)
            }
            View::Page(n) => match xml::page_head(fd, doc, n) {
                Some((head, span)) => (head, span, xml::CONTENT_TAIL.into()),
                None => {
                    let msg = format!("Invalid page number. Valid range: 1-{}", doc.pages());
                    return Err(FdError::new(FdErrorKind::InvalidPage, Some(fd), msg));
                }
            },
            View::All => {
                let lines = if doc.total_lines() == 0 { (0, 0) } else { (1, doc.total_lines()) };
                (xml::lines_head(fd, doc, lines), doc.all(), xml::CONTENT_TAIL.into())
            }
            View::Lines(a, b) => {
                let span = doc.lines(a, b).ok_or_else(|| range_error(fd, a, b, doc.total_lines()))?;
                (xml::lines_head(fd, doc, (a, b)), span, xml::CONTENT_TAIL.into())
            }
        };
        let p = xml::render_span(doc, &head, span, &tail, cursor, self.budget).map_err(bad_cursor(fd))?;
        Ok(part(p))
    }

    fn search(
        &self,
        fd: &str,
        query: &str,
        ignore_case: bool,
        cursor: Option<u64>,
    ) -> Result<Map<String, Value>, FdError> {
        let (_, doc) = self.lookup(fd)?;
        if doc.encoding() == super::store::Encoding::Base64 {
            return Err(FdError::arg(
                Some(fd),
                format!("{fd} holds binary content (base64); search needs text"),
            ));
        }
        if !query.chars().all(xml::xml_char) {
            return Err(FdError::arg(Some(fd), "the query holds a character XML cannot carry"));
        }
        let q = Query::new(query, ignore_case);
        let p = search::render(doc, fd, query, &q, cursor, self.budget).map_err(bad_cursor(fd))?;
        Ok(part(p))
    }

    fn to_file_plan(&self, fd: &str, mode: WriteMode, selection: Selection) -> Result<Work, FdError> {
        let (num, doc) = self.lookup(fd)?;
        let span = match selection {
            Selection::Whole => doc.all(),
            Selection::Page(n) => match doc.page(n) {
                Some(p) => p.span,
                None => {
                    let msg = format!("Invalid page number. Valid range: 1-{}", doc.pages());
                    return Err(FdError::new(FdErrorKind::InvalidPage, Some(fd), msg));
                }
            },
            Selection::Lines(a, b) => {
                doc.lines(a, b).ok_or_else(|| range_error(fd, a, b, doc.total_lines()))?
            }
        };
        let bytes = doc.bytes_of(span.clone());
        let start = bytes.as_ptr() as usize - doc.raw().as_ptr() as usize;
        let plan = VecDeque::from([Piece::Fd(start..start + bytes.len())]);
        Ok(Work::ToFile { fd: fd.to_owned(), num, span, mode, existing: Vec::new(), plan })
    }

    fn start_job(
        &mut self,
        client: ClientId,
        id: String,
        path: String,
        stage: Stage,
        access: Access,
        work: Work,
    ) {
        let job = JobId(self.next_job);
        self.next_job += 1;
        let op = FileOp::Open { path: path.clone(), access };
        self.jobs
            .insert(job, Job { client, id, path, stage, open: false, abandoned: false, answer: None, work });
        self.outputs.push_back(PagerOutput::File { job, client, op });
    }

    fn op(&mut self, job: JobId, op: FileOp) {
        if let Some(j) = self.jobs.get_mut(&job) {
            if op == FileOp::Close {
                j.open = false;
            }
            let client = j.client;
            self.outputs.push_back(PagerOutput::File { job, client, op });
        }
    }

    fn set_stage(&mut self, job: JobId, stage: Stage) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.stage = stage;
        }
    }

    /// End the job with `answer`, closing its file first if it is open.
    fn end(&mut self, job: JobId, answer: Result<Map<String, Value>, FdError>) {
        let Some(j) = self.jobs.get_mut(&job) else { return };
        if j.open {
            j.answer = Some(answer);
            j.stage = Stage::Closing;
            return self.op(job, FileOp::Close);
        }
        let Some(j) = self.jobs.remove(&job) else { return };
        if !j.abandoned {
            self.reply(j.client, j.id, answer);
        }
    }

    fn file_done(&mut self, job: JobId, result: FileResult) {
        let Some(j) = self.jobs.get_mut(&job) else { return };
        // Asking for a close marks the file closed (`op`).
        if result == FileResult::Opened {
            j.open = true;
        }
        if j.abandoned {
            // Nobody to answer: only make sure the file is closed. Not
            // open, the result was to an open or a close: the job is done.
            if j.open {
                j.stage = Stage::Closing;
                return self.op(job, FileOp::Close);
            }
            self.jobs.remove(&job);
            return;
        }
        let stage = j.stage;
        let is_wrap = matches!(j.work, Work::Wrap { .. });
        let (operation, fd) = match &j.work {
            Work::Wrap { .. } => ("read", None),
            Work::ToFile { mode, fd, .. } => (mode.as_str(), Some(fd.clone())),
        };
        let path = j.path.clone();
        let fail = |why: &str, kind: FsErrorKind| {
            FdError::file(fd.as_deref(), operation, &path, why, kind == FsErrorKind::Denied)
        };
        match (stage, result) {
            (Stage::Closing, r) => {
                let Some(j) = self.jobs.remove(&job) else { return };
                let answer = match (j.answer, r) {
                    (Some(Ok(_)), FileResult::Failed { kind, message }) => Err(fail(&message, kind)),
                    (Some(a), _) => a,
                    (None, _) => Err(fail("closed unexpectedly", FsErrorKind::Other)),
                };
                self.reply(j.client, j.id, answer);
            }
            // A file that was only read: a failed close loses nothing.
            (Stage::CloseRead, _) => self.after_read(job),
            (Stage::OpenRead, FileResult::Failed { kind: FsErrorKind::NotFound, .. }) if !is_wrap => {
                // Insert into a file that does not exist: it counts as empty.
                self.after_read(job)
            }
            (_, FileResult::Failed { kind, message }) => self.end(job, Err(fail(&message, kind))),
            (Stage::OpenRead, FileResult::Opened) => {
                self.set_stage(job, Stage::Reading);
                self.op(job, FileOp::Read { max: FILE_CHUNK });
            }
            (Stage::Reading, FileResult::Data { data, eof }) => self.on_data(job, &data, eof),
            (Stage::OpenWrite, FileResult::Opened) => {
                self.set_stage(job, Stage::Writing);
                self.write_next(job);
            }
            (Stage::Writing, FileResult::Written) => self.write_next(job),
            (_, other) => {
                let why = format!("unexpected result {other:?}");
                self.end(job, Err(fail(&why, FsErrorKind::Other)));
            }
        }
    }

    fn on_data(&mut self, job: JobId, data: &[u8], eof: bool) {
        let limit = self.available();
        let Some(j) = self.jobs.get_mut(&job) else { return };
        let over = match &mut j.work {
            Work::Wrap { builder, .. } => {
                let held = builder.held();
                let over = builder.push(data, limit + held).is_err();
                if over {
                    *builder = Builder::new(1);
                }
                over
            }
            Work::ToFile { existing, .. } => {
                let over = data.len() as u64 > limit;
                if over {
                    *existing = Vec::new();
                } else {
                    existing.extend_from_slice(data);
                }
                over
            }
        };
        if over {
            let e = self.limit_error();
            return self.end(job, Err(e));
        }
        if eof || data.is_empty() {
            self.set_stage(job, Stage::CloseRead);
            self.op(job, FileOp::Close);
        } else {
            self.op(job, FileOp::Read { max: FILE_CHUNK });
        }
    }

    /// The file (or the existing file, for insert) has been read and closed.
    fn after_read(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else { return };
        j.open = false;
        match &mut j.work {
            Work::Wrap { builder, source } => {
                let builder = std::mem::replace(builder, Builder::new(1));
                let source = source.take();
                let answer = self.finish_wrap(builder, source.as_deref());
                self.end(job, answer);
            }
            Work::ToFile { fd, mode, existing, plan, .. } => {
                let WriteMode::Insert { at } = *mode else { return };
                let lines = count_lines(existing);
                if at == 0 || at > lines + 1 {
                    let msg = format!("Invalid insert line {at}. Valid range: 1-{}", lines + 1);
                    let e = FdError::new(FdErrorKind::InvalidRange, Some(fd), msg);
                    return self.end(job, Err(e));
                }
                let offset = if at == 1 {
                    0
                } else {
                    existing
                        .iter()
                        .enumerate()
                        .filter(|(_, &b)| b == b'\n')
                        .nth((at - 2) as usize)
                        .map_or(existing.len(), |(i, _)| i + 1)
                };
                let n = existing.len();
                plan.push_front(Piece::Existing(0..offset));
                plan.push_back(Piece::Existing(offset..n));
                j.stage = Stage::OpenWrite;
                let op = FileOp::Open { path: j.path.clone(), access: Access::Write };
                self.op(job, op);
            }
        }
    }

    fn write_next(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else { return };
        let Work::ToFile { num, span, mode, existing, plan, fd } = &mut j.work else { return };
        let Some(Stored { doc, .. }) = self.docs.get(num) else { return };
        while let Some(piece) = plan.pop_front() {
            let (range, src): (Range<usize>, &[u8]) = match &piece {
                Piece::Existing(r) => (r.clone(), existing),
                Piece::Fd(r) => (r.clone(), doc.raw()),
            };
            if range.is_empty() {
                continue;
            }
            let end = range.end.min(range.start + FILE_CHUNK as usize);
            let data = src[range.start..end].to_vec();
            let rest = end..range.end;
            match piece {
                Piece::Existing(_) => plan.push_front(Piece::Existing(rest)),
                Piece::Fd(_) => plan.push_front(Piece::Fd(rest)),
            }
            return self.op(job, FileOp::Write { data });
        }
        // All written: answer once the file is closed.
        let bytes = doc.bytes_of(span.clone());
        let (written, lines) = (bytes.len(), count_lines(bytes));
        let path = j.path.clone();
        let message = match mode {
            WriteMode::Write => format!("Content from {fd} successfully written to {path}"),
            WriteMode::Append => format!("Content from {fd} successfully appended to {path}"),
            WriteMode::Insert { at } => {
                format!("Content from {fd} successfully inserted into {path} at line {at}")
            }
        };
        let xml = format!(
            "<fd_write fd=\"{}\" file_path=\"{}\" success=\"true\" mode=\"{}\">\n  <message>{}</message>\n  <stats>\n    <bytes>{written}</bytes>\n    <lines>{lines}</lines>\n  </stats>\n</fd_write>",
            attr(fd),
            attr(&path),
            mode.as_str(),
            text(&message),
        );
        j.answer = Some(Ok(ok([("xml", xml.into())])));
        j.stage = Stage::Closing;
        self.op(job, FileOp::Close);
    }
}

/// An fd holds more characters than a threshold, so at least one line.
fn range_error(fd: &str, a: u64, b: u64, total: u64) -> FdError {
    let msg = format!("Invalid line range {a}-{b}. Valid range: 1-{total}");
    FdError::new(FdErrorKind::InvalidRange, Some(fd), msg)
}
