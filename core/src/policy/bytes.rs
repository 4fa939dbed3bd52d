//! Unix path components over raw bytes, with exactly the semantics of
//! `std::path::Components` on Unix (a leading `/` is the root, a leading
//! `.` of a relative path is the current directory, other `.` and empty
//! components vanish, `..` stays).
//!
//! The policy, scope and symlink walk compare paths on every file request;
//! std's component iterator is a general state machine (prefixes, verbatim
//! paths, both ends) and shows in the simulator's profile, while every
//! question asked here only needs a forward split on `/`. The tests hold
//! each function to its std counterpart on arbitrary bytes.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One component, as `std::path::Component` on Unix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comp<'a> {
    Root,
    Cur,
    Parent,
    Normal(&'a [u8]),
}

/// The components of a path, front to back.
#[derive(Clone, Debug)]
pub struct Comps<'a> {
    /// What is left to split.
    rest: &'a [u8],
    /// Nothing yielded yet: the root or a leading `.` may come first.
    fresh: bool,
}

pub fn comps(path: &[u8]) -> Comps<'_> {
    Comps { rest: path, fresh: true }
}

pub fn bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

pub fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

impl<'a> Iterator for Comps<'a> {
    type Item = Comp<'a>;

    fn next(&mut self) -> Option<Comp<'a>> {
        if self.fresh {
            self.fresh = false;
            match self.rest {
                [b'/', ..] => {
                    self.rest = &self.rest[1..];
                    return Some(Comp::Root);
                }
                [b'.'] | [b'.', b'/', ..] => {
                    self.rest = &self.rest[1..];
                    return Some(Comp::Cur);
                }
                _ => {}
            }
        }
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (seg, rest) = match self.rest.iter().position(|&b| b == b'/') {
                Some(i) => (&self.rest[..i], &self.rest[i + 1..]),
                None => (self.rest, &self.rest[self.rest.len()..]),
            };
            self.rest = rest;
            match seg {
                b"" | b"." => {}
                b".." => return Some(Comp::Parent),
                _ => return Some(Comp::Normal(seg)),
            }
        }
    }
}

impl<'a> Comps<'a> {
    /// Whether the next component is `want`, consuming it if so (if not,
    /// the iterator is left anywhere). Unlike comparing `next()`, it reads
    /// no further into the path than `want` is long: a path with a name of
    /// megabytes costs no more to hold against a short root than a short one.
    fn next_is(&mut self, want: Comp<'_>) -> bool {
        if self.fresh {
            self.fresh = false;
            match self.rest {
                [b'/', ..] => {
                    self.rest = &self.rest[1..];
                    return want == Comp::Root;
                }
                [b'.'] | [b'.', b'/', ..] => {
                    self.rest = &self.rest[1..];
                    return want == Comp::Cur;
                }
                _ => {}
            }
        }
        // Empty and `.` names are not components.
        loop {
            match self.rest {
                [b'/', rest @ ..] | [b'.', b'/', rest @ ..] => self.rest = rest,
                [b'.'] => self.rest = &[],
                _ => break,
            }
        }
        let name: &[u8] = match want {
            Comp::Normal(n) => n,
            Comp::Parent => b"..",
            // Only the first component can be the root or `.`.
            Comp::Root | Comp::Cur => return false,
        };
        // `name` is neither empty nor `.`, so a match up to a separator is
        // the whole of the next name.
        match self.rest.strip_prefix(name) {
            Some([]) => {
                self.rest = &[];
                true
            }
            Some([b'/', rest @ ..]) => {
                self.rest = rest;
                true
            }
            _ => false,
        }
    }

    /// What `std::path::Components::as_path` returns at this point:
    /// the rest, without empty or `.` components at the ends (at the
    /// front only once something was yielded).
    fn as_bytes(&self) -> &'a [u8] {
        let mut s = self.rest;
        // Bytes at the front that belong to the root or a leading `.`,
        // not to the body, are never trimmed.
        let before_body = if self.fresh {
            match s {
                [b'/', ..] => 1,
                [b'.'] | [b'.', b'/', ..] => 1,
                _ => 0,
            }
        } else {
            while !s.is_empty() {
                let (seg, rest) = match s.iter().position(|&b| b == b'/') {
                    Some(i) => (&s[..i], &s[i + 1..]),
                    None => (s, &s[s.len()..]),
                };
                if !matches!(seg, b"" | b".") {
                    break;
                }
                s = rest;
            }
            0
        };
        while s.len() > before_body {
            let body = &s[before_body..];
            let (seg_len, cut) = match body.iter().rposition(|&b| b == b'/') {
                Some(i) => (body.len() - i - 1, body.len() - i),
                None => (body.len(), body.len()),
            };
            let seg = &body[body.len() - seg_len..];
            if !matches!(seg, b"" | b".") {
                break;
            }
            s = &s[..s.len() - cut];
        }
        s
    }
}

