//! The integrated GPU's MMU: the CPU's x86-64 format and a GPU's translation caches.
//!
//! An integrated GPU walks x86-64 tables in host memory (Intel's GPUs walk the process's
//! tables through the IOMMU in SVM mode), so its format is the CPU's and the core can
//! let it *share* the CPU's table; attached in coherent mode it gets a table of its own
//! in the same format. What is its own: a small L1 TLB per compute unit, a shared L2
//! and a page-walk cache.

use gmem_sim::RadixTables;
use gmem_sim::{HierarchyConfig, Replacement, SimMmu, TlbConfig};
use gmem_x86pt::X86Codec;

type X86Tables = RadixTables<X86Codec>;

/// The integrated GPU's MMU.
pub type IgpuMmu = SimMmu<X86Tables>;

/// Translation caches for `cus` compute units: a 32-entry 4-way L1 per CU, a shared
/// 512-entry 8-way L2 and a 16-entry page-walk cache, all LRU.
pub fn igpu_tlbs(cus: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: cus,
        l1: TlbConfig::new(8, 4, Replacement::Lru),
        l2: Some(TlbConfig::new(64, 8, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 16, Replacement::Lru)),
    }
}
