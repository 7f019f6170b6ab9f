//! [`PagedMmu`]: an x86-family page table in real memory as a core [`Mmu`].
//!
//! ## Theory
//! A page table is a tree of 4 KiB frames from the kernel's [`FrameSource`]; the
//! [`PageTableRoot`] the core holds is the physical address of the root frame. The
//! driver keeps no shadow of the tree: every walk reads the entries through
//! [`PagingHardware`], so what the host tests check is what the walker walks. The
//! format is a codec of the shared engine ([`gmem_ptengine`]): [`crate::X86Codec`] for
//! the CPU, [`crate::VtdCodec`] for a VT-d IOMMU's second-level tables — one engine,
//! one driver, two walkers.
//!
//! - **Global mappings.** [`PagedMmu::new`] builds a *template* root holding the
//!   embedding kernel's own mappings ([`GlobalMapping`], the largest leaves alignment
//!   allows). Every table the driver creates starts as a copy of the template's root
//!   entries, so the kernel keeps running when `activate` loads another root; the
//!   subtrees below are shared, never copied. A root slot that holds a global mapping
//!   belongs to the template: `map` refuses it (`MmuError::Unsupported`), `unmap` and
//!   `protect` skip it. An IOMMU context has no global mappings.
//! - **Leaves.** 4 KiB, and 2 MiB where the codec has them: a run the core asks for as
//!   2 MiB gets one 2 MiB leaf, never a larger one. Every 2 MiB leaf keeps a *split
//!   reserve* (a table frame taken when it is mapped), so a later partial unmap or
//!   protect splits it without allocating and `unmap` cannot fail.
//! - **Freeing tables.** `unmap` unlinks tables it emptied. A walker may still hold an
//!   unlinked table in its paging-structure cache until the next invalidation, so
//!   unlinked tables are *retired* and given back to the frame source only after the
//!   next `invalidate_all` (which an `invalidate` or a `map` becomes while tables are
//!   retired).
//! - **Invalidation.** `invalidate` hands the ranges to the hardware (per page on the
//!   CPU, page-selective descriptors on an IOMMU) up to
//!   [`PagedConfig::flush_all_above`] pages, and invalidates everything above that.
//!   `map` needs none: neither walker caches a not-present entry.
//!
//! One driver drives one walker; the core serialises calls on one table, and the
//! driver's shared state (live roots, retired tables, counters) is behind a lock or an
//! atomic.

use crate::hardware::PagingHardware;
use alloc::sync::Arc;
use alloc::vec::Vec;
use gmem_core::sync::{AtomicU64, Mutex, Ordering};
use gmem_core::{
    FrameSource, MapRun, Mmu, MmuError, PageSize, PageSizes, PageTableFormat, PageTableRoot,
    PhysAddr, Prot, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_ptengine::{index, level_size, Codec, EditError, Edited, Engine, Run, TableMemory};

/// `MmuError::Hardware` code: the root is not a live table of this driver.
pub const HW_UNKNOWN_ROOT: u32 = 0x86_01;
/// `MmuError::Hardware` code: the walk met an entry with a reserved encoding.
pub const HW_RESERVED_ENTRY: u32 = 0x86_02;
/// `MmuError::Hardware` code: the frame source returned a frame an entry cannot hold.
pub const HW_BAD_FRAME: u32 = 0x86_03;

/// Tunables of the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedConfig {
    /// Above this many pages an invalidation invalidates everything instead.
    pub flush_all_above: u64,
}

impl Default for PagedConfig {
    fn default() -> Self {
        PagedConfig {
            flush_all_above: 64,
        }
    }
}

/// A mapping present in every table the driver creates (the kernel's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalMapping {
    /// First virtual address, page aligned.
    pub va: VirtAddr,
    /// First physical address, page aligned.
    pub pa: PhysAddr,
    /// Length in bytes, a non-zero multiple of 4 KiB.
    pub len: u64,
    /// Permissions (not empty).
    pub prot: Prot,
}

impl GlobalMapping {
    /// `len` bytes mapped at their own physical address.
    pub const fn identity(start: u64, len: u64, prot: Prot) -> GlobalMapping {
        GlobalMapping {
            va: VirtAddr::new(start),
            pa: PhysAddr::new(start),
            len,
            prot,
        }
    }
}

/// What a walk found for one virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The physical address the virtual address translates to (offset included).
    pub pa: PhysAddr,
    /// The permissions of the leaf.
    pub prot: Prot,
    /// The size of the leaf.
    pub page_size: PageSize,
}

