#![no_main]

// The heap is counted, so every input's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

// The check lives with the tests so `cargo test` replays the corpus through
// the very same code (tests/toolexec_http_corpus.rs).
#[path = "../../tests/support/toolexec_http_check.rs"]
mod toolexec_http_check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| toolexec_http_check::check(data));
