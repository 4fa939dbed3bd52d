//! The places where airlock's tasks and threads meet, as small primitives
//! written on a shim (`sync`) that is `std` normally and `loom` under
//! `--cfg loom`, so the very code the shell and the simulator run is the
//! code loom model-checks (`tests/models.rs`).
//!
//! The protocol machines themselves (handle tables, the broker's queue and
//! its one-call gate) are single-threaded and deterministic in
//! `airlock-core`, checked by the simulator; `tests/gate.rs` has loom try
//! every order in which concurrent tasks' inputs can reach the gate. What
//! is left to meet across tasks is here:
//!
//! - [`backlog::Backlog`]: flow control between a connection's writer task
//!   and its reader task (no lost wakeup; a dead writer never strands the
//!   reader).
//! - [`inflight::Inflight`]: a provider call's result racing its
//!   cancellation (delivered exactly once; a result already in hand is never
//!   traded for "cancelled").
//! - [`seeds::SeedQueue`]: the simulator's worker threads sharing out seeds
//!   (each seed run exactly once).

pub mod backlog;
pub mod inflight;
pub mod seeds;
pub mod sync;
