//! The path handling of the policy, the scope and the symlink walk as they
//! were written on `std::path` components, kept as the oracle the byte
//! implementations are held to: same answers, same refusals, same bytes,
//! on arbitrary and hostile paths (empty, `.`, `..`, `//`, trailing
//! slashes, NUL, non-UTF-8, very long, symlinks anywhere).

use super::bytes;
use super::{Access, Denied, Policy, Resolved, Root, RootId};
use crate::fsproxy::wire::Mode;
use crate::resolve::{self, Entry, Final, Namespace, OpenFinal, Refusal, Via, MAX_SYMLINK_HOPS};
use crate::scope::{Rule, Scope};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

fn old_normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in path.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                out.push(c.as_os_str());
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if depth > 0 {
                    out.pop();
                    depth -= 1;
                } else if !path.is_absolute() {
                    return None;
                }
            }
            Component::Normal(n) => {
                out.push(n);
                depth += 1;
            }
        }
    }
    Some(out)
}

fn old_resolve(policy: &Policy, path: &str, write: bool) -> Result<Resolved, Denied> {
    if path.is_empty() {
        return Err(Denied::Empty);
    }
    if path.contains('\0') {
        return Err(Denied::Nul);
    }
    let p = Path::new(path);
    let relative = !p.is_absolute();
    let norm_rel = if relative { Some(old_normalize(p).ok_or(Denied::Escape)?) } else { None };
    let abs = match &norm_rel {
        Some(rel) => policy.cwd.join(rel),
        None => old_normalize(p).ok_or(Denied::Escape)?,
    };
    let best = policy
        .roots
        .iter()
        .enumerate()
        .filter(|(_, r)| abs.starts_with(&r.path))
        .max_by_key(|(_, r)| r.path.components().count());
    match (best, norm_rel) {
        (Some((i, root)), _) => {
            if write && root.access == Access::ReadOnly {
                return Err(Denied::ReadOnly { root: root.path.clone() });
            }
            let rel = abs.strip_prefix(&root.path).map(Path::to_path_buf).unwrap_or_default();
            Ok(Resolved::Host { root: RootId(i), rel })
        }
        (None, Some(rel)) => {
            let name = rel.to_str().ok_or(Denied::Nul)?;
            if name.is_empty() {
                return Err(Denied::Empty);
            }
            Ok(Resolved::Virtual { name: name.to_owned() })
        }
        (None, None) => Err(Denied::OutsideRoots),
    }
}

fn old_rule_for<'a>(rules: &'a [Rule], path: &Path) -> Option<&'a Rule> {
    rules.iter().filter(|r| path.starts_with(&r.path)).max_by_key(|r| r.path.components().count())
}

fn old_permits(rules: &[Rule], path: &Path, write: bool) -> bool {
    match old_rule_for(rules, path).and_then(|r| r.access) {
        Some(Access::ReadWrite) => true,
        Some(Access::ReadOnly) => !write,
        None => false,
    }
}

fn old_from_rules(rules: Vec<Rule>) -> Vec<Rule> {
    let mut v = rules;
    v.sort();
    let mut out: Vec<Rule> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(last) if last.path == r.path => *last = r,
            _ => out.push(r),
        }
    }
    let mut kept: Vec<Rule> = Vec::with_capacity(out.len());
    for r in out {
        let inherited = kept
            .iter()
            .filter(|k| r.path.starts_with(&k.path))
            .max_by_key(|k| k.path.components().count())
            .and_then(|k| k.access);
        if inherited != r.access {
            kept.push(r);
        }
    }
    kept
}

