//! The simulated host filesystem as it was keyed by `PathBuf` (compared
//! component by component), kept as the oracle the byte-keyed one is held
//! to: the same answers to the same operations, on hostile paths.

use super::HostFs;
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{EffectResult, FileId};
use airlock_core::policy::Access;
use airlock_core::resolve::{self, Entry, Final, Namespace, OpenFinal, Refusal};
use airlock_core::scope::{Rule, Scope};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    pos: usize,
    /// Opened in `a` mode: every write lands at the end, as with O_APPEND.
    append: bool,
}

#[derive(Debug, Default)]
pub struct OldHostFs {
    files: BTreeMap<PathBuf, Vec<u8>>,
    dirs: BTreeSet<PathBuf>,
    links: BTreeMap<PathBuf, PathBuf>,
    /// Keyed by (level, file): file ids are per machine.
    open: BTreeMap<(usize, FileId), OpenFile>,
    /// Paths changed since the checkers last looked.
    pub dirty: BTreeSet<PathBuf>,
}

/// The in-memory tree as the walk's namespace: a "descriptor" is the
/// directory's physical path, which stays valid because the simulator
/// never renames directories.
struct Walk<'a> {
    fs: &'a mut OldHostFs,
    anchors: &'a [PathBuf],
}

impl Namespace for Walk<'_> {
    type Dir = PathBuf;

    fn anchor(&mut self, index: usize) -> Result<PathBuf, Refusal> {
        self.anchors.get(index).cloned().ok_or_else(|| Refusal::Fs("unknown anchor".into()))
    }

    fn lookup(&mut self, dir: &PathBuf, name: &OsStr) -> Result<Entry<PathBuf>, Refusal> {
        let p = dir.join(name);
        Ok(if self.fs.dirs.contains(&p) {
            Entry::Dir(p)
        } else if let Some(t) = self.fs.links.get(&p) {
            Entry::Symlink(t.clone())
        } else if self.fs.files.contains_key(&p) {
            Entry::NotDir
        } else {
            Entry::Missing
        })
    }
}

impl OpenFinal for Walk<'_> {
    type File = PathBuf;

    fn open_final(
        &mut self,
        dir: &PathBuf,
        name: &OsStr,
        _: &Path,
        mode: Mode,
    ) -> Result<Final<PathBuf>, Refusal> {
        let p = dir.join(name);
        if let Some(t) = self.fs.links.get(&p) {
            return Ok(Final::Symlink(t.clone()));
        }
        if self.fs.dirs.contains(&p) {
            return Err(Refusal::Denied("not a regular file".into()));
        }
        match mode {
            Mode::Read if !self.fs.files.contains_key(&p) => return Err(Refusal::NotFound),
            Mode::Read => {}
            Mode::Write => {
                self.fs.files.insert(p.clone(), Vec::new());
                self.fs.dirty.insert(p.clone());
            }
            Mode::Append | Mode::ReadWrite => {
                if !self.fs.files.contains_key(&p) {
                    self.fs.files.insert(p.clone(), Vec::new());
                    self.fs.dirty.insert(p.clone());
                }
            }
        }
        Ok(Final::File(p))
    }
}

impl OldHostFs {
    pub fn add_dir(&mut self, path: PathBuf) {
        self.dirs.insert(path);
    }

    pub fn add_file(&mut self, path: PathBuf, content: Vec<u8>) {
        self.files.insert(path, content);
    }

    /// Make `path` a symlink to `target`, replacing whatever file or link
    /// was there (an attacker swapping names between requests).
    pub fn set_link(&mut self, path: PathBuf, target: PathBuf) {
        self.files.remove(&path);
        self.links.insert(path, target);
    }

    /// Make `path` a regular file again (empty if it was not one).
    pub fn unlink(&mut self, path: &Path) {
        self.links.remove(path);
    }

