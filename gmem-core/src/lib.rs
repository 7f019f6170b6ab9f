//! # gmem-core: one memory manager for the CPU and every device MMU
//!
//! This crate is the GMEM kernel programming interface (KPI) as a `no_std` + `alloc`
//! library. A kernel embeds it once; every driver then writes only its MMU functions
//! (the [`Mmu`] trait) and a data mover ([`DeviceMemory`]) and lets the core do the
//! virtual-memory work: address spaces, virtual-range allocation, the logical page
//! table, page faults, placement, migration, oversubscription and TLB coherence.
//!
//! ## Vocabulary
//! - A **device** is anything with an MMU: the host CPU (predefined, the swap space of
//!   every device memory), an IOMMU, a GPU. It has capabilities ([`DevCaps`]) and may
//!   register local physical memory.
//! - An **address space** is a virtual range `[begin, end)` with an allocation policy.
//!   Devices **attach** to it in shared, coherent or replicate mode ([`MmuMode`]); each
//!   device is **active** in one space at a time.
//! - A **region** is an allocated virtual range of a space. Its pages are backed
//!   lazily: a fault allocates, zero-fills or migrates a frame according to the region's
//!   placement policy, and installs the mapping through the faulting device's MMU.
//! - The **logical page table** records, per virtual page, where the data lives and
//!   which page tables currently map it; it is the single source of truth that keeps
//!   the devices' page tables coherent.
//!
//! ## Layers inside the crate
//! | module | owns |
//! |---|---|
//! | [`addr`] | addresses, page numbers, page sizes |
//! | [`flags`] | protections, capabilities, policies (bitflags) |
//! | [`vmem`] | vmem arenas: virtual ranges and physical frames |
//! | [`mmu`] | the driver-facing MMU and memory traits |
//! | [`device`] | devices and their registered physical memory |
//! | [`gmem`] | the instance: device and space registries, statistics |
//! | [`kpi`] | **the KPI entry points**, one module per object: [`kpi::device`] (`dev_*`), [`kpi::space`] (`as_*`), [`kpi::region`] (`region_*`), [`kpi::mapping_set`] (`mapping_set_*`) |
//! | [`space`] | one address space's state behind its lock: regions, page tables, attachments (`attach`), the fault path (`fault`), the queue's work (`queue`), shared region operations (`ops`), its invariants (`check`) |
//! | [`fault`] | what a fault answers, and the fault path's theory |
//! | `queue` | the asynchronous MMU queue, callbacks, strict unmaps invalidated outside the lock |
//! | [`physmem`] | one device's frames: queues, reverse map, free extents, page groups |
//! | [`error`] | one error enum per call family |
//! | [`sync`] | locks and atomics (loom-switchable) and **the lock order** |
//! | [`check`] | `check_invariants` |
//! | [`stats`] | counters a caller can read |
//!
//! The entry point is [`Gmem`], one instance per kernel; a KPI call's path is
//! `lib.rs` → [`kpi`] → the module named for its object.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
// `unsafe` appears as the `FrameSource` contract (an `unsafe trait`) and in fenced
// hardware hints (`vmem`'s prefetch); the page queues of `physmem` are linked by frame
// index, with no pointer to fence.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

extern crate alloc;
// Only the optional `std` feature (user-space hosts) links std: yielding lock waits and
// the debug-build lock-order checker.
#[cfg(feature = "std")]
extern crate std;

pub mod addr;
pub mod check;
pub mod device;
pub mod error;
pub mod fault;
pub mod flags;
pub mod gmem;
pub mod handle;
pub mod kpi;
mod lpt;
pub mod mmu;
pub mod physmem;
pub mod platform;
mod queue;
pub mod space;
pub mod stats;
pub mod sync;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod vmem;

pub use addr::{AddrError, PageSize, Pfn, PhysAddr, VaRange, VirtAddr, Vpn, PAGE_SIZE};
pub use check::Violation;
pub use device::DeviceDesc;
pub use error::{
    AllocError, AttachError, DeviceError, FaultError, LookupError, MapError, PolicyError,
    PopulateError, ProtectError, RegionError, SetError, SpaceError,
};
pub use fault::{FaultKind, FaultResolution};
pub use flags::{AllocPolicy, DevCaps, MapFlags, PageSizes, Prot};
pub use gmem::Gmem;
pub use handle::{DeviceId, MappingSetId, SpaceId};
pub use kpi::frames::{CompactReport, FrameError};
pub use kpi::region::{MapRequest, MigrateScope};
pub use mmu::{
    bounce_copy, Attrs, DeviceMemory, FrameConstraint, FramePlacement, FrameRequest, MapRun,
    MemError, Mmu, MmuError, PageTableFormat, PageTableRoot, COPY_BOUNCE_BYTES,
};
pub use physmem::{EvictionPolicy, FrameCounts, FreeExtents, GroupStats, ReservationStats};
pub use platform::{FrameSource, Platform, SingleCpu};
pub use queue::Callback;
pub use space::{
    Activation, AllocRequest, LargeLeaf, MmuMode, Placement, PlacementMode, PlacementTarget,
    Region, RegionInfo,
};
pub use stats::Stats;
