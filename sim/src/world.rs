//! One simulated world: FS proxy machines, the client processes that talk to
//! them, the pipes between them, the host filesystem, and the checkers.
//!
//! Everything here is driven by seeded RNGs and iterates ordered maps only,
//! so a (seed, swarm) pair always yields the same run, step for step.

mod adversary;
mod bounds;
mod broker;
mod draw;
mod files;
mod floods;
mod frames;
mod held;
mod log;
mod order;
mod pager;
mod request;
mod response;
mod tool;
pub(crate) mod toolexec;
mod upstream;

use crate::fs::HostFs;
use crate::swarm::{FaultKind, Rates, Swarm, PPM};
use crate::{Failure, Scenario};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{
    Config, Effect, EffectId, EffectResult, FileId, FsErrorKind, FsProxy, Input, Output, PlantedBug,
    StdioRole, ATTACHED_CLIENT_BASE,
};
use airlock_core::handles::ClientId;
use airlock_core::policy::{Access, Policy, Root};
use airlock_core::time::Instant;
use airlock_core::trace::{Header, TraceWriter};
use broker::{BOp, BrokerSim};
use files::Files;
use frames::{frame, payloads, Frames};
use held::{HModel, Held};
use order::Order;
use pager::{POp, PagerSim};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use request::req;
use response::{Id, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Component, PathBuf};

/// The intermediate's connection at the top level.
const MIDDLE_CONN: ClientId = ClientId(1000);
const CWD: &str = "/work/proj";
/// Steps allowed after `max_steps` for the world to drain and shut down.
const WIND_DOWN_STEPS: u64 = 100_000;
/// Attaches with a descriptor a world's clients may ask for, in all: each
/// one that is served adds a client.
const ATTACH_BUDGET: usize = 6;

/// What broke, before the step number is attached.
#[derive(Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub message: String,
    pub level: Option<usize>,
    pub client: Option<ClientId>,
}

fn violation(invariant: &'static str, message: String) -> Violation {
    Violation { invariant, message, level: None, client: None }
}

fn at(mut v: Violation, level: usize, client: ClientId) -> Violation {
    v.level = Some(level);
    v.client = Some(client);
    v
}

type Check = Result<(), Violation>;

pub fn policy() -> Policy {
    Policy::new(
        CWD.into(),
        [
            Root { path: "/data/ro".into(), access: Access::ReadOnly },
            Root { path: "/data/rw".into(), access: Access::ReadWrite },
            Root { path: "/data/rw/sub".into(), access: Access::ReadOnly },
            Root { path: "scratch".into(), access: Access::ReadWrite },
        ],
    )
}

/// Bytes on their way through a pipe, kept as the frames they were written
/// as so that an undisturbed delivery hands over exactly one frame.
#[derive(Debug, Default)]
struct Pipe {
    frames: VecDeque<Vec<u8>>,
    /// Bytes of the front frame already delivered.
    off: usize,
    len: usize,
    /// Bytes ever pushed and taken: where in the stream each frame ends.
    pushed: u64,
    taken: u64,
    /// Where the last piece wholly taken ends in the stream.
    whole: u64,
}

