//! The IOMMU's table memory: 4 KiB frames of 64-bit words that software and the
//! hardware walker access atomically.
//!
//! ## Why a memory of its own
//! [`gmem_sim::SimMemory`] holds bytes behind one lock and offers single 64-bit loads and
//! stores, but no compare-and-swap. The lock-free discipline of [`crate::table`] needs
//! exactly that (Linux installs an intermediate IOMMU table with `cmpxchg64`), and a
//! reader-writer discipline is only meaningful if readers do not serialise on a memory
//! lock underneath. So the IOMMU's tables live here: `frames` frames at physical
//! addresses `[base, base + frames * 4 KiB)` (a range of the machine's physical address
//! space no other memory answers for), each entry one `AtomicU64` that the edits store,
//! swap and compare-and-swap and the walker loads with acquire ordering — what DRAM
//! and a coherent IOMMU walker give a real driver. The entry encoding is x86-64's
//! ([`gmem_x86pt::X86Pte`]).
//!
//! ## Frames and their metadata
//! Frames come from a free list (the kernel page allocator of a real driver) and are
//! handed out zeroed. Each frame has metadata, as an OS keeps a `struct page` per page:
//! the number of present entries (the reference count the reader-writer discipline
//! reclaims on), a reader-writer lock (used on root frames: the per-table lock of the
//! locked and reader-writer disciplines) and whether it is a live root.
//!
//! ## Reclamation
//! A table page that an unmap unlinked may still be cached by a walker's page-walk
//! cache, so it is *retired*: tagged with the walkers translating with its root at that
//! moment, and freed when each of them has invalidated that root or switched away. The
//! rule and its books are the shared engine's ([`gmem_ptengine::Retirement`]); this
//! memory only gives it its free list.

use crate::sync::{fence, AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering, RwLock};
use gmem_core::{PageTableRoot, PhysAddr, PAGE_SIZE};
use gmem_ptengine::{AtomicTableMemory, Retirement};
use gmem_sim::WalkerId;
use std::fmt;

/// Entries per table frame.
const WORDS: usize = 512;
/// Most frames a table memory may have (4 GiB of tables).
pub const MAX_FRAMES: u64 = 1 << 20;

/// Why a table memory could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableMemoryError {
    /// The base is not page aligned, the frame count is 0 or above [`MAX_FRAMES`], or the
    /// range overflows.
    BadRange {
        /// The base asked for.
        base: u64,
        /// The frames asked for.
        frames: u64,
    },
}

impl fmt::Display for TableMemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableMemoryError::BadRange { base, frames } => {
                write!(f, "table memory {base:#x} with {frames} frames is invalid")
            }
        }
    }
}

/// Counters of a table memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableMemoryStats {
    /// Frames in the memory.
    pub frames: u64,
    /// Frames handed out and not yet freed (retired ones included).
    pub in_use: u64,
    /// Most frames in use at once.
    pub peak: u64,
    /// Allocations refused because no frame was free.
    pub exhausted: u64,
    /// Retired pages freed at once (no walker used their root).
    pub freed_at_once: u64,
    /// Retired pages freed after the walkers' invalidations.
    pub freed_after_invalidation: u64,
    /// Retired pages still waiting for an invalidation.
    pub waiting: u64,
}

/// Per-frame metadata (a `struct page`).
pub(crate) struct FrameMeta {
    /// Present entries (maintained by the disciplines that reclaim).
    pub count: AtomicU32,
    /// The table lock, used on root frames.
    pub lock: RwLock<()>,
    /// Whether the frame is a live root.
    pub root: AtomicBool,
}

impl Default for FrameMeta {
    fn default() -> Self {
        FrameMeta {
            count: AtomicU32::new(0),
            lock: RwLock::new(()),
            root: AtomicBool::new(false),
        }
    }
}

struct FreeList {
    free: Vec<u32>,
    peak: u64,
    exhausted: u64,
}

/// Atomic-word table frames at a physical range.
pub struct TableMemory {
    base: u64,
    frames: u64,
    words: Box<[AtomicU64]>,
    meta: Box<[FrameMeta]>,
    free: Mutex<FreeList>,
    books: Retirement,
}

impl fmt::Debug for TableMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TableMemory([{:#x}, {:#x}))",
            self.base,
            self.base + self.frames * PAGE_SIZE
        )
    }
}

