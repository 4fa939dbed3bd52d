//! The path operations on the simulated tree, through the core's own walks
//! (`airlock_core::pathops`), with the semantics the real shell's `*at`
//! calls give: a file removed or replaced while open lives on for its
//! handles (an orphan, as an inode), a renamed one is followed by them; a
//! directory moves whole, never into itself; a non-empty one is never
//! removed.

use super::{join_key, path_of, HostFs, Walk};
use airlock_core::pathops::{self, DirEntry, FileStat, Kind, Node, Page, PathDone, PathNs, PathOp, SetAttr};
use airlock_core::policy::bytes;
use airlock_core::resolve::Refusal;
use airlock_core::scope::Scope;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;

/// Files grown by `set_attr` stay this small.
const MAX_SIM_FILE: u64 = 1 << 16;

type Dir<'a> = (Cow<'a, [u8]>, bool);

/// The key of `name` in `dir`.
fn key_of(dir: &Dir<'_>, name: &OsStr) -> Vec<u8> {
    let (p, spelled) = join_key(&dir.0, dir.1, name);
    if spelled {
        p
    } else {
        bytes::canonical(&p).into_owned()
    }
}

/// `k` is `base` or lies beneath it.
fn under(k: &[u8], base: &[u8]) -> bool {
    k == base || (k.starts_with(base) && (base == b"/" || k.get(base.len()) == Some(&b'/')))
}

fn moved(k: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = to.to_vec();
    out.extend_from_slice(&k[from.len()..]);
    out
}

impl HostFs {
    /// Carry out `op` as the production shell would, from `anchors` under
    /// `scope`.
    pub fn path(&mut self, op: &PathOp, anchors: &[PathBuf], scope: &Scope) -> Result<PathDone, Refusal> {
        let counts: Vec<Option<usize>> =
            anchors.iter().map(|a| bytes::spelled_count(bytes::bytes(a))).collect();
        let mut walk = Walk { fs: self, anchors, counts: &counts };
        pathops::perform(&mut walk, anchors, &counts, scope, op)
    }

    /// The paths path operations changed since the last call.
    pub fn take_touched(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.touched)
    }

    /// Is `key` anything at all.
    fn exists(&self, key: &[u8]) -> bool {
        self.files.contains_key(key) || self.dirs.contains(key) || self.links.contains_key(key)
    }

    fn has_children(&self, key: &[u8]) -> bool {
        let beneath = |k: &Vec<u8>| k.as_slice() != key && under(k, key);
        self.files.keys().any(beneath) || self.dirs.iter().any(beneath) || self.links.keys().any(beneath)
    }

    /// The file at `key` is going: its open handles keep its content.
    fn orphan(&mut self, key: &[u8]) {
        let Some(content) = self.files.remove(key) else { return };
        let holders: Vec<_> =
            self.open.iter().filter(|(_, f)| f.orphan.is_none() && f.key == key).map(|(k, _)| *k).collect();
        if holders.is_empty() {
            return;
        }
        let id = self.next_orphan;
        self.next_orphan += 1;
        self.orphans.insert(id, content);
        for h in holders {
            if let Some(f) = self.open.get_mut(&h) {
                f.orphan = Some(id);
            }
        }
    }

    /// Open handles on files at or beneath `from` follow them to `to`.
    fn rekey(&mut self, from: &[u8], to: &[u8]) {
        for f in self.open.values_mut().filter(|f| f.orphan.is_none() && under(&f.key, from)) {
            f.key = moved(&f.key, from, to);
            f.path = path_of(f.key.clone());
        }
    }

    fn touch(&mut self, key: &[u8]) {
        let p = path_of(key.to_vec());
        self.dirty.push(p.clone());
        self.touched.push(p);
    }
}

