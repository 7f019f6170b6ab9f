//! # policy: the decisions a GPU driver expects from a unified memory manager
//!
//! NVIDIA's UVM driver (the open `kernel-open/nvidia-uvm` sources) services GPU page
//! faults with a set of *performance heuristics* layered on its fault path: faults
//! arrive in batches and are serviced one 2 MiB block at a time, a tree prefetcher
//! grows each fault into the surrounding pages, a thrashing detector pins or throttles
//! pages that bounce between processors, access counters pull hot remote-mapped
//! blocks into the accessing GPU's memory, and `cudaMemAdvise` records per-range
//! advice. This module holds those heuristics as **pure engines**: data structures
//! and decisions, no page moving, no locks, no driver calls.
//!
//! ## Big theory statement
//!
//! **1. Why pure engines.** A heuristic that moves pages itself is welded to one fault
//! path; one that answers a question ("which pages should migrate with this fault?",
//! "is this page thrashing, and what should the faulting processor do?") can be
//! tested against a reference model in isolation and wired into any fault path. The
//! fault path (module `space::fault`) owns the space's lock, asks the engines, and
//! does what they answer. Every engine's state lives in a plain value the caller
//! keeps beside the space's other state; the caller's lock is the engine's lock.
//!
//! **2. Vocabulary.** A *block* is an aligned 2 MiB virtual range ([`BLOCK_SIZE`]),
//! [`BLOCK_PAGES`] base pages of 4 KiB: UVM's `uvm_va_block_t` granule and the unit
//! its fault servicing, prefetching and access counters work in. A page inside a
//! block is named by its index `0..512` ([`PageIndex`]); a set of pages of one block
//! is a [`PageMask`] (UVM's `uvm_page_mask_t`), and a contiguous run of them is a
//! [`PageRun`], the unit of one copy-engine transfer.
//!
//! **3. The engines**, one module each:
//! - [`batch`]: a batch of fault records (device, address, access) deduplicated by
//!   page and grouped by block, as UVM's replayable-fault servicing does
//!   (`uvm_gpu_replayable_faults.c`); counters of faults, batches and duplicates.
//! - [`prefetch`]: UVM's bitmap-tree prefetcher (`uvm_perf_prefetch.c`): the largest
//!   subtree around each faulted page whose occupancy passes a threshold (51%).
//! - [`thrashing`]: UVM's per-page thrashing detection and its two mitigations, pin
//!   (map remotely) and throttle (`uvm_perf_thrashing.c`).
//! - [`counters`]: access-counter notifications per (device, block) with a threshold
//!   (`uvm_gpu_access_counters.c`).
//! - [`advice`]: the per-range advice record (`cudaMemAdvise`; the GMEM RFC's
//!   `hmadvise`): preferred location, accessed-by set, read-mostly.
//!
//! **4. Parameters.** Every configuration field names its source: the UVM file and
//! module parameter it mirrors, or "assumption". Configurations are validated when
//! built; a bad value is a typed error and no engine is built with it. Per-device
//! knobs (UVM's prefetch threshold is per driver, the issue asks for per device)
//! live in a [`PerDevice`] map: a default plus overrides.
//!
//! **5. Misuse.** Every fallible call checks its whole input before it changes
//! anything: a rejected call leaves the engine exactly as it was.
//!
//! **6. How a fault path uses them** (steps 1, 4 and 6 are wired: `space::batch`
//! behind [`crate::Gmem::dev_fault_batch`]; the rest is still to come; UVM's
//! `service_fault_batch_block_locked`, `uvm_gpu_replayable_faults.c`, likewise asks the
//! thrashing hint per fault before it picks residency and prefetch):
//! 1. drain the device's fault buffer into [`batch::FaultRecord`]s and group them with
//!    [`batch::FaultBatcher::batch`]; then, for each (device, block) group:
//! 2. read each page's [`advice::Advice`]: a device in the accessed-by set maps the
//!    page where it lives (no migration); a read-mostly page read by a device gets a
//!    read-only copy;
//! 3. ask [`thrashing::Thrashing::hint`] for each faulted page: `Pin` maps it remotely
//!    where it is, `Throttle` puts the record back for a later batch;
//! 4. ask [`prefetch::plan`] for the rest, with the destination's resident pages, the
//!    faulted pages, [`thrashing::Thrashing::thrashing_mask`] and the range's extent
//!    (first touch at the preferred location fills the range);
//! 5. migrate each of the plan's runs with one copy, map, and tell the engines:
//!    [`thrashing::Thrashing::record_migration`] per page moved,
//!    [`counters::AccessCounters::migrated`] per range;
//! 6. one TLB invalidation and one replay for the whole batch.
//!
//! Besides faults: [`thrashing::Thrashing::expire`] now and then (unmap the remote
//! mappings of the pages it unpins), and a driver's access-counter reports through
//! [`counters::AccessCounters::record`], whose hot regions migrate like a fault (UVM's
//! access-counter servicing skips a page the thrashing hint throttles, and pins one it
//! pins). The access counters are wired: `space::access` keeps a space's engine and
//! [`crate::Gmem::dev_report_accesses`] migrates the hot regions it reports (no
//! thrashing hint is asked there yet: thrashing is not wired).

