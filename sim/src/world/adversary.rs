//! The adversary scenario: a nested level whose policy is wider than, narrower
//! than, or empty beside the top's, clients that aim at every way out of it,
//! and an attacker (a process outside airlock with write access to the roots)
//! that creates and swaps symlinks inside the roots between requests.
//!
//! Its invariant (DESIGN.md, 10), checked on every file effect: the file an
//! open lands on, after resolution in the simulated filesystem, is inside the
//! policy of every level between the child and the files, in the mode asked,
//! recomputed here from each level's own `Policy` (not from the scope the
//! machine computed); and a level's virtual namespace never reaches a host
//! file.

use super::{invalid, next_id, pick, request, send, violation, Check, Kind, World, CWD, MODES};
use crate::fs::HostFs;
use crate::swarm::FaultKind;
use airlock_core::fsproxy::wire::Mode;
use airlock_core::guard::{Act, Class, Grants, Guard};
use airlock_core::policy::{Access, Policy, Root};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::path::Path;

/// What the nested level allows, beside the top.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Middle {
    /// More than the top: all of `/data` read-write. The top's read-only
    /// root and single-file root must hold on their own.
    Wide,
    /// Less: one directory inside a top root, and the read-only fixtures.
    Narrow,
    /// Nothing but its own virtual files.
    Empty,
}

#[derive(Debug)]
pub struct Adversary {
    pub middle: Middle,
}

/// Attack sites: where the attacker puts symlinks, and what they may point at
/// (`None`: no link, a regular file or nothing).
const SITES: [(&str, &[Option<&str>]); 7] = [
    (
        "/data/rw/rolink",
        &[Some("sub"), Some("./sub"), Some("/data/rw/sub"), Some("../rw/sub"), Some("a"), None],
    ),
    (
        "/data/one/out.txt",
        &[
            None,
            Some("secret.txt"),
            Some("/data/one/secret.txt"),
            Some("out.txt"),
            Some("/data/ro/a.txt"),
            Some("../rw/a/ok.txt"),
        ],
    ),
    ("/data/rw/a/up", &[Some("../b"), Some("/data/rw/b"), Some("."), Some("up"), Some("hop"), None]),
    ("/data/rw/a/hop", &[Some("../b"), Some("/data/rw/a"), Some("/etc"), Some("../../rw/a/../b")]),
    ("/work/proj/scratch/esc", &[Some("/etc"), Some("../../../data/rw/b"), Some("/data/rw/a"), None]),
    // Protected paths and secret files behind a harmless name (DESIGN.md,
    // invariants 13 and 14).
    (
        "/data/rw/cfg",
        &[
            Some(".git/config"),
            Some("/data/rw/.git/hooks/pre-commit"),
            Some(".git/hooks/new"),
            Some(".env"),
            Some("./.ENV"),
            Some("a/ok.txt"),
            None,
        ],
    ),
    ("/data/rw/gitlink", &[Some(".git"), Some("/data/rw/.git/hooks"), Some("a"), None]),
];

/// What the clients open.
const TARGETS: [&str; 25] = [
    "/data/rw/rolink/keep.txt",
    "/data/rw/rolink/new.txt",
    "/data/one/out.txt",
    "/data/rw/a/up/secret",
    "/data/rw/a/up/new.txt",
    "/data/rw/a/hop/secret",
    "/data/rw/a/ok.txt",
    "/data/rw/sub/keep.txt",
    "/data/rw/b/secret",
    "scratch/esc/passwd",
    "scratch/x.txt",
    "data/rw/b/secret",
    "notes.txt",
    "/work/proj/scratch/esc/passwd",
    "/data/rw/.git/config",
    "/data/rw/.git/hooks/pre-commit",
    "/data/rw/.git/hooks/new",
    "/data/rw/.git/index",
    "/data/rw/cfg",
    "/data/rw/gitlink/config",
    "/data/rw/gitlink/index",
    "/data/rw/gitlink/pre-commit",
    "/data/rw/.env",
    "/data/rw/.ENV",
    "/data/rw/a/.git",
];

/// What path operations aim at besides the targets: the roots, the
/// directories holding rules, the attack sites, places out of reach.
const PATH_AIMS: [&str; 18] = [
    "/data/rw",
    "/data/rw/sub",
    "/data/ro",
    "/data/one",
    "/data/rw/a",
    "/data/rw/b",
    "/data/rw/a/up",
    "/data/rw/rolink",
    "/data/rw/new",
    "/data/rw/a/new/deeper",
    "/etc",
    "/data",
    "scratch",
    "scratch/esc",
    "v/dir",
    ".",
    "/data/rw/moved",
    "scratch/moved",
];

