//! Placeholders for protected names absent from a writable direct view
//! (`airlock_core::sandbox::Cover::Hold`): made on disk before the view,
//! an empty read-only one bound over each inside it, removed when the last
//! view holding them ends. A ledger beside the session sockets names
//! them, so that the next airlock removes what a SIGKILLed one left.
//!
//! A protected path the process made where no placeholder held it (beneath
//! a directory it made, or in a view without a mount namespace) is
//! renamed aside at the session's end ([`set_aside`]).
//!
//! One airlock may make views side by side (the tool's `process.run`): a
//! placeholder is counted per view and goes with the last. Two airlock
//! processes on one tree do not share counts: the first to end removes
//! its placeholders, and the second's view loses those mounts (the
//! session's end still reports what was made under them).

use crate::guardscan::{Found, Tree};
use airlock_core::guard::Guard;
use airlock_core::sandbox::sweep::{self, Placeholder, LEDGER_SUFFIX, MAX_LEDGER_ENTRIES};
use airlock_core::sandbox::{
    hold_sites, holds, ordered, set_aside_name, set_aside_roots, Cover, CoverRefusal, NsMode, MAX_COVERS,
};
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// This process's placeholders, each with the number of views holding it.
static HELD: Mutex<BTreeMap<PathBuf, (usize, Placeholder)>> = Mutex::new(BTreeMap::new());

/// A ledger is read for at most this many bytes (its entries, hex paths).
const MAX_LEDGER_BYTES: u64 = (MAX_LEDGER_ENTRIES as u64) * 8300;

/// The placeholders one view holds; released when dropped.
#[derive(Debug, Default)]
#[must_use = "the placeholders go when this is dropped"]
pub struct Held(Vec<PathBuf>);

/// Hold the protected names absent from the writable trees among `trees`
/// (see `airlock_core::sandbox::hold_sites`): each is made (an empty
/// directory or file), and its cover joins `found`. A name that cannot be
/// made for want of permission (or on a read-only filesystem) needs no
/// hold: the process, with no more rights than airlock, cannot make it
/// either.
///
/// Nothing is held when `namespaces` is `Off`: without a mount view a
/// placeholder is an entry the process may remove and replace (or trip
/// over); the report lists `protected_create` as not enforced instead.
pub fn hold(guard: &Guard, trees: &[Tree], namespaces: NsMode, found: &mut Found) -> anyhow::Result<Held> {
    let tops: Vec<PathBuf> =
        trees.iter().filter(|t| t.writable && is_dir(&t.path)).map(|t| t.path.clone()).collect();
    if tops.is_empty() || namespaces == NsMode::Off {
        return Ok(Held::default());
    }
    let base = crate::session_socket::base();
    crate::confine::sweep::socket_dirs(&base);
    let mut held = Held::default();
    let mut failed = None;
    {
        let mut registry = HELD.lock().unwrap_or_else(|e| e.into_inner());
        'sites: for (site, at) in hold_sites(&tops, &found.covers) {
            if !is_dir(&site) {
                continue;
            }
            for c in holds(guard, &site, at) {
                let Cover::Hold { path, dir, .. } = &c else { continue };
                if let Some((count, _)) = registry.get_mut(path) {
                    *count += 1;
                } else {
                    if !path.parent().is_some_and(is_dir) {
                        continue;
                    }
                    match make(path, *dir) {
                        Ok(p) => {
                            registry.insert(path.clone(), (1, p));
                        }
                        Err(e) if skippable(&e) => continue,
                        Err(e) => {
                            failed = Some(anyhow::Error::from(e).context(format!(
                                "holding the protected name {} absent from a --sandbox-rw tree",
                                path.display()
                            )));
                            break 'sites;
                        }
                    }
                }
                held.0.push(path.clone());
                found.covers.push(c);
            }
        }
        write_ledger(&base, &registry);
    }
    // Dropped (released) on the way out when anything failed.
    if let Some(e) = failed {
        return Err(e);
    }
    found.covers = ordered(std::mem::take(&mut found.covers));
    if found.covers.len() > MAX_COVERS {
        return Err(CoverRefusal::TooMany { count: found.covers.len() }.into());
    }
    Ok(held)
}

impl Held {
    /// The protected paths among `paths` that are not this view's
    /// placeholders as made (same inode, still empty): what the process
    /// made where a placeholder did not hold (without a mount namespace,
    /// or deeper than any placeholder).
    pub fn made_past(&self, paths: Vec<PathBuf>) -> Vec<PathBuf> {
        let registry = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let intact =
            |path: &PathBuf| self.0.contains(path) && registry.get(path).is_some_and(|(_, p)| untouched(p));
        paths.into_iter().filter(|p| !intact(p)).collect()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut registry = HELD.lock().unwrap_or_else(|e| e.into_inner());
        for path in self.0.drain(..) {
            let Some((count, _)) = registry.get_mut(&path) else { continue };
            *count -= 1;
            if *count == 0 {
                if let Some((_, p)) = registry.remove(&path) {
                    remove(&p);
                }
            }
        }
        write_ledger(&crate::session_socket::base(), &registry);
    }
}

/// Remove the placeholders a dead session's ledger names, then the
/// ledger. Only what is still the placeholder made (same device and
/// inode) and still empty is removed.
pub fn release_ledger(path: &Path) {
    use std::io::Read;
    let mut text = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(MAX_LEDGER_BYTES).read_to_end(&mut text));
    if let Err(e) = read {
        tracing::warn!("reading {}, left by a session that is gone: {e}", path.display());
        return;
    }
    for p in sweep::parse_ledger(&text) {
        remove(&p);
    }
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!("removing {}, left by a session that is gone: {e}", path.display());
    }
}

