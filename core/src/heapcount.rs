//! A counting global allocator for the harnesses (the simulator, the fuzz
//! targets, the tests that want it), never the release binary's: it tells
//! how many bytes each machine really holds, so a bound the machine's own
//! accounting models can be checked against what is allocated.
//!
//! A harness installs it over the system allocator:
//!
//! ```text
//! #[global_allocator]
//! static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
//!     airlock_core::heapcount::Counting(std::alloc::System);
//!
//! fn main() {
//!     let machine = airlock_core::heapcount::Tag::new(1);
//!     let base = airlock_core::heapcount::live(machine).unwrap();
//!     let v: Vec<u8> = machine.scope(|| Vec::with_capacity(1000));
//!     assert_eq!(airlock_core::heapcount::live(machine), Some(base + 1000));
//!     drop(v);
//!     assert_eq!(airlock_core::heapcount::live(machine), Some(base));
//! }
//! ```
//!
//! Each block is charged to the tag that was current on its thread when it
//! was allocated (a harness sets a machine's tag around each call into the
//! machine) and its size is given back to that tag when it is freed,
//! whichever tag is current then: a block a machine allocates and the
//! harness frees is the machine's until then. [`retag`] moves a block the
//! machine hands out (an output's bytes, kept in a simulated pipe) to
//! another tag. Counters are per thread: a harness runs a world on one
//! thread, and a block freed on another thread is given back there.
//!
//! Nothing here feeds back into what a harness does: the counts are read
//! only by checkers, so a seeded world is the same with or without it.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Tags a harness may use: 0 is the harness's own (untagged) memory.
pub const MAX_TAGS: usize = 8;

/// Bytes in front of each block, holding its tag: at least 16, and a
/// multiple of the block's alignment, so the block keeps it.
const HEADER: usize = 16;

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A thread's current tag, its live bytes per tag and the most each tag
/// held since its peak was last reset, in one thread-local (one lookup an
/// allocation).
struct Counters {
    current: Cell<u8>,
    live: [Cell<u64>; MAX_TAGS],
    peak: [Cell<u64>; MAX_TAGS],
}

thread_local! {
    static COUNTERS: Counters = const {
        Counters {
            current: Cell::new(0),
            live: [const { Cell::new(0) }; MAX_TAGS],
            peak: [const { Cell::new(0) }; MAX_TAGS],
        }
    };
}

/// Whose allocations a block is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tag(u8);

impl Tag {
    /// The harness's own memory.
    pub const HARNESS: Tag = Tag(0);

    /// Tag `n`, taken modulo [`MAX_TAGS`].
    pub const fn new(n: usize) -> Tag {
        Tag((n % MAX_TAGS) as u8)
    }

    /// Run `f` with this tag current on this thread, then restore the
    /// tag that was.
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        let _g = self.enter();
        f()
    }

    /// Make this tag current on this thread until the guard drops.
    pub fn enter(self) -> Entered {
        let prev = COUNTERS.with(|c| c.current.replace(self.0));
        Entered(prev)
    }
}

/// Restores the tag current before [`Tag::enter`].
#[must_use]
pub struct Entered(u8);

impl Drop for Entered {
    fn drop(&mut self) {
        COUNTERS.with(|c| c.current.set(self.0));
    }
}

/// Whether the counting allocator is the global allocator of this process
/// (it has allocated at least once).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Bytes live under `tag` on this thread, or `None` when the counting
/// allocator is not installed. Block sizes as requested (what the caller
/// holds), without the allocator's own overhead.
pub fn live(tag: Tag) -> Option<u64> {
    installed().then(|| COUNTERS.with(|c| c.live[usize::from(tag.0)].get()))
}

/// The most `tag` held live on this thread since [`reset_peak`] (or the
/// thread began), or `None` when the counting allocator is not installed:
/// what a call held at its worst, temporary buffers included.
pub fn peak(tag: Tag) -> Option<u64> {
    installed().then(|| COUNTERS.with(|c| c.peak[usize::from(tag.0)].get()))
}

