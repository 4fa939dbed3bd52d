//! The shim: `std` (and `atomic-waker`) normally, `loom` under `--cfg loom`,
//! after tokio's own `loom` module.

#[cfg(loom)]
pub use loom::{
    future::{block_on, AtomicWaker},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread,
};

#[cfg(not(loom))]
pub use atomic_waker::AtomicWaker;
#[cfg(not(loom))]
pub use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread,
};

/// Lock `m`, going on past a poisoned lock: every critical section here
/// leaves the data consistent before anything in it can panic.
pub fn lock<T>(m: &Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Register `waker` with `slot` (the two `AtomicWaker`s spell it differently).
pub fn register(slot: &AtomicWaker, waker: &std::task::Waker) {
    #[cfg(loom)]
    slot.register_by_ref(waker);
    #[cfg(not(loom))]
    slot.register(waker);
}
