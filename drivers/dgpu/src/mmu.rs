//! The discrete GPU's MMU: its own format and its translation caches.

use crate::format::GpuTables;
use gmem_sim::{HierarchyConfig, Replacement, SimMmu, TlbConfig};

/// The discrete GPU's MMU.
pub type DgpuMmu = SimMmu<GpuTables>;

/// Translation caches for `cus` compute units: a 32-entry 4-way L1 per CU, a shared
/// 1024-entry 16-way L2 and a 16-entry page-walk cache, all LRU.
pub fn dgpu_tlbs(cus: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: cus,
        l1: TlbConfig::new(8, 4, Replacement::Lru),
        l2: Some(TlbConfig::new(64, 16, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 16, Replacement::Lru)),
    }
}
