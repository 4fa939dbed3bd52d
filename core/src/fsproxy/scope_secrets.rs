//! The secrets of narrowed scopes: which secret sent on the session socket
//! admits a connection under which narrowing.
//!
//! A `narrow` is answered with a secret of its own, drawn by the shell
//! (`Effect::DrawSecret`: the machine makes no randomness) and bound here
//! to the narrowed scope. Whoever narrowed puts that secret, never the
//! session's, in the environment of what it starts; a connection on the
//! session socket that sends it is admitted under that scope and nothing
//! wider, so closing the narrowed descriptor and reconnecting no longer
//! widens a process back to the session's policy.
//!
//! A scope's secret works while some client holds the scope: the
//! connection that narrowed, those attached from it, those admitted with
//! the secret. When the last goes, the entry goes and the secret is
//! unknown from then on. At most [`MAX_SCOPE_SECRETS`] are live; a
//! `narrow` past that is refused (E_RANGE) and changes nothing.

use crate::scope::Scope;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Narrowed scopes whose secrets may be live at once in one session.
pub const MAX_SCOPE_SECRETS: usize = 256;
/// A secret as sent on the session socket: 32 random bytes in lowercase
/// hex (the session's own secret has the same form).
pub const SECRET_LEN: usize = 64;

/// A secret as the shell drew it or a connection sent it: exactly
/// [`SECRET_LEN`] lowercase hex digits. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Secret(String);

impl Secret {
    /// `sent` as a secret, when it has the form of one.
    pub fn parse(sent: &[u8]) -> Option<Secret> {
        let ok = sent.len() == SECRET_LEN && sent.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        // Hex digits only, so this is UTF-8.
        ok.then(|| Secret(String::from_utf8_lossy(sent).into_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Equal in time independent of where they differ.
    fn same(&self, other: &Secret) -> bool {
        let diff = self.0.bytes().zip(other.0.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0 && self.0.len() == other.0.len()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl TryFrom<String> for Secret {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Secret::parse(s.as_bytes()).ok_or_else(|| format!("a secret is {SECRET_LEN} lowercase hex digits"))
    }
}

impl From<Secret> for String {
    fn from(s: Secret) -> String {
        s.0
    }
}

/// Names one live narrowed scope in [`ScopeSecrets`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScopeKey(u64);

/// Why a scope's secret was not bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindError {
    /// [`MAX_SCOPE_SECRETS`] are live.
    Full,
    /// The shell drew a secret already bound (never, from a real RNG):
    /// binding it twice would make one secret mean two scopes.
    Taken,
}

#[derive(Debug)]
struct Entry {
    secret: Secret,
    /// The narrowing itself, as clients under it carry it.
    scope: Scope,
    /// This level's own scope intersected with `scope`.
    effective: Scope,
    /// Clients under this scope; the entry goes with the last.
    holders: usize,
}

/// The live narrowed scopes and their secrets.
#[derive(Debug, Default)]
pub struct ScopeSecrets {
    entries: BTreeMap<ScopeKey, Entry>,
    /// Draws asked of the shell and not yet bound: they count against
    /// [`MAX_SCOPE_SECRETS`], so a burst of `narrow`s cannot pass it.
    reserved: usize,
    next: u64,
}

impl ScopeSecrets {
    /// Room for one more secret: reserved until [`bind`](Self::bind) or
    /// [`unreserve`](Self::unreserve). `false` when none is left.
    pub fn reserve(&mut self) -> bool {
        if self.entries.len() + self.reserved >= MAX_SCOPE_SECRETS {
            return false;
        }
        self.reserved += 1;
        true
    }

    /// A reservation that will not be bound (the draw failed, or the
    /// client left meanwhile).
    pub fn unreserve(&mut self) {
        self.reserved = self.reserved.saturating_sub(1);
    }

    /// Bind `secret` to `scope` for one holder (the client that narrowed),
    /// using up a reservation if there is one.
    pub fn bind(&mut self, secret: Secret, scope: Scope, effective: Scope) -> Result<ScopeKey, BindError> {
        let reserved = self.reserved > 0;
        self.unreserve();
        if self.find(&secret).is_some() {
            return Err(BindError::Taken);
        }
        if !reserved && self.entries.len() >= MAX_SCOPE_SECRETS {
            return Err(BindError::Full);
        }
        let key = ScopeKey(self.next);
        self.next += 1;
        self.entries.insert(key, Entry { secret, scope, effective, holders: 1 });
        Ok(key)
    }

    /// The live scope `sent` is the secret of. Every entry is compared
    /// whole, whichever matches, so the time taken says nothing of which
    /// secrets exist.
    pub fn find(&self, sent: &Secret) -> Option<ScopeKey> {
        let mut found = None;
        for (k, e) in &self.entries {
            if e.secret.same(sent) {
                found = Some(*k);
            }
        }
        found
    }

    /// The narrowing and the effective scope of `key`.
    pub fn scopes(&self, key: ScopeKey) -> Option<(&Scope, &Scope)> {
        self.entries.get(&key).map(|e| (&e.scope, &e.effective))
    }

    /// One more client under `key`.
    pub fn hold(&mut self, key: ScopeKey) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.holders += 1;
        }
    }

    /// One client under `key` is gone (or narrowed further); the last
    /// takes the secret with it.
    pub fn release(&mut self, key: ScopeKey) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.holders -= 1;
            if e.holders == 0 {
                self.entries.remove(&key);
            }
        }
    }

