//! The path operations on the FS proxy: `stat`, `list`, `mkdir`, `remove`
//! and `rename`, under the same policy, error codes and audit as `open`.
//!
//! Each path is decided lexically first, as an open's is (its root, a
//! read-only root refusing a change, a nested level's narrowing), then:
//! - a host path becomes one `Effect::Path` for the shell, which resolves
//!   it from the root descriptors it holds and decides again on what it
//!   resolves to ([`crate::pathops`]), or, on a level under an upstream
//!   airlock, is forwarded there made absolute, narrowed as an open is;
//! - a relative path under none of the roots is this level's virtual
//!   namespace, answered here and never forwarded. Its directories show
//!   the roots that lie beneath them, so a listing of the working
//!   directory leads to every root under it.
//!
//! A rename between the virtual namespace and host files is refused
//! (`E_UNSUPPORTED`): nothing moves between memory and disk behind the
//! client's back.

use super::wire::path::{self, PathRequest};
use super::{
    denied_failure, fs_failure, narrowed_permit, unexpected, Effect, EffectResult, ErrorCode, Failure,
    FsProxy, Mode, Op, Pending, PlantedBug, Success, Waiting,
};
use crate::handles::ClientId;
use crate::pathops::{self, PathOp};
use crate::policy::{bytes, Denied, Resolved, RootId};
use crate::scope::Scope;
use serde_json::Map;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Where a path of a path operation is.
enum Where {
    Host {
        root: RootId,
        rel: PathBuf,
        abs: PathBuf,
    },
    /// A name of the virtual namespace; "" is its top (the working
    /// directory, when no root holds it).
    Virtual(String),
}

impl FsProxy {
    pub(super) fn serve_path(
        &mut self,
        client: ClientId,
        id: String,
        req: PathRequest,
        scope: Option<Scope>,
    ) {
        *self.stats.path_ops.entry(req.name().to_owned()).or_default() += 1;
        match self.path_op(client, &id, req, scope) {
            Ok(Some(s)) => self.respond(client, Some(id), Ok(s)),
            Ok(None) => {}
            Err(f) => self.respond(client, Some(id), Err(f)),
        }
    }

    fn locate(&self, path: &str, write: bool) -> Result<Where, Failure> {
        if path.is_empty() {
            return Err(denied_failure(Denied::Empty));
        }
        match self.config.policy.resolve(path, write) {
            Ok(Resolved::Host { root, rel }) => {
                let r = self
                    .config
                    .policy
                    .root(root)
                    .ok_or_else(|| Failure::new(ErrorCode::Io, "unknown root"))?;
                let abs = if rel.as_os_str().is_empty() { r.path.clone() } else { r.path.join(&rel) };
                Ok(Where::Host { root, rel, abs })
            }
            Ok(Resolved::Virtual { name }) => Ok(Where::Virtual(name)),
            // A relative path that names the working directory itself.
            Err(Denied::Empty) => Ok(Where::Virtual(String::new())),
            Err(d) => Err(denied_failure(d)),
        }
    }

    fn path_op(
        &mut self,
        client: ClientId,
        id: &str,
        req: PathRequest,
        scope: Option<Scope>,
    ) -> Result<Option<Success>, Failure> {
        let write = req.changes();
        let first = self.locate(req.path(), write)?;
        let second = match &req {
            PathRequest::Rename { to, .. } => Some(self.locate(to, write)?),
            _ => None,
        };
        match (first, second) {
            (Where::Virtual(a), None) => self.virtual_path(&req, &a, None).map(Some),
            (Where::Virtual(a), Some(Where::Virtual(b))) => self.virtual_path(&req, &a, Some(&b)).map(Some),
            (Where::Host { root, rel, abs }, None) => {
                self.host_path(client, id, &req, scope, (root, rel, abs), None).map(|()| None)
            }
            (Where::Host { root, rel, abs }, Some(Where::Host { abs: to, .. })) => {
                self.host_path(client, id, &req, scope, (root, rel, abs), Some(to)).map(|()| None)
            }
            _ => Err(Failure::new(
                ErrorCode::Unsupported,
                "a rename between the session's virtual files and host files is not supported: \
                 copy, then remove",
            )),
        }
    }

    /// The names of the directories in virtual directory `name` that a
    /// root lies beneath.
    fn roots_beyond(&self, name: &str) -> BTreeSet<String> {
        let cwd = self.config.policy.cwd();
        let dir = if name.is_empty() { cwd.to_path_buf() } else { cwd.join(name) };
        let dir = bytes::bytes(&dir);
        let mut out = BTreeSet::new();
        for r in self.config.policy.roots() {
            let p = bytes::bytes(&r.path);
            if !crate::resolve::strictly_beneath(p, dir) {
                continue;
            }
            let rest = if dir == b"/" { &p[1..] } else { &p[dir.len() + 1..] };
            let first = rest.split(|&b| b == b'/').next().unwrap_or_default();
            if let Ok(first) = std::str::from_utf8(first) {
                out.insert(first.to_owned());
            }
        }
        out
    }

