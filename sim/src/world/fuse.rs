//! The `fuse` scenario: the FS proxy machine serving one mount, driven by
//! a hostile kernel client (every request the protocol has, in any order,
//! for nodes it holds and nodes it never got: interleaved lookups and
//! opens, renames over open files, unlinks of open files, forgets out of
//! order and past what it holds, interrupts, garbage), with an attacker
//! swapping names for symlinks inside the root between steps, and the
//! machine's effects run on an inode tree by the core's own walks
//! ([`tree`]), delivered late and, with `effect_reorder`, out of order.
//! The swarm's other faults, as a mount meets them: `fs_error` fails host
//! opens and reads, `clock_jump` moves time on, `cancel_storm` is a burst
//! of interrupts, `non_utf8_frame` a name that is not UTF-8, `huge_names` a
//! lookup past `NAME_MAX`, and `eof` / `process_death` the kernel's end
//! going away mid-flight (after which every file must still be closed).
//!
//! Checked after every step:
//! - `no_secret_served`: no reply carries a byte of a file outside the
//!   roots, nor a listing one of their names;
//! - `no_change_outside_policy`: nothing outside the read-write root (the
//!   secrets, the read-only root beneath it) ever changes;
//! - `one_reply`: every request is answered at most once, forgets and
//!   interrupts never, and no reply names a request never sent;
//! - `bounded`: the mount's pending requests and nodes stay under their
//!   limits.
//!
//! And at the end, once the kernel gave back everything it held:
//! `open_released` (no handle in the table, no file open on the tree, no
//! backing file registered: passthrough is agreed, and a registration
//! fails as an injected error may), and `lookups_balance` (the node table
//! holds the root alone, and counted as many lookups given back as it
//! handed out, as many as the kernel got).

mod tree;

use super::base::{violation, Outcome, Violation};
use crate::swarm::{FaultKind, Rates, Swarm, PPM};
use crate::Failure;
use airlock_core::fsproxy::{
    Config, Effect, EffectId, EffectResult, FileId, FsErrorKind, FsProxy, Input, Output, PlantedBug,
    StdioRole,
};
use airlock_core::fuse::abi::{self, oflags};
use airlock_core::fuse::codec::{self, Header, InitIn, Name, Op, Reply, Request, SetattrIn};
use airlock_core::fuse::{self as fuse_core};
use airlock_core::handles::ClientId;
use airlock_core::pathops;
use airlock_core::policy::{Access, Policy, Root, RootId};
use airlock_core::resolve;
use airlock_core::time::Instant;
use airlock_core::trace::{Header as TraceHeader, TraceWriter};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use tree::{Body, FileOp, Tree, Walk};

const MOUNT: ClientId = ClientId(1 << 20);
const ROOT: &str = "/w/proj";
const READ_ONLY: &str = "/w/proj/ro";
const SECRETS: &str = "/w/secret";
const SECRET: &[u8] = b"SECRET-";
/// Names the kernel asks for: the tree's, the secrets', and new ones.
const NAMES: &[&str] =
    &["a.txt", "b.txt", "src", "d", "e.txt", "ro", "keep.txt", "up", "rolink", "s.txt", "new", "x"];
/// Names it makes: never a secret's, so a secret's name in a listing is
/// one that came from outside the roots.
const NEW_NAMES: &[&str] = &["a.txt", "b.txt", "src", "d", "e.txt", "keep.txt", "new", "x"];
/// A name that is not UTF-8: FUSE names are bytes.
const NON_UTF8_NAME: &[u8] = b"n\xff\xfe";
/// Interrupts in one storm, at most.
const INTERRUPT_STORM_MAX: usize = 12;
/// How far past `NAME_MAX` a huge name may go.
const HUGE_NAME_EXTRA: usize = 300;
/// How far a clock jump goes, in microseconds (a second to an hour).
const CLOCK_JUMP_MICROS: std::ops::Range<u64> = 1_000_000..3_600_000_000;
/// Steps after the last request before the world must have drained.
const WIND_DOWN_STEPS: u64 = 20_000;

fn policy() -> Policy {
    Policy::new(
        ROOT.into(),
        [
            Root { path: ROOT.into(), access: Access::ReadWrite },
            Root { path: READ_ONLY.into(), access: Access::ReadOnly },
        ],
    )
}

fn name(s: &str) -> Name {
    name_bytes(s.as_bytes())
}

fn name_bytes(b: &[u8]) -> Name {
    Name::new(b).unwrap_or_else(|_| Name::new(b"x").expect("a name"))
}