/// Whether a name in the sockets' base is a ledger.
pub fn is_ledger(name: &str) -> bool {
    name.strip_suffix(LEDGER_SUFFIX).is_some_and(|n| n.ends_with('-'))
}

/// A protected path the process made past every placeholder, and the
/// name it was renamed to at the session's end.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SetAside {
    pub path: PathBuf,
    pub to: PathBuf,
}

/// Rename each protected path in `created` (the shallowest of each
/// subtree) to a name no rule protects (see
/// `airlock_core::sandbox::set_aside_name`), never over an existing one:
/// what the process left there is kept for the user to look at, and
/// nothing runs it. Called once the process and all it started are gone.
pub fn set_aside(created: &[PathBuf]) -> Vec<SetAside> {
    let mut moved = Vec::new();
    for path in set_aside_roots(created.to_vec()) {
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let Some(to) = set_aside_name(&path, |p| std::fs::symlink_metadata(p).is_ok()) else {
            tracing::warn!("no free name to set {} aside", path.display());
            continue;
        };
        let cwd = rustix::fs::CWD;
        match rustix::fs::renameat_with(cwd, &path, cwd, &to, rustix::fs::RenameFlags::NOREPLACE) {
            Ok(()) => moved.push(SetAside { path, to }),
            Err(e) => tracing::warn!("setting {} aside: {e}", path.display()),
        }
    }
    moved
}

fn ledger_path(base: &Path) -> PathBuf {
    base.join(sweep::name(crate::confine::sweep::me(), LEDGER_SUFFIX))
}

fn write_ledger(base: &Path, registry: &BTreeMap<PathBuf, (usize, Placeholder)>) {
    let path = ledger_path(base);
    let result = if registry.is_empty() {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    } else {
        let entries: Vec<Placeholder> = registry.values().map(|(_, p)| p.clone()).collect();
        write_private(&path, &sweep::ledger(&entries))
    };
    if let Err(e) = result {
        tracing::warn!("the placeholders' ledger {}: {e}", path.display());
    }
}

fn write_private(path: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(text)
}

fn make(path: &Path, dir: bool) -> std::io::Result<Placeholder> {
    if dir {
        std::fs::DirBuilder::new().mode(0o755).create(path)?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
    }
    let m = std::fs::symlink_metadata(path)?;
    Ok(Placeholder { path: path.to_path_buf(), dir, dev: m.dev(), ino: m.ino() })
}

fn untouched(p: &Placeholder) -> bool {
    let Ok(m) = std::fs::symlink_metadata(&p.path) else { return false };
    let same = m.dev() == p.dev && m.ino() == p.ino && m.is_dir() == p.dir && !m.file_type().is_symlink();
    let empty =
        if p.dir { std::fs::read_dir(&p.path).is_ok_and(|mut d| d.next().is_none()) } else { m.len() == 0 };
    same && empty
}

fn remove(p: &Placeholder) {
    let Ok(m) = std::fs::symlink_metadata(&p.path) else { return };
    if m.dev() != p.dev || m.ino() != p.ino || m.is_dir() != p.dir || m.file_type().is_symlink() {
        return;
    }
    let result = if p.dir {
        std::fs::remove_dir(&p.path)
    } else if m.len() == 0 {
        std::fs::remove_file(&p.path)
    } else {
        Ok(())
    };
    if let Err(e) = result {
        // Something was put in it from outside the view: left as it is.
        tracing::warn!("the placeholder {} stays: {e}", p.path.display());
    }
}

fn skippable(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::PermissionDenied)
        || e.raw_os_error() == Some(libc::EROFS)
}

fn is_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::guard::{Grants, Guard};

    #[test]
    fn absent_names_are_made_counted_per_view_and_removed_with_the_last() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(top.join(".idea")).unwrap();
        let guard = Guard::new(Grants::default(), Grants::default(), None, []);
        let trees = [Tree { path: top.clone(), writable: true }];
        let mut first = Found::default();
        let a = hold(&guard, &trees, NsMode::Try, &mut first).unwrap();
        assert!(top.join(".vscode").is_dir() && top.join(".git").is_dir());
        let held: Vec<&Path> = first.covers.iter().map(Cover::path).collect();
        assert!(held.contains(&top.join(".vscode").as_path()), "{held:?}");
        // Present already: the scan's to cover, not a placeholder.
        assert!(!held.contains(&top.join(".idea").as_path()), "{held:?}");
        let mut second = Found::default();
        let b = hold(&guard, &trees, NsMode::Try, &mut second).unwrap();
        assert_eq!(first.covers, second.covers);
        // An untouched placeholder is not something the process made.
        let vscode = top.join(".vscode");
        assert_eq!(a.made_past(vec![vscode.clone(), top.join("x/.idea")]), [top.join("x/.idea")]);
        drop(a);
        assert!(vscode.is_dir(), "still held by the second view");
        // One replaced (as a process without a mount view could) is.
        // (Its inode number may be the placeholder's again: what it holds
        // tells it apart.)
        std::fs::remove_dir(&vscode).unwrap();
        std::fs::create_dir(&vscode).unwrap();
        std::fs::write(vscode.join("tasks.json"), "{}").unwrap();
        assert_eq!(b.made_past(vec![vscode.clone()]), std::slice::from_ref(&vscode));
        std::fs::remove_dir_all(&vscode).unwrap();
        // Something put in a placeholder from outside stays.
        std::fs::write(top.join(".claude/kept"), "x").unwrap();
        drop(b);
        assert!(!top.join(".git").exists() && !top.join(".cursor").exists());
        assert!(top.join(".claude/kept").exists() && top.join(".idea").is_dir());
    }
}
