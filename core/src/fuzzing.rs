//! Entry points shared by the fuzz targets in `fuzz/` and the tests that
//! replay their corpora, so both exercise exactly the same code.
//!
//! Also home of [`Shell`], a minimal in-memory shell for the FS proxy: the
//! unit tests, the corpus replay and the fuzz targets all drive the machine
//! through it, so an invariant it checks is checked everywhere.
//!
//! The functions here panic on purpose when the machine misbehaves: a panic
//! is how a fuzzer learns it found something.

use crate::broker::{CallId, ProviderRequest, ProviderResult, TelemetryRecord};
use crate::codec::frame::{self, FrameDecoder, HEADER_LEN};
use crate::fsproxy::wire::Mode;
use crate::fsproxy::{
    Config, Effect, EffectId, EffectResult, FileId, FsErrorKind, FsProxy, Input, Output, StdStream, StdioRole,
};
use crate::handles::ClientId;
use crate::heapcount::Tag;
use crate::pathops::{FileStat, Kind, Page, PathOp};
use crate::policy::{Access, Policy, Root, RootId};
use crate::scope::Scope;
use crate::time::Instant;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod nested;
pub use nested::fsproxy_nested;
mod toolexec;
pub use toolexec::toolexec_events;

/// Where a host file lives in [`MemFs`]: a root and a path beneath it.
pub type FileKey = (RootId, PathBuf);

#[derive(Debug)]
struct OpenFile {
    key: FileKey,
    pos: u64,
    mode: Mode,
}

/// The host filesystem and stdio, in memory, as the shell would see them.
#[derive(Debug, Default)]
pub struct MemFs {
    pub files: BTreeMap<FileKey, Vec<u8>>,
    /// Directories made with `mkdir` (the others are implicit: a root
    /// itself, and every directory a file is in).
    pub dirs: BTreeSet<FileKey>,
    open: BTreeMap<FileId, OpenFile>,
    pub stdin: Vec<u8>,
    stdin_pos: usize,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Secrets drawn (`Effect::DrawSecret`): each is the next number, so
    /// every one differs.
    pub secrets_drawn: u64,
}

impl MemFs {
    /// Host files currently open on the machine's behalf.
    pub fn open_files(&self) -> usize {
        self.open.len()
    }

    fn file(&self, file: FileId, what: &str) -> &OpenFile {
        match self.open.get(&file) {
            Some(f) => f,
            None => panic!("{what} on {file:?}, which is not open"),
        }
    }

    /// Carry out `effect` the way a POSIX shell would.
    ///
    /// # Panics
    /// When the machine asks for something no correct machine asks for:
    /// an operation on a file it has not opened, a write through a
    /// read-only open, an open of a path that is not confined to its root.
    pub fn perform(&mut self, effect: &Effect) -> EffectResult {
        match effect {
            Effect::DrawSecret => {
                self.secrets_drawn += 1;
                match crate::fsproxy::Secret::parse(format!("{:064x}", self.secrets_drawn).as_bytes()) {
                    Some(secret) => EffectResult::Secret { secret },
                    None => unreachable!("64 hex digits are a secret"),
                }
            }
            Effect::Backing { .. } | Effect::Unback { .. } => {
                panic!("a backing file asked for where no mount was made: {effect:?}")
            }
            Effect::Open { file, root, rel, mode, .. } => {
                assert!(!self.open.contains_key(file), "{file:?} opened twice");
                assert!(
                    rel.components().all(|c| matches!(c, Component::Normal(_))),
                    "open of an unconfined path {rel:?}"
                );
                let key = (*root, rel.clone());
                match mode {
                    Mode::Read if !self.files.contains_key(&key) => {
                        return EffectResult::Failed {
                            kind: FsErrorKind::NotFound,
                            message: format!("{} not found", rel.display()),
                        };
                    }
                    Mode::Write => {
                        self.files.insert(key.clone(), Vec::new());
                    }
                    _ => {
                        self.files.entry(key.clone()).or_default();
                    }
                }
                self.open.insert(*file, OpenFile { key, pos: 0, mode: *mode });
                EffectResult::Opened
            }
            Effect::Read { file, max } => {
                let f = self.file(*file, "read");
                assert!(f.mode.readable(), "read through a handle opened {:?}", f.mode);
                let data = self.files.get(&f.key).map(Vec::as_slice).unwrap_or_default();
                let start = usize::try_from(f.pos).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(*max as usize).min(data.len());
                let out = data[start..end].to_vec();
                if let Some(f) = self.open.get_mut(file) {
                    f.pos = end as u64;
                }
                let eof = out.is_empty();
                EffectResult::Data { data: out, eof }
            }
            Effect::Write { file, data } => {
                let f = self.file(*file, "write");
                assert!(f.mode.writable(), "write through a handle opened {:?}", f.mode);
                let (key, pos, append) = (f.key.clone(), f.pos, f.mode == Mode::Append);
                let content = self.files.entry(key).or_default();
                let start = if append { content.len() } else { usize::try_from(pos).unwrap_or(usize::MAX) };
                let end = start.saturating_add(data.len());
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[start..end].copy_from_slice(data);
                if let Some(f) = self.open.get_mut(file) {
                    f.pos = end as u64;
                }
                EffectResult::Written { written: data.len() as u64 }
            }
            Effect::Close { file } => {
                let _ = self.file(*file, "close");
                self.open.remove(file);
                EffectResult::Closed
            }
            Effect::ReadStdin { max } => {
                let start = self.stdin_pos.min(self.stdin.len());
                let end = start.saturating_add(*max as usize).min(self.stdin.len());
                self.stdin_pos = end;
                let data = self.stdin[start..end].to_vec();
                let eof = data.is_empty();
                EffectResult::Data { data, eof }
            }
            Effect::WriteStdio { stream, data } => {
                match stream {
                    StdStream::Stdout => self.stdout.extend_from_slice(data),
                    StdStream::Stderr => self.stderr.extend_from_slice(data),
                }
                EffectResult::Written { written: data.len() as u64 }
            }
            Effect::Path { .. } => panic!("a path effect is performed with its policy (perform_path)"),
            // This shell serves no mount: a machine asking for a mount's
            // effect asked for what no correct machine asks for.
            Effect::ReadAt { .. }
            | Effect::WriteAt { .. }
            | Effect::Fstat { .. }
            | Effect::Truncate { .. }
            | Effect::Readlink { .. } => panic!("a mount's effect with no mount: {effect:?}"),
        }
    }

