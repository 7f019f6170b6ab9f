//! Range-allocator benchmarks: our vmem arena against `offset-allocator`, `range-alloc`
//! and `vm-allocator` on three traces, the uncached cost curve from 1k to 1M live
//! ranges, and the cached arena on one and two threads.
//!
//! Every trace is a seeded, pre-generated list of steps over a fixed number of live
//! slots: a live set is allocated first, then each step frees one slot's range and
//! allocates a new range (of the step's size) into the same slot. All allocators
//! replay the same trace; the time is per (free + alloc) pair.
//!
//! - **churn**: sizes uniform in 1..=32 pages of 4 KiB, the freed slot uniformly
//!   random, in a space of four times the all-maximum live set (the original trace).
//! - **fragmenting**: mixed sizes (half 1..=8 pages, three eighths 1..=32, one eighth
//!   1..=128), random frees, in a space only 1.25x the largest live total the trace
//!   ever reaches. A search-based best fit walks many free ranges; the cached arena
//!   caches every size up to 128 pages (its largest), so it reaches the segment layer
//!   only to import or flush a magazine.
//! - **iommu**: the sizes Linux's IOVA range caches serve (powers of two, 1 to 32
//!   pages, small ones most frequent) freed FIFO-ish (step `k` frees slot
//!   `k + jitter`, jitter below 32), as DMA buffers are unmapped in roughly the order
//!   they were mapped.
//!
//! Every allocator's handle is stored the same way (a [`PageRun`]: first page and page
//! count, 8 bytes, offset-allocator's own handle size), and the replay loop prefetches
//! the slot a few steps ahead: the live set is the bench's bookkeeping, and its random
//! accesses should cost every allocator the same and as little as possible.
//!
//! Our arena appears twice with caches: shared through an `Arc` (`alloc`/`free`, a
//! per-CPU lock per operation) and owned by the bench thread (`alloc_mut`/`free_mut`,
//! no lock on a cache hit), which is how every peer (all `&mut` allocators) is driven.
//!
//! For each trace the table shows ns per pair, the free-segment count at the end (ours
//! from [`Arena::stats`], range-alloc's from its allocated runs), allocation failures
//! (a full or fragmented space: the slot stays empty) and the speed ratio of our cached
//! arena against each peer. Then: uncached instant-fit at 1k..1M live ranges on the
//! churn trace (with offset-allocator beside it, and the same arena with each free
//! announced ahead through `Arena::prefetch_free`, as a caller that knows its next
//! frees can), and the cached arena driven by one
//! and by two threads (each with its own live set and CPU id) on one arena with a CPU
//! record per CPU of the machine (at least 2) in both runs, in pairs per second; and
//! as a same-run control two threads on an arena each (nothing shared: what the
//! machine gives two threads at the moment).
//!
//! Set `GMEM_BENCH_LIVE` to change the live-set size of the three traces (default
//! 65 536), `GMEM_BENCH_SKIP_VM=1` to leave out the (linear-time) vm-allocator, and
//! `GMEM_BENCH_STATS=1` to print our arena's counters (cache hits, misses, depot
//! exchanges) after each of its runs.
//!
//! `GMEM_BENCH_THP=1` advises every allocation of 2 MiB or more `MADV_HUGEPAGE` (every
//! allocator alike; see `BenchAlloc`), to tell how much of the growth from 1k to 1M
//! live ranges is TLB misses.
//!
//! `GMEM_BENCH_REPLAY=<live>:<pairs>` skips criterion: it fills an uncached
//! instant-fit arena with the scaling curve's churn trace at `<live>` live ranges,
//! replays `<pairs>` pairs and prints their wall time per pair (the fill excluded),
//! the failures and the free segments. It is a
//! deterministic driver for a cache simulator: run it under
//! `valgrind --tool=cachegrind` with `<pairs>` = 0 and = N, and the difference of the
//! miss counts over N is the misses per pair, the fill excluded.
//! `GMEM_BENCH_REPLAY=<live>:<pairs>:<trace>:<arena>` replays one of the three traces
//! (`churn`, `fragmenting`, `iommu`, with the table's seeds) on `instant` (uncached),
//! `announced` (uncached, frees announced ahead), `cached` (shared, `alloc`/`free`) or `mut` (cached, `alloc_mut`/`free_mut`), so
//! the cached rows can be counted the same way.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};
use gmem_core::Platform;

