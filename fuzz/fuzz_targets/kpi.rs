//! Fuzz target `kpi`: libFuzzer's bytes decoded into a system setup and a KPI
//! operation list, run by the testkit's KPI runner against its region model.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gmem_testkit::replay_kpi(data);
});
