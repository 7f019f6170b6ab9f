//! # gmem-core: one memory manager for the CPU and every device MMU
//!
//! A `#![no_std]` + `alloc` library that a kernel embeds once as the memory manager of
//! the CPU and of every device with an MMU (an IOMMU, a GPU). The kernel and its
//! drivers describe hardware; the core does the virtual-memory work: address spaces,
//! virtual-range allocation, the logical page table, page faults, placement,
//! migration, eviction and TLB coherence.
//!
//! ## Quick start
//! A driver implements two traits:
//! - [`Mmu`] — its page-table format and its TLB: create and destroy a table, map a
//!   physically contiguous run, unmap and protect ranges, invalidate, activate. The
//!   contracts it may rely on are in [`driver`].
//! - [`DeviceMemory`] — how the core zeroes, reads and writes the memory it manages
//!   for the device (for the CPU: RAM through the kernel's own mapping).
//!
//! The kernel adds a [`Platform`] (which CPU runs, how many there are, and the
//! interrupt-off section around every call; [`SingleCpu`] for a uniprocessor). Then
//! the path from nothing to a served page fault is ten lines:
//!
//! ```
//! use gmem_core::*;
//! use std::collections::BTreeMap;
//! use std::sync::{Arc, Mutex};
//!
//! /// A toy format: one map per table, virtual page -> (frame, protection).
//! #[derive(Default)]
//! struct ToyMmu {
//!     tables: Mutex<BTreeMap<u64, BTreeMap<u64, (u64, Prot)>>>,
//! }
//!
//! impl Mmu for ToyMmu {
//!     fn format(&self) -> PageTableFormat { PageTableFormat(0x70) }
//!     fn page_sizes(&self) -> PageSizes { PageSizes::S4K }
//!     fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
//!         let mut t = self.tables.lock().unwrap();
//!         let root = t.len() as u64 + 1; // a real driver: the root page's address
//!         t.insert(root, BTreeMap::new());
//!         Ok(PageTableRoot(root))
//!     }
//!     fn destroy_page_table(&self, root: PageTableRoot) {
//!         self.tables.lock().unwrap().remove(&root.0);
//!     }
//!     fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
//!         let mut t = self.tables.lock().unwrap();
//!         let table = t.get_mut(&root.0).ok_or(MmuError::Hardware(1))?;
//!         for k in 0..run.len / PAGE_SIZE {
//!             table.insert(run.va.vpn().0 + k, (run.pa.pfn().0 + k, run.prot));
//!         }
//!         Ok(())
//!     }
//!     fn unmap(&self, root: PageTableRoot, range: VaRange) {
//!         let first = range.first_vpn().0;
//!         if let Some(table) = self.tables.lock().unwrap().get_mut(&root.0) {
//!             table.retain(|vpn, _| *vpn < first || *vpn >= first + range.pages());
//!         }
//!     }
//!     fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
//!         let first = range.first_vpn().0;
//!         if let Some(table) = self.tables.lock().unwrap().get_mut(&root.0) {
//!             for (_, pte) in table.range_mut(first..first + range.pages()) {
//!                 pte.1 = prot;
//!             }
//!         }
//!         Ok(())
//!     }
//!     fn invalidate(&self, _root: PageTableRoot, _ranges: &[VaRange]) {} // invlpg / IPIs
//!     fn invalidate_all(&self, _root: PageTableRoot) {}
//!     fn activate(&self, _root: Option<PageTableRoot>) {} // write CR3 / satp
//! }
//! # impl ToyMmu {
//! #     fn lookup(&self, va: VirtAddr) -> Option<(u64, Prot)> {
//! #         let t = self.tables.lock().unwrap();
//! #         t.values().find_map(|table| table.get(&va.vpn().0).copied())
//! #     }
//! # }
//! #
//! # /// RAM the core manages: 64 pages of bytes from physical address 0.
//! # struct Ram(Mutex<Vec<u8>>);
//! # impl DeviceMemory for Ram {
//! #     fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
//! #         let mut m = self.0.lock().unwrap();
//! #         let r = m.get_mut(pa.as_u64() as usize..(pa.as_u64() + len) as usize);
//! #         r.ok_or(MemError::OutOfRange { pa })?.fill(0);
//! #         Ok(())
//! #     }
//! #     fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
//! #         let m = self.0.lock().unwrap();
//! #         let r = m.get(pa.as_u64() as usize..pa.as_u64() as usize + buf.len());
//! #         buf.copy_from_slice(r.ok_or(MemError::OutOfRange { pa })?);
//! #         Ok(())
//! #     }
//! #     fn write(&self, pa: PhysAddr, buf: &[u8]) -> Result<(), MemError> {
//! #         let mut m = self.0.lock().unwrap();
//! #         let r = m.get_mut(pa.as_u64() as usize..pa.as_u64() as usize + buf.len());
//! #         r.ok_or(MemError::OutOfRange { pa })?.copy_from_slice(buf);
//! #         Ok(())
//! #     }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let ram = Arc::new(Ram(Mutex::new(vec![0xAA; 64 * PAGE_SIZE as usize])));
//!
//! let mmu = Arc::new(ToyMmu::default());
//! let cpu = DeviceDesc {
//!     name: "cpu".into(), mmu: mmu.clone(), memory: Some(ram),
//!     caps: DevCaps::FAULTABLE, data: None,
//! };
//! let gm = Gmem::new(Arc::new(SingleCpu), cpu)?;                     // one per kernel
//! gm.dev_register_physmem(gm.host(), PhysAddr::new(0), PhysAddr::new(64 * PAGE_SIZE))?;
//! let space = gm.as_create(VirtAddr::new(1 << 30), VirtAddr::new(2 << 30), AllocPolicy::empty())?;
//! gm.as_attach(space, gm.host(), MmuMode::Coherent, Activation::Switch)?; // activate(Some)
//! let buf = gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))?;
//! // The CPU stores to `buf.start` and takes a page fault; the handler calls:
//! let served = gm.dev_try_fault(gm.host(), buf.start, Prot::WRITE)?;
//! assert_eq!(served.kind, FaultKind::ZeroFill);
//! // ... and returns: the store retries through the mapping the core installed.
//! let (frame, prot) = mmu.lookup(buf.start).expect("mapped by the fault");
//! assert!(frame < 64 && prot == Prot::RW);
//! # Ok(())
//! # }
//! ```
//!
//! Where to go next:
//! - [`guide`] — the embedding guide: the traits, a page-fault handler, the locking and
//!   interrupt rules, SMP shootdowns, what the core allocates.
//! - [`kpi`] — every call, by the object it acts on, each with an example.
//! - [`driver`] — the driver face: every trait and type a driver implements or is
//!   handed, and every contract it relies on.
//! - `gmem-core/examples/driver.rs` — a complete toy driver with a data mover
//!   (`cargo run -p gmem-core --example driver`); `drivers/sv39` — a real RISC-V Sv39
//!   driver and a kernel that boots on it under QEMU.
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
//! ## The public face
//! Two faces and three helpers; everything else is re-exported at the crate root or
//! private.
//!
//! | module | for |
//! |---|---|
//! | [`driver`] | **the driver face**: `Mmu`, `DeviceMemory`, `MapRun`, `FrameRequest`, `Platform`, their contracts |
//! | [`kpi`] | **the KPI face**: every call of [`Gmem`], by the object it acts on |
//! | [`error`] | one error enum per call family, all `#[non_exhaustive]` |
//! | [`guide`] | the embedding guide (documentation only) |
//! | [`sync`] | the core's locks and atomics (loom-switchable) and **the lock order**, for drivers that want them |
//! | [`vmem`] | the vmem arena on its own (virtual ranges, IOVAs, physical frames) |
//! | [`policy`] | the GPU-driver policy engines (fault batching, tree prefetch, thrashing, access counters, advice): data structures and decisions, not yet wired into the fault path |
//! | `testing` | (feature `test-util`) an in-memory test MMU, test memory and a test system |
//!
//! ## Inside the crate
//! Not needed to embed the core; for reading its code. The design notes it cites are
//! `gmem-core/DESIGN.md` (its invariants are the ones `check_invariants` checks).
//!
//! | module | owns |
//! |---|---|
//! | `addr`, `flags` | addresses, page numbers, page sizes; protections, capabilities, policies |
//! | `mmu`, `platform`, `device` | the driver traits and their types; the kernel's hooks; devices and their physical memory |
//! | `gmem` | the instance: device and space registries, statistics |
//! | `kpi/*` | the KPI entry points, one module per object: `device` (`dev_*`), `space` (`as_*`), `region` (`region_*`), `pages` (the range calls), `mapping_set`, `frames`, `large` |
//! | `space` | one address space's state behind its lock: regions, page tables, attachments (`attach`), the fault path (`fault`), the asynchronous MMU queue, its callbacks and strict unmaps invalidated outside the lock (`queue`), shared region operations (`ops`), its invariants (`check`) |
//! | `fault` | what a fault answers, and the fault path's theory |