    /// A virtual file is never created where a root makes a directory.
    pub(super) fn virtual_open_check(&self, name: &str, mode: Mode) -> Result<(), Failure> {
        if (mode.writable() || self.virt.contents(name).is_none()) && !self.roots_beyond(name).is_empty() {
            return Err(Failure::new(ErrorCode::Perm, "is a directory, not a regular file"));
        }
        Ok(())
    }

    fn list_max(&self, asked: Option<u32>) -> u32 {
        let limit = self.config.max_list_entries.max(1);
        asked.map_or(limit, |m| m.min(limit))
    }

    fn virtual_path(&mut self, req: &PathRequest, name: &str, to: Option<&str>) -> Result<Success, Failure> {
        let beyond = self.roots_beyond(name);
        let done = Success::Value(Map::new());
        match req {
            PathRequest::Stat { .. } => {
                self.virt.stat(name, !beyond.is_empty()).map(|s| Success::Value(path::stat_result(&s)))
            }
            PathRequest::List { after, max, .. } => {
                let max = self.list_max(*max);
                let page = self.virt.list(name, after.as_deref(), max as usize, &beyond)?;
                let page = pathops::trim(page, max as usize, self.config.max_list_bytes as usize);
                Ok(Success::Value(path::page_result(&page)))
            }
            PathRequest::Mkdir { parents, .. } => {
                self.virt.mkdir(name, *parents, !beyond.is_empty()).map(|()| done)
            }
            PathRequest::Remove { .. } => self.virt.remove(name, !beyond.is_empty()).map(|()| done),
            PathRequest::Rename { noreplace, .. } => {
                let to = to.unwrap_or_default();
                if !beyond.is_empty() || !self.roots_beyond(to).is_empty() {
                    return Err(Failure::new(
                        ErrorCode::Perm,
                        "an allowed root lies beneath: a directory on the way to a root is never moved or \
                         replaced",
                    ));
                }
                self.virt.rename(name, to, *noreplace).map(|()| done)
            }
        }
    }

    fn host_path(
        &mut self,
        client: ClientId,
        id: &str,
        req: &PathRequest,
        scope: Option<Scope>,
        (root, rel, abs): (RootId, PathBuf, PathBuf),
        to: Option<PathBuf>,
    ) -> Result<(), Failure> {
        let write = req.changes();
        let request_scoped = scope.is_some();
        let narrowing = match (self.clients.get(&client).and_then(|c| c.scope.clone()), scope) {
            (Some(a), Some(b)) => Some(a.intersect(&b)),
            (a, b) => a.or(b),
        };
        narrowed_permit(narrowing.as_ref(), &abs, write)?;
        if let Some(to) = &to {
            narrowed_permit(narrowing.as_ref(), to, write)?;
        }
        let req_id = Some(id.to_owned());
        let bug = self.config.planted_bug;
        if self.config.upstream {
            if !self.upstream_alive {
                return Err(Failure::new(ErrorCode::Io, "upstream closed"));
            }
            let mut paths = [Some(&abs), to.as_ref()].into_iter().flatten();
            let mut fwd = req.with_paths(|p| {
                paths.next().map_or_else(|| p.to_owned(), |a| a.to_string_lossy().into_owned())
            });
            if let PathRequest::List { max, .. } = &mut fwd {
                *max = Some(self.list_max(*max));
            }
            let scope = narrowing.filter(|_| bug != Some(PlantedBug::NestedSkipsNarrow));
            self.forward(client, req_id, Waiting::UpstreamPath, Op::Path { req: fwd, scope });
            return Ok(());
        }
        let effective = self.clients.get(&client).and_then(|c| c.effective.clone());
        let scope = self.host_scope(root, &rel, narrowing.as_ref(), effective, request_scoped);
        let op = match req {
            PathRequest::Stat { follow, .. } => PathOp::Stat { path: abs, follow: *follow },
            PathRequest::List { after, max, .. } => PathOp::List {
                path: abs,
                after: after.clone(),
                max: self.list_max(*max),
                max_bytes: self.config.max_list_bytes,
            },
            PathRequest::Mkdir { parents, .. } => PathOp::Mkdir { path: abs, parents: *parents },
            PathRequest::Remove { .. } => PathOp::Remove { path: abs },
            PathRequest::Rename { noreplace, .. } => {
                PathOp::Rename { from: abs, to: to.unwrap_or_default(), noreplace: *noreplace }
            }
        };
        self.effect(Pending { client, req: req_id, waiting: Waiting::Path }, Effect::Path { op, scope });
        Ok(())
    }

    /// The shell carried out a path operation.
    pub(super) fn path_effect_done(&mut self, client: ClientId, req: Option<String>, result: EffectResult) {
        let outcome = match result {
            EffectResult::Stat { stat } => Ok(Success::Value(path::stat_result(&stat))),
            EffectResult::Listed { page } => Ok(Success::Value(path::page_result(&page))),
            EffectResult::Done => Ok(Success::Value(Map::new())),
            EffectResult::Failed { kind, message } => Err(fs_failure(kind, message)),
            other => Err(unexpected(&other)),
        };
        if req.is_none() {
            return;
        }
        let alive = self.clients.get(&client).is_some_and(|c| c.alive);
        self.settle(client, req, outcome, alive);
    }
}
