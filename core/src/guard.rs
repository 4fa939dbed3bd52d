//! Protected paths and secret files: the one rule every door applies, on
//! the path a request resolves to.
//!
//! - A **secret file** (the `.env` family, SSH private keys, credential
//!   files by convention, see [`names`]) and a path matching a `--deny`
//!   glob are out of reach: not read, not written, not listed.
//! - A **protected path** (what git, an editor, an agent or a login shell
//!   later runs without asking: `.git/config`, `.git/hooks/`, `.vscode/`,
//!   `.mcp.json`, `~/.bashrc`, …) may be read but never changed: not
//!   written, created, truncated, removed, renamed away or renamed onto.
//!   The rest of a `.git` directory (objects, refs, the index) stays
//!   writable, so `git add` and `git commit` keep working.
//!
//! A [`Guard`] is the rule with what lifts it: `--allow-protected PATH`
//! and `--allow-secret PATH` grants (a path and what lies beneath it), and
//! what adds to it: `--deny` globs. Guards of nested levels meet by
//! [`Guard::intersect`], exactly as scopes do: a path is granted only when
//! every level grants it, and refused when any level denies it.
//!
//! The decision is [`Guard::check`]: a pure function of the resolved
//! absolute path and the act, naming the rule that refused (or that a
//! grant lifted, for the report).

use crate::policy::{bytes, normalize};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod names;
#[cfg(test)]
mod tests;

/// Grants of one kind a guard sent over the wire may hold.
pub const MAX_GUARD_GRANTS: usize = 256;
/// `--deny` globs a guard sent over the wire may hold, all levels' together.
pub const MAX_GUARD_DENY: usize = 256;
/// Home directories a guard sent over the wire may name.
pub const MAX_GUARD_HOMES: usize = 16;

/// What kind of rule refused a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// May be read, never changed.
    Protected,
    /// Never reached at all.
    Secret,
    /// A `--deny` glob: never reached at all.
    Denied,
}

/// Which rule matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// `.git` itself (a directory, or a file redirecting to another git
    /// directory), its `modules/` and `worktrees/` entries.
    GitDir,
    /// `.git/config`, `config.worktree`, `commondir`, and theirs in
    /// submodules and worktrees.
    GitConfig,
    /// `.git/hooks/`, and submodules'.
    GitHooks,
    /// `.vscode/`, `.idea/`, `.devcontainer/`.
    EditorConfig,
    /// `.claude/`, `.cursor/`, `.codex/`, `.gemini/`, `.mcp.json`, `.claude.json`.
    AgentConfig,
    /// `.envrc`: a script direnv runs on entering its directory. Read, it
    /// is a secret of the `.env` family; changed, it is this rule.
    ShellHook,
    /// Shell and login start-up files, `.gitconfig`, `.ssh/config`, … in a
    /// home directory.
    HomeStartup,
    /// The `.env` family.
    EnvFile,
    /// SSH private keys.
    SshKey,
    /// Credential files by convention (`.netrc`, `.pgpass`, `.npmrc`,
    /// `.pypirc`, cloud credentials, …).
    Credentials,
    /// A `--deny` glob.
    DenyGlob,
}

impl Rule {
    pub fn class(self) -> Class {
        match self {
            Rule::GitDir
            | Rule::GitConfig
            | Rule::GitHooks
            | Rule::EditorConfig
            | Rule::AgentConfig
            | Rule::ShellHook
            | Rule::HomeStartup => Class::Protected,
            Rule::EnvFile | Rule::SshKey | Rule::Credentials => Class::Secret,
            Rule::DenyGlob => Class::Denied,
        }
    }

    /// What the rule covers, for a refusal.
    pub fn describe(self) -> &'static str {
        match self {
            Rule::GitDir => "a git directory itself: .git, a .git file, .git/modules, .git/worktrees",
            Rule::GitConfig => "the repository's executable configuration: .git/config and the like",
            Rule::GitHooks => "the repository's hooks: .git/hooks",
            Rule::EditorConfig => "editor configuration that runs commands: .vscode, .idea, .devcontainer",
            Rule::AgentConfig => "agent configuration that runs commands: .claude, .cursor, .mcp.json, …",
            Rule::ShellHook => "a script a shell runs on entering its directory: .envrc",
            Rule::HomeStartup => "a start-up file of a home directory: .bashrc, .profile, .gitconfig, …",
            Rule::EnvFile => "the .env family",
            Rule::SshKey => "an SSH private key",
            Rule::Credentials => "a credentials file: .netrc, .pgpass, .npmrc, .pypirc, cloud credentials, …",
            Rule::DenyGlob => "a --deny glob",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::GitDir => "git_dir",
            Rule::GitConfig => "git_config",
            Rule::GitHooks => "git_hooks",
            Rule::EditorConfig => "editor_config",
            Rule::AgentConfig => "agent_config",
            Rule::ShellHook => "shell_hook",
            Rule::HomeStartup => "home_startup",
            Rule::EnvFile => "env_file",
            Rule::SshKey => "ssh_key",
            Rule::Credentials => "credentials",
            Rule::DenyGlob => "deny_glob",
        }
    }
}

