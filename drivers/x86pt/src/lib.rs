//! # gmem-x86pt: the x86-64 4-level page-table format
//!
//! The page-table format of the host CPU and of every device that walks the CPU's
//! tables (an integrated GPU, an IOMMU): 4 KiB tables of 512 64-bit entries, four levels
//! over 48-bit canonical virtual addresses, 4 KiB leaves and optional 2 MiB leaves.
//! `no_std` and independent of the simulator: the format is a codec of the shared
//! page-table engine ([`gmem_ptengine`]), which a kernel can drive over its physical
//! memory as well as gmem-sim drives it over simulated host memory.
//!
//! | module | owns |
//! |---|---|
//! | [`pte`] | the entry format (P/RW/US/PWT/PCD/A/D/PS/G/NX), address layout, canonical checks |
//! | [`codec`] | [`X86Codec`]: the encoding as a [`gmem_ptengine::Codec`] |
//! | [`vtd`] | [`VtdCodec`]: the Intel VT-d second-level format, the same tree with the IOMMU's entry bits |
//! | [`hardware`] | [`PagingHardware`]: entries in real memory, a walker's invalidations and root; [`DirectCpu`] (x86-64) |
//! | `paged` | [`PagedMmu`]: either codec as a core `Mmu` over real memory (global mappings, 2 MiB leaves with split reserves, retired tables) |
//! | [`mesc`] | MESC's subregion contiguity bits (derived in every edit), its three walk modes, the memory-subregion cache interface, CoLT's line coalescing, Alg. 1's full scan |
//!
//! The tree, its edits (map, unmap, protect, 2 MiB leaves and their splits, table
//! reclamation) and the hardware walk with accessed/dirty bits are the engine's; in
//! the simulator, `gmem_sim::RadixTables<X86Codec>` is that tree in host memory, and on
//! a real machine [`PagedMmu`] is: `drivers/x86pt/kernel` boots under QEMU with the CPU's
//! tables and a VT-d IOMMU's tables both written by it.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

extern crate alloc;

pub mod codec;
pub mod hardware;
pub mod mesc;
mod paged;
#[cfg(test)]
mod paged_tests;
pub mod pte;
pub mod vtd;
#[cfg(test)]
extern crate std;
#[cfg(test)]
mod mesc_tests;
#[cfg(test)]
mod tests;

pub use codec::{X86Codec, X86Config, GRANULARITY_BIT, X86_FORMAT};
#[cfg(target_arch = "x86_64")]
pub use hardware::DirectCpu;
pub use hardware::PagingHardware;
pub use paged::{
    GlobalMapping, PagedConfig, PagedMmu, PagedStats, Translation, HW_BAD_FRAME, HW_RESERVED_ENTRY,
    HW_UNKNOWN_ROOT,
};
pub use pte::{Decoded, X86Flags, X86Pte};
pub use vtd::{VtdCodec, VTD_FORMAT};