    /// Carry out a path effect of a machine under `policy`: its paths are
    /// under the policy's roots (else the machine asked for what no
    /// correct machine asks for: a panic), and decided under `scope` (no
    /// symlinks here, so on the path itself).
    pub fn perform_path(&mut self, policy: &Policy, op: &PathOp, scope: &Scope) -> EffectResult {
        let key = |p: &std::path::Path| -> FileKey {
            let roots = policy.roots();
            let found = roots
                .iter()
                .enumerate()
                .filter(|(_, r)| p.starts_with(&r.path))
                .max_by_key(|(_, r)| r.path.components().count());
            match found {
                Some((i, r)) => (RootId(i), p.strip_prefix(&r.path).map(PathBuf::from).unwrap_or_default()),
                None => panic!("path effect on {p:?}, under no root"),
            }
        };
        for p in op.paths() {
            assert!(p.components().all(|c| !matches!(c, Component::ParentDir)), "unnormalized {p:?}");
            if let Err(r) = crate::resolve::decide(scope, crate::policy::bytes::bytes(p), op.changes(), None)
            {
                return EffectResult::Failed { kind: r.kind(), message: r.to_string() };
            }
        }
        let conflict = |m: String| EffectResult::Failed { kind: FsErrorKind::Conflict, message: m };
        let missing = || EffectResult::Failed { kind: FsErrorKind::NotFound, message: "no such file".into() };
        match op {
            PathOp::Stat { path, .. } => {
                let k = key(path);
                match self.files.get(&k) {
                    Some(c) => EffectResult::Stat { stat: FileStat::of(Kind::File, c.len() as u64) },
                    None if self.is_dir(&k) => EffectResult::Stat { stat: FileStat::of(Kind::Dir, 0) },
                    None => missing(),
                }
            }
            PathOp::List { path, after, max, .. } => {
                let k = key(path);
                if !self.is_dir(&k) {
                    return if self.files.contains_key(&k) {
                        conflict("not a directory".into())
                    } else {
                        missing()
                    };
                }
                let mut children: BTreeMap<String, (Kind, u64)> = BTreeMap::new();
                let under = |p: &PathBuf| {
                    p.strip_prefix(&k.1).ok().filter(|r| !r.as_os_str().is_empty()).map(PathBuf::from)
                };
                for ((r, p), c) in &self.files {
                    if let Some(rest) = under(p).filter(|_| *r == k.0) {
                        let mut comps = rest.components();
                        let first = comps
                            .next()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                            .unwrap_or_default();
                        let e = if comps.next().is_some() {
                            (Kind::Dir, 0)
                        } else {
                            (Kind::File, c.len() as u64)
                        };
                        children.insert(first, e);
                    }
                }
                for (r, p) in &self.dirs {
                    if let Some(rest) = under(p).filter(|_| *r == k.0) {
                        let first = rest
                            .components()
                            .next()
                            .map(|c| c.as_os_str().to_string_lossy().into_owned())
                            .unwrap_or_default();
                        children.entry(first).or_insert((Kind::Dir, 0));
                    }
                }
                let mut page = Page::default();
                for (name, (kind, size)) in children {
                    if after.as_ref().is_some_and(|a| name <= *a)
                        || !crate::resolve::name_visible(
                            scope,
                            crate::policy::bytes::bytes(&path.join(&name)),
                        )
                    {
                        continue;
                    }
                    if page.entries.len() == *max as usize {
                        page.more = true;
                        break;
                    }
                    page.entries.push(crate::pathops::DirEntry { name, kind, size });
                }
                EffectResult::Listed { page }
            }
            PathOp::Mkdir { path, parents } => {
                let k = key(path);
                if self.files.contains_key(&k) || (self.is_dir(&k) && !parents) {
                    return conflict("already exists".into());
                }
                let parent = (k.0, k.1.parent().map(PathBuf::from).unwrap_or_default());
                if !parents && !self.is_dir(&parent) {
                    return missing();
                }
                if !self.is_dir(&k) {
                    self.dirs.insert(k);
                }
                EffectResult::Done
            }
            PathOp::Remove { path } => {
                let k = key(path);
                if k.1.as_os_str().is_empty() {
                    return EffectResult::Failed { kind: FsErrorKind::Denied, message: "a root".into() };
                }
                if self.files.remove(&k).is_some() {
                    return EffectResult::Done;
                }
                if self.is_dir(&k) && !self.dirs.contains(&k) || self.has_children(&k) {
                    return conflict("not empty".into());
                }
                if self.dirs.remove(&k) {
                    EffectResult::Done
                } else {
                    missing()
                }
            }
            PathOp::Rename { from, to, noreplace } => {
                let (f, t) = (key(from), key(to));
                if f.1.as_os_str().is_empty() || t.1.as_os_str().is_empty() {
                    return EffectResult::Failed { kind: FsErrorKind::Denied, message: "a root".into() };
                }
                if *noreplace && (self.files.contains_key(&t) || self.is_dir(&t)) {
                    return conflict("already exists".into());
                }
                if let Some(c) = self.files.remove(&f) {
                    self.files.insert(t, c);
                    return EffectResult::Done;
                }
                if !self.is_dir(&f) {
                    return missing();
                }
                if t.0 == f.0 && t.1.starts_with(&f.1) {
                    return conflict("into itself".into());
                }
                let moved = |k: &FileKey| k.0 == f.0 && k.1.starts_with(&f.1);
                let re = |k: &FileKey| (t.0, t.1.join(k.1.strip_prefix(&f.1).unwrap_or(&k.1)));
                let files: Vec<FileKey> = self.files.keys().filter(|k| moved(k)).cloned().collect();
                for k in files {
                    if let Some(c) = self.files.remove(&k) {
                        self.files.insert(re(&k), c);
                    }
                }
                let dirs: Vec<FileKey> = self.dirs.iter().filter(|k| moved(k)).cloned().collect();
                for k in dirs {
                    self.dirs.remove(&k);
                    self.dirs.insert(re(&k));
                }
                EffectResult::Done
            }
            PathOp::SetAttr { path, attr } => {
                let k = key(path);
                match self.files.get_mut(&k) {
                    Some(c) => {
                        if let Some(n) = attr.size {
                            c.resize(usize::try_from(n).unwrap_or(usize::MAX).min(1 << 20), 0);
                        }
                        EffectResult::Stat { stat: FileStat::of(Kind::File, c.len() as u64) }
                    }
                    None => missing(),
                }
            }
        }
    }

