//! # gmem-sv39: a RISC-V Sv39 MMU driver for gmem-core
//!
//! The driver a kernel on a RISC-V hart gives the core as its CPU device's [`Mmu`]
//! (`gmem_core::Mmu`): three-level page tables in real memory, 4 KiB leaves for the
//! core's mappings, large leaves for the kernel's own *global* mappings (copied into
//! every table so the kernel keeps running when `satp` changes), emptied tables freed
//! after a full `sfence.vma`, per-page or full TLB invalidation.
//!
//! | module | owns |
//! |---|---|
//! | [`pte`] | the entry format (V/R/W/X/U/G/A/D, PPN), address layout, canonical checks |
//! | [`codec`] | [`Sv39Codec`]: the format as a codec of the shared page-table engine |
//! | [`hardware`] | the two hardware touch points: page-table memory and `sfence.vma`/`satp` |
//! | `driver` | [`Sv39`]: the engine over real memory, global slots, retirement, fences |
//!
//! Everything but [`hardware::Sv39Hardware`]'s implementation is plain format logic,
//! tested on the host against a `Vec`-backed memory and a recording hart; on a real
//! hart, `DirectHart` (riscv64 only) implements it with volatile accesses and inline
//! assembly. `drivers/sv39/kernel` in this repository boots a kernel that uses it under
//! QEMU and serves its real page faults through the core.
//!
//! [`Mmu`]: gmem_core::Mmu

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod codec;
mod driver;
pub mod hardware;
pub mod pte;
#[cfg(test)]
mod tests;

pub use codec::Sv39Codec;
pub use driver::{
    GlobalMapping, Sv39, Sv39Config, Sv39Stats, Translation, HW_BAD_FRAME, HW_RESERVED_ENTRY,
    HW_UNKNOWN_ROOT, SV39_FORMAT,
};
#[cfg(target_arch = "riscv64")]
pub use hardware::DirectHart;
pub use hardware::Sv39Hardware;