/// Start `tag`'s peak over from what it holds now.
pub fn reset_peak(tag: Tag) {
    let _ = COUNTERS.try_with(|c| {
        let i = usize::from(tag.0);
        c.peak[i].set(c.live[i].get());
    });
}

/// What a call cost on the heap, measured from what its tag held before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    /// Bytes still live when it returned, what it returned among them.
    pub kept: u64,
    /// The most it held at once.
    pub peak: u64,
}

/// Run `f` with `tag` current and say what it cost (`None` when the
/// counting allocator is not installed). `tag` should hold nothing that
/// `f` frees, or `kept` wraps.
pub fn cost<R>(tag: Tag, f: impl FnOnce() -> R) -> (R, Option<Cost>) {
    let before = live(tag);
    reset_peak(tag);
    let r = tag.scope(f);
    let cost = before
        .and_then(|b| Some(Cost { kept: live(tag)?.wrapping_sub(b), peak: peak(tag)?.wrapping_sub(b) }));
    (r, cost)
}

/// Charge the block holding `v`'s bytes to `tag` from now on (a machine's
/// output handed to the harness, or the harness's bytes a machine keeps).
/// Nothing happens when the allocator is not installed or `v` holds no
/// block.
pub fn retag(v: &Vec<u8>, tag: Tag) {
    if !installed() || v.capacity() == 0 {
        return;
    }
    // SAFETY: the counting allocator is the global allocator (it has
    // allocated, and a process has one global allocator for its whole
    // life), so every block it hands out, this one among them, starts
    // HEADER bytes after a header it wrote; a Vec<u8> with capacity holds
    // a block of exactly `capacity` bytes starting at its pointer.
    unsafe {
        let header = v.as_ptr().sub(HEADER).cast_mut();
        let old = header.read();
        if old == tag.0 {
            return;
        }
        header.write(tag.0);
        let n = v.capacity() as u64;
        COUNTERS.with(|c| {
            let o = &c.live[usize::from(old) % MAX_TAGS];
            o.set(o.get().wrapping_sub(n));
            let t = &c.live[usize::from(tag.0)];
            t.set(t.get().wrapping_add(n));
            let p = &c.peak[usize::from(tag.0)];
            p.set(p.get().max(t.get()));
        });
    }
}

/// The counting allocator over `A`.
pub struct Counting<A>(pub A);

fn outer(layout: Layout) -> Option<(Layout, usize)> {
    let pad = HEADER.max(layout.align());
    let size = layout.size().checked_add(pad)?;
    Layout::from_size_align(size, layout.align().max(HEADER)).ok().map(|l| (l, pad))
}

/// Charge `size` bytes of a new block to the current tag; its tag.
fn charge_new(size: u64) -> u8 {
    // `try_with`: a thread's last frees may come after its counters are
    // gone (they have no destructor, so they never are, but the allocator
    // must not panic if that changes).
    COUNTERS
        .try_with(|c| {
            let tag = c.current.get();
            let l = &c.live[usize::from(tag)];
            let now = l.get().wrapping_add(size);
            l.set(now);
            let p = &c.peak[usize::from(tag)];
            if now > p.get() {
                p.set(now);
            }
            tag
        })
        .unwrap_or(0)
}

/// Give `size` bytes of a block back to `tag`.
fn release(tag: u8, size: u64) {
    let _ = COUNTERS.try_with(|c| {
        let l = &c.live[usize::from(tag) % MAX_TAGS];
        l.set(l.get().wrapping_sub(size));
    });
}

