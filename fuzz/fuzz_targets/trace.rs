//! Fuzz target `trace`: libFuzzer's bytes run by the testkit's `trace` runner.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gmem_testkit::replay_trace(data);
});
