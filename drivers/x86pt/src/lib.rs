//! # gmem-x86pt: the x86-64 4-level page-table format in simulated memory
//!
//! The page-table format of the host CPU and of every device that walks the CPU's
//! tables (an integrated GPU, an IOMMU): 4 KiB tables of 512 64-bit entries, four levels
//! over 48-bit canonical virtual addresses, 4 KiB leaves and optional 2 MiB leaves. The
//! tables live in a [`gmem_sim::SimMemory`] (host memory), so the devices that share a
//! table in shared mode walk the very same frames, and every walk is memory reads that
//! can be counted.
//!
//! | module | owns |
//! |---|---|
//! | [`pte`] | the entry format (P/RW/US/PWT/PCD/A/D/PS/G/NX), address layout, canonical checks |
//! | `tables` | [`X86Tables`]: map, unmap, protect, table reclamation, the hardware walk |
//!
//! [`X86Tables`] implements [`gmem_sim::TableFormat`]; a driver turns it into the core's
//! `Mmu` with [`gmem_sim::SimMmu`] and its own TLBs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod pte;
mod tables;
#[cfg(test)]
mod tests;

pub use pte::{Decoded, X86Flags, X86Pte};
pub use tables::{X86Config, X86Stats, X86Tables, HW_BAD_ENTRY, HW_UNKNOWN_ROOT, X86_FORMAT};
