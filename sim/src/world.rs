//! One simulated world: FS proxy machines, the client processes that talk to
//! them, the pipes between them, the host filesystem, and the checkers.
//!
//! Everything here is driven by seeded RNGs and iterates ordered maps only,
//! so a (seed, swarm) pair always yields the same run, step for step.

mod adversary;
mod base;
mod bounds;
mod broker;
mod checks;
mod client;
mod draw;
pub(crate) mod egress;
mod files;
mod floods;
mod frames;
mod fuse;
mod heap;
mod held;
mod issue;
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
    StdioRole,
};
use airlock_core::handles::ClientId;
use airlock_core::policy::{Access, Policy, Root};
use airlock_core::time::Instant;
use airlock_core::trace::{Header, TraceWriter};
use base::{at, cat, oracle_id, pick, violation, Check, Pipe};
pub use base::{Outcome, Violation};
use broker::BrokerSim;
use client::{add_private_files, Class, Client, FileModel, Kind, Loc, Queued, Sent};
use files::Files;
use frames::{frame, payloads, Frames};
use issue::{invalid, next_id, send, send_raw, MODES};
use pager::PagerSim;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use request::req;
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Queue {
    File(FileId),
    /// Path operations, in order.
    Path,
    Stdio,
}

/// An effect awaiting completion: its arrival number, id and request.
type PendingEffect = (u64, EffectId, Effect);

#[derive(Debug)]
struct Level {
    /// What this level's heap tag held before its machine was built.
    heap_base: u64,
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
    if scenario == Scenario::Egress {
        // Its planted bugs are the egress machine's own (see
        // `crate::run_egress_with_bug`).
        return egress::run(seed, swarm, None, record);
    }
    if scenario == Scenario::Fuse {
        return fuse::run(seed, swarm, bug, record);
    }
    World::new(seed, scenario, swarm, bug, record).run()
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
    /// Secrets a machine asked for while its outputs were routed: drawn
    /// as soon as they are, as the real shell does (see `feed`).
    secret_draws: Vec<(usize, EffectId)>,
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
            .enumerate()
            .map(|(level, c)| Level {
                heap_base: heap::base(level),
                m: heap::tag(level).scope(|| FsProxy::new(c)),
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
            secret_draws: Vec::new(),
            gone: BTreeSet::new(),
            closed_by_machine: BTreeSet::new(),
            departed_check: Vec::new(),
            faults: BTreeMap::new(),
            trace,
            first_violation: None,
            actions: Vec::new(),
            fixture,
            finished: false,
            broker: broker_setup.as_ref().map(|s| BrokerSim::new(s, bug, seed)),
            floods,
            policies,
            anchors,
            adversary,
            pager: pager_setup.as_ref().map(PagerSim::new),
        };
        if w.broker.is_some() {
            let redactor = broker::world_redactor(bug);
            heap::tag(0).scope(|| w.levels[0].m.set_redactor(redactor));
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

    /// Hand `input` to `level`, record it, and route what comes out.
    fn feed(&mut self, level: usize, input: Input) {
        let now = Instant::from_micros(self.now);
        if let Some(t) = &mut self.trace {
            let _ = t.input(level, now, &input);
        }
        let tag = heap::tag(level);
        if let Input::EffectDone { result: EffectResult::Data { data, .. }, .. } = &input {
            airlock_core::heapcount::retag(data, tag);
        }
        tag.scope(|| self.levels[level].m.handle(now, input));
        while let Some(out) = tag.scope(|| self.levels[level].m.poll_output()) {
            heap::hand_out(&out);
            if let Some(t) = &mut self.trace {
                let _ = t.output(level, &out);
            }
            if let Err(v) = self.route(level, out) {
                self.first_violation.get_or_insert(v);
            }
        }
        // Drawn at once, never queued with the file effects: no fault
        // touches them, and no world's random numbers move for them.
        for (level, id) in std::mem::take(&mut self.secret_draws) {
            // Named by the level and the effect, so each differs.
            let hex = format!("{level:032x}{:032x}", id.0);
            let result = match airlock_core::fsproxy::Secret::parse(hex.as_bytes()) {
                Some(secret) => EffectResult::Secret { secret },
                None => EffectResult::Failed { kind: FsErrorKind::Other, message: "not hex".into() },
            };
            self.feed(level, Input::EffectDone { id, result });
        }
    }

    fn client_at(&self, level: usize, client: ClientId) -> Option<usize> {
        self.clients.iter().position(|c| c.level == level && c.id == client)
    }

    fn route(&mut self, level: usize, out: Output) -> Check {
        match out {
            // These worlds mount nothing (the `fuse` world does).
            Output::FuseReply { client, .. } => {
                Err(violation("policy", format!("level {level} replied to a mount {client} never made")))
            }
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
            Output::Dismiss => Err(at(
                violation("no_socket", "dismissed a connection nobody accepted".into()),
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
                    Effect::Path { .. } => {
                        if level != self.store {
                            return Err(violation(
                                "policy",
                                format!("level {level} forwards upstream yet asked for a path effect"),
                            ));
                        }
                        Queue::Path
                    }
                    Effect::ReadAt { .. }
                    | Effect::WriteAt { .. }
                    | Effect::Fstat { .. }
                    | Effect::Truncate { .. }
                    | Effect::Readlink { .. }
                    | Effect::Backing { .. }
                    | Effect::Unback { .. } => {
                        return Err(violation(
                            "policy",
                            format!("level {level} asked for a mount's effect, and no mount was made"),
                        ));
                    }
                    Effect::DrawSecret => {
                        self.secret_draws.push((level, id));
                        return Ok(());
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
                if let Effect::Path { op, .. } = &effect {
                    let mode = if op.changes() { Mode::Write } else { Mode::Read };
                    for p in op.paths() {
                        self.check_confined(p, mode, false)?;
                    }
                }
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
            Output::BudgetPassed { initial, charged } => self.on_budget_passed(initial, charged),
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
            // Drawn when asked for (see `feed`), never queued.
            Effect::DrawSecret => return Err(violation("policy", "a queued secret draw".into())),
            Effect::Open { file, root, rel, mode, scope, .. } => {
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
                        self.check_guarded(&p, mode)?;
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
            Effect::Path { .. } if self.fires(FaultKind::FsError) => {
                self.count(FaultKind::FsError);
                EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
            }
            Effect::Path { op, scope } => {
                let anchors = std::mem::take(&mut self.anchors);
                let done = self.fs.path(&op, &anchors, &scope);
                self.anchors = anchors;
                // Invariant 10 on what the operation changed, where it
                // landed after resolution; and no root ever moves.
                for p in self.fs.take_touched() {
                    self.check_confined(&p, Mode::Write, true)?;
                }
                if let Some(a) = self.anchors.iter().find(|a| !self.fs.is_dir(a)) {
                    return Err(violation(
                        "roots_stay",
                        format!("{} ({op:?}) left root directory {} gone", op.name(), a.display()),
                    ));
                }
                EffectResult::of_path(done)
            }
            // Refused when routed.
            Effect::ReadAt { .. }
            | Effect::WriteAt { .. }
            | Effect::Fstat { .. }
            | Effect::Truncate { .. }
            | Effect::Readlink { .. }
            | Effect::Backing { .. }
            | Effect::Unback { .. } => {
                return Err(violation("policy", "a mount's effect in a world without mounts".into()))
            }
        };
        self.feed(level, Input::EffectDone { id, result });
        Ok(())
    }
}
