//! The CPU's MMU: the x86-64 format of [`gmem_x86pt`] and a core's translation caches.
//!
//! Everything MMU-specific about the host CPU is here: its table format (x86-64, shared
//! with every other x86-format device of the machine) and the geometry of its TLBs. The
//! table edits and the walk are the format's; [`SimMmu`] turns them into the core's
//! `Mmu` and translates every access through the caches.

use crate::device::X86Tables;
use gmem_sim::{HierarchyConfig, Replacement, SimMmu, TlbConfig};

/// The host CPU's MMU.
pub type CpuMmu = SimMmu<X86Tables>;

/// Translation caches shaped like a recent x86 core's, for `cores` cores: a 64-entry
/// 4-way L1 dTLB per core, a 1536-entry 12-way second-level TLB (modelled as shared)
/// and a 32-entry fully associative paging-structure cache, all LRU.
pub fn cpu_tlbs(cores: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: cores,
        l1: TlbConfig::new(16, 4, Replacement::Lru),
        l2: Some(TlbConfig::new(128, 12, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 32, Replacement::Lru)),
    }
}