/// The tree a world starts with.
fn initial_tree() -> Tree {
    let mut t = Tree::new();
    for (p, c) in [
        ("/w/proj/a.txt", &b"alpha"[..]),
        ("/w/proj/b.txt", b"bravo"),
        ("/w/proj/src/c.txt", b"charlie"),
        ("/w/proj/src/d/e.txt", b"echo"),
        ("/w/proj/ro/keep.txt", b"keep"),
        ("/w/secret/s.txt", b"SECRET-1"),
        ("/w/secret/d/e.txt", b"SECRET-2"),
    ] {
        t.put(Path::new(p), Body::File(c.to_vec()));
    }
    t.put(Path::new("/w/proj/up"), Body::Link("../secret".into()));
    t.put(Path::new("/w/proj/rolink"), Body::Link("ro".into()));
    t
}

/// What a request was, for reading its reply and for the kernel's state.
#[derive(Debug)]
enum Sent {
    Lookup,
    Create,
    Open {
        node: u64,
    },
    Opendir {
        node: u64,
    },
    Readdir,
    Read,
    Release {
        fh: u64,
    },
    Releasedir {
        fh: u64,
    },
    /// A lookup of a name too long to be one: answered with an error.
    HugeLookup,
    Other,
}

/// What the hostile kernel holds.
#[derive(Debug, Default)]
struct Kernel {
    /// Lookups held, by node.
    nodes: BTreeMap<u64, u64>,
    /// Nodes seen as directories.
    dirs: BTreeMap<u64, bool>,
    files: BTreeMap<u64, u64>,
    dir_handles: BTreeMap<u64, u64>,
    /// Lookups received in all.
    received: u64,
}

struct FuseWorld {
    rng: ChaCha8Rng,
    rates: Rates,
    faults: BTreeMap<FaultKind, u64>,
    m: FsProxy,
    tree: Tree,
    anchors: Vec<PathBuf>,
    effects: VecDeque<(EffectId, Effect)>,
    /// What the machine gave back, taken (and recorded) as soon as it was
    /// handed an input, so the trace holds each input's outputs right
    /// after it, as replay expects; routed by [`FuseWorld::drain`].
    outbox: VecDeque<Output>,
    kernel: Kernel,
    /// Backing files registered (passthrough) and not yet dropped, each
    /// with the file it stands for.
    backing: BTreeMap<u32, FileId>,
    next_backing: u32,
    outstanding: BTreeMap<u64, (u32, Sent)>,
    next_unique: u64,
    ops_left: usize,
    step: u64,
    now: u64,
    trace: Option<TraceWriter<Vec<u8>>>,
    /// What lies outside the read-write root, as it must stay.
    kept: BTreeMap<PathBuf, Vec<u8>>,
    wind_down_from: Option<u64>,
    ended: bool,
    /// The kernel's end went away (`eof`, `process_death`): the machine
    /// owes it nothing more, and must still close every file it opened.
    gone: bool,
    max_pending: usize,
    max_nodes: usize,
    max_open: usize,
    /// Steps after which the kernel sends nothing new and winds down
    /// (`--steps`, and what a shrunk swarm keeps).
    max_steps: u64,
}

/// `record`: keep a trace, whose header notes `failure` when given.
pub(super) fn run(
    seed: u64,
    swarm: Swarm,
    bug: Option<PlantedBug>,
    record: Option<Option<Value>>,
) -> Outcome {
    let mut w = FuseWorld::new(seed, &swarm, bug, record);
    let mut failure: Option<Violation> = None;
    // Past the mount's end too, until the closes it left behind (of the
    // files a departed kernel held) are carried out.
    while !w.ended || !w.effects.is_empty() {
        w.step += 1;
        if let Err(v) = w.step_once().and_then(|()| w.check()) {
            failure = Some(v);
            break;
        }
    }
    if failure.is_none() {
        if let Err(v) = w.check_end() {
            failure = Some(v);
        }
    }
    let trace = w.trace.take().and_then(|t| t.into_inner().ok());
    Outcome {
        steps: w.step,
        now: w.now,
        faults: w.faults,
        failure: failure.map(|v| Failure {
            invariant: v.invariant.to_owned(),
            step: w.step,
            message: v.message,
            level: None,
            client: None,
        }),
        trace,
    }
}