    fn has_children(&self, k: &FileKey) -> bool {
        let under = |(r, p): &FileKey| *r == k.0 && p != &k.1 && p.starts_with(&k.1);
        self.files.keys().any(under) || self.dirs.iter().any(under)
    }

    /// A root itself, a directory made, or one a file or a made one is in.
    fn is_dir(&self, k: &FileKey) -> bool {
        k.1.as_os_str().is_empty() || self.dirs.contains(k) || self.has_children(k)
    }

    /// Fail `effect` as an I/O error would. A failed close still releases
    /// the file, as `close(2)` does.
    pub fn fail(&mut self, effect: &Effect) -> EffectResult {
        if let Effect::Close { file } = effect {
            let _ = self.file(*file, "close");
            self.open.remove(file);
        }
        EffectResult::Failed { kind: FsErrorKind::Other, message: "injected failure".into() }
    }
}

/// One output of the machine, as the shell recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A response frame's payload.
    Sent(ClientId, Vec<u8>),
    Closed(ClientId),
    /// `from` passed a socket, now served as the second client.
    Attached(ClientId, ClientId),
    /// A whole frame for the upstream proxy.
    Upstream(Vec<u8>),
    /// A connection of the session socket, now served as this client.
    Admitted(ClientId),
    /// A connection of the session socket refused with this payload.
    Refused(Vec<u8>),
    /// A connection of the session socket closed unanswered: its secret
    /// was no live scope's.
    Dismissed,
}

/// A shell around one [`FsProxy`]: performs its effects on a [`MemFs`],
/// and records what it sends, checking on the way that every frame to a
/// client is well formed and that nothing goes to a client that has left.
#[derive(Debug)]
pub struct Shell {
    pub proxy: FsProxy,
    pub fs: MemFs,
    /// Complete every effect as soon as it appears.
    pub auto: bool,
    /// Effects issued and not yet completed, in issue order.
    pub effects: Vec<(EffectId, Effect)>,
    pub events: Vec<Event>,
    /// Provider calls started and not yet reported done, in start order,
    /// with their deadlines.
    pub provider_calls: Vec<(CallId, ProviderRequest, Instant)>,
    /// Every call ever started, in start order.
    pub started: Vec<CallId>,
    /// Calls the machine asked to drop (`CancelProvider`), in order.
    pub cancelled: Vec<CallId>,
    pub telemetry: Vec<TelemetryRecord>,
    /// Audit records, in order.
    pub audit: Vec<crate::fsproxy::audit::AuditRecord>,
    /// The call whose `ProviderDone` the machine is being handed.
    reporting: Option<CallId>,
    departed: BTreeSet<ClientId>,
    clock: u64,
    /// The heap tag the machine's allocations are charged to, and what it
    /// held before the machine was built.
    heap: (Tag, u64),
}

/// Each shell's machine gets a heap tag of its own (nested targets stack
/// several); tag 0 is the harness's.
static NEXT_HEAP_TAG: AtomicUsize = AtomicUsize::new(0);

fn next_heap_tag() -> Tag {
    Tag::new(1 + NEXT_HEAP_TAG.fetch_add(1, Ordering::Relaxed) % (crate::heapcount::MAX_TAGS - 1))
}