use alloc::collections::BTreeMap;

use crate::addr::{Vpn, PAGE_SIZE};
use crate::handle::DeviceId;

pub mod advice;
pub mod batch;
pub mod counters;
pub mod prefetch;
pub mod thrashing;

/// Base pages per block: 2 MiB / 4 KiB (UVM's `PAGES_PER_UVM_VA_BLOCK`).
pub const BLOCK_PAGES: usize = 512;

/// Bytes per block: 2 MiB (UVM's `UVM_VA_BLOCK_SIZE`).
pub const BLOCK_SIZE: u64 = BLOCK_PAGES as u64 * PAGE_SIZE;

/// The index of a base page inside its block, `0..BLOCK_PAGES`.
pub type PageIndex = u16;

const WORDS: usize = BLOCK_PAGES / 64;

/// The first page of the block holding `vpn`, and `vpn`'s index in it.
pub const fn block_of(vpn: Vpn) -> (Vpn, PageIndex) {
    let base = vpn.0 & !(BLOCK_PAGES as u64 - 1);
    (Vpn(base), (vpn.0 - base) as PageIndex)
}

/// A contiguous run of pages inside one block: `[first, first + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageRun {
    /// First page index.
    pub first: PageIndex,
    /// Number of pages, at least 1.
    pub len: u16,
}

impl PageRun {
    /// One past the last page index.
    pub const fn end(&self) -> usize {
        self.first as usize + self.len as usize
    }
}

/// A set of pages of one block (UVM's `uvm_page_mask_t`): 512 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PageMask {
    words: [u64; WORDS],
}

impl core::fmt::Debug for PageMask {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.runs().map(|r| r.first as usize..r.end()))
            .finish()
    }
}

impl PageMask {
    /// The empty set.
    pub const fn new() -> Self {
        Self { words: [0; WORDS] }
    }

    /// Every page of the block.
    pub const fn full() -> Self {
        Self {
            words: [u64::MAX; WORDS],
        }
    }

    /// The pages `i` of the block for which `f(i)` holds (e.g. the pages a logical
    /// page table says are resident in one memory).
    pub fn from_fn(mut f: impl FnMut(usize) -> bool) -> Self {
        let mut m = Self::new();
        for i in 0..BLOCK_PAGES {
            if f(i) {
                m.words[i / 64] |= 1 << (i % 64);
            }
        }
        m
    }

    /// The pages `[start, end)`; indices past [`BLOCK_PAGES`] are clamped.
    pub fn range(start: usize, end: usize) -> Self {
        let mut m = Self::new();
        m.fill(start, end);
        m
    }

    /// Whether page `i` is in the set (false for `i >= BLOCK_PAGES`).
    pub fn test(&self, i: usize) -> bool {
        i < BLOCK_PAGES && self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Adds page `i`; returns whether it was absent. Ignores `i >= BLOCK_PAGES`.
    pub fn set(&mut self, i: usize) -> bool {
        if i >= BLOCK_PAGES {
            return false;
        }
        let was = self.test(i);
        self.words[i / 64] |= 1 << (i % 64);
        !was
    }

    /// Removes page `i`; returns whether it was present.
    pub fn clear(&mut self, i: usize) -> bool {
        if i >= BLOCK_PAGES {
            return false;
        }
        let was = self.test(i);
        self.words[i / 64] &= !(1 << (i % 64));
        was
    }

    /// Adds the pages `[start, end)` (clamped to the block).
    pub fn fill(&mut self, start: usize, end: usize) {
        for_each_word(start, end, |w, bits| self.words[w] |= bits);
    }

    /// Removes the pages `[start, end)` (clamped to the block).
    pub fn clear_range(&mut self, start: usize, end: usize) {
        for_each_word(start, end, |w, bits| self.words[w] &= !bits);
    }

    /// Number of pages in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Number of pages of the set inside `[start, end)` (clamped to the block).
    pub fn count_range(&self, start: usize, end: usize) -> usize {
        let mut n = 0;
        for_each_word(start, end, |w, bits| {
            n += (self.words[w] & bits).count_ones() as usize
        });
        n
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The union.
    #[must_use]
    pub fn or(&self, other: &PageMask) -> PageMask {
        self.zip(other, |a, b| a | b)
    }

    /// The intersection.
    #[must_use]
    pub fn and(&self, other: &PageMask) -> PageMask {
        self.zip(other, |a, b| a & b)
    }

    /// The pages of `self` not in `other`.
    #[must_use]
    pub fn and_not(&self, other: &PageMask) -> PageMask {
        self.zip(other, |a, b| a & !b)
    }

    fn zip(&self, other: &PageMask, f: impl Fn(u64, u64) -> u64) -> PageMask {
        let mut out = PageMask::new();
        for (w, o) in out.words.iter_mut().enumerate() {
            *o = f(self.words[w], other.words[w]);
        }
        out
    }

    /// The page indices in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            core::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(w * 64 + b)
            })
        })
    }

    /// The set as maximal contiguous runs, ascending.
    pub fn runs(&self) -> impl Iterator<Item = PageRun> + '_ {
        let mut next = 0usize;
        core::iter::from_fn(move || {
            let first = (next..BLOCK_PAGES).find(|&i| self.test(i))?;
            let end = (first..BLOCK_PAGES)
                .find(|&i| !self.test(i))
                .unwrap_or(BLOCK_PAGES);
            next = end;
            Some(PageRun {
                first: first as PageIndex,
                len: (end - first) as u16,
            })
        })
    }
}

