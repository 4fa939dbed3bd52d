#![no_main]

// The heap is counted, as in every target.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

// The check lives with the core's tests so `cargo test` replays the corpus
// through the very same code (core/tests/fuzz_corpus.rs).
#[path = "../../core/tests/support/egress_oracle.rs"]
mod egress_oracle;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| egress_oracle::check(data));
