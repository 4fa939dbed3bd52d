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
/// so no later child — and no reader of airlock's `/proc/<pid>/environ` —
/// sees it.
///
/// Removing the variable only unlinks it from the `environ` array; the
/// kernel's `/proc/<pid>/environ` still shows the block the process
/// started with. So the value is first overwritten with zero bytes in
/// place.
///
/// Call it before the runtime starts: changing the environment races with
/// any other thread reading it, and at that point there is none.
pub fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    if value.is_some() {
        scrub(name);
    }
    std::env::remove_var(name);
    value
}

/// Zero the bytes of `name`'s value where the C environment keeps them.
fn scrub(name: &str) {
    let Ok(c_name) = std::ffi::CString::new(name) else { return };
    // SAFETY: no other thread exists yet (see `take_env`), so nothing reads
    // or changes the environment meanwhile. getenv returns a pointer to the
    // NUL-terminated value inside the process's own, writable environment
    // strings (or null); strlen stays within that string, and the bytes
    // overwritten are exactly the value's, before its NUL.
    unsafe {
        let value = libc::getenv(c_name.as_ptr());
        if !value.is_null() {
            let len = libc::strlen(value);
            std::ptr::write_bytes(value, 0, len);
        }
    }
}