/// What a request does to the path it resolved to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Read,
    /// List a directory (its entries are decided one by one).
    List,
    /// Open for writing an existing file, or one that may be created.
    Write,
    Create,
    Truncate,
    Remove,
    RenameFrom,
    /// The destination of a rename; `dir` when a directory is moved.
    RenameTo {
        dir: bool,
    },
    MakeDir,
}

impl Act {
    /// Whether the act changes the file system.
    pub fn changes(self) -> bool {
        !matches!(self, Act::Read | Act::List)
    }
}

/// A path a rule matched, and whether a grant lifted it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Hit {
    pub path: PathBuf,
    pub rule: Rule,
    pub class: Class,
    /// Lifted by `--allow-protected`/`--allow-secret`.
    pub granted: bool,
}

impl Hit {
    fn new(path: &[u8], rule: Rule, granted: bool) -> Self {
        Hit { path: PathBuf::from(bytes::os(path)), rule, class: rule.class(), granted }
    }

    /// The flag that lifts the rule, when one does.
    pub fn flag(&self) -> Option<&'static str> {
        match self.class {
            Class::Protected => Some("--allow-protected"),
            Class::Secret => Some("--allow-secret"),
            Class::Denied => None,
        }
    }
}

impl fmt::Display for Hit {
    /// The refusal, naming the rule and how to lift it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match self.class {
            Class::Protected => write!(
                f,
                "{p} is a protected path ({}): airlock never changes it; pass --allow-protected {p} to allow it",
                self.rule.describe()
            ),
            Class::Secret => write!(
                f,
                "{p} is a secret file ({}): airlock never serves it; pass --allow-secret {p} to share it",
                self.rule.describe()
            ),
            Class::Denied => write!(f, "{p} matches a --deny glob"),
        }
    }
}

/// A set of paths, each covering itself and what lies beneath it: sorted,
/// none beneath another.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Grants(Vec<PathBuf>);

impl Grants {
    /// Every path.
    pub fn all() -> Self {
        Grants(vec![PathBuf::from("/")])
    }

    /// From absolute, normal paths (others are dropped).
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut v: Vec<PathBuf> =
            paths.into_iter().filter(|p| p.is_absolute() && normalize(p).as_deref() == Some(p)).collect();
        v.sort();
        v.dedup();
        let mut out: Vec<PathBuf> = Vec::with_capacity(v.len());
        for p in v {
            if !out.iter().any(|o| bytes::starts_with(bytes::bytes(&p), bytes::bytes(o))) {
                out.push(p);
            }
        }
        Grants(out)
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.0
    }

    pub fn covers(&self, path: &[u8]) -> bool {
        self.0.iter().any(|g| bytes::starts_with(path, bytes::bytes(g)))
    }

    /// The paths both cover: of two that nest, the deeper one.
    pub fn intersect(&self, other: &Grants) -> Grants {
        let mut out = Vec::new();
        for a in &self.0 {
            for b in &other.0 {
                let (ab, bb) = (bytes::bytes(a), bytes::bytes(b));
                if bytes::starts_with(bb, ab) {
                    out.push(b.clone());
                } else if bytes::starts_with(ab, bb) {
                    out.push(a.clone());
                }
            }
        }
        Grants::new(out)
    }
}

/// One level's `--deny` globs (gitignore syntax), relative to `base`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "DenyParts", into = "DenyParts")]
pub struct DenySet {
    base: PathBuf,
    globs: Vec<String>,
    /// The globs, matched beneath `base`.
    beneath: Gitignore,
    /// The globs without a slash but at their end (`*.key`, `secret/`),
    /// which match a name at any depth: matched on paths outside `base`.
    anywhere: Gitignore,
}

#[derive(Serialize, Deserialize)]
struct DenyParts {
    base: PathBuf,
    globs: Vec<String>,
}

impl TryFrom<DenyParts> for DenySet {
    type Error = GuardError;
    fn try_from(p: DenyParts) -> Result<Self, GuardError> {
        DenySet::new(p.base, p.globs)
    }
}

impl From<DenySet> for DenyParts {
    fn from(d: DenySet) -> Self {
        DenyParts { base: d.base, globs: d.globs }
    }
}

impl PartialEq for DenySet {
    fn eq(&self, other: &Self) -> bool {
        self.base == other.base && self.globs == other.globs
    }
}
impl Eq for DenySet {}