fn old_rewrite(dir: &[OsString], target: &Path, rest: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = if target.is_absolute() { Vec::new() } else { dir.to_vec() };
    for c in target.components() {
        match c {
            Component::Normal(n) => out.push(n.to_owned()),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out.extend(rest.iter().cloned());
    out
}

fn old_to_path(parts: &[OsString]) -> PathBuf {
    let mut p = PathBuf::from("/");
    p.extend(parts);
    p
}

fn old_outside(scope: &Scope, path: PathBuf, via: Option<Via>) -> Refusal {
    let denied_by = old_rule_for(scope.rules(), &path).filter(|r| r.access.is_none()).map(|r| r.path.clone());
    Refusal::Outside { path, denied_by, via }
}

fn old_open<N: OpenFinal>(
    ns: &mut N,
    anchors: &[PathBuf],
    path: &Path,
    mode: Mode,
    scope: &Scope,
) -> Result<(N::File, PathBuf), Refusal> {
    let mut parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            _ => None,
        })
        .collect();
    let mut hops = 0;
    let mut via: Option<Via> = None;
    let note = |link: PathBuf, via: &mut Option<Via>| {
        if via.is_none() {
            let root =
                old_rule_for(scope.rules(), &link).filter(|r| r.access.is_some()).map(|r| r.path.clone());
            *via = Some(Via { link, root });
        }
    };
    'walk: loop {
        let Some((name, parent)) = parts.split_last() else {
            return Err(Refusal::Denied("not a regular file".into()));
        };
        let parent_path = old_to_path(parent);
        let Some((index, anchor)) = anchors
            .iter()
            .enumerate()
            .filter(|(_, a)| parent_path.starts_with(a))
            .max_by_key(|(_, a)| a.components().count())
        else {
            let path = old_to_path(&parts);
            let normal = |a: &PathBuf| {
                let names: Vec<OsString> = a
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_owned()),
                        _ => None,
                    })
                    .collect();
                old_to_path(&names)
            };
            if old_rule_for(scope.rules(), &path).is_some_and(|r| r.access.is_some())
                && anchors.iter().any(|a| normal(a) == path)
            {
                return Err(Refusal::Denied("is a directory, not a regular file".into()));
            }
            return Err(old_outside(scope, path, via));
        };
        let depth = anchor.components().count() - 1;
        let mut dir = ns.anchor(index)?;
        for i in depth..parent.len() {
            match ns.lookup(&dir, &parent[i])? {
                Entry::Dir(d) => dir = d,
                Entry::Symlink(target) => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(Refusal::TooManyLinks);
                    }
                    note(old_to_path(&parent[..=i]), &mut via);
                    parts = old_rewrite(&parent[..i], &target, &parts[i + 1..]);
                    continue 'walk;
                }
                Entry::NotDir => return Err(Refusal::NotFound),
                Entry::Missing => return Err(Refusal::NotFound),
            }
        }
        let full = old_to_path(&parts);
        if !old_permits(scope.rules(), &full, false) {
            return Err(old_outside(scope, full, via));
        }
        // The guard is its own module, with its own tests: the walk is
        // held to asking it, on the resolved path, in this order.
        let act = if mode.writable() { crate::guard::Act::Write } else { crate::guard::Act::Read };
        if let Err(hit) = scope.guard().check(&full, act, false) {
            return Err(Refusal::Guarded { hit, via });
        }
        if mode.writable() && !old_permits(scope.rules(), &full, true) {
            let root = old_rule_for(scope.rules(), &full).map_or_else(|| full.clone(), |r| r.path.clone());
            return Err(Refusal::ReadOnly { path: full, root, via });
        }
        match ns.open_final(&dir, name, &full, mode)? {
            Final::File(f) => return Ok((f, full)),
            Final::Symlink(target) => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(Refusal::TooManyLinks);
                }
                note(full, &mut via);
                parts = old_rewrite(parent, &target, &[]);
            }
        }
    }
}

/// A namespace of absolute paths, looked up by component equality as a
/// real directory tree would (`/a//b` and `/a/b` are one name), which
/// records every call so that both walks can be held to the same calls.
#[derive(Clone, Debug, Default, PartialEq)]
struct Mem {
    nodes: BTreeMap<PathBuf, Node>,
    anchors: Vec<PathBuf>,
    calls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir,
    File,
    Link(PathBuf),
}

