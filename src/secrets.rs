//! Keeping airlock's own secrets from its children: a child runs as the
//! same user, so without this it could read `/proc/<airlock>/environ` or
//! `mem`, or attach a debugger.

/// Make airlock non-dumpable: no core dumps, no ptrace attach, and its
/// `/proc/<pid>/environ`, `mem`, `fd` and the like are refused to other
/// processes of the same user. Call before anything secret is read.
pub fn not_dumpable() -> anyhow::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| anyhow::anyhow!("making airlock non-dumpable: {e}"))
}

/// Read the variable `name` and remove it from airlock's own environment,
/// so no later child — and no reader of airlock's environment — sees it.
///
/// Call it before the runtime starts: changing the environment races with
/// any other thread reading it, and at that point there is none.
pub fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    std::env::remove_var(name);
    value
}