impl Shell {
    pub fn new(config: Config, fs: MemFs) -> Self {
        let tag = next_heap_tag();
        let base = crate::heapcount::live(tag).unwrap_or(0);
        Shell {
            heap: (tag, base),
            proxy: tag.scope(|| FsProxy::new(config)),
            fs,
            auto: true,
            effects: Vec::new(),
            events: Vec::new(),
            provider_calls: Vec::new(),
            started: Vec::new(),
            cancelled: Vec::new(),
            telemetry: Vec::new(),
            audit: Vec::new(),
            reporting: None,
            departed: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Each input comes a microsecond after the last, so time moves.
    fn now(&mut self) -> Instant {
        self.clock += 1;
        Instant::from_micros(self.clock)
    }

    /// The time of the last input.
    pub fn clock(&self) -> Instant {
        Instant::from_micros(self.clock)
    }

    /// Let `d` pass without telling the machine (a busy shell).
    pub fn advance(&mut self, d: Duration) {
        self.clock = self.clock.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn tick(&mut self) {
        self.input(Input::Tick);
    }

    /// Move the clock to the machine's next timer and fire it, as a shell
    /// would; false when it has none.
    pub fn fire_timer(&mut self) -> bool {
        let Some(at) = self.proxy.poll_timeout() else { return false };
        // `input` adds its microsecond: the tick lands just past the
        // deadline, as a real timer would.
        self.clock = self.clock.max(at.as_micros().saturating_sub(1));
        self.tick();
        true
    }

    /// Report the provider call `call` done.
    ///
    /// The call stays in flight until the machine has taken the report:
    /// timers due at this `now` fire before the input is applied, so the
    /// machine may first give up on this very call at its deadline and ask
    /// to cancel it, as it would for any call still running. It must not,
    /// though, count the call as running when it starts the next one.
    pub fn provider_done(&mut self, call: CallId, result: ProviderResult) {
        self.reporting = Some(call);
        self.input(Input::ProviderDone { call, result });
        self.reporting = None;
        self.provider_calls.retain(|(c, _, _)| *c != call);
    }

    /// The provider call in flight, not cancelled and not being reported
    /// done, if any.
    pub fn running_call(&self) -> Option<CallId> {
        self.provider_calls
            .iter()
            .map(|(c, _, _)| *c)
            .find(|c| !self.cancelled.contains(c) && self.reporting != Some(*c))
    }

    /// Hand `input` to the machine and collect what it puts out.
    pub fn input(&mut self, input: Input) {
        match &input {
            Input::Eof { client } | Input::Died { client } => {
                self.departed.insert(*client);
            }
            Input::Connected { client } => {
                self.departed.remove(client);
            }
            _ => {}
        }
        let now = self.now();
        self.handle(now, input);
        self.drain();
        if self.auto {
            self.settle();
        }
        self.check_heap();
    }

    /// The machine's `handle`, its allocations charged to its heap tag; an
    /// effect's result is the machine's from then on.
    fn handle(&mut self, now: Instant, input: Input) {
        if let Input::EffectDone { result: EffectResult::Data { data, .. }, .. } = &input {
            crate::heapcount::retag(data, self.heap.0);
        }
        let proxy = &mut self.proxy;
        self.heap.0.scope(|| proxy.handle(now, input));
    }

    /// What the machine holds on the heap stays within what its limits
    /// allow (`FsProxy::heap_check`), when the counting allocator is the
    /// global one (the fuzz targets and the corpus replay install it).
    pub fn check_heap(&self) {
        let (tag, base) = self.heap;
        if let Some(live) = crate::heapcount::live(tag) {
            if let Err(m) = self.proxy.heap_check(live.wrapping_sub(base), u64::MAX) {
                panic!("bounded_memory: the machine {m}");
            }
        }
    }

    pub fn connect(&mut self, client: ClientId) {
        self.input(Input::Connected { client });
    }

    /// Send the JSON `request` framed, as `client`.
    pub fn send_json(&mut self, client: ClientId, request: &serde_json::Value) {
        self.send(client, request.to_string().as_bytes());
    }

    /// Send `payload` framed, as `client`.
    pub fn send(&mut self, client: ClientId, payload: &[u8]) {
        self.input(Input::Bytes { client, data: frame::encode(payload) });
    }

    fn drain(&mut self) {
        loop {
            let proxy = &mut self.proxy;
            let Some(out) = self.heap.0.scope(|| proxy.poll_output()) else { break };
            // Handed out: the shell's to keep or drop from here.
            if let Output::Send { data, .. }
            | Output::SendUpstream { data }
            | Output::Effect {
                effect: Effect::Write { data, .. } | Effect::WriteStdio { data, .. },
                ..
            } = &out
            {
                crate::heapcount::retag(data, Tag::HARNESS);
            }
            match out {
                Output::Send { client, data } => {
                    assert!(!self.departed.contains(&client), "sent to {client}, which has left: {data:?}");
                    let payload = single_frame(&data);
                    self.events.push(Event::Sent(client, payload));
                }
                Output::Close { client } => {
                    self.departed.insert(client);
                    self.events.push(Event::Closed(client));
                }
                Output::Attach { from, client } => {
                    assert!(!self.departed.contains(&from), "attach from {from}, which has left");
                    self.events.push(Event::Attached(from, client));
                }
                Output::DropDescriptor { client, .. } => {
                    assert!(!self.departed.contains(&client), "descriptor of {client} dropped after it left");
                }
                Output::Admit { client } => self.events.push(Event::Admitted(client)),
                Output::Refuse { data } => self.events.push(Event::Refused(single_frame(&data))),
                Output::Dismiss => self.events.push(Event::Dismissed),
                Output::Effect { id, effect } => self.effects.push((id, effect)),
                Output::SendUpstream { data } => self.events.push(Event::Upstream(data)),
                Output::Audit { record } => {
                    // A record comes with the answer it describes: never
                    // for a client that has left, and a refusal says why.
                    assert!(
                        !self.departed.contains(&record.client),
                        "audit of {} after it left",
                        record.client
                    );
                    assert_eq!(record.allowed, record.code.is_none(), "{record:?}");
                    assert_eq!(record.code.is_some(), record.reason.is_some(), "{record:?}");
                    // Kept only while few: a fuzz run makes millions.
                    if self.audit.len() < 1024 {
                        self.audit.push(record);
                    }
                }
                Output::StartProvider { call, request, deadline } => {
                    // Invariant 1: one call at a time; a call given up on
                    // (cancelled) may still be winding down.
                    assert!(
                        self.running_call().is_none(),
                        "{call} started while {:?} runs",
                        self.running_call()
                    );
                    assert!(!self.started.contains(&call), "{call} started twice");
                    self.started.push(call);
                    self.provider_calls.push((call, request, deadline));
                }
                Output::CancelProvider { call } => {
                    assert!(
                        self.provider_calls.iter().any(|(c, _, _)| *c == call),
                        "cancel of {call}, which is not in flight"
                    );
                    assert!(!self.cancelled.contains(&call), "{call} cancelled twice");
                    self.cancelled.push(call);
                }
                Output::Telemetry { record } => self.telemetry.push(record),
                Output::BudgetPassed { .. } => {}
                Output::FuseReply { client, .. } => panic!("a reply to mount {client}, which was never made"),
            }
        }
    }

    /// Complete the `idx`-th outstanding effect (successfully, or with an
    /// injected failure).
    pub fn complete(&mut self, idx: usize, fail: bool) {
        if idx >= self.effects.len() {
            return;
        }
        let (id, effect) = self.effects.remove(idx);
        let result = match &effect {
            // A secret comes from the OS's random number generator, not
            // the file system whose failures are injected here.
            Effect::DrawSecret => self.fs.perform(&effect),
            _ if fail => self.fs.fail(&effect),
            Effect::Path { op, scope } => self.fs.perform_path(&self.proxy.config().policy, op, scope),
            _ => self.fs.perform(&effect),
        };
        let now = self.now();
        self.handle(now, Input::EffectDone { id, result });
        self.drain();
        self.check_heap();
    }

    /// Complete every outstanding effect, and those they lead to.
    pub fn settle(&mut self) {
        // Completions issue only closes (of files whose client left), and
        // a close issues nothing, so this ends.
        while !self.effects.is_empty() {
            self.complete(0, false);
        }
    }

    /// Response payloads sent to `client`, as JSON.
    pub fn responses(&self, client: ClientId) -> Vec<Value> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Sent(c, p) if *c == client => Some(parse_response_json(p)),
                _ => None,
            })
            .collect()
    }

