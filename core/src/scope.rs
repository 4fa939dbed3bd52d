//! What a request may reach once symlinks are resolved: the intersection of
//! the policies of every level between the child and the files.
//!
//! A [`Scope`] is a set of rules over absolute paths; the most specific rule
//! containing a path decides its access, and a path under no rule is out of
//! reach. Unlike a [`Policy`](crate::policy::Policy), a rule may deny
//! (`access: None`), which is what an intersection needs: a read-write root
//! of one level with a read-only root of another inside it, or a level
//! allowing `/a` and another only `/a/sub`. [`Scope::intersect`] is exact:
//! for every path, the access of the intersection is the lesser of the two
//! (property-tested below), so a level can only ever narrow what reaches
//! the files.
//!
//! A scope also carries the [`Guard`]: protected paths and secret files,
//! with the grants that lift them and the `--deny` globs that add to
//! them, met across levels the same way. [`Scope::decide`] is the one
//! decision every door takes on a resolved path: the most specific rule,
//! then the guard.
//!
//! The shell that owns the files checks the *resolved* path against the
//! scope ([`crate::resolve`]), never the path as the child wrote it.

use crate::guard::{Act, Guard, Hit};
use crate::policy::{bytes, normalize, Access, Root};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rules a scope sent over the wire (`narrow`, or an open's `scope`) may
/// hold; the frame size bounds their bytes.
pub const MAX_SCOPE_RULES: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rule {
    /// Absolute and lexically normal.
    pub path: PathBuf,
    /// `None`: nothing at or beneath `path` (unless a deeper rule says so).
    pub access: Option<Access>,
}

/// Written and read as its rules alone, and shown as them: the kept counts
/// are the rules'. Shared, as every host open's effect carries the scope it
/// is decided under.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Scope {
    rules: Arc<Rules>,
    guard: Arc<Guard>,
}

/// Why [`Scope::decide`] refused a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial<'a> {
    /// No rule gives access; `rule` is the one that decided, if any
    /// (a `none` rule of a narrowing).
    Outside { rule: Option<&'a Rule> },
    /// A change under a read-only rule.
    ReadOnly { rule: &'a Rule },
    /// A protected path, a secret file or a `--deny` glob.
    Guarded(Hit),
}

#[derive(Default, PartialEq, Eq)]
struct Rules {
    /// Sorted by path, one rule per path, none redundant.
    rules: Vec<Rule>,
    /// Each rule's [`bytes::spelled_count`], which every lookup would
    /// otherwise derive again.
    counts: Vec<Option<usize>>,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Scope");
        d.field("rules", &self.rules.rules);
        if !self.guard.is_plain() {
            d.field("guard", &*self.guard);
        }
        d.finish()
    }
}

/// A scope as written: its rules alone when its guard is the plain rule
/// (as every scope was written before guards), else both.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Written {
    Rules(Vec<Rule>),
    WithGuard { rules: Vec<Rule>, guard: Guard },
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.guard.is_plain() {
            self.rules.rules.serialize(s)
        } else {
            #[derive(Serialize)]
            struct Both<'a> {
                rules: &'a [Rule],
                guard: &'a Guard,
            }
            Both { rules: &self.rules.rules, guard: &self.guard }.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Scope {
    /// Taken as written, unsorted and unsimplified.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Written::deserialize(d)? {
            Written::Rules(rules) => Scope::kept(rules),
            Written::WithGuard { rules, guard } => Scope::kept(rules).with_guard(guard),
        })
    }
}

