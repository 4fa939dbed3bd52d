//! The handle table: which client owns which open handle.
//!
//! Handles are numbered from 3 upward (0..2 are stdio, served by the
//! parent-side mux and never allocated) and never reused within a session,
//! so a closed handle can be told apart from one that never existed without
//! remembering every closed handle: it is below the next number.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A protocol handle as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Handle(u64);

impl Handle {
    /// The first handle a table hands out.
    pub const FIRST: Handle = Handle(3);

    pub const fn new(raw: u64) -> Self {
        Handle(raw)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// Handles 0, 1 and 2: stdin, stdout, stderr.
    pub const fn is_stdio(self) -> bool {
        self.0 < Self::FIRST.0
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One connected client of a machine (a child's end of the pipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClientId(pub u64);

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client-{}", self.0)
    }
}

/// Why a lookup found no live handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Never allocated, or owned by another client.
    NoEntry,
    /// Allocated once and closed since.
    Closed,
}

#[derive(Debug)]
pub struct Entry<T> {
    pub owner: ClientId,
    pub value: T,
}

#[derive(Debug)]
pub struct HandleTable<T> {
    next: u64,
    live: BTreeMap<Handle, Entry<T>>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable { next: Handle::FIRST.0, live: BTreeMap::new() }
    }
}

impl<T> HandleTable<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocate a fresh handle owned by `owner`.
    pub fn insert(&mut self, owner: ClientId, value: T) -> Handle {
        let h = Handle(self.next);
        self.next += 1;
        self.live.insert(h, Entry { owner, value });
        h
    }

    fn missing(&self, h: Handle) -> Missing {
        if h.0 >= Handle::FIRST.0 && h.0 < self.next && !self.live.contains_key(&h) {
            Missing::Closed
        } else {
            Missing::NoEntry
        }
    }

    /// The live handle `h`, if `owner` owns it.
    pub fn get(&self, owner: ClientId, h: Handle) -> Result<&T, Missing> {
        match self.live.get(&h) {
            Some(e) if e.owner == owner => Ok(&e.value),
            Some(_) => Err(Missing::NoEntry),
            None => Err(self.missing(h)),
        }
    }

    /// The live handle `h`, if `owner` owns it.
    pub fn get_mut(&mut self, owner: ClientId, h: Handle) -> Result<&mut T, Missing> {
        let missing = self.missing(h);
        match self.live.get_mut(&h) {
            Some(e) if e.owner == owner => Ok(&mut e.value),
            Some(_) => Err(Missing::NoEntry),
            None => Err(missing),
        }
    }

    /// Remove the live handle `h` if `owner` owns it.
    pub fn remove(&mut self, owner: ClientId, h: Handle) -> Result<T, Missing> {
        match self.live.get(&h) {
            Some(e) if e.owner == owner => {
                Ok(self.live.remove(&h).map(|e| e.value).ok_or(Missing::NoEntry)?)
            }
            Some(_) => Err(Missing::NoEntry),
            None => Err(self.missing(h)),
        }
    }

    /// Remove every handle `owner` holds, in handle order.
    pub fn drain_owner(&mut self, owner: ClientId) -> Vec<(Handle, T)> {
        let owned: Vec<Handle> =
            self.live.iter().filter(|(_, e)| e.owner == owner).map(|(h, _)| *h).collect();
        owned.into_iter().filter_map(|h| self.live.remove(&h).map(|e| (h, e.value))).collect()
    }

    pub fn owned_by(&self, owner: ClientId) -> usize {
        self.live.values().filter(|e| e.owner == owner).count()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (Handle, &Entry<T>)> {
        self.live.iter().map(|(h, e)| (*h, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u8),
        Remove(u8, u64),
        Drain(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..3).prop_map(Step::Insert),
            (0u8..3, 0u64..40).prop_map(|(c, h)| Step::Remove(c, h)),
            (0u8..3).prop_map(Step::Drain),
        ]
    }

    proptest! {
        #[test]
        fn never_stdio_never_twice(steps in proptest::collection::vec(step(), 0..200)) {
            let mut t = HandleTable::<()>::new();
            let mut ever = std::collections::BTreeSet::new();
            for s in steps {
                match s {
                    Step::Insert(c) => {
                        let h = t.insert(ClientId(c.into()), ());
                        prop_assert!(!h.is_stdio());
                        prop_assert!(ever.insert(h), "handle {} handed out twice", h);
                    }
                    Step::Remove(c, h) => {
                        let h = Handle::new(h);
                        let before = t.len();
                        match t.remove(ClientId(c.into()), h) {
                            Ok(()) => prop_assert_eq!(t.len(), before - 1),
                            Err(Missing::Closed) => prop_assert!(ever.contains(&h)),
                            Err(Missing::NoEntry) => prop_assert_eq!(t.len(), before),
                        }
                    }
                    Step::Drain(c) => {
                        t.drain_owner(ClientId(c.into()));
                        prop_assert_eq!(t.owned_by(ClientId(c.into())), 0);
                    }
                }
            }
        }
    }

    #[test]
    fn closed_versus_unknown_versus_foreign() {
        let mut t = HandleTable::new();
        let a = ClientId(1);
        let b = ClientId(2);
        let h = t.insert(a, "x");
        assert_eq!(h, Handle::FIRST);
        assert_eq!(t.get_mut(b, h).map(|v| *v), Err(Missing::NoEntry));
        assert_eq!(t.remove(a, h), Ok("x"));
        assert_eq!(t.remove(a, h), Err(Missing::Closed));
        assert_eq!(t.remove(a, Handle::new(99)), Err(Missing::NoEntry));
        assert_eq!(t.remove(a, Handle::new(1)), Err(Missing::NoEntry));
    }
}