#[path = "iova_churn/huge.rs"]
mod huge;
#[path = "iova_churn/latency.rs"]
mod latency;
#[path = "iova_churn/threads.rs"]
mod threads;

use huge::huge_pages;
use threads::{print_threads, threaded};

const PAGE: u64 = 4096;
/// Steps in a trace; replayed cyclically (every step keeps the live set valid).
const TRACE_STEPS: usize = 1 << 20;
const BASE: u64 = 1 << 32;

/// The seeded operation trace shared by every allocator.
struct Trace {
    name: &'static str,
    /// Size in pages of each initially live range.
    initial: Vec<u64>,
    /// (slot to free and refill, pages of the new range): 8 bytes a step, so that
    /// streaming the trace through the caches (a million steps, replayed cyclically)
    /// takes as little of the last-level cache from the allocators as it can.
    steps: Vec<(u32, u32)>,
    /// Pages of address space the allocators manage.
    space: u64,
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// Trace (a): uniform 1..=32 pages, random slots, four times the worst-case space.
fn churn_trace(live: usize, seed: u64) -> Trace {
    let mut s = seed;
    let initial = (0..live).map(|_| xorshift(&mut s) % 32 + 1).collect();
    let steps = (0..TRACE_STEPS)
        .map(|_| {
            let slot = (xorshift(&mut s) % live as u64) as u32;
            (slot, (xorshift(&mut s) % 32 + 1) as u32)
        })
        .collect();
    Trace {
        name: "churn",
        initial,
        steps,
        space: live as u64 * 32 * 4,
    }
}

/// Trace (b): mixed sizes, random frees, space 1.25x the peak live total.
fn fragmenting_trace(live: usize, seed: u64) -> Trace {
    let mut s = seed;
    let mut size = move || {
        let r = xorshift(&mut s);
        let max = match r % 8 {
            0..=3 => 8,
            4..=6 => 32,
            _ => 128,
        };
        ((r >> 8) % max + 1, xorshift(&mut s))
    };
    let initial: Vec<u64> = (0..live).map(|_| size().0).collect();
    let mut live_pages: u64 = initial.iter().sum();
    let mut peak = live_pages;
    let mut cur = initial.clone();
    let steps: Vec<(u32, u32)> = (0..TRACE_STEPS)
        .map(|_| {
            let (pages, r) = size();
            let slot = (r % live as u64) as u32;
            live_pages = live_pages - cur[slot as usize] + pages;
            cur[slot as usize] = pages;
            peak = peak.max(live_pages);
            // At most 128 pages.
            (slot, pages as u32)
        })
        .collect();
    Trace {
        name: "fragmenting",
        initial,
        steps,
        space: peak + peak / 4,
    }
}

/// Trace (c): Linux IOVA rcache sizes (orders 0..=5), FIFO-ish frees.
fn iommu_trace(live: usize, seed: u64) -> Trace {
    let mut s = seed;
    let mut size = move || {
        // Orders 0..5 with weights 16, 6, 4, 3, 2, 1 (of 32): small mappings dominate.
        let order = match xorshift(&mut s) % 32 {
            0..=15 => 0,
            16..=21 => 1,
            22..=25 => 2,
            26..=28 => 3,
            29..=30 => 4,
            _ => 5,
        };
        1u64 << order
    };
    let initial: Vec<u64> = (0..live).map(|_| size()).collect();
    let mut j = seed ^ 0x5555;
    let steps = (0..TRACE_STEPS)
        .map(|k| {
            let jitter = (xorshift(&mut j) % 32) as usize;
            // At most 32 pages.
            (((k + jitter) % live) as u32, size() as u32)
        })
        .collect();
    Trace {
        name: "iommu",
        initial,
        steps,
        space: live as u64 * 32 * 2,
    }
}

/// An allocator of page-granular ranges, as the churn loop drives it.
trait Iova {
    type Handle: Copy + Send;
    /// `None` when the space is full (or too fragmented).
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle>;
    fn free(&mut self, h: Self::Handle);
    /// True when the replay loop should announce each free [`FREE_ANNOUNCE`] steps
    /// ahead through [`Iova::prefetch_free`].
    const ANNOUNCES: bool = false;
    /// A free of `h` is coming (see [`Arena::prefetch_free`]).
    fn prefetch_free(&mut self, _h: &Self::Handle) {}
    /// Free segments / free ranges, where the allocator can tell.
    fn fragments(&self) -> Option<u64> {
        None
    }
}

// The CPU id of the calling bench thread, for `ThreadCpus`.
thread_local! {
    static CPU: Cell<usize> = const { Cell::new(0) };
}

/// A platform whose "CPUs" are the bench threads (each sets its id in [`CPU`]).
struct ThreadCpus(usize);

impl Platform for ThreadCpus {
    fn current_cpu(&self) -> usize {
        CPU.with(Cell::get)
    }
    fn cpu_count(&self) -> usize {
        self.0
    }
}

/// What a bench slot keeps for an allocation of ours or of range-alloc: the first
/// page (counted from [`BASE`]) and the page count, 8 bytes, the size of
/// offset-allocator's own handle. Every allocator's live set thus costs the replay
/// loop the same memory traffic (12 bytes a slot with the `Option` tag), and the
/// loop's random slot accesses do not penalise the allocators whose natural handle is
/// two `u64`s.
#[derive(Clone, Copy)]
struct PageRun {
    page: u32,
    pages: u32,
}

impl PageRun {
    #[inline]
    fn new(addr: u64, bytes: u64) -> Self {
        // Spaces are below 2^32 pages (1M live ranges of up to 128 pages).
        Self {
            page: ((addr - BASE) / PAGE) as u32,
            pages: (bytes / PAGE) as u32,
        }
    }
    #[inline]
    fn addr(self) -> u64 {
        BASE + u64::from(self.page) * PAGE
    }
    #[inline]
    fn bytes(self) -> u64 {
        u64::from(self.pages) * PAGE
    }
}

/// Our arena.
struct Ours(Arc<Arena>);

/// Our arena variants.
#[derive(Clone, Copy)]
enum Variant {
    /// Quantum caches up to 32 pages with per-CPU magazines, instant-fit behind them.
    Cached,
    /// No caches, instant-fit.
    Instant,
    /// No caches, best-fit (the fragmentation reference).
    Best,
}

fn arena(space: u64, v: Variant, cpus: usize) -> Arena {
    let (qcache_max, fit) = match v {
        // Every size the three traces use (the fragmenting trace's reach 128 pages).
        Variant::Cached => (128 * PAGE, FitPolicy::InstantFit),
        Variant::Instant => (0, FitPolicy::InstantFit),
        Variant::Best => (0, FitPolicy::BestFit),
    };
    let cfg = ArenaConfig {
        qcache_max,
        magazines: qcache_max != 0,
        // As the address space uses it: it checks its own region map first.
        check_frees: false,
        fit,
        ..ArenaConfig::new(PAGE)
    };
    let platform: Arc<dyn Platform> = Arc::new(ThreadCpus(cpus));
    let a = Arena::new(cfg, Some(platform)).expect("config");
    a.add_span(BASE, space * PAGE).expect("span");
    a
}

impl Iova for Ours {
    type Handle = PageRun;
    // Always: with two callers (the replay loop and `OursAnnounced`) `#[inline]` left
    // these out of line, 32 more instructions per pair than the loop's own inlining.
    #[inline(always)]
    fn alloc(&mut self, pages: u64) -> Option<PageRun> {
        let size = pages * PAGE;
        self.0.alloc(size).ok().map(|a| PageRun::new(a, size))
    }
    #[inline(always)]
    fn free(&mut self, h: PageRun) {
        self.0.free(h.addr(), h.bytes()).expect("arena free");
    }
    fn fragments(&self) -> Option<u64> {
        let st = self.0.stats();
        if std::env::var("GMEM_BENCH_STATS").is_ok() {
            eprintln!("{st:?}");
        }
        Some(st.free_segments)
    }
}

/// Our uncached arena driven as [`Ours`], with every free announced
/// [`FREE_ANNOUNCE`] steps ahead ([`Arena::prefetch_free`]), as a caller with a queue
/// of frees (an IOMMU flush queue, an unmap of many ranges) can.
struct OursAnnounced(Ours);

impl Iova for OursAnnounced {
    type Handle = PageRun;
    const ANNOUNCES: bool = true;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Option<PageRun> {
        self.0.alloc(pages)
    }
    #[inline]
    fn free(&mut self, h: PageRun) {
        self.0.free(h);
    }
    #[inline]
    fn prefetch_free(&mut self, h: &PageRun) {
        (self.0).0.prefetch_free(h.addr(), h.bytes());
    }
    fn fragments(&self) -> Option<u64> {
        self.0.fragments()
    }
}

/// Our arena owned by the bench thread, driven through `alloc_mut`/`free_mut` (the
/// exclusive-owner path: no per-CPU lock on a cache hit). The peers are all `&mut`
/// allocators; this row compares like with like, the `Arc` row above is what a
/// shared arena costs.
struct OursMut(Arena);

impl Iova for OursMut {
    type Handle = PageRun;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Option<PageRun> {
        let size = pages * PAGE;
        self.0.alloc_mut(size).ok().map(|a| PageRun::new(a, size))
    }
    #[inline]
    fn free(&mut self, h: PageRun) {
        self.0.free_mut(h.addr(), h.bytes()).expect("arena free");
    }
    fn fragments(&self) -> Option<u64> {
        Some(self.0.stats().free_segments)
    }
}

/// `offset-allocator` works in u32 units: we give it pages.
struct Offset(offset_allocator::Allocator<u32>);

impl Iova for Offset {
    type Handle = offset_allocator::Allocation<u32>;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Option<Self::Handle> {
        self.0.allocate(pages as u32)
    }
    #[inline]
    fn free(&mut self, h: Self::Handle) {
        self.0.free(h);
    }
}

/// `range-alloc`, in bytes (best fit over a sorted vector of free ranges).
struct RangeAlloc(range_alloc::RangeAllocator<u64>);

impl Iova for RangeAlloc {
    type Handle = PageRun;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Option<PageRun> {
        let r = self.0.allocate_range(pages * PAGE).ok()?;
        Some(PageRun::new(r.start, r.end - r.start))
    }
    #[inline]
    fn free(&mut self, h: PageRun) {
        self.0.free_range(h.addr()..h.addr() + h.bytes());
    }
    fn fragments(&self) -> Option<u64> {
        // Free ranges lie between allocated runs: one more than the runs, at most.
        Some(self.0.allocated_ranges().count() as u64 + 1)
    }
}

/// `vm-allocator`'s `AddressAllocator`, in bytes, first match.
struct VmAlloc(vm_allocator::AddressAllocator);

impl Iova for VmAlloc {
    type Handle = PageRun;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Option<PageRun> {
        let r = self
            .0
            .allocate(pages * PAGE, PAGE, vm_allocator::AllocPolicy::FirstMatch)
            .ok()?;
        Some(PageRun::new(r.start(), r.len()))
    }
    #[inline]
    fn free(&mut self, h: PageRun) {
        let r = vm_allocator::RangeInclusive::new(h.addr(), h.addr() + h.bytes() - 1)
            .expect("vm-allocator range");
        self.0.free(&r).expect("vm-allocator free");
    }
}

/// What one run measured.
#[derive(Clone, Copy, Default)]
struct Outcome {
    /// Median ns per (free + alloc) over criterion's measured samples.
    ns: Option<f64>,
    /// Free fragments at the end, if the allocator reports them.
    fragments: Option<u64>,
    /// Allocations that failed (space full or fragmented), fill included.
    failures: u64,
}

/// The live set: one optional handle per slot.
type Slots<H> = Vec<Option<H>>;

/// Keeps each thread's state on its own cache lines.
#[repr(align(128))]
struct CachePadded<T>(T);

/// One bench thread's live set and trace position.
type ThreadState = (Slots<PageRun>, usize);

/// Build an allocator holding the trace's initial live set; counts failures.
fn filled<A: Iova>(make: &impl Fn() -> A, t: &Trace, failures: &mut u64) -> (A, Slots<A::Handle>) {
    let mut a = make();
    let slots = t
        .initial
        .iter()
        .map(|&p| {
            let h = a.alloc(p);
            *failures += u64::from(h.is_none());
            h
        })
        .collect();
    (a, slots)
}

/// How many steps ahead the replay loop prefetches the slot it will touch.
const SLOT_PREFETCH: usize = 16;

/// How many steps ahead the replay loop announces a free to an allocator that takes
/// announcements: twice the arena's [`gmem_core::vmem::FREE_AHEAD_CALLS`], so that
/// both stages of its prefetch have that many steps to arrive. Below
/// [`SLOT_PREFETCH`], so that reading the slot to announce finds it in cache.
const FREE_ANNOUNCE: usize = 2 * gmem_core::vmem::FREE_AHEAD_CALLS;

/// Hint the CPU to bring `p`'s cache line in (a no-op off x86_64).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and changes no state, whatever
    // the address.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_prefetch(p.cast::<i8>(), core::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Replay `iters` steps of `t` from `*pos`; returns the failures.
///
/// The live set is the bench's bookkeeping, not the allocator's: the loop prefetches
/// the slot of the step [`SLOT_PREFETCH`] ahead, the same for every allocator, so the
/// random slot accesses of a large live set do not hide the allocators' own costs.
#[inline]
fn replay<A: Iova>(
    a: &mut A,
    slots: &mut Slots<A::Handle>,
    t: &Trace,
    pos: &mut usize,
    iters: u64,
) -> u64 {
    let mut failures = 0;
    for _ in 0..iters {
        let (slot, pages) = t.steps[*pos];
        let (ahead, _) = t.steps[(*pos + SLOT_PREFETCH) & (TRACE_STEPS - 1)];
        prefetch(slots.as_ptr().wrapping_add(ahead as usize));
        if A::ANNOUNCES {
            let (soon, _) = t.steps[(*pos + FREE_ANNOUNCE) & (TRACE_STEPS - 1)];
            if let Some(h) = &slots[soon as usize] {
                a.prefetch_free(h);
            }
        }
        *pos = (*pos + 1) & (TRACE_STEPS - 1);
        let slot = &mut slots[slot as usize];
        if let Some(h) = slot.take() {
            a.free(h);
        }
        // No `std::hint::black_box`: the slot is read back by a later step, and forcing the
        // handle through a stack temporary cost a store-forwarding stall (a handle
        // written as two halves, read back whole) that dwarfed a cached allocation.
        *slot = a.alloc(u64::from(pages));
        failures += u64::from(slot.is_none());
    }
    failures
}

/// Benchmark one allocator on one trace. The live set is built lazily on the first
/// call (so a filtered-out benchmark costs nothing), or up front when `eager` (for
/// slow allocators: criterion sizes its samples from the wall time of the first
/// warm-up call, which would otherwise include the fill).
fn churn<A: Iova>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    samples: usize,
    make: impl Fn() -> A,
    t: &Trace,
    eager: bool,
) -> Outcome {
    let mut failures = 0u64;
    let mut state: Option<(A, Slots<A::Handle>)> = eager.then(|| filled(&make, t, &mut failures));
    let mut pos = 0usize;
    let mut per_call: Vec<f64> = Vec::new();
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            // The live set is built once, outside the timed region.
            let (a, slots) = state.get_or_insert_with(|| filled(&make, t, &mut failures));
            let start = Instant::now();
            failures += replay(a, slots, t, &mut pos, iters);
            let elapsed = start.elapsed();
            per_call.push(elapsed.as_nanos() as f64 / iters.max(1) as f64);
            elapsed
        })
    });
    // Criterion calls the routine for warm-up first; the last `samples` calls are
    // the measured samples.
    let n = per_call.len();
    if n == 0 {
        return Outcome::default();
    }
    let mut measured = per_call.split_off(n.saturating_sub(samples));
    measured.sort_by(f64::total_cmp);
    Outcome {
        ns: Some(measured[measured.len() / 2]),
        fragments: state.as_ref().and_then(|(a, _)| a.fragments()),
        failures,
    }
}

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or_else(|| "skipped".into(), |v| format!("{v:.1}"))
}

