//! The Sv39 driver: page tables in real memory, `sfence.vma`, `satp`.
//!
//! ## Theory
//! A page table is a tree of 4 KiB frames from the kernel's [`FrameSource`]; the
//! [`PageTableRoot`] the core holds is the physical address of the root frame. The
//! driver keeps no shadow of the tree: every walk reads the entries through
//! [`Sv39Hardware`], so what the host tests check is exactly what the hart walks.
//!
//! - **Global mappings.** [`Sv39::new`] builds a *template* root holding the embedding
//!   kernel's own mappings ([`GlobalMapping`], `G` set, the largest leaves alignment
//!   allows). Every table the driver creates starts as a copy of the template's root
//!   entries, so the kernel keeps running when `activate` switches `satp`, and the
//!   subtrees below those entries are shared, never copied. A root slot (1 GiB of
//!   address space) that holds a global mapping belongs to the template: `map` refuses
//!   it (`MmuError::Unsupported`), `unmap`, `protect` and `destroy_page_table` skip it.
//!   The template itself is what the hart runs on when no space is active.
//! - **Leaves.** The MMU reports [`PageSizes::S4K`] and [`PageSizes::S2M`]: the core's
//!   runs are installed with the leaf size each [`MapRun`] asks for (a 2 MiB megapage
//!   for a run the core asks for as 2 MiB, which it does only for aligned blocks on
//!   aligned frames), never larger. Every megapage keeps a *split reserve*, a table
//!   frame taken from the frame source when the megapage is mapped: a later unmap or
//!   protect of part of it replaces it by a table of 512 4 KiB leaves built in that
//!   frame, so `unmap` cannot fail, as the core's contract requires
//!   ([`gmem_core::mmu`]); a megapage whose reserve cannot be had is mapped as 4 KiB
//!   leaves. Global mappings use 2 MiB and 1 GiB leaves where aligned (without
//!   reserves: the core never edits a global slot). [`Sv39::translate`] decodes
//!   all three sizes.
//! - **Freeing tables.** `unmap` clears leaves and unlinks every level-0 or level-1
//!   table it left empty. An unlinked table may still sit in the hart's page-walk cache,
//!   which only a full `sfence.vma` drops (a per-address fence covers leaf entries
//!   only), so unlinked tables are *retired*: the next `invalidate` after them issues a
//!   full fence and only then gives them back to the frame source.
//! - **Fences.** `invalidate` fences each page of its ranges (`sfence.vma va, zero`) up
//!   to [`Sv39Config::flush_all_above`] pages, and the whole TLB above that or when
//!   tables were retired. `map` fences the pages it made valid too: RISC-V lets a hart
//!   keep using an invalid entry it read before, so without the fence the retried
//!   access could fault again (the core would count it as spurious and fence then).
//!   `activate` writes `satp` and fences everything (one ASID for every table).
//! - **Several harts.** A kernel may run the driver's tables on several harts (one CPU
//!   device of the core whose TLB is spread over them, as a Unix address space runs on
//!   the CPUs of its `mm_cpumask`). The driver keeps the set of harts that activated
//!   one of its tables ([`Sv39::harts`], bit `i` for hart
//!   [`Sv39Hardware::current_hart`] `i`), set before the hart's `satp` is written and
//!   cleared after it switched away and fenced. Every fence that invalidates —
//!   `invalidate`, `invalidate_all`, and the full fence that frees retired tables — is
//!   made on the calling hart and then on every other hart of the set through
//!   [`Sv39Hardware::remote_sfence_vma`], which returns once they all acknowledged:
//!   when `invalidate` returns, no hart can use a stale translation of the ranges, and
//!   a retired table is freed only after every hart dropped its walk caches. `map`'s
//!   fence stays local (it made entries valid; another hart that cached the invalid
//!   entry takes a spurious fault, and the core's answer to that is an `invalidate`).
//!   The retired list is taken *before* the fences that free it, so a table unlinked
//!   while they run waits for the next full fence. A hart switches only its own `satp`:
//!   before a table is destroyed, every hart still running on it must switch away
//!   itself (`activate(None)` on that hart), or it would walk freed frames.
//!
//! The walk and the edits are the shared page-table engine's ([`gmem_ptengine`], plain
//! discipline, the [`crate::codec::Sv39Codec`] encoding): this driver is the memory the
//! engine edits (entries through [`Sv39Hardware`], frames from the frame source,
//! retirement until the next full fence), the global slots and the fences.
//!
//! One driver instance drives the `satp` and TLB of every hart that activates its
//! tables (each writes its own `satp` through `activate`); the core serialises calls on
//! one table, and the driver's own shared state (live roots, retired tables, the hart
//! set, counters) is behind a lock or atomic.

