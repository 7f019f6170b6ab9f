//! Fuzz target `private`: libFuzzer's bytes decoded into a device size and an operation
//! list over device-private frames, run by the testkit's private-frame runner against
//! its two-copy model.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gmem_testkit::replay_private(data);
});
