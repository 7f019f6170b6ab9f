//! A device MMU: a page-table format plus the device's translation caches.
//!
//! [`SimMmu`] implements the core's [`Mmu`] for any [`TableFormat`]: table edits go to
//! the format, `invalidate` and `invalidate_all` to the device's [`TlbHierarchy`], and
//! `activate` points the device at a root (flushing its caches, as a CR3 write without
//! PCIDs does). [`SimMmu::translate`] is what the hardware does on every access:
//! TLBs, then a page walk (through the page-walk cache), then either a leaf that
//! permits the access or a [`Miss`] the driver turns into `dev_fault`.

use crate::format::{Leaf, TableFormat, WalkerId};
use crate::hierarchy::{HierarchyConfig, HierarchyStats, TlbHierarchy};
use crate::lock;
use crate::tlb::TlbConfigError;
use gmem_core::{
    MapRun, Mmu, MmuError, PageSizes, PageTableFormat, PageTableRoot, Prot, VaRange, VirtAddr,
};
use std::sync::{Arc, Mutex};

/// Why a translation did not produce a usable leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// The device translates with no page table (not active in any space).
    Inactive,
    /// No valid leaf maps the address.
    NotPresent,
    /// A leaf maps it but does not permit the access.
    Protection {
        /// What the leaf permits.
        allowed: Prot,
    },
}

/// What a device does for each access: translate an address for a unit.
pub trait Translator: Send + Sync {
    /// Translate `va` for `access` by compute unit `unit`.
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss>;
    /// Number of compute units.
    fn units(&self) -> usize;
}

/// Counters of a [`SimMmu`] beyond its caches'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmuStats {
    /// The caches' counters.
    pub caches: HierarchyStats,
    /// `invalidate` calls.
    pub invalidate_calls: u64,
    /// Ranges those calls carried.
    pub invalidated_ranges: u64,
    /// `invalidate_all` calls.
    pub invalidate_all_calls: u64,
    /// `activate` calls.
    pub activations: u64,
    /// Translations that missed every cache and walked.
    pub translations: u64,
}

struct State {
    root: Option<PageTableRoot>,
    caches: TlbHierarchy,
    stats: MmuStats,
}

/// A device MMU over format `F`.
pub struct SimMmu<F: TableFormat> {
    format: Arc<F>,
    walker: WalkerId,
    state: Mutex<State>,
}

impl<F: TableFormat> SimMmu<F> {
    /// An MMU walking `format`'s tables with caches of geometry `config`.
    pub fn new(format: Arc<F>, config: HierarchyConfig) -> Result<SimMmu<F>, TlbConfigError> {
        let caches = TlbHierarchy::new(config)?;
        let walker = format.new_walker();
        Ok(SimMmu {
            format,
            walker,
            state: Mutex::new(State {
                root: None,
                caches,
                stats: MmuStats::default(),
            }),
        })
    }

    /// The format.
    pub fn table_format(&self) -> &Arc<F> {
        &self.format
    }

    /// The root the device translates with.
    pub fn active_root(&self) -> Option<PageTableRoot> {
        lock(&self.state).root
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> MmuStats {
        let g = lock(&self.state);
        MmuStats {
            caches: g.caches.stats(),
            ..g.stats
        }
    }

    /// Unit `unit`'s L1 counters.
    pub fn l1_stats(&self, unit: usize) -> Option<crate::tlb::TlbStats> {
        lock(&self.state).caches.l1_stats(unit)
    }

    /// Whether unit `unit`'s L1 or the L2 caches a translation of `va` (a probe for
    /// tests: no counter moves).
    pub fn cached(&self, unit: usize, va: VirtAddr) -> bool {
        let g = lock(&self.state);
        g.root
            .is_some_and(|root| g.caches.holds(unit, root.0, va.as_u64()))
    }
}

impl<F: TableFormat> Translator for SimMmu<F> {
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss> {
        let mut g = lock(&self.state);
        let root = g.root.ok_or(Miss::Inactive)?;
        if let Some(leaf) = g.caches.lookup(unit, root.0, va.as_u64()) {
            if !leaf.prot.contains(access) {
                g.caches.forget(unit, root.0, va.as_u64());
                return Err(Miss::Protection { allowed: leaf.prot });
            }
            if leaf.dirty || !access.contains(Prot::WRITE) {
                return Ok(leaf);
            }
            // A store through a clean entry walks again to set the dirty bit.
        }
        g.stats.translations += 1;
        let walk = self.format.walk(root, va, access, g.caches.walk_cache());
        g.caches.note_walk(&walk);
        match walk.leaf {
            None => Err(Miss::NotPresent),
            Some(leaf) if !leaf.prot.contains(access) => {
                Err(Miss::Protection { allowed: leaf.prot })
            }
            Some(leaf) => {
                g.caches.fill(unit, root.0, va.as_u64(), leaf);
                Ok(leaf)
            }
        }
    }

    fn units(&self) -> usize {
        lock(&self.state).caches.units()
    }
}

impl<F: TableFormat> Mmu for SimMmu<F> {
    fn format(&self) -> PageTableFormat {
        self.format.format()
    }
    fn page_sizes(&self) -> PageSizes {
        self.format.page_sizes()
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        self.format.create()
    }
    fn destroy_page_table(&self, root: PageTableRoot) {
        self.format.destroy(root)
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        self.format.map(root, run)
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        self.format.unmap(root, range)
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        self.format.protect(root, range, prot)
    }
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]) {
        let list: Vec<(u64, u64)> = ranges.iter().map(|r| (r.start.as_u64(), r.len)).collect();
        {
            let mut g = lock(&self.state);
            g.caches.invalidate(root.0, &list);
            g.stats.invalidate_calls += 1;
            g.stats.invalidated_ranges += ranges.len() as u64;
        }
        self.format.walker_invalidated(self.walker, root);
    }
    fn invalidate_all(&self, root: PageTableRoot) {
        {
            let mut g = lock(&self.state);
            g.caches.invalidate_root(root.0);
            g.stats.invalidate_all_calls += 1;
        }
        self.format.walker_invalidated(self.walker, root);
    }
    /// The format's accessed bits. The TLB is not touched here: the core invalidates
    /// every device using the table for a page reported referenced, after which the
    /// next access walks and sets the bit again.
    fn test_and_clear_accessed(&self, root: PageTableRoot, range: VaRange) -> Option<bool> {
        self.format.test_and_clear_accessed(root, range)
    }
    fn activate(&self, root: Option<PageTableRoot>) {
        {
            let mut g = lock(&self.state);
            g.root = root;
            g.caches.flush();
            g.stats.activations += 1;
        }
        self.format.walker_activated(self.walker, root);
    }
}
