//! The allocator's settings for a process that serves clients.
//!
//! A read answer's life is a few allocations (the host read's buffer, the
//! answer's frame) freed as soon as the batch holding it is written, and
//! glibc's malloc hands freed memory at the top of its heap back to the
//! kernel once more than a threshold (128 KiB, or more after large
//! `mmap`ed blocks) is free there: a pipelining client's wakeups then each
//! grow the heap again, page by page, every page a fault and a zero fill.
//! A profile of the FS proxy bench put a sixth of airlock's CPU there
//! (docs/perf.md). Keeping what was freed, up to a bound, ends it.

/// Free bytes malloc may keep at the top of its heap rather than return
/// to the kernel.
pub const HEAP_TRIM_THRESHOLD: usize = 16 << 20;
/// Blocks from this size up get a mapping of their own, returned to the
/// kernel when freed. Setting the trim threshold stops glibc adapting this
/// one (from 128 KiB up), so it is set too: a large frame's buffer stays a
/// heap block, as the adaptive threshold made it after the first.
pub const HEAP_MMAP_THRESHOLD: usize = 4 << 20;

/// Apply [`HEAP_TRIM_THRESHOLD`] and [`HEAP_MMAP_THRESHOLD`]. Call it
/// before other threads start (the runtime, the stdin reader).
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let trim = libc::c_int::try_from(HEAP_TRIM_THRESHOLD).unwrap_or(libc::c_int::MAX);
        let mmap = libc::c_int::try_from(HEAP_MMAP_THRESHOLD).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets malloc's parameters; no pointer is
        // passed, and a value it refuses leaves the default in force.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap);
        }
    }
}