impl fmt::Debug for DenySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenySet").field("base", &self.base).field("globs", &self.globs).finish()
    }
}

/// Why a guard could not be built (a command line, or a nested level's
/// `narrow`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardError(pub String);

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GuardError {}

impl DenySet {
    /// `globs` relative to `base` (absolute, normal).
    pub fn new(base: PathBuf, globs: Vec<String>) -> Result<Self, GuardError> {
        if !base.is_absolute() || normalize(&base).as_deref() != Some(base.as_path()) {
            return Err(GuardError(format!("--deny base {} is not absolute and normal", base.display())));
        }
        let build = |root: &Path, only_anywhere: bool| -> Result<Gitignore, GuardError> {
            let mut b = GitignoreBuilder::new(root);
            for g in &globs {
                if g.contains('\0') {
                    return Err(GuardError(format!("--deny {g:?}: contains a NUL byte")));
                }
                if only_anywhere && g.trim_end_matches('/').contains('/') {
                    continue;
                }
                b.add_line(None, g).map_err(|e| GuardError(format!("--deny {g:?}: {e}")))?;
            }
            b.build().map_err(|e| GuardError(format!("--deny {}: {e}", globs.join(" "))))
        };
        let beneath = build(&base, false)?;
        let anywhere = build(Path::new("/"), true)?;
        Ok(DenySet { base, globs, beneath, anywhere })
    }

    pub fn globs(&self) -> &[String] {
        &self.globs
    }

    /// Whether a glob matches `path` (canonical absolute) or a directory
    /// above it. `is_dir`: whether `path` is a directory (a glob ending
    /// in `/` matches directories only).
    pub fn matches(&self, path: &[u8], is_dir: bool) -> bool {
        let p = Path::new(bytes::os(path));
        if self.globs.is_empty() || p == Path::new("/") {
            return false;
        }
        if bytes::starts_with(path, bytes::bytes(&self.base)) {
            if p == self.base {
                return false;
            }
            self.beneath.matched_path_or_any_parents(p, is_dir).is_ignore()
        } else {
            self.anywhere.matched_path_or_any_parents(p, is_dir).is_ignore()
        }
    }
}

/// The rule, with what lifts it and what adds to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// `--allow-protected`.
    #[serde(default, skip_serializing_if = "is_empty_grants")]
    pub protected: Grants,
    /// `--allow-secret`.
    #[serde(default, skip_serializing_if = "is_empty_grants")]
    pub secret: Grants,
    /// Every level's `--deny` globs.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "shared_sets")]
    deny: Vec<Arc<DenySet>>,
    /// Home directories (canonical, absolute) whose start-up files are
    /// protected, besides `/root` and `/home/NAME`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub homes: Vec<PathBuf>,
}

/// `Vec<Arc<DenySet>>` written and read as the sets themselves.
mod shared_sets {
    use super::DenySet;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(v: &[Arc<DenySet>], s: S) -> Result<S::Ok, S::Error> {
        let sets: Vec<&DenySet> = v.iter().map(|a| &**a).collect();
        sets.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Arc<DenySet>>, D::Error> {
        Ok(Vec::<DenySet>::deserialize(d)?.into_iter().map(Arc::new).collect())
    }
}

fn is_empty_grants(g: &Grants) -> bool {
    g.0.is_empty()
}

impl Guard {
    /// The rule lifted everywhere: the identity of [`Guard::intersect`].
    pub fn everything() -> Self {
        Guard { protected: Grants::all(), secret: Grants::all(), deny: Vec::new(), homes: Vec::new() }
    }

    /// The rule with `protected` and `secret` grants, `deny` globs and
    /// `homes`.
    pub fn new(
        protected: Grants,
        secret: Grants,
        deny: Option<DenySet>,
        homes: impl IntoIterator<Item = PathBuf>,
    ) -> Self {
        let mut homes: Vec<PathBuf> = homes.into_iter().filter(|h| h.is_absolute()).collect();
        homes.sort();
        homes.dedup();
        Guard {
            protected,
            secret,
            deny: deny.filter(|d| !d.globs.is_empty()).map(Arc::new).into_iter().collect(),
            homes,
        }
    }

    /// Whether it is the rule alone: no grant, glob or home.
    pub fn is_plain(&self) -> bool {
        self == &Guard::default()
    }

    pub fn deny(&self) -> &[Arc<DenySet>] {
        &self.deny
    }

    /// The guard of two levels: granted where both grant, denied where
    /// either denies, every home of either.
    pub fn intersect(&self, other: &Guard) -> Guard {
        let mut deny = self.deny.clone();
        for d in &other.deny {
            if !deny.iter().any(|e| e == d) {
                deny.push(d.clone());
            }
        }
        let mut homes = self.homes.clone();
        homes.extend(other.homes.iter().cloned());
        homes.sort();
        homes.dedup();
        Guard {
            protected: self.protected.intersect(&other.protected),
            secret: self.secret.intersect(&other.secret),
            deny,
            homes,
        }
    }

