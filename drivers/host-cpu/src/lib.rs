//! # gmem-host-cpu: the simulated host CPU device
//!
//! The core's predefined CPU device (`gm_dev_CPU`) on simulated hardware: host memory
//! that holds real bytes (the swap space of every device memory), x86-64 4-level page
//! tables in that memory, per-core TLBs with a second-level TLB and a paging-structure
//! cache, and `load`/`store` that translate like the hardware, call `Gmem::dev_fault` on
//! a miss or a protection fault, retry, and move the bytes in whichever device's memory
//! the translation points to.
//!
//! | module | part of the driver |
//! |---|---|
//! | [`mmu`] | MMU-specific: the x86-64 format and the TLB geometry |
//! | [`device`] | device-independent: memory, registration, loads and stores |
//!
//! ```
//! use gmem_core::{Activation, AllocPolicy, AllocRequest, MmuMode, VirtAddr};
//! use gmem_host_cpu::{HostCpu, HostCpuConfig};
//!
//! let (gm, cpu) = HostCpu::boot(HostCpuConfig::default()).unwrap();
//! let space = gm
//!     .as_create(VirtAddr::new(1 << 30), VirtAddr::new(1 << 40), AllocPolicy::empty())
//!     .unwrap();
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch).unwrap();
//! let buf = gm.as_alloc(space, AllocRequest::new(1 << 16)).unwrap();
//! cpu.store_u32(&gm, buf.start, 42).unwrap(); // faults, the core zero-fills, retry
//! assert_eq!(cpu.load_u32(&gm, buf.start).unwrap(), 42);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod device;
pub mod mmu;
#[cfg(test)]
mod tests;

pub use device::{HostCpu, HostCpuConfig, HostCpuError, HostCpuStats, X86Tables};
pub use mmu::{cpu_tlbs, CpuMmu};