fn fmt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn ratio(peer: Outcome, ours: Outcome) -> Option<f64> {
    match (peer.ns, ours.ns) {
        (Some(p), Some(o)) if o > 0.0 => Some(p / o),
        _ => None,
    }
}

/// One trace's results, for the summary.
struct TraceResult {
    name: &'static str,
    live: usize,
    space: u64,
    rows: Vec<(&'static str, Outcome)>,
}

fn run_trace(c: &mut Criterion, t: &Trace, live: usize, skip_vm: bool) -> TraceResult {
    let samples = 20;
    let mut group = c.benchmark_group(format!("ranges_{}", t.name));
    group
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let space = t.space;
    let mut rows = Vec::new();
    for (label, id, v) in [
        (
            "gmem vmem, qcache + magazines",
            "vmem_cached",
            Variant::Cached,
        ),
        (
            "gmem vmem, instant-fit, no caches",
            "vmem_instant_fit",
            Variant::Instant,
        ),
        (
            "gmem vmem, best-fit, no caches",
            "vmem_best_fit",
            Variant::Best,
        ),
    ] {
        let o = churn(
            &mut group,
            id,
            samples,
            || Ours(Arc::new(arena(space, v, 1))),
            t,
            false,
        );
        rows.push((label, o));
        if matches!(v, Variant::Cached) {
            let o = churn(
                &mut group,
                "vmem_cached_exclusive",
                samples,
                || OursMut(arena(space, v, 1)),
                t,
                false,
            );
            rows.push(("gmem vmem, cached, &mut owner", o));
        }
    }
    let offset = churn(
        &mut group,
        "offset_allocator",
        samples,
        || {
            Offset(offset_allocator::Allocator::with_max_allocs(
                space as u32,
                4 * live as u32,
            ))
        },
        t,
        false,
    );
    rows.push(("offset-allocator 0.2", offset));
    let range = churn(
        &mut group,
        "range_alloc",
        samples,
        || RangeAlloc(range_alloc::RangeAllocator::new(BASE..BASE + space * PAGE)),
        t,
        false,
    );
    rows.push(("range-alloc 0.1", range));
    if !skip_vm {
        // vm-allocator searches linearly (hundreds of microseconds per pair at 64k
        // live, and a fill of tens of seconds): few samples, eager fill.
        let vm_samples = 10;
        group
            .sample_size(vm_samples)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        let vm = churn(
            &mut group,
            "vm_allocator",
            vm_samples,
            || {
                VmAlloc(
                    vm_allocator::AddressAllocator::new(BASE, space * PAGE).expect("vm-allocator"),
                )
            },
            t,
            true,
        );
        rows.push(("vm-allocator 0.1", vm));
    }
    group.finish();
    TraceResult {
        name: t.name,
        live,
        space,
        rows,
    }
}

/// The `GMEM_BENCH_REPLAY` driver (see the module header); false when unset.
fn replay_only() -> bool {
    let Ok(v) = std::env::var("GMEM_BENCH_REPLAY") else {
        return false;
    };
    let mut parts = v.split(':');
    let parsed = (|| {
        let live = parts.next()?.parse::<usize>().ok().filter(|&l| l > 0)?;
        let pairs = parts.next()?.parse::<u64>().ok()?;
        let t = match parts.next() {
            None => churn_trace(live, 0x5ca1e ^ live as u64),
            Some("churn") => churn_trace(live, 0x10_7a_c4_u64 ^ 0x9e37_79b9_7f4a_7c15),
            Some("fragmenting") => fragmenting_trace(live, 0xf4a9_3e11),
            Some("iommu") => iommu_trace(live, 0x10_3300),
            Some(_) => return None,
        };
        let arena = parts.next().unwrap_or("instant");
        parts.next().is_none().then_some((live, pairs, t, arena))
    })();
    let Some((live, pairs, t, kind)) = parsed else {
        eprintln!("GMEM_BENCH_REPLAY wants <live>:<pairs>[:<trace>:<arena>], got {v:?}");
        std::process::exit(2);
    };
    let (ns, failures, fragments) = match kind {
        "instant" => replay_timed(
            || Ours(Arc::new(arena(t.space, Variant::Instant, 1))),
            &t,
            pairs,
        ),
        "cached" => replay_timed(
            || Ours(Arc::new(arena(t.space, Variant::Cached, 1))),
            &t,
            pairs,
        ),
        "mut" => replay_timed(|| OursMut(arena(t.space, Variant::Cached, 1)), &t, pairs),
        "announced" => replay_timed(
            || OursAnnounced(Ours(Arc::new(arena(t.space, Variant::Instant, 1)))),
            &t,
            pairs,
        ),
        _ => {
            eprintln!(
                "GMEM_BENCH_REPLAY: arena is instant, announced, cached or mut, got {kind:?}"
            );
            std::process::exit(2);
        }
    };
    println!(
        "replay: {} {kind}, {live} live, {pairs} pairs, {ns:.1} ns/pair (fill excluded), \
         {failures} failures, {} free segments, huge pages {}",
        t.name,
        fmt_count(fragments),
        if huge_pages() { "on" } else { "off" }
    );
    true
}

/// Fill, then replay `pairs` pairs of `t`: (ns per pair, failures, free segments).
fn replay_timed<A: Iova>(make: impl Fn() -> A, t: &Trace, pairs: u64) -> (f64, u64, Option<u64>) {
    let mut failures = 0;
    let (mut a, mut slots) = filled(&make, t, &mut failures);
    let mut pos = 0;
    let start = Instant::now();
    failures += replay(&mut a, &mut slots, t, &mut pos, pairs);
    let ns = start.elapsed().as_nanos() as f64 / pairs.max(1) as f64;
    (ns, failures, a.fragments())
}

fn main() {
    huge::set(std::env::var("GMEM_BENCH_THP").is_ok_and(|v| v == "1"));
    if replay_only() {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let live: usize = std::env::var("GMEM_BENCH_LIVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 * 1024);
    let skip_vm = std::env::var("GMEM_BENCH_SKIP_VM").is_ok_and(|v| v == "1");

    let traces = [
        churn_trace(live, 0x10_7a_c4_u64 ^ 0x9e37_79b9_7f4a_7c15),
        fragmenting_trace(live, 0xf4a9_3e11),
        iommu_trace(live, 0x10_3300),
    ];
    let results: Vec<TraceResult> = traces
        .iter()
        .map(|t| run_trace(&mut c, t, live, skip_vm))
        .collect();

    let mut group = c.benchmark_group("instant_fit_scaling");
    let scale_samples = 15;
    group
        .sample_size(scale_samples)
        .warm_up_time(Duration::from_millis(400))
        .measurement_time(Duration::from_secs(2));
    let mut curve = Vec::new();
    // Eager fills (a few seconds in all, even when filtered out): a lazy fill of a
    // million ranges (over a second) inside criterion's first warm-up call made it
    // size the samples as if one pair took that long, so until alloc10 the 1M point
    // was 15 single pairs measured right after the fill ("Collecting 15 samples ...
    // (15 iterations)"), cold and noisy, not the steady state.
    for live in [1_000usize, 10_000, 100_000, 1_000_000] {
        let t = churn_trace(live, 0x5ca1e ^ live as u64);
        let v = churn(
            &mut group,
            &format!("live_{live}"),
            scale_samples,
            || Ours(Arc::new(arena(t.space, Variant::Instant, 1))),
            &t,
            true,
        );
        // The same arena with every free announced ahead (`Arena::prefetch_free`).
        let announced = churn(
            &mut group,
            &format!("announced_live_{live}"),
            scale_samples,
            || OursAnnounced(Ours(Arc::new(arena(t.space, Variant::Instant, 1)))),
            &t,
            true,
        );
        // The same churn on offset-allocator (O(1) bins), to tell the algorithm's
        // growth from the memory hierarchy's.
        let peer = churn(
            &mut group,
            &format!("offset_allocator_live_{live}"),
            scale_samples,
            || {
                Offset(offset_allocator::Allocator::with_max_allocs(
                    t.space as u32,
                    4 * live as u32,
                ))
            },
            &t,
            true,
        );
        curve.push((live, v, announced, peer));
    }
    group.finish();

    let threads = threaded(&mut c, 32 * 1024);
    c.final_summary();

    println!();
    println!(
        "=== range allocators: ns per (free + alloc) pair, median of criterion's samples; \
         ours single-CPU, check_frees = false (as the address space uses the arena) ==="
    );
    for r in &results {
        println!();
        println!(
            "--- trace {}: {} live ranges, space {} pages ---",
            r.name, r.live, r.space
        );
        println!(
            "{:<36} {:>10} {:>14} {:>10}",
            "allocator", "ns/pair", "free segments", "failures"
        );
        for (name, o) in &r.rows {
            println!(
                "{:<36} {:>10} {:>14} {:>10}",
                name,
                fmt_ns(o.ns),
                fmt_count(o.fragments),
                o.failures
            );
        }
        for (which, ours) in [("shared", r.rows[0].1), ("&mut", r.rows[1].1)] {
            for (name, o) in &r.rows[4..] {
                let target = match *name {
                    n if n.starts_with("offset") => Some(3.0),
                    n if n.starts_with("range") => Some(1.5),
                    _ => None,
                };
                let verdict = match (ratio(*o, ours), target) {
                    (Some(x), Some(t)) => format!(
                        "{x:.2}x (target >= {t}x: {})",
                        if x >= t { "met" } else { "NOT met" }
                    ),
                    (Some(x), None) => format!("{x:.2}x"),
                    _ => "n/a".into(),
                };
                println!("  cached arena ({which:<6}) vs {name:<20} {verdict}");
            }
        }
        let inst = r.rows[2].1;
        let best = r.rows[3].1;
        if let (Some(i), Some(b)) = (inst.fragments, best.fragments) {
            println!(
                "  free segments, instant-fit / best-fit: {i} / {b} = {:.2} (target <= 2)",
                i as f64 / b.max(1) as f64
            );
        }
    }
    println!();
    println!(
        "=== uncached instant-fit: ns per (free + alloc) pair vs live ranges (churn), \
         huge pages {} (GMEM_BENCH_THP) ===",
        if huge_pages() { "on" } else { "off" }
    );
    println!(
        "{:>10} {:>10} {:>8} {:>14} {:>14} {:>8} {:>16} {:>8}",
        "live",
        "ns/pair",
        "vs 1k",
        "free segments",
        "announced ns",
        "vs 1k",
        "offset-alloc ns",
        "vs 1k"
    );
    let (base, ann_base, peer_base) = (curve[0].1.ns, curve[0].2.ns, curve[0].3.ns);
    let growth = |v: Option<f64>, b: Option<f64>| match (v, b) {
        (Some(v), Some(b)) if b > 0.0 => format!("{:.2}x", v / b),
        _ => "n/a".into(),
    };
    for (live, o, ann, peer) in &curve {
        println!(
            "{:>10} {:>10} {:>8} {:>14} {:>14} {:>8} {:>16} {:>8}",
            live,
            fmt_ns(o.ns),
            growth(o.ns, base),
            fmt_count(o.fragments),
            fmt_ns(ann.ns),
            growth(ann.ns, ann_base),
            fmt_ns(peer.ns),
            growth(peer.ns, peer_base)
        );
    }
    println!(
        "(announced: the same arena, each free announced {FREE_ANNOUNCE} frees ahead \
         through Arena::prefetch_free, as a caller with a queue of frees can)"
    );
    if let Some(b) = base {
        let load = latency::dependent_load_ns(latency::CHASE_BYTES, 2_000_000);
        println!(
            "host floor: one dependent random load in {} MiB costs {load:.1} ns here, so a \
             pair that waits on one at 1M live ranges grows at least {:.2}x from this \
             run's {b:.1} ns at 1k",
            latency::CHASE_BYTES >> 20,
            (b + load) / b
        );
    }
    println!();
    print_threads(&threads);
}
