//! Invariant 11 against what is really allocated: after every step, the
//! bytes each machine holds — counted by the harness's global allocator
//! (`airlock-heapcount`), each block charged to the machine that allocated
//! it — stay within what the machine's limits let it hold, plus a stated
//! constant (`FsProxy::heap_check`). The other bounds checkers agree with
//! the machine's model of what it holds; this one checks the model against
//! the heap, so a buffer allocated and never counted is found
//! (`PlantedBug::UncountedBuffer`).
//!
//! Without the counting allocator (a binary with another global
//! allocator) there is nothing to read and the check passes. The counts
//! are read only here, never by what the world chooses, so a seed's world
//! is the same either way.

use super::{violation, Check, World};
use airlock_core::fsproxy::bounds::HEAP_SLACK;
use airlock_core::fsproxy::{Effect, Output};
use airlock_core::heapcount::{self as heapcount, Tag};

/// The heap tag of level `level`'s machine (0 is the world's own).
pub(super) fn tag(level: usize) -> Tag {
    Tag::new(level + 1)
}

/// What the tag of `level` holds before its machine is built.
pub(super) fn base(level: usize) -> u64 {
    heapcount::live(tag(level)).unwrap_or(0)
}

/// An output's bytes are the world's once handed out: a pipe holds them
/// until delivered, as a shell's write buffer would.
pub(super) fn hand_out(out: &Output) {
    match out {
        Output::Send { data, .. }
        | Output::SendUpstream { data }
        | Output::Effect { effect: Effect::Write { data, .. } | Effect::WriteStdio { data, .. }, .. } => {
            heapcount::retag(data, Tag::HARNESS)
        }
        _ => {}
    }
}

impl World {
    /// Invariant 11 on the heap, every step: see the module's comment.
    pub(super) fn check_heap(&self) -> Check {
        // Requests the world's clients have outstanding, on any level: no
        // level holds records for more. Counted only for a level past the
        // slack, which most steps are not.
        let requests = || -> u64 {
            self.clients.iter().filter(|c| !c.gone).map(|c| (c.order.len() + c.null_expected) as u64).sum()
        };
        for (level, l) in self.levels.iter().enumerate() {
            if !l.alive {
                continue;
            }
            let Some(live) = heapcount::live(tag(level)) else { return Ok(()) };
            let held = live.wrapping_sub(l.heap_base);
            if held <= HEAP_SLACK {
                continue;
            }
            l.m.heap_check(held, requests())
                .map_err(|m| violation("bounded_memory", format!("level {level} {m}")))?;
        }
        Ok(())
    }
}
