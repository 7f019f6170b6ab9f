//! Tree prefetch: which pages of a block migrate together with its faults.
//!
//! The rule is UVM's (`kernel-open/nvidia-uvm/uvm_perf_prefetch.c`,
//! `uvm_perf_prefetch_prenotify_fault_migrations` and `compute_prefetch_region`):
//!
//! 1. The *occupancy* of the block is the pages already resident at the destination
//!    plus the pages faulted in this batch.
//! 2. *Big-page growth* (`grow_fault_granularity`): every aligned big page (64 KiB by
//!    default) holding a faulted page that is not thrashing is counted as occupied in
//!    full, so prefetching is big-page friendly.
//! 3. A binary tree spans the block's pages (512 leaves, 10 levels). For each faulted
//!    page that is not thrashing, walk from its leaf to the root; each node's pages are
//!    the aligned power-of-two range containing the page, clipped to the region the
//!    block actually covers. The *largest* node whose occupied count satisfies
//!    `occupied * 100 > pages * threshold` is that fault's prefetch region (UVM keeps
//!    overwriting the region while walking up, so a larger qualifying node wins even
//!    if a node between them does not qualify).
//! 4. The prefetch set is the union of those regions, minus the faulted pages (they
//!    migrate anyway), minus thrashing pages, minus pages already resident at the
//!    destination (nothing to copy).
//! 5. A first-touch fault on a block nothing is resident in, whose destination is the
//!    range's preferred location, populates the whole region.
//!
//! UVM also requires a minimum number of fault migrations to the same processor
//! before it prefetches (`uvm_perf_prefetch_min_faults`, default 1, so any fault
//! qualifies); that counter is state across batches, which this pure engine does not
//! keep: with the default it never changes the answer.

use super::{PageMask, PageRun, BLOCK_PAGES};
use core::fmt;

/// Prefetch tuning for one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchConfig {
    threshold_percent: u8,
    big_page_pages: u16,
}

/// Why a [`PrefetchConfig`] or a [`PrefetchInput`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefetchError {
    /// The threshold is outside `1..=100` (UVM: "Valid values 1-100").
    Threshold(u8),
    /// The big-page size is not a power of two in `1..=512` pages.
    BigPage(u16),
    /// The region `[first, outer)` is empty or runs past the block.
    Region {
        /// First page of the region.
        first: usize,
        /// One past its last page.
        outer: usize,
    },
    /// A faulted page lies outside the region.
    FaultOutsideRegion(usize),
}

impl fmt::Display for PrefetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Threshold(t) => write!(f, "prefetch threshold {t}% is not in 1..=100"),
            Self::BigPage(p) => write!(f, "big page of {p} pages is not a power of two <= 512"),
            Self::Region { first, outer } => {
                write!(f, "region {first}..{outer} is empty or past the block")
            }
            Self::FaultOutsideRegion(p) => write!(f, "faulted page {p} is outside the region"),
        }
    }
}

impl core::error::Error for PrefetchError {}

impl Default for PrefetchConfig {
    /// UVM's defaults: 51% (`UVM_PREFETCH_THRESHOLD_DEFAULT` in `uvm_perf_prefetch.c`)
    /// and 64 KiB big pages (the size `uvm_perf_prefetch_prenotify_fault_migrations`
    /// assumes when the destination's big-page size is unknown, `UVM_PAGE_SIZE_64K`).
    fn default() -> Self {
        Self {
            threshold_percent: 51,
            big_page_pages: 16,
        }
    }
}

impl PrefetchConfig {
    /// A configuration: the occupancy threshold in percent and the big-page size in
    /// base pages (1 turns big-page growth off).
    ///
    /// # Errors
    /// [`PrefetchError::Threshold`] unless `1 <= threshold_percent <= 100`;
    /// [`PrefetchError::BigPage`] unless `big_page_pages` is a power of two `<= 512`.
    pub fn new(threshold_percent: u8, big_page_pages: u16) -> Result<Self, PrefetchError> {
        if !(1..=100).contains(&threshold_percent) {
            return Err(PrefetchError::Threshold(threshold_percent));
        }
        if !big_page_pages.is_power_of_two() || big_page_pages as usize > BLOCK_PAGES {
            return Err(PrefetchError::BigPage(big_page_pages));
        }
        Ok(Self {
            threshold_percent,
            big_page_pages,
        })
    }

