//! A device MMU: a page-table format plus the device's translation caches.
//!
//! [`SimMmu`] implements the core's [`Mmu`] for any [`TableFormat`]: table edits go to
//! the format, `invalidate` and `invalidate_all` to the device's [`TlbHierarchy`], and
//! `activate` points the device at a root (flushing its caches, as a CR3 write without
//! PCIDs does). [`SimMmu::translate`] is what the hardware does on every access:
//! TLBs, then a page walk (through the page-walk cache), then either a leaf that
//! permits the access or a [`Miss`] the driver turns into `dev_fault`.
//!
//! ## Shootdowns wait for accesses in flight
//! Each MMU has an [`AccessGate`]: a port holds it shared from the translation that
//! produced a frame until the bytes have moved, and `invalidate`, `invalidate_all` and
//! `activate` take it exclusively before dropping cached entries. So when the core's
//! invalidation returns, no access of this device still uses a frame looked up before
//! it (the core then copies a migrating page's bytes and frees the old frame), as a
//! hardware shootdown waits for the requests in flight to drain.
//!
//! ## Recording
//! [`SimMmu::start_recording`] logs every translation (unit, root, address, access,
//! the leaf a walk gave or the cached leaf, the walk's entry reads) and every
//! invalidation as [`TraceEvent`]s; [`replay`] runs such a stream through any
//! [`TranslationCaches`] with the same decision logic as the live MMU, so replaying
//! through the live configuration gives exactly the live counters, page-walk cache
//! included. A replayed walk probes the replay's page-walk cache as the live walker
//! does (deepest level first), reads one entry per level from the level it starts at
//! down to the level where the live walk stopped (the leaf's level for a walk the live
//! run did not make) and fills the cache for each level it descended. The cache's
//! values (table addresses) are not recorded: replay needs only which keys are
//! present.

use crate::format::{Leaf, TableFormat, Walk, WalkerId};
use crate::hierarchy::{HierarchyConfig, HierarchyStats, Level, TlbHierarchy, TranslationCaches};
use crate::lock;
use crate::tlb::{Tlb, TlbConfigError};
use gmem_core::{
    MapRun, Mmu, MmuError, PageSizes, PageTableFormat, PageTableRoot, Prot, VaRange, VirtAddr,
};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

/// Where a translation was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Served {
    /// The unit's L1 TLB.
    L1,
    /// The shared L2 TLB.
    L2,
    /// A page walk that read `reads` table entries (after the page-walk cache).
    Walk {
        /// Entries read from memory.
        reads: u32,
    },
    /// The translator does not say.
    Unknown,
}

/// Accesses in flight against shootdowns: shared by accesses, exclusive for an
/// invalidation (see the module documentation).
#[derive(Debug, Default)]
pub struct AccessGate(RwLock<()>);

impl AccessGate {
    /// An open gate.
    pub fn new() -> AccessGate {
        AccessGate::default()
    }