/// `Path::is_absolute` on Unix.
pub fn is_absolute(path: &[u8]) -> bool {
    path.first() == Some(&b'/')
}

/// Whether `path` begins with the bytes of `base` up to a separator and
/// `base` is spelled as its components are: then `path`'s components begin
/// with `base`'s, and what follows them is `path[base.len()..]`. The common
/// case (a policy's roots are normalized) costs a `memcmp`.
fn spelled_prefix(path: &[u8], base: &[u8]) -> bool {
    !base.is_empty() && spelled_prefix_at(path, base) && is_canonical(base)
}

/// `Path::starts_with`: `base`'s components are a prefix of `path`'s.
pub fn starts_with(path: &[u8], base: &[u8]) -> bool {
    if spelled_prefix(path, base) {
        return true;
    }
    let mut p = comps(path);
    comps(base).all(|b| p.next_is(b))
}

/// `path` begins with `base`'s bytes up to a separator: when both are
/// canonical and `base` is not empty, that `path`'s components begin with
/// `base`'s.
fn spelled_prefix_at(path: &[u8], base: &[u8]) -> bool {
    path.starts_with(base) && (path.len() == base.len() || path[base.len()] == b'/' || base == b"/")
}

/// The components of a non-empty canonical spelling: one per `/`, and
/// one more for the last name unless it is the root alone.
fn canonical_count(base: &[u8]) -> usize {
    let slashes = base.iter().filter(|&&b| b == b'/').count();
    if base == b"/" {
        1
    } else {
        slashes + 1
    }
}

/// `base.components().count()` when `path.starts_with(base)`, in one pass:
/// what picking the deepest rule containing a path asks of every rule.
pub fn prefix_depth(path: &[u8], base: &[u8]) -> Option<usize> {
    if spelled_prefix(path, base) {
        return Some(canonical_count(base));
    }
    let mut p = comps(path);
    let mut depth = 0;
    for b in comps(base) {
        if !p.next_is(b) {
            return None;
        }
        depth += 1;
    }
    Some(depth)
}

