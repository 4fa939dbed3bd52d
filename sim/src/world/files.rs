//! The world's model of every file, keeping what the bounds checker asks
//! of it every step — the virtual files' bytes and number, per level —
//! up to date as files change, instead of walking every file each step.
//!
//! Every change goes through [`FileMut`], whose drop moves the file's share
//! of the counts from what it was to what it is, so no change can be
//! missed; [`Files::check_counts`] holds the counts to a full recount (at
//! the end of every seed, and after every step in debug builds).

use super::{FileModel, Loc};
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

/// What a level's virtual files hold, by the world's own count: their
/// names' bytes and modelled contents, and how many exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct VirtualUse {
    pub bytes: u64,
    pub files: usize,
}

/// One file's share of its level's [`VirtualUse`], if any.
fn share(f: &FileModel) -> Option<(usize, u64)> {
    let Loc::Virtual(name, level) = &f.loc else { return None };
    if !f.exists || f.unknown {
        return None;
    }
    let content = if f.alt.is_none() { f.content.len() as u64 } else { 0 };
    Some((*level, name.len() as u64 + content))
}

#[derive(Debug, Default)]
pub(super) struct Files {
    map: BTreeMap<String, FileModel>,
    /// Per level, kept by [`FileMut`].
    usage: Vec<VirtualUse>,
}

fn add(usage: &mut Vec<VirtualUse>, s: Option<(usize, u64)>, sign: bool) {
    let Some((level, bytes)) = s else { return };
    if usage.len() <= level {
        usage.resize(level + 1, VirtualUse::default());
    }
    let u = &mut usage[level];
    if sign {
        u.bytes += bytes;
        u.files += 1;
    } else {
        u.bytes -= bytes;
        u.files -= 1;
    }
}

impl Files {
    pub fn get(&self, key: &str) -> Option<&FileModel> {
        self.map.get(key)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<FileMut<'_>> {
        let usage = &mut self.usage;
        self.map.get_mut(key).map(|f| FileMut::new(f, usage))
    }

    /// Puts `f` under `key`, in place of any file there.
    pub fn insert(&mut self, key: String, f: FileModel) {
        add(&mut self.usage, share(&f), true);
        if let Some(old) = self.map.insert(key, f) {
            add(&mut self.usage, share(&old), false);
        }
    }

    /// Adds `f` under `key` unless a file is already there.
    pub fn insert_new(&mut self, key: String, f: FileModel) {
        if self.map.contains_key(&key) {
            return;
        }
        add(&mut self.usage, share(&f), true);
        self.map.insert(key, f);
    }

    /// Each file in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FileModel)> {
        self.map.iter().map(|(k, f)| (k.as_str(), f))
    }

    /// Each file `wanted` picks, in key order, to change as it is visited
    /// (the others are passed over unguarded: they do not change).
    pub fn for_each_mut<E>(
        &mut self,
        wanted: impl Fn(&FileModel) -> bool,
        mut visit: impl FnMut(&str, &mut FileMut<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        for (key, f) in &mut self.map {
            if wanted(f) {
                let mut f = FileMut::new(f, &mut self.usage);
                visit(key, &mut f)?;
            }
        }
        Ok(())
    }

    /// `level`'s virtual files, as kept.
    pub fn virtual_use(&self, level: usize) -> VirtualUse {
        self.usage.get(level).copied().unwrap_or_default()
    }

    /// `level`'s virtual files, counted afresh.
    pub fn virtual_use_recounted(&self, level: usize) -> VirtualUse {
        let mut u = VirtualUse::default();
        for (l, bytes) in self.map.values().filter_map(share) {
            if l == level {
                u.bytes += bytes;
                u.files += 1;
            }
        }
        u
    }

    /// The kept counts against a full recount: `Err` names the first level
    /// where they differ.
    pub fn check_counts(&self, levels: usize) -> Result<(), String> {
        for level in 0..levels.max(self.usage.len()) {
            let (kept, counted) = (self.virtual_use(level), self.virtual_use_recounted(level));
            if kept != counted {
                return Err(format!("level {level}: kept {kept:?}, recounted {counted:?}"));
            }
        }
        Ok(())
    }
}