    /// Enter with an access (shared). Never hold it across `Gmem::dev_fault`: the core
    /// may invalidate this device while serving the fault.
    #[inline]
    pub fn enter(&self) -> RwLockReadGuard<'_, ()> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until no access is in flight and keep new ones out (exclusive).
    pub fn shootdown(&self) -> RwLockWriteGuard<'_, ()> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a device does for each access: translate an address for a unit.
pub trait Translator: Send + Sync {
    /// Translate `va` for `access` by compute unit `unit`.
    ///
    /// # Errors
    /// The [`Miss`] the device reports to the core's fault path: [`Miss::Inactive`]
    /// with no active table, [`Miss::NotPresent`] with no valid leaf,
    /// [`Miss::Protection`] with a leaf that does not permit `access`.
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss>;
    /// Number of compute units.
    fn units(&self) -> usize;
    /// [`Translator::translate`], also saying which level served it (a cost model's
    /// input). The default says [`Served::Unknown`].
    fn translate_served(
        &self,
        unit: usize,
        va: VirtAddr,
        access: Prot,
    ) -> (Result<Leaf, Miss>, Served) {
        (self.translate(unit, va, access), Served::Unknown)
    }
    /// The gate invalidations of this translator wait on, if it has one.
    fn gate(&self) -> Option<&AccessGate> {
        None
    }
    /// Which of `pages` (the first 64) unit `unit`'s caches hold now, as a bit mask
    /// (bit `i` for `pages[i]`), without moving a counter or a replacement stamp: what
    /// a timed model asks at issue time to know which requests will walk. `None` when
    /// the translator does not say (the default).
    fn held(&self, unit: usize, pages: &[(VirtAddr, Prot)]) -> Option<u64> {
        let _ = (unit, pages);
        None
    }
    /// [`Translator::translate_served`] for each `(va, access)` of `pages` in order,
    /// handing each answer to `each` with the page's index, and stopping as soon as
    /// `each` returns `false` (the way a faulting instruction stops). An MMU may serve
    /// the whole list under one acquisition of its state; the default translates one
    /// page at a time.
    fn translate_batch(
        &self,
        unit: usize,
        pages: &[(VirtAddr, Prot)],
        each: &mut dyn FnMut(usize, Result<Leaf, Miss>, Served) -> bool,
    ) {
        for (i, &(va, access)) in pages.iter().enumerate() {
            let (r, served) = self.translate_served(unit, va, access);
            if !each(i, r, served) {
                return;
            }
        }
    }
}

/// One event of a recorded translation stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A translation request.
    Translate {
        /// The unit asking.
        unit: u32,
        /// The root translated with.
        root: u64,
        /// The address.
        va: u64,
        /// The access.
        access: Prot,
        /// What a walk gives at this point: the walked leaf when the live run walked,
        /// otherwise the cached leaf; `None` when nothing was mapped.
        answer: Option<Leaf>,
        /// The live run walked for this request.
        walked: bool,
        /// Entries the live walk read (0 when it did not walk).
        reads: u32,
        /// Entries written back.
        writes: u32,
        /// Levels the live walk skipped thanks to its page-walk cache (0 when it did
        /// not walk).
        skipped: u32,
    },
    /// `invalidate(root, ranges)`; the ranges are `TraceLog::ranges[first..first+count]`.
    Invalidate {
        /// The root.
        root: u64,
        /// First range in [`TraceLog::ranges`].
        first: u32,
        /// Number of ranges.
        count: u32,
    },
    /// `invalidate_all(root)`.
    InvalidateRoot {
        /// The root.
        root: u64,
    },
    /// `activate`: every cache flushed.
    Flush,
}

/// A recorded translation stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceLog {
    /// The events in order.
    pub events: Vec<TraceEvent>,
    /// Range lists of the invalidations, `(start, len)` bytes.
    pub ranges: Vec<(u64, u64)>,
}

impl TraceLog {
    /// Translation requests in the log.
    pub fn translations(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| matches!(e, TraceEvent::Translate { .. }))
            .count() as u64
    }
}

/// Counters of a replay (the same as the live MMU's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// The caches' counters.
    pub caches: HierarchyStats,
    /// Translations that walked.
    pub translations: u64,
}

/// The decision logic shared by the live MMU and the replayer: caches first; a hit
/// that forbids the access drops the entry and misses; a store through a clean entry
/// walks again; a walk's leaf is filled only when it permits the access.
pub(crate) fn translate_in<C: TranslationCaches>(
    caches: &mut C,
    walks: &mut u64,
    unit: usize,
    root: u64,
    va: u64,
    access: Prot,
    walk: impl FnOnce(&mut C) -> Walk,
) -> (Result<Leaf, Miss>, Served, Option<Walk>, Option<Leaf>) {
    let cached = caches.lookup(unit, root, va);
    translate_looked_up(caches, walks, unit, root, va, access, cached, walk)
}

