//! The handles a simulated client holds, with how many of them it may
//! still use (no close on its way) kept as they change: the world asks
//! that of every client on every step to decide what each may do next,
//! and walking every client's handles for it showed in the profile.
//!
//! `closing` is only changed here, so the count cannot drift;
//! [`Held::check_count`] holds it to a recount at the end of each seed
//! (and after every step in debug builds), as the other kept counts are.

use airlock_core::fsproxy::wire::Mode;
use std::collections::BTreeMap;

/// One handle as its client knows it.
#[derive(Clone, Debug)]
pub(super) struct HModel {
    pub key: Option<String>,
    pub mode: Mode,
    pub pos: u64,
    pub host: bool,
    /// A close is on its way: no further requests use the handle. Changed
    /// only by [`Held`], which counts the handles without it.
    closing: bool,
}

impl HModel {
    pub fn new(key: Option<String>, mode: Mode, host: bool) -> Self {
        HModel { key, mode, pos: 0, host, closing: false }
    }

    pub fn closing(&self) -> bool {
        self.closing
    }
}

#[derive(Debug, Default)]
pub(super) struct Held {
    map: BTreeMap<u64, HModel>,
    /// Handles without `closing`.
    usable: usize,
}

impl Held {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether any handle may still be used.
    pub fn any_usable(&self) -> bool {
        self.usable > 0
    }

    /// The handles that may still be used, in order.
    pub fn usable(&self) -> Vec<u64> {
        self.usable_iter().collect()
    }

    fn usable_iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.iter().filter(|(_, h)| !h.closing()).map(|(h, _)| *h)
    }

    /// How many of [`Held::usable`] there are, from the kept count.
    pub fn usable_count(&self) -> usize {
        self.usable
    }

    /// The `k`th of [`Held::usable`], without collecting them.
    pub fn nth_usable(&self, k: usize) -> Option<u64> {
        self.usable_iter().nth(k)
    }

    pub fn values(&self) -> impl Iterator<Item = &HModel> {
        self.map.values()
    }

    pub fn get(&self, h: &u64) -> Option<&HModel> {
        self.map.get(h)
    }

    /// To change what is not `closing` (use [`Held::set_closing`] for that).
    pub fn get_mut(&mut self, h: &u64) -> Option<&mut HModel> {
        self.map.get_mut(h)
    }

    pub fn contains_key(&self, h: &u64) -> bool {
        self.map.contains_key(h)
    }

    pub fn insert(&mut self, h: u64, hm: HModel) {
        self.usable += usize::from(!hm.closing());
        if let Some(old) = self.map.insert(h, hm) {
            self.usable -= usize::from(!old.closing());
        }
    }

    pub fn remove(&mut self, h: &u64) -> Option<HModel> {
        let old = self.map.remove(h)?;
        self.usable -= usize::from(!old.closing());
        Some(old)
    }

    /// Marks `h` as having a close on its way, or not; `false` if not held.
    pub fn set_closing(&mut self, h: &u64, closing: bool) -> bool {
        let Some(hm) = self.map.get_mut(h) else { return false };
        if hm.closing != closing {
            hm.closing = closing;
            if closing {
                self.usable -= 1;
            } else {
                self.usable += 1;
            }
        }
        true
    }

    /// The kept count against a recount.
    pub fn check_count(&self) -> Result<(), String> {
        let counted = self.map.values().filter(|h| !h.closing()).count();
        if counted != self.usable {
            return Err(format!("{} usable handles kept, {counted} counted", self.usable));
        }
        Ok(())
    }
}

impl std::ops::Index<&u64> for Held {
    type Output = HModel;
    fn index(&self, h: &u64) -> &HModel {
        &self.map[h]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn model() -> HModel {
        HModel::new(None, Mode::Read, false)
    }

    proptest! {
        /// Whatever is opened, marked and closed in whatever order, the
        /// kept count is the recount.
        #[test]
        fn kept_count_is_the_recount(ops in proptest::collection::vec((0u8..4, 0u64..6, any::<bool>()), 0..80)) {
            let mut held = Held::default();
            for (op, h, b) in ops {
                match op {
                    0 => held.insert(h, model()),
                    1 => drop(held.remove(&h)),
                    _ => drop(held.set_closing(&h, b)),
                }
                prop_assert_eq!(held.check_count(), Ok(()));
                prop_assert_eq!(held.any_usable(), !held.usable().is_empty());
                let usable = held.usable();
                prop_assert_eq!(held.usable_count(), usable.len());
                for k in 0..=usable.len() {
                    prop_assert_eq!(held.nth_usable(k), usable.get(k).copied());
                }
            }
        }
    }
}
