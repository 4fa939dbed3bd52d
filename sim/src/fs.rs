//! The simulated host filesystem: answers the file effects of the level that
//! holds files, with the semantics the real shell gives them.

use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::{EffectResult, FileId, FsErrorKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    pos: usize,
    /// Opened in `a` mode: every write lands at the end, as with O_APPEND.
    append: bool,
}

#[derive(Debug, Default)]
pub struct HostFs {
    files: BTreeMap<PathBuf, Vec<u8>>,
    /// Directories (the roots): opening one fails as on a real system.
    dirs: BTreeSet<PathBuf>,
    /// Keyed by (level, file): file ids are per machine.
    open: BTreeMap<(usize, FileId), OpenFile>,
    /// Paths changed since the checkers last looked.
    pub dirty: BTreeSet<PathBuf>,
}

fn failed(kind: FsErrorKind, message: &str) -> EffectResult {
    EffectResult::Failed { kind, message: message.to_owned() }
}

impl HostFs {
    pub fn add_dir(&mut self, path: PathBuf) {
        self.dirs.insert(path);
    }

    pub fn add_file(&mut self, path: PathBuf, content: Vec<u8>) {
        self.files.insert(path, content);
    }

    pub fn get(&self, path: &Path) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// `Err` is a misuse by the machine (an id opened twice).
    pub fn open(
        &mut self,
        level: usize,
        file: FileId,
        path: PathBuf,
        mode: Mode,
    ) -> Result<EffectResult, String> {
        if self.open.contains_key(&(level, file)) {
            return Err(format!("level {level} opened file {file:?} twice"));
        }
        if self.dirs.contains(&path) {
            return Ok(failed(FsErrorKind::Other, "is a directory"));
        }
        let pos = match mode {
            Mode::Read => {
                if !self.files.contains_key(&path) {
                    return Ok(failed(FsErrorKind::NotFound, "no such file"));
                }
                0
            }
            Mode::Write => {
                self.files.insert(path.clone(), Vec::new());
                self.dirty.insert(path.clone());
                0
            }
            Mode::Append | Mode::ReadWrite => {
                if !self.files.contains_key(&path) {
                    self.files.insert(path.clone(), Vec::new());
                    self.dirty.insert(path.clone());
                }
                0
            }
        };
        self.open.insert((level, file), OpenFile { path, pos, append: mode == Mode::Append });
        Ok(EffectResult::Opened)
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