impl TableMemory {
    /// `frames` zeroed frames from physical address `base`.
    ///
    /// # Errors
    /// [`TableMemoryError::BadRange`] when `base` is not page aligned, `frames` is zero
    /// or above [`MAX_FRAMES`], or the range overflows.
    pub fn new(base: PhysAddr, frames: u64) -> Result<TableMemory, TableMemoryError> {
        let bad = TableMemoryError::BadRange {
            base: base.as_u64(),
            frames,
        };
        if !base.is_page_aligned() || frames == 0 || frames > MAX_FRAMES {
            return Err(bad);
        }
        base.as_u64().checked_add(frames * PAGE_SIZE).ok_or(bad)?;
        let words = (0..frames as usize * WORDS)
            .map(|_| AtomicU64::new(0))
            .collect();
        let meta = (0..frames).map(|_| FrameMeta::default()).collect();
        Ok(TableMemory {
            base: base.as_u64(),
            frames,
            words,
            meta,
            // Lowest addresses first: deterministic layouts.
            free: Mutex::new(FreeList {
                free: (0..frames as u32).rev().collect(),
                peak: 0,
                exhausted: 0,
            }),
            books: Retirement::new(),
        })
    }

    /// First physical address.
    pub fn base(&self) -> PhysAddr {
        PhysAddr::new(self.base)
    }

    /// Whether `pa` lies inside the memory.
    pub fn contains(&self, pa: PhysAddr) -> bool {
        self.frame_of(pa.as_u64()).is_some()
    }

    fn frame_of(&self, pa: u64) -> Option<usize> {
        let off = pa.checked_sub(self.base)?;
        (off / PAGE_SIZE < self.frames).then_some((off / PAGE_SIZE) as usize)
    }

    /// The word at `pa` (8-byte aligned, inside the memory).
    pub(crate) fn word(&self, pa: u64) -> Option<&AtomicU64> {
        if pa % 8 != 0 {
            return None;
        }
        self.frame_of(pa)?;
        self.words.get(((pa - self.base) / 8) as usize)
    }

    /// Read the entry at `pa` (acquire), as the walker does; `None` outside the memory.
    pub fn read_u64(&self, pa: PhysAddr) -> Option<u64> {
        self.word(pa.as_u64()).map(|w| w.load(Ordering::Acquire))
    }

    /// The metadata of the frame holding `pa`.
    pub(crate) fn meta(&self, pa: u64) -> Option<&FrameMeta> {
        self.meta.get(self.frame_of(pa)?)
    }

    /// A zeroed frame, or `None` when every frame is in use.
    fn alloc_frame(&self) -> Option<u64> {
        let i = {
            let mut f = self.free.lock();
            let Some(i) = f.free.pop() else {
                f.exhausted += 1;
                return None;
            };
            let used = self.frames - f.free.len() as u64;
            f.peak = f.peak.max(used);
            i as usize
        };
        for w in &self.words[i * WORDS..(i + 1) * WORDS] {
            w.store(0, Ordering::Relaxed);
        }
        let m = &self.meta[i];
        m.count.store(0, Ordering::Relaxed);
        m.root.store(false, Ordering::Relaxed);
        // Publish the zeroed frame before its address is stored anywhere.
        fence(Ordering::Release);
        Some(self.base + i as u64 * PAGE_SIZE)
    }