use crate::codec::Sv39Codec;
use crate::hardware::Sv39Hardware;
use crate::pte::{
    index, is_canonical_range, low_bits, sign_extend, Pte, PteFlags, ENTRIES, LEVELS, PA_BITS,
};
use alloc::sync::Arc;
use alloc::vec::Vec;
use gmem_core::sync::{AtomicU64, Mutex, Ordering};
use gmem_core::{
    FrameSource, MapRun, Mmu, MmuError, PageSize, PageSizes, PageTableFormat, PageTableRoot,
    PhysAddr, Prot, VaRange, VirtAddr, PAGE_SIZE,
};
use gmem_ptengine::{level_size, EditError, Edited, Engine, Run, TableMemory};

/// The format id of Sv39 tables (`"S9"`): two Sv39 devices may share one table.
pub const SV39_FORMAT: PageTableFormat = PageTableFormat(0x5339);

/// `MmuError::Hardware` code: the root is not a live table of this driver.
pub const HW_UNKNOWN_ROOT: u32 = 0x39_01;
/// `MmuError::Hardware` code: the walk met an entry with a reserved encoding.
pub const HW_RESERVED_ENTRY: u32 = 0x39_02;
/// `MmuError::Hardware` code: the frame source returned an unaligned or unreachable frame.
pub const HW_BAD_FRAME: u32 = 0x39_03;

/// `satp.MODE` for Sv39.
const SATP_MODE_SV39: u64 = 8 << 60;

/// Tunables of the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sv39Config {
    /// Set `U` on the core's mappings (U-mode address spaces). S-mode code then needs
    /// `sstatus.SUM` to touch them.
    pub user: bool,
    /// The ASID written to `satp` for every table.
    pub asid: u16,
    /// Above this many pages an invalidation fences the whole TLB instead of each page.
    pub flush_all_above: u64,
}

impl Default for Sv39Config {
    fn default() -> Self {
        Sv39Config {
            user: false,
            asid: 0,
            flush_all_above: 64,
        }
    }
}

/// A mapping present in every table the driver creates (the kernel's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalMapping {
    /// First virtual address, page aligned and canonical.
    pub va: VirtAddr,
    /// First physical address, page aligned.
    pub pa: PhysAddr,
    /// Length in bytes, a non-zero multiple of 4 KiB.
    pub len: u64,
    /// Permissions (not empty). Global mappings are supervisor mappings (`U` clear).
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
    /// The leaf's flag bits.
    pub flags: PteFlags,
}

gmem_ptengine::counters! {
    /// A snapshot of the driver's counters.
    pub struct Sv39Stats in Counters {
        /// Page-table frames taken from the frame source (template included).
        tables_allocated,
        /// Page-table frames given back to it.
        tables_freed,
        /// Tables unlinked and waiting for a full fence before they are freed.
        tables_retired,
        /// 4 KiB leaves installed by `map`.
        pages_mapped,
        /// Leaves cleared by `unmap` (in 4 KiB pages).
        pages_unmapped,
        /// Leaves rewritten by `protect` (in 4 KiB pages).
        pages_protected,
        /// `sfence.vma va, zero` issued.
        fences_page,
        /// `sfence.vma zero, zero` issued.
        fences_all,
        /// `satp` writes.
        satp_writes,
        /// Remote fences of one range on other harts (each for every hart of the set).
        remote_fences_range,
        /// Remote fences of everything on other harts.
        remote_fences_all,
    }
}

/// The page-table memory as the engine sees it: entries through [`Sv39Hardware`],
/// frames from the kernel's frame source, unlinked tables retired until a full fence.
struct Sv39Memory<H> {
    hw: H,
    frames: Arc<dyn FrameSource>,
    /// Unlinked tables waiting for a full fence.
    retired: Mutex<Vec<PhysAddr>>,
    counters: Counters,
}