    /// Take the frames queued for upstream.
    pub fn take_upstream(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.events.retain(|e| match e {
            Event::Upstream(d) => {
                out.push(d.clone());
                false
            }
            _ => true,
        });
        out
    }

    /// Take every frame payload sent to `client`.
    pub fn take_sent(&mut self, client: ClientId) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.events.retain(|e| match e {
            Event::Sent(c, p) if *c == client => {
                out.push(p.clone());
                false
            }
            _ => true,
        });
        out
    }
}

/// The payload of `data`, which must be exactly one frame.
fn single_frame(data: &[u8]) -> Vec<u8> {
    let Some((header, payload)) = data.split_first_chunk::<HEADER_LEN>() else {
        panic!("output shorter than a frame header: {data:?}");
    };
    assert_eq!(u32::from_be_bytes(*header) as usize, payload.len(), "output is not exactly one frame");
    payload.to_vec()
}

/// A response payload as JSON, checked to carry the envelope every
/// response must carry.
///
/// # Panics
/// When it does not.
pub fn parse_response_json(payload: &[u8]) -> Value {
    let v: Value = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(e) => panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(payload)),
    };
    let Some(obj) = v.as_object() else { panic!("response is not an object: {v}") };
    assert!(matches!(obj.get("id"), Some(Value::String(_) | Value::Null)), "response without id: {v}");
    match obj.get("ok") {
        Some(Value::Bool(true)) => assert!(!obj.contains_key("error"), "ok response with error: {v}"),
        Some(Value::Bool(false)) => {
            let code = v.pointer("/error/code").and_then(Value::as_str);
            assert!(
                code.is_some_and(|c| crate::fsproxy::wire::ErrorCode::parse(c).is_some()),
                "failed response without a known code: {v}"
            );
        }
        _ => panic!("response without boolean ok: {v}"),
    }
    v
}

/// The policy the harnesses use: `/ro` read-only (root 0), `/rw` writable
/// (root 1), working directory `/home/agent`, whose relative paths are
/// virtual.
pub fn test_policy() -> Policy {
    Policy::new(
        PathBuf::from("/home/agent"),
        [
            Root { path: "/ro".into(), access: Access::ReadOnly },
            Root { path: "/rw".into(), access: Access::ReadWrite },
        ],
    )
}

/// A filesystem with one file under each root.
pub fn test_fs() -> MemFs {
    let mut fs = MemFs::default();
    fs.files.insert((RootId(0), "hello.txt".into()), b"hello".to_vec());
    fs.files.insert((RootId(1), "notes.txt".into()), b"old notes".to_vec());
    fs.stdin = b"typed on stdin\n".to_vec();
    fs
}

