//! Every workload verified at the quick size on the MESC integrated GPU.

use gmem_simt::machine::SimtMachine;
use gmem_simt::workloads::{pages_needed, run, Size, WORKLOADS};

#[test]
fn every_workload_matches_its_cpu_reference_at_the_quick_size() {
    for name in WORKLOADS {
        let m = SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap();
        let o = run(&m, name, Size::Quick).unwrap();
        assert!(o.verified, "{name}: max error {}", o.max_error);
        assert!(o.stats.memory_instructions > 0 && o.stats.cycles > 0, "{name}");
        let mmu = m.gpu_mmu().caches;
        assert_eq!(
            mmu.l1.hits + mmu.l1.misses,
            o.stats.translations,
            "{name}: every translation request looks up the unit's L1 once"
        );
    }
}