impl<H: Sv39Hardware> TableMemory for Sv39Memory<H> {
    fn read(&self, pa: u64) -> Option<u64> {
        // SAFETY: the engine reads entries (8-byte aligned, `table + 8 * index`) of the
        // template, of live roots, and of tables reached through entries the driver
        // wrote into those: all frames it got from its frame source and still holds
        // (`Sv39::new`'s contract makes them reachable through `hw`).
        Some(unsafe { self.hw.read_pte(PhysAddr::new(pa)) })
    }

    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        // SAFETY: as in `read` for the address. The driver writes the global slots only
        // while building the template and into roots not yet handed out, and otherwise
        // only entries of ranges the core maps, unmaps or protects (never a global
        // slot): never a translation the kernel runs on.
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
        // The hart's page-walk cache may hold the table until a full fence.
        self.counters.tables_retired.add(1);
        self.retired.lock().push(PhysAddr::new(table));
    }
}

/// The Sv39 MMU driver of the harts that run its tables.
pub struct Sv39<H: Sv39Hardware> {
    engine: Engine<Sv39Codec, Sv39Memory<H>>,
    config: Sv39Config,
    /// Root holding only the global mappings.
    template: PhysAddr,
    /// The template's valid root entries, copied into every new table.
    globals: Vec<(usize, u64)>,
    /// Bit `i` set: root slot `i` belongs to the global mappings.
    global_slots: [u64; ENTRIES / 64],
    /// Roots created and not yet destroyed.
    live: Mutex<Vec<u64>>,
    /// Root in `satp` (0: the template or bare), last written by any hart.
    active: AtomicU64,
    /// Bit `i`: hart `i` runs (or may still cache translations of) one of the tables.
    harts: AtomicU64,
}

/// More ranges than this in one invalidation make the remote fence a full one (each
/// remote range fence is one round trip to every hart).
const REMOTE_RANGES_MAX: usize = 4;

impl<H: Sv39Hardware> Sv39<H> {
    /// A driver whose tables come from `frames` and contain `globals`.
    ///
    /// # Errors
    /// `Unsupported` for a global mapping that is unaligned, empty, not canonical,
    /// beyond 56 physical bits, without permissions or overlapping another;
    /// `OutOfTableMemory` when `frames` runs dry; `Hardware(HW_BAD_FRAME)` for a frame
    /// an entry cannot point to. Nothing is left allocated on error.
    ///
    /// # Safety
    /// `frames` hands out frames nobody else uses while the driver holds them, reachable
    /// through `hw` ([`Sv39Hardware::read_pte`]). Every translation `activate` can
    /// select carries `globals`, so when `hw` is a real hart, `globals` must map the
    /// code, stack and data the kernel runs on (and the page-table frames, if `hw`
    /// reaches them through translated addresses).
    pub unsafe fn new(
        hw: H,
        frames: Arc<dyn FrameSource>,
        config: Sv39Config,
        globals: &[GlobalMapping],
    ) -> Result<Sv39<H>, MmuError> {
        let memory = Sv39Memory {
            hw,
            frames,
            retired: Mutex::new(Vec::new()),
            counters: Counters::default(),
        };
        // The codec's geometry is fixed and valid.
        let engine =
            Engine::new(Sv39Codec, memory).map_err(|_| MmuError::Hardware(HW_BAD_FRAME))?;
        let template = engine
            .create_root()
            .map_err(|e| e.to_mmu(HW_BAD_FRAME, HW_RESERVED_ENTRY))?;
        let mut d = Sv39 {
            engine,
            config,
            template: PhysAddr::new(template),
            globals: Vec::new(),
            global_slots: [0; ENTRIES / 64],
            live: Mutex::new(Vec::new()),
            active: AtomicU64::new(0),
            harts: AtomicU64::new(0),
        };
        if Pte::table(d.template).is_none() {
            return Err(MmuError::Hardware(HW_BAD_FRAME));
        }
        for (k, g) in globals.iter().enumerate() {
            d.add_global(g, &globals[..k])?;
        }
        // Megapages the core asks for keep split reserves; the globals need none.
        d.engine.enable_split_reserve();
        for i in 0..ENTRIES {
            let e = d.rd(d.template, i);
            if Pte(e).is_valid() {
                d.globals.push((i, e));
                d.global_slots[i / 64] |= 1 << (i % 64);
            }
        }
        Ok(d)
    }

