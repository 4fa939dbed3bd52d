//! The `FD_*` ops on the FS proxy: served by the session's pager at the
//! top, whose file jobs run through this machine's policy, virtual
//! namespace and effects; forwarded upstream by an intermediate, after
//! its own policy and its `--isolate-fds` view.

use super::{
    denied_failure, narrowed_permit, Effect, EffectResult, ErrorCode, Failure, FileId, FsErrorKind, FsProxy,
    Mode, Op, Pending, Success, Waiting,
};
use crate::handles::ClientId;
use crate::pager::machine::FileResult;
use crate::pager::wire::{self as fdwire, FdOp};
use crate::pager::{Access, FdError, FileOp, JobId, Pager, PagerInput, PagerOutput};
use crate::policy::Resolved;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug)]
enum JobFile {
    Host { file: FileId, opened: bool },
    Virtual { node: super::virtual_fs::NodeId, pos: u64, append: bool },
}

/// What a forwarded `FD_*` op needs when its answer comes.
#[derive(Debug)]
pub(super) struct Forwarded {
    /// An `FD_WRAP`: an fd it creates joins the isolated view.
    wrap: bool,
    /// The client's stream and whether it goes on after this chunk.
    stream: Option<(String, bool)>,
}

#[derive(Debug)]
pub(super) struct FdState {
    jobs: BTreeMap<JobId, JobFile>,
    /// Forwarding: a client's stream → its name upstream.
    streams: BTreeMap<(ClientId, String), String>,
    next_stream: u64,
    /// Forwarding with `--isolate-fds`: the fds this level's clients see.
    visible: Option<BTreeSet<String>>,
}

impl FdState {
    pub(super) fn new(config: &super::Config) -> Self {
        FdState {
            jobs: BTreeMap::new(),
            streams: BTreeMap::new(),
            next_stream: 0,
            visible: config.isolate_fds.as_ref().map(|v| v.iter().cloned().collect()),
        }
    }
}

pub(super) fn pager_for(config: &super::Config) -> Option<Pager> {
    match &config.pager {
        Some(p) if !config.upstream => {
            let mut p = p.clone();
            if config.planted_bug == Some(super::PlantedBug::PagerIgnoresLimit) {
                p.max_total_bytes = u64::MAX;
            }
            Some(Pager::new(p, config.max_frame))
        }
        _ => None,
    }
}

fn fd_failure(e: FdError) -> Failure {
    Failure::new(e.code, e.to_xml())
}

fn mode_of(access: Access) -> Mode {
    match access {
        Access::Read | Access::ReadForWrite => Mode::Read,
        Access::Write => Mode::Write,
        Access::Append => Mode::Append,
    }
}

impl FsProxy {
    /// The session's pager, when this level runs one.
    pub fn pager(&self) -> Option<&Pager> {
        self.pager.as_ref()
    }

    /// Streams and file jobs under way in the pager, and host files its
    /// jobs hold (for checkers).
    pub fn pager_busy(&self) -> (usize, usize, usize) {
        let (s, j) = self.pager.as_ref().map_or((0, 0), Pager::busy);
        (s + self.fd.streams.len(), j, self.fd.jobs.len())
    }