gmem_ptengine::counters! {
    /// A snapshot of the driver's counters.
    pub struct PagedStats in Counters {
        /// Page-table frames taken from the frame source (template included).
        tables_allocated,
        /// Page-table frames given back to it.
        tables_freed,
        /// Tables unlinked and waiting for an invalidation before they are freed.
        tables_retired,
        /// 4 KiB pages installed by `map` (a 2 MiB leaf counts 512).
        pages_mapped,
        /// 4 KiB pages cleared by `unmap`.
        pages_unmapped,
        /// 4 KiB pages rewritten by `protect`.
        pages_protected,
        /// Range invalidations handed to the hardware.
        invalidations_ranged,
        /// Whole-table invalidations handed to the hardware.
        invalidations_all,
        /// Roots loaded into the walker.
        activations,
    }
}

/// The page-table memory as the engine sees it.
struct PagedMemory<H> {
    hw: H,
    frames: Arc<dyn FrameSource>,
    retired: Mutex<Vec<PhysAddr>>,
    counters: Counters,
}

impl<H: PagingHardware> TableMemory for PagedMemory<H> {
    fn read(&self, pa: u64) -> Option<u64> {
        // SAFETY: the engine reads aligned entries of the template, of live roots and of
        // tables reached through entries the driver wrote: frames it got from its frame
        // source and still holds (`PagedMmu::new`'s contract).
        Some(unsafe { self.hw.read_pte(PhysAddr::new(pa)) })
    }

    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        // SAFETY: as in `read`. The driver writes global slots only while building the
        // template and into roots not yet handed out, otherwise only entries of ranges
        // the core edits: never a translation the kernel runs on.
        unsafe { self.hw.write_pte(PhysAddr::new(pa), raw) };
        Some(())
    }

    fn alloc(&self) -> Option<u64> {
        let f = self.frames.alloc_frame()?;
        self.counters.tables_allocated.add(1);
        Some(f.as_u64())
    }

    fn free(&self, table: u64) {
        self.frames.free_frame(PhysAddr::new(table));
        self.counters.tables_freed.add(1);
    }

    fn retire(&self, _root: u64, table: u64) {
        self.counters.tables_retired.add(1);
        self.retired.lock().push(PhysAddr::new(table));
    }
}

/// An x86-family MMU (CPU or IOMMU context) over page tables in real memory.
pub struct PagedMmu<C: Codec, H: PagingHardware> {
    engine: Engine<C, PagedMemory<H>>,
    config: PagedConfig,
    template: PhysAddr,
    /// The template's present root entries, copied into every new table.
    globals: Vec<(u64, u64)>,
    live: Mutex<Vec<u64>>,
    active: AtomicU64,
}

impl<C: Codec, H: PagingHardware> PagedMmu<C, H> {
    /// A driver for `codec`'s tables, walked by `hw`, built in frames from `frames`,
    /// every table carrying `globals`.
    ///
    /// # Errors
    /// `Unsupported` for a global mapping that is unaligned, empty, untranslatable,
    /// without permissions or overlapping another; `OutOfTableMemory` when `frames`
    /// runs dry; `Hardware(HW_BAD_FRAME)` for a codec the engine refuses or a frame an
    /// entry cannot point to.
    ///
    /// # Safety
    /// `frames` hands out frames nobody else uses while the driver holds them,
    /// reachable through `hw`. When `hw` is the CPU, `globals` map the code, stack and
    /// data the kernel runs on and the page-table frames.
    pub unsafe fn new(
        codec: C,
        hw: H,
        frames: Arc<dyn FrameSource>,
        config: PagedConfig,
        globals: &[GlobalMapping],
    ) -> Result<Self, MmuError> {
        let memory = PagedMemory {
            hw,
            frames,
            retired: Mutex::new(Vec::new()),
            counters: Counters::default(),
        };
        let engine = Engine::new(codec, memory).map_err(|_| MmuError::Hardware(HW_BAD_FRAME))?;
        let template = engine.create_root().map_err(to_mmu)?;
        let mut d = PagedMmu {
            engine,
            config,
            template: PhysAddr::new(template),
            globals: Vec::new(),
            live: Mutex::new(Vec::new()),
            active: AtomicU64::new(0),
        };
        for (k, g) in globals.iter().enumerate() {
            d.add_global(g, &globals[..k])?;
        }
        d.engine.enable_split_reserve();
        for i in 0..512 {
            let e = d.entry(template, i);
            if d.engine.codec().decode(e, d.engine.top()) != gmem_ptengine::Entry::NotPresent {
                d.globals.push((i, e));
            }
        }
        Ok(d)
    }