/// A hit that serves `access` as it is: a cached leaf that permits it and, for a
/// store, is dirty. [`translate_in`] answers such a hit with the leaf and its level,
/// moving nothing more; the one home of that condition (the fast path of
/// `SimMmu::translate_served` and `SimMmu::translate_batch`, `translate_untraced`, asks
/// it too).
#[inline]
fn clean_hit(cached: Option<(Leaf, Level)>, access: Prot) -> Option<(Leaf, Level)> {
    cached.filter(|(leaf, _)| {
        leaf.prot.contains(access) && (leaf.dirty || !access.contains(Prot::WRITE))
    })
}

/// [`translate_in`] after its cache lookup answered `cached`.
#[allow(clippy::too_many_arguments)]
fn translate_looked_up<C: TranslationCaches>(
    caches: &mut C,
    walks: &mut u64,
    unit: usize,
    root: u64,
    va: u64,
    access: Prot,
    cached: Option<(Leaf, Level)>,
    walk: impl FnOnce(&mut C) -> Walk,
) -> (Result<Leaf, Miss>, Served, Option<Walk>, Option<Leaf>) {
    if let Some((leaf, level)) = clean_hit(cached, access) {
        return (Ok(leaf), served_at(level), None, Some(leaf));
    }
    if let Some((leaf, level)) = cached {
        if !leaf.prot.contains(access) {
            caches.forget(unit, root, va);
            return (
                Err(Miss::Protection { allowed: leaf.prot }),
                served_at(level),
                None,
                Some(leaf),
            );
        }
        // Permitted but a store through a clean leaf: walk to set the dirty bit.
    }
    *walks += 1;
    let w = walk(caches);
    caches.note_walk(&w);
    let r = match w.leaf {
        None => Err(Miss::NotPresent),
        Some(leaf) if !leaf.prot.contains(access) => Err(Miss::Protection { allowed: leaf.prot }),
        Some(leaf) => {
            if cached.is_none() {
                caches.fill_missed(unit, root, va, leaf);
            } else {
                caches.fill(unit, root, va, leaf);
            }
            Ok(leaf)
        }
    };
    // A fill that read entries beyond the walk (MESC's head leaves) makes the walk
    // longer: the served reads count them (the trace keeps the hardware walk's).
    let extra = if r.is_ok() {
        caches.take_fill_reads()
    } else {
        0
    };
    let served = Served::Walk {
        reads: w.reads + extra,
    };
    (r, served, Some(w), w.leaf)
}

fn served_at(level: Level) -> Served {
    match level {
        Level::L1 => Served::L1,
        Level::L2 => Served::L2,
    }
}

/// Replay `log` through `caches`. `levels` is the table format's depth (4 for x86-64).
/// A walk uses the recorded answer; its reads follow from where the replay's
/// page-walk cache lets it start and where the live walk stopped (see the module
/// documentation). Replaying through a copy of the live configuration gives the live
/// counters.
pub fn replay<C: TranslationCaches>(caches: &mut C, log: &TraceLog, levels: u32) -> ReplayStats {
    let top = levels.saturating_sub(1);
    let mut walks = 0;
    for e in &log.events {
        match *e {
            TraceEvent::Translate {
                unit,
                root,
                va,
                access,
                answer,
                walked,
                reads,
                writes,
                skipped,
            } => {
                let end = walk_end(top, answer, walked, reads, skipped);
                let _ = translate_in(caches, &mut walks, unit as usize, root, va, access, |c| {
                    replay_walk(c, root, va, top, end, answer, writes)
                });
            }
            TraceEvent::Invalidate { root, first, count } => {
                let r = &log.ranges[first as usize..(first + count) as usize];
                caches.invalidate(root, r);
            }
            TraceEvent::InvalidateRoot { root } => caches.invalidate_root(root),
            TraceEvent::Flush => caches.flush(),
        }
    }
    ReplayStats {
        caches: caches.stats(),
        translations: walks,
    }
}