    pub fn get(&self, path: &Path) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    pub fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains(path)
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Open `path` as the production shell would: resolve it from the
    /// `anchors` and refuse unless `scope` permits the resolved file in
    /// `mode`. Returns the result and, when opened, the resolved path.
    /// `Err` is a misuse by the machine (an id opened twice).
    pub fn open(
        &mut self,
        level: usize,
        file: FileId,
        path: &Path,
        mode: Mode,
        anchors: &[PathBuf],
        scope: &Scope,
    ) -> Result<(EffectResult, Option<PathBuf>), String> {
        if self.open.contains_key(&(level, file)) {
            return Err(format!("level {level} opened file {file:?} twice"));
        }
        let mut walk = Walk { fs: self, anchors };
        match resolve::open(&mut walk, anchors, path, mode, scope) {
            Ok((p, _)) => {
                self.open.insert(
                    (level, file),
                    OpenFile { path: p.clone(), pos: 0, append: mode == Mode::Append },
                );
                Ok((EffectResult::Opened, Some(p)))
            }
            Err(r) => Ok((EffectResult::Failed { kind: r.kind(), message: r.to_string() }, None)),
        }
    }

    pub fn read(&mut self, level: usize, file: FileId, max: u32) -> Result<EffectResult, String> {
        let f = self
            .open
            .get_mut(&(level, file))
            .ok_or_else(|| format!("level {level} read unopened {file:?}"))?;
        let data = self.files.get(&f.path).map(Vec::as_slice).unwrap_or_default();
        let start = f.pos.min(data.len());
        let end = start.saturating_add(max as usize).min(data.len());
        // Like an OS file offset, a position past the end stays put.
        if end > start {
            f.pos = end;
        }
        let data = data[start..end].to_vec();
        let eof = data.is_empty();
        Ok(EffectResult::Data { data, eof })
    }

    pub fn write(&mut self, level: usize, file: FileId, bytes: &[u8]) -> Result<EffectResult, String> {
        let f = self
            .open
            .get_mut(&(level, file))
            .ok_or_else(|| format!("level {level} wrote unopened {file:?}"))?;
        let data = self.files.entry(f.path.clone()).or_default();
        let start = if f.append { data.len() } else { f.pos };
        let end = start + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        f.pos = end;
        self.dirty.insert(f.path.clone());
        Ok(EffectResult::Written { written: bytes.len() as u64 })
    }

    pub fn close(&mut self, level: usize, file: FileId) -> Result<EffectResult, String> {
        match self.open.remove(&(level, file)) {
            Some(_) => Ok(EffectResult::Closed),
            None => Err(format!("level {level} closed unopened {file:?}")),
        }
    }
}

fn path(b: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(b.to_vec()))
}

/// A hostile path near the simulator's tree: `..`, `.`, `//`, trailing
/// slashes, empty, NUL, non-UTF-8, now and then very long.
fn arb_path() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        4 => prop::sample::select(vec![
            "", ".", "..", "data", "ro", "rw", "sub", "a", "b", "one", "out.txt", "secret.txt", "keep.txt",
            "x", "etc", "passwd",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(prop::sample::select(vec![b'.', b'a', 0, 0xff]), 0..4),
    ];
    (
        prop::sample::select(vec!["/", "/", "/", "//", "", "./"]),
        prop::collection::vec((name, prop::sample::select(vec!["/", "/", "//", "/./"])), 0..5),
        prop::sample::select(vec!["", "", "/", "/."]),
        0..30usize,
    )
        .prop_map(|(lead, names, trail, long)| {
            let mut out = lead.as_bytes().to_vec();
            for (i, (n, sep)) in names.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(sep.as_bytes());
                }
                out.extend_from_slice(n);
            }
            if long > 28 {
                out.extend(std::iter::repeat_n(b'y', 3000));
            }
            out.extend_from_slice(trail.as_bytes());
            out
        })
}

#[derive(Clone, Debug)]
enum Op {
    Dir(Vec<u8>),
    File(Vec<u8>, Vec<u8>),
    Link(Vec<u8>, Vec<u8>),
    Unlink(Vec<u8>),
    Open(usize, u64, Vec<u8>, Mode, usize),
    Read(usize, u64, u32),
    Write(usize, u64, Vec<u8>),
    Close(usize, u64),
    Get(Vec<u8>),
    IsDir(Vec<u8>),
    TakeDirty,
}

