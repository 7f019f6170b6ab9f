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
//! | [`codec`] | [`X86Codec`]: the encoding as a [`gmem_sim::radix::PteCodec`] |
//!
//! The tree, its edits (map, unmap, protect, 2 MiB leaves and their splits, table
//! reclamation) and the counted hardware walk with accessed/dirty bits are
//! [`gmem_sim::RadixTables`]'s; [`X86Tables`] is that tree with this encoding. It
//! implements [`gmem_sim::TableFormat`], and a driver turns it into the core's `Mmu`
//! with [`gmem_sim::SimMmu`] and its own TLBs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
pub mod pte;
#[cfg(test)]
mod tests;

pub use codec::{X86Codec, X86Config, X86Tables, X86_FORMAT};
pub use pte::{Decoded, X86Flags, X86Pte};
