//! The connection cap: the shell takes a permit before `accept`, so extra
//! clients wait in the listen backlog instead of being accepted and idled.

use super::Exchange;
use crate::fsproxy::bounds::{heap_verdict, HeapShare};

/// What a ToolExec server holds on the heap whatever its clients do (its
/// config and allow-list, one step's scratch): the constant a heap check
/// adds to its exchanges' allowances.
#[doc(hidden)]
pub const HEAP_SLACK: u64 = 64 << 10;
/// Held per exchange beyond its counted bytes: its output queue, its
/// state.
#[doc(hidden)]
pub const HEAP_PER_EXCHANGE: u64 = 2 << 10;

/// Connections served at once, against `--max-connections`.
#[derive(Clone, Debug)]
pub struct Gate {
    max: usize,
    open: usize,
}

impl Gate {
    pub fn new(max: usize) -> Self {
        Gate { max: max.max(1), open: 0 }
    }

    /// May the shell call `accept` now?
    pub fn may_accept(&self) -> bool {
        self.open < self.max
    }

    /// Take a permit; `false` (and nothing taken) when the cap is reached.
    pub fn try_take(&mut self) -> bool {
        if self.may_accept() {
            self.open += 1;
            true
        } else {
            false
        }
    }

    /// A connection ended (or an accept failed): its permit comes back.
    pub fn release(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    pub fn open(&self) -> usize {
        self.open
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// `held` bytes on the heap for the server's `exchanges` (every one
    /// the shell holds) against their allowances
    /// ([`Exchange::heap_allowance`], summed limit by limit) plus
    /// [`HEAP_SLACK`]; over it, what the check reports, naming the limit
    /// broken.
    #[doc(hidden)]
    pub fn heap_check<'a>(
        &self,
        exchanges: impl IntoIterator<Item = &'a Exchange>,
        held: u64,
    ) -> Result<(), String> {
        if held <= HEAP_SLACK {
            return Ok(());
        }
        let mut shares: Vec<HeapShare> = Vec::new();
        for s in exchanges.into_iter().flat_map(Exchange::heap_allowance) {
            match shares.iter_mut().find(|t| t.limit == s.limit) {
                Some(t) => t.bytes = t.bytes.saturating_add(s.bytes),
                None => shares.push(s),
            }
        }
        heap_verdict(held, HEAP_SLACK, &shares)
    }
}