    /// Map `g` into the template with the largest leaves alignment allows; `before`
    /// are the global mappings already there (`g` must not overlap them).
    fn add_global(&self, g: &GlobalMapping, before: &[GlobalMapping]) -> Result<(), MmuError> {
        let va = g.va.as_u64();
        let pa = g.pa.as_u64();
        let bad = MmuError::Unsupported { va: g.va };
        let overlaps = |o: &GlobalMapping| {
            let (a, b) = (o.va.as_u64(), va);
            a < b.wrapping_add(g.len) && b < a.wrapping_add(o.len)
        };
        if !g.va.is_page_aligned()
            || !g.pa.is_page_aligned()
            || g.len % PAGE_SIZE != 0
            || !is_canonical_range(va, g.len)
            || pa.checked_add(g.len).map_or(true, |end| end > 1 << PA_BITS)
            || g.prot.is_empty()
            || before.iter().any(overlaps)
        {
            return Err(bad);
        }
        let run = Run {
            va,
            pa,
            len: g.len,
            prot: g.prot,
            memory: None,
            bits: PteFlags::G.bits(),
        };
        self.engine
            .map(self.template.as_u64(), &run)
            .map_err(|e| e.to_mmu(HW_BAD_FRAME, HW_RESERVED_ENTRY))
    }

    /// The driver's configuration.
    pub fn config(&self) -> Sv39Config {
        self.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Sv39Stats {
        self.counters().snapshot()
    }

    fn counters(&self) -> &Counters {
        &self.engine.memory().counters
    }

    /// The hardware interface.
    pub fn hardware(&self) -> &H {
        &self.engine.memory().hw
    }

    /// The harts that activated one of the driver's tables and have not switched away
    /// (bit `i`: hart `i`): the harts an invalidation fences.
    pub fn harts(&self) -> u64 {
        self.harts.load(Ordering::Acquire)
    }

    /// The root holding only the global mappings (what the hart runs on when no table
    /// of a space is active).
    pub fn template_root(&self) -> PageTableRoot {
        PageTableRoot(self.template.as_u64())
    }

    /// The `satp` value selecting `root`.
    pub fn satp_of(&self, root: PageTableRoot) -> u64 {
        SATP_MODE_SV39 | (u64::from(self.config.asid) << 44) | (root.0 >> 12)
    }

    /// Whether root slot `i` (1 GiB of address space) belongs to the global mappings.
    pub fn is_global_slot(&self, i: usize) -> bool {
        self.global_slots[i / 64] & (1 << (i % 64)) != 0
    }

    /// Page-table frames currently held (live tables, the template, retired ones).
    pub fn frames_held(&self) -> u64 {
        let s = self.stats();
        s.tables_allocated - s.tables_freed
    }

    /// Walk `root` for `va` as the hart would: `None` if nothing valid translates it (or
    /// the root is neither a live table of this driver nor its template, or `va` is not
    /// canonical).
    pub fn translate(&self, root: PageTableRoot, va: VirtAddr) -> Option<Translation> {
        let known = root == self.template_root() || self.is_live(root);
        if !known {
            return None;
        }
        let leaf = self.engine.lookup(root.0, va.as_u64())?;
        Some(Translation {
            pa: leaf.translate(va),
            prot: leaf.prot,
            page_size: PageSize::from_bytes(1 << leaf.shift).unwrap_or(PageSize::Size4K),
            flags: PteFlags::from_bits_truncate(leaf.bits),
        })
    }

    // ----- entries and frames --------------------------------------------------------

    fn rd(&self, table: PhysAddr, i: usize) -> u64 {
        let at = table.as_u64() + 8 * (i % ENTRIES) as u64;
        self.engine.memory().read(at).unwrap_or(0)
    }

    fn wr(&self, table: PhysAddr, i: usize, pte: u64) {
        let at = table.as_u64() + 8 * (i % ENTRIES) as u64;
        let _ = self.engine.memory().write(at, pte);
    }

    fn is_live(&self, root: PageTableRoot) -> bool {
        self.live.lock().contains(&root.0)
    }

    /// Apply `edit` to the parts of `[va, va + len)` outside the global root slots;
    /// returns the 4 KiB pages it reports.
    fn outside_globals(
        &self,
        va: u64,
        len: u64,
        mut edit: impl FnMut(u64, u64) -> Result<Edited, EditError>,
    ) -> u64 {
        let slot = level_size(LEVELS as u32 - 1);
        let last = va + (len - 1);
        let mut done = 0;
        let mut v = va;
        loop {
            let end = (v | (slot - 1)).min(last);
            if !self.is_global_slot(index(v, LEVELS - 1)) {
                // Megapages outside the global slots keep split reserves: an unmap or
                // protect of a canonical range cannot fail.
                done += edit(v, end - v + 1).map_or(0, |e| e.pages);
            }
            match end.checked_add(1) {
                Some(next) if end < last => v = next,
                _ => return done,
            }
        }
    }

    // ----- fences --------------------------------------------------------------------

    /// The calling hart's bit.
    fn me(&self) -> u64 {
        1u64.checked_shl(self.hardware().current_hart() as u32)
            .unwrap_or(0)
    }

    /// The harts other than the caller that may cache the driver's translations.
    fn others(&self) -> u64 {
        self.harts.load(Ordering::Acquire) & !self.me()
    }

    /// Fence everything on every hart, then free the tables retired before: no cached
    /// walk can reach them any more.
    fn fence_all(&self) {
        let retired = core::mem::take(&mut *self.engine.memory().retired.lock());
        self.hardware().sfence_vma(None);
        self.counters().fences_all.add(1);
        self.fence_others(None);
        for f in retired {
            self.engine.memory().free(f.as_u64());
        }
    }

    /// Fence `ranges` (`None`: everything) on the other harts of the set, and wait.
    fn fence_others(&self, ranges: Option<&[VaRange]>) {
        // The entry writes before the fence become visible to the other harts' walkers
        // before they fence.
        core::sync::atomic::fence(Ordering::SeqCst);
        let others = self.others();
        if others == 0 {
            return;
        }
        match ranges {
            Some(ranges) if ranges.len() <= REMOTE_RANGES_MAX => {
                for r in ranges {
                    self.hardware().remote_sfence_vma(others, Some(*r));
                }
                self.counters().remote_fences_range.add(ranges.len() as u64);
            }
            _ => {
                self.hardware().remote_sfence_vma(others, None);
                self.counters().remote_fences_all.add(1);
            }
        }
    }

    fn retired_waiting(&self) -> bool {
        !self.engine.memory().retired.lock().is_empty()
    }

    /// Fence the pages of `ranges` on the calling hart one by one, or everything when
    /// they are many; `false` when they were many.
    fn fence_local(&self, ranges: &[VaRange]) -> bool {
        let pages = ranges.iter().fold(0u64, |n, r| n.saturating_add(r.pages()));
        if pages > self.config.flush_all_above {
            self.hardware().sfence_vma(None);
            self.counters().fences_all.add(1);
            return false;
        }
        for r in ranges {
            for k in 0..r.pages() {
                self.hardware()
                    .sfence_vma(Some(VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE)));
            }
        }
        self.counters().fences_page.add(pages);
        true
    }

