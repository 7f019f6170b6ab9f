//! A DMA device's IOMMU context: the tables' format, its IOTLB, and the modeled latency
//! of an IOTLB invalidation.
//!
//! Everything MMU-specific about a device behind the IOMMU is here. Table edits are
//! [`IoTables`]'s; [`SimMmu`] gives the device its translation caches (a small
//! per-queue L1, the IOMMU's shared IOTLB as L2, a paging-structure cache) and the
//! translation of every DMA access. [`IommuMmu`] adds what makes an IOMMU expensive to
//! unmap on: an invalidation does not complete when the caches are dropped, but when
//! the hardware has processed the invalidation descriptors and signalled the wait
//! descriptor.
//!
//! ## The invalidation latency model
//! [`InvalidationLatency::nanos`] is the time one `invalidate` / `invalidate_all` call
//! takes to complete, whatever the number of ranges it carries (one batch of
//! page-selective descriptors followed by one wait descriptor: the wait dominates).
//! With [`InvalidationWait::Spin`] the calling CPU busy-waits that many nanoseconds of
//! wall-clock time (`Instant` polled with `spin_loop`), as Linux's `qi_submit_sync` and
//! FreeBSD's `dmar_qi_wait_for_seq` spin on the wait descriptor's status: the wait
//! costs real CPU time and delays everything the caller holds a lock for. With
//! [`InvalidationWait::Account`] nothing waits and the nanoseconds are only counted
//! (for tests). Waits of different CPUs do not queue behind each other in the model.

use crate::table::IoTables;
use gmem_core::{
    MapRun, Mmu, MmuError, PageSizes, PageTableFormat, PageTableRoot, Prot, VaRange, VirtAddr,
};
use gmem_sim::{
    HierarchyConfig, HierarchyStats, Leaf, Level, Miss, MmuStats, Replacement, SimMmu, Tlb,
    TlbConfig, TlbConfigError, TlbHierarchy, TlbStats, TranslationCaches, Translator, Walk,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the caller experiences an invalidation's latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidationWait {
    /// Busy-wait the latency on the calling CPU.
    Spin,
    /// Only count the latency.
    Account,
}

/// The modeled completion time of one IOTLB invalidation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidationLatency {
    /// Nanoseconds from submitting the descriptors to the wait descriptor's completion.
    pub nanos: u64,
    /// Whether the caller spins or the time is only counted.
    pub wait: InvalidationWait,
}

impl InvalidationLatency {
    /// A real IOTLB invalidation's order of magnitude (about 2 µs), spun.
    pub const TYPICAL: InvalidationLatency = InvalidationLatency::spin(2000);

    /// `nanos` spun by the caller.
    pub const fn spin(nanos: u64) -> InvalidationLatency {
        InvalidationLatency {
            nanos,
            wait: InvalidationWait::Spin,
        }
    }

    /// `nanos` counted, not waited.
    pub const fn accounted(nanos: u64) -> InvalidationLatency {
        InvalidationLatency {
            nanos,
            wait: InvalidationWait::Account,
        }
    }

    fn wait(&self) {
        if self.wait == InvalidationWait::Spin && self.nanos > 0 {
            let until = Duration::from_nanos(self.nanos);
            let t = Instant::now();
            while t.elapsed() < until {
                std::hint::spin_loop();
            }
        }
    }
}