impl FuseWorld {
    fn new(seed: u64, swarm: &Swarm, bug: Option<PlantedBug>, record: Option<Option<Value>>) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6675_7365_0000_0000);
        let mut config = Config::new(policy(), StdioRole::Reject);
        config.planted_bug = bug;
        config.max_open_handles = swarm.max_open_handles;
        config.max_list_entries = 4;
        config.fuse.max_pending = swarm.pipeline.max(1) * 2;
        config.fuse.max_nodes = if swarm.max_open_handles < 16 { 8 } else { 64 };
        config.audit = true;
        let (max_pending, max_nodes) = (config.fuse.max_pending, config.fuse.max_nodes);
        let trace = record.map(|note| {
            let mut header = TraceHeader::fsproxy(config.clone());
            header.seed = Some(seed);
            let mut meta = json!({ "scenario": "fuse", "swarm": swarm });
            if let Some(n) = note {
                meta["failure"] = n;
            }
            header.meta = Some(meta);
            TraceWriter::new(Vec::new(), &header).expect("a trace in memory")
        });
        let tree = initial_tree();
        let mut kept = tree.files_under(Path::new(SECRETS));
        kept.extend(tree.files_under(Path::new(READ_ONLY)));
        let mut w = FuseWorld {
            rng,
            rates: swarm.rates(),
            faults: BTreeMap::new(),
            m: FsProxy::new(config),
            tree,
            anchors: vec![ROOT.into(), READ_ONLY.into()],
            effects: VecDeque::new(),
            outbox: VecDeque::new(),
            kernel: Kernel::default(),
            backing: BTreeMap::new(),
            next_backing: 1,
            outstanding: BTreeMap::new(),
            next_unique: 1,
            ops_left: swarm.ops_per_client * swarm.clients.max(1),
            step: 0,
            now: 0,
            trace,
            kept,
            wind_down_from: None,
            ended: false,
            gone: false,
            max_pending,
            max_nodes,
            max_open: swarm.max_open_handles,
            max_steps: swarm.max_steps as u64,
        };
        w.kernel.dirs.insert(abi::ROOT_ID, true);
        w.feed(Input::FuseMounted {
            client: MOUNT,
            root: RootId(0),
            uid: 1000,
            gid: 1000,
            passthrough: true,
        });
        let init = InitIn { major: 7, minor: 41, max_readahead: 131072, flags: u64::MAX };
        w.send(abi::ROOT_ID, Op::Init(init), Sent::Other);
        w
    }

    fn fires(&mut self, kind: FaultKind) -> bool {
        let rate = self.rates.get(kind);
        let hit = rate > 0 && self.rng.gen_range(0..PPM) < rate;
        if hit {
            *self.faults.entry(kind).or_default() += 1;
        }
        hit
    }

    /// Hand `input` to the machine and take what it gives back: several
    /// inputs may go in before the world routes anything, and the trace
    /// must still hold each one's outputs before the next input.
    fn feed(&mut self, input: Input) {
        let now = Instant::from_micros(self.now);
        if let Some(t) = &mut self.trace {
            let _ = t.input(0, now, &input);
        }
        self.m.handle(now, input);
        while let Some(out) = self.m.poll_output() {
            if let Some(t) = &mut self.trace {
                let _ = t.output(0, &out);
            }
            self.outbox.push_back(out);
        }
    }

    fn send(&mut self, node: u64, op: Op, sent: Sent) {
        let unique = self.next_unique;
        self.next_unique += 1;
        let header = Header {
            opcode: codec::opcode_of(&op, 9999),
            unique,
            nodeid: node,
            uid: 1000,
            gid: 1000,
            pid: 7,
        };
        if !op.unanswered() {
            self.outstanding.insert(unique, (header.opcode, sent));
        }
        let data = codec::encode_request(&Request { header, op });
        self.feed(Input::Fuse { client: MOUNT, data });
    }

    fn step_once(&mut self) -> Result<(), Violation> {
        self.now += self.rng.gen_range(1..200);
        if self.fires(FaultKind::ClockJump) {
            self.now += self.rng.gen_range(CLOCK_JUMP_MICROS);
        }
        self.drain()?;
        if self.step > self.max_steps {
            self.ops_left = 0;
        }
        let winding = self.ops_left == 0;
        if winding && self.wind_down_from.is_none() {
            self.wind_down_from = Some(self.step);
        }
        if !self.effects.is_empty() && (winding || self.rng.gen_bool(0.5)) {
            return self.deliver();
        }
        if winding {
            return self.wind_down();
        }
        self.ops_left -= 1;
        if self.fires(FaultKind::Eof) {
            return self.kernel_gone(Input::Eof { client: MOUNT });
        }
        if self.fires(FaultKind::ProcessDeath) {
            return self.kernel_gone(Input::Died { client: MOUNT });
        }
        if self.fires(FaultKind::SymlinkSwap) {
            self.swap();
        }
        if self.fires(FaultKind::CancelStorm) {
            self.interrupt_storm();
            return self.drain();
        }
        if self.fires(FaultKind::HugeNames) {
            self.huge_lookup();
            return self.drain();
        }
        if self.fires(FaultKind::CorruptFrame) {
            let len = self.rng.gen_range(0..80);
            let mut data: Vec<u8> = (0..len).map(|_| self.rng.gen()).collect();
            if data.len() >= 16 && self.rng.gen_bool(0.5) {
                data[..4].copy_from_slice(&(len as u32).to_le_bytes());
            }
            if data.len() >= 16 {
                // Its own range of uniques: what the machine answers it
                // with is expected, and never taken for another's answer.
                let unique = 1u64 << 63 | self.next_unique;
                self.next_unique += 1;
                data[8..16].copy_from_slice(&unique.to_le_bytes());
                let answered = match codec::parse_request(&data) {
                    Ok(r) => !r.op.unanswered(),
                    Err(e) => e.unique.is_some(),
                };
                if answered {
                    let op = codec::parse_request(&data).map_or(0, |r| r.header.opcode);
                    self.outstanding.insert(unique, (op, Sent::Other));
                }
            }
            self.feed(Input::Fuse { client: MOUNT, data });
            return self.drain();
        }
        self.request();
        self.drain()
    }

    /// A node the kernel holds (the root when none, or, now and then,
    /// one it never got).
    fn node(&mut self, dir: bool) -> u64 {
        if self.rng.gen_ratio(1, 40) {
            return self.rng.gen_range(0..self.next_unique + 4);
        }
        let held: Vec<u64> = self
            .kernel
            .nodes
            .keys()
            .copied()
            .filter(|n| !dir || self.kernel.dirs.get(n).copied().unwrap_or(false))
            .collect();
        if held.is_empty() || self.rng.gen_ratio(1, 4) {
            abi::ROOT_ID
        } else {
            held[self.rng.gen_range(0..held.len())]
        }
    }

    fn pick_name(&mut self) -> Name {
        if self.fires(FaultKind::NonUtf8Frame) {
            return name_bytes(NON_UTF8_NAME);
        }
        name(NAMES[self.rng.gen_range(0..NAMES.len())])
    }

    fn new_name(&mut self) -> Name {
        if self.fires(FaultKind::NonUtf8Frame) {
            return name_bytes(NON_UTF8_NAME);
        }
        name(NEW_NAMES[self.rng.gen_range(0..NEW_NAMES.len())])
    }

    /// The kernel's end goes away mid-flight (a lazy unmount, a crash):
    /// every request still waiting is owed nothing, and the world winds
    /// down by delivering the effects left until the mount ends.
    fn kernel_gone(&mut self, input: Input) -> Result<(), Violation> {
        self.gone = true;
        self.ops_left = 0;
        self.wind_down_from = Some(self.step);
        self.outstanding.clear();
        self.kernel = Kernel::default();
        self.feed(input);
        self.drain()
    }

    /// A burst of interrupts, for requests waiting and for ones never
    /// sent: none is answered, and none may cost a waiting one its reply.
    fn interrupt_storm(&mut self) {
        let waiting: Vec<u64> = self.outstanding.keys().copied().collect();
        for _ in 0..self.rng.gen_range(2..=INTERRUPT_STORM_MAX) {
            let unique = if waiting.is_empty() || self.rng.gen_bool(0.3) {
                self.rng.gen_range(0..self.next_unique + 2)
            } else {
                waiting[self.rng.gen_range(0..waiting.len())]
            };
            self.send(0, Op::Interrupt { unique }, Sent::Other);
        }
    }

    /// A lookup of a name past `NAME_MAX`, which the codec never builds:
    /// the frame is patched by hand, and must be refused with an error.
    fn huge_lookup(&mut self) {
        let dir = self.node(true);
        let unique = self.next_unique;
        self.next_unique += 1;
        let header =
            Header { opcode: abi::opcode::LOOKUP, unique, nodeid: dir, uid: 1000, gid: 1000, pid: 7 };
        let mut data = codec::encode_request(&Request { header, op: Op::Lookup { name: name("x") } });
        data.truncate(abi::IN_HEADER_LEN);
        data.extend(std::iter::repeat_n(b'n', abi::NAME_MAX + 1 + self.rng.gen_range(0..HUGE_NAME_EXTRA)));
        data.push(0);
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        data[..4].copy_from_slice(&len.to_le_bytes());
        self.outstanding.insert(unique, (abi::opcode::LOOKUP, Sent::HugeLookup));
        self.feed(Input::Fuse { client: MOUNT, data });
    }

    fn fh(&mut self) -> u64 {
        let fhs: Vec<u64> = self.kernel.files.keys().copied().collect();
        if fhs.is_empty() || self.rng.gen_ratio(1, 30) {
            self.rng.gen_range(0..8)
        } else {
            fhs[self.rng.gen_range(0..fhs.len())]
        }
    }

    fn request(&mut self) {
        let flags = [oflags::RDONLY, oflags::WRONLY | oflags::TRUNC, oflags::RDWR, oflags::WRONLY]
            [self.rng.gen_range(0..4)];
        match self.rng.gen_range(0..22) {
            0..=4 => {
                let (dir, n) = (self.node(true), self.pick_name());
                self.send(dir, Op::Lookup { name: n }, Sent::Lookup);
            }
            5 => {
                let n = self.node(false);
                let fh = self.rng.gen_bool(0.3).then(|| self.fh());
                self.send(n, Op::Getattr { fh }, Sent::Other);
            }
            6 | 7 => {
                let n = self.node(false);
                self.send(n, Op::Open { flags }, Sent::Open { node: n });
            }
            8 => {
                let (dir, n) = (self.node(true), self.new_name());
                let excl = if self.rng.gen_bool(0.3) { oflags::EXCL } else { 0 };
                let op =
                    Op::Create { name: n, flags: flags | oflags::CREAT | excl, mode: 0o644, umask: 0o022 };
                self.send(dir, op, Sent::Create);
            }
            9 | 10 => {
                let fh = self.fh();
                let (offset, size) = (self.rng.gen_range(0..16), self.rng.gen_range(1..64));
                self.send(abi::ROOT_ID, Op::Read { fh, offset, size }, Sent::Read);
            }
            11 => {
                let fh = self.fh();
                let data = format!("w{}", self.step).into_bytes();
                let offset = self.rng.gen_range(0..8);
                self.send(abi::ROOT_ID, Op::Write { fh, offset, data }, Sent::Other);
            }
            12 => {
                let n = self.node(false);
                let mut s = SetattrIn::default();
                match self.rng.gen_range(0..3) {
                    0 => {
                        s.valid = abi::fattr::SIZE;
                        s.size = self.rng.gen_range(0..4);
                    }
                    1 => {
                        s.valid = abi::fattr::SIZE | abi::fattr::FH;
                        s.fh = self.fh();
                    }
                    _ => {
                        s.valid = abi::fattr::MODE | abi::fattr::MTIME_NOW | abi::fattr::MTIME;
                        s.mode = 0o600;
                    }
                }
                self.send(n, Op::Setattr(s), Sent::Other);
            }
            13 => {
                let (dir, n) = (self.node(true), self.new_name());
                self.send(dir, Op::Mkdir { name: n, mode: 0o755, umask: 0 }, Sent::Lookup);
            }
            14 => {
                let (dir, n) = (self.node(true), self.pick_name());
                let op = if self.rng.gen_bool(0.5) { Op::Unlink { name: n } } else { Op::Rmdir { name: n } };
                self.send(dir, op, Sent::Other);
            }
            15 => {
                let (a, an, b, bn) = (self.node(true), self.pick_name(), self.node(true), self.new_name());
                let flags = [0, 0, abi::RENAME_NOREPLACE, abi::RENAME_EXCHANGE][self.rng.gen_range(0..4)];
                self.send(a, Op::Rename { newdir: b, name: an, newname: bn, flags }, Sent::Other);
            }
            16 => {
                let n = self.node(true);
                self.send(n, Op::Opendir { flags: 0 }, Sent::Opendir { node: n });
            }
            17 => {
                let fhs: Vec<u64> = self.kernel.dir_handles.keys().copied().collect();
                let fh = if fhs.is_empty() { 1 << 62 } else { fhs[self.rng.gen_range(0..fhs.len())] };
                let offset = [0, 1, 2, 3, 4, 7][self.rng.gen_range(0..6)];
                self.send(abi::ROOT_ID, Op::Readdir { fh, offset, size: 200, plus: false }, Sent::Readdir);
                if self.rng.gen_bool(0.3) && !fhs.is_empty() {
                    self.kernel.dir_handles.remove(&fh);
                    self.send(abi::ROOT_ID, Op::Releasedir { fh }, Sent::Releasedir { fh });
                }
            }
            18 => {
                let fh = self.fh();
                self.kernel.files.remove(&fh);
                self.send(abi::ROOT_ID, Op::Release { fh }, Sent::Release { fh });
            }
            19 => self.forget_some(),
            20 => {
                let unique = self.rng.gen_range(0..self.next_unique + 2);
                self.send(0, Op::Interrupt { unique }, Sent::Other);
            }
            _ => {
                let n = self.node(false);
                let op = match self.rng.gen_range(0..4) {
                    0 => Op::Readlink,
                    1 => Op::Access { mask: [0, 2, 4, 1][self.rng.gen_range(0..4)] },
                    2 => Op::Statfs,
                    _ => Op::Symlink { name: self.pick_name(), target: b"/w/secret".to_vec() },
                };
                self.send(n, op, Sent::Other);
            }
        }
    }

    /// Give back lookups: some of one node, in a batch, or more than held.
    fn forget_some(&mut self) {
        let held: Vec<(u64, u64)> = self.kernel.nodes.iter().map(|(n, c)| (*n, *c)).collect();
        if held.is_empty() {
            return;
        }
        let (n, count) = held[self.rng.gen_range(0..held.len())];
        let give = self.rng.gen_range(1..=count);
        self.release_lookups(n, give);
        if self.rng.gen_bool(0.5) {
            self.send(n, Op::Forget { nlookup: give }, Sent::Other);
        } else {
            self.send(0, Op::BatchForget { forgets: vec![(n, give)] }, Sent::Other);
        }
    }

    fn release_lookups(&mut self, n: u64, give: u64) {
        if let Some(c) = self.kernel.nodes.get_mut(&n) {
            *c -= give.min(*c);
            if *c == 0 {
                self.kernel.nodes.remove(&n);
            }
        }
    }

    /// The attacker: a name inside the read-write root becomes a symlink
    /// out of it, into the read-only root, or a file or directory again.
    fn swap(&mut self) {
        let at = [
            "/w/proj/a.txt",
            "/w/proj/src",
            "/w/proj/src/d",
            "/w/proj/new",
            "/w/proj/x",
            "/w/proj/src/c.txt",
        ][self.rng.gen_range(0..6)];
        let body = match self.rng.gen_range(0..5) {
            0 => Body::Link("/w/secret".into()),
            1 => Body::Link("../../secret/s.txt".into()),
            2 => Body::Link("ro".into()),
            3 => Body::File(b"swapped".to_vec()),
            _ => Body::Dir(BTreeMap::new()),
        };
        self.tree.put(Path::new(at), body);
    }

    /// Carry out the oldest effect (any one with `effect_reorder`).
    fn deliver(&mut self) -> Result<(), Violation> {
        let i = if self.effects.len() > 1 && self.fires(FaultKind::EffectReorder) {
            self.rng.gen_range(0..self.effects.len())
        } else {
            0
        };
        let Some((id, effect)) = self.effects.remove(i) else { return Ok(()) };
        let result = self.run_effect(effect)?;
        self.feed(Input::EffectDone { id, result });
        self.drain()
    }

    fn run_effect(&mut self, effect: Effect) -> Result<EffectResult, Violation> {
        let fail = |r: resolve::Refusal| EffectResult::Failed { kind: r.kind(), message: r.to_string() };
        self.tree.now = self.now as i64;
        let anchors = self.anchors.clone();
        Ok(match effect {
            Effect::Open { how, .. }
                if !how.as_ref().is_some_and(|h| h.truncate) && self.fires(FaultKind::FsError) =>
            {
                EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
            }
            Effect::ReadAt { .. } if self.fires(FaultKind::FsError) => {
                EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
            }
            Effect::Open { file, root, rel, mode, scope, how } => {
                let base = policy()
                    .root(root)
                    .map(|r| r.path.clone())
                    .ok_or_else(|| violation("policy", format!("unknown root {root:?}")))?;
                let path = if rel.as_os_str().is_empty() { base } else { base.join(rel) };
                let mut walk = Walk { tree: &mut self.tree, anchors: &anchors };
                match resolve::open_how(&mut walk, &anchors, &[], &path, mode, how.as_ref(), &scope) {
                    Ok((ino, _)) => {
                        self.tree.opened(file, ino, mode).map_err(|e| violation("fs_misuse", e))?;
                        EffectResult::Opened
                    }
                    Err(r) => fail(r),
                }
            }
            Effect::Path { op, scope } => {
                let mut walk = Walk { tree: &mut self.tree, anchors: &anchors };
                EffectResult::of_path(pathops::perform(&mut walk, &anchors, &[], &scope, &op))
            }
            Effect::Readlink { path, scope } => {
                let mut walk = Walk { tree: &mut self.tree, anchors: &anchors };
                match fuse_core::readlink::readlink(&mut walk, &anchors, &[], &scope, &path) {
                    Ok(target) => EffectResult::Target { target },
                    Err(r) => fail(r),
                }
            }
            Effect::ReadAt { file, offset, max } => self.tree.file_effect(file, FileOp::Read { offset, max }),
            Effect::WriteAt { file, offset, data } => {
                self.tree.file_effect(file, FileOp::Write { offset, bytes: data })
            }
            Effect::Truncate { file, size } => self.tree.file_effect(file, FileOp::Truncate { size }),
            Effect::Fstat { file } => self.tree.file_effect(file, FileOp::Stat),
            Effect::Close { file } => self.tree.close(file).map_err(|e| violation("fs_misuse", e))?,
            Effect::Backing { file, .. } => {
                if self.fires(FaultKind::FsError) {
                    EffectResult::Failed { kind: FsErrorKind::Other, message: "injected I/O error".into() }
                } else if let EffectResult::Failed { message, .. } = self.tree.file_effect(file, FileOp::Stat)
                {
                    return Err(violation(
                        "fs_misuse",
                        format!("a backing file for {file:?}, not open: {message}"),
                    ));
                } else {
                    let id = self.next_backing;
                    self.next_backing += 1;
                    self.backing.insert(id, file);
                    EffectResult::Backing { id }
                }
            }
            Effect::Unback { id, .. } => match self.backing.remove(&id) {
                Some(_) => EffectResult::Done,
                None => {
                    return Err(violation("fs_misuse", format!("backing id {id} dropped, never registered")))
                }
            },
            other => {
                return Err(violation("policy", format!("a mount asked for {other:?}")));
            }
        })
    }

    /// Route the machine's outputs.
    fn drain(&mut self) -> Result<(), Violation> {
        while let Some(out) = self.outbox.pop_front() {
            match out {
                Output::Effect { id, effect } => self.effects.push_back((id, effect)),
                Output::FuseReply { client, data } => {
                    if client != MOUNT {
                        return Err(violation("one_reply", format!("a reply to {client}, no mount")));
                    }
                    self.reply(&data)?;
                }
                Output::Audit { .. } => {}
                Output::Close { client } if client == MOUNT => self.ended = self.wind_down_from.is_some(),
                other => return Err(violation("policy", format!("unexpected output {other:?}"))),
            }
        }
        Ok(())
    }

    fn reply(&mut self, data: &[u8]) -> Result<(), Violation> {
        let unique = u64::from_le_bytes(data.get(8..16).and_then(|b| b.try_into().ok()).unwrap_or_default());
        let Some((op, sent)) = self.outstanding.remove(&unique) else {
            return Err(violation("one_reply", format!("a reply to request {unique}, which is not waiting")));
        };
        let decoded = codec::decode_reply(op, data)
            .map_err(|e| violation("one_reply", format!("reply to opcode {op} unreadable: {e}")))?;
        if data.windows(SECRET.len()).any(|w| w == SECRET) {
            return Err(violation(
                "no_secret_served",
                format!("a reply to opcode {op} carries a secret: {decoded:?}"),
            ));
        }
        match (sent, decoded.reply) {
            (Sent::HugeLookup, Reply::Error(_)) => {}
            (Sent::HugeLookup, other) => {
                return Err(violation("one_reply", format!("a name past NAME_MAX was looked up: {other:?}")));
            }
            (Sent::Lookup, Reply::Entry(e)) if e.nodeid != 0 => self.looked_up(e.nodeid, e.attr.is_dir()),
            (Sent::Create, Reply::Create(e, o)) => {
                self.looked_up(e.nodeid, false);
                self.kernel.files.insert(o.fh, e.nodeid);
            }
            (Sent::Open { node }, Reply::Open(o)) => {
                self.kernel.files.insert(o.fh, node);
            }
            (Sent::Opendir { node }, Reply::Open(o)) => {
                self.kernel.dir_handles.insert(o.fh, node);
            }
            (Sent::Readdir, Reply::Data(d)) => {
                let entries = codec::decode_dir(&d)
                    .map_err(|e| violation("one_reply", format!("listing unreadable: {e}")))?;
                if let Some(e) = entries.iter().find(|e| e.name == b"s.txt") {
                    return Err(violation(
                        "no_secret_served",
                        format!("a listing shows a secret's name: {e:?}"),
                    ));
                }
            }
            (Sent::Release { fh } | Sent::Releasedir { fh }, _) => {
                self.kernel.files.remove(&fh);
                self.kernel.dir_handles.remove(&fh);
            }
            _ => {}
        }
        Ok(())
    }

    fn looked_up(&mut self, node: u64, dir: bool) {
        *self.kernel.nodes.entry(node).or_default() += 1;
        self.kernel.dirs.insert(node, dir);
        self.kernel.received += 1;
    }

    /// The end: every handle and directory released, every lookup given
    /// back, then the mount's end.
    fn wind_down(&mut self) -> Result<(), Violation> {
        let since = self.step - self.wind_down_from.unwrap_or(self.step);
        if since > WIND_DOWN_STEPS {
            return Err(violation("liveness", format!("not drained {since} steps after the last request")));
        }
        if self.gone {
            // Every effect is done (or this would deliver one), so the
            // mount had all it needs to end.
            return Err(violation("liveness", "the mount did not end once its kernel was gone".into()));
        }
        if !self.outstanding.is_empty() && self.effects.is_empty() {
            // Answered by now or never: the machine owes nothing more.
            let left: Vec<u64> = self.outstanding.keys().copied().collect();
            return Err(violation("one_reply", format!("requests never answered: {left:?}")));
        }
        if let Some((&fh, _)) = self.kernel.files.iter().next() {
            self.kernel.files.remove(&fh);
            self.send(abi::ROOT_ID, Op::Release { fh }, Sent::Release { fh });
        } else if let Some((&fh, _)) = self.kernel.dir_handles.iter().next() {
            self.kernel.dir_handles.remove(&fh);
            self.send(abi::ROOT_ID, Op::Releasedir { fh }, Sent::Releasedir { fh });
        } else if !self.kernel.nodes.is_empty() {
            let forgets: Vec<(u64, u64)> = std::mem::take(&mut self.kernel.nodes).into_iter().collect();
            self.send(0, Op::BatchForget { forgets }, Sent::Other);
        } else if self.outstanding.is_empty() && self.effects.is_empty() {
            self.check_released()?;
            self.send(abi::ROOT_ID, Op::Destroy, Sent::Other);
            self.drain()?;
            if !self.ended {
                return Err(violation("liveness", "the mount did not end after DESTROY".into()));
            }
        }
        self.drain()
    }

    /// Everything the kernel held is given back: nothing may be left.
    fn check_released(&self) -> Result<(), Violation> {
        if !self.backing.is_empty() {
            return Err(violation(
                "open_released",
                format!("backing files still registered once every file was released: {:?}", self.backing),
            ));
        }
        if self.m.open_handles() != 0 || self.tree.open_count() != 0 {
            return Err(violation(
                "open_released",
                format!(
                    "{} handles, {} files open once every file was released",
                    self.m.open_handles(),
                    self.tree.open_count()
                ),
            ));
        }
        let Some((nodes, (given, back))) = self.m.fuse_nodes(MOUNT) else {
            return Err(violation("lookups_balance", "the mount is gone before DESTROY".into()));
        };
        if nodes != 1 || given != back || given != self.kernel.received {
            return Err(violation(
                "lookups_balance",
                format!(
                    "{nodes} nodes held, {given} lookups handed out, {back} given back, the kernel got {}",
                    self.kernel.received
                ),
            ));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), Violation> {
        let mut now = self.tree.files_under(Path::new(SECRETS));
        now.extend(self.tree.files_under(Path::new(READ_ONLY)));
        if now != self.kept {
            return Err(violation(
                "no_change_outside_policy",
                "a file outside the read-write root changed".into(),
            ));
        }
        if let Some((nodes, _)) = self.m.fuse_nodes(MOUNT) {
            if nodes > self.max_nodes {
                return Err(violation(
                    "bounded",
                    format!("{nodes} nodes, past the limit of {}", self.max_nodes),
                ));
            }
        }
        // Requests wait on effects up to the limit; releases, never
        // refused, close at most every handle besides.
        let pending = self.effects.len();
        if pending > self.max_pending + self.max_open + 1 {
            return Err(violation(
                "bounded",
                format!("{pending} effects pending, limit {}", self.max_pending),
            ));
        }
        Ok(())
    }

    fn check_end(&self) -> Result<(), Violation> {
        if !self.ended {
            return Err(violation("liveness", "the world ended before the mount".into()));
        }
        if !self.backing.is_empty() {
            return Err(violation(
                "open_released",
                format!("backing files still registered: {:?}", self.backing),
            ));
        }
        if self.m.open_handles() != 0 || self.tree.open_count() != 0 {
            return Err(violation(
                "open_released",
                format!("{} files open at the end", self.tree.open_count()),
            ));
        }
        Ok(())
    }
}
