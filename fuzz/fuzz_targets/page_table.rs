//! Fuzz target `page_table`: libFuzzer's bytes decoded into x86-64 table operations,
//! run by the testkit's runner against its map model.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gmem_testkit::replay_page_table(data);
});