/// Fuzz the frame decoder: the first byte picks the maximum frame size,
/// then the data is fed in chunks whose sizes come from the data itself.
/// Re-encoding every decoded frame must give back exactly the bytes
/// consumed, and a refusal must be for a prefix really over the maximum.
/// One request frame's payload, as it arrives: the request fast path,
/// wherever it answers, answers as the full parse does.
pub fn fsproxy_request(data: &[u8]) {
    if let Err(e) = crate::fsproxy::wire::fast_path_agrees(data) {
        panic!("{e}, for {:?}", String::from_utf8_lossy(data));
    }
    // A frame the machine drops as a response must be one as the tree
    // reads it: any other frame is answered.
    let response = crate::fsproxy::bounds::is_response(data);
    let tree = response_by_tree(data);
    assert_eq!(response, tree, "is_response says {response} for {:?}", String::from_utf8_lossy(data));
    // The machine reads it off the request parse's tree: the same answer
    // wherever the parse refuses the frame.
    let limits = crate::fsproxy::wire::Limits::default();
    let (req, seen) = crate::fsproxy::wire::parse_request_or_response(data, limits);
    assert_eq!(req, crate::fsproxy::wire::parse_request(data, limits));
    assert!(req.is_ok() || seen == response, "the parse says {seen} for {:?}", String::from_utf8_lossy(data));
}

/// Whether a frame is a response as a `Value` tree reads it: a JSON object
/// with `ok`, `result` or `error` and no `op`.
pub fn response_by_tree(data: &[u8]) -> bool {
    serde_json::from_slice::<Value>(data).is_ok_and(|v| crate::fsproxy::wire::responds(&v))
}

pub fn frame_decoder(data: &[u8]) {
    let Some((&max_byte, rest)) = data.split_first() else { return };
    let max = usize::from(max_byte) * 4;
    let mut dec = FrameDecoder::new(max);
    // Reads the same chunks where they lie (what the proxy does): it must
    // give what `push` then `next_frame` give.
    let mut direct = FrameDecoder::new(max);
    let mut stream: Vec<u8> = Vec::new();
    let mut reencoded: Vec<u8> = Vec::new();
    let mut failed = false;
    let mut input = rest;
    while let Some((&size, tail)) = input.split_first() {
        let n = usize::from(size % 64).min(tail.len());
        let (chunk, tail) = tail.split_at(n);
        input = tail;
        stream.extend_from_slice(chunk);
        dec.push(chunk);
        let mut unread = chunk;
        loop {
            let next = dec.next_frame();
            let read = direct.next_from(&mut unread).map(|p| p.map(|p| p.to_vec()));
            assert_eq!(read, next, "reading where the bytes lie differs");
            if !matches!(next, Ok(Some(_))) {
                assert!(unread.is_empty(), "bytes left unread");
                assert_eq!(direct.buffered(), dec.buffered(), "buffered differently");
            }
            match next {
                Ok(Some(payload)) => {
                    assert!(!failed, "a frame came out after a refusal");
                    assert!(payload.len() <= max, "frame of {} bytes over max {max}", payload.len());
                    frame::encode_into(&payload, &mut reencoded);
                }
                Ok(None) => break,
                Err(e) => {
                    // The refused prefix sits right after what was consumed.
                    let at = reencoded.len();
                    let header = stream.get(at..at + HEADER_LEN).and_then(|h| <[u8; 4]>::try_from(h).ok());
                    let Some(header) = header else { panic!("refused without a full header: {e}") };
                    let len = u32::from_be_bytes(header) as usize;
                    assert!(len > max, "refused a {len}-byte frame under max {max}");
                    failed = true;
                    break;
                }
            }
        }
        if !failed {
            assert_eq!(reencoded.len() + dec.buffered(), stream.len(), "bytes lost or invented");
            assert!(dec.buffered() < HEADER_LEN + max + 64, "buffered more than one frame");
        }
        assert_eq!(&stream[..reencoded.len()], &reencoded[..], "re-encoding differs from the input");
    }
    if failed {
        assert!(dec.next_frame().is_err(), "decoder recovered after a refusal");
        assert!(!dec.has_partial());
    }
}

/// Requests the session fuzzer can name with a couple of bytes, so it
/// reaches deep states without having to spell JSON.
fn template(sel: u8, arg: u8, id: u64) -> Vec<u8> {
    const PATHS: [&str; 8] = [
        "/ro/hello.txt",
        "/rw/notes.txt",
        "/rw/new.txt",
        "scratch.txt",
        "../escape",
        "/etc/passwd",
        "/ro/missing",
        "sub/dir/v.txt",
    ];
    const MODES: [&str; 5] = ["r", "w", "a", "rw", "x"];
    let h = u64::from(arg % 12);
    let req = match sel % 8 {
        0 | 1 => serde_json::json!({"id": id.to_string(), "op": "open", "params": {
            "path": PATHS[usize::from(arg % 8)], "mode": MODES[usize::from(arg / 8 % 5)]}}),
        2 => {
            serde_json::json!({"id": id.to_string(), "op": "read", "params": {"h": h, "max": 1 + u64::from(arg) * 17}})
        }
        3 => serde_json::json!({"id": id.to_string(), "op": "write", "params": {"h": h, "data": "aGVsbG8="}}),
        4 => serde_json::json!({"id": id.to_string(), "op": "close", "params": {"h": h}}),
        5 if arg % 3 == 2 => path_template(arg / 3, id),
        5 => {
            let op = ["QUOTA", "LLMCMD"][usize::from(arg % 2)];
            serde_json::json!({"id": id.to_string(), "op": op})
        }
        6 => {
            serde_json::json!({"id": id.to_string(), "op": "read", "params": {"h": h, "max": u64::from(arg % 2) * 5000}})
        }
        _ => serde_json::json!({"op": "close", "params": {"h": h}}),
    };
    serde_json::to_vec(&req).unwrap_or_default()
}

