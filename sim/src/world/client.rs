//! The FS-proxy world's simulated client: the files it models, what it
//! has sent and holds, how it arrives (attach) and leaves, and how it reads
//! each answer against its model.

use super::broker::BOp;
use super::files::Files;
use super::frames::Frames;
use super::held::{HModel, Held};
use super::order::Order;
use super::pager::POp;
use super::response::{Id, Response};
use super::{floods, log, violation, Check, Pipe, World, MIDDLE_CONN};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{Input, ATTACHED_CLIENT_BASE};
use airlock_core::handles::ClientId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
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
pub(super) enum Loc {
    Host(PathBuf),
    /// A virtual file of the level named.
    Virtual(String, usize),
}

#[derive(Debug)]
pub(super) struct FileModel {
    pub(super) class: Class,
    pub(super) loc: Loc,
    pub(super) exists: bool,
    pub(super) content: Vec<u8>,
    /// Too uncertain to model (an effectful request failed in a way that
    /// leaves open whether it took effect).
    pub(super) unknown: bool,
    /// Another acceptable state: the owner left with one request possibly
    /// applied, and this is the state it would leave.
    pub(super) alt: Option<(bool, Vec<u8>)>,
    /// A log's chunks, and what its check keeps.
    pub(super) log: log::Log,
    pub(super) dirty: bool,
}

impl FileModel {
    pub(super) fn new(class: Class, loc: Loc) -> Self {
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

pub(super) fn apply_write(content: &mut Vec<u8>, pos: &mut u64, append: bool, data: &[u8]) {
    let start = if append { content.len() } else { *pos as usize };
    let end = start + data.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[start..end].copy_from_slice(data);
    *pos = end as u64;
}

#[derive(Clone, Debug)]
pub(super) enum Kind {
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
    /// A path operation (`stat`, `list`, `mkdir`, `remove`, `rename`);
    /// `list`: the listing's page bound, to hold its answer to.
    Path {
        list: Option<u32>,
    },
}

#[derive(Debug)]
pub(super) struct Sent {
    pub(super) kind: Kind,
    /// The invariant a success would break (a request that must fail).
    pub(super) must_fail: Option<&'static str>,
}

#[derive(Debug)]
pub(super) struct Client {
    pub(super) id: ClientId,
    pub(super) idx: usize,
    pub(super) level: usize,
    pub(super) rng: ChaCha8Rng,
    pub(super) gone: bool,
    pub(super) ops_left: usize,
    /// Closes what it holds before exiting.
    pub(super) tidy: bool,
    /// Sent a frame that ends its session (oversized).
    pub(super) stream_ended: bool,
    pub(super) next_req: u64,
    pub(super) out: Pipe,
    pub(super) frames: Frames,
    /// The unanswered requests, in the order they were sent, each with
    /// what its answer is checked against.
    pub(super) order: Order<Sent>,
    pub(super) null_expected: usize,
    pub(super) handles: Held,
    pub(super) closed: Vec<u64>,
    pub(super) pending_opens: usize,
    /// Broker ops not yet wholly delivered: (end offset in `out`, id).
    pub(super) bpending: VecDeque<(u64, String)>,
    /// Broker ops sent and not yet registered with the checkers.
    pub(super) bnew: Vec<(String, BOp)>,
    pub(super) next_token: u64,
    pub(super) tokens_used: Vec<String>,
    /// Unanswered LLMCMDs and their cancel tokens.
    pub(super) llm_tokens: BTreeMap<String, Option<String>>,
    /// Where in `out` each frame carrying a descriptor starts: the
    /// descriptor reaches the machine with the frame's first byte.
    pub(super) dpending: VecDeque<u64>,
    /// Descriptors the machine has been handed and no attach has claimed.
    pub(super) fds_unclaimed: u64,
    /// An attach with a descriptor was refused unserved, so its descriptor
    /// lingers and could be claimed by a later attach without one.
    pub(super) stray_fd: bool,
    /// An attached client's first frame must answer this attach.
    pub(super) attach_wait: Option<String>,
    pub(super) floods: floods::ClientFloods,
}

impl Client {
    pub(super) fn new(seed: u64, idx: usize, level: usize, id: ClientId, ops: usize) -> Self {
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
    pub(super) fn answer(&mut self, id: &str) -> Option<Sent> {
        self.order.remove(id)
    }
}

/// A request in a client's `order`. What the bounds checker needs of it is
/// kept here, fixed when it is sent, so the walk it makes every step looks
/// nothing up.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) id: String,
    /// Where its frame ends in the client's stream, and its payload's
    /// length (the bytes a machine holds while it waits); none for the
    /// attach an attached client's first frame answers.
    pub(super) frame: Option<(u64, u64)>,
    /// Holds the client's other requests while it is served (broker ops
    /// and attaches answer elsewhere and do not).
    pub(super) in_line: bool,
    /// A close: admitted past the bounds, as it only releases.
    pub(super) close: bool,
}

/// Client `idx`'s own files, whose content is modelled exactly.
pub(super) fn add_private_files(files: &mut Files, idx: usize, level: usize) {
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

impl World {
    /// The machine serves a descriptor `from` passed as the new client
    /// `new`: a new simulated process, whose first frame must answer the
    /// attach `from` sent.
    pub(super) fn on_attach(&mut self, level: usize, from: ClientId, new: ClientId) -> Check {
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

    /// Client `i` is gone for its machine: it left (`input`), the machine
    /// dropped it, or its intermediate died. Records the one request that
    /// may still take effect.
    pub(super) fn depart(&mut self, i: usize, input: Option<Input>) {
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

    pub(super) fn on_response(&mut self, i: usize, payload: &[u8]) -> Check {
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
                // Invariant 14: no secret file's bytes reach a child.
                let mark = super::adversary::SECRET_MARK;
                if data.windows(mark.len()).any(|w| w == mark) {
                    return Err(violation(
                        "secret_files",
                        format!("a read answer carries a secret file's bytes: {v}"),
                    ));
                }
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
            Kind::Path { list: Some(max) } if ok => {
                // A page: within its bound, names in strictly rising byte
                // order, and `next` the last of them when more follow.
                let r = v.value();
                let names: Vec<String> = r
                    .pointer("/result/entries")
                    .and_then(|e| e.as_array())
                    .ok_or_else(|| violation("response_shape", format!("list without entries: {r}")))?
                    .iter()
                    .map(|e| e["name"].as_str().unwrap_or_default().to_owned())
                    .collect();
                let next = r.pointer("/result/next").and_then(|n| n.as_str());
                let sorted = names.windows(2).all(|w| w[0] < w[1]);
                let cursor_ok = next.is_none_or(|n| names.last().map(String::as_str) == Some(n));
                if names.len() > max as usize
                    || !sorted
                    || !cursor_ok
                    || names.iter().any(|n| n.contains('/'))
                {
                    return Err(violation("list_pages", format!("page bound {max}: {r}")));
                }
            }
            Kind::Invalid | Kind::Broker(_) | Kind::Pager(_) | Kind::Path { .. } => {}
        }
        Ok(())
    }
}