    /// The occupancy threshold in percent.
    pub fn threshold_percent(&self) -> u8 {
        self.threshold_percent
    }

    /// The big-page size in base pages.
    pub fn big_page_pages(&self) -> u16 {
        self.big_page_pages
    }
}

/// What the prefetcher looks at for one block and one destination.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchInput<'a> {
    /// Pages already resident at the destination.
    pub resident: &'a PageMask,
    /// Pages faulted by the destination in this batch.
    pub faulted: &'a PageMask,
    /// Pages the thrashing detector reports as thrashing (never prefetched, and
    /// their faults do not seed prefetching).
    pub thrashing: Option<&'a PageMask>,
    /// The pages of the block that belong to the faulting range: `[first, outer)`.
    /// A range smaller than the block clips every tree node to it.
    pub region: (usize, usize),
    /// Nothing of the block is resident anywhere and the destination is the range's
    /// preferred location: UVM populates the whole block on such a first touch.
    pub first_touch_at_preferred: bool,
}

/// The prefetcher's answer for one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchPlan {
    /// Pages to migrate because of the faults: faulted and not resident.
    pub faulted: PageMask,
    /// Pages to migrate in addition, by prediction.
    pub prefetch: PageMask,
}

impl PrefetchPlan {
    /// Every page to migrate: faulted and prefetched.
    pub fn migrate(&self) -> PageMask {
        self.faulted.or(&self.prefetch)
    }

    /// The pages to migrate as contiguous runs (one copy each), ascending.
    pub fn runs(&self) -> impl Iterator<Item = PageRun> {
        let m = self.migrate();
        let runs: alloc::vec::Vec<PageRun> = m.runs().collect();
        runs.into_iter()
    }
}

