//! The session's virtual namespace: in-memory files created by relative
//! paths outside every allowed root. They live as long as the machine and
//! never touch the disk.

use super::wire::{ErrorCode, Failure, Mode};
use std::collections::BTreeMap;

/// Total bytes the virtual namespace may hold by default.
pub const DEFAULT_MAX_VIRTUAL_BYTES: u64 = 64 << 20;

#[derive(Debug, Default)]
pub struct VirtualFs {
    files: BTreeMap<String, Vec<u8>>,
    total: u64,
    max_total: u64,
}

impl VirtualFs {
    pub fn new(max_total: u64) -> Self {
        VirtualFs { files: BTreeMap::new(), total: 0, max_total }
    }

    /// Open `name` in `mode`; returns the initial position.
    pub fn open(&mut self, name: &str, mode: Mode) -> Result<u64, Failure> {
        match mode {
            Mode::Read if !self.files.contains_key(name) => {
                Err(Failure::new(ErrorCode::NoEnt, format!("no such file: {name}")))
            }
            Mode::Read | Mode::ReadWrite | Mode::Append => {
                self.files.entry(name.to_owned()).or_default();
                Ok(0)
            }
            Mode::Write => {
                let old = self.files.insert(name.to_owned(), Vec::new());
                self.total -= old.map_or(0, |v| v.len() as u64);
                Ok(0)
            }
        }
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
        let data = self.files.entry(name.to_owned()).or_default();
        let start = if append { data.len() as u64 } else { *pos };
        let end = start + bytes.len() as u64;
        let growth = end.saturating_sub(data.len() as u64);
        if self.total + growth > self.max_total {
            return Err(Failure::new(
                ErrorCode::Range,
                format!("virtual files would exceed their limit of {} bytes", self.max_total),
            ));
        }
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
}
