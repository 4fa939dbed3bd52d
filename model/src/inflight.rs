//! Provider calls in flight: each call's task and the session race to
//! settle it, and its result must reach the broker exactly once.
//!
//! The task finishes with a result (`complete`) and then tells the session,
//! which `take`s it; or the broker cancels the call first (`cancel`). Both
//! paths remove the call's entry under one lock, so whichever comes first
//! delivers and the other finds nothing. A result that arrived before the
//! cancel is delivered as it is — its usage was billed and must be charged —
//! instead of being traded for "cancelled".

use crate::sync::{lock, Mutex};
use std::collections::BTreeMap;

#[derive(Debug)]
enum Slot<R> {
    Running,
    Done(R),
}

/// What a cancel found.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancel<R> {
    /// The call had finished: deliver its real result.
    Finished(R),
    /// Still running: drop its task and deliver "cancelled".
    Running,
    /// Already settled, or never started.
    Unknown,
}

#[derive(Debug)]
pub struct Inflight<K, R> {
    calls: Mutex<BTreeMap<K, Slot<R>>>,
}

impl<K: Ord, R> Default for Inflight<K, R> {
    fn default() -> Self {
        Inflight { calls: Mutex::new(BTreeMap::new()) }
    }
}

impl<K: Ord + Copy, R> Inflight<K, R> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The session started the call's task.
    pub fn start(&self, call: K) {
        lock(&self.calls).insert(call, Slot::Running);
    }

    /// The call's task finished with `result`. `true`: tell the session,
    /// which will `take` it; `false`: the call was settled already (cancelled)
    /// and nobody wants the result.
    pub fn complete(&self, call: K, result: R) -> bool {
        match lock(&self.calls).get_mut(&call) {
            Some(slot @ Slot::Running) => {
                *slot = Slot::Done(result);
                true
            }
            Some(Slot::Done(_)) | None => false,
        }
    }

    /// The session heard that the call finished: its result, unless a
    /// cancel settled it first.
    pub fn take(&self, call: K) -> Option<R> {
        let mut calls = lock(&self.calls);
        match calls.get(&call) {
            Some(Slot::Done(_)) => match calls.remove(&call) {
                Some(Slot::Done(r)) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }

    /// The broker gave up on the call.
    pub fn cancel(&self, call: K) -> Cancel<R> {
        match lock(&self.calls).remove(&call) {
            Some(Slot::Done(r)) => Cancel::Finished(r),
            Some(Slot::Running) => Cancel::Running,
            None => Cancel::Unknown,
        }
    }

    /// Settle every call (the session is over), in call order: each with its
    /// result if it had one.
    pub fn drain(&self) -> Vec<(K, Option<R>)> {
        std::mem::take(&mut *lock(&self.calls))
            .into_iter()
            .map(|(k, slot)| match slot {
                Slot::Done(r) => (k, Some(r)),
                Slot::Running => (k, None),
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        lock(&self.calls).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