// SAFETY: every block is the inner allocator's block of `outer(layout)`,
// offset by the header; frees and reallocs undo the offset and pass the
// inner allocator the layout it allocated with.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some((o, pad)) = outer(layout) else { return std::ptr::null_mut() };
        // SAFETY: `o` has a non-zero size (it holds the header).
        let base = unsafe { self.0.alloc(o) };
        if base.is_null() {
            return base;
        }
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let tag = charge_new(layout.size() as u64);
        // SAFETY: `base` holds `pad >= HEADER` bytes before the block.
        unsafe {
            let p = base.add(pad);
            p.sub(HEADER).write(tag);
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some((o, pad)) = outer(layout) else { return };
        // SAFETY: `ptr` came from `alloc` or `realloc` with this layout.
        unsafe {
            release(ptr.sub(HEADER).read(), layout.size() as u64);
            self.0.dealloc(ptr.sub(pad), o);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some((o, pad)) = outer(layout) else { return std::ptr::null_mut() };
        let Some(new_outer) = new_size.checked_add(pad) else { return std::ptr::null_mut() };
        // SAFETY: `ptr` came from `alloc` or `realloc` with this layout; the
        // header moves with the block, as the inner realloc copies it.
        unsafe {
            let old_tag = ptr.sub(HEADER).read();
            let base = self.0.realloc(ptr.sub(pad), o, new_outer);
            if base.is_null() {
                return base;
            }
            // A block that grows is charged to whoever grows it: a buffer
            // the harness handed in and a machine extends is the machine's.
            release(old_tag, layout.size() as u64);
            let tag = charge_new(new_size as u64);
            let p = base.add(pad);
            p.sub(HEADER).write(tag);
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    #[global_allocator]
    static HEAP: Counting<System> = Counting(System);

    fn held(tag: Tag) -> u64 {
        live(tag).expect("installed")
    }

    #[test]
    fn a_block_is_charged_to_the_tag_that_allocated_it_until_freed() {
        let t = Tag::new(3);
        let base = held(t);
        let v: Vec<u8> = t.scope(|| Vec::with_capacity(4096));
        assert_eq!(held(t), base + 4096);
        // Freed under another tag, it is still given back to its own.
        drop(v);
        assert_eq!(held(t), base);
    }

    #[test]
    fn growing_a_block_charges_its_new_size_to_who_grows_it() {
        let (a, b) = (Tag::new(4), Tag::new(5));
        let (base_a, base_b) = (held(a), held(b));
        let mut v: Vec<u8> = a.scope(|| Vec::with_capacity(100));
        b.scope(|| v.reserve_exact(1000));
        assert_eq!(held(a), base_a);
        assert_eq!(held(b), base_b + v.capacity() as u64);
        drop(v);
        assert_eq!((held(a), held(b)), (base_a, base_b));
    }

    #[test]
    fn retag_moves_a_block_to_another_tag() {
        let (a, b) = (Tag::new(6), Tag::new(7));
        let (base_a, base_b) = (held(a), held(b));
        let v: Vec<u8> = a.scope(|| vec![7u8; 300]);
        retag(&v, b);
        assert_eq!((held(a), held(b)), (base_a, base_b + 300));
        drop(v);
        assert_eq!((held(a), held(b)), (base_a, base_b));
    }

    #[test]
    fn the_peak_is_the_most_held_since_its_reset() {
        let t = Tag::new(1);
        reset_peak(t);
        let base = held(t);
        assert_eq!(peak(t), Some(base));
        t.scope(|| {
            let big: Vec<u8> = Vec::with_capacity(5000);
            drop(big);
            let _small: Vec<u8> = Vec::with_capacity(100);
        });
        assert_eq!(held(t), base);
        assert_eq!(peak(t), Some(base + 5000));
        reset_peak(t);
        assert_eq!(peak(t), Some(base));
    }

    #[test]
    fn alignment_above_the_header_is_kept() {
        #[repr(align(64))]
        struct Wide([u8; 64]);
        let t = Tag::new(2);
        let base = held(t);
        let v: Vec<Wide> = t.scope(|| (0..5).map(|_| Wide([0; 64])).collect());
        assert!(v.iter().all(|w| (w.0.as_ptr() as usize).is_multiple_of(64)));
        assert_eq!(held(t), base + 5 * 64);
        drop(v);
        assert_eq!(held(t), base);
    }
}