    pub(super) fn serve_fd(&mut self, client: ClientId, id: String, op: FdOp, params: Map<String, Value>) {
        if self.config.upstream {
            return self.forward_fd(client, id, op, params);
        }
        let Some(pager) = self.pager.as_mut() else {
            let msg = format!("{} needs a [file_descriptor] section in the session's config", op.as_str());
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Unsupported, msg)));
        };
        let req = match fdwire::parse(op, &params) {
            Ok(r) => r,
            Err(e) => return self.respond(client, Some(id), Err(fd_failure(e))),
        };
        pager.handle(PagerInput::Request { client, id, req });
        if pager.has_job(client) {
            // Answered when the job ends; the client's next requests wait.
            if let Some(c) = self.clients.get_mut(&client) {
                c.busy = true;
                c.busy_on_file = true;
            }
        }
        self.drain_pager(false);
    }

    /// Carry out what the pager asks. `pump`: serve the next requests of a
    /// client whose answer comes now (not when called from `serve`, which
    /// goes on serving by itself).
    fn drain_pager(&mut self, pump: bool) {
        while let Some(out) = self.pager.as_mut().and_then(Pager::poll_output) {
            match out {
                PagerOutput::Reply { client, id, outcome } => {
                    if let Some(c) = self.clients.get_mut(&client) {
                        c.busy = false;
                        c.busy_on_file = false;
                    }
                    self.respond(client, Some(id), outcome.map(Success::Value).map_err(fd_failure));
                    if pump {
                        self.pump(client);
                    }
                }
                PagerOutput::File { job, client, op } => self.pager_file_op(job, client, op),
            }
        }
    }

    fn feed_file(&mut self, job: JobId, result: FileResult) {
        if let Some(p) = self.pager.as_mut() {
            p.handle(PagerInput::FileDone { job, result });
        }
    }

    fn pager_file_op(&mut self, job: JobId, client: ClientId, op: FileOp) {
        let pending = Pending { client, req: None, waiting: Waiting::Pager { job } };
        match op {
            FileOp::Open { path, access } => {
                let mode = mode_of(access);
                let write = access != Access::Read;
                match self.config.policy.resolve(&path, write) {
                    Err(d) => {
                        let f = denied_failure(d);
                        let kind =
                            if f.code == ErrorCode::Perm { FsErrorKind::Denied } else { FsErrorKind::Other };
                        self.feed_file(job, FileResult::Failed { kind, message: f.message });
                    }
                    Ok(Resolved::Virtual { name }) => match self.virt.open(&name, mode) {
                        Ok(node) => {
                            let append = mode == Mode::Append;
                            self.fd.jobs.insert(job, JobFile::Virtual { node, pos: 0, append });
                            self.feed_file(job, FileResult::Opened);
                        }
                        Err(f) => {
                            let kind = match f.code {
                                ErrorCode::NoEnt => FsErrorKind::NotFound,
                                ErrorCode::Perm => FsErrorKind::Denied,
                                _ => FsErrorKind::Other,
                            };
                            self.feed_file(job, FileResult::Failed { kind, message: f.message });
                        }
                    },
                    Ok(Resolved::Host { root, rel }) => {
                        // A nested level's jobs are decided under its
                        // narrowing too, on the resolved file, like its opens.
                        let (narrowing, effective) = match self.clients.get(&client) {
                            Some(c) => (c.scope.clone(), c.effective.clone()),
                            None => (None, None),
                        };
                        let abs = match self.config.policy.root(root) {
                            Some(r) => r.path.join(&rel),
                            None => rel.clone(),
                        };
                        if let Err(f) = narrowed_permit(narrowing.as_ref(), &abs, write) {
                            self.feed_file(
                                job,
                                FileResult::Failed { kind: FsErrorKind::Denied, message: f.message },
                            );
                            return;
                        }
                        let scope = self.host_scope(root, &rel, narrowing.as_ref(), effective, false);
                        let file = FileId(self.next_file);
                        self.next_file += 1;
                        self.fd.jobs.insert(job, JobFile::Host { file, opened: false });
                        self.effect(pending, Effect::Open { file, root, rel, mode, scope, how: None });
                    }
                }
            }
            FileOp::Read { max } => match self.fd.jobs.get_mut(&job) {
                Some(JobFile::Host { file, .. }) => {
                    let file = *file;
                    self.effect(pending, Effect::Read { file, max });
                }
                Some(JobFile::Virtual { node, pos, .. }) => {
                    let data = self.virt.read(*node, pos, max);
                    let eof = data.is_empty();
                    self.feed_file(job, FileResult::Data { data, eof });
                }
                None => self.feed_file(job, not_open()),
            },
            FileOp::Write { data } => match self.fd.jobs.get_mut(&job) {
                Some(JobFile::Host { file, .. }) => {
                    let file = *file;
                    self.effect(pending, Effect::Write { file, data });
                }
                Some(JobFile::Virtual { node, pos, append }) => {
                    let result = match self.virt.write(*node, pos, *append, &data) {
                        Ok(_) => FileResult::Written,
                        Err(f) => FileResult::Failed { kind: FsErrorKind::Other, message: f.message },
                    };
                    self.feed_file(job, result);
                }
                None => self.feed_file(job, not_open()),
            },
            FileOp::Close => match self.fd.jobs.remove(&job) {
                Some(JobFile::Host { file, .. }) => self.effect(pending, Effect::Close { file }),
                Some(JobFile::Virtual { node, .. }) => {
                    self.virt.release(node);
                    self.feed_file(job, FileResult::Closed)
                }
                None => self.feed_file(job, FileResult::Closed),
            },
        }
    }

    pub(super) fn pager_effect_done(&mut self, client: ClientId, job: JobId, result: EffectResult) {
        let result = match result {
            EffectResult::Opened => {
                if let Some(JobFile::Host { opened, .. }) = self.fd.jobs.get_mut(&job) {
                    *opened = true;
                }
                FileResult::Opened
            }
            EffectResult::Data { data, eof } => FileResult::Data { data, eof },
            EffectResult::Written { .. } => FileResult::Written,
            EffectResult::Closed => FileResult::Closed,
            other @ (EffectResult::Stat { .. }
            | EffectResult::Listed { .. }
            | EffectResult::Done
            | EffectResult::Target { .. }
            | EffectResult::Secret { .. }
            | EffectResult::Backing { .. }) => FileResult::Failed {
                kind: FsErrorKind::Other,
                message: format!("unexpected effect result: {other:?}"),
            },
            EffectResult::Failed { kind, message } => {
                // A failed open holds nothing.
                if matches!(self.fd.jobs.get(&job), Some(JobFile::Host { opened: false, .. })) {
                    self.fd.jobs.remove(&job);
                }
                FileResult::Failed { kind, message }
            }
        };
        self.feed_file(job, result);
        self.drain_pager(true);
        let alive = self.clients.get(&client).is_some_and(|c| c.alive);
        if !alive && !self.pager.as_ref().is_some_and(|p| p.has_job(client)) {
            if let Some(c) = self.clients.get_mut(&client) {
                c.busy = false;
                c.busy_on_file = false;
            }
            self.cleanup(client);
        }
    }

    pub(super) fn fd_owner_gone(&mut self, client: ClientId) {
        if let Some(p) = self.pager.as_mut() {
            p.handle(PagerInput::ClientGone { client });
            self.drain_pager(false);
        }
        let gone: Vec<String> =
            self.fd.streams.iter().filter(|((c, _), _)| *c == client).map(|(_, up)| up.clone()).collect();
        self.fd.streams.retain(|(c, _), _| *c != client);
        if !self.upstream_alive {
            return;
        }
        for up in gone {
            let mut params = Map::new();
            params.insert("stream".into(), up.into());
            params.insert("abort".into(), true.into());
            self.forward(client, None, Waiting::Cleanup, Op::Fd { op: FdOp::Wrap, params });
        }
    }

    /// An intermediate: check what this level's policy and view allow,
    /// then pass the op to the top, where the session's fds live.
    fn forward_fd(&mut self, client: ClientId, id: String, op: FdOp, mut params: Map<String, Value>) {
        if !self.upstream_alive {
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Io, "upstream closed")));
        }
        let fd = params.get("fd").and_then(Value::as_str).map(str::to_owned);
        if let (Some(visible), Some(fd)) = (&self.fd.visible, &fd) {
            if !visible.contains(fd) {
                return self.respond(client, Some(id), Err(fd_failure(FdError::not_found(fd))));
            }
        }
        if let Some(path) = params.get("path").and_then(Value::as_str).map(str::to_owned) {
            let write = op == FdOp::ToFile;
            let operation = match params.get("mode").and_then(Value::as_str) {
                _ if !write => "read",
                Some("append") => "append",
                Some("insert") => "insert",
                _ => "write",
            };
            let up = match self.config.policy.resolve(&path, write) {
                Err(d) => {
                    let e = FdError::file(fd.as_deref(), operation, &path, &d.to_string(), true);
                    return self.respond(client, Some(id), Err(fd_failure(e)));
                }
                Ok(Resolved::Host { root, rel }) => match self.config.policy.root(root) {
                    Some(r) => r.path.join(rel).to_string_lossy().into_owned(),
                    None => {
                        return self.respond(
                            client,
                            Some(id),
                            Err(Failure::new(ErrorCode::Io, "unknown root")),
                        )
                    }
                },
                Ok(Resolved::Virtual { name }) => name,
            };
            params.insert("path".into(), up.into());
        }
        let mut stream = None;
        if op == FdOp::Wrap {
            if let Some(s) = params.get("stream").and_then(Value::as_str).map(str::to_owned) {
                let more = params.get("more").and_then(Value::as_bool).unwrap_or(false);
                let key = (client, s.clone());
                let up = match self.fd.streams.get(&key) {
                    Some(up) => up.clone(),
                    None => {
                        let up = format!("s{}", self.fd.next_stream);
                        self.fd.next_stream += 1;
                        up
                    }
                };
                if more {
                    self.fd.streams.insert(key, up.clone());
                } else {
                    self.fd.streams.remove(&key);
                }
                params.insert("stream".into(), up.into());
                stream = Some((s, more));
            }
        }
        let waiting = Waiting::UpstreamFd(Forwarded { wrap: op == FdOp::Wrap, stream });
        self.forward(client, Some(id), waiting, Op::Fd { op, params });
    }

    pub(super) fn upstream_fd_done(
        &mut self,
        client: ClientId,
        req: Option<String>,
        f: Forwarded,
        outcome: Result<Success, Failure>,
    ) {
        match &outcome {
            Ok(Success::Value(m)) => {
                if let (true, Some(visible), Some(fd)) =
                    (f.wrap, self.fd.visible.as_mut(), m.get("fd").and_then(Value::as_str))
                {
                    visible.insert(fd.to_owned());
                }
            }
            // The top dropped the stream: so does this level.
            _ => {
                if let Some((s, true)) = f.stream {
                    self.fd.streams.remove(&(client, s));
                }
            }
        }
        self.finish_upstream(client, req, true, outcome);
    }
}

fn not_open() -> FileResult {
    FileResult::Failed { kind: FsErrorKind::Other, message: "file is not open".into() }
}

#[cfg(test)]
#[path = "fd_tests.rs"]
mod tests;