/// Why a scope from the wire was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeError(pub String);

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Scope {
    /// Everything, read-write: the identity of [`Scope::intersect`].
    /// Its guard lifts every rule too.
    pub fn everything() -> Self {
        Scope::kept(vec![Rule { path: PathBuf::from("/"), access: Some(Access::ReadWrite) }])
            .with_guard(Guard::everything())
    }

    /// A scope of `rules` as they are, under the plain guard.
    fn kept(rules: Vec<Rule>) -> Self {
        let counts = rules.iter().map(|r| bytes::spelled_count(bytes::bytes(&r.path))).collect();
        Scope { rules: Arc::new(Rules { rules, counts }), guard: Arc::default() }
    }

    /// The same rules under `guard`.
    pub fn with_guard(mut self, guard: Guard) -> Self {
        self.guard = Arc::new(guard);
        self
    }

    /// Protected paths, secret files and `--deny` globs, with their grants.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Nothing at all.
    pub fn nothing() -> Self {
        Scope::default()
    }

    /// The scope of a policy's roots (absolute, normal, as `Policy` keeps them).
    pub fn from_roots(roots: &[Root]) -> Self {
        Self::from_rules(roots.iter().map(|r| Rule { path: r.path.clone(), access: Some(r.access) }))
    }

    /// Build from rules, merging duplicates (the greater access wins, as for
    /// a policy's equal roots) and dropping redundant ones.
    pub fn from_rules(rules: impl IntoIterator<Item = Rule>) -> Self {
        let mut v: Vec<Rule> = rules.into_iter().collect();
        v.sort();
        // Of equal paths the greatest access sorts last: keep it.
        let mut out: Vec<Rule> = Vec::with_capacity(v.len());
        for r in v {
            match out.last_mut() {
                Some(last) if last.path == r.path => *last = r,
                _ => out.push(r),
            }
        }
        simplified(out)
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules.rules
    }

    /// The access the most specific rule containing `path` gives.
    pub fn access(&self, path: &Path) -> Option<Access> {
        self.rule_for(path).and_then(|r| r.access)
    }

    /// The rule that decides `path`: the deepest one containing it.
    pub fn rule_for(&self, path: &Path) -> Option<&Rule> {
        let path = bytes::bytes(path);
        self.rule_for_spelled(path, bytes::is_canonical(path))
    }

    /// [`Scope::rule_for`] the bytes of a path, `spelled` being whether
    /// they are canonical ([`bytes::is_canonical`]), which the caller knows.
    pub fn rule_for_spelled(&self, path: &[u8], spelled: bool) -> Option<&Rule> {
        let Rules { rules, counts } = &*self.rules;
        bytes::deepest_spelled(path, spelled, rules.iter().zip(counts.iter().copied()), |r| &r.path)
            .map(|(_, r, _)| r)
    }

    /// Whether `path` may be opened for reading, or writing when `write`:
    /// [`Scope::decide`] on a file.
    pub fn permits(&self, path: &Path, write: bool) -> bool {
        let b = bytes::bytes(path);
        let act = if write { Act::Write } else { Act::Read };
        self.decide_spelled(b, bytes::is_canonical(b), act, false).is_ok()
    }

    /// The decision on a resolved path (canonical, absolute) for `act`:
    /// the most specific rule must give access (writing for an act that
    /// changes the file system), then the guard must not refuse. `Ok`
    /// carries what a grant lifted, for the report. `is_dir`: whether the
    /// path is a directory (a `--deny` glob ending in `/` matches only
    /// those).
    pub fn decide(&self, path: &[u8], act: Act, is_dir: bool) -> Result<Option<Hit>, Denial<'_>> {
        self.decide_spelled(path, true, act, is_dir)
    }

    fn decide_spelled(
        &self,
        path: &[u8],
        spelled: bool,
        act: Act,
        is_dir: bool,
    ) -> Result<Option<Hit>, Denial<'_>> {
        let rule = self.rule_for_spelled(path, spelled);
        let Some(r) = rule.filter(|r| r.access.is_some()) else {
            return Err(Denial::Outside { rule });
        };
        let canonical;
        let path = if spelled {
            path
        } else {
            canonical = bytes::canonical(path);
            &canonical
        };
        let hit = self.guard.check(Path::new(bytes::os(path)), act, is_dir).map_err(Denial::Guarded)?;
        if act.changes() && r.access == Some(Access::ReadOnly) {
            return Err(Denial::ReadOnly { rule: r });
        }
        Ok(hit)
    }

    /// The scope that gives every path the lesser of the two accesses.
    ///
    /// Why it is exact: for a path `p`, let `r` be the deepest rule of
    /// either scope containing `p`. The deepest rule of `self` containing
    /// `p` contains `r` too (both are ancestors of `p`, and `r` is the
    /// deepest), so `self.access(p) == self.access(r)`, and likewise for
    /// `other`. Giving every rule path of either scope the lesser of the
    /// two accesses at that path therefore gives every path its lesser one.
    pub fn intersect(&self, other: &Scope) -> Scope {
        let rules = self
            .rules()
            .iter()
            .chain(other.rules())
            .map(|r| Rule { path: r.path.clone(), access: self.access(&r.path).min(other.access(&r.path)) });
        let mut v: Vec<Rule> = rules.collect();
        v.sort();
        v.dedup();
        simplified(v).with_guard(self.guard.intersect(&other.guard))
    }

    /// The wire form: `{"rules":[{"path":"/a","access":"r"|"rw"|"none"}]}`,
    /// with a `"guard"` ([`Guard::to_wire`]) unless it is the plain rule.
    pub fn to_wire(&self) -> serde_json::Value {
        let rules: Vec<serde_json::Value> = self
            .rules()
            .iter()
            .map(|r| {
                let access = match r.access {
                    Some(Access::ReadOnly) => "r",
                    Some(Access::ReadWrite) => "rw",
                    None => "none",
                };
                serde_json::json!({ "path": r.path.to_string_lossy(), "access": access })
            })
            .collect();
        if self.guard.is_plain() {
            serde_json::json!({ "rules": rules })
        } else {
            serde_json::json!({ "rules": rules, "guard": self.guard.to_wire() })
        }
    }

    /// Parse the wire form, refusing relative, unnormalized or NUL-bearing
    /// paths and more than [`MAX_SCOPE_RULES`] rules.
    pub fn from_wire(v: &serde_json::Value) -> Result<Scope, ScopeError> {
        let err = |m: &str| ScopeError(m.to_owned());
        let rules =
            v.get("rules").and_then(serde_json::Value::as_array).ok_or_else(|| err("missing rules"))?;
        if rules.len() > MAX_SCOPE_RULES {
            return Err(ScopeError(format!("{} rules exceed the limit of {MAX_SCOPE_RULES}", rules.len())));
        }
        let mut out = Vec::with_capacity(rules.len());
        for r in rules {
            let path =
                r.get("path").and_then(serde_json::Value::as_str).ok_or_else(|| err("rule lacks a path"))?;
            let access = match r.get("access").and_then(serde_json::Value::as_str) {
                Some("r") => Some(Access::ReadOnly),
                Some("rw") => Some(Access::ReadWrite),
                Some("none") => None,
                _ => return Err(err("rule access must be r, rw or none")),
            };
            let p = Path::new(path);
            if path.contains('\0') || !p.is_absolute() || normalize(p).as_deref() != Some(p) {
                return Err(ScopeError(format!("rule path {path:?} is not absolute and normal")));
            }
            out.push(Rule { path: p.to_path_buf(), access });
        }
        // A level that sends no guard asks for the plain rule: no grant
        // lifts it.
        let guard = match v.get("guard") {
            None => Guard::default(),
            Some(g) => Guard::from_wire(g).map_err(|e| ScopeError(e.to_string()))?,
        };
        Ok(Scope::from_rules(out).with_guard(guard))
    }
}