thread_local! {
    /// Nanoseconds this thread has spent inside invalidations (measured, not modeled).
    static INVALIDATING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Run the invalidation `f` and add its wall time to the calling thread's account.
fn invalidating<T>(f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    let took = t.elapsed().as_nanos() as u64;
    INVALIDATING.with(|c| c.set(c.get() + took));
    r
}

/// The wall-clock nanoseconds the calling thread has spent inside IOTLB invalidations
/// so far (every context, every IOMMU): the modeled wait ([`InvalidationWait::Spin`])
/// and the simulated caches dropping their entries — the hardware's part of an
/// invalidation, which a real CPU spends spinning on the wait descriptor. A benchmark
/// that times a map or unmap subtracts the difference across the call to get the
/// mapping layer's own cost (allocation, bookkeeping, table edits, locks).
pub fn invalidating_nanos_on_this_thread() -> u64 {
    INVALIDATING.with(std::cell::Cell::get)
}

/// IOTLB geometry for a device with `queues` DMA queues: a 32-entry 8-way L1 per queue
/// (the device's view), a shared 256-entry 8-way IOTLB and a 16-entry paging-structure
/// cache, all LRU.
pub fn iotlb(queues: usize) -> HierarchyConfig {
    HierarchyConfig {
        units: queues,
        l1: TlbConfig::new(4, 8, Replacement::Lru),
        l2: Some(TlbConfig::new(32, 8, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 16, Replacement::Lru)),
    }
}

/// Counters of an [`IommuMmu`] beyond its caches'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IommuMmuStats {
    /// The caches and the walker.
    pub sim: MmuStats,
    /// Invalidations completed (`invalidate` and `invalidate_all` calls).
    pub invalidations: u64,
    /// Modeled nanoseconds spent waiting for them.
    pub invalidation_nanos: u64,
    /// Of the invalidations, paging-structure-cache flushes after a map that found
    /// unlinked table pages still retired (reader-writer or locked tables with
    /// asynchronous unmaps).
    pub walk_cache_flushes: u64,
}

/// The translation caches of a context: the IOTLB hierarchy, or an organisation a
/// caller plugs in (such as MESC's subregion IOTLB entries) behind the same trait.
// The stock hierarchy stays inline: boxing it would add an indirection to every
// translation of the Table 3 benchmark's hot path.
#[allow(clippy::large_enum_variant)]
pub enum IoCaches {
    /// Per-queue L1s, the shared IOTLB and the paging-structure cache ([`iotlb`]).
    Plain(TlbHierarchy),
    /// Another organisation.
    Plugged(Box<dyn TranslationCaches>),
}

macro_rules! each {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            IoCaches::Plain($c) => $e,
            IoCaches::Plugged(b) => {
                let $c = &**b;
                $e
            }
        }
    };
}

macro_rules! each_mut {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            IoCaches::Plain($c) => $e,
            IoCaches::Plugged(b) => {
                let $c = &mut **b;
                $e
            }
        }
    };
}

impl TranslationCaches for IoCaches {
    fn units(&self) -> usize {
        each!(self, c => c.units())
    }
    fn lookup(&mut self, unit: usize, root: u64, va: u64) -> Option<(Leaf, Level)> {
        each_mut!(self, c => TranslationCaches::lookup(c, unit, root, va))
    }
    fn holds(&self, unit: usize, root: u64, va: u64) -> bool {
        each!(self, c => TranslationCaches::holds(c, unit, root, va))
    }
    fn fill(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        each_mut!(self, c => TranslationCaches::fill(c, unit, root, va, leaf))
    }
    fn fill_missed(&mut self, unit: usize, root: u64, va: u64, leaf: Leaf) {
        each_mut!(self, c => c.fill_missed(unit, root, va, leaf))
    }
    fn forget(&mut self, unit: usize, root: u64, va: u64) {
        each_mut!(self, c => TranslationCaches::forget(c, unit, root, va))
    }
    fn walk_cache(&mut self) -> Option<&mut Tlb<u64>> {
        each_mut!(self, c => TranslationCaches::walk_cache(c))
    }
    fn note_walk(&mut self, walk: &Walk) {
        each_mut!(self, c => TranslationCaches::note_walk(c, walk))
    }
    fn invalidate(&mut self, root: u64, ranges: &[(u64, u64)]) {
        each_mut!(self, c => TranslationCaches::invalidate(c, root, ranges))
    }
    fn invalidate_root(&mut self, root: u64) {
        each_mut!(self, c => TranslationCaches::invalidate_root(c, root))
    }
    fn flush(&mut self) {
        each_mut!(self, c => TranslationCaches::flush(c))
    }
    fn stats(&self) -> HierarchyStats {
        each!(self, c => TranslationCaches::stats(c))
    }
    fn l1_stats(&self, unit: usize) -> Option<TlbStats> {
        each!(self, c => TranslationCaches::l1_stats(c, unit))
    }
}

/// One device's context in the IOMMU: the core's `Mmu` for it.
pub struct IommuMmu {
    sim: SimMmu<IoTables, IoCaches>,
    latency: InvalidationLatency,
    invalidations: AtomicU64,
    nanos: AtomicU64,
    walk_cache_flushes: AtomicU64,
}

