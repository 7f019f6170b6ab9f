//! # gmem-iommu: a simulated IOMMU whose devices get their IOVA spaces from the core
//!
//! The GMEM paper's BUS_DMA case study (section 6.1, Table 3) on simulated hardware.
//! A DMA device (a NIC) sits behind an IOMMU; every buffer it may touch is mapped for
//! the duration of one DMA and unmapped right after ("strict" safety), so the mapping
//! churn is as high as the packet rate. Without GMEM the IOMMU driver brings its own
//! IOVA allocator and page-table code; with GMEM the driver writes only its MMU
//! functions and the core gives each device an address space (IOVA space) with a vmem
//! arena, a logical page table and an asynchronous MMU queue that coalesces IOTLB
//! invalidations.
//!
//! | module | part of the driver |
//! |---|---|
//! | [`memory`] | MMU-specific: table memory with atomic 64-bit entries, table-page reclamation |
//! | [`table`] | MMU-specific: x86-64 4-level tables, lock-free / reader-writer / locked edits |
//! | [`mmu`] | MMU-specific: a device's IOMMU context, its IOTLB, the invalidation latency |
//! | [`device`] | device-independent: the IOMMU unit, DMA devices in the core, bus_dma map/unmap, DMA |
//! | [`baseline`] | the peer: FreeBSD's busdma path (GAS tree, domain / page-table / unit locks), bypassing the core |
//! | [`gas`] | the peer's IOVA allocator: FreeBSD's augmented tree of map entries |
//!
//! ## What each variant of Table 3 is here
//! | paper | here |
//! |---|---|
//! | FreeBSD (GAS tree allocator, giant-locked page table) | [`GiantLockDomain`] on [`Discipline::Locked`] tables |
//! | GM-V | [`DmaDevice`] (core's vmem arena), [`Discipline::Locked`], strict unmap |
//! | GM-V-CAS | [`Discipline::Cas`], strict unmap |
//! | GM-V-RW | [`Discipline::Rw`], strict unmap |
//! | GM-V-CAS-A / GM-V-RW-A | the same with `MapFlags::ASYNC` unmaps (coalesced invalidations) |
//!
//! ```
//! use gmem_core::{AllocPolicy, MapFlags, PhysAddr, Prot, SingleCpu, VirtAddr};
//! use gmem_host_cpu::{HostCpu, HostCpuConfig};
//! use gmem_iommu::{Iommu, IommuConfig, InvalidationLatency};
//! use std::sync::Arc;
//!
//! // Host memory: the core manages all of it but the last 1 MiB, which holds buffers.
//! let cpu = HostCpu::new(HostCpuConfig::default()).unwrap();
//! let gm = gmem_core::Gmem::new(Arc::new(SingleCpu), cpu.device_desc()).unwrap();
//! cpu.port().bind(gm.host()).unwrap();
//! cpu.memory_map().add(gm.host(), cpu.memory().clone()).unwrap();
//! let buffers = cpu.memory().end().as_u64() - (1 << 20);
//! gm.dev_register_physmem(gm.host(), PhysAddr::new(cpu.memory().base().as_u64() + (8 << 20)),
//!     PhysAddr::new(buffers)).unwrap();
//!
//! let config = IommuConfig { latency: InvalidationLatency::accounted(2000), ..Default::default() };
//! let iommu = Iommu::new(config, cpu.memory_map().clone()).unwrap();
//! let nic = iommu.create_device(&gm, "nic").unwrap();
//! let space = nic
//!     .create_space(&gm, VirtAddr::new(1 << 20), VirtAddr::new(1 << 32), AllocPolicy::CACHED)
//!     .unwrap();
//! let buf = PhysAddr::new(buffers);
//! let mapping = nic.map_buffer(&gm, space, &[buf], gm.host(), Prot::WRITE).unwrap();
//! nic.write(0, mapping.start, b"packet").unwrap();
//! let mut got = [0u8; 6];
//! cpu.memory().read(buf, &mut got).unwrap();
//! assert_eq!(&got, b"packet");
//! nic.unmap_buffer(&gm, mapping, MapFlags::empty(), None).unwrap();
//! assert!(nic.write(0, mapping.start, b"late").is_err()); // an IOMMU fault
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod baseline;
pub mod device;
pub mod gas;
pub mod memory;
pub mod mmu;
mod sync;
pub mod table;
#[cfg(test)]
mod tests;

pub use baseline::{BusDmaMap, GiantLockDomain, LegacyError, LegacyStats};
pub use device::{
    BusDmaError, CachesFn, DmaDevice, DmaError, DmaFault, DmaPort, DmaStats, Iommu, IommuConfig,
    IommuError,
};
pub use gas::{Gas, GasEntry, GasStats, IovaError};
pub use memory::{TableMemory, TableMemoryError, TableMemoryStats};
pub use mmu::{
    invalidating_nanos_on_this_thread, iotlb, InvalidationLatency, InvalidationWait, IoCaches,
    IommuMmu, IommuMmuStats,
};
pub use table::{Discipline, IoTableStats, IoTables, IOMMU_FORMAT};