    /// Give a frame back to the free list.
    pub(crate) fn free_frame(&self, pa: u64) {
        if let Some(i) = self.frame_of(pa) {
            self.free.lock().free.push(i as u32);
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TableMemoryStats {
        let (free, peak, exhausted) = {
            let f = self.free.lock();
            (f.free.len() as u64, f.peak, f.exhausted)
        };
        let r = self.books.stats();
        TableMemoryStats {
            frames: self.frames,
            in_use: self.frames - free,
            peak,
            exhausted,
            freed_at_once: r.freed_at_once,
            freed_after_invalidation: r.freed_after_invalidation,
            waiting: r.waiting,
        }
    }

    // ----- reclamation (the shared rule, over this memory's free list) ---------------

    /// A new walker id.
    pub(crate) fn new_walker(&self) -> WalkerId {
        self.books.new_walker()
    }

    /// `walker` now translates with `root` (its caches were flushed by the switch).
    pub(crate) fn activated(&self, walker: WalkerId, root: Option<PageTableRoot>) {
        self.books
            .activated(walker, root.map(|r| r.0), |f| self.free_frame(f))
    }

    /// `walker` dropped every cached entry of `root`.
    pub(crate) fn invalidated(&self, walker: WalkerId, root: PageTableRoot) {
        self.books
            .invalidated(walker, root.0, |f| self.free_frame(f))
    }

    /// Table page `frame` of `root` was unlinked: free it once no walker can reach it.
    fn retire_frame(&self, root: u64, frame: u64) {
        self.books.retire(root, frame, |f| self.free_frame(f))
    }

    /// Whether a page unlinked from `root` still waits for a walker's invalidation.
    pub(crate) fn has_retired(&self, root: u64) -> bool {
        self.books.has_retired(root)
    }

    /// `root` was destroyed: free whatever it still has retired.
    pub(crate) fn destroyed(&self, root: u64) {
        self.books.destroyed(root, |f| self.free_frame(f))
    }
}

/// The engine's view: entries are the atomic words (acquire loads, release stores,
/// atomic swap and compare-exchange), counts the frames' atomic counters.
impl gmem_ptengine::TableMemory for TableMemory {
    fn read(&self, pa: u64) -> Option<u64> {
        self.word(pa).map(|w| w.load(Ordering::Acquire))
    }
    fn write(&self, pa: u64, raw: u64) -> Option<()> {
        self.word(pa).map(|w| w.store(raw, Ordering::Release))
    }
    fn swap(&self, pa: u64, raw: u64) -> Option<u64> {
        self.word(pa).map(|w| w.swap(raw, Ordering::AcqRel))
    }
    fn compare_exchange(&self, pa: u64, current: u64, new: u64) -> Option<Result<u64, u64>> {
        self.word(pa).map(|w| install(w, current, new))
    }
    fn alloc(&self) -> Option<u64> {
        self.alloc_frame()
    }
    fn free(&self, table: u64) {
        self.free_frame(table)
    }
    fn retire(&self, root: u64, table: u64) {
        self.retire_frame(root, table)
    }
    fn count(&self, table: u64, delta: i32) -> Option<u32> {
        let c = &self.meta(table)?.count;
        Some(match delta {
            0 => c.load(Ordering::Acquire),
            d if d > 0 => c.fetch_add(d as u32, Ordering::AcqRel) + d as u32,
            d => c.fetch_sub(d.unsigned_abs(), Ordering::AcqRel) - d.unsigned_abs(),
        })
    }
}

impl AtomicTableMemory for TableMemory {}

/// Install `new` in `e` if it still holds `current`; otherwise what it holds.
#[cfg(not(gmem_loom_bug = "iommu_cas_plain_store"))]
fn install(e: &AtomicU64, current: u64, new: u64) -> Result<u64, u64> {
    e.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
}

/// Broken variant for the loom model: check, then store, as two steps. Two mappers can
/// both see the entry empty and both install; the first table is overwritten and what
/// was mapped through it is lost.
#[cfg(gmem_loom_bug = "iommu_cas_plain_store")]
fn install(e: &AtomicU64, current: u64, new: u64) -> Result<u64, u64> {
    let seen = e.load(Ordering::Acquire);
    if seen != current {
        return Err(seen);
    }
    e.store(new, Ordering::Release);
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_zeroed_lowest_first_and_exhaustion_is_counted() {
        let m = TableMemory::new(PhysAddr::new(0x10_0000), 2).unwrap();
        let a = m.alloc_frame().unwrap();
        m.word(a + 8).unwrap().store(7, Ordering::Relaxed);
        let b = m.alloc_frame().unwrap();
        assert_eq!((a, b), (0x10_0000, 0x10_1000));
        assert_eq!(m.alloc_frame(), None);
        m.free_frame(a);
        let c = m.alloc_frame().unwrap();
        assert_eq!(c, a);
        assert_eq!(m.read_u64(PhysAddr::new(a + 8)), Some(0));
        let s = m.stats();
        assert_eq!((s.in_use, s.peak, s.exhausted), (2, 2, 1));
    }

    #[test]
    fn bad_ranges_and_addresses_outside_are_refused() {
        assert!(TableMemory::new(PhysAddr::new(0x800), 1).is_err());
        assert!(TableMemory::new(PhysAddr::new(0), 0).is_err());
        assert!(TableMemory::new(PhysAddr::new(u64::MAX - 0xfff), 2).is_err());
        let m = TableMemory::new(PhysAddr::new(0x1000), 1).unwrap();
        assert_eq!(m.read_u64(PhysAddr::new(0x2000)), None);
        assert_eq!(m.read_u64(PhysAddr::new(0x1004)), None);
        assert_eq!(m.read_u64(PhysAddr::new(0)), None);
        assert!(m.contains(PhysAddr::new(0x1ff8)));
    }

    #[test]
    fn a_retired_page_waits_for_every_walker_of_its_root_and_a_switch_counts() {
        let m = TableMemory::new(PhysAddr::new(0), 4).unwrap();
        let (a, b) = (m.new_walker(), m.new_walker());
        m.activated(a, Some(PageTableRoot(1)));
        m.activated(b, Some(PageTableRoot(1)));
        let f = m.alloc_frame().unwrap();
        m.retire_frame(1, f);
        m.invalidated(a, PageTableRoot(1));
        m.invalidated(b, PageTableRoot(2));
        assert_eq!(m.stats().waiting, 1);
        m.activated(b, None);
        let s = m.stats();
        assert_eq!((s.waiting, s.in_use, s.freed_after_invalidation), (0, 0, 1));
        let g = m.alloc_frame().unwrap();
        m.retire_frame(9, g);
        assert_eq!(m.stats().freed_at_once, 1);
        let h = m.alloc_frame().unwrap();
        m.retire_frame(1, h);
        m.destroyed(1);
        assert_eq!(m.stats().in_use, 0);
    }
}
