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
//! - **Leaves.** The core's mappings are installed as 4 KiB leaves (the MMU reports
//!   [`PageSizes::S4K`]); global mappings use 2 MiB and 1 GiB leaves where aligned.
//!   [`Sv39::translate`] decodes all three.
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
//!
//! One driver instance drives one hart's `satp` and TLB; the core serialises calls on
//! one table, and the driver's own shared state (live roots, retired tables, counters)
//! is behind a lock or atomic.

use crate::hardware::Sv39Hardware;
use crate::pte::{
    index, is_canonical, is_canonical_range, level_size, low_bits, sign_extend, LeafAttrs, Pte,
    PteFlags, PteKind, ENTRIES, LEVELS, PA_BITS,
};
use alloc::sync::Arc;
use alloc::vec::Vec;
use gmem_core::sync::{AtomicU64, Mutex, Ordering};
use gmem_core::{
    FrameSource, MapRun, Mmu, MmuError, PageSize, PageSizes, PageTableFormat, PageTableRoot,
    PhysAddr, Prot, VaRange, VirtAddr, PAGE_SIZE,
};

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

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        #[derive(Default)]
        struct Counters { $( $name: AtomicU64, )* }

        /// A snapshot of the driver's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Sv39Stats { $( $(#[$doc])* pub $name: u64, )* }

        impl Counters {
            fn snapshot(&self) -> Sv39Stats {
                Sv39Stats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
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
    /// Leaves rewritten by `protect`.
    pages_protected,
    /// `sfence.vma va, zero` issued.
    fences_page,
    /// `sfence.vma zero, zero` issued.
    fences_all,
    /// `satp` writes.
    satp_writes,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The Sv39 MMU driver of one hart.
pub struct Sv39<H: Sv39Hardware> {
    hw: H,
    frames: Arc<dyn FrameSource>,
    config: Sv39Config,
    /// Root holding only the global mappings.
    template: PhysAddr,
    /// The template's valid root entries, copied into every new table.
    globals: Vec<(usize, Pte)>,
    /// Bit `i` set: root slot `i` belongs to the global mappings.
    global_slots: [u64; ENTRIES / 64],
    /// Roots created and not yet destroyed.
    live: Mutex<Vec<u64>>,
    /// Unlinked tables waiting for a full fence.
    retired: Mutex<Vec<PhysAddr>>,
    /// Root in `satp` (0: the template or bare).
    active: AtomicU64,
    counters: Counters,
}

impl<H: Sv39Hardware> Sv39<H> {
    /// A driver whose tables come from `frames` and contain `globals`.
    ///
    /// Fails with `Unsupported` for a global mapping that is unaligned, empty, not
    /// canonical, beyond 56 physical bits, without permissions or overlapping another,
    /// and with `OutOfTableMemory` when `frames` runs dry.
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
        let template = frames.alloc_frame().ok_or(MmuError::OutOfTableMemory)?;
        if Pte::table(template).is_none() {
            frames.free_frame(template);
            return Err(MmuError::Hardware(HW_BAD_FRAME));
        }
        let mut d = Sv39 {
            hw,
            frames,
            config,
            template,
            globals: Vec::new(),
            global_slots: [0; ENTRIES / 64],
            live: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            active: AtomicU64::new(0),
            counters: Counters::default(),
        };
        add(&d.counters.tables_allocated, 1);
        for g in globals {
            d.add_global(g)?;
        }
        for i in 0..ENTRIES {
            let e = d.rd(d.template, i);
            if e.is_valid() {
                d.globals.push((i, e));
                d.global_slots[i / 64] |= 1 << (i % 64);
            }
        }
        Ok(d)
    }

    fn add_global(&self, g: &GlobalMapping) -> Result<(), MmuError> {
        let va = g.va.as_u64();
        let pa = g.pa.as_u64();
        let bad = MmuError::Unsupported { va: g.va };
        if !g.va.is_page_aligned()
            || !g.pa.is_page_aligned()
            || g.len % PAGE_SIZE != 0
            || !is_canonical_range(va, g.len)
            || pa.checked_add(g.len).map_or(true, |end| end > 1 << PA_BITS)
            || g.prot.is_empty()
        {
            return Err(bad);
        }
        let attrs = LeafAttrs {
            user: false,
            global: true,
        };
        let mut off = 0;
        while off < g.len {
            let (v, p, rest) = (va + off, pa + off, g.len - off);
            let level = (0..LEVELS)
                .rev()
                .find(|&l| {
                    let s = level_size(l);
                    v % s == 0 && p % s == 0 && rest >= s
                })
                .unwrap_or(0);
            let leaf = Pte::leaf(PhysAddr::new(p), g.prot, attrs).ok_or(bad)?;
            self.install(self.template, v, level, leaf, false)?;
            off += level_size(level);
        }
        Ok(())
    }

    /// The driver's configuration.
    pub fn config(&self) -> Sv39Config {
        self.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Sv39Stats {
        self.counters.snapshot()
    }

    /// The hardware interface.
    pub fn hardware(&self) -> &H {
        &self.hw
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
        if !known || !is_canonical(va.as_u64()) {
            return None;
        }
        let mut table = PhysAddr::new(root.0);
        for level in (0..LEVELS).rev() {
            match self.rd(table, index(va.as_u64(), level)).decode() {
                PteKind::Table(next) if level > 0 => table = next,
                PteKind::Leaf { pa, prot, flags } => {
                    let size = level_size(level);
                    if pa.as_u64() % size != 0 {
                        return None; // misaligned superpage: the hart faults
                    }
                    return Some(Translation {
                        pa: PhysAddr::new(pa.as_u64() + (va.as_u64() & (size - 1))),
                        prot,
                        page_size: PageSize::from_bytes(size).unwrap_or(PageSize::Size4K),
                        flags,
                    });
                }
                _ => return None,
            }
        }
        None
    }

    // ----- entries and frames --------------------------------------------------------

    fn rd(&self, table: PhysAddr, i: usize) -> Pte {
        debug_assert!(i < ENTRIES);
        let at = PhysAddr::new(table.as_u64() + 8 * (i % ENTRIES) as u64);
        // SAFETY: every `table` the driver reads is the template, a live root, or a
        // table reached through an entry the driver wrote into one of those: all frames
        // it got from its frame source and still holds (`new`'s contract makes them
        // reachable through `hw`); `i < 512` keeps the aligned entry inside the frame.
        Pte(unsafe { self.hw.read_pte(at) })
    }

    fn wr(&self, table: PhysAddr, i: usize, pte: Pte) {
        let at = PhysAddr::new(table.as_u64() + 8 * (i % ENTRIES) as u64);
        // SAFETY: as in `rd` for the address. The driver writes the global slots only
        // while building the template and into roots not yet handed out, and otherwise
        // only entries of ranges the core maps, unmaps or protects: never a translation
        // the kernel runs on.
        unsafe { self.hw.write_pte(at, pte.0) }
    }

    fn alloc_table(&self) -> Result<PhysAddr, MmuError> {
        let f = self
            .frames
            .alloc_frame()
            .ok_or(MmuError::OutOfTableMemory)?;
        if Pte::table(f).is_none() {
            self.frames.free_frame(f);
            return Err(MmuError::Hardware(HW_BAD_FRAME));
        }
        add(&self.counters.tables_allocated, 1);
        Ok(f)
    }

    fn free_table(&self, f: PhysAddr) {
        self.frames.free_frame(f);
        add(&self.counters.tables_freed, 1);
    }

    fn is_live(&self, root: PageTableRoot) -> bool {
        self.live.lock().contains(&root.0)
    }

    fn is_empty(&self, table: PhysAddr) -> bool {
        (0..ENTRIES).all(|i| !self.rd(table, i).is_valid())
    }

    /// Install `leaf` at `level` for `va`, creating missing tables above it. With
    /// `replace`, an existing leaf at that place is overwritten; without, it is an error.
    fn install(
        &self,
        root: PhysAddr,
        va: u64,
        level: usize,
        leaf: Pte,
        replace: bool,
    ) -> Result<(), MmuError> {
        let unsupported = MmuError::Unsupported {
            va: VirtAddr::new(va),
        };
        let mut table = root;
        for l in (level + 1..LEVELS).rev() {
            let i = index(va, l);
            match self.rd(table, i).decode() {
                PteKind::Invalid => {
                    let next = self.alloc_table()?;
                    self.wr(table, i, Pte::table(next).ok_or(unsupported)?);
                    table = next;
                }
                PteKind::Table(next) => table = next,
                PteKind::Leaf { .. } => return Err(unsupported),
                PteKind::Reserved(_) => return Err(MmuError::Hardware(HW_RESERVED_ENTRY)),
            }
        }
        let i = index(va, level);
        match self.rd(table, i).decode() {
            PteKind::Invalid => {}
            PteKind::Leaf { .. } if replace => {}
            PteKind::Table(_) if level == 0 && replace => {}
            _ => return Err(unsupported),
        }
        self.wr(table, i, leaf);
        Ok(())
    }

    /// Clear the leaves in `[lo, hi)` (low 39 bits) under `table` at `level`, whose
    /// first entry maps `base`, unlinking emptied tables into `retired`. Returns the
    /// 4 KiB pages cleared.
    fn clear(
        &self,
        table: PhysAddr,
        level: usize,
        base: u64,
        lo: u64,
        hi: u64,
        retired: &mut Vec<PhysAddr>,
    ) -> u64 {
        let size = level_size(level);
        let (first, last) = ((lo - base) / size, (hi - 1 - base) / size);
        let mut cleared = 0;
        for i in first as usize..=last as usize {
            if level == LEVELS - 1 && self.is_global_slot(i) {
                continue;
            }
            let ebase = base + i as u64 * size;
            let (elo, ehi) = (lo.max(ebase), hi.min(ebase + size));
            let whole = elo == ebase && ehi == ebase + size;
            match self.rd(table, i).decode() {
                PteKind::Invalid => {}
                PteKind::Table(next) if level > 0 => {
                    cleared += self.clear(next, level - 1, ebase, elo, ehi, retired);
                    if self.is_empty(next) {
                        self.wr(table, i, Pte::INVALID);
                        retired.push(next);
                    }
                }
                // A large leaf outside the global slots is not the driver's own; it is
                // removed only when the range covers it whole.
                PteKind::Leaf { .. } | PteKind::Reserved(_) | PteKind::Table(_) => {
                    if whole {
                        self.wr(table, i, Pte::INVALID);
                        cleared += size / PAGE_SIZE;
                    }
                }
            }
        }
        cleared
    }

    /// Rewrite the leaves in `[lo, hi)` under `table` to grant `prot`. Returns the
    /// 4 KiB pages rewritten.
    fn reprotect(
        &self,
        table: PhysAddr,
        level: usize,
        base: u64,
        lo: u64,
        hi: u64,
        prot: Prot,
    ) -> u64 {
        let size = level_size(level);
        let (first, last) = ((lo - base) / size, (hi - 1 - base) / size);
        let mut done = 0;
        for i in first as usize..=last as usize {
            if level == LEVELS - 1 && self.is_global_slot(i) {
                continue;
            }
            let ebase = base + i as u64 * size;
            let (elo, ehi) = (lo.max(ebase), hi.min(ebase + size));
            let e = self.rd(table, i);
            match e.decode() {
                PteKind::Table(next) if level > 0 => {
                    done += self.reprotect(next, level - 1, ebase, elo, ehi, prot);
                }
                PteKind::Leaf { .. } if elo == ebase && ehi == ebase + size => {
                    if let Some(n) = e.with_prot(prot) {
                        self.wr(table, i, n);
                        done += size / PAGE_SIZE;
                    }
                }
                _ => {}
            }
        }
        done
    }

    /// Free every table below `table` (at `level`), skipping global root slots.
    fn free_subtree(&self, table: PhysAddr, level: usize) {
        for i in 0..ENTRIES {
            if level == LEVELS - 1 && self.is_global_slot(i) {
                continue;
            }
            if let PteKind::Table(next) = self.rd(table, i).decode() {
                if level > 0 {
                    if level > 1 {
                        self.free_subtree(next, level - 1);
                    }
                    self.free_table(next);
                }
            }
        }
    }

    /// Unlink `[lo, hi)` of `root`, retiring emptied tables.
    fn unmap_low(&self, root: PhysAddr, lo: u64, hi: u64) -> u64 {
        let mut retired = Vec::new();
        let n = self.clear(root, LEVELS - 1, 0, lo, hi, &mut retired);
        if !retired.is_empty() {
            add(&self.counters.tables_retired, retired.len() as u64);
            self.retired.lock().extend(retired);
        }
        n
    }

    // ----- fences --------------------------------------------------------------------

    /// Fence everything, then free the retired tables: no cached walk can reach them.
    fn fence_all(&self) {
        self.hw.sfence_vma(None);
        add(&self.counters.fences_all, 1);
        let retired = core::mem::take(&mut *self.retired.lock());
        for f in retired {
            self.free_table(f);
        }
    }

    /// Fence the pages of `ranges` one by one, or everything when they are many or
    /// tables wait to be freed.
    fn fence_ranges(&self, ranges: &[VaRange]) {
        let pages = ranges.iter().fold(0u64, |n, r| n.saturating_add(r.pages()));
        if pages > self.config.flush_all_above || !self.retired.lock().is_empty() {
            self.fence_all();
            return;
        }
        for r in ranges {
            for k in 0..r.pages() {
                self.hw
                    .sfence_vma(Some(VirtAddr::new(r.start.as_u64() + k * PAGE_SIZE)));
            }
        }
        add(&self.counters.fences_page, pages);
    }

    fn switch_to(&self, root: Option<PageTableRoot>) {
        let satp = match root {
            Some(r) => self.satp_of(r),
            None if self.globals.is_empty() => 0,
            None => self.satp_of(self.template_root()),
        };
        // SAFETY: `satp` is bare or names a live root of this driver or its template,
        // each carrying the global mappings that `new`'s contract says map the running
        // kernel; the full fence follows.
        unsafe { self.hw.write_satp(satp) };
        add(&self.counters.satp_writes, 1);
        self.active
            .store(root.map_or(0, |r| r.0), Ordering::Release);
        self.fence_all();
    }
}

impl<H: Sv39Hardware> Drop for Sv39<H> {
    /// Gives back the template's tables and the retired ones. Tables created by the
    /// driver share the template's subtrees: destroy them (and leave them) first.
    fn drop(&mut self) {
        for f in core::mem::take(&mut *self.retired.lock()) {
            self.free_table(f);
        }
        self.global_slots = [0; ENTRIES / 64];
        self.free_subtree(self.template, LEVELS - 1);
        self.free_table(self.template);
    }
}

impl<H: Sv39Hardware> Mmu for Sv39<H> {
    fn format(&self) -> PageTableFormat {
        SV39_FORMAT
    }

    fn page_sizes(&self) -> PageSizes {
        PageSizes::S4K
    }

    fn create_page_table(&self) -> Result<PageTableRoot, MmuError> {
        let root = self.alloc_table()?;
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
        } else if !self.retired.lock().is_empty() {
            self.fence_all();
        }
        self.live.lock().retain(|r| *r != root.0);
        let table = PhysAddr::new(root.0);
        self.free_subtree(table, LEVELS - 1);
        self.free_table(table);
    }

    fn map(&self, root: PageTableRoot, run: &MapRun) -> Result<(), MmuError> {
        let va = run.va.as_u64();
        let unsupported = MmuError::Unsupported { va: run.va };
        if !self.is_live(root) {
            return Err(MmuError::Hardware(HW_UNKNOWN_ROOT));
        }
        if run.page_size != PageSize::Size4K
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
        {
            return Err(unsupported);
        }
        let attrs = LeafAttrs {
            user: self.config.user,
            global: false,
        };
        if Pte::leaf_flags(run.prot, attrs).is_none() {
            return Err(unsupported);
        }
        let (lo, hi) = (low_bits(va), low_bits(va) + run.len);
        let top = LEVELS - 1;
        let (s0, s1) = (index(va, top), ((hi - 1) >> 30) as usize & (ENTRIES - 1));
        if let Some(s) = (s0..=s1).find(|&s| self.is_global_slot(s)) {
            let at = sign_extend((s as u64) << 30).max(run.va);
            return Err(MmuError::Unsupported { va: at });
        }
        let table = PhysAddr::new(root.0);
        for k in 0..run.len / PAGE_SIZE {
            let v = va + k * PAGE_SIZE;
            let pa = PhysAddr::new(run.pa.as_u64() + k * PAGE_SIZE);
            let leaf = Pte::leaf(pa, run.prot, attrs).ok_or(unsupported)?;
            if let Err(e) = self.install(table, v, 0, leaf, true) {
                // Nothing of the run may stay: clear what was installed, and the
                // tables made for the failing page.
                self.unmap_low(table, lo, low_bits(v) + PAGE_SIZE);
                return Err(e);
            }
        }
        add(&self.counters.pages_mapped, run.len / PAGE_SIZE);
        self.fence_ranges(&[run.range()]);
        Ok(())
    }

    fn unmap(&self, root: PageTableRoot, range: VaRange) {
        let va = range.start.as_u64();
        if !self.is_live(root) || !is_canonical_range(va, range.len) {
            return;
        }
        let n = self.unmap_low(
            PhysAddr::new(root.0),
            low_bits(va),
            low_bits(va) + range.len,
        );
        add(&self.counters.pages_unmapped, n);
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
        let n = self.reprotect(
            PhysAddr::new(root.0),
            LEVELS - 1,
            0,
            low_bits(va),
            low_bits(va) + range.len,
            prot,
        );
        add(&self.counters.pages_protected, n);
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