/// A file being changed; its level's counts follow when it is dropped.
pub(super) struct FileMut<'a> {
    f: &'a mut FileModel,
    usage: &'a mut Vec<VirtualUse>,
    before: Option<(usize, u64)>,
}

impl<'a> FileMut<'a> {
    fn new(f: &'a mut FileModel, usage: &'a mut Vec<VirtualUse>) -> Self {
        let before = share(f);
        FileMut { f, usage, before }
    }
}

impl Deref for FileMut<'_> {
    type Target = FileModel;
    fn deref(&self) -> &FileModel {
        self.f
    }
}

impl DerefMut for FileMut<'_> {
    fn deref_mut(&mut self) -> &mut FileModel {
        self.f
    }
}

impl Drop for FileMut<'_> {
    fn drop(&mut self) {
        let after = share(self.f);
        if after != self.before {
            add(self.usage, self.before, false);
            add(self.usage, after, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Class;
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Change {
        Add(u8, usize, bool),
        Exists(u8, bool),
        Unknown(u8, bool),
        Content(u8, usize),
        Alt(u8, bool),
        Visit(bool),
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0u8..8, 0usize..3, any::<bool>()).prop_map(|(k, l, v)| Change::Add(k, l, v)),
            (0u8..8, any::<bool>()).prop_map(|(k, b)| Change::Exists(k, b)),
            (0u8..8, any::<bool>()).prop_map(|(k, b)| Change::Unknown(k, b)),
            (0u8..8, 0usize..50).prop_map(|(k, n)| Change::Content(k, n)),
            (0u8..8, any::<bool>()).prop_map(|(k, b)| Change::Alt(k, b)),
            any::<bool>().prop_map(Change::Visit),
        ]
    }

    #[test]
    fn counts_that_drifted_are_caught() {
        let mut files = Files::default();
        let mut f = FileModel::new(Class::Private, Loc::Virtual("v/a".into(), 1));
        f.exists = true;
        f.content = vec![0; 5];
        files.insert("v/a".into(), f);
        assert_eq!(files.virtual_use(1), VirtualUse { bytes: 8, files: 1 });
        assert_eq!(files.check_counts(2), Ok(()));
        // A change behind the guard's back, as a bug would make.
        if let Some(f) = files.map.get_mut("v/a") {
            f.content.clear();
        }
        assert!(files.check_counts(2).is_err());
    }

    proptest! {
        /// Whatever changes files in whatever order, the kept counts are
        /// the recount.
        #[test]
        fn kept_counts_are_the_recount(changes in proptest::collection::vec(change(), 0..60)) {
            let mut files = Files::default();
            for c in changes {
                let key = |k: u8| format!("name-{k}");
                match c {
                    Change::Add(k, level, virt) => {
                        let loc = if virt { Loc::Virtual(key(k), level) } else { Loc::Host(key(k).into()) };
                        let mut f = FileModel::new(Class::Private, loc);
                        f.exists = k % 2 == 0;
                        files.insert_new(key(k), f);
                    }
                    Change::Exists(k, b) => if let Some(mut f) = files.get_mut(&key(k)) { f.exists = b },
                    Change::Unknown(k, b) => if let Some(mut f) = files.get_mut(&key(k)) { f.unknown = b },
                    Change::Content(k, n) => if let Some(mut f) = files.get_mut(&key(k)) { f.content = vec![1; n] },
                    Change::Alt(k, b) => if let Some(mut f) = files.get_mut(&key(k)) {
                        f.alt = b.then(|| (true, Vec::new()));
                    },
                    Change::Visit(exists) => {
                        let _ = files.for_each_mut(|f| f.exists != exists, |_, f| -> Result<(), ()> {
                            f.exists = exists;
                            Ok(())
                        });
                    }
                }
                prop_assert_eq!(files.check_counts(3), Ok(()));
            }
        }
    }
}