    /// Invalidate `ranges` on every hart of the set: per page, or everything when they
    /// are many or tables wait to be freed.
    fn fence_ranges(&self, ranges: &[VaRange]) {
        if self.retired_waiting() {
            self.fence_all();
        } else if self.fence_local(ranges) {
            self.fence_others(Some(ranges));
        } else {
            self.fence_others(None);
        }
    }

    fn switch_to(&self, root: Option<PageTableRoot>) {
        let satp = match root {
            Some(r) => self.satp_of(r),
            None if self.globals.is_empty() => 0,
            None => self.satp_of(self.template_root()),
        };
        let me = self.me();
        if root.is_some() {
            // In the set before this hart can cache anything of the table.
            self.harts.fetch_or(me, Ordering::SeqCst);
        }
        // SAFETY: `satp` is bare or names a live root of this driver or its template,
        // each carrying the global mappings that `new`'s contract says map the running
        // kernel; the full fence follows.
        unsafe { self.hardware().write_satp(satp) };
        self.counters().satp_writes.add(1);
        self.active
            .store(root.map_or(0, |r| r.0), Ordering::Release);
        self.fence_all();
        if root.is_none() {
            // Switched away and fenced: nothing of the tables is cached here any more.
            self.harts.fetch_and(!me, Ordering::SeqCst);
        }
    }
}

impl<H: Sv39Hardware> Drop for Sv39<H> {
    /// Gives back the template's tables and the retired ones. Tables created by the
    /// driver share the template's subtrees: destroy them (and leave them) first.
    fn drop(&mut self) {
        let memory = self.engine.memory();
        for f in core::mem::take(&mut *memory.retired.lock()) {
            memory.free(f.as_u64());
        }
        self.engine.free_tree(self.template.as_u64(), |_| false);
        memory.free(self.template.as_u64());
    }
}

