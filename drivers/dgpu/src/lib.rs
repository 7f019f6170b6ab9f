//! # gmem-dgpu: a simulated faultable discrete GPU
//!
//! The GMEM paper's second simulated device (section 6.5): a GPU with video memory of
//! its own, registered with the core (which places, migrates and — when the memory is
//! oversubscribed — evicts pages in it), its own page-table format living in that
//! memory, a copy engine that is the core's data mover for it, and a kernel-execution
//! engine whose work-items load and store through the GPU's MMU: per-CU L1 TLBs, a
//! shared L2, a page-walk cache, faults served by `Gmem::dev_fault` and retried.
//!
//! | module | part of the driver |
//! |---|---|
//! | [`format`](mod@format) | MMU-specific: the 3-level GPU format with its aperture bit |
//! | [`mmu`] | MMU-specific: the TLB geometry |
//! | [`device`] | device-independent: video memory, registration, kernels |
//!
//! `tests/hmm.rs` runs Linux's HMM selftests adapted to GMEM against it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod device;
pub mod format;
pub mod mmu;

#[cfg(test)]
mod mesc_tests;

pub use device::{Dgpu, DgpuConfig, DgpuError, DgpuStats};
pub use format::{GpuCodec, GpuTables};
pub use mmu::{dgpu_tlbs, DgpuMmu};
