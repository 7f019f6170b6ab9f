//! # gmem-igpu: a simulated faultable integrated GPU
//!
//! The GMEM paper's first simulated device (section 6.4): an integrated GPU with no
//! memory of its own that walks x86-64 tables in host memory, so it can either *share*
//! the CPU's page table (attach in `MmuMode::Shared`: one table, the core shoots down
//! both TLBs) or keep a *coherent* one of its own (`MmuMode::Coherent`), and that
//! recovers from translation faults (fault-and-retry through `Gmem::dev_fault`). Each
//! compute unit has an L1 TLB; an L2 TLB and a page-walk cache are shared. Kernels run
//! as work-groups whose every load and store goes through that MMU.
//!
//! | module | part of the driver |
//! |---|---|
//! | [`mmu`] | MMU-specific: the (CPU's) x86-64 format and the TLB geometry |
//! | [`device`] | device-independent: creation in the core, kernels, loads and stores |

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod device;
pub mod mmu;

pub use device::{Igpu, IgpuError, IgpuStats};
pub use mmu::{igpu_tlbs, IgpuMmu};