    /// The rule `path` (canonical absolute) falls under for `act`, if
    /// any, ignoring grants: a `--deny` glob, then a secret, then (for an
    /// act that changes the file system) a protected path. A file that is
    /// both a secret and a script the host runs (`.envrc`) meets the
    /// protected rule when changed, so a writable direct view holds it
    /// and sets aside one made past the holds, as it does `.vscode`.
    pub fn matched(&self, path: &[u8], act: Act, is_dir: bool) -> Option<Rule> {
        if self.deny.iter().any(|d| d.matches(path, is_dir)) {
            return Some(Rule::DenyGlob);
        }
        let protected = || {
            let homes: Vec<&[u8]> = self.homes.iter().map(|h| bytes::bytes(h)).collect();
            let dir_into = matches!(act, Act::RenameTo { dir: true });
            names::protected(path, &homes, dir_into)
        };
        let secret = names::secret(path);
        if !act.changes() {
            return secret;
        }
        match (secret, protected()) {
            (_, Some(Rule::ShellHook)) => Some(Rule::ShellHook),
            (Some(rule), _) => Some(rule),
            (None, protected) => protected,
        }
    }

    /// Decide `act` on `path` (canonical absolute, the resolved path).
    /// `Ok(None)`: no rule applies; `Ok(Some(hit))`: a grant lifted a rule
    /// (for the report); `Err(hit)`: refused, the hit naming the rule.
    pub fn check(&self, path: &Path, act: Act, is_dir: bool) -> Result<Option<Hit>, Hit> {
        let b = bytes::bytes(path);
        let Some(rule) = self.matched(b, act, is_dir) else { return Ok(None) };
        let granted = match rule.class() {
            Class::Protected => self.protected.covers(b),
            Class::Secret => self.secret.covers(b),
            Class::Denied => false,
        };
        let hit = Hit::new(b, rule, granted);
        if granted {
            Ok(Some(hit))
        } else {
            Err(hit)
        }
    }

    /// Whether `path` may be reached by `act` at all.
    pub fn permits(&self, path: &Path, act: Act, is_dir: bool) -> bool {
        self.check(path, act, is_dir).is_ok()
    }

    /// The wire form (`narrow`, an open's `scope`): `{"protected": [..],
    /// "secret": [..], "deny": [{"base", "globs"}], "homes": [..]}`.
    pub fn to_wire(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Parse the wire form, refusing relative or unnormalized paths,
    /// globs that do not compile and more than the limits.
    pub fn from_wire(v: &serde_json::Value) -> Result<Guard, GuardError> {
        let obj = v.as_object().ok_or_else(|| GuardError("guard is not an object".into()))?;
        let paths = |key: &str, max: usize| -> Result<Vec<PathBuf>, GuardError> {
            let Some(list) = obj.get(key) else { return Ok(Vec::new()) };
            let list = list.as_array().ok_or_else(|| GuardError(format!("guard {key} is not a list")))?;
            if list.len() > max {
                return Err(GuardError(format!(
                    "guard {key}: {} entries exceed the limit of {max}",
                    list.len()
                )));
            }
            list.iter()
                .map(|p| {
                    let s = p.as_str().ok_or_else(|| GuardError(format!("guard {key}: not a string")))?;
                    let path = Path::new(s);
                    if s.contains('\0') || !path.is_absolute() || normalize(path).as_deref() != Some(path) {
                        return Err(GuardError(format!("guard {key}: {s:?} is not absolute and normal")));
                    }
                    Ok(path.to_path_buf())
                })
                .collect()
        };
        let protected = Grants::new(paths("protected", MAX_GUARD_GRANTS)?);
        let secret = Grants::new(paths("secret", MAX_GUARD_GRANTS)?);
        let homes = paths("homes", MAX_GUARD_HOMES)?;
        let mut deny = Vec::new();
        let mut globs = 0usize;
        if let Some(list) = obj.get("deny") {
            let list = list.as_array().ok_or_else(|| GuardError("guard deny is not a list".into()))?;
            for set in list {
                let parts: DenyParts = serde_json::from_value(set.clone())
                    .map_err(|e| GuardError(format!("guard deny: {e}")))?;
                globs += parts.globs.len();
                if globs > MAX_GUARD_DENY {
                    return Err(GuardError(format!("guard deny: more than {MAX_GUARD_DENY} globs")));
                }
                let set = DenySet::new(parts.base, parts.globs)?;
                if !set.globs.is_empty() {
                    deny.push(Arc::new(set));
                }
            }
        }
        let mut g = Guard::new(protected, secret, None, homes);
        g.deny = deny;
        Ok(g)
    }
}