impl Namespace for Mem {
    type Dir = PathBuf;
    fn anchor(&mut self, index: usize) -> Result<PathBuf, Refusal> {
        self.calls.push(format!("anchor {index}"));
        self.anchors.get(index).cloned().ok_or_else(|| Refusal::Fs("unknown anchor".into()))
    }
    fn lookup(&mut self, dir: &PathBuf, name: &OsStr) -> Result<Entry<PathBuf>, Refusal> {
        self.calls.push(format!("lookup {dir:?} {name:?}"));
        let p = dir.join(name);
        Ok(match self.nodes.get(&p) {
            Some(Node::Dir) => Entry::Dir(p),
            Some(Node::File) => Entry::NotDir,
            Some(Node::Link(t)) => Entry::Symlink(t.clone()),
            None => Entry::Missing,
        })
    }
}

impl OpenFinal for Mem {
    type File = PathBuf;

    fn open_final(
        &mut self,
        dir: &PathBuf,
        name: &OsStr,
        path: &Path,
        mode: Mode,
    ) -> Result<Final<PathBuf>, Refusal> {
        self.calls.push(format!("open {dir:?} {name:?} {path:?} {mode:?}"));
        let p = dir.join(name);
        match self.nodes.get(&p).cloned() {
            Some(Node::File) => Ok(Final::File(p)),
            Some(Node::Link(t)) => Ok(Final::Symlink(t)),
            Some(Node::Dir) => Err(Refusal::Denied("not a regular file".into())),
            None if mode == Mode::Read => Err(Refusal::NotFound),
            None => {
                self.nodes.insert(p.clone(), Node::File);
                Ok(Final::File(p))
            }
        }
    }
}

fn os(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

/// One name of a hostile path.
fn arb_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "", ".", "..", "...", ".a", "a.", "a", "b", "c", "data", "ro", "rw", "sub", "scratch", "work",
            "proj", "one", "out.txt", "dataset", "link", "loop",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..6),
        1 => prop::collection::vec(prop::sample::select(vec![b'.', b'/', b'a', 0, 0xff, 0x80]), 0..6),
    ]
}

/// A hostile path: names joined with `/` or `//`, with or without a
/// leading `/` or `./`, a trailing `/` or `/.`, now and then very long.
fn arb_path() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(vec!["", "/", "//", "./", "/./", ".", "///"]),
        prop::collection::vec((arb_name(), prop::sample::select(vec!["/", "//", "/./"])), 0..7),
        prop::sample::select(vec!["", "/", "/.", "//", "/.."]),
        0..40usize,
    )
        .prop_map(|(lead, names, trail, long)| {
            let mut out = lead.as_bytes().to_vec();
            for (i, (n, sep)) in names.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(sep.as_bytes());
                }
                out.extend_from_slice(n);
            }
            if long > 36 {
                out.extend(std::iter::repeat_n(b'x', 5000));
                out.extend_from_slice(b"/../../y");
            }
            out.extend_from_slice(trail.as_bytes());
            out
        })
}

/// An absolute path spelled as a policy keeps it, or not.
fn arb_rooted() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(
            prop::sample::select(vec!["data", "ro", "rw", "sub", "a", "b", "work", "proj", "scratch"]),
            0..4,
        )
        .prop_map(|v| format!("/{}", v.join("/")).into_bytes()),
        1 => arb_path(),
    ]
}

fn utf8(b: Vec<u8>) -> String {
    String::from_utf8_lossy(&b).into_owned()
}

fn arb_access() -> impl Strategy<Value = Option<Access>> {
    prop_oneof![Just(None), Just(Some(Access::ReadOnly)), Just(Some(Access::ReadWrite))]
}

