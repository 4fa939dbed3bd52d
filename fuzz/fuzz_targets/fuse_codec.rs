#![no_main]

// The heap is counted, so every input's bounded-memory check runs.
#[global_allocator]
static HEAP: airlock_core::heapcount::Counting<std::alloc::System> =
    airlock_core::heapcount::Counting(std::alloc::System);

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| airlock_core::fuse::fuzzing::codec(data));
