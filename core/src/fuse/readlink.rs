//! `READLINK` as one walk: the path's directories resolved from the
//! anchors (symlinks on the way followed, as every path operation's), the
//! last name looked at without following it, the decision made on the
//! link's own resolved path for reading, and its target read from what
//! was looked at, in the directory held.

use crate::pathops::PathNs;
use crate::resolve::{self, Finish, Refusal, Step, Via};
use crate::scope::Scope;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

struct Readlink<'a> {
    scope: &'a Scope,
    via: Option<Via>,
}

impl<N: PathNs> Finish<N> for Readlink<'_> {
    type Out = Vec<u8>;
    type Err = Refusal;

    fn refused(&mut self, r: Refusal) -> Refusal {
        r
    }

    fn outside(&mut self, path: &[u8]) -> Refusal {
        let rule = self.scope.rule_for_spelled(path, true);
        resolve::outside(rule, resolve::path_of(path), self.via.clone())
    }

    fn link(&mut self, link: &[u8]) -> Result<(), Refusal> {
        if self.via.is_none() {
            let rule = self.scope.rule_for_spelled(link, true);
            let root = rule.filter(|r| r.access.is_some()).map(|r| r.path.clone());
            self.via = Some(Via { link: resolve::path_of(link), root });
        }
        Ok(())
    }

    fn last(
        &mut self,
        ns: &mut N,
        dir: &N::Dir,
        name: &OsStr,
        path: &[u8],
    ) -> Result<Step<Vec<u8>>, Refusal> {
        let found = ns.inspect(dir, name)?;
        resolve::decide(self.scope, path, false, self.via.as_ref())?;
        match found.and_then(|n| n.target) {
            Some(target) => Ok(Step::Done(target.as_os_str().as_bytes().to_vec())),
            None => Err(Refusal::Conflict(format!("{} is not a symlink", resolve::path_of(path).display()))),
        }
    }
}

/// The target of the symlink at `path` (absolute, lexically normal), from
/// the `anchors` (`counts` as for [`resolve::walk`]) under `scope`.
pub fn readlink<N: PathNs>(
    ns: &mut N,
    anchors: &[PathBuf],
    counts: &[Option<usize>],
    scope: &Scope,
    path: &Path,
) -> Result<Vec<u8>, Refusal> {
    resolve::walk(ns, anchors, counts, path, &mut Readlink { scope, via: None }).map(|(t, _)| t)
}
