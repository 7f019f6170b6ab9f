//! Fuzz target `vmem`: libFuzzer's bytes decoded into an arena configuration and an
//! operation list, run by the testkit's vmem runner against its interval model.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gmem_testkit::replay_vmem(data);
});