/// A path operation aimed at the targets, the roots and the sites: a
/// change the level's own policy refuses on the path's text must fail.
fn path_op(c: &mut super::Client, id: String, policy: &Policy, max_list: u32) {
    let aim = |c: &mut super::Client| -> String {
        if c.rng.gen_bool(0.5) {
            (*pick(&mut c.rng, &TARGETS)).to_owned()
        } else {
            (*pick(&mut c.rng, &PATH_AIMS)).to_owned()
        }
    };
    let mut path = aim(c);
    let kind = c.rng.gen_range(0..5);
    if kind >= 3 && c.rng.gen_bool(0.4) {
        // A root itself, removed or moved.
        let roots = policy.roots();
        if !roots.is_empty() {
            path = roots[c.rng.gen_range(0..roots.len())].path.to_string_lossy().into_owned();
        }
    }
    let (op, params, paths, write) = match kind {
        0 => ("stat", serde_json::json!({ "path": path, "follow": c.rng.gen_bool(0.7) }), vec![path], false),
        1 => {
            let max = c.rng.gen_range(1..=4u32);
            ("list", serde_json::json!({ "path": path, "max": max }), vec![path], false)
        }
        2 => ("mkdir", serde_json::json!({ "path": path, "parents": c.rng.gen_bool(0.5) }), vec![path], true),
        3 => ("remove", serde_json::json!({ "path": path }), vec![path], true),
        _ => {
            let to = aim(c);
            let params = serde_json::json!({ "from": path, "to": to, "noreplace": c.rng.gen_bool(0.3) });
            ("rename", params, vec![path, to], true)
        }
    };
    // Lexically refused by this level (a read-only root, outside every
    // root): whatever the files are, it must fail.
    let refused = paths.iter().any(|p| {
        matches!(
            policy.resolve(p, write),
            Err(airlock_core::policy::Denied::OutsideRoots
                | airlock_core::policy::Denied::ReadOnly { .. }
                | airlock_core::policy::Denied::Escape)
        )
    });
    let list = (op == "list").then(|| params["max"].as_u64().map_or(max_list, |m| (m as u32).min(max_list)));
    let payload = super::req(&id, op, params);
    send(c, id, payload, Kind::Path { list }, refused.then_some("confinement"));
}

pub fn setup(rng: &mut ChaCha8Rng) -> Adversary {
    let middle = *pick(rng, &[Middle::Wide, Middle::Narrow, Middle::Empty]);
    Adversary { middle }
}

/// The top's policy: the usual roots and a single-file root.
pub fn top_policy() -> Policy {
    let mut roots: Vec<Root> = super::policy().roots().to_vec();
    roots.push(Root { path: "/data/one/out.txt".into(), access: Access::ReadWrite });
    Policy::new(CWD.into(), roots)
}

pub fn middle_policy(m: Middle) -> Policy {
    let rw = |p: &str| Root { path: p.into(), access: Access::ReadWrite };
    let roots = match m {
        Middle::Wide => vec![rw("/data"), rw("scratch")],
        Middle::Narrow => vec![rw("/data/rw/a"), Root { path: "/data/ro".into(), access: Access::ReadOnly }],
        Middle::Empty => vec![],
    };
    let policy = Policy::new(CWD.into(), roots);
    match m {
        // Grants the top does not give: they must not lift its rule.
        Middle::Wide => policy.with_guard(Guard::new(
            Grants::new(["/data/rw/.git".into()]),
            Grants::new(["/data/rw/.env".into(), "/data/rw/.ENV".into()]),
            None,
            [],
        )),
        _ => policy,
    }
}

/// Directories and files the attack sites need, and a first state for each
/// site.
pub fn populate(fs: &mut HostFs, rng: &mut ChaCha8Rng) {
    for d in
        ["/data", "/data/one", "/data/rw/a", "/data/rw/b", "/etc", "/data/rw/.git", "/data/rw/.git/hooks"]
    {
        fs.add_dir(d.into());
    }
    for (f, content) in [
        ("/data/rw/.git/config", &b"[core]\n"[..]),
        ("/data/rw/.git/hooks/pre-commit", b"#!/bin/sh\n"),
        ("/data/rw/.git/index", b"index"),
        ("/data/rw/.env", SECRET_FILE_CONTENT),
        ("/data/rw/.ENV", SECRET_FILE_CONTENT),
    ] {
        fs.add_file(f.into(), content.to_vec());
    }
    for (f, content) in [
        ("/data/rw/sub/keep.txt", &b"keep"[..]),
        ("/data/one/out.txt", b"out"),
        ("/data/one/secret.txt", b"secret"),
        ("/data/rw/b/secret", b"secret"),
        ("/data/rw/a/ok.txt", b"ok"),
        ("/etc/passwd", b"root"),
    ] {
        fs.add_file(f.into(), content.to_vec());
    }
    for (site, choices) in SITES {
        set_site(fs, site, *pick(rng, choices));
    }
}

