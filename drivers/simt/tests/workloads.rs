//! Every workload verified at the quick size on the MESC integrated GPU.

use gmem_simt::machine::SimtMachine;
use gmem_simt::workloads::{pages_needed, run, Size, WORKLOADS};

#[test]
fn every_workload_matches_its_cpu_reference_at_the_quick_size() {
    for name in WORKLOADS {
        let m = SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap();
        let o = run(&m, name, Size::Quick).unwrap();
        assert!(o.verified, "{name}: max error {}", o.max_error);
        assert!(
            o.stats.memory_instructions > 0 && o.stats.cycles > 0,
            "{name}"
        );
        let mmu = m.gpu_mmu().caches;
        // Every request looks up its unit's L1 once; a faulted instruction replays
        // its pages (at most 32) after the fault.
        let lookups = mmu.l1.hits + mmu.l1.misses;
        let faults = m.port().stats().faults;
        assert!(
            lookups >= o.stats.translations && lookups - o.stats.translations <= 32 * faults,
            "{name}: {lookups} lookups, {} requests, {faults} faults",
            o.stats.translations
        );
    }
}