/// A path operation (`stat`, `list`, `mkdir`, `remove`, `rename`) on the
/// templates' paths and a few directories, picked by `arg`.
fn path_template(arg: u8, id: u64) -> Value {
    const PATHS: [&str; 8] = ["/rw", "/rw/notes.txt", "/rw/d", "/rw/d/e", "/ro", "sub/dir", ".", "/etc"];
    let (p, q) = (PATHS[usize::from(arg % 8)], PATHS[usize::from(arg / 8 % 8)]);
    let id = id.to_string();
    match arg / 64 % 4 {
        0 => {
            let op = if arg & 8 == 0 { "stat" } else { "list" };
            serde_json::json!({"id": id, "op": op, "params": {"path": p, "max": 1}})
        }
        1 => serde_json::json!({"id": id, "op": "mkdir", "params": {"path": p, "parents": arg & 8 != 0}}),
        2 => serde_json::json!({"id": id, "op": "remove", "params": {"path": p}}),
        _ => serde_json::json!({"id": id, "op": "rename", "params": {"from": p, "to": q}}),
    }
}

/// Fuzz an FS proxy session. The first byte picks the configuration; the
/// rest is a script of commands, each a selector byte and its arguments:
/// raw bytes or a whole frame from one of two client slots, a templated
/// request, effect completions and failures, a passed descriptor and its
/// `attach`, EOF, death, reconnection.
/// Every response must be a well-formed frame carrying a JSON object with
/// an id and a boolean ok; once every client has gone and every effect is
/// done, no handle and no file may be left open.
///
/// Config bit 2 gives the machine a broker; a command with bits 4..6 all
/// set is then a broker command ([`broker_command`]): an `LLMCMD`,
/// `CANCEL` or `QUOTA`, a provider result, or a timer. The [`Shell`]
/// checks that one provider call runs at a time; at the end every call
/// must be over and nothing owed.
pub fn fsproxy_session(data: &[u8]) {
    let Some((&cfg, mut script)) = data.split_first() else { return };
    let stdio = if cfg & 1 == 0 { StdioRole::Local } else { StdioRole::Reject };
    let mut config = Config::new(test_policy(), stdio);
    // Records only add outputs: every input exercises their bookkeeping.
    config.audit = true;
    if cfg & 2 != 0 {
        // Small limits, so oversized frames and full tables are reachable.
        config.max_frame = 200;
        config.max_open_handles = 4;
        config.max_queued_requests = 4;
        config.max_virtual_bytes = 64;
    }
    if cfg & 4 != 0 {
        config.broker = Some(broker_setup(cfg >> 3));
    }
    let mut shell = Shell::new(config, test_fs());
    shell.auto = false;
    let mut slots = [ClientId(0), ClientId(1)];
    let mut next_client = 2;
    for c in slots {
        shell.connect(c);
    }
    let mut next_id = 0u64;
    let take = |script: &mut &[u8], n: usize| -> Vec<u8> {
        let n = n.min(script.len());
        let (head, tail) = script.split_at(n);
        *script = tail;
        head.to_vec()
    };
    while let Some((&cmd, rest)) = script.split_first() {
        script = rest;
        let client = slots[usize::from(cmd >> 7)];
        let arg = take(&mut script, 1).first().copied().unwrap_or(0);
        if cmd & 0x70 == 0x70 {
            next_id += 1;
            broker_command(&mut shell, client, arg, next_id);
            continue;
        }
        match cmd & 0x0f {
            0 | 1 => {
                let bytes = take(&mut script, usize::from(arg));
                shell.input(Input::Bytes { client, data: bytes });
            }
            2 => {
                let payload = take(&mut script, usize::from(arg));
                shell.send(client, &payload);
            }
            3..=7 => {
                let sel = take(&mut script, 1).first().copied().unwrap_or(0);
                next_id += 1;
                shell.send(client, &template(sel, arg, next_id));
            }
            8 => {
                let n = shell.effects.len().max(1);
                shell.complete(usize::from(arg) % n, false);
            }
            9 => {
                next_id += 1;
                if let Some(new) = pass_descriptor(&mut shell, client, arg, next_id) {
                    slots[usize::from(cmd >> 7)] = new;
                }
            }
            10 => {
                let n = shell.effects.len().max(1);
                shell.complete(usize::from(arg) % n, true);
            }
            11 => shell.settle(),
            12 => shell.input(Input::Eof { client }),
            13 => shell.input(Input::Died { client }),
            14 => {
                let slot = usize::from(cmd >> 7);
                slots[slot] = ClientId(next_client);
                next_client += 1;
                shell.connect(slots[slot]);
            }
            _ => shell.fs.stdin.extend_from_slice(&take(&mut script, usize::from(arg))),
        }
    }
    let attached: Vec<ClientId> = shell
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Attached(_, new) | Event::Admitted(new) => Some(*new),
            _ => None,
        })
        .collect();
    for client in (0..next_client).map(ClientId).chain(attached) {
        shell.input(Input::Eof { client });
    }
    shell.settle();
    // Calls still running end (each report may start nothing: every
    // waiter's owner has gone).
    while let Some((call, _, _)) = shell.provider_calls.first().cloned() {
        shell.provider_done(call, ProviderResult::error(None, "end"));
    }
    while shell.fire_timer() {}
    if let Some(b) = shell.proxy.broker() {
        assert!(b.is_idle(), "broker work left after every client left");
    }
    assert_eq!(shell.proxy.broker_requests_pending(), 0, "broker answers still owed");
    assert_eq!(shell.proxy.open_handles(), 0, "handles left after every client left");
    assert_eq!(shell.proxy.tracked_clients(), 0, "clients still tracked");
    assert_eq!(shell.fs.open_files(), 0, "host files left open");
    assert!(shell.proxy.quiescent());
    let stats = shell.proxy.stats();
    assert_eq!(stats.handles_opened, stats.handles_closed, "opened and closed counts differ");
}

