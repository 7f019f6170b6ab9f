//! # gmem-kvm: a guest whose CPU and pass-through device share one address space
//!
//! GMEM's first use example (section 4.2): KVM with a pass-through device, guest
//! memory growing and shrinking. Without GMEM the EPT and the IOMMU are two page tables
//! that KVM and VFIO must keep consistent by hand; Linux's notifiers do not cover a
//! pass-through device. With GMEM both devices attach to one guest-physical address
//! space: the guest CPU (its MMU is the EPT) and the DMA device (its MMU is the IOMMU).
//! Growing guest memory is `as_alloc` (plus `region_wire`, because the device cannot
//! fault), shrinking it is `region_dealloc`, and the core keeps both tables and both
//! TLBs coherent.
//!
//! | module | part of the driver |
//! |---|---|
//! | [`ept`] | MMU-specific: the EPT entry format and the guest's TLB geometry |
//! | [`vm`] | device-independent: the space, the two devices, grow / shrink, accesses |
//!
//! The pass-through device's MMU functions are the IOMMU driver's ([`gmem_iommu`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod ept;
#[cfg(test)]
mod tests;
pub mod vm;

pub use ept::{ept_tlbs, EptCodec, EptMmu, EptTables, EPT_FORMAT};
pub use vm::{KvmError, Vm, VmConfig, VmStats};