/// Calls `f(word, bits)` for each word overlapping `[start, end)` with the bits of that
/// word inside the range.
fn for_each_word(start: usize, end: usize, mut f: impl FnMut(usize, u64)) {
    let end = end.min(BLOCK_PAGES);
    let mut i = start;
    while i < end {
        let w = i / 64;
        let lo = i % 64;
        let hi = (end - w * 64).min(64);
        let bits = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        f(w, bits);
        i = w * 64 + hi;
    }
}

/// A per-device configuration: one default, overridden for some devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerDevice<T> {
    default: T,
    overrides: BTreeMap<DeviceId, T>,
}

impl<T> PerDevice<T> {
    /// Every device uses `default`.
    pub fn new(default: T) -> Self {
        Self {
            default,
            overrides: BTreeMap::new(),
        }
    }

    /// `device` uses `value` from now on; returns its previous override.
    pub fn set(&mut self, device: DeviceId, value: T) -> Option<T> {
        self.overrides.insert(device, value)
    }

    /// `device` goes back to the default; returns its override.
    pub fn reset(&mut self, device: DeviceId) -> Option<T> {
        self.overrides.remove(&device)
    }

    /// The value for `device`.
    pub fn get(&self, device: DeviceId) -> &T {
        self.overrides.get(&device).unwrap_or(&self.default)
    }

    /// The default value.
    pub fn default_value(&self) -> &T {
        &self.default
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// A reference set: a plain bool array.
    fn model(m: &PageMask) -> Vec<bool> {
        (0..BLOCK_PAGES).map(|i| m.test(i)).collect()
    }

    #[test]
    fn fill_and_count_range_agree_with_a_bool_array_on_every_word_boundary() {
        for (s, e) in [
            (0, 0),
            (0, 1),
            (63, 65),
            (64, 128),
            (1, 511),
            (0, 512),
            (500, 600),
        ] {
            let m = PageMask::range(s, e);
            let want: Vec<bool> = (0..BLOCK_PAGES).map(|i| i >= s && i < e).collect();
            assert_eq!(model(&m), want, "fill {s}..{e}");
            for (a, b) in [(0, 512), (60, 70), (s, e), (100, 101)] {
                let n = (a..b.min(BLOCK_PAGES)).filter(|&i| want[i]).count();
                assert_eq!(m.count_range(a, b), n, "count {a}..{b} of {s}..{e}");
            }
        }
    }

    #[test]
    fn runs_are_maximal_ascending_and_cover_the_set_exactly() {
        let mut m = PageMask::new();
        for i in [0, 1, 2, 63, 64, 65, 200, 511] {
            m.set(i);
        }
        let runs: Vec<_> = m.runs().map(|r| (r.first, r.len)).collect();
        assert_eq!(runs, [(0, 3), (63, 3), (200, 1), (511, 1)]);
        assert_eq!(PageMask::full().runs().count(), 1);
        assert_eq!(PageMask::new().runs().count(), 0);
        let back: Vec<usize> = m.iter().collect();
        assert_eq!(back, [0, 1, 2, 63, 64, 65, 200, 511]);
    }

    #[test]
    fn set_operations_match_the_bool_model() {
        let a = PageMask::range(10, 300);
        let b = PageMask::range(200, 400);
        assert_eq!(a.or(&b), PageMask::range(10, 400));
        assert_eq!(a.and(&b), PageMask::range(200, 300));
        assert_eq!(a.and_not(&b), PageMask::range(10, 200));
        let mut c = a;
        c.clear_range(50, 250);
        assert_eq!(c.count(), 40 + 50);
        assert!(!c.set(512) && !c.test(512) && !c.clear(700));
        let odd = PageMask::from_fn(|i| i % 2 == 1);
        assert_eq!(odd.count(), BLOCK_PAGES / 2);
        assert!(odd.test(511) && !odd.test(0));
    }

    #[test]
    fn block_of_splits_a_page_number_into_block_and_index() {
        assert_eq!(block_of(Vpn(0x200 * 7 + 5)), (Vpn(0x200 * 7), 5));
        assert_eq!(block_of(Vpn(511)), (Vpn(0), 511));
    }

    #[test]
    fn per_device_overrides_fall_back_to_the_default() {
        let a = DeviceId::from_raw(1, 0);
        let b = DeviceId::from_raw(2, 0);
        let mut p = PerDevice::new(51u8);
        assert_eq!(p.set(a, 90), None);
        assert_eq!((*p.get(a), *p.get(b)), (90, 51));
        assert_eq!(p.reset(a), Some(90));
        assert_eq!(*p.get(a), 51);
    }
}