//! | `physmem` | one device's frames: queues, reverse map, free extents, page groups |
//! | `stats` | counters a caller can read |
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
// the debug-build lock-order checker; and loom builds (loom needs std), whose spin lock
// model names the thread that holds it.
#[cfg(any(feature = "std", gmem_loom))]
extern crate std;

mod addr;
mod device;
pub mod driver;
pub mod error;
mod fault;
mod flags;
mod gmem;
pub mod guide;
mod handle;
pub mod kpi;
mod lpt;
mod mmu;
mod physmem;
mod platform;
pub mod policy;
mod space;
mod stats;
pub mod sync;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod vmem;

// The driver face lives in `driver`; the root names its items too (kernels and drivers
// write `gmem_core::Mmu`), as plain re-exports so that each has one page.
pub use addr::{AddrError, PageSize, Pfn, PhysAddr, VaRange, VirtAddr, Vpn, PAGE_SIZE};
#[doc(no_inline)]
pub use driver::{
    bounce_copy, Attrs, DeviceDesc, DeviceMemory, FrameConstraint, FramePlacement, FrameRequest,
    FrameSource, MapRun, MemError, Mmu, MmuError, PageTableFormat, PageTableRoot, Platform,
    SingleCpu, COPY_BOUNCE_BYTES,
};
pub use error::{
    AllocError, AttachError, DeviceError, FaultError, LookupError, MapError, MoveError,
    PolicyError, PopulateError, ProtectError, RegionError, SetError, SpaceError,
};
pub use fault::{FaultKind, FaultResolution};
pub use flags::{AllocPolicy, DevCaps, MapFlags, PageSizes, Prot};
pub use gmem::Gmem;
pub use handle::{DeviceId, MappingSetId, SpaceId};
pub use kpi::access::{AccessCounterState, AccessError, AccessOutcome};
pub use kpi::advice::AdviseError;
pub use kpi::batch::{BatchFault, BatchReport};
pub use kpi::dma::{DmaMapError, DmaMapping, DmaUnmapError};
pub use kpi::frames::{CompactReport, FrameError};
pub use kpi::pages::Pages;
pub use kpi::region::{MapRequest, MigrateScope};
pub use kpi::thrashing::ThrashingState;
pub use physmem::{
    EvictionPolicy, FrameCounts, FreeExtents, GroupStats, ReservationStats, MAX_GROUP_ORDER,
    MAX_ORDER,
};
pub use space::queue::Callback;
pub use space::violation::Violation;
pub use space::{
    Activation, AllocRequest, LargeLeaf, MmuMode, Placement, PlacementMode, PlacementTarget,
    Region, RegionInfo, MAX_MEMORIES, MAX_TABLES,
};
pub use stats::Stats;
