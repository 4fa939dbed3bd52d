//! The simulator's worker threads share out a range of seeds.

use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::ops::Range;

/// Hands out each seed of a range once, to whichever worker asks, and
/// collects the results.
#[derive(Debug)]
pub struct SeedQueue<R> {
    next: AtomicU64,
    end: u64,
    results: Mutex<Vec<R>>,
}

impl<R> SeedQueue<R> {
    pub fn new(seeds: Range<u64>) -> Self {
        SeedQueue { next: AtomicU64::new(seeds.start), end: seeds.end, results: Mutex::new(Vec::new()) }
    }

    /// The next seed nobody has taken, if any.
    pub fn claim(&self) -> Option<u64> {
        // fetch_add may step past the end; every claim after that sees it.
        let seed = self.next.fetch_add(1, Ordering::Relaxed);
        (seed < self.end).then_some(seed)
    }

    pub fn finish(&self, result: R) {
        lock(&self.results).push(result);
    }

    /// Every result, in completion order.
    pub fn into_results(self) -> Vec<R> {
        self.results.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}