/// `client` passes a descriptor; with `arg` bit 0 it also sends an
/// `attach` (id `id`) to claim it. With bit 1, the client attached now (if
/// the attach was served at once) is returned, for the caller to drive
/// from then on.
fn pass_descriptor(shell: &mut Shell, client: ClientId, arg: u8, id: u64) -> Option<ClientId> {
    shell.input(Input::Descriptor { client });
    if arg & 1 == 0 {
        return None;
    }
    shell.send_json(client, &serde_json::json!({"id": id.to_string(), "op": "attach"}));
    match shell.events.last() {
        Some(Event::Sent(new, _)) if arg & 2 != 0 => shell.events.iter().rev().find_map(|e| match e {
            Event::Attached(from, c) if *from == client && c == new => Some(*new),
            _ => None,
        }),
        _ => None,
    }
}

/// A broker with budget `sel % 3` of 0, 1e-6 or 1 USD, and timers short
/// enough for a few commands to reach them.
fn broker_setup(sel: u8) -> crate::broker::BrokerSetup {
    let budget = [0, 1_000_000, 1_000_000_000_000][usize::from(sel) % 3];
    let mut setup = crate::broker::BrokerSetup::new(crate::broker::Money::from_pico(budget), "fuzz");
    setup.config.queue_max_wait = Duration::from_micros(50);
    setup.config.request_timeout = Duration::from_micros(120);
    setup
}

/// One broker command of [`fsproxy_session`], picked by `arg`.
fn broker_command(shell: &mut Shell, client: ClientId, arg: u8, id: u64) {
    match broker_request(arg, id) {
        Some(req) => shell.send(client, &serde_json::to_vec(&req).unwrap_or_default()),
        None => provider_command(shell, arg),
    }
}

/// The broker request `arg % 8` in 0..=4 names: an `LLMCMD` (with cancel
/// token `t(arg >> 6)` unless 2; model `(arg >> 3) % 4`; `max_tokens`
/// when bit 5), a `CANCEL` or a `QUOTA`. `None` for 5..=7.
fn broker_request(arg: u8, id: u64) -> Option<Value> {
    const MODELS: [Option<&str>; 4] = [None, Some("gpt-4o-mini"), Some("gpt-5"), Some("nope")];
    let token = format!("t{}", arg >> 6);
    Some(match arg % 8 {
        0..=2 => {
            let mut params = serde_json::json!({"messages": [{"role": "user", "content": "q"}]});
            if let Some(m) = MODELS[usize::from(arg >> 3) % 4] {
                params["model"] = m.into();
            }
            if arg & 0x20 != 0 {
                params["max_tokens"] = (u32::from(arg) * 37 + 1).into();
            }
            if arg % 8 != 2 {
                params["cancel_token"] = token.into();
            }
            serde_json::json!({"id": id.to_string(), "op": "LLMCMD", "params": params})
        }
        3 => serde_json::json!({"id": id.to_string(), "op": "CANCEL", "params": {"cancel_token": token}}),
        4 => serde_json::json!({"id": id.to_string(), "op": "QUOTA"}),
        _ => return None,
    })
}

/// What the provider and the clock do, for `arg % 8` in 5..=7: 5/6
/// report the call `(arg >> 3) % n` in flight done (ok or error; usage
/// when bit 6), 7 fires the next timer (bit 7) or lets `arg` µs pass and
/// ticks.
fn provider_command(shell: &mut Shell, arg: u8) {
    match arg % 8 {
        5 | 6 => {
            let Some((call, _, _)) =
                shell.provider_calls.get(usize::from(arg >> 3) % shell.provider_calls.len().max(1)).cloned()
            else {
                return;
            };
            let usage = (arg & 0x40 != 0).then(|| crate::broker::Usage {
                prompt_tokens: u64::from(arg),
                cached_tokens: u64::from(arg / 3),
                completion_tokens: u64::from(arg / 2),
                total_tokens: u64::from(arg) + u64::from(arg / 2),
            });
            let result = if arg % 8 == 5 {
                ProviderResult::Ok {
                    messages: crate::broker::RawJson::from_value(&serde_json::json!([{"role": "assistant"}])),
                    usage,
                    model: "m".into(),
                }
            } else {
                ProviderResult::error(usage, "fuzz")
            };
            shell.provider_done(call, result);
        }
        7 => {
            if arg & 0x80 != 0 {
                shell.fire_timer();
            } else {
                shell.advance(Duration::from_micros(u64::from(arg)));
                shell.tick();
            }
        }
        _ => {}
    }
}

/// Fuzz the LLM broker over arbitrary event sequences: the first byte
/// picks the setup ([`crate::broker::check::Setup::from_byte`]), the rest
/// is a script of submits, cancels, owner deaths, provider results, late
/// and stray results and clock moves ([`crate::broker::check::decode_steps`]).
/// The broker's invariants are checked after every step by
/// [`crate::broker::check::Checker`].
pub fn broker_events(data: &[u8]) {
    use crate::broker::check;
    let Some((&setup, script)) = data.split_first() else { return };
    check::run(check::Setup::from_byte(setup), &check::decode_steps(script));
}
