//! The session's virtual namespace: in-memory files created by relative
//! paths outside every allowed root. They live as long as the machine and
//! never touch the disk.
//!
//! What a file costs is its name and its contents: both count against
//! `max_total` bytes, and the number of files against `max_files`, so a
//! flood of empty files with long names is bounded too.

use super::wire::{ErrorCode, Failure, Mode};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Total bytes (names and contents) the virtual namespace may hold by
/// default.
pub const DEFAULT_MAX_VIRTUAL_BYTES: u64 = 64 << 20;
/// Virtual files the namespace may hold by default.
pub const DEFAULT_MAX_VIRTUAL_FILES: usize = 4096;

/// A virtual file's name, shared by the namespace and every handle open on
/// it, so a long name is held once however many handles name it.
pub type Name = Arc<str>;

#[derive(Debug, Default)]
pub struct VirtualFs {
    files: BTreeMap<Name, Vec<u8>>,
    /// Bytes of every name and every content.
    total: u64,
    max_total: u64,
    max_files: usize,
    /// A planted bug: names cost nothing (see `PlantedBug::VirtualNamesFree`).
    names_free: bool,
}

impl VirtualFs {
    pub fn new(max_total: u64, max_files: usize) -> Self {
        VirtualFs { files: BTreeMap::new(), total: 0, max_total, max_files, names_free: false }
    }

    #[doc(hidden)]
    pub fn plant_names_free(&mut self) {
        self.names_free = true;
    }

    fn too_big(&self) -> Failure {
        Failure::new(
            ErrorCode::Range,
            format!(
                "virtual files would exceed their limit of {} bytes, names included (--max-virtual-bytes)",
                self.max_total
            ),
        )
    }

    /// The name as stored, creating the file if `create`.
    fn entry(&mut self, name: &str, create: bool) -> Result<Option<Name>, Failure> {
        if let Some((k, _)) = self.files.get_key_value(name) {
            return Ok(Some(k.clone()));
        }
        if !create {
            return Ok(None);
        }
        if self.files.len() >= self.max_files {
            return Err(Failure::new(
                ErrorCode::Range,
                format!("more than {} virtual files (--max-virtual-files)", self.max_files),
            ));
        }
        let cost = if self.names_free { 0 } else { name.len() as u64 };
        if self.total + cost > self.max_total {
            return Err(self.too_big());
        }
        let key: Name = Arc::from(name);
        self.files.insert(key.clone(), Vec::new());
        self.total += cost;
        Ok(Some(key))
    }

    /// Open `name` in `mode`: the name to hold, the initial position being 0.
    pub fn open(&mut self, name: &str, mode: Mode) -> Result<Name, Failure> {
        let key = self.entry(name, mode != Mode::Read)?;
        let Some(key) = key else {
            return Err(Failure::new(ErrorCode::NoEnt, format!("no such file: {name}")));
        };
        if mode == Mode::Write {
            if let Some(old) = self.files.get_mut(&*key) {
                self.total -= old.len() as u64;
                *old = Vec::new();
            }
        }
        Ok(key)
    }

    pub fn read(&self, name: &str, pos: &mut u64, max: u32) -> Vec<u8> {
        let Some(data) = self.files.get(name) else { return Vec::new() };
        let start = usize::try_from(*pos).unwrap_or(usize::MAX).min(data.len());
        let end = start.saturating_add(max as usize).min(data.len());
        // A position past the end (the file was truncated through another
        // handle) stays where it is, as a file offset does: clamping it
        // would make this handle read later writes at the wrong offset.
        if end > start {
            *pos = end as u64;
        }
        data[start..end].to_vec()
    }

    /// Write at `*pos` (or at the end for append), within the size limit.
    pub fn write(&mut self, name: &str, pos: &mut u64, append: bool, bytes: &[u8]) -> Result<u64, Failure> {
        let len = self.files.get(name).map_or(0, Vec::len) as u64;
        let start = if append { len } else { *pos };
        let end = start.saturating_add(bytes.len() as u64);
        let growth = end.saturating_sub(len);
        if self.total.saturating_add(growth) > self.max_total {
            return Err(self.too_big());
        }
        let Some(data) = self.files.get_mut(name) else {
            return Err(Failure::new(ErrorCode::Io, format!("virtual file {name} is gone")));
        };
        let (start, end) = (start as usize, end as usize);
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        self.total += growth;
        *pos = end as u64;
        Ok(bytes.len() as u64)
    }

    pub fn contents(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(Vec::as_slice)
    }

    /// Bytes held, names and contents.
    pub fn bytes(&self) -> u64 {
        self.total
    }

    /// Files held.
    pub fn files(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_count_against_the_byte_limit() {
        let mut v = VirtualFs::new(100, 10);
        let long = "n".repeat(60);
        v.open(&long, Mode::Write).unwrap();
        assert_eq!(v.bytes(), 60);
        let other = "m".repeat(41);
        let e = v.open(&other, Mode::Write).unwrap_err();
        assert_eq!(e.code, ErrorCode::Range);
        assert!(e.message.contains("--max-virtual-bytes"), "{}", e.message);
        // Reopening an existing name costs nothing more.
        v.open(&long, Mode::Append).unwrap();
        assert_eq!(v.bytes(), 60);
    }

    #[test]
    fn the_number_of_files_is_bounded() {
        let mut v = VirtualFs::new(1 << 20, 3);
        for n in ["a", "b", "c"] {
            v.open(n, Mode::Write).unwrap();
        }
        let e = v.open("d", Mode::ReadWrite).unwrap_err();
        assert!(e.message.contains("--max-virtual-files"), "{}", e.message);
        assert_eq!(v.files(), 3);
        // A read of a missing file creates nothing.
        assert_eq!(v.open("e", Mode::Read).unwrap_err().code, ErrorCode::NoEnt);
    }

    #[test]
    fn truncation_gives_bytes_back() {
        let mut v = VirtualFs::new(100, 10);
        let name = v.open("f", Mode::Write).unwrap();
        let mut pos = 0;
        v.write(&name, &mut pos, false, &[1; 50]).unwrap();
        assert_eq!(v.bytes(), 51);
        v.open("f", Mode::Write).unwrap();
        assert_eq!(v.bytes(), 1);
    }
}