fn set_site(fs: &mut HostFs, site: &str, choice: Option<&str>) {
    match choice {
        Some(target) => fs.set_link(site.into(), target.into()),
        None => fs.unlink(Path::new(site)),
    }
}

/// What the secret files hold.
pub const SECRET_FILE_CONTENT: &[u8] = b"TOKEN=hunter2-0d5a";
/// The part of it no read answer may carry.
pub const SECRET_MARK: &[u8] = b"hunter2";

impl World {
    /// The attacker swaps one site, between two steps.
    pub(super) fn adversary_swap(&mut self) {
        if self.adversary.is_none() || !self.fires(FaultKind::SymlinkSwap) {
            return;
        }
        self.count(FaultKind::SymlinkSwap);
        let (site, choices) = SITES[self.rng.gen_range(0..SITES.len())];
        let choice = *pick(&mut self.rng, choices);
        set_site(&mut self.fs, site, choice);
    }

    /// Client `i`'s next request: an open aimed at the sites, an invalid
    /// request now and then, or an operation on a handle it holds.
    pub(super) fn adversary_issue(&mut self, i: usize) {
        let invalid_ppm = self.swarm.invalid_ppm;
        let level = self.clients[i].level;
        let stdio_local = self.levels[level].m.config().stdio == airlock_core::fsproxy::StdioRole::Local;
        let policy = &self.policies[level];
        let c = &mut self.clients[i];
        if c.rng.gen_range(0..crate::swarm::PPM) < invalid_ppm {
            return invalid(c, stdio_local);
        }
        let usable = c.handles.usable();
        let id = next_id(c);
        if c.rng.gen_bool(0.25) {
            return path_op(c, id, policy, self.levels[level].m.config().max_list_entries);
        }
        if usable.is_empty() || c.rng.gen_bool(0.4) {
            let path = *pick(&mut c.rng, &TARGETS);
            let mode = *pick(&mut c.rng, &MODES);
            // A host file (at the top, through this level) if this level
            // sends it on at all; otherwise one of its virtual files.
            let host = policy.reaches_host(path, mode.writable());
            let payload = request::open(&id, path, mode.as_str());
            return send(c, id, payload, Kind::Open { key: None, mode, host }, None);
        }
        let h = *pick(&mut c.rng, &usable);
        let hm = c.handles[&h].clone();
        if c.rng.gen_bool(0.25) {
            c.handles.set_closing(&h, true);
            send(c, id.clone(), request::close(&id, h), Kind::Close { h }, None);
        } else if hm.mode.writable() && (!hm.mode.readable() || c.rng.gen_bool(0.5)) {
            let data = super::draw::bytes(&mut c.rng, 0..64);
            let payload = request::write(&id, h, &data, None);
            send(c, id, payload, Kind::Write { h, data }, None);
        } else {
            let max = c.rng.gen_range(1..=256);
            send(c, id.clone(), request::read(&id, h, max), Kind::Read { h, max }, None);
        }
    }

    /// Invariants 13 and 14: a completed open resolved to `path` in
    /// `mode` changes no protected path and reaches no secret file that
    /// the policy of every level between the child and the files does not
    /// grant, each recomputed from the level's own `Policy` (its guard),
    /// not from the scope the machine computed.
    pub(super) fn check_guarded(&self, path: &Path, mode: Mode) -> Check {
        let levels = if self.nested && self.swarm.top_clients == 0 { 0..2 } else { 0..1 };
        let act = if mode.writable() { Act::Write } else { Act::Read };
        for level in levels {
            if let Err(hit) = self.policies[level].guard().check(path, act, false) {
                let invariant =
                    if hit.class == Class::Protected { "protected_paths" } else { "secret_files" };
                return Err(violation(
                    invariant,
                    format!(
                        "a {mode:?} open at the top reached {} , refused by level {level}: {hit}",
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Invariant 10: what the store level opens on behalf of level
    /// `through` (and every level between) lies inside each one's policy,
    /// for `mode`. `path` is the resolved path of a completed open, or the
    /// path an open effect names before resolution (`resolved` false).
    pub(super) fn check_confined(&self, path: &Path, mode: Mode, resolved: bool) -> Check {
        // Top-level clients' effects cannot be told from the intermediate's,
        // so the intermediate's policy is held to only when the top has none.
        let levels = if self.nested && self.swarm.top_clients == 0 { 0..2 } else { 0..1 };
        let text = path.to_string_lossy();
        for level in levels {
            if !self.policies[level].reaches_host(&text, mode.writable()) {
                let how = if resolved { "resolves to" } else { "names" };
                return Err(violation(
                    "confinement",
                    format!(
                        "a {mode:?} open at the top {how} {} , outside level {level}'s policy{}",
                        path.display(),
                        if level == 1 && self.adversary.as_ref().is_some_and(|a| a.middle == Middle::Empty) {
                            " (which has no roots: only virtual files)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        Ok(())
    }
}
