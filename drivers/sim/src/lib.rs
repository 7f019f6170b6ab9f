//! # gmem-sim: simulated hardware that holds real bytes
//!
//! The pieces every simulated gmem driver is built from. Nothing here is a driver: a
//! driver is a page-table format ([`TableFormat`]: its MMU functions) plus a few lines
//! of device glue, and this crate supplies the hardware around it.
//!
//! | module | owns |
//! |---|---|
//! | [`memory`] | [`SimMemory`]: sparse, page-granular, bounds-checked physical memory |
//! | [`frames`] | [`FramePool`]: page-table frames carved out of a memory |
//! | [`dma`] | [`DmaEngine`]: a device's data mover, counting traffic each way |
//! | [`map`] | [`MemoryMap`]: which device's memory answers for a physical address |
//! | [`tlb`] | [`Tlb`]: set-associative, LRU / FIFO / seeded random replacement |
//! | [`hierarchy`] | [`TlbHierarchy`]: per-unit L1 TLBs, shared L2, page-walk cache |
//! | [`format`](mod@format) | [`TableFormat`]: what a page-table format in memory provides |
//! | [`radix`] | [`RadixTables`]: the shared page-table engine (`gmem-ptengine`) over a [`SimMemory`], any [`PteCodec`] |
//! | [`reclaim`] | [`TableReclaim`]: the engine's retirement rule over a [`FramePool`] |
//! | [`mmu`] | [`SimMmu`]: a format + caches = the core's `Mmu`, and the translation |
//! | [`stream`] | [`ReplayStream`]: a recorded stream pre-decoded, replayed split by level |
//! | [`port`] | [`Port`]: loads and stores with fault-and-retry through `dev_fault` |
//! | [`exec`] | work-groups of work-items running on a device's [`Port`] |
//!
//! ## How an access flows
//! A device load at `va` by compute unit `u`: [`Port::load`] asks the device's
//! [`SimMmu`] to translate; the unit's L1 TLB, then the shared L2, then a walk of the
//! active table in simulated memory (upper levels possibly from the page-walk cache)
//! produce a [`Leaf`]. No leaf, or one that forbids the access, is reported to the
//! core with `Gmem::dev_fault`; the core places, zero-fills or migrates the page and
//! calls the format's `map`; the port retries. The bytes then move in the
//! [`SimMemory`] the leaf points to. Every step counts what it did.
//!
//! Everything is deterministic: no clocks, no threads of its own, seeded randomness.
//!
//! The crate denies `unsafe`. The one exception is the TLB's SSE2 probe scan (the
//! private module `tlb::scan`: two aligned 16-byte loads, each with its `// SAFETY:`).

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod dma;
pub mod exec;
pub mod format;
pub mod frames;
pub mod hierarchy;
pub mod map;
pub mod memory;
pub mod mmu;
pub mod port;
pub mod radix;
pub mod reclaim;
pub mod stream;
pub mod tlb;

pub use dma::{Direction, DmaEngine, DmaStats};
pub use exec::{Grid, LaunchError, LaunchStats, WorkItem};
pub use format::{Leaf, TableFormat, Walk, WalkerId};
pub use frames::{FramePool, PoolStats};
pub use hierarchy::{HierarchyConfig, HierarchyStats, Level, TlbHierarchy, TranslationCaches};
pub use map::{MapError, MemoryMap};
pub use memory::{BoundsError, MemoryStats, SimMemory};
pub use mmu::{
    replay, AccessGate, Miss, MmuStats, ReplayStats, Served, SimMmu, TraceEvent, TraceLog,
    Translator,
};
pub use port::{AccessError, PageList, Port, PortStats, Resolved, DEFAULT_MAX_FAULTS};
pub use radix::{PteCodec, RadixTables, SimTableMemory, TableStats};
pub use reclaim::{ReclaimStats, TableReclaim};
pub use stream::{ReplayPath, ReplayStream, SplitReplay, StreamError, Unsplit};
pub use tlb::{Replacement, Tlb, TlbConfig, TlbConfigError, TlbStats};

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking the data even if a panicking thread poisoned the lock (the
/// simulated state stays usable for the assertions that follow the panic).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
