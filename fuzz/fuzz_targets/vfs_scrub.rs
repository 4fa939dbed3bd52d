#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| airlock_core::vfs::fuzzing::scrubber(data));