impl Pipe {
    fn push(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.pushed += bytes.len() as u64;
            self.len += bytes.len();
            self.frames.push_back(bytes);
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn front_rest(&self) -> usize {
        self.frames.front().map_or(0, |f| f.len() - self.off)
    }

    fn take(&mut self, mut n: usize) -> Vec<u8> {
        // Exactly the next piece, whole: handed over, not copied.
        if self.off == 0 && n > 0 && self.frames.front().is_some_and(|f| f.len() == n) {
            if let Some(front) = self.frames.pop_front() {
                self.len -= n;
                self.taken += n as u64;
                self.whole = self.taken;
                return front;
            }
        }
        let mut out = Vec::with_capacity(n);
        while n > 0 {
            let Some(front) = self.frames.front() else { break };
            let k = n.min(front.len() - self.off);
            out.extend_from_slice(&front[self.off..self.off + k]);
            self.off += k;
            n -= k;
            self.len -= k;
            self.taken += k as u64;
            if self.off == front.len() {
                self.frames.pop_front();
                self.off = 0;
                self.whole = self.taken;
            }
        }
        out
    }

    /// Bytes taken past the end of the last piece wholly taken: what a
    /// reader holds of a frame not yet complete.
    fn partial(&self) -> u64 {
        self.taken - self.whole
    }

    fn clear(&mut self) {
        let pushed = self.pushed;
        *self = Pipe { pushed, taken: pushed, whole: pushed, ..Pipe::default() };
    }
}

/// The id a conforming server must answer `payload` under: the `id` string
/// of a JSON object, else none.
fn oracle_id(payload: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Value>(payload) {
        Ok(Value::Object(mut o)) => match o.remove("id") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// One client's own file: content is modelled exactly.
    Private,
    /// Opened by everyone in `a` (or `r`) mode: every acknowledged chunk
    /// must be in it, whole, and nothing else.
    Log,
    /// Anyone, any mode: only the other invariants apply.
    Chaos,
    /// Read-only content fixed at creation.
    Fixture,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Loc {
    Host(PathBuf),
    /// A virtual file of the level named.
    Virtual(String, usize),
}

#[derive(Debug)]
struct FileModel {
    class: Class,
    loc: Loc,
    exists: bool,
    content: Vec<u8>,
    /// Too uncertain to model (an effectful request failed in a way that
    /// leaves open whether it took effect).
    unknown: bool,
    /// Another acceptable state: the owner left with one request possibly
    /// applied, and this is the state it would leave.
    alt: Option<(bool, Vec<u8>)>,
    /// A log's chunks, and what its check keeps.
    log: log::Log,
    dirty: bool,
}

impl FileModel {
    fn new(class: Class, loc: Loc) -> Self {
        FileModel {
            class,
            loc,
            exists: false,
            content: Vec::new(),
            unknown: false,
            alt: None,
            log: log::Log::default(),
            dirty: true,
        }
    }
}

fn apply_write(content: &mut Vec<u8>, pos: &mut u64, append: bool, data: &[u8]) {
    let start = if append { content.len() } else { *pos as usize };
    let end = start + data.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[start..end].copy_from_slice(data);
    *pos = end as u64;
}

#[derive(Clone, Debug)]
enum Kind {
    Open {
        key: Option<String>,
        mode: Mode,
        host: bool,
    },
    Read {
        h: u64,
        max: u32,
    },
    Write {
        h: u64,
        data: Vec<u8>,
    },
    Close {
        h: u64,
    },
    Stdio {
        write_len: Option<usize>,
    },
    Invalid,
    /// LLMCMD, CANCEL or QUOTA (broker worlds).
    Broker(BOp),
    /// An `FD_*` op (pager worlds).
    Pager(POp),
    /// `attach`, sent with a descriptor (`fd`) or without one.
    Attach {
        fd: bool,
    },
    /// The `attach` that created this client, answered on it.
    Attached,
}

#[derive(Debug)]
struct Sent {
    kind: Kind,
    /// The invariant a success would break (a request that must fail).
    must_fail: Option<&'static str>,
}

#[derive(Debug)]
struct Client {
    id: ClientId,
    idx: usize,
    level: usize,
    rng: ChaCha8Rng,
    gone: bool,
    ops_left: usize,
    /// Closes what it holds before exiting.
    tidy: bool,
    /// Sent a frame that ends its session (oversized).
    stream_ended: bool,
    next_req: u64,
    out: Pipe,
    frames: Frames,
    /// The unanswered requests, in the order they were sent, each with
    /// what its answer is checked against.
    order: Order<Sent>,
    null_expected: usize,
    handles: Held,
    closed: Vec<u64>,
    pending_opens: usize,
    /// Broker ops not yet wholly delivered: (end offset in `out`, id).
    bpending: VecDeque<(u64, String)>,
    /// Broker ops sent and not yet registered with the checkers.
    bnew: Vec<(String, BOp)>,
    next_token: u64,
    tokens_used: Vec<String>,
    /// Unanswered LLMCMDs and their cancel tokens.
    llm_tokens: BTreeMap<String, Option<String>>,
    /// Where in `out` each frame carrying a descriptor starts: the
    /// descriptor reaches the machine with the frame's first byte.
    dpending: VecDeque<u64>,
    /// Descriptors the machine has been handed and no attach has claimed.
    fds_unclaimed: u64,
    /// An attach with a descriptor was refused unserved, so its descriptor
    /// lingers and could be claimed by a later attach without one.
    stray_fd: bool,
    /// An attached client's first frame must answer this attach.
    attach_wait: Option<String>,
    floods: floods::ClientFloods,
}

impl Client {
    fn new(seed: u64, idx: usize, level: usize, id: ClientId, ops: usize) -> Self {
        let mut crng = ChaCha8Rng::seed_from_u64(seed);
        crng.set_stream(idx as u64);
        Client {
            id,
            idx,
            level,
            tidy: crng.gen_bool(0.5),
            rng: crng,
            gone: false,
            ops_left: ops,
            stream_ended: false,
            next_req: 0,
            out: Pipe::default(),
            frames: Frames::default(),
            order: Order::default(),
            null_expected: 0,
            handles: Held::default(),
            closed: Vec::new(),
            pending_opens: 0,
            bpending: VecDeque::new(),
            bnew: Vec::new(),
            next_token: 0,
            tokens_used: Vec::new(),
            llm_tokens: BTreeMap::new(),
            dpending: VecDeque::new(),
            fds_unclaimed: 0,
            stray_fd: false,
            attach_wait: None,
            floods: floods::ClientFloods::default(),
        }
    }

    /// Request `id` is answered: it leaves `order`, which holds only
    /// unanswered requests, so the checkers that walk it every step cost
    /// what is outstanding, not what was ever sent.
    fn answer(&mut self, id: &str) -> Option<Sent> {
        self.order.remove(id)
    }
}

/// A request in a client's `order`. What the bounds checker needs of it is
/// kept here, fixed when it is sent, so the walk it makes every step looks
/// nothing up.
#[derive(Debug)]
struct Queued {
    id: String,
    /// Where its frame ends in the client's stream, and its payload's
    /// length (the bytes a machine holds while it waits); none for the
    /// attach an attached client's first frame answers.
    frame: Option<(u64, u64)>,
    /// Holds the client's other requests while it is served (broker ops
    /// and attaches answer elsewhere and do not).
    in_line: bool,
    /// A close: admitted past the bounds, as it only releases.
    close: bool,
}

/// Client `idx`'s own files, whose content is modelled exactly.
fn add_private_files(files: &mut Files, idx: usize, level: usize) {
    for (key, loc) in [
        (format!("/data/rw/c{idx}.dat"), None),
        (format!("/work/proj/scratch/c{idx}.log"), None),
        (format!("v/c{idx}.txt"), Some(format!("v/c{idx}.txt"))),
    ] {
        let loc = match loc {
            Some(name) => Loc::Virtual(name, level),
            None => Loc::Host(key.clone().into()),
        };
        files.insert(key, FileModel::new(Class::Private, loc));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Queue {
    File(FileId),
    Stdio,
}

/// An effect awaiting completion: its arrival number, id and request.
type PendingEffect = (u64, EffectId, Effect);

#[derive(Debug)]
struct Level {
    m: FsProxy,
    alive: bool,
    upstream_frames: Frames,
    /// Handles ever handed to a simulated client, to catch reuse.
    issued: BTreeSet<u64>,
    stdin: VecDeque<u8>,
}

#[derive(Debug, Default)]
struct Link {
    up: Pipe,
    down: Pipe,
    /// The top closed the connection: the middle sees EOF once `down` drains.
    down_eof: bool,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Issue(usize),
    Deliver(usize),
    Exit(usize),
    Effect,
    Up,
    Down,
}

/// Run one world of `scenario`; the tool and toolexec scenarios have worlds
/// of their own.
pub(crate) fn run(
    seed: u64,
    scenario: Scenario,
    swarm: Swarm,
    bug: Option<PlantedBug>,
    record: Option<Option<Value>>,
) -> Outcome {
    if scenario == Scenario::Toolexec {
        let o = toolexec::run(seed, None, record.is_some());
        return Outcome { steps: o.steps, now: o.now, faults: o.faults, failure: o.failure, trace: o.trace };
    }
    if scenario == Scenario::Tool {
        return tool::run(seed, swarm, bug, record);
    }
    World::new(seed, scenario, swarm, bug, record).run()
}

pub struct Outcome {
    pub steps: u64,
    pub now: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub failure: Option<Failure>,
    pub trace: Option<Vec<u8>>,
}

pub struct World {
    seed: u64,
    /// Attaches with a descriptor clients may still ask for.
    attach_budget: usize,
    swarm: Swarm,
    nested: bool,
    rng: ChaCha8Rng,
    now: u64,
    step: u64,
    levels: Vec<Level>,
    /// The level holding host files and the virtual namespace.
    store: usize,
    clients: Vec<Client>,
    link: Option<Link>,
    fs: HostFs,
    files: Files,
    effects: BTreeMap<(usize, Queue), VecDeque<PendingEffect>>,
    effect_seq: u64,
    /// (level, client) pairs the machine may no longer talk to.
    gone: BTreeSet<(usize, ClientId)>,
    closed_by_machine: BTreeSet<(usize, ClientId)>,
    departed_check: Vec<(usize, ClientId)>,
    faults: BTreeMap<FaultKind, u64>,
    /// The swarm's fault rates, fixed for the run.
    rates: Rates,
    trace: Option<TraceWriter<Vec<u8>>>,
    first_violation: Option<Violation>,
    actions: Vec<Action>,
    fixture: Vec<u8>,
    finished: bool,
    /// The broker scenario's provider and checkers.
    broker: Option<BrokerSim>,
    floods: floods::WorldFloods,
    /// Each level's policy, as the checkers know it.
    policies: Vec<Policy>,
    /// The directories the store level's shell holds open.
    anchors: Vec<PathBuf>,
    /// The adversary scenario's setup.
    adversary: Option<adversary::Adversary>,
    /// The pager scenario's model and checkers.
    pager: Option<PagerSim>,
}

impl World {
    /// `record`: keep a trace, whose header notes `failure` when given.
    pub fn new(
        seed: u64,
        scenario: Scenario,
        swarm: Swarm,
        bug: Option<PlantedBug>,
        record: Option<Option<Value>>,
    ) -> Self {
        let nested = matches!(scenario, Scenario::Nested | Scenario::Adversary | Scenario::Pager);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Drawn first in broker worlds only, so other worlds draw as before.
        let broker_setup = (scenario == Scenario::Broker).then(|| broker::setup(&mut rng, seed));
        let pager_setup = (scenario == Scenario::Pager).then(|| pager::setup(&mut rng));
        let adversary = (scenario == Scenario::Adversary).then(|| adversary::setup(&mut rng));
        let policies = match &adversary {
            Some(a) => vec![adversary::top_policy(), adversary::middle_policy(a.middle)],
            None => vec![policy(), policy()],
        };
        let config = |level: usize, stdio: StdioRole, upstream: bool| {
            let mut c = Config::new(policies[level].clone(), stdio);
            c.upstream = upstream;
            c.max_frame = swarm.max_frame;
            c.max_queued_requests = swarm.max_queued_requests;
            c.max_open_handles = swarm.max_open_handles;
            c.max_queued_bytes = swarm.bounds.max_queued_bytes;
            c.max_session_queued_bytes = swarm.bounds.max_session_queued_bytes;
            c.max_clients = swarm.bounds.max_clients;
            c.max_buffered_bytes = swarm.bounds.max_buffered_bytes;
            c.max_virtual_bytes = swarm.bounds.max_virtual_bytes;
            c.max_virtual_files = swarm.bounds.max_virtual_files;
            c.max_upstream_frame = swarm.bounds.max_upstream_frame;
            c.max_descriptors = swarm.bounds.max_descriptors;
            c.planted_bug = bug;
            c.broker = broker_setup.clone();
            c.pager = pager_setup.clone();
            c
        };
        let configs = if nested {
            vec![config(0, StdioRole::Reject, false), config(1, StdioRole::Local, true)]
        } else {
            vec![config(0, StdioRole::Reject, false)]
        };
        let trace = if let Some(failure) = record {
            let mut header = Header::fsproxy(configs[0].clone());
            header.levels = configs[1..].to_vec();
            header.seed = Some(seed);
            header.meta =
                Some(json!({ "scenario": scenario.to_string(), "swarm": &swarm, "failure": failure }));
            TraceWriter::new(Vec::new(), &header).ok()
        } else {
            None
        };
        let levels = configs
            .into_iter()
            .map(|c| Level {
                m: FsProxy::new(c),
                alive: true,
                upstream_frames: Frames::default(),
                issued: BTreeSet::new(),
                stdin: { draw::bytes(&mut rng, 0..3000).into() },
            })
            .collect();
        let mut fs = HostFs::default();
        for r in policy().roots() {
            fs.add_dir(r.path.clone());
        }
        let fixture = draw::bytes(&mut rng, 0..6000);
        fs.add_file("/data/ro/a.txt".into(), fixture.clone());
        fs.add_file("/data/ro/empty".into(), Vec::new());
        if adversary.is_some() {
            adversary::populate(&mut fs, &mut rng);
        }
        let anchors = crate::fs::anchors(&fs, policies[0].roots());
        let mut files = Files::default();
        for (key, content) in [("/data/ro/a.txt", fixture.clone()), ("/data/ro/empty", Vec::new())] {
            let mut m = FileModel::new(Class::Fixture, Loc::Host(key.into()));
            m.exists = true;
            m.content = content;
            files.insert(key.to_owned(), m);
        }
        files.insert(
            "/data/rw/shared.log".into(),
            FileModel::new(Class::Log, Loc::Host("/data/rw/shared.log".into())),
        );
        let chaos = "/work/proj/scratch/chaos.bin";
        files.insert(chaos.into(), FileModel::new(Class::Chaos, Loc::Host(chaos.into())));
        let mut clients = Vec::new();
        let client_level = usize::from(nested);
        let total = swarm.clients + if nested { swarm.top_clients } else { 0 };
        for idx in 1..=total {
            let level = if idx <= swarm.clients { client_level } else { 0 };
            add_private_files(&mut files, idx, level);
            clients.push(Client::new(seed, idx, level, ClientId(idx as u64), swarm.ops_per_client));
        }
        let floods = floods::WorldFloods::new(&swarm);
        let mut w = World {
            seed,
            attach_budget: ATTACH_BUDGET,
            rates: swarm.rates(),
            swarm,
            nested,
            rng,
            now: 0,
            step: 0,
            levels,
            store: 0,
            clients,
            link: if nested { Some(Link::default()) } else { None },
            fs,
            files,
            effects: BTreeMap::new(),
            effect_seq: 0,
            gone: BTreeSet::new(),
            closed_by_machine: BTreeSet::new(),
            departed_check: Vec::new(),
            faults: BTreeMap::new(),
            trace,
            first_violation: None,
            actions: Vec::new(),
            fixture,
            finished: false,
            broker: broker_setup.as_ref().map(|s| BrokerSim::new(s, bug)),
            floods,
            policies,
            anchors,
            adversary,
            pager: pager_setup.as_ref().map(PagerSim::new),
        };
        if w.broker.is_some() {
            w.levels[0].m.set_redactor(broker::world_redactor(bug));
        }
        if nested {
            w.feed(0, Input::Connected { client: MIDDLE_CONN });
        }
        for i in 0..w.clients.len() {
            let (level, client) = (w.clients[i].level, w.clients[i].id);
            w.feed(level, Input::Connected { client });
        }
        w
    }

    fn count(&mut self, kind: FaultKind) {
        *self.faults.entry(kind).or_default() += 1;
    }

    fn fires(&mut self, kind: FaultKind) -> bool {
        let rate = self.rates.get(kind);
        rate > 0 && self.rng.gen_range(0..PPM) < rate
    }

    pub fn run(mut self) -> Outcome {
        while !self.finished && self.first_violation.is_none() {
            self.step += 1;
            if let Err(v) = self.step_once() {
                self.first_violation.get_or_insert(v);
            }
            if self.first_violation.is_none() {
                if let Err(v) = self.check() {
                    self.first_violation = Some(v);
                }
            }
            if cfg!(debug_assertions) && self.first_violation.is_none() {
                self.first_violation = self.check_kept_counts().err();
            }
        }
        if self.first_violation.is_none() {
            self.first_violation = self.check_kept_counts().and_then(|()| self.check_logs_agree()).err();
        }
        let failure = self.first_violation.take().map(|v| Failure {
            invariant: v.invariant.to_owned(),
            step: self.step,
            message: v.message,
            level: v.level,
            client: v.client.map(|c| c.0),
        });
        let trace = self.trace.take().and_then(|t| t.into_inner().ok());
        Outcome { steps: self.step, now: self.now, faults: self.faults, failure, trace }
    }

    fn winding_down(&self) -> bool {
        self.step > self.swarm.max_steps as u64
    }

    fn step_once(&mut self) -> Check {
        if self.step > self.swarm.max_steps as u64 + WIND_DOWN_STEPS {
            return Err(violation(
                "liveness",
                format!("the world did not drain within {WIND_DOWN_STEPS} steps"),
            ));
        }
        let max_step = if self.broker.is_some() { broker::MAX_STEP_US } else { 200 };
        self.now += self.rng.gen_range(1..=max_step);
        if !self.winding_down() {
            self.faults_step();
        }
        self.broker_due();
        self.actions.clear();
        let wind = self.winding_down();
        for (i, c) in self.clients.iter().enumerate() {
            if c.gone {
                continue;
            }
            if !c.out.is_empty() {
                self.actions.push(Action::Deliver(i));
            }
            let usable = c.handles.any_usable();
            let wants =
                !c.stream_ended && c.attach_wait.is_none() && (c.ops_left > 0 && !wind || c.tidy && usable);
            if wants && c.order.len() + c.null_expected < self.swarm.pipeline {
                self.actions.push(Action::Issue(i));
            }
            if !wants
                && (!c.stream_ended || c.floods.partial.is_some())
                && c.out.is_empty()
                && c.order.is_empty()
                && c.null_expected == 0
            {
                self.actions.push(Action::Exit(i));
            }
        }
        let queues = self.effects.len();
        for _ in 0..queues.min(3) {
            self.actions.push(Action::Effect);
        }
        if let Some(link) = &self.link {
            if !link.up.is_empty() {
                self.actions.push(Action::Up);
            }
            if !link.down.is_empty() || link.down_eof {
                self.actions.push(Action::Down);
            }
        }
        if self.actions.is_empty() {
            // Waiting on the provider or a broker timer: sleep until then,
            // as a shell would.
            if let Some(t) = self.broker_next_event() {
                self.now = self.now.max(t);
                return self.first_violation.take().map_or(Ok(()), Err);
            }
            return self.shutdown_step();
        }
        let action = self.actions[self.rng.gen_range(0..self.actions.len())];
        match action {
            Action::Issue(i) => self.issue(i),
            Action::Deliver(i) => {
                let n = self.chunk(|w| &w.clients[i].out);
                self.deliver(i, n);
            }
            Action::Exit(i) => {
                let died = self.rng.gen_bool(0.3);
                self.depart(
                    i,
                    Some(if died {
                        Input::Died { client: self.clients[i].id }
                    } else {
                        Input::Eof { client: self.clients[i].id }
                    }),
                );
                if !died && self.rng.gen_bool(0.5) {
                    // The process exits after closing its pipe.
                    let (level, client) = (self.clients[i].level, self.clients[i].id);
                    self.feed(level, Input::Died { client });
                }
            }
            Action::Effect => self.complete_effect()?,
            Action::Up => {
                let n = self.chunk(|w| &w.link.as_ref().expect("nested").up);
                let data = self.link.as_mut().map(|l| l.up.take(n)).unwrap_or_default();
                self.feed(0, Input::Bytes { client: MIDDLE_CONN, data });
            }
            Action::Down => {
                let n = self.chunk(|w| &w.link.as_ref().expect("nested").down);
                let link = self.link.as_mut().expect("nested");
                if n == 0 && link.down_eof {
                    link.down_eof = false;
                    self.feed(1, Input::UpstreamEof);
                } else {
                    let data = link.down.take(n);
                    self.feed(1, Input::UpstreamBytes { data });
                }
            }
        }
        self.first_violation.take().map_or(Ok(()), Err)
    }

    /// Nothing left to do but shut down: the middle exits once its clients
    /// are gone; then the world is finished.
    fn shutdown_step(&mut self) -> Check {
        if self.clients.iter().any(|c| !c.gone) {
            return Err(violation(
                "liveness",
                "clients still wait for responses but nothing is in flight".to_owned(),
            ));
        }
        if self.nested && self.levels[1].alive {
            let m = &self.levels[1].m;
            if m.open_handles() != 0 || m.tracked_clients() != 0 {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!(
                            "intermediate holds {} handles for {} clients after all left",
                            m.open_handles(),
                            m.tracked_clients()
                        ),
                    ),
                    1,
                    MIDDLE_CONN,
                ));
            }
            self.kill_middle(false);
            return self.first_violation.take().map_or(Ok(()), Err);
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.alive && (l.m.open_handles() != 0 || l.m.tracked_clients() != 0) {
                return Err(violation(
                    "no_leaked_handles",
                    format!(
                        "level {i} ends the run with {} handles and {} clients",
                        l.m.open_handles(),
                        l.m.tracked_clients()
                    ),
                ));
            }
        }
        if self.fs.open_count() != 0 {
            return Err(violation(
                "no_leaked_handles",
                format!("{} host files still open at the end", self.fs.open_count()),
            ));
        }
        self.broker_final_check()?;
        self.pager_final_check()?;
        if self.fs.get(&PathBuf::from("/data/ro/a.txt")) != Some(self.fixture.as_slice()) {
            return Err(violation("policy", "a read-only file changed".to_owned()));
        }
        self.finished = true;
        Ok(())
    }

    /// How many bytes the next delivery from a pipe hands over.
    fn chunk(&mut self, pipe: impl Fn(&World) -> &Pipe) -> usize {
        let (len, front) = {
            let p = pipe(self);
            (p.len, p.front_rest())
        };
        if len == 0 {
            return 0;
        }
        if self.fires(FaultKind::SplitDelivery) {
            self.count(FaultKind::SplitDelivery);
            return self.rng.gen_range(1..=len);
        }
        if len > front && self.fires(FaultKind::CoalescedDelivery) {
            self.count(FaultKind::CoalescedDelivery);
            return len;
        }
        front
    }

    fn faults_step(&mut self) {
        self.adversary_swap();
        if self.fires(FaultKind::ClockJump) {
            self.count(FaultKind::ClockJump);
            let jump = self.rng.gen_range(1_000_000..3_600_000_000);
            self.now += jump;
            if let Some(b) = self.broker.as_mut() {
                b.jumped += jump;
            }
        }
        if self.fires(FaultKind::CancelStorm) {
            self.cancel_storm();
        }
        if self.fires(FaultKind::QueueFlood) {
            self.queue_flood();
        }
        for kind in [FaultKind::Eof, FaultKind::ProcessDeath] {
            if !self.fires(kind) {
                continue;
            }
            let live: Vec<usize> = (0..self.clients.len()).filter(|&i| !self.clients[i].gone).collect();
            if live.is_empty() {
                continue;
            }
            self.count(kind);
            let i = live[self.rng.gen_range(0..live.len())];
            // Whatever the process wrote before it went may still be read,
            // up to an arbitrary byte.
            let n = self.rng.gen_range(0..=self.clients[i].out.len);
            let client = self.clients[i].id;
            if n > 0 {
                self.deliver(i, n);
            }
            if self.clients[i].gone {
                continue;
            }
            let input = if kind == FaultKind::Eof { Input::Eof { client } } else { Input::Died { client } };
            self.depart(i, Some(input));
        }
        if self.nested && self.levels[1].alive && self.fires(FaultKind::MiddleDeath) {
            self.count(FaultKind::MiddleDeath);
            self.kill_middle(true);
        }
    }

    /// Hand the next `n` bytes client `i` wrote to its machine, each
    /// descriptor it passed with a frame ahead of that frame's first byte.
    fn deliver(&mut self, i: usize, n: usize) {
        let start = self.clients[i].out.taken;
        let data = self.clients[i].out.take(n);
        self.mark_delivered(i);
        let (level, client) = (self.clients[i].level, self.clients[i].id);
        let end = start + data.len() as u64;
        while self.clients[i].dpending.front().is_some_and(|&s| s < end) {
            self.clients[i].dpending.pop_front();
            self.clients[i].fds_unclaimed += 1;
            self.feed(level, Input::Descriptor { client });
        }
        self.feed(level, Input::Bytes { client, data });
    }

    /// The intermediate process goes away: its clients lose their pipes and
    /// the top sees its connection end, possibly mid-frame.
    fn kill_middle(&mut self, abrupt: bool) {
        self.levels[1].alive = false;
        self.effects.retain(|(level, _), _| *level != 1);
        for i in 0..self.clients.len() {
            if self.clients[i].level == 1 && !self.clients[i].gone {
                self.depart(i, None);
            }
        }
        let Some(link) = self.link.as_mut() else { return };
        link.down.clear();
        link.down_eof = false;
        if self.gone.contains(&(0, MIDDLE_CONN)) {
            return;
        }
        let n = if abrupt { self.rng.gen_range(0..=link.up.len) } else { link.up.len };
        let data = link.up.take(n);
        link.up.clear();
        if !data.is_empty() {
            self.feed(0, Input::Bytes { client: MIDDLE_CONN, data });
        }
        self.gone.insert((0, MIDDLE_CONN));
        self.departed_check.push((0, MIDDLE_CONN));
        let input = if abrupt && self.rng.gen_bool(0.5) {
            Input::Died { client: MIDDLE_CONN }
        } else {
            Input::Eof { client: MIDDLE_CONN }
        };
        self.feed(0, input);
    }

    /// Client `i` is gone for its machine: it left (`input`), the machine
    /// dropped it, or its intermediate died. Records the one request that
    /// may still take effect.
    fn depart(&mut self, i: usize, input: Option<Input>) {
        let c = &mut self.clients[i];
        if c.gone {
            return;
        }
        c.gone = true;
        c.out.clear();
        c.dpending.clear();
        // The first request the machine had not yet answered may still
        // take effect. Invalid requests are passed over: they change
        // nothing, and one answered with no readable id (a corrupt frame)
        // stays outstanding here for good, though the machine has long
        // moved on to the requests behind it.
        let first = c.order.records().map(|s| &s.kind).find(|k| !matches!(k, Kind::Invalid)).cloned();
        let handles = std::mem::take(&mut c.handles);
        let (level, client) = (c.level, c.id);
        match first {
            Some(Kind::Write { h, data }) => {
                if let Some(hm) = handles.get(&h) {
                    if let Some(mut f) = hm.key.as_ref().and_then(|k| self.files.get_mut(k)) {
                        match f.class {
                            Class::Private => {
                                let mut content = f.content.clone();
                                let mut pos = hm.pos;
                                apply_write(&mut content, &mut pos, hm.mode == Mode::Append, &data);
                                f.alt = Some((true, content));
                            }
                            Class::Log => f.log.send(data),
                            _ => {}
                        }
                        f.dirty = true;
                    }
                }
            }
            Some(Kind::Open { key: Some(key), mode, .. }) if mode != Mode::Read => {
                if let Some(mut f) = self.files.get_mut(&key) {
                    if f.class == Class::Private {
                        let content = if mode == Mode::Write { Vec::new() } else { f.content.clone() };
                        f.alt = Some((true, content));
                        f.dirty = true;
                    }
                }
            }
            _ => {}
        }
        self.gone.insert((level, client));
        self.departed_check.push((level, client));
        self.broker_depart(i);
        if let Some(input) = input {
            self.feed(level, input);
        }
    }

    /// Hand `input` to `level`, record it, and route what comes out.
    fn feed(&mut self, level: usize, input: Input) {
        let now = Instant::from_micros(self.now);
        if let Some(t) = &mut self.trace {
            let _ = t.input(level, now, &input);
        }
        self.levels[level].m.handle(now, input);
        while let Some(out) = self.levels[level].m.poll_output() {
            if let Some(t) = &mut self.trace {
                let _ = t.output(level, &out);
            }
            if let Err(v) = self.route(level, out) {
                self.first_violation.get_or_insert(v);
            }
        }
    }

    fn client_at(&self, level: usize, client: ClientId) -> Option<usize> {
        self.clients.iter().position(|c| c.level == level && c.id == client)
    }

    fn route(&mut self, level: usize, out: Output) -> Check {
        match out {
            Output::Send { client, data } => {
                if self.gone.contains(&(level, client)) {
                    return Err(at(
                        violation(
                            "nothing_sent_to_departed",
                            format!("level {level} sent {} bytes", data.len()),
                        ),
                        level,
                        client,
                    ));
                }
                if self.nested && level == 0 && client == MIDDLE_CONN {
                    // A dead intermediate reads nothing more.
                    if let Some(link) = self.link.as_mut().filter(|_| self.levels[1].alive) {
                        link.down.push(data);
                        self.maybe_oversize_upstream();
                    }
                    return Ok(());
                }
                let i = self.client_at(level, client).ok_or_else(|| {
                    violation("nothing_sent_to_departed", format!("level {level} sent to unknown {client}"))
                })?;
                self.broker_check_sent(&data).map_err(|v| at(v, level, client))?;
                let (bytes, whole) = self.clients[i].frames.push(data);
                for payload in payloads(&bytes[..whole]) {
                    self.on_response(i, payload).map_err(|v| at(v, level, client))?;
                }
                Ok(())
            }
            Output::Attach { from, client } => {
                self.on_attach(level, from, client).map_err(|v| at(v, level, from))
            }
            Output::DropDescriptor { client, .. } => self.on_drop_descriptor(level, client),
            // The simulated worlds have no session socket: nothing was
            // accepted for the machine to admit or refuse.
            Output::Admit { client } => {
                Err(at(violation("no_socket", "admitted a connection nobody accepted".into()), level, client))
            }
            Output::Refuse { .. } => Err(at(
                violation("no_socket", "refused a connection nobody accepted".into()),
                level,
                ClientId(0),
            )),
            Output::Close { client } => {
                if !self.closed_by_machine.insert((level, client)) {
                    return Err(at(violation("close_once", "closed twice".into()), level, client));
                }
                if self.nested && level == 0 && client == MIDDLE_CONN {
                    if !self.gone.contains(&(0, MIDDLE_CONN)) {
                        self.gone.insert((0, MIDDLE_CONN));
                        self.departed_check.push((0, MIDDLE_CONN));
                        if let Some(link) = self.link.as_mut() {
                            link.down_eof = true;
                            link.up.clear();
                        }
                    }
                    return Ok(());
                }
                if let Some(i) = self.client_at(level, client) {
                    self.depart(i, None);
                }
                Ok(())
            }
            Output::Effect { id, effect } => {
                let queue = match &effect {
                    Effect::Open { file, .. }
                    | Effect::Read { file, .. }
                    | Effect::Write { file, .. }
                    | Effect::Close { file } => {
                        if level != self.store {
                            return Err(violation(
                                "policy",
                                format!("level {level} forwards upstream yet asked for a file effect"),
                            ));
                        }
                        Queue::File(*file)
                    }
                    Effect::ReadStdin { .. } | Effect::WriteStdio { .. } => {
                        if self.levels[level].m.config().stdio != StdioRole::Local {
                            return Err(violation(
                                "policy",
                                format!("level {level} rejects stdio yet used it"),
                            ));
                        }
                        Queue::Stdio
                    }
                };
                if let Effect::Open { root, rel, mode, .. } = &effect {
                    let policy = &self.levels[level].m.config().policy;
                    let Some(r) = policy.root(*root) else {
                        return Err(violation("policy", format!("open under unknown root {root:?}")));
                    };
                    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                        return Err(violation("policy", format!("open of {rel:?} leaves its root")));
                    }
                    if mode.writable() && r.access != Access::ReadWrite {
                        return Err(violation(
                            "policy",
                            format!("{mode:?} open under read-only {:?}", r.path),
                        ));
                    }
                    let named = crate::fs::joined(&r.path, rel);
                    self.check_confined(&named, *mode, false)?;
                }
                self.effect_seq += 1;
                self.effects.entry((level, queue)).or_default().push_back((self.effect_seq, id, effect));
                Ok(())
            }
            Output::StartProvider { call, request, deadline } => {
                self.on_start_provider(call, request, deadline.as_micros())
            }
            Output::CancelProvider { call } => self.on_cancel_provider(call),
            Output::Audit { record } => {
                if !self.levels[level].m.config().audit {
                    return Err(violation("policy", format!("audit record without audit on: {record:?}")));
                }
                Ok(())
            }
            Output::Telemetry { record } => {
                if self.broker.is_none() {
                    return Err(violation("policy", format!("telemetry without a broker: {record:?}")));
                }
                self.on_broker_telemetry(&record)
            }
            Output::SendUpstream { data } => {
                if !self.nested || level != 1 {
                    return Err(violation("policy", format!("level {level} has no upstream yet sent to it")));
                }
                let (bytes, whole) = self.levels[1].upstream_frames.push(data.clone());
                for payload in payloads(&bytes[..whole]) {
                    let f = upstream::read(payload).map_err(|e| {
                        violation("upstream_frames", format!("upstream request is not JSON: {e}"))
                    })?;
                    let shown = || serde_json::from_slice::<Value>(payload).unwrap_or(Value::Null);
                    if let Some(h) = f.h.filter(|h| *h < 3) {
                        return Err(violation(
                            "stdio_never_upstream",
                            format!("handle {h} forwarded: {}", shown()),
                        ));
                    }
                    // Invariant 10: a level's virtual namespace is its own.
                    if let Some(p) = f.open_path.filter(|p| !p.starts_with('/')) {
                        return Err(violation(
                            "confinement",
                            format!("level 1 forwarded its virtual name {p:?} upstream: {}", shown()),
                        ));
                    }
                }
                if !self.gone.contains(&(0, MIDDLE_CONN)) {
                    if let Some(link) = self.link.as_mut() {
                        link.up.push(data);
                    }
                }
                Ok(())
            }
        }
    }

    /// The machine serves a descriptor `from` passed as the new client
    /// `new`: a new simulated process, whose first frame must answer the
    /// attach `from` sent.
    fn on_attach(&mut self, level: usize, from: ClientId, new: ClientId) -> Check {
        if self.gone.contains(&(level, from)) {
            return Err(violation(
                "nothing_sent_to_departed",
                format!("attach of {new} for a departed client"),
            ));
        }
        let i =
            self.client_at(level, from).filter(|&i| self.clients[i].fds_unclaimed > 0).ok_or_else(|| {
                violation("no_attach_without_descriptor", format!("attach of {new} without a descriptor"))
            })?;
        if new.0 < ATTACHED_CLIENT_BASE || new == MIDDLE_CONN || self.client_at(level, new).is_some() {
            return Err(violation("attach_fresh_client", format!("attach reuses client id {new}")));
        }
        let c = &mut self.clients[i];
        c.fds_unclaimed -= 1;
        // Requests are served in order, and those refused unserved were
        // answered already: the oldest attach outstanding is the one served.
        let id = c
            .order
            .iter()
            .find(|(_, s)| matches!(s, Sent { kind: Kind::Attach { fd: true }, .. }))
            .map(|(q, _)| q.id.clone())
            .ok_or_else(|| violation("no_attach_without_descriptor", format!("attach of {new} unasked")))?;
        c.answer(&id);
        let idx = self.clients.len() + 1;
        add_private_files(&mut self.files, idx, level);
        let mut c = Client::new(self.seed, idx, level, new, (self.swarm.ops_per_client / 2).max(1));
        c.order.push_back(
            Queued { id: id.clone(), frame: None, in_line: false, close: false },
            Sent { kind: Kind::Attached, must_fail: None },
        );
        c.attach_wait = Some(id);
        self.clients.push(c);
        Ok(())
    }

    fn complete_effect(&mut self) -> Check {
        let key = if self.fires(FaultKind::EffectReorder) {
            self.count(FaultKind::EffectReorder);
            let n = self.rng.gen_range(0..self.effects.len());
            self.effects.keys().nth(n).copied()
        } else {
            self.effects.iter().min_by_key(|(_, q)| q.front().map_or(u64::MAX, |e| e.0)).map(|(k, _)| *k)
        };
        let Some(key) = key else { return Ok(()) };
        let Some(queue) = self.effects.get_mut(&key) else { return Ok(()) };
        let Some((_, id, effect)) = queue.pop_front() else { return Ok(()) };
        if queue.is_empty() {
            self.effects.remove(&key);
        }
        let level = key.0;
        let misuse = |e: String| violation("fs_misuse", e);
        let result = match effect {
            Effect::Open { file, root, rel, mode, scope } => {
                let Some(r) = self.levels[level].m.config().policy.root(root) else {
                    return Err(violation("policy", format!("unknown root {root:?}")));
                };
                let path = crate::fs::joined(&r.path, &rel);
                if mode != Mode::Write && self.fires(FaultKind::FsError) {
                    self.count(FaultKind::FsError);
                    EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
                } else {
                    let anchors = std::mem::take(&mut self.anchors);
                    let opened = self.fs.open(level, file, &path, mode, &anchors, &scope);
                    self.anchors = anchors;
                    let (result, resolved) = opened.map_err(misuse)?;
                    if let Some(p) = resolved {
                        self.check_confined(&p, mode, true)?;
                    }
                    result
                }
            }
            // A failed host read: a batch of reads answers its first with it.
            Effect::Read { .. } if self.fires(FaultKind::FsError) => {
                self.count(FaultKind::FsError);
                EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
            }
            Effect::Read { file, max } => self.fs.read(level, file, max).map_err(misuse)?,
            Effect::Write { file, data } => self.fs.write(level, file, &data).map_err(misuse)?,
            Effect::Close { file } => self.fs.close(level, file).map_err(misuse)?,
            Effect::ReadStdin { max } => {
                let stdin = &mut self.levels[level].stdin;
                let n = stdin.len().min(max as usize);
                let data: Vec<u8> = stdin.drain(..n).collect();
                let eof = data.is_empty();
                EffectResult::Data { data, eof }
            }
            Effect::WriteStdio { data, .. } => EffectResult::Written { written: data.len() as u64 },
        };
        self.feed(level, Input::EffectDone { id, result });
        Ok(())
    }

    fn quiescent(&self) -> bool {
        self.broker
            .as_ref()
            .is_none_or(|b| b.provider_idle() && self.levels[0].m.broker().is_some_and(|x| x.is_idle()))
            && self.effects.is_empty()
            && self.clients.iter().all(|c| c.gone || c.out.is_empty())
            && self.link.as_ref().is_none_or(|l| l.up.is_empty() && l.down.is_empty() && !l.down_eof)
    }

    /// The checks that need a settled world; the others run as outputs are
    /// routed.
    fn check(&mut self) -> Check {
        self.broker_check()?;
        self.check_bounds()?;
        self.pager_check()?;
        if !self.quiescent() {
            return Ok(());
        }
        for c in &self.clients {
            if !c.gone && (!c.order.is_empty() || c.null_expected > 0) {
                // The first five by id, as they were named when a map
                // sorted by id held them.
                let mut ids: Vec<&String> = c.order.iter().map(|(q, _)| &q.id).collect();
                ids.sort_unstable();
                ids.truncate(5);
                return Err(at(
                    violation(
                        "liveness",
                        format!(
                            "world is quiet but {} requests are unanswered (ids {ids:?}, {} without id)",
                            c.order.len(),
                            c.null_expected
                        ),
                    ),
                    c.level,
                    c.id,
                ));
            }
        }
        self.check_handles()?;
        self.check_files()
    }

    fn check_handles(&mut self) -> Check {
        for &(level, client) in &self.departed_check {
            let l = &self.levels[level];
            if l.alive && l.m.handles_of(client) != 0 {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!(
                            "departed client still owns {} handles on level {level}",
                            l.m.handles_of(client)
                        ),
                    ),
                    level,
                    client,
                ));
            }
        }
        self.departed_check.clear();
        let middle_up = self.nested && self.levels[1].alive && !self.gone.contains(&(0, MIDDLE_CONN));
        let mut middle_total = 0;
        let mut host_open = 0;
        let mut totals = vec![0usize; self.levels.len()];
        for c in self.clients.iter().filter(|c| !c.gone) {
            let l = &self.levels[c.level];
            if !l.alive {
                continue;
            }
            let n = c.handles.len();
            if l.m.handles_of(c.id) != n {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!("machine says {} handles, client holds {n}", l.m.handles_of(c.id)),
                    ),
                    c.level,
                    c.id,
                ));
            }
            totals[c.level] += n;
            let hosts = c.handles.values().filter(|h| h.host).count();
            if c.level == 1 {
                // Only host files are held at the top: the intermediate's
                // virtual files are its own.
                middle_total += hosts;
                if middle_up {
                    host_open += hosts;
                }
            } else {
                host_open += hosts;
            }
        }
        if middle_up {
            totals[0] += middle_total;
            let at_top = self.levels[0].m.handles_of(MIDDLE_CONN);
            if at_top != middle_total {
                return Err(at(
                    violation(
                        "no_leaked_handles",
                        format!("top holds {at_top} handles for the intermediate, whose clients hold {middle_total}"),
                    ),
                    0,
                    MIDDLE_CONN,
                ));
            }
        }
        for (i, l) in self.levels.iter().enumerate() {
            if l.alive && l.m.open_handles() != totals[i] {
                return Err(violation(
                    "no_leaked_handles",
                    format!("level {i} holds {} handles, live clients {}", l.m.open_handles(), totals[i]),
                ));
            }
        }
        if self.fs.open_count() != host_open {
            return Err(violation(
                "no_leaked_handles",
                format!("{} host files open, live clients hold {host_open}", self.fs.open_count()),
            ));
        }
        Ok(())
    }

    fn check_files(&mut self) -> Check {
        let dirty = self.fs.take_dirty();
        for p in dirty {
            if let Some(mut f) = p.to_str().and_then(|k| self.files.get_mut(k)) {
                f.dirty = true;
            }
        }
        let levels = &self.levels;
        let fs = &self.fs;
        self.files.for_each_mut(
            |f| f.dirty,
            |key, f| {
                f.dirty = false;
                let actual = match &f.loc {
                    Loc::Host(p) => fs.get(p),
                    Loc::Virtual(name, level) => levels[*level].m.virtual_file(name),
                };
                match f.class {
                    Class::Private if !f.unknown => {
                        let is = |exists: bool, content: &[u8]| {
                            if exists {
                                actual == Some(content)
                            } else {
                                actual.is_none()
                            }
                        };
                        if !is(f.exists, &f.content) && !f.alt.as_ref().is_some_and(|(e, c)| is(*e, c)) {
                            return Err(violation(
                                "no_data_loss",
                                format!(
                                    "{key}: holds {:?} bytes, acknowledged requests leave {} bytes{}",
                                    actual.map(<[u8]>::len),
                                    f.content.len(),
                                    f.alt
                                        .as_ref()
                                        .map_or(String::new(), |(_, c)| format!(" (or {})", c.len()))
                                ),
                            ));
                        }
                    }
                    Class::Log => {
                        f.log
                            .check(actual.unwrap_or_default())
                            .map_err(|m| violation("no_data_loss", format!("{key}: {m}")))?;
                    }
                    _ => {}
                }
                Ok(())
            },
        )
    }

    /// At the end of a seed: each log's kept check gives the verdict of a
    /// check from the start of the file.
    fn check_logs_agree(&self) -> Check {
        for (key, f) in self.files.iter() {
            if let (Class::Log, Loc::Host(p)) = (f.class, &f.loc) {
                let data = self.fs.get(p).unwrap_or_default();
                f.log.agrees(data).map_err(|m| violation("checker_counts", format!("{key}: {m}")))?;
            }
        }
        Ok(())
    }
}