    /// Live secrets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secret(n: u64) -> Secret {
        Secret::parse(format!("{n:064x}").as_bytes()).expect("hex")
    }

    #[test]
    fn a_secret_has_one_form_and_is_never_printed() {
        assert!(Secret::parse(&[b'a'; SECRET_LEN]).is_some());
        assert!(Secret::parse(&[b'A'; SECRET_LEN]).is_none());
        assert!(Secret::parse(&[b'a'; SECRET_LEN - 1]).is_none());
        assert!(Secret::parse(&[b'g'; SECRET_LEN]).is_none());
        assert_eq!(format!("{:?}", secret(7)), "Secret(..)");
        assert!(serde_json::from_str::<Secret>("\"abc\"").is_err());
    }

    #[test]
    fn the_table_is_bounded_and_a_full_one_refuses() {
        let mut t = ScopeSecrets::default();
        for n in 0..MAX_SCOPE_SECRETS as u64 {
            assert!(t.reserve());
            t.bind(secret(n), Scope::default(), Scope::default()).expect("room");
        }
        assert!(!t.reserve());
        assert_eq!(t.bind(secret(u64::MAX), Scope::default(), Scope::default()), Err(BindError::Full));
        // One ending makes room again.
        let k = t.find(&secret(3)).expect("live");
        t.release(k);
        assert!(t.reserve());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Bind(u8),
        Hold(u8),
        Release(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u8..8).prop_map(Step::Bind),
            (0u8..8).prop_map(Step::Hold),
            (0u8..8).prop_map(Step::Release),
        ]
    }

    proptest! {
        /// Against a model (secret → holders): a secret finds its own scope
        /// exactly while it has a holder, never another's, and never after
        /// its last holder went.
        #[test]
        fn a_secret_maps_to_its_own_scope_while_held(steps in proptest::collection::vec(step(), 0..64)) {
            let mut t = ScopeSecrets::default();
            let mut model: BTreeMap<u8, (ScopeKey, usize)> = BTreeMap::new();
            let mut ended: Vec<u8> = Vec::new();
            // Each secret's scope is told apart by its rules' root.
            let scope_of = |n: u8| {
                Scope::from_rules([crate::scope::Rule {
                    path: format!("/s{n}").into(),
                    access: Some(crate::policy::Access::ReadOnly),
                }])
            };
            for s in steps {
                match s {
                    Step::Bind(n) if !model.contains_key(&n) && !ended.contains(&n) => {
                        prop_assert!(t.reserve());
                        let k = t.bind(secret(u64::from(n)), scope_of(n), scope_of(n)).expect("room");
                        model.insert(n, (k, 1));
                    }
                    Step::Bind(_) => {}
                    Step::Hold(n) => {
                        if let Some((k, h)) = model.get_mut(&n) {
                            t.hold(*k);
                            *h += 1;
                        }
                    }
                    Step::Release(n) => {
                        if let Some((k, h)) = model.get_mut(&n) {
                            t.release(*k);
                            *h -= 1;
                            if *h == 0 {
                                model.remove(&n);
                                ended.push(n);
                            }
                        }
                    }
                }
                for n in 0..8u8 {
                    let found = t.find(&secret(u64::from(n)));
                    match model.get(&n) {
                        Some((k, _)) => {
                            prop_assert_eq!(found, Some(*k));
                            let (scope, _) = t.scopes(*k).expect("live");
                            prop_assert_eq!(scope, &scope_of(n));
                        }
                        None => prop_assert_eq!(found, None),
                    }
                }
                prop_assert_eq!(t.len(), model.len());
            }
        }
    }
}