fn arb_op() -> impl Strategy<Value = Op> {
    let mode = prop::sample::select(vec![Mode::Read, Mode::Write, Mode::Append, Mode::ReadWrite]);
    prop_oneof![
        2 => arb_path().prop_map(Op::Dir),
        2 => (arb_path(), prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(p, c)| Op::File(p, c)),
        3 => (arb_path(), arb_path()).prop_map(|(p, t)| Op::Link(p, t)),
        1 => arb_path().prop_map(Op::Unlink),
        6 => (0..2usize, 0..4u64, arb_path(), mode, 0..3usize).prop_map(|(l, f, p, m, s)| Op::Open(l, f, p, m, s)),
        3 => (0..2usize, 0..4u64, 0..12u32).prop_map(|(l, f, m)| Op::Read(l, f, m)),
        3 => (0..2usize, 0..4u64, prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(l, f, d)| Op::Write(l, f, d)),
        2 => (0..2usize, 0..4u64).prop_map(|(l, f)| Op::Close(l, f)),
        1 => arb_path().prop_map(Op::Get),
        1 => arb_path().prop_map(Op::IsDir),
        1 => Just(Op::TakeDirty),
    ]
}

fn scopes() -> [Scope; 3] {
    let rule = |p: &str, access| Rule { path: p.into(), access };
    [
        Scope::everything(),
        Scope::from_rules([
            rule("/data", Some(Access::ReadWrite)),
            rule("/data/ro", Some(Access::ReadOnly)),
            rule("/data/rw/sub", None),
        ]),
        Scope::from_rules([rule("/data/one/out.txt", Some(Access::ReadWrite))]),
    ]
}

fn show(r: &Result<(EffectResult, Option<PathBuf>), String>) -> String {
    match r {
        Ok((e, p)) => format!("{e:?} {:?}", p.as_ref().map(|p| p.as_os_str().to_owned())),
        Err(e) => e.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn byte_keys_answer_as_component_keys(ops in prop::collection::vec(arb_op(), 0..60)) {
        let mut new = HostFs::default();
        let mut old = OldHostFs::default();
        for d in ["/data", "/data/ro", "/data/rw", "/data/rw/sub", "/data/one", "/etc"] {
            new.add_dir(d.into());
            old.add_dir(d.into());
        }
        let anchors: Vec<PathBuf> = vec!["/data/ro".into(), "/data/rw".into(), "/data/rw/sub".into(), "/data/one".into()];
        let scopes = scopes();
        for op in ops {
            match op {
                Op::Dir(p) => {
                    new.add_dir(path(&p));
                    old.add_dir(path(&p));
                }
                Op::File(p, c) => {
                    new.add_file(path(&p), c.clone());
                    old.add_file(path(&p), c);
                }
                Op::Link(p, t) => {
                    new.set_link(path(&p), path(&t));
                    old.set_link(path(&p), path(&t));
                }
                Op::Unlink(p) => {
                    new.unlink(&path(&p));
                    old.unlink(&path(&p));
                }
                Op::Open(l, f, p, m, s) => {
                    let a = new.open(l, FileId(f), &path(&p), m, &anchors, &scopes[s]);
                    let b = old.open(l, FileId(f), &path(&p), m, &anchors, &scopes[s]);
                    prop_assert_eq!(show(&a), show(&b));
                    prop_assert_eq!(a, b);
                }
                Op::Read(l, f, max) => prop_assert_eq!(new.read(l, FileId(f), max), old.read(l, FileId(f), max)),
                Op::Write(l, f, d) => prop_assert_eq!(new.write(l, FileId(f), &d), old.write(l, FileId(f), &d)),
                Op::Close(l, f) => prop_assert_eq!(new.close(l, FileId(f)), old.close(l, FileId(f))),
                Op::Get(p) => prop_assert_eq!(new.get(&path(&p)), old.get(&path(&p))),
                Op::IsDir(p) => prop_assert_eq!(new.is_dir(&path(&p)), old.is_dir(&path(&p))),
                Op::TakeDirty => {
                    // As a set of paths, the first spelling of each kept,
                    // as the oracle's set keeps it.
                    let a: BTreeSet<PathBuf> = new.take_dirty().into_iter().collect();
                    let a: Vec<OsString> = a.into_iter().map(PathBuf::into_os_string).collect();
                    let b: Vec<OsString> = std::mem::take(&mut old.dirty).into_iter().map(PathBuf::into_os_string).collect();
                    prop_assert_eq!(a, b);
                }
            }
            prop_assert_eq!(new.open_count(), old.open_count());
        }
        for p in ["/data/ro/a.txt", "/data/rw/x", "/data/one/out.txt", "/etc/passwd"] {
            prop_assert_eq!(new.get(Path::new(p)), old.get(Path::new(p)));
        }
    }
}