/// Drop rules that give what their nearest enclosing rule (or, at the
/// top, the default: nothing) already gives. `rules` is sorted, so a
/// rule's ancestors come before it.
fn simplified(rules: Vec<Rule>) -> Scope {
    let mut kept: Vec<Rule> = Vec::with_capacity(rules.len());
    for r in rules {
        let inherited = bytes::deepest(bytes::bytes(&r.path), &kept, |k| &k.path).and_then(|(_, k)| k.access);
        if inherited != r.access {
            kept.push(r);
        }
    }
    Scope::kept(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(path: &str, access: Option<Access>) -> Rule {
        Rule { path: path.into(), access }
    }

    const RO: Option<Access> = Some(Access::ReadOnly);
    const RW: Option<Access> = Some(Access::ReadWrite);

    #[test]
    fn nested_narrower_and_read_only_inside_writable() {
        let top = Scope::from_rules([rule("/d", RW), rule("/d/ro", RO)]);
        let nested = Scope::from_rules([rule("/d/a/sub", RW)]);
        let both = top.intersect(&nested);
        assert_eq!(both.access(Path::new("/d/a/sub/x")), RW);
        assert_eq!(both.access(Path::new("/d/a/other")), None);
        assert_eq!(both.access(Path::new("/d/ro/keep.txt")), None);
        let wide = Scope::from_rules([rule("/d", RW)]);
        assert_eq!(top.intersect(&wide).access(Path::new("/d/ro/keep.txt")), RO);
        assert!(!top.intersect(&wide).permits(Path::new("/d/ro/keep.txt"), true));
        assert_eq!(top.intersect(&Scope::nothing()), Scope::nothing());
        assert_eq!(top.intersect(&Scope::everything()), top);
        // "/dataset" is not under "/data".
        assert_eq!(Scope::from_rules([rule("/data", RW)]).access(Path::new("/dataset")), None);
    }

    #[test]
    fn wire_round_trip_and_refusals() {
        let s = Scope::from_rules([rule("/d", RW), rule("/d/ro", RO), rule("/d/ro/x", None)]);
        assert_eq!(Scope::from_wire(&s.to_wire()), Ok(s));
        for bad in [
            serde_json::json!({}),
            serde_json::json!({ "rules": [{ "path": "rel", "access": "r" }] }),
            serde_json::json!({ "rules": [{ "path": "/a/../b", "access": "r" }] }),
            serde_json::json!({ "rules": [{ "path": "/a", "access": "x" }] }),
            serde_json::json!({ "rules": [{ "path": "/a\u{0}", "access": "r" }] }),
        ] {
            assert!(Scope::from_wire(&bad).is_err(), "{bad}");
        }
        let many: Vec<_> = (0..=MAX_SCOPE_RULES)
            .map(|i| serde_json::json!({"path": format!("/{i}"), "access": "r"}))
            .collect();
        assert!(Scope::from_wire(&serde_json::json!({ "rules": many })).is_err());
    }

    #[test]
    fn a_guard_travels_with_its_scope() {
        use crate::guard::{Grants, Guard};
        let g = Guard::new(Grants::new(["/d/.git/hooks".into()]), Grants::default(), None, ["/h".into()]);
        let s = Scope::from_rules([rule("/d", RW)]).with_guard(g.clone());
        assert_eq!(Scope::from_wire(&s.to_wire()), Ok(s.clone()));
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Scope>(&text).unwrap(), s);
        // A scope with the plain rule is written as its rules alone, as
        // before guards; read back, it has the plain rule.
        let plain = Scope::from_rules([rule("/d", RW)]);
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#"[{"path":"/d","access":"read_write"}]"#);
        assert_eq!(plain.to_wire(), serde_json::json!({"rules": [{"path": "/d", "access": "rw"}]}));
        // A level that sends none gets no grant; one that grants more
        // than this level is met with this level's.
        let from_old =
            Scope::from_wire(&serde_json::json!({"rules": [{"path": "/d", "access": "rw"}]})).unwrap();
        assert!(!from_old.permits(Path::new("/d/.git/hooks/x"), true));
        assert!(s.permits(Path::new("/d/.git/hooks/x"), true));
        assert!(!s.intersect(&from_old).permits(Path::new("/d/.git/hooks/x"), true));
        assert!(!s.permits(Path::new("/d/.env"), false));
        assert!(Scope::everything().permits(Path::new("/d/.env"), false));
        assert!(Scope::from_wire(&serde_json::json!({"rules": [], "guard": {"protected": ["x"]}})).is_err());
    }

    fn arb_path() -> impl Strategy<Value = PathBuf> {
        proptest::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 0..4)
            .prop_map(|parts| PathBuf::from(format!("/{}", parts.join("/"))))
    }

    fn arb_access() -> impl Strategy<Value = Option<Access>> {
        prop_oneof![Just(None), Just(RO), Just(RW)]
    }

    fn arb_scope() -> impl Strategy<Value = Scope> {
        proptest::collection::vec((arb_path(), arb_access()), 0..6)
            .prop_map(|v| Scope::from_rules(v.into_iter().map(|(path, access)| Rule { path, access })))
    }

    proptest! {
        /// The effective access of a path is the minimum over the levels,
        /// whatever the levels' rules and however they are grouped.
        #[test]
        fn intersection_is_the_minimum_over_levels(levels in proptest::collection::vec(arb_scope(), 1..4), p in arb_path()) {
            let min = levels.iter().map(|s| s.access(&p)).min().flatten();
            let folded = levels.iter().fold(Scope::everything(), |acc, s| acc.intersect(s));
            prop_assert_eq!(folded.access(&p), min);
            let rev = levels.iter().rev().fold(Scope::everything(), |acc, s| acc.intersect(s));
            prop_assert_eq!(rev.access(&p), min);
            prop_assert!(folded.rules().len() <= levels.iter().map(|s| s.rules().len()).sum::<usize>() + 1);
        }

        /// A scope built from a policy's roots agrees with the policy.
        #[test]
        fn scope_of_roots_agrees_with_the_policy(roots in proptest::collection::vec((arb_path(), any::<bool>()), 0..5), p in arb_path(), write in any::<bool>()) {
            let roots: Vec<Root> = roots.into_iter().map(|(path, rw)| Root { path, access: if rw { Access::ReadWrite } else { Access::ReadOnly } }).collect();
            let policy = crate::policy::Policy::new("/".into(), roots.clone());
            let scope = Scope::from_roots(policy.roots());
            let by_policy = matches!(policy.resolve(p.to_str().unwrap(), write), Ok(crate::policy::Resolved::Host { .. }));
            prop_assert_eq!(scope.permits(&p, write), by_policy);
        }
    }
}