impl<H: Sv39Hardware> Mmu for Sv39<H> {
    fn format(&self) -> PageTableFormat {
        SV39_FORMAT
    }

    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K | PageSizes::S2M
    }

    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let root = self
            .engine
            .create_root()
            .map_err(|e| e.to_mmu(HW_BAD_FRAME, HW_RESERVED_ENTRY))?;
        let root = PhysAddr::new(root);
        if Pte::table(root).is_none() {
            self.engine.memory().free(root.as_u64());
            return Err(MmuError::Hardware(HW_BAD_FRAME));
        }
        for &(i, e) in &self.globals {
            self.wr(root, i, e);
        }
        self.live.lock().push(root.as_u64());
        Ok(PageTableRoot(root.as_u64()))
    }

    fn destroy_page_table(&self, root: PageTableRoot) {
        if !self.is_live(root) {
            return;
        }
        if self.active.load(Ordering::Acquire) == root.0 {
            self.switch_to(None);
        } else if self.retired_waiting() {
            self.fence_all();
        }
        self.live.lock().retain(|r| *r != root.0);
        self.engine
            .free_tree(root.0, |i| self.is_global_slot(i as usize));
        self.engine.memory().free(root.0);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let va = run.va.as_u64();
        let unsupported = MmuError::Unsupported { va: run.va };
        if !self.is_live(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        let size = run.page_size.bytes();
        if !matches!(run.page_size, PageSize::Size4K | PageSize::Size2M)
            || run.va.as_u64() % size != 0
            || run.pa.as_u64() % size != 0
            || run.len % size != 0
            || !run.va.is_page_aligned()
            || !run.pa.is_page_aligned()
            || run.len == 0
            || run.len % PAGE_SIZE != 0
            || !is_canonical_range(va, run.len)
            || run
                .pa
                .as_u64()
                .checked_add(run.len)
                .map_or(true, |end| end > 1 << PA_BITS)
            || run.prot.is_empty()
        {
            return Err(unsupported);
        }
        let hi = low_bits(va) + run.len;
        let top = LEVELS - 1;
        let (s0, s1) = (index(va, top), ((hi - 1) >> 30) as usize & (ENTRIES - 1));
        if let Some(s) = (s0..=s1).find(|&s| self.is_global_slot(s)) {
            let at = sign_extend((s as u64) << 30).max(run.va);
            return Err(MmuError::Unsupported { va: at });
        }
        let mut r = Run::of(run);
        r.memory = None;
        if self.config.user {
            r.bits = PteFlags::U.bits();
        }
        // Leaves of the asked size, none larger; on error the engine has taken the run
        // back (its emptied tables are retired and freed at the next full fence).
        let large = match run.page_size {
            PageSize::Size2M => 1 << 1,
            _ => 0,
        };
        self.engine
            .map_limited(root.0, &r, large)
            .map_err(|e| e.to_mmu(HW_BAD_FRAME, HW_RESERVED_ENTRY))?;
        self.counters().pages_mapped.add(run.len / PAGE_SIZE);
        // Only this hart may retry an access now (another hart that cached the invalid
        // entry faults again, and the core invalidates); retired tables need everyone.
        if self.retired_waiting() {
            self.fence_all();
        } else {
            self.fence_local(&[run.range()]);
        }
        Ok(())
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let va = range.start.as_u64();
        if !self.is_live(root) || !is_canonical_range(va, range.len) {
            return;
        }
        let n = self.outside_globals(va, range.len, |v, len| self.engine.unmap(root.0, v, len));
        self.counters().pages_unmapped.add(n);
    }

    fn protect(&self, root: PageTableRoot, range: VaRange, prot: Prot) -> Result<(), MmuError> {
        let va = range.start.as_u64();
        if !self.is_live(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if !range.start.is_page_aligned()
            || range.len % PAGE_SIZE != 0
            || !is_canonical_range(va, range.len)
            || prot.is_empty()
        {
            return Err(MmuError::Unsupported { va: range.start });
        }
        let n = self.outside_globals(va, range.len, |v, len| {
            self.engine.protect(root.0, v, len, prot)
        });
        self.counters().pages_protected.add(n);
        Ok(())
    }

    fn invalidate(&self, _root: PageTableRoot, ranges: &[VaRange]) {
        self.fence_ranges(ranges);
    }

    fn invalidate_all(&self, _root: PageTableRoot) {
        self.fence_all();
    }

    fn activate(&self, root: Option<PageTableRoot>) {
        match root {
            Some(r) if !self.is_live(r) => {}
            _ => self.switch_to(root),
        }
    }
}