/// The level a recorded translation's walk stops at (reads last): where the live walk
/// stopped when it walked, otherwise the level of the leaf it would have reached.
pub(crate) fn walk_end(
    top: u32,
    answer: Option<Leaf>,
    walked: bool,
    reads: u32,
    skipped: u32,
) -> u32 {
    if walked {
        (top.saturating_sub(skipped) + 1).saturating_sub(reads)
    } else {
        answer.map_or(0, |l| u32::from(l.shift.saturating_sub(12)) / 9)
    }
}

/// A replayed walk of `va` from the top level `top` down to level `end`: the page-walk
/// cache probed and filled as [`crate::walk_cached`] does.
fn replay_walk<C: TranslationCaches>(
    c: &mut C,
    root: u64,
    va: u64,
    top: u32,
    end: u32,
    answer: Option<Leaf>,
    writes: u32,
) -> Walk {
    replay_walk_in(c.walk_cache(), root, va, top, end, answer, writes)
}

/// [`replay_walk`] through the page-walk cache `pwc` itself (the split replayer holds
/// the cache levels apart).
pub(crate) fn replay_walk_in(
    pwc: Option<&mut Tlb<u64>>,
    root: u64,
    va: u64,
    top: u32,
    end: u32,
    answer: Option<Leaf>,
    writes: u32,
) -> Walk {
    let mut start = top;
    if let Some(pwc) = pwc {
        let (mut shifts, mut n) = ([0u8; 8], 0);
        for l in 1..=top.min(8) {
            shifts[n] = gmem_ptengine::level_shift(l);
            n += 1;
        }
        if let Some((s, _)) = pwc.lookup_deepest(root, va, &shifts[..n]) {
            start = (u32::from(s) - 12) / 9 - 1;
        }
        // The walk descends through the tables below levels start..=end+1. Those
        // levels are at or below `start`: `lookup_deepest` probed each before the hit
        // (or all, on a miss) and found nothing, so no search for an entry to overwrite.
        let mut l = start;
        while l > end {
            pwc.insert_absent(root, va, gmem_ptengine::level_shift(l), 0);
            l -= 1;
        }
    }
    Walk {
        leaf: answer,
        reads: (start + 1).saturating_sub(end),
        writes,
        skipped: top - start,
    }
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

struct State<C> {
    root: Option<PageTableRoot>,
    caches: C,
    stats: MmuStats,
    trace: Option<TraceLog>,
}

/// A device MMU over format `F` with cache organisation `C`.
pub struct SimMmu<F: TableFormat, C: TranslationCaches = TlbHierarchy> {
    format: Arc<F>,
    walker: WalkerId,
    gate: AccessGate,
    state: Mutex<State<C>>,
}

impl<F: TableFormat> SimMmu<F> {
    /// An MMU walking `format`'s tables with caches of geometry `config`.
    ///
    /// # Errors
    /// As [`TlbHierarchy::new`] for a bad geometry.
    pub fn new(format: Arc<F>, config: HierarchyConfig) -> Result<SimMmu<F>, TlbConfigError> {
        Ok(SimMmu::with_caches(format, TlbHierarchy::new(config)?))
    }
}

impl<F: TableFormat, C: TranslationCaches> SimMmu<F, C> {
    /// An MMU walking `format`'s tables with the cache organisation `caches`.
    pub fn with_caches(format: Arc<F>, caches: C) -> SimMmu<F, C> {
        let walker = format.new_walker();
        SimMmu {
            format,
            walker,
            gate: AccessGate::new(),
            state: Mutex::new(State {
                root: None,
                caches,
                stats: MmuStats::default(),
                trace: None,
            }),
        }
    }

    /// Start logging translations and invalidations (dropping any log in progress).
    pub fn start_recording(&self) {
        lock(&self.state).trace = Some(TraceLog::default());
    }

    /// Stop logging and return the log (empty when none was started).
    pub fn take_recording(&self) -> TraceLog {
        lock(&self.state).trace.take().unwrap_or_default()
    }

    /// Run `f` on the cache organisation (a probe for tests and reports).
    pub fn with_cache_state<R>(&self, f: impl FnOnce(&C) -> R) -> R {
        f(&lock(&self.state).caches)
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

impl<F: TableFormat, C: TranslationCaches> Translator for SimMmu<F, C> {
    fn translate(&self, unit: usize, va: VirtAddr, access: Prot) -> Result<Leaf, Miss> {
        self.translate_served(unit, va, access).0
    }

    fn translate_served(
        &self,
        unit: usize,
        va: VirtAddr,
        access: Prot,
    ) -> (Result<Leaf, Miss>, Served) {
        let mut g = lock(&self.state);
        let g = &mut *g;
        match g.root {
            // As one page of `translate_batch`: a clean hit answered here, anything
            // else through the one path of `translate_in`.
            Some(root) if g.trace.is_none() => {
                // A repeated hit (consecutive accesses to one page) answered inline.
                let cached = match g.caches.lookup_repeated(unit, root.0, va.as_u64()) {
                    Some(hit) => Some(hit),
                    None => g.caches.lookup(unit, root.0, va.as_u64()),
                };
                self.translate_untraced(g, unit, root, va, access, cached)
            }
            _ => self.translate_locked(g, unit, va, access),
        }
    }

    fn translate_batch(
        &self,
        unit: usize,
        pages: &[(VirtAddr, Prot)],
        each: &mut dyn FnMut(usize, Result<Leaf, Miss>, Served) -> bool,
    ) {
        let mut g = lock(&self.state);
        let g = &mut *g;
        match g.root {
            // Untraced, a clean hit (the common case) is answered here; anything else
            // takes the one path of `translate_in` from the same lookup. Neither
            // changes the root or the recording, so they are read once per batch.
            Some(root) if g.trace.is_none() => {
                for (i, &(va, access)) in pages.iter().enumerate() {
                    let cached = g.caches.lookup(unit, root.0, va.as_u64());
                    let (r, served) = self.translate_untraced(g, unit, root, va, access, cached);
                    if !each(i, r, served) {
                        return;
                    }
                }
            }
            _ => {
                for (i, &(va, access)) in pages.iter().enumerate() {
                    let (r, served) = self.translate_locked(g, unit, va, access);
                    if !each(i, r, served) {
                        return;
                    }
                }
            }
        }
    }

    fn units(&self) -> usize {
        lock(&self.state).caches.units()
    }

    fn gate(&self) -> Option<&AccessGate> {
        Some(&self.gate)
    }

    fn held(&self, unit: usize, pages: &[(VirtAddr, Prot)]) -> Option<u64> {
        let g = lock(&self.state);
        let Some(root) = g.root else {
            return Some(0);
        };
        Some(
            pages
                .iter()
                .take(64)
                .enumerate()
                .filter(|(_, (va, _))| g.caches.holds(unit, root.0, va.as_u64()))
                .fold(0, |m, (i, _)| m | 1 << i),
        )
    }
}

impl<F: TableFormat, C: TranslationCaches> SimMmu<F, C> {
    /// One translation with the state locked, active (`root`) and not recording, once
    /// the caches' lookup of `va` answered `cached`: a clean hit (the common case)
    /// answered from it, anything else the rest of [`translate_in`] from the same
    /// lookup ([`SimMmu::translate_missed`]). The same answer and counters as
    /// [`SimMmu::translate_locked`] then.
    #[inline(always)]
    fn translate_untraced(
        &self,
        st: &mut State<C>,
        unit: usize,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cached: Option<(Leaf, Level)>,
    ) -> (Result<Leaf, Miss>, Served) {
        match clean_hit(cached, access) {
            Some((leaf, level)) => (Ok(leaf), served_at(level)),
            None => self.translate_missed(st, unit, root, va, access, cached),
        }
    }

    /// An untraced translation whose cache lookup answered `cached`, not a clean hit
    /// (see [`SimMmu::translate_untraced`]): the rest of [`translate_in`]. Out of line so
    /// that the hit path stays small. Its arguments repeat `translate_untraced`'s on
    /// purpose: passed as one struct they cost the strided `rows` kernel 22,872 →
    /// 23,129 instructions per memory instruction (callgrind on `live_speed rows`,
    /// stop 28), the struct going through memory at this out-of-line call.
    #[inline(never)]
    fn translate_missed(
        &self,
        st: &mut State<C>,
        unit: usize,
        root: PageTableRoot,
        va: VirtAddr,
        access: Prot,
        cached: Option<(Leaf, Level)>,
    ) -> (Result<Leaf, Miss>, Served) {
        debug_assert!(st.trace.is_none());
        let (r, served, _, _) = translate_looked_up(
            &mut st.caches,
            &mut st.stats.translations,
            unit,
            root.0,
            va.as_u64(),
            access,
            cached,
            |c| self.format.walk(root, va, access, c.walk_cache()),
        );
        (r, served)
    }

    /// One translation with the state already locked.
    fn translate_locked(
        &self,
        g: &mut State<C>,
        unit: usize,
        va: VirtAddr,
        access: Prot,
    ) -> (Result<Leaf, Miss>, Served) {
        let Some(root) = g.root else {
            return (Err(Miss::Inactive), Served::Unknown);
        };
        let st = g;
        let (r, served, walk, answer) = translate_in(
            &mut st.caches,
            &mut st.stats.translations,
            unit,
            root.0,
            va.as_u64(),
            access,
            |c| self.format.walk(root, va, access, c.walk_cache()),
        );
        if let Some(t) = st.trace.as_mut() {
            let units = st.caches.units().max(1);
            t.events.push(TraceEvent::Translate {
                unit: (unit % units) as u32,
                root: root.0,
                va: va.as_u64(),
                access,
                answer,
                walked: walk.is_some(),
                reads: walk.map_or(0, |w| w.reads),
                writes: walk.map_or(0, |w| w.writes),
                skipped: walk.map_or(0, |w| w.skipped),
            });
        }
        (r, served)
    }
}

impl<F: TableFormat, C: TranslationCaches> Mmu for SimMmu<F, C> {
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
            let _drained = self.gate.shootdown();
            let mut g = lock(&self.state);
            g.caches.invalidate(root.0, &list);
            g.stats.invalidate_calls += 1;
            g.stats.invalidated_ranges += ranges.len() as u64;
            if let Some(t) = g.trace.as_mut() {
                let first = t.ranges.len() as u32;
                t.ranges.extend_from_slice(&list);
                t.events.push(TraceEvent::Invalidate {
                    root: root.0,
                    first,
                    count: list.len() as u32,
                });
            }
        }
        self.format.walker_invalidated(self.walker, root);
    }
    fn invalidate_all(&self, root: PageTableRoot) {
        {
            let _drained = self.gate.shootdown();
            let mut g = lock(&self.state);
            g.caches.invalidate_root(root.0);
            g.stats.invalidate_all_calls += 1;
            if let Some(t) = g.trace.as_mut() {
                t.events.push(TraceEvent::InvalidateRoot { root: root.0 });
            }
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
            let _drained = self.gate.shootdown();
            let mut g = lock(&self.state);
            g.root = root;
            g.caches.flush();
            g.stats.activations += 1;
            if let Some(t) = g.trace.as_mut() {
                t.events.push(TraceEvent::Flush);
            }
        }
        self.format.walker_activated(self.walker, root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::SimMemory;
    use crate::radix::test_codec::TestCodec;
    use crate::radix::RadixTables;
    use crate::tlb::{Replacement, TlbConfig};
    use gmem_core::{DeviceId, PageSize, PhysAddr, PAGE_SIZE};

    /// An active MMU over fresh tables: a read-write page at 0x40_0000, a read-only
    /// one at 0x40_1000, nothing at 0x40_2000.
    fn mmu() -> SimMmu<RadixTables<TestCodec>> {
        let m = Arc::new(SimMemory::new("m", PhysAddr::new(0), 4 << 20).unwrap());
        let tables = Arc::new(RadixTables::new(TestCodec, m, PhysAddr::new(0), 16).unwrap());
        let config = HierarchyConfig {
            units: 2,
            l1: TlbConfig::new(4, 2, Replacement::Lru),
            l2: Some(TlbConfig::new(16, 4, Replacement::Lru)),
            walk_cache: None,
        };
        let mmu = SimMmu::new(tables, config).unwrap();
        let root = mmu.create_page_table().unwrap();
        for (va, pa, prot) in [
            (0x40_0000, 0x20_0000, Prot::RW),
            (0x40_1000, 0x20_1000, Prot::READ),
        ] {
            let run = MapRun {
                va: VirtAddr::new(va),
                pa: PhysAddr::new(pa),
                len: PAGE_SIZE,
                prot,
                page_size: PageSize::Size4K,
                memory: DeviceId::from_raw(0, 1),
                attrs: Default::default(),
            };
            mmu.map(root, &run).unwrap();
        }
        mmu.activate(Some(root));
        mmu
    }

    /// `translate_batch` (its clean hits answered without the general path) gives the
    /// answers, the levels and the counters of one `translate_served` per page, in
    /// order, and stops where `each` says: walks, L1 and L2 hits, a store through a
    /// clean cached leaf, a store a read-only leaf refuses, an unmapped page. Both give
    /// those of a recording MMU's `translate_served`, which takes the general path
    /// (`translate_locked`) for every page.
    #[test]
    fn batch_equals_a_translation_per_page() {
        let (batch, single, traced) = (mmu(), mmu(), mmu());
        traced.start_recording();
        let (rw, ro, none) = (0x40_0000u64, 0x40_1000u64, 0x40_2000u64);
        let va = |a: u64| VirtAddr::new(a + 0x48);
        // (unit, pages, answers `each` takes before it stops the batch)
        type List = (usize, Vec<(VirtAddr, Prot)>, usize);
        let lists: Vec<List> = vec![
            (0, vec![(va(rw), Prot::READ), (va(ro), Prot::READ)], 2),
            (0, vec![(va(rw), Prot::READ), (va(ro), Prot::READ)], 2),
            (1, vec![(va(rw), Prot::READ)], 1),
            (0, vec![(va(rw), Prot::WRITE), (va(rw), Prot::WRITE)], 2),
            (0, vec![(va(ro), Prot::WRITE), (va(ro), Prot::READ)], 2),
            (1, vec![(va(none), Prot::READ), (va(rw), Prot::READ)], 2),
            (0, vec![(va(rw), Prot::READ), (va(rw), Prot::WRITE)], 1),
            (1, vec![(va(rw), Prot::WRITE), (va(ro), Prot::READ)], 2),
        ];
        let mut served_seen = Vec::new();
        for (unit, pages, stop_after) in lists {
            let mut got = Vec::new();
            batch.translate_batch(unit, &pages, &mut |i, r, served| {
                got.push((i, r, served));
                got.len() < stop_after
            });
            let want: Vec<_> = pages
                .iter()
                .take(stop_after)
                .enumerate()
                .map(|(i, &(va, access))| {
                    let (r, served) = single.translate_served(unit, va, access);
                    assert_eq!(traced.translate_served(unit, va, access), (r, served));
                    (i, r, served)
                })
                .collect();
            assert_eq!(got, want);
            served_seen.extend(got.iter().map(|&(_, r, s)| (r.is_ok(), s)));
        }
        assert_eq!(batch.stats(), single.stats());
        assert_eq!(traced.stats(), single.stats());
        assert!(traced.take_recording().translations() > 0);
        assert_eq!(
            batch.with_cache_state(|c| c.stats()),
            single.with_cache_state(|c| c.stats())
        );
        // The sequence reached every kind of answer.
        for kind in [Served::L1, Served::L2] {
            assert!(served_seen.contains(&(true, kind)), "{kind:?}");
        }
        assert!(served_seen
            .iter()
            .any(|&(ok, s)| ok && matches!(s, Served::Walk { .. })));
        assert!(served_seen.iter().any(|&(ok, _)| !ok));
    }
}
