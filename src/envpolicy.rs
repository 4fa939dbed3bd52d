//! The environment policy's flags (`--env-pass`, `--env-clear`), shared by
//! `run`, `tool` and `toolexec serve`. The decision is the core's
//! (`airlock_core::environ`); this reads airlock's environment, hands it
//! over, and says what was kept back.

use airlock_core::environ::{Base, Decision, EnvPolicy, Removed};
use std::ffi::OsString;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct EnvArgs {
    /// Let the variable NAME reach the child even though its name or value
    /// looks like a credential (by default names holding KEY, SECRET,
    /// TOKEN, PASSWORD, PASSWD, CREDENTIAL or AUTH, URLs with a password
    /// and agent sockets are removed). Repeats.
    #[arg(long = "env-pass", value_name = "NAME")]
    pub env_pass: Vec<String>,
    /// Start the child's environment from nothing but PATH, HOME, LANG,
    /// LC_*, TERM, TZ, USER and TMPDIR (plus each --env-pass).
    #[arg(long = "env-clear")]
    pub env_clear: bool,
}

/// A variable name a user may pass: not empty, no `=` or NUL.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        anyhow::bail!("not an environment variable name");
    }
    Ok(())
}

impl EnvArgs {
    /// The policy these flags, plus the config's `[env]` (when there is
    /// one), describe; `withhold` are never passed.
    pub fn policy(
        &self,
        config: Option<&crate::config::EnvSection>,
        withhold: impl IntoIterator<Item = OsString>,
    ) -> anyhow::Result<EnvPolicy> {
        let mut p = EnvPolicy::new();
        if self.env_clear || config.is_some_and(|c| c.clear) {
            p.base = Base::Core;
        }
        for name in self.env_pass.iter().chain(config.into_iter().flat_map(|c| c.pass.iter())) {
            check_name(name).map_err(|e| anyhow::anyhow!("--env-pass {name:?}: {e}"))?;
            p.pass.insert(name.into());
        }
        p.withhold.extend(withhold);
        Ok(p)
    }
}

/// airlock's own environment under `policy`.
pub fn decide(policy: &EnvPolicy) -> Decision {
    policy.decide(std::env::vars_os())
}

/// A note for stderr naming what `decision` kept from `whom`, or `None`
/// when nothing was (the names only, never a value).
pub fn note(decision: &Decision, whom: &str) -> Option<String> {
    let names: Vec<&str> = decision
        .removed
        .iter()
        .filter(|r| !matches!(r.reason, Removed::NotCore | Removed::Withheld))
        .map(|r| r.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    Some(format!(
        "kept from {whom}'s environment as credentials: {} (let one through with --env-pass NAME)",
        names.join(", ")
    ))
}