/// The index and item of the deepest of `items` whose path `path` starts
/// with: `max_by_key` over the matching ones, so of equal depths the last.
pub fn deepest<'a, T>(
    path: &[u8],
    items: impl IntoIterator<Item = &'a T>,
    of: impl Fn(&T) -> &Path,
) -> Option<(usize, &'a T)>
where
    T: 'a,
{
    deepest_counted(path, items.into_iter().map(|item| (item, spelled_count(bytes(of(item))))), &of)
}

/// What [`deepest`] asks of each base on every call, asked once: the
/// number of components of a base spelled canonically (and not empty),
/// `None` for any other base.
pub fn spelled_count(base: &[u8]) -> Option<usize> {
    // `canonical_count` of a canonical base, counted as it is checked: the
    // root or a leading `.` is a component before the names.
    match base {
        [] | [b'.', b'/'] => None,
        [b'/'] | [b'.'] => Some(1),
        [b'/', body @ ..] | [b'.', b'/', body @ ..] => names(body, true).map(|n| n + 1),
        _ => names(base, true),
    }
}

/// [`deepest`] over items given with their [`spelled_count`], kept by a
/// caller that asks again and again of the same bases (a policy's roots).
pub fn deepest_counted<'a, T>(
    path: &[u8],
    items: impl IntoIterator<Item = (&'a T, Option<usize>)>,
    of: impl Fn(&T) -> &Path,
) -> Option<(usize, &'a T)>
where
    T: 'a,
{
    // Between two canonical spellings, components match exactly when the
    // bytes do up to a separator: one check of `path` spares splitting it
    // against every item.
    deepest_spelled(path, is_canonical(path), items, of).map(|(i, item, _)| (i, item))
}

/// [`deepest_counted`] for a caller that knows whether `path` is
/// canonical: `spelled` must be `is_canonical(path)`. Returns the depth of
/// the item found too, `of(item).components().count()`.
pub fn deepest_spelled<'a, T>(
    path: &[u8],
    spelled: bool,
    items: impl IntoIterator<Item = (&'a T, Option<usize>)>,
    of: impl Fn(&T) -> &Path,
) -> Option<(usize, &'a T, usize)>
where
    T: 'a,
{
    debug_assert_eq!(spelled, is_canonical(path));
    let mut best: Option<(usize, &'a T, usize)> = None;
    for (i, (item, count)) in items.into_iter().enumerate() {
        let base = bytes(of(item));
        let depth = match count {
            Some(count) if spelled => spelled_prefix_at(path, base).then_some(count),
            _ => prefix_depth(path, base),
        };
        if let Some(depth) = depth {
            if best.is_none_or(|(_, _, d)| depth >= d) {
                best = Some((i, item, depth));
            }
        }
    }
    best
}

/// `path.components().count()`.
pub fn count(path: &[u8]) -> usize {
    comps(path).count()
}

/// `Path::strip_prefix` of a canonical `path` by a base whose
/// [`spelled_count`] is a number and which `path` begins with up to a
/// separator (as [`deepest_spelled`] found it): what follows the base,
/// without the separator.
pub fn strip_spelled<'a>(path: &'a [u8], base: &[u8]) -> &'a [u8] {
    debug_assert!(is_canonical(path) && spelled_prefix(path, base));
    let rest = &path[base.len()..];
    rest.strip_prefix(b"/").unwrap_or(rest)
}

/// `Path::strip_prefix`, as bytes of `path`.
pub fn strip_prefix<'a>(path: &'a [u8], base: &[u8]) -> Option<&'a [u8]> {
    if spelled_prefix(path, base) {
        // `base` has a component, so the rest is trimmed at the front too.
        return Some(Comps { rest: &path[base.len()..], fresh: false }.as_bytes());
    }
    let mut p = comps(path);
    for b in comps(base) {
        if !p.next_is(b) {
            return None;
        }
    }
    Some(p.as_bytes())
}

/// `policy::normalize` on bytes: `.` dropped, `..` applied, `None` when a
/// `..` climbs above the start of a relative path, `/..` staying at `/`.
pub fn normalize(path: &[u8]) -> Option<Vec<u8>> {
    let absolute = is_absolute(path);
    let mut out: Vec<u8> = Vec::with_capacity(path.len());
    let mut depth = 0usize;
    for c in comps(path) {
        match c {
            Comp::Root => out.push(b'/'),
            Comp::Cur => {}
            Comp::Parent => {
                if depth > 0 {
                    // `PathBuf::pop` on a path built only of normal names.
                    match out.iter().rposition(|&b| b == b'/') {
                        Some(0) => out.truncate(1),
                        Some(i) => out.truncate(i),
                        None => out.clear(),
                    }
                    depth -= 1;
                } else if !absolute {
                    return None;
                }
            }
            Comp::Normal(n) => {
                if out.last().is_some_and(|&b| b != b'/') {
                    out.push(b'/');
                }
                out.extend_from_slice(n);
                depth += 1;
            }
        }
    }
    Some(out)
}

/// `PathBuf::push` of a relative `rel` onto `base`, as bytes.
pub fn join(base: &[u8], rel: &[u8]) -> Vec<u8> {
    if is_absolute(rel) {
        return rel.to_vec();
    }
    let mut out = Vec::with_capacity(base.len() + 1 + rel.len());
    out.extend_from_slice(base);
    if out.last().is_some_and(|&b| b != b'/') {
        out.push(b'/');
    }
    out.extend_from_slice(rel);
    out
}

/// Whether `path` is spelled exactly as [`canonical`] spells its
/// components: no empty or `.` names, no trailing `/`.
pub fn is_canonical(path: &[u8]) -> bool {
    let body = match path {
        [] | [b'/'] | [b'.'] => return true,
        [b'.', b'/'] => return false,
        [b'/', rest @ ..] | [b'.', b'/', rest @ ..] => rest,
        _ => path,
    };
    names(body, true).is_some()
}