    fn add_global(&self, g: &GlobalMapping, before: &[GlobalMapping]) -> Result<(), MmuError> {
        let (va, pa) = (g.va.as_u64(), g.pa.as_u64());
        let overlaps = |o: &GlobalMapping| {
            let a = o.va.as_u64();
            a < va.wrapping_add(g.len) && va < a.wrapping_add(o.len)
        };
        if !g.va.is_page_aligned()
            || !g.pa.is_page_aligned()
            || g.len == 0
            || g.len % PAGE_SIZE != 0
            || g.prot.is_empty()
            || before.iter().any(overlaps)
        {
            return Err(MmuError::Unsupported { va: g.va });
        }
        let run = Run {
            va,
            pa,
            len: g.len,
            prot: g.prot,
            memory: None,
            bits: 0,
        };
        self.engine
            .map(self.template.as_u64(), &run)
            .map_err(to_mmu)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PagedStats {
        self.memory().counters.snapshot()
    }

    fn memory(&self) -> &PagedMemory<H> {
        self.engine.memory()
    }

    /// The hardware interface.
    pub fn hardware(&self) -> &H {
        &self.memory().hw
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        self.engine.codec()
    }

    /// The root holding only the global mappings.
    pub fn template_root(&self) -> PageTableRoot {
        PageTableRoot(self.template.as_u64())
    }

    /// The root the walker was last pointed at by `activate` (`None`: nothing, or the
    /// template).
    pub fn active_root(&self) -> Option<PageTableRoot> {
        match self.active.load(Ordering::Acquire) {
            0 => None,
            r => Some(PageTableRoot(r)),
        }
    }

    /// Page-table frames currently held (live tables, the template, retired ones).
    pub fn frames_held(&self) -> u64 {
        let s = self.stats();
        s.tables_allocated - s.tables_freed
    }

    /// Walk `root` for `va` as the hardware would: `None` if nothing translates it or
    /// the root is neither a live table of this driver nor its template.
    pub fn translate(&self, root: PageTableRoot, va: VirtAddr) -> Option<Translation> {
        if root != self.template_root() && !self.is_live(root) {
            return None;
        }
        let leaf = self.engine.lookup(root.0, va.as_u64())?;
        Some(Translation {
            pa: leaf.translate(va),
            prot: leaf.prot,
            page_size: PageSize::from_bytes(1 << leaf.shift).unwrap_or(PageSize::Size4K),
        })
    }

    /// The raw entry at index `i` of the table at `table` (a root, say), as the walker
    /// reads it.
    pub fn entry(&self, table: u64, i: u64) -> u64 {
        self.memory().read(table + 8 * (i % 512)).unwrap_or(0)
    }

    fn is_live(&self, root: PageTableRoot) -> bool {
        self.live.lock().contains(&root.0)
    }

    fn is_global_slot(&self, i: u64) -> bool {
        self.globals.iter().any(|&(g, _)| g == i)
    }

    /// Apply `edit` to the parts of `[va, va + len)` outside the global root slots.
    fn outside_globals(
        &self,
        va: u64,
        len: u64,
        mut edit: impl FnMut(u64, u64) -> Result<Edited, EditError>,
    ) -> u64 {
        let top = self.engine.top();
        let slot = level_size(top);
        let last = va + (len - 1);
        let mut done = 0;
        let mut v = va;
        loop {
            let end = (v | (slot - 1)).min(last);
            if !self.is_global_slot(index(v, top)) {
                done += edit(v, end - v + 1).map_or(0, |e| e.pages);
            }
            match end.checked_add(1) {
                Some(next) if end < last => v = next,
                _ => return done,
            }
        }
    }

    fn retired_waiting(&self) -> bool {
        !self.memory().retired.lock().is_empty()
    }

    /// Invalidate everything of `root`, then free the retired tables.
    fn flush_all(&self, root: PageTableRoot) {
        self.hardware().invalidate_all(root);
        self.memory().counters.invalidations_all.add(1);
        let retired = core::mem::take(&mut *self.memory().retired.lock());
        for f in retired {
            self.memory().free(f.as_u64());
        }
    }

    fn switch_to(&self, root: Option<PageTableRoot>) {
        let target = match root {
            Some(r) => Some(r),
            None if self.globals.is_empty() => None,
            None => Some(self.template_root()),
        };
        // SAFETY: `target` is nothing, a live root or the template, each carrying the
        // global mappings that `new`'s contract says map the running kernel.
        unsafe { self.hardware().activate(target) };
        self.memory().counters.activations.add(1);
        self.active
            .store(root.map_or(0, |r| r.0), Ordering::Release);
        let retired = core::mem::take(&mut *self.memory().retired.lock());
        if !retired.is_empty() {
            // A root switch drops the old cached walks.
            for f in retired {
                self.memory().free(f.as_u64());
            }
        }
    }
}

fn to_mmu(e: EditError) -> MmuError {
    e.to_mmu(HW_BAD_FRAME, HW_RESERVED_ENTRY)
}

impl<C: Codec, H: PagingHardware> Drop for PagedMmu<C, H> {
    /// Gives back the template's tables and the retired ones. Tables created by the
    /// driver share the template's subtrees: destroy them first.
    fn drop(&mut self) {
        let memory = self.engine.memory();
        for f in core::mem::take(&mut *memory.retired.lock()) {
            memory.free(f.as_u64());
        }
        self.engine.free_tree(self.template.as_u64(), |_| false);
        memory.free(self.template.as_u64());
    }
}

impl<C: Codec + Send + Sync, H: PagingHardware> Mmu for PagedMmu<C, H> {
    fn format(&self) -> PageTableFormat {
        self.codec().format()
    }