impl<'a> PathNs for Walk<'a> {
    fn inspect(&mut self, dir: &Dir<'a>, name: &OsStr) -> Result<Option<Node<Dir<'a>>>, Refusal> {
        let k = key_of(dir, name);
        let fs = &self.fs;
        Ok(if fs.dirs.contains(&k) {
            let canonical = bytes::is_canonical(&k);
            Some(Node {
                stat: FileStat::of(Kind::Dir, 0),
                dir: Some((Cow::Owned(k), canonical)),
                target: None,
            })
        } else if let Some(t) = fs.links.get(&k) {
            Some(Node { stat: FileStat::of(Kind::Symlink, 0), dir: None, target: Some(t.clone()) })
        } else {
            fs.files.get(&k).map(|c| Node {
                stat: FileStat::of(Kind::File, c.len() as u64),
                dir: None,
                target: None,
            })
        })
    }

    fn list(
        &mut self,
        dir: &Dir<'a>,
        after: Option<&[u8]>,
        max: usize,
        keep: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<Page, Refusal> {
        let base = bytes::canonical(&dir.0).into_owned();
        let fs = &self.fs;
        let kinds = fs
            .files
            .iter()
            .map(|(k, c)| (k, Kind::File, c.len() as u64))
            .chain(fs.dirs.iter().map(|k| (k, Kind::Dir, 0)))
            .chain(fs.links.keys().map(|k| (k, Kind::Symlink, 0)));
        let mut page: BTreeMap<Vec<u8>, (Kind, u64)> = BTreeMap::new();
        for (k, kind, size) in kinds {
            if k == &base || !under(k, &base) {
                continue;
            }
            let rest = &k[base.len() + usize::from(base != b"/")..];
            if rest.contains(&b'/') || after.is_some_and(|a| rest <= a) || !keep(rest) {
                continue;
            }
            page.insert(rest.to_vec(), (kind, size));
            if page.len() > max + 1 {
                page.pop_last();
            }
        }
        let more = page.len() > max;
        let entries = page
            .into_iter()
            .take(max)
            .filter_map(|(n, (kind, size))| {
                String::from_utf8(n).ok().map(|name| DirEntry { name, kind, size })
            })
            .collect();
        Ok(Page { entries, more })
    }

    fn mkdir(&mut self, dir: &Dir<'a>, name: &OsStr) -> Result<(), Refusal> {
        let k = key_of(dir, name);
        if self.fs.exists(&k) {
            return Err(Refusal::Conflict(format!("{} already exists", name.to_string_lossy())));
        }
        self.fs.dirs.insert(k.clone());
        self.fs.touch(&k);
        Ok(())
    }

    fn remove(&mut self, dir: &Dir<'a>, name: &OsStr, is_dir: bool) -> Result<(), Refusal> {
        let k = key_of(dir, name);
        let fs = &mut *self.fs;
        match (fs.dirs.contains(&k), is_dir) {
            (true, true) if fs.has_children(&k) => {
                return Err(Refusal::Conflict(format!(
                    "{} is a directory that is not empty",
                    name.to_string_lossy()
                )))
            }
            (true, true) => {
                fs.dirs.remove(&k);
            }
            (true, false) => {
                return Err(Refusal::Conflict(format!("{} is a directory", name.to_string_lossy())))
            }
            (false, true) if fs.exists(&k) => return Err(Refusal::Conflict("not a directory".into())),
            (false, _) if fs.links.remove(&k).is_some() => {}
            (false, _) if fs.files.contains_key(&k) => fs.orphan(&k),
            (false, _) => return Err(Refusal::NotFound),
        }
        fs.touch(&k);
        Ok(())
    }

    fn rename(
        &mut self,
        from_dir: &Dir<'a>,
        from: &OsStr,
        to_dir: &Dir<'a>,
        to: &OsStr,
        noreplace: bool,
    ) -> Result<(), Refusal> {
        let (kf, kt) = (key_of(from_dir, from), key_of(to_dir, to));
        let fs = &mut *self.fs;
        if !fs.exists(&kf) {
            return Err(Refusal::NotFound);
        }
        if kf == kt {
            return Ok(());
        }
        if noreplace && fs.exists(&kt) {
            return Err(Refusal::Conflict(format!("{} already exists", to.to_string_lossy())));
        }
        if fs.dirs.contains(&kf) {
            if under(&kt, &kf) {
                return Err(Refusal::Conflict("a directory cannot move into itself".into()));
            }
            if fs.files.contains_key(&kt) || fs.links.contains_key(&kt) {
                return Err(Refusal::Conflict(format!("{} is not a directory", to.to_string_lossy())));
            }
            if fs.dirs.contains(&kt) {
                if fs.has_children(&kt) {
                    return Err(Refusal::Conflict(format!("{} is not empty", to.to_string_lossy())));
                }
                fs.dirs.remove(&kt);
            }
            let dirs: Vec<Vec<u8>> = fs.dirs.iter().filter(|k| under(k, &kf)).cloned().collect();
            for k in dirs {
                fs.dirs.remove(&k);
                fs.dirs.insert(moved(&k, &kf, &kt));
            }
            let files: Vec<Vec<u8>> = fs.files.keys().filter(|k| under(k, &kf)).cloned().collect();
            for k in files {
                if let Some(c) = fs.files.remove(&k) {
                    fs.files.insert(moved(&k, &kf, &kt), c);
                }
            }
            let links: Vec<Vec<u8>> = fs.links.keys().filter(|k| under(k, &kf)).cloned().collect();
            for k in links {
                if let Some(t) = fs.links.remove(&k) {
                    fs.links.insert(moved(&k, &kf, &kt), t);
                }
            }
        } else {
            if fs.dirs.contains(&kt) {
                return Err(Refusal::Conflict(format!("{} is a directory", to.to_string_lossy())));
            }
            fs.links.remove(&kt);
            fs.orphan(&kt);
            if let Some(t) = fs.links.remove(&kf) {
                fs.links.insert(kt.clone(), t);
            } else if let Some(c) = fs.files.remove(&kf) {
                fs.files.insert(kt.clone(), c);
            }
        }
        fs.rekey(&kf, &kt);
        fs.touch(&kf);
        fs.touch(&kt);
        Ok(())
    }

    fn set_attr(
        &mut self,
        dir: &Dir<'a>,
        name: &OsStr,
        _: &FileStat,
        attr: &SetAttr,
    ) -> Result<FileStat, Refusal> {
        let k = key_of(dir, name);
        if self.fs.dirs.contains(&k) {
            return Ok(FileStat::of(Kind::Dir, 0));
        }
        let Some(c) = self.fs.files.get_mut(&k) else { return Err(Refusal::NotFound) };
        if let Some(size) = attr.size {
            c.resize(size.min(MAX_SIM_FILE) as usize, 0);
        }
        let stat = FileStat::of(Kind::File, c.len() as u64);
        self.fs.touch(&k);
        Ok(stat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::fsproxy::wire::Mode;
    use airlock_core::fsproxy::FileId;
    use airlock_core::policy::Access;
    use airlock_core::scope::Rule;

    #[test]
    fn open_files_follow_renames_and_outlive_removes() {
        let mut fs = HostFs::default();
        for d in ["/d", "/d/a"] {
            fs.add_dir(d.into());
        }
        fs.add_file("/d/a/f".into(), b"one".to_vec());
        fs.add_file("/d/g".into(), b"two".to_vec());
        let anchors = vec![PathBuf::from("/d")];
        let scope = Scope::from_rules([Rule { path: "/d".into(), access: Some(Access::ReadWrite) }]);
        fs.open(0, FileId(1), "/d/a/f".as_ref(), Mode::ReadWrite, &anchors, &scope).unwrap();
        fs.open(0, FileId(2), "/d/g".as_ref(), Mode::Read, &anchors, &scope).unwrap();
        let op = |from: &str, to: &str| PathOp::Rename { from: from.into(), to: to.into(), noreplace: false };
        // A directory moves with its open file; a file moved over another
        // leaves the other to its handle.
        fs.path(&op("/d/a", "/d/b"), &anchors, &scope).unwrap();
        fs.write(0, FileId(1), b"ONE").unwrap();
        assert_eq!(fs.get("/d/b/f".as_ref()), Some(&b"ONE"[..]));
        fs.path(&op("/d/b/f", "/d/g"), &anchors, &scope).unwrap();
        assert_eq!(
            fs.read(0, FileId(2), 10).unwrap(),
            airlock_core::fsproxy::EffectResult::Data { data: b"two".to_vec(), eof: false }
        );
        fs.path(&PathOp::Remove { path: "/d/g".into() }, &anchors, &scope).unwrap();
        fs.write(0, FileId(1), b"!").unwrap();
        assert_eq!(fs.get("/d/g".as_ref()), None, "a removed file's handle writes to it alone");
        fs.close(0, FileId(1)).unwrap();
        fs.close(0, FileId(2)).unwrap();
        assert!(fs.orphans.is_empty() && fs.open_count() == 0);
        let touched = fs.take_touched();
        assert!(touched.contains(&PathBuf::from("/d/b")) && touched.contains(&PathBuf::from("/d/g")));
    }
}