/// The number of `/`-separated names of `body` when every one is a name
/// the canonical (or, without `dotdot`, the normal) spelling keeps: not
/// empty, not `.`, and `..` only with `dotdot`. One pass over the bytes,
/// as every file request asks it of a path or two.
fn names(body: &[u8], dotdot: bool) -> Option<usize> {
    let kept = |name: &[u8]| match name {
        b"" | b"." => false,
        b".." => dotdot,
        _ => true,
    };
    let (mut start, mut n) = (0, 1);
    let all = each_slash(body, |i| {
        let ok = kept(&body[start..i]);
        start = i + 1;
        n += 1;
        ok
    });
    (all && kept(&body[start..])).then_some(n)
}

/// Call `f` with the offset of every `/` in `path`, in order, while it
/// returns true; whether it always did. Paths are mostly short, where a
/// call into `memchr` per separator costs more than the bytes: eight bytes
/// are looked at a time, in a word.
fn each_slash(path: &[u8], mut f: impl FnMut(usize) -> bool) -> bool {
    if path.len() >= 128 {
        return memchr::memchr_iter(b'/', path).all(f);
    }
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const SLASHES: u64 = 0x2f2f_2f2f_2f2f_2f2f;
    let mut chunks = path.chunks_exact(8);
    let mut base = 0;
    for c in &mut chunks {
        let word = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // The high bit of each byte that is `/`, exactly (no carries).
        let v = word ^ SLASHES;
        let mut hits = !(((v & LOW7) + LOW7) | v | LOW7);
        while hits != 0 {
            if !f(base + (hits.trailing_zeros() / 8) as usize) {
                return false;
            }
            hits &= hits - 1;
        }
        base += 8;
    }
    for (i, &b) in chunks.remainder().iter().enumerate() {
        if b == b'/' && !f(base + i) {
            return false;
        }
    }
    true
}

/// Whether [`normalize`] returns `path` as it is: no empty, `.` or `..`
/// names, no trailing `/` (the root alone aside). Such a path is
/// canonical too.
pub fn is_normal(path: &[u8]) -> bool {
    match path {
        [b'/'] => true,
        [b'/', body @ ..] => names(body, false).is_some(),
        _ => names(path, false).is_some(),
    }
}

/// Where each name of `path` ends, when `path` is absolute and normal
/// ([`is_normal`]): the offsets of its separators but the first, and its
/// length (none for the root alone).
pub fn normal_ends(path: &[u8]) -> Option<Vec<usize>> {
    let [b'/', body @ ..] = path else { return None };
    let mut ends = Vec::with_capacity(8);
    if body.is_empty() {
        return Some(ends);
    }
    let normal = |name: &[u8]| !matches!(name, b"" | b"." | b"..");
    let mut start = 0;
    let all = each_slash(body, |i| {
        let ok = normal(&body[start..i]);
        start = i + 1;
        // Offsets in `path`, one byte on.
        ends.push(i + 1);
        ok
    });
    if !all || !normal(&body[start..]) {
        return None;
    }
    ends.push(path.len());
    Some(ends)
}

/// [`normalize`], borrowing `path` when it is normal already.
pub fn normalized(path: &[u8]) -> Option<Cow<'_, [u8]>> {
    if is_normal(path) {
        return Some(Cow::Borrowed(path));
    }
    normalize(path).map(Cow::Owned)
}

/// One spelling per path: two paths have the same components exactly when
/// their canonical spellings are the same bytes, so a map keyed by these
/// bytes finds what a map keyed by `PathBuf` would, comparing bytes only.
pub fn canonical(path: &[u8]) -> Cow<'_, [u8]> {
    if is_canonical(path) {
        return Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len());
    for c in comps(path) {
        let name: &[u8] = match c {
            Comp::Root => {
                out.push(b'/');
                continue;
            }
            Comp::Cur => {
                out.push(b'.');
                continue;
            }
            Comp::Parent => b"..",
            Comp::Normal(n) => n,
        };
        if out.last().is_some_and(|&b| b != b'/') {
            out.push(b'/');
        }
        out.extend_from_slice(name);
    }
    Cow::Owned(out)
}