fn arb_rules() -> impl Strategy<Value = Vec<Rule>> {
    prop::collection::vec((arb_rooted(), arb_access()), 0..6).prop_map(|v| {
        v.into_iter().map(|(p, access)| Rule { path: PathBuf::from(OsString::from_vec(p)), access }).collect()
    })
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    let roots = prop::collection::vec((arb_rooted(), any::<bool>()), 0..5);
    (arb_rooted(), roots, any::<bool>()).prop_map(|(cwd, roots, raw)| {
        let roots: Vec<Root> = roots
            .into_iter()
            .map(|(p, rw)| Root {
                path: PathBuf::from(OsString::from_vec(p)),
                access: if rw { Access::ReadWrite } else { Access::ReadOnly },
            })
            .collect();
        let cwd = PathBuf::from(OsString::from_vec(cwd));
        // A policy read back from a trace is taken as written, unnormalized.
        if raw {
            Policy::kept(roots, cwd)
        } else {
            Policy::new(cwd, roots)
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn components_agree_with_std(p in arb_path(), base in arb_path()) {
        let (pp, bp) = (os(&p), os(&base));
        let ours: Vec<bytes::Comp> = bytes::comps(&p).collect();
        let std: Vec<bytes::Comp> = pp
            .components()
            .map(|c| match c {
                Component::RootDir => bytes::Comp::Root,
                Component::CurDir => bytes::Comp::Cur,
                Component::ParentDir => bytes::Comp::Parent,
                Component::Normal(n) => bytes::Comp::Normal(n.as_bytes()),
                Component::Prefix(_) => unreachable!("no prefixes on Unix"),
            })
            .collect();
        prop_assert_eq!(ours, std);
        prop_assert_eq!(bytes::count(&p), pp.components().count());
        prop_assert_eq!(bytes::is_absolute(&p), pp.is_absolute());
        prop_assert_eq!(bytes::starts_with(&p, &base), pp.starts_with(bp));
        prop_assert_eq!(bytes::starts_with(&p, &p), true);
        let depth = pp.starts_with(bp).then(|| bp.components().count());
        prop_assert_eq!(bytes::prefix_depth(&p, &base), depth);
        prop_assert_eq!(bytes::prefix_depth(&p, &p), Some(pp.components().count()));
        let ours = bytes::strip_prefix(&p, &base).map(|r| r.to_vec());
        let std = pp.strip_prefix(bp).ok().map(|r| r.as_os_str().as_bytes().to_vec());
        prop_assert_eq!(ours, std);
        let ours = bytes::strip_prefix(&p, &p[..p.len() / 2]).map(|r| r.to_vec());
        let std = pp.strip_prefix(os(&p[..p.len() / 2])).ok().map(|r| r.as_os_str().as_bytes().to_vec());
        prop_assert_eq!(ours, std);
        // `path` spelled from `base` on, with and without a separator.
        let canon = bytes::canonical(&base).into_owned();
        for joined in [[&canon[..], b"/", &p[..]].concat(), [&canon[..], &p[..]].concat()] {
            let jp = os(&joined);
            prop_assert_eq!(bytes::starts_with(&joined, &canon), jp.starts_with(os(&canon)));
            let depth = jp.starts_with(os(&canon)).then(|| os(&canon).components().count());
            prop_assert_eq!(bytes::prefix_depth(&joined, &canon), depth);
            let ours = bytes::strip_prefix(&joined, &canon).map(|r| r.to_vec());
            let std = jp.strip_prefix(os(&canon)).ok().map(|r| r.as_os_str().as_bytes().to_vec());
            prop_assert_eq!(ours, std);
        }
        // The deepest of several bases, canonical or not, as std picks it.
        let bases: Vec<PathBuf> = [base.clone(), canon.clone(), bytes::canonical(&p).into_owned(), p[..p.len() / 2].to_vec(), b"/".to_vec(), Vec::new()]
            .into_iter()
            .map(|b| PathBuf::from(OsString::from_vec(b)))
            .collect();
        for path in [p.clone(), bytes::canonical(&p).into_owned(), [&canon[..], b"/", &p[..]].concat(), bytes::canonical(&[&canon[..], b"/", &p[..]].concat()).into_owned()] {
            let ours = bytes::deepest(&path, &bases, PathBuf::as_path).map(|(i, _)| i);
            let std = bases
                .iter()
                .enumerate()
                .filter(|(_, b)| os(&path).starts_with(b))
                .max_by_key(|(_, b)| b.components().count())
                .map(|(i, _)| i);
            prop_assert_eq!(ours, std);
        }
        // What the policy and the walk ask of paths they know canonical.
        let norm = bytes::normalize(&p);
        prop_assert_eq!(bytes::normalized(&p).map(|n| n.into_owned()), norm.clone());
        let counted = (!p.is_empty() && bytes::is_canonical(&p)).then(|| pp.components().count());
        prop_assert_eq!(bytes::spelled_count(&p), counted);
        prop_assert_eq!(bytes::normal_ends(&p).is_some(), bytes::is_absolute(&p) && bytes::is_normal(&p));
        if bytes::is_normal(&p) {
            prop_assert_eq!(norm.as_deref(), Some(&p[..]));
            prop_assert!(bytes::is_canonical(&p));
        }
        for path in [p.clone(), bytes::canonical(&p).into_owned(), [&canon[..], b"/", &p[..]].concat(), bytes::canonical(&[&canon[..], b"/", &p[..]].concat()).into_owned()] {
            let spelled = bytes::is_canonical(&path);
            let counted = bases.iter().map(|b| (b, bytes::spelled_count(bytes::bytes(b))));
            let found = bytes::deepest_spelled(&path, spelled, counted, PathBuf::as_path);
            let std = bases
                .iter()
                .enumerate()
                .filter(|(_, b)| os(&path).starts_with(b))
                .max_by_key(|(_, b)| b.components().count())
                .map(|(i, b)| (i, b.components().count()));
            prop_assert_eq!(found.map(|(i, _, depth)| (i, depth)), std);
            if let Some((_, b, _)) = found.filter(|_| spelled) {
                let b = bytes::bytes(b);
                if bytes::spelled_count(b).is_some() {
                    let std = os(&path).strip_prefix(os(b)).ok().map(|r| r.as_os_str().as_bytes().to_vec());
                    prop_assert_eq!(Some(bytes::strip_spelled(&path, b).to_vec()), std);
                }
            }
        }
        let ours = bytes::join(&base, &p);
        prop_assert_eq!(ours, bp.join(pp).into_os_string().into_vec());
        let canon = bytes::canonical(&p);
        prop_assert_eq!(os(&canon), pp);
        prop_assert_eq!(bytes::is_canonical(&p), canon.as_ref() == p.as_slice());
        prop_assert_eq!(bytes::canonical(&p) == bytes::canonical(&base), pp == bp);
    }

    #[test]
    fn normalize_agrees(p in arb_path()) {
        let ours = super::normalize(os(&p)).map(|p| p.into_os_string().into_vec());
        let old = old_normalize(os(&p)).map(|p| p.into_os_string().into_vec());
        prop_assert_eq!(ours, old);
    }

    #[test]
    fn a_policy_read_back_keeps_its_roots_counts(policy in arb_policy()) {
        // JSON holds only UTF-8 paths.
        let json = serde_json::to_string(&policy);
        prop_assume!(json.is_ok());
        let json = json.expect("assumed");
        // The kept counts are not written: they are the roots'.
        let written: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let keys: Vec<&str> = written.as_object().expect("an object").keys().map(String::as_str).collect();
        prop_assert_eq!(keys, ["cwd", "roots"]);
        let back: Policy = serde_json::from_str(&json).expect("and reads back");
        // Equality covers the kept counts: rebuilt from the roots as read.
        prop_assert_eq!(back, policy);
    }

    #[test]
    fn policy_resolve_agrees(policy in arb_policy(), p in arb_path(), write in any::<bool>()) {
        let text = utf8(p);
        let ours = policy.resolve(&text, write);
        let old = old_resolve(&policy, &text, write);
        prop_assert_eq!(policy.reaches_host(&text, write), matches!(old, Ok(Resolved::Host { .. })));
        // `PathBuf` compares by components: hold the bytes to each other too.
        let raw = |r: &Result<Resolved, Denied>| match r {
            Ok(Resolved::Host { rel, .. }) => Some(rel.as_os_str().as_bytes().to_vec()),
            _ => None,
        };
        prop_assert_eq!(raw(&ours), raw(&old));
        prop_assert_eq!(ours, old);
    }

    #[test]
    fn scope_agrees(rules in arb_rules(), p in arb_path(), write in any::<bool>()) {
        let scope = Scope::from_rules(rules.clone());
        let old = old_from_rules(rules.clone());
        prop_assert_eq!(scope.rules(), old.as_slice());
        let path = os(&p);
        prop_assert_eq!(scope.rule_for(path), old_rule_for(scope.rules(), path));
        prop_assert_eq!(scope.permits(path, write), old_permits(scope.rules(), path, write));
        // Rules as sent, unsorted and unsimplified, decide alike too.
        let sent: Vec<Rule> = rules.into_iter().filter(|r| r.path.to_str().is_some()).collect();
        let raw: Scope = serde_json::from_value(serde_json::to_value(&sent).unwrap()).unwrap();
        prop_assert_eq!(raw.rules(), sent.as_slice());
        prop_assert_eq!(raw.rule_for(path), old_rule_for(raw.rules(), path));
        // Written, read and shown as its rules alone.
        prop_assert_eq!(serde_json::to_value(&raw).unwrap(), serde_json::to_value(&sent).unwrap());
        prop_assert_eq!(format!("{raw:?}"), format!("Scope {{ rules: {sent:?} }}"));
        prop_assert_eq!(format!("{raw:#?}"), format!("Scope {{\n    rules: {},\n}}", format!("{sent:#?}").replace('\n', "\n    ")));
        let copy = scope.clone();
        prop_assert_eq!(copy.rule_for(path), old_rule_for(scope.rules(), path));
        prop_assert_eq!(copy, scope);
    }
}

/// A tree of directories, files and symlinks under `/d` (the anchor)
/// with hostile link targets.
fn arb_tree() -> impl Strategy<Value = Mem> {
    let node = prop_oneof![
        2 => Just(Node::Dir),
        2 => Just(Node::File),
        3 => arb_path().prop_map(|t| Node::Link(PathBuf::from(OsString::from_vec(t)))),
        1 => arb_rooted().prop_map(|t| Node::Link(PathBuf::from(OsString::from_vec(t)))),
    ];
    let anchors = prop::sample::subsequence(vec!["/d", "/d/a", "/", "/d/a/b", "/e", "/d//a/"], 1..3);
    (prop::collection::vec((arb_rooted(), node), 0..16), anchors).prop_map(|(nodes, anchors)| {
        let mut m = Mem::default();
        for d in ["/d", "/d/a", "/d/a/b", "/e"] {
            m.nodes.insert(d.into(), Node::Dir);
        }
        for (p, n) in nodes {
            let p = PathBuf::from(OsString::from_vec([&b"/d/"[..], &p].concat()));
            m.nodes.insert(p, n);
        }
        m.anchors = anchors.into_iter().map(PathBuf::from).collect();
        m
    })
}

fn arb_mode() -> impl Strategy<Value = Mode> {
    prop::sample::select(vec![Mode::Read, Mode::Write, Mode::Append, Mode::ReadWrite])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// The walk makes the same calls on the namespace, in the same order,
    /// and ends the same way, byte for byte.
    #[test]
    fn open_agrees(tree in arb_tree(), p in arb_rooted(), mode in arb_mode(), rules in arb_rules()) {
        let scope = if rules.is_empty() { Scope::everything() } else { Scope::from_rules(rules) };
        let path = PathBuf::from(OsString::from_vec([&b"/d/"[..], &p].concat()));
        let (mut a, mut b) = (tree.clone(), tree.clone());
        let anchors = tree.anchors.clone();
        let ours = resolve::open(&mut a, &anchors, &path, mode, &scope);
        let old = old_open(&mut b, &anchors, &path, mode, &scope);
        let raw = |r: &Result<(PathBuf, PathBuf), Refusal>| match r {
            Ok((f, p)) => format!("{:?} {:?}", f.as_os_str().as_bytes(), p.as_os_str().as_bytes()),
            Err(e) => format!("{e:?} {e}"),
        };
        prop_assert_eq!(raw(&ours), raw(&old));
        prop_assert_eq!(ours, old);
        prop_assert_eq!(&a, &b);
        // Given the anchors' counts, or only some of them, it walks alike.
        let counts: Vec<Option<usize>> = anchors.iter().map(|a| bytes::spelled_count(bytes::bytes(a))).collect();
        for given in [&counts[..], &counts[..counts.len() / 2]] {
            let mut c = tree.clone();
            let counted = resolve::open_counted(&mut c, &anchors, given, &path, mode, &scope);
            let mut d = tree.clone();
            let plain = resolve::open(&mut d, &anchors, &path, mode, &scope);
            prop_assert_eq!(raw(&counted), raw(&plain));
            prop_assert_eq!(&c, &d);
        }
    }
}