// Requests: how a client picks and encodes them, and how it reads answers.
impl World {
    fn issue(&mut self, i: usize) {
        let stdio_local = self.levels[self.clients[i].level].m.config().stdio == StdioRole::Local;
        let invalid_ppm = self.swarm.invalid_ppm;
        let max_frame = self.swarm.max_frame;
        let c = &mut self.clients[i];
        if c.ops_left == 0 || self.step > self.swarm.max_steps as u64 {
            // Tidying up before exit.
            if let Some(h) = c.handles.nth_usable(0) {
                c.handles.set_closing(&h, true);
                let id = next_id(c);
                let payload = request::close(&id, h);
                send(c, id, payload, Kind::Close { h }, None);
            }
            return;
        }
        c.ops_left -= 1;
        let kinds = [FaultKind::OversizedFrame, FaultKind::CorruptFrame, FaultKind::NonUtf8Frame];
        let rates = kinds.map(|k| self.rates.get(k));
        let c = &mut self.clients[i];
        let roll = c.rng.gen_range(0..PPM);
        if roll < rates[0] {
            *self.faults.entry(FaultKind::OversizedFrame).or_default() += 1;
            let len = (max_frame as u64 + 1 + c.rng.gen_range(0..1000)).min(u64::from(u32::MAX)) as u32;
            let mut bytes = len.to_be_bytes().to_vec();
            bytes.extend((0..c.rng.gen_range(0..64)).map(|_| b'x'));
            c.out.push(bytes);
            c.null_expected += 1;
            c.stream_ended = true;
            return;
        }
        if roll < rates[0] + rates[1] {
            *self.faults.entry(FaultKind::CorruptFrame).or_default() += 1;
            let id = next_id(c);
            let data = draw::bytes(&mut c.rng, 0..40);
            let good = request::write(&id, 3, &data, None);
            let mut bad = good.clone();
            for _ in 0..c.rng.gen_range(1..=4) {
                let at = c.rng.gen_range(0..bad.len());
                bad[at] = c.rng.gen();
            }
            if serde_json::from_slice::<Value>(&bad).is_ok() {
                // Still JSON: it could still be a request. A proper prefix
                // of an object never is.
                bad = good[..c.rng.gen_range(1..good.len())].to_vec();
            }
            send_raw(c, bad);
            return;
        }
        if roll < rates[0] + rates[1] + rates[2] {
            *self.faults.entry(FaultKind::NonUtf8Frame).or_default() += 1;
            let id = next_id(c);
            let mut p = format!(r#"{{"id":"{id}","op":"open","params":{{"path":"v/"#).into_bytes();
            p.extend([0xff, 0xfe, 0xc3]);
            p.extend_from_slice(br#"","mode":"r"}}"#);
            send_raw(c, p);
            return;
        }
        if self.broker.is_some() {
            self.broker_issue(i);
            return;
        }
        if self.pager_issue(i) {
            return;
        }
        if self.issue_flood(i) {
            return;
        }
        if self.adversary.is_some() {
            self.adversary_issue(i);
            return;
        }
        // Drawn only when attach is on, so worlds without it draw as before.
        let attach = self.rates.get(FaultKind::Attach);
        if attach > 0 && self.clients[i].rng.gen_range(0..PPM) < attach && self.issue_attach(i) {
            return;
        }
        let c = &mut self.clients[i];
        if c.rng.gen_range(0..PPM) < invalid_ppm {
            invalid(c, stdio_local);
        } else {
            valid(c);
        }
        // Log chunks are known from the moment they are sent: any of them
        // may end up in the file, acknowledged or not.
        let c = &self.clients[i];
        if let Some((_, Sent { kind: Kind::Write { h, data }, .. })) = c.order.back() {
            let key = c.handles.get(h).and_then(|hm| hm.key.as_ref());
            if let Some(mut f) = key.and_then(|k| self.files.get_mut(k)).filter(|f| f.class == Class::Log) {
                f.log.send(data.clone());
            }
        }
    }

    /// Client `i` asks to attach, passing a descriptor with the request
    /// (a child process getting a connection of its own) or, now and then,
    /// without one (which must fail). The two never overlap, so which
    /// attach claims which descriptor stays known. False: nothing sent.
    fn issue_attach(&mut self, i: usize) -> bool {
        let budget = self.attach_budget;
        let c = &mut self.clients[i];
        let with_fd = budget > 0 && c.rng.gen_bool(0.8);
        let (mut has_fd, mut has_bare) = (false, false);
        for s in c.order.records() {
            match s.kind {
                Kind::Attach { fd: true } => has_fd = true,
                Kind::Attach { fd: false } => has_bare = true,
                _ => {}
            }
        }
        let must_fail = if with_fd && !has_bare {
            self.attach_budget -= 1;
            c.dpending.push_back(c.out.pushed);
            None
        } else if !with_fd && !has_fd && !c.stray_fd && c.fds_unclaimed == 0 {
            Some("attach_needs_descriptor")
        } else {
            return false;
        };
        let id = next_id(c);
        let payload = serde_json::to_vec(&json!({ "id": id, "op": "attach" })).unwrap_or_default();
        send(c, id, payload, Kind::Attach { fd: must_fail.is_none() }, must_fail);
        self.count(FaultKind::Attach);
        true
    }

    fn on_response(&mut self, i: usize, payload: &[u8]) -> Check {
        let v = Response::parse(payload).map_err(|m| violation("response_shape", m))?;
        let ok = v.ok().ok_or_else(|| violation("response_shape", format!("{v}")))?;
        let code = v.code();
        let code: &str = &code;
        const CODES: [&str; 14] = [
            "E_ARG",
            "E_NOENT",
            "E_PERM",
            "E_IO",
            "E_CLOSED",
            "E_UNSUPPORTED",
            "E_RANGE",
            "queue_timeout",
            "cancelled_before_start",
            "cancelled_after_start",
            "provider_timeout",
            "provider_error",
            "queue_full",
            "budget_exhausted",
        ];
        if !ok && !CODES.contains(&code) {
            return Err(violation("response_shape", format!("unknown error code in {v}")));
        }
        self.check_not_answering_echo(i, &v)?;
        self.check_link_kept(i, &v)?;
        let level = self.clients[i].level;
        let c = &mut self.clients[i];
        let id = match v.id() {
            Id::Str(s) => s,
            Id::None if self.buffered_closure(i, &v)? => return Ok(()),
            Id::None => {
                let c = &mut self.clients[i];
                if c.null_expected == 0 {
                    return Err(violation("one_response_per_request", format!("unexpected response {v}")));
                }
                c.null_expected -= 1;
                if ok {
                    return Err(violation("must_fail", format!("a frame without an id succeeded: {v}")));
                }
                return Ok(());
            }
            Id::Other => return Err(violation("response_shape", format!("id is not a string: {v}"))),
        };
        if let Some(first) = c.attach_wait.take() {
            if first != id {
                return Err(violation(
                    "attach_response_first",
                    format!("attached client's first frame answers {id}, not its attach {first}: {v}"),
                ));
            }
        }
        let Some(sent) = c.answer(&id) else {
            return Err(violation(
                "one_response_per_request",
                format!("response to unknown or answered {id}: {v}"),
            ));
        };
        if let Some(inv) = sent.must_fail {
            if ok {
                return Err(violation(inv, format!("request {id} ({:?}) must fail: {v}", sent.kind)));
            }
        }
        if let Kind::Broker(op) = sent.kind {
            c.llm_tokens.remove(id.as_ref());
            return self.on_broker_response(i, &id, op, &v.value());
        }
        if let Kind::Pager(op) = sent.kind {
            return self.on_pager_response(&id, op, &v);
        }
        let result = v.result();
        let refused = |what: &str| violation("valid_request_refused", format!("{what} {id} failed: {v}"));
        // A queue overflow rejects a request unserved; E_IO means an
        // upstream lost mid-request. Anything else on a valid request on a
        // handle the client holds is a confusion of handles.
        let benign = matches!(code, "E_RANGE" | "E_IO");
        match sent.kind {
            Kind::Open { key, mode, host } => {
                c.pending_opens -= 1;
                let file = key.as_ref().and_then(|k| self.files.get_mut(k));
                if ok {
                    let h = result
                        .and_then(|r| r.handle.as_u64())
                        .ok_or_else(|| violation("response_shape", format!("open without handle: {v}")))?;
                    if h < 3 || !self.levels[level].issued.insert(h) {
                        return Err(violation(
                            "handle_unique",
                            format!("handle {h} handed out again or stdio"),
                        ));
                    }
                    c.handles.insert(h, HModel::new(key.clone(), mode, host));
                    if let Some(mut f) = file {
                        f.dirty = true;
                        if f.class == Class::Private && !f.unknown {
                            if mode == Mode::Read && !f.exists {
                                return Err(violation(
                                    "fs_semantics",
                                    format!("opened missing {key:?} for reading"),
                                ));
                            }
                            if mode == Mode::Write {
                                f.content.clear();
                            }
                            f.exists = true;
                        }
                    }
                } else if let Some(mut f) = file {
                    if f.class == Class::Private && !f.unknown {
                        if code == "E_NOENT" && (mode != Mode::Read || f.exists) {
                            return Err(violation("fs_semantics", format!("open {key:?} {mode:?}: {v}")));
                        }
                        if code == "E_IO" && mode != Mode::Read && self.nested {
                            f.unknown = true;
                        }
                    }
                }
            }
            Kind::Read { h, max } => {
                let Some(hm) = c.handles.get_mut(&h) else {
                    if ok {
                        return Err(violation(
                            "must_fail",
                            format!("read on foreign handle {h} succeeded: {v}"),
                        ));
                    }
                    return Ok(());
                };
                if !ok {
                    return if benign || !hm.mode.readable() { Ok(()) } else { Err(refused("read")) };
                }
                let r = result.ok_or_else(|| violation("response_shape", format!("{v}")))?;
                let data = r
                    .data
                    .as_str()
                    .and_then(|d| base64_simd::STANDARD.decode_to_vec(d.as_bytes()).ok())
                    .ok_or_else(|| violation("response_shape", format!("read without data: {v}")))?;
                let eof = r.eof.as_bool();
                if data.len() > max as usize || eof != Some(data.is_empty()) {
                    return Err(violation(
                        "read_consistency",
                        format!("read of {max} gave {} bytes, eof {eof:?}", data.len()),
                    ));
                }
                if let Some(f) = hm.key.as_ref().and_then(|k| self.files.get(k)) {
                    if matches!(f.class, Class::Private | Class::Fixture) && !f.unknown {
                        let start = (hm.pos as usize).min(f.content.len());
                        let end = start.saturating_add(max as usize).min(f.content.len());
                        if data != f.content[start..end] {
                            return Err(violation(
                                "read_consistency",
                                format!(
                                    "{:?} at {start}: read {} bytes, model has {}",
                                    hm.key,
                                    data.len(),
                                    end - start
                                ),
                            ));
                        }
                    }
                }
                hm.pos += data.len() as u64;
            }
            Kind::Write { h, data } => {
                let Some(hm) = c.handles.get_mut(&h) else {
                    if ok {
                        return Err(violation(
                            "must_fail",
                            format!("write on foreign handle {h} succeeded: {v}"),
                        ));
                    }
                    return Ok(());
                };
                let file = hm.key.as_ref().and_then(|k| self.files.get_mut(k));
                if !ok {
                    if let Some(mut f) = file {
                        if f.class == Class::Log && code != "E_IO" {
                            f.log.refuse(data);
                        } else if f.class == Class::Private && code == "E_IO" {
                            f.unknown = true;
                        }
                    }
                    return if benign || !hm.mode.writable() { Ok(()) } else { Err(refused("write")) };
                }
                let written = result.and_then(|r| r.written.as_u64());
                if written != Some(data.len() as u64) {
                    return Err(violation(
                        "no_data_loss",
                        format!("wrote {} bytes, acknowledged {written:?}", data.len()),
                    ));
                }
                match file {
                    Some(mut f) if f.class == Class::Private => {
                        if !f.unknown {
                            apply_write(&mut f.content, &mut hm.pos, hm.mode == Mode::Append, &data);
                        }
                        f.dirty = true;
                    }
                    Some(mut f) if f.class == Class::Log => {
                        f.log.ack(data);
                        f.dirty = true;
                    }
                    _ => hm.pos += data.len() as u64,
                }
            }
            Kind::Close { h } => match c.handles.contains_key(&h) {
                false if ok => {
                    return Err(violation(
                        "must_fail",
                        format!("close of foreign handle {h} succeeded: {v}"),
                    ));
                }
                false => {}
                // A rejected close was never served: the handle stays.
                true if !ok && code == "E_RANGE" => {
                    c.handles.set_closing(&h, false);
                }
                true => {
                    c.handles.remove(&h);
                    c.closed.push(h);
                    if !ok && !benign {
                        return Err(refused("close"));
                    }
                }
            },
            Kind::Stdio { write_len } => {
                let written = result.and_then(|r| r.written.as_u64());
                if let (true, Some(len)) = (ok, write_len) {
                    if written != Some(len as u64) {
                        return Err(violation(
                            "write_ack",
                            format!("stdio write of {len} acknowledged {written:?}"),
                        ));
                    }
                }
            }
            // Answered on the sharer only when unserved (a full queue); its
            // descriptor then lingers.
            Kind::Attach { fd: true } => {
                if ok || code != "E_RANGE" {
                    return Err(violation(
                        "attach_answered_on_new_client",
                        format!("attach {id} with a descriptor answered on the sharer: {v}"),
                    ));
                }
                c.stray_fd = true;
            }
            Kind::Attach { fd: false } => {
                if code != "E_ARG" && code != "E_RANGE" {
                    return Err(violation(
                        "attach_needs_descriptor",
                        format!("attach {id} without one: {v}"),
                    ));
                }
            }
            Kind::Attached => {
                if !ok {
                    return Err(violation("attach_response_first", format!("attach {id} answered {v}")));
                }
            }
            Kind::Invalid | Kind::Broker(_) | Kind::Pager(_) => {}
        }
        Ok(())
    }
}

fn next_id(c: &mut Client) -> String {
    c.next_req += 1;
    let (mut idx, mut req) = (itoa::Buffer::new(), itoa::Buffer::new());
    cat(&["c", idx.format(c.idx), "-", req.format(c.next_req)])
}

/// The parts joined: what `format!` gives for strings and integers, in one
/// allocation (`format!` was a tenth of what a client spent on a request).
fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

fn send(c: &mut Client, id: String, payload: Vec<u8>, kind: Kind, must_fail: Option<&'static str>) {
    let in_line = !matches!(kind, Kind::Broker(_) | Kind::Attach { .. } | Kind::Attached);
    send_held(c, id, payload, kind, must_fail, in_line);
}

/// `send`, saying whether the request holds the client's others while it
/// is served.
fn send_held(
    c: &mut Client,
    id: String,
    payload: Vec<u8>,
    kind: Kind,
    must_fail: Option<&'static str>,
    in_line: bool,
) {
    let len = payload.len() as u64;
    c.out.push(frame(payload));
    if matches!(kind, Kind::Open { .. }) {
        c.pending_opens += 1;
    }
    let close = matches!(kind, Kind::Close { .. });
    c.order
        .push_back(Queued { id, frame: Some((c.out.pushed, len)), in_line, close }, Sent { kind, must_fail });
}

/// A frame whose answer only the oracle can tell; it must fail. With an
/// id the oracle reads, the machine holds it in line like any other until
/// it is served and refused. Without one, its `id: null` answer does not
/// say which frame it answers: refused on arrival past a bound, or served
/// in turn, so it is left out of `order` (its bytes uncounted, never
/// miscounted).
fn send_raw(c: &mut Client, payload: Vec<u8>) {
    let len = payload.len() as u64;
    let id = oracle_id(&payload);
    c.out.push(frame(payload));
    match id {
        Some(id) => {
            c.order.push_back(
                Queued { id, frame: Some((c.out.pushed, len)), in_line: true, close: false },
                Sent { kind: Kind::Invalid, must_fail: Some("must_fail") },
            );
        }
        None => c.null_expected += 1,
    }
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.gen_range(0..items.len())]
}

const MODES: [Mode; 4] = [Mode::Read, Mode::Write, Mode::Append, Mode::ReadWrite];

fn valid(c: &mut Client) {
    let mut idx_text = itoa::Buffer::new();
    let idx = idx_text.format(c.idx);
    let usable = c.handles.usable_count();
    let open = usable == 0 || usable < 4 && c.rng.gen_bool(0.3);
    if open {
        let (key, path, mode, host) = match c.rng.gen_range(0..100) {
            0..30 => {
                let key = cat(&["/data/rw/c", idx, ".dat"]);
                // As `pick` over the four spellings, building only the one.
                let path = match c.rng.gen_range(0..4usize) {
                    0 => key.clone(),
                    1 => cat(&["/data/rw/./c", idx, ".dat"]),
                    2 => cat(&["/data/ro/../rw/c", idx, ".dat"]),
                    _ => cat(&["/data/rw/sub/../c", idx, ".dat"]),
                };
                (key, path, *pick(&mut c.rng, &MODES), true)
            }
            30..45 => {
                let path = match c.rng.gen_range(0..3usize) {
                    0 => cat(&["scratch/c", idx, ".log"]),
                    1 => cat(&["./scratch/c", idx, ".log"]),
                    _ => cat(&["/work/proj/scratch/c", idx, ".log"]),
                };
                (cat(&["/work/proj/scratch/c", idx, ".log"]), path, *pick(&mut c.rng, &MODES), true)
            }
            45..60 => {
                let path = match c.rng.gen_range(0..3usize) {
                    0 => cat(&["v/c", idx, ".txt"]),
                    1 => cat(&["./v/c", idx, ".txt"]),
                    _ => cat(&["v/../v/c", idx, ".txt"]),
                };
                (cat(&["v/c", idx, ".txt"]), path, *pick(&mut c.rng, &MODES), false)
            }
            60..75 => {
                let mode = if c.rng.gen_bool(0.8) { Mode::Append } else { Mode::Read };
                ("/data/rw/shared.log".to_owned(), "/data/rw/shared.log".to_owned(), mode, true)
            }
            75..82 => {
                let key = "/work/proj/scratch/chaos.bin".to_owned();
                (key, "scratch/chaos.bin".to_owned(), *pick(&mut c.rng, &MODES), true)
            }
            _ => {
                let key =
                    pick(&mut c.rng, &["/data/ro/a.txt", "/data/ro/a.txt", "/data/ro/empty"]).to_string();
                (key.clone(), key, Mode::Read, true)
            }
        };
        let id = next_id(c);
        let payload = request::open(&id, &path, mode.as_str());
        send(c, id, payload, Kind::Open { key: Some(key), mode, host }, None);
        return;
    }
    // As `pick` over the usable handles, without collecting them (a kept
    // count out of step with the handles is the count checker's to report).
    let Some(h) = c.handles.nth_usable(c.rng.gen_range(0..usable)) else { return };
    let hm = &c.handles[&h];
    let (mode, shared) = (hm.mode, hm.key.as_deref() == Some("/data/rw/shared.log"));
    let close = c.rng.gen_bool(if usable > 3 { 0.3 } else { 0.1 });
    let id = next_id(c);
    if close {
        c.handles.set_closing(&h, true);
        let payload = request::close(&id, h);
        send(c, id, payload, Kind::Close { h }, None);
    } else if mode.writable() && (!mode.readable() || c.rng.gen_bool(0.5)) {
        let data: Vec<u8> = if shared {
            let n = c.rng.gen_range(0..40);
            let letters: String = (0..n).map(|_| char::from(c.rng.gen_range(b'a'..=b'z'))).collect();
            format!("[{id}:{letters}]").into_bytes()
        } else {
            match c.rng.gen_range(0..100) {
                0..70 => draw::bytes(&mut c.rng, 0..64),
                70..95 => draw::bytes(&mut c.rng, 64..512),
                _ => draw::bytes(&mut c.rng, 512..=2048),
            }
        };
        let payload = request::write(&id, h, &data, Some(c.rng.gen_bool(0.1)));
        send(c, id, payload, Kind::Write { h, data }, None);
    } else {
        let max = match c.rng.gen_range(0..100) {
            0..70 => c.rng.gen_range(1..64),
            70..90 => c.rng.gen_range(64..1024),
            _ => c.rng.gen_range(1024..=4096),
        };
        let payload = request::read(&id, h, max);
        send(c, id, payload, Kind::Read { h, max }, None);
    }
}

fn invalid(c: &mut Client, stdio_local: bool) {
    let idx = c.idx;
    let id = next_id(c);
    let own = c.handles.usable();
    match c.rng.gen_range(0..13) {
        0 => {
            let path = *pick(
                &mut c.rng,
                &[
                    "../escape.txt",
                    "/etc/passwd",
                    "/data/ro/../../etc/shadow",
                    "scratch/../../outside",
                    "",
                    "a\u{0}b",
                    ".",
                    "/",
                    "/data",
                    "/data/rw",
                    "/work/proj/notes.txt",
                    "v/../../x",
                ],
            );
            let mode = *pick(&mut c.rng, &MODES);
            let payload = request::open(&id, path, mode.as_str());
            send(c, id, payload, Kind::Open { key: None, mode, host: true }, Some("policy"));
        }
        1 => {
            let path = *pick(&mut c.rng, &["/data/ro/a.txt", "/data/rw/sub/x", "/data/ro/new"]);
            let mode = *pick(&mut c.rng, &[Mode::Write, Mode::Append, Mode::ReadWrite]);
            let payload = request::open(&id, path, mode.as_str());
            send(c, id, payload, Kind::Open { key: None, mode, host: true }, Some("policy"));
        }
        2 => {
            let path = if c.rng.gen_bool(0.5) {
                format!("/data/rw/missing-{idx}-{}", c.next_req)
            } else {
                format!("v/missing-{idx}")
            };
            let payload = request::open(&id, &path, "r");
            send(
                c,
                id,
                payload,
                Kind::Open { key: None, mode: Mode::Read, host: true },
                Some("fs_semantics"),
            );
        }
        3 => {
            let h = match c.rng.gen_range(0..3) {
                0 if !c.closed.is_empty() => c.closed[c.rng.gen_range(0..c.closed.len())],
                1 if c.pending_opens == 0 => {
                    let h = c.rng.gen_range(3..64);
                    if c.handles.contains_key(&h) {
                        1_000_000
                    } else {
                        h
                    }
                }
                _ => 1_000_000 + c.rng.gen_range(0..1000),
            };
            let (payload, kind) = match c.rng.gen_range(0..3) {
                0 => (request::read(&id, h, 16), Kind::Read { h, max: 16 }),
                1 => (
                    req(&id, "write", json!({ "h": h, "data": "aGk=" })),
                    Kind::Write { h, data: b"hi".to_vec() },
                ),
                _ => (request::close(&id, h), Kind::Close { h }),
            };
            send(c, id, payload, kind, Some("must_fail"));
        }
        4 => {
            let h = c.rng.gen_range(0..3u64);
            let (payload, kind, ok) = match c.rng.gen_range(0..3) {
                0 => (request::read(&id, h, 100), Kind::Stdio { write_len: None }, h == 0),
                1 => {
                    let data = draw::bytes(&mut c.rng, 0..100);
                    let len = data.len();
                    (request::write(&id, h, &data, None), Kind::Stdio { write_len: Some(len) }, h != 0)
                }
                _ => (request::close(&id, h), Kind::Stdio { write_len: None }, true),
            };
            let must_fail = if stdio_local && ok { None } else { Some("must_fail") };
            send(c, id, payload, kind, must_fail);
        }
        5 => {
            let h = own.first().copied().unwrap_or(3);
            let max = pick(
                &mut c.rng,
                &[json!(0), json!(4097), json!(1 << 20), json!("12"), json!(-1), json!(1.5), Value::Null],
            )
            .clone();
            let payload = req(&id, "read", json!({ "h": h, "max": max }));
            send(c, id, payload, Kind::Invalid, Some("must_fail"));
        }
        6 if !own.is_empty() => {
            let h = own[c.rng.gen_range(0..own.len())];
            let mode = c.handles[&h].mode;
            let (payload, kind) = if !mode.readable() {
                (request::read(&id, h, 8), Kind::Read { h, max: 8 })
            } else if !mode.writable() {
                (
                    req(&id, "write", json!({ "h": h, "data": "aGk=" })),
                    Kind::Write { h, data: b"hi".to_vec() },
                )
            } else {
                (request::read(&id, h, 0), Kind::Invalid)
            };
            send(c, id, payload, kind, Some("must_fail"));
        }
        7 => {
            let op = *pick(&mut c.rng, &["stat", "QUOTA", "LLMCMD", "OPEN", ""]);
            let payload = req(&id, op, json!({}));
            // A nested level passes `QUOTA` on to the top, where a
            // session's broker is, and serves the client's next request
            // meanwhile.
            let passed_up = op == "QUOTA" && c.level > 0;
            send_held(c, id, payload, Kind::Invalid, Some("must_fail"), !passed_up);
        }
        8 => {
            let payload = pick(
                &mut c.rng,
                &[
                    json!({ "id": id, "op": "open", "params": [1, 2] }),
                    json!({ "id": id, "op": "open", "params": { "path": "v/x" } }),
                    json!({ "id": id, "op": "open", "params": { "mode": "r" } }),
                    json!({ "id": id, "op": "open", "params": { "path": "v/x", "mode": "x" } }),
                    json!({ "id": id, "op": "open", "params": { "path": 5, "mode": "r" } }),
                    json!({ "id": id, "op": 7 }),
                    json!({ "id": id }),
                    json!({ "id": id, "op": "close", "params": { "h": "three" } }),
                    json!({ "id": id, "op": "close" }),
                ],
            )
            .clone();
            let payload = serde_json::to_vec(&payload).unwrap_or_default();
            send(c, id, payload, Kind::Invalid, Some("must_fail"));
        }
        9 => {
            let h = own.first().copied().unwrap_or(3);
            let params = if c.rng.gen_bool(0.5) {
                json!({ "h": h, "data": "!!not base64!!" })
            } else {
                json!({ "h": h, "data": "aGk=", "final": "yes" })
            };
            send(c, id.clone(), req(&id, "write", params), Kind::Invalid, Some("must_fail"));
        }
        _ => {
            let garbage: [&[u8]; 7] = [
                &b"not json"[..],
                b"[1,2,3]",
                br#"{"id":5,"op":"read"}"#,
                br#"{"op":"read","params":{"h":3,"max":1}}"#,
                b"",
                br#"{"id":"x""#,
                b"\"just a string\"",
            ];
            let text = *pick(&mut c.rng, &garbage);
            send_raw(c, text.to_vec());
        }
    }
}