/// Computes the pages to migrate for one block under `config`.
///
/// # Errors
/// [`PrefetchError::Region`] if the region is empty or runs past the block;
/// [`PrefetchError::FaultOutsideRegion`] if a faulted page lies outside it.
pub fn plan(
    config: &PrefetchConfig,
    input: &PrefetchInput<'_>,
) -> Result<PrefetchPlan, PrefetchError> {
    let (first, outer) = input.region;
    if first >= outer || outer > BLOCK_PAGES {
        return Err(PrefetchError::Region { first, outer });
    }
    if let Some(p) = input.faulted.iter().find(|&p| p < first || p >= outer) {
        return Err(PrefetchError::FaultOutsideRegion(p));
    }
    let empty = PageMask::new();
    let thrashing = input.thrashing.unwrap_or(&empty);
    let region = PageMask::range(first, outer);
    let faulted_migrate = input.faulted.and_not(input.resident);

    let chosen = if input.first_touch_at_preferred {
        region
    } else {
        // 1. occupancy, 2. big-page growth.
        let mut occupied = input.resident.or(input.faulted).and(&region);
        let big = config.big_page_pages as usize;
        if big > 1 {
            let mut start = first & !(big - 1);
            while start < outer {
                let (s, e) = (start.max(first), (start + big).min(outer));
                if input.faulted.count_range(s, e) > 0 && thrashing.count_range(s, e) == 0 {
                    occupied.fill(s, e);
                }
                start += big;
            }
        }
        // 3. the tree walk per faulted, non-thrashing page.
        let mut chosen = PageMask::new();
        let threshold = config.threshold_percent as usize;
        for page in input.faulted.and_not(thrashing).iter() {
            if chosen.count_range(first, outer) == outer - first {
                break; // UVM's early out: the region is chosen whole
            }
            let mut best = (page, page + 1);
            for level in 0..=BLOCK_PAGES.trailing_zeros() {
                let size = 1usize << level;
                let node = page & !(size - 1);
                let (s, e) = (node.max(first), (node + size).min(outer));
                let pages = e - s;
                if occupied.count_range(s, e) * 100 > pages * threshold {
                    best = (s, e);
                }
            }
            chosen.fill(best.0, best.1);
        }
        chosen
    };
    let prefetch = chosen
        .and(&region)
        .and_not(input.faulted)
        .and_not(thrashing)
        .and_not(input.resident);
    Ok(PrefetchPlan {
        faulted: faulted_migrate,
        prefetch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn input<'a>(resident: &'a PageMask, faulted: &'a PageMask) -> PrefetchInput<'a> {
        PrefetchInput {
            resident,
            faulted,
            thrashing: None,
            region: (0, BLOCK_PAGES),
            first_touch_at_preferred: false,
        }
    }

    fn no_big(threshold: u8) -> PrefetchConfig {
        PrefetchConfig::new(threshold, 1).unwrap()
    }

    /// The reference: the rule written the slow way, one node at a time from the
    /// root down, keeping the largest qualifying node per fault.
    fn reference(threshold: usize, resident: &PageMask, faulted: &PageMask) -> PageMask {
        let occ = resident.or(faulted);
        let mut out = PageMask::new();
        for p in faulted.iter() {
            let mut size = BLOCK_PAGES;
            loop {
                let node = p / size * size;
                let n = (node..node + size).filter(|&i| occ.test(i)).count();
                if n * 100 > size * threshold || size == 1 {
                    out.fill(node, node + size);
                    break;
                }
                size /= 2;
            }
        }
        out.and_not(faulted).and_not(resident)
    }

    #[test]
    fn a_lone_fault_in_an_empty_block_prefetches_nothing_without_big_pages() {
        let (r, f) = (PageMask::new(), PageMask::range(7, 8));
        let p = plan(&no_big(51), &input(&r, &f)).unwrap();
        assert!(p.prefetch.is_empty());
        assert_eq!(p.migrate(), f);
    }

    #[test]
    fn two_adjacent_faults_fill_their_pair_and_a_third_fills_the_quad() {
        // Pages 0 and 1: the pair node (2 pages, 2 occupied) qualifies, the quad
        // (4 pages, 2 occupied = 50%) does not at 51%: nothing new to prefetch.
        let r = PageMask::new();
        let f = PageMask::range(0, 2);
        assert!(plan(&no_big(51), &input(&r, &f))
            .unwrap()
            .prefetch
            .is_empty());
        // Pages 0..3: the quad has 3 of 4 (75%) -> page 3 prefetched; the octet has 3
        // of 8 (37%) -> not.
        let f = PageMask::range(0, 3);
        let p = plan(&no_big(51), &input(&r, &f)).unwrap();
        assert_eq!(p.prefetch, PageMask::range(3, 4));
        // At a 50% threshold the same three faults (3 of 8 = 37%) still stop at the
        // quad, and two faults (2 of 4 = 50%, not above 50%) do not grow.
        let f2 = PageMask::range(0, 2);
        assert!(plan(&no_big(50), &input(&r, &f2))
            .unwrap()
            .prefetch
            .is_empty());
    }

    #[test]
    fn a_block_past_half_resident_is_completed_by_one_fault() {
        // 256 resident + 1 fault = 257 of 512 > 51%? 257*100 = 25700 > 512*51 = 26112? no.
        // 262 resident + 1 fault = 263*100 = 26300 > 26112: the whole block.
        let r = PageMask::range(0, 262);
        let f = PageMask::range(300, 301);
        let p = plan(&no_big(51), &input(&r, &f)).unwrap();
        assert_eq!(p.migrate(), PageMask::range(262, 512));
        let r = PageMask::range(0, 256);
        let p = plan(&no_big(51), &input(&r, &f)).unwrap();
        assert_ne!(
            p.migrate(),
            PageMask::range(256, 512),
            "256+1 is not above 51%"
        );
    }

    #[test]
    fn the_engine_matches_the_reference_on_pseudorandom_blocks() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..300 {
            let mut r = PageMask::new();
            let mut f = PageMask::new();
            // Dense resident prefixes and clustered faults exercise every level.
            let dens = (next() % 100) as usize;
            for i in 0..BLOCK_PAGES {
                if (next() % 100) < dens as u64 / 2 {
                    r.set(i);
                }
            }
            let base = (next() % BLOCK_PAGES as u64) as usize;
            for _ in 0..(next() % 40) {
                let p = (base + (next() % 64) as usize) % BLOCK_PAGES;
                if !r.test(p) {
                    f.set(p);
                }
            }
            let t = 1 + (next() % 100) as u8;
            let got = plan(&no_big(t), &input(&r, &f)).unwrap().prefetch;
            assert_eq!(
                got,
                reference(t as usize, &r, &f),
                "case {case} threshold {t}"
            );
        }
    }

    #[test]
    fn big_page_growth_fills_each_faulted_big_page_unless_it_thrashes() {
        let r = PageMask::new();
        let f = PageMask::range(17, 18); // in the second 64 KiB big page
        let p = plan(&PrefetchConfig::default(), &input(&r, &f)).unwrap();
        assert_eq!(p.migrate(), PageMask::range(16, 32));
        let t = PageMask::range(20, 21);
        let mut i = input(&r, &f);
        i.thrashing = Some(&t);
        let p = plan(&PrefetchConfig::default(), &i).unwrap();
        assert_eq!(
            p.migrate(),
            f,
            "a thrashing page in the big page stops the growth"
        );
    }

    #[test]
    fn a_streaming_scan_migrates_the_whole_block_within_a_few_batches() {
        // One fault per 64 KiB big page, in order, as a streaming kernel touches them.
        let cfg = PrefetchConfig::default();
        let mut resident = PageMask::new();
        let mut batches = 0;
        let mut page = 0;
        while resident.count() < BLOCK_PAGES {
            let f = PageMask::range(page, page + 1);
            let p = plan(&cfg, &input(&resident, &f)).unwrap();
            resident = resident.or(&p.migrate());
            batches += 1;
            page = (0..BLOCK_PAGES)
                .find(|&i| !resident.test(i))
                .unwrap_or(BLOCK_PAGES);
        }
        // Faults at 0, 16, 32 (3 of 4 big pages of the first 256 KiB resident -> the
        // 64-page node qualifies) ... the block completes well before 32 faults.
        assert!(batches < 8, "{batches} batches to fill the block");
    }

    #[test]
    fn thrashing_and_resident_pages_are_never_prefetched_and_runs_cover_the_plan() {
        let r = PageMask::range(0, 100);
        let f = PageMask::range(100, 200);
        let t = PageMask::range(300, 310);
        let mut i = input(&r, &f);
        i.thrashing = Some(&t);
        let p = plan(&no_big(51), &i).unwrap();
        assert!(p.prefetch.and(&t).is_empty() && p.prefetch.and(&r).is_empty());
        assert!(p.prefetch.and(&f).is_empty());
        let mut back = PageMask::new();
        let runs: Vec<PageRun> = p.runs().collect();
        for run in &runs {
            back.fill(run.first as usize, run.end());
        }
        assert_eq!(back, p.migrate());
        assert!(runs.windows(2).all(|w| w[0].end() < w[1].first as usize));
    }

    #[test]
    fn a_region_smaller_than_the_block_clips_every_node() {
        // The range covers pages 0..10 only; 6 faults of 10 pages = 60% > 51%.
        let r = PageMask::new();
        let f = PageMask::range(0, 6);
        let mut i = input(&r, &f);
        i.region = (0, 10);
        let p = plan(&no_big(51), &i).unwrap();
        assert_eq!(p.migrate(), PageMask::range(0, 10));
        i.first_touch_at_preferred = true;
        assert_eq!(
            plan(&no_big(51), &i).unwrap().migrate(),
            PageMask::range(0, 10)
        );
    }

    #[test]
    fn bad_configs_and_inputs_are_typed_errors() {
        assert_eq!(PrefetchConfig::new(0, 16), Err(PrefetchError::Threshold(0)));
        assert_eq!(
            PrefetchConfig::new(101, 16),
            Err(PrefetchError::Threshold(101))
        );
        assert_eq!(PrefetchConfig::new(51, 24), Err(PrefetchError::BigPage(24)));
        assert_eq!(
            PrefetchConfig::new(51, 1024),
            Err(PrefetchError::BigPage(1024))
        );
        let (r, f) = (PageMask::new(), PageMask::range(20, 21));
        let mut i = input(&r, &f);
        i.region = (0, 10);
        assert_eq!(
            plan(&no_big(51), &i),
            Err(PrefetchError::FaultOutsideRegion(20))
        );
        i.region = (5, 5);
        assert_eq!(
            plan(&no_big(51), &i),
            Err(PrefetchError::Region { first: 5, outer: 5 })
        );
    }
}