impl IommuMmu {
    /// A context walking `tables` with caches `caches` and invalidations that take
    /// `latency`.
    ///
    /// # Errors
    /// A [`TlbConfigError`] when `caches` has no queue (unit) or a TLB with zero sets or
    /// ways or more than 2^20 entries.
    pub fn new(
        tables: Arc<IoTables>,
        caches: HierarchyConfig,
        latency: InvalidationLatency,
    ) -> Result<IommuMmu, TlbConfigError> {
        let caches = IoCaches::Plain(TlbHierarchy::new(caches)?);
        Ok(IommuMmu::with_caches(tables, caches, latency))
    }

    /// A context walking `tables` with the cache organisation `caches`.
    pub fn with_caches(
        tables: Arc<IoTables>,
        caches: IoCaches,
        latency: InvalidationLatency,
    ) -> IommuMmu {
        IommuMmu {
            sim: SimMmu::with_caches(tables, caches),
            latency,
            invalidations: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            walk_cache_flushes: AtomicU64::new(0),
        }
    }

    /// The tables.
    pub fn tables(&self) -> &Arc<IoTables> {
        self.sim.table_format()
    }

    /// The invalidation latency.
    pub fn latency(&self) -> InvalidationLatency {
        self.latency
    }

    /// The root the device translates with.
    pub fn active_root(&self) -> Option<PageTableRoot> {
        self.sim.active_root()
    }

    /// Whether queue `queue`'s L1 or the IOTLB caches a translation of `va` (a probe: no
    /// counter moves).
    pub fn cached(&self, queue: usize, va: VirtAddr) -> bool {
        self.sim.cached(queue, va)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> IommuMmuStats {
        IommuMmuStats {
            sim: self.sim.stats(),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            invalidation_nanos: self.nanos.load(Ordering::Relaxed),
            walk_cache_flushes: self.walk_cache_flushes.load(Ordering::Relaxed),
        }
    }

    fn wait(&self) {
        self.latency.wait();
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(self.latency.nanos, Ordering::Relaxed);
    }
}

impl Translator for IommuMmu {
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss> {
        self.sim.translate(unit, va, access)
    }
    fn units(&self) -> usize {
        self.sim.units()
    }
}

impl Mmu for IommuMmu {
    fn format(&self) -> PageTableFormat {
        self.sim.format()
    }
    fn page_sizes(&self) -> PageSizes {
        self.sim.page_sizes()
    }
    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        self.sim.create_page_table()
    }
    fn destroy_page_table(&self, root: PageTableRoot) {
        self.sim.destroy_page_table(root)
    }
    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let installs = self.tables().installs();
        self.sim.map(root, run)?;
        // The IOTLB never caches a non-present leaf, but its paging-structure cache may
        // still point at a table page an unmap unlinked since the last invalidation (an
        // asynchronous unmap's table reclamation). If this map installed a new table
        // where such a page used to be, a walk would follow the stale pointer and miss
        // the new mapping. So a map that installed a table while pages of the root are
        // retired flushes that cache — an invalidation command with its latency — which
        // also lets the retired pages go.
        if self.tables().installs() != installs && self.tables().has_retired(root) {
            invalidating(|| {
                self.wait();
                self.sim.invalidate(root, &[]);
            });
            self.walk_cache_flushes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        self.sim.unmap(root, range)
    }
    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        self.sim.protect(root, range, prot)
    }
    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]) {
        // The entries stay usable until the wait descriptor completes; only then are
        // they gone (and the table pages retired before may be freed).
        invalidating(|| {
            self.wait();
            self.sim.invalidate(root, ranges);
        })
    }
    fn invalidate_all(&self, root: PageTableRoot) {
        invalidating(|| {
            self.wait();
            self.sim.invalidate_all(root);
        })
    }
    fn activate(&self, root: Option<PageTableRoot>) {
        self.sim.activate(root)
    }
    /// Every discipline takes concurrent edits of disjoint ranges: the locked one
    /// serialises them on its table's own lock (held for the edit only, not for the
    /// core's bookkeeping), compare-and-swap and reader-writer tables edit in parallel.
    fn concurrent_edits(&self) -> bool {
        true
    }
}