    fn page_sizes(&self) -> PageSizes {
        if self.codec().large_levels() & (1 << 1) != 0 {
            PageSizes::S4K | PageSizes::S2M
        } else {
            PageSizes::S4K
        }
    }

    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let root = self.engine.create_root().map_err(to_mmu)?;
        for &(i, e) in &self.globals {
            let _ = self.memory().write(root + 8 * i, e);
        }
        self.live.lock().push(root);
        Ok(PageTableRoot(root))
    }

    fn destroy_page_table(&self, root: PageTableRoot) {
        if !self.is_live(root) {
            return;
        }
        if self.active.load(Ordering::Acquire) == root.0 {
            self.switch_to(None);
        } else if self.retired_waiting() {
            self.flush_all(root);
        }
        self.live.lock().retain(|r| *r != root.0);
        self.engine.free_tree(root.0, |i| self.is_global_slot(i));
        self.memory().free(root.0);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        if !self.is_live(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        let unsupported = MmuError::Unsupported { va: run.va };
        let size = run.page_size.bytes();
        let large = match run.page_size {
            PageSize::Size4K => 0,
            PageSize::Size2M if self.page_sizes().contains(PageSizes::S2M) => 1 << 1,
            _ => return Err(unsupported),
        };
        let va = run.va.as_u64();
        if va % size != 0
            || run.pa.as_u64() % size != 0
            || run.len == 0
            || run.len % size != 0
            || run.prot.is_empty()
        {
            return Err(unsupported);
        }
        let top = self.engine.top();
        let last = match va.checked_add(run.len - 1) {
            Some(l) => l,
            None => return Err(unsupported),
        };
        let (s0, s1) = (index(va, top), index(last, top));
        if last - va >= level_size(top) * 512 {
            return Err(unsupported);
        }
        let mut s = s0;
        loop {
            if self.is_global_slot(s) {
                return Err(unsupported);
            }
            if s == s1 {
                break;
            }
            s = (s + 1) % 512;
        }
        let mut r = Run::of(run);
        r.memory = None;
        self.engine.map_limited(root.0, &r, large).map_err(to_mmu)?;
        self.memory().counters.pages_mapped.add(run.len / PAGE_SIZE);
        // A new table may sit where a retired one was: a cached walk must not reach
        // the old one.
        if self.retired_waiting() {
            self.flush_all(root);
        }
        Ok(())
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        if !self.is_live(root) || range.len == 0 {
            return;
        }
        let n = self.outside_globals(range.start.as_u64(), range.len, |v, len| {
            self.engine.unmap(root.0, v, len)
        });
        self.memory().counters.pages_unmapped.add(n);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        if !self.is_live(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if !range.start.is_page_aligned()
            || range.len == 0
            || range.len % PAGE_SIZE != 0
            || prot.is_empty()
        {
            return Err(MmuError::Unsupported { va: range.start });
        }
        let n = self.outside_globals(range.start.as_u64(), range.len, |v, len| {
            self.engine.protect(root.0, v, len, prot)
        });
        self.memory().counters.pages_protected.add(n);
        Ok(())
    }

    fn invalidate(&self, root: PageTableRoot, ranges: &[VaRange]) {
        let pages = ranges.iter().fold(0u64, |n, r| n.saturating_add(r.pages()));
        if pages > self.config.flush_all_above || self.retired_waiting() {
            self.flush_all(root);
            return;
        }
        self.hardware().invalidate(root, ranges);
        self.memory().counters.invalidations_ranged.add(1);
    }

    fn invalidate_all(&self, root: PageTableRoot) {
        self.flush_all(root);
    }

    fn activate(&self, root: Option<PageTableRoot>) {
        match root {
            Some(r) if !self.is_live(r) => {}
            _ => self.switch_to(root),
        }
    }
}
