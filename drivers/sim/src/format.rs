//! What a page-table format living in simulated memory provides.
//!
//! A [`TableFormat`] is one hardware format: its entry encoding, how its tables are
//! laid out in a [`crate::SimMemory`], how software edits them (the core's map, unmap
//! and protect, which is what a driver author writes) and how the hardware walks them.
//! [`crate::SimMmu`] turns any format into a device MMU (TLBs, a page-walk cache and
//! the core's [`gmem_core::Mmu`] trait); one driver = one format plus a few lines of
//! device glue.
//!
//! ## Contract
//! - Table edits are serialised by the core per table; a format still guards its own
//!   bookkeeping with a lock, because several devices may edit different tables of the
//!   same format at once.
//! - [`TableFormat::walk`] may run concurrently with edits of the same table (a device
//!   translating while the core maps something else): it reads each entry once, and an
//!   edit writes each entry with one store, so a walk sees the old or the new entry.
//! - A table page that an unmap emptied may still be cached by a walker's page-walk
//!   cache. It is *retired*, not freed, until every walker that was translating with
//!   that root has invalidated it ([`TableFormat::walker_invalidated`]); see
//!   [`crate::TableReclaim`].

use crate::tlb::Tlb;
use gmem_core::{
    MapRun, MmuError, PageSizes, PageTableFormat, PageTableRoot, Prot, VaRange, VirtAddr,
};

/// A leaf translation as a walk found it and a TLB caches it (the engine's: its
/// `bits` are the format bits a TLB entry keeps).
pub use gmem_ptengine::Leaf;

/// What one hardware page walk found and what it cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// The leaf, or `None` when some level was not present.
    pub leaf: Option<Leaf>,
    /// Entries read from memory.
    pub reads: u32,
    /// Entries written back (accessed/dirty bits).
    pub writes: u32,
    /// Levels skipped thanks to the page-walk cache.
    pub skipped: u32,
}

/// A walker's identity for table reclamation (one per device MMU).
pub use gmem_ptengine::WalkerId;

/// A page-table format in simulated memory: the driver's MMU functions and the
/// hardware's walk.
pub trait TableFormat: Send + Sync + 'static {
    /// The core's format id: equal ids share tables.
    fn format(&self) -> PageTableFormat;
    /// Page sizes the format reports to the core.
    fn page_sizes(&self) -> PageSizes;
    /// A new empty table.
    ///
    /// # Errors
    /// [`MmuError`] as the format reports it, e.g. no frame left for the root table.
    fn create(&self) -> Result<PageTableRoot, MmuError>;
    /// Free a table and everything below it.
    fn destroy(&self, root: PageTableRoot);
    /// Install a run; on error nothing of it stays mapped.
    ///
    /// # Errors
    /// [`MmuError`] as the format reports it: no frame for a table page, a page size
    /// the format cannot map, an address or frame outside its reach.
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError>;
    /// Clear every leaf in `range`, retiring tables left empty.
    fn unmap(&self, root: PageTableRoot, range: VaRange);
    /// Rewrite the permissions of every leaf in `range`.
    ///
    /// # Errors
    /// [`MmuError`] as the format reports it (e.g. no frame to split a large leaf the
    /// range cuts).
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError>;
    /// Read and clear the accessed bits of the leaves in `range` (see
    /// [`gmem_core::Mmu::test_and_clear_accessed`]); `None` (the default) for a format
    /// without accessed bits.
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        let _ = (root, range);
        None
    }
    /// The hardware walk of `va` for `access`, starting from the deepest level the
    /// page-walk cache `cache` (keyed by root, one page shift per level) knows and
    /// filling it. A permitted access sets the format's accessed/dirty bits.
    fn walk(
        &self,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cache: Option<&mut Tlb<u64>>,
    ) -> Walk;
    /// A new walker (a device MMU that walks this format's tables).
    fn new_walker(&self) -> WalkerId;
    /// The walker now translates with `root` (or nothing); its caches were flushed.
    fn walker_activated(&self, walker: WalkerId, root: Option<PageTableRoot>);
    /// The walker dropped every cached entry of `root` it had.
    fn walker_invalidated(&self, walker: WalkerId, root: PageTableRoot);
}
