//! IOVA churn: the workload of an IOMMU driver mapping and unmapping DMA buffers.
//!
//! Sizes are uniform in 1..=32 pages of 4 KiB. A live set of ranges is allocated
//! first; then every step frees one random live range and allocates a new one of a
//! random size in its place. All allocators replay the same pre-generated, seeded
//! trace, and the time is per (free + alloc) pair. Group 1 compares our arena (with
//! quantum caches and magazines, with caches but no magazines, and plain instant-fit)
//! against `offset-allocator`, `range-alloc` and `vm-allocator` at 64k live ranges.
//! Group 2 runs plain instant-fit, and offset-allocator beside it, at 1k to 1M live
//! ranges: how the cost per pair grows with the number of segments, and how much of
//! that growth the memory hierarchy imposes on an O(1) allocator too. Criterion writes its usual reports; a summary
//! table with medians and ratios is printed at the end.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};

const PAGE: u64 = 4096;
const MAX_PAGES: u64 = 32;
/// Steps in a trace; replayed cyclically (every step keeps the live set valid).
const TRACE_STEPS: usize = 1 << 20;
const LIVE: usize = 64 * 1024;

/// The seeded operation trace shared by every allocator.
struct Trace {
    /// Size in pages of each initially live range.
    initial: Vec<u64>,
    /// (slot to free and refill, pages of the new range).
    steps: Vec<(u32, u64)>,
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

fn trace(live: usize, seed: u64) -> Trace {
    let mut s = seed;
    let initial = (0..live)
        .map(|_| xorshift(&mut s) % MAX_PAGES + 1)
        .collect();
    let steps = (0..TRACE_STEPS)
        .map(|_| {
            let slot = (xorshift(&mut s) % live as u64) as u32;
            (slot, xorshift(&mut s) % MAX_PAGES + 1)
        })
        .collect();
    Trace { initial, steps }
}

/// An allocator of page-granular ranges, as the churn loop drives it.
trait Iova {
    type Handle: Copy;
    fn alloc(&mut self, pages: u64) -> Self::Handle;
    fn free(&mut self, h: Self::Handle);
    /// Free fragments (free segments / free ranges), where the allocator can tell.
    fn fragments(&self) -> Option<u64> {
        None
    }
}

/// Our arena; the handle is (address, size).
struct Ours(Arena);

impl Ours {
    fn new(live: usize, qcache_pages: u64, magazines: bool) -> Self {
        let cfg = ArenaConfig {
            qcache_max: qcache_pages * PAGE,
            magazines,
            // As the address space uses it: it checks its own region map first.
            check_frees: false,
            fit: FitPolicy::InstantFit,
            ..ArenaConfig::new(PAGE)
        };
        let a = Arena::new(cfg, None).expect("config");
        a.add_span(1 << 32, space_pages(live) * PAGE).expect("span");
        Self(a)
    }
}

/// Address space for a live set: four times the worst case of all-maximum ranges.
fn space_pages(live: usize) -> u64 {
    live as u64 * MAX_PAGES * 4
}

impl Iova for Ours {
    type Handle = (u64, u64);
    #[inline]
    fn alloc(&mut self, pages: u64) -> (u64, u64) {
        let size = pages * PAGE;
        (self.0.alloc(size).expect("arena alloc"), size)
    }
    #[inline]
    fn free(&mut self, (addr, size): (u64, u64)) {
        self.0.free(addr, size).expect("arena free");
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
    fn alloc(&mut self, pages: u64) -> Self::Handle {
        self.0
            .allocate(pages as u32)
            .expect("offset-allocator alloc")
    }
    #[inline]
    fn free(&mut self, h: Self::Handle) {
        self.0.free(h);
    }
}

/// `range-alloc`, in bytes.
struct RangeAlloc(range_alloc::RangeAllocator<u64>);

impl Iova for RangeAlloc {
    type Handle = (u64, u64);
    #[inline]
    fn alloc(&mut self, pages: u64) -> (u64, u64) {
        let r = self
            .0
            .allocate_range(pages * PAGE)
            .expect("range-alloc alloc");
        (r.start, r.end)
    }
    #[inline]
    fn free(&mut self, (start, end): (u64, u64)) {
        self.0.free_range(start..end);
    }
    fn fragments(&self) -> Option<u64> {
        // Free ranges lie between allocated runs: one more than the runs, at most.
        Some(self.0.allocated_ranges().count() as u64 + 1)
    }
}

/// `vm-allocator`'s `AddressAllocator`, in bytes, first match.
struct VmAlloc(vm_allocator::AddressAllocator);

impl Iova for VmAlloc {
    type Handle = vm_allocator::RangeInclusive;
    #[inline]
    fn alloc(&mut self, pages: u64) -> Self::Handle {
        self.0
            .allocate(pages * PAGE, PAGE, vm_allocator::AllocPolicy::FirstMatch)
            .expect("vm-allocator alloc")
    }
    #[inline]
    fn free(&mut self, h: Self::Handle) {
        self.0.free(&h).expect("vm-allocator free");
    }
}

/// What one run measured.
#[derive(Clone, Copy, Default)]
struct Outcome {
    /// Median ns per (free + alloc) over criterion's measured samples.
    ns: Option<f64>,
    /// Free fragments at the end, if the allocator reports them.
    fragments: Option<u64>,
}

/// Build an allocator holding the trace's initial live set.
fn filled<A: Iova>(make: impl Fn() -> A, t: &Trace) -> (A, Vec<A::Handle>) {
    let mut a = make();
    let slots = t.initial.iter().map(|&p| a.alloc(p)).collect();
    (a, slots)
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
    let mut state: Option<(A, Vec<A::Handle>)> = eager.then(|| filled(&make, t));
    let mut pos = 0usize;
    let mut per_call: Vec<f64> = Vec::new();
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            // The live set is built once, outside the timed region.
            let (a, slots) = state.get_or_insert_with(|| filled(&make, t));
            let start = Instant::now();
            for _ in 0..iters {
                let (slot, pages) = t.steps[pos];
                pos = (pos + 1) & (TRACE_STEPS - 1);
                let slot = &mut slots[slot as usize];
                a.free(*slot);
                *slot = black_box(a.alloc(pages));
            }
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
    }
}

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or_else(|| "skipped".into(), |v| format!("{v:.1}"))
}

fn fmt_count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let t = trace(LIVE, 0x10_7a_c4_u64 ^ 0x9e37_79b9_7f4a_7c15);
    let samples = 30;

    let mut group = c.benchmark_group("iova_churn_64k");
    group
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(800))
        .measurement_time(Duration::from_secs(3));
    let ours_mag = churn(
        &mut group,
        "vmem_qcache_magazines",
        samples,
        || Ours::new(LIVE, MAX_PAGES, true),
        &t,
        false,
    );
    let ours_stack = churn(
        &mut group,
        "vmem_qcache_stacks",
        samples,
        || Ours::new(LIVE, MAX_PAGES, false),
        &t,
        false,
    );
    let ours_plain = churn(
        &mut group,
        "vmem_instant_fit",
        samples,
        || Ours::new(LIVE, 0, false),
        &t,
        false,
    );
    let offset = churn(
        &mut group,
        "offset_allocator",
        samples,
        || {
            let pages = space_pages(LIVE) as u32;
            Offset(offset_allocator::Allocator::with_max_allocs(
                pages,
                4 * LIVE as u32,
            ))
        },
        &t,
        false,
    );
    let range = churn(
        &mut group,
        "range_alloc",
        samples,
        || {
            let base = 1u64 << 32;
            RangeAlloc(range_alloc::RangeAllocator::new(
                base..base + space_pages(LIVE) * PAGE,
            ))
        },
        &t,
        false,
    );
    // vm-allocator searches linearly (hundreds of microseconds per pair at 64k live,
    // and a fill of tens of seconds): few samples, short measurement, eager fill.
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
                vm_allocator::AddressAllocator::new(1 << 32, space_pages(LIVE) * PAGE)
                    .expect("vm-allocator"),
            )
        },
        &t,
        true,
    );
    group.finish();

    let mut group = c.benchmark_group("instant_fit_scaling");
    let scale_samples = 20;
    group
        .sample_size(scale_samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let mut curve = Vec::new();
    for live in [1_000usize, 10_000, 100_000, 1_000_000] {
        let t = trace(live, 0x5ca1e ^ live as u64);
        let v = churn(
            &mut group,
            &format!("live_{live}"),
            scale_samples,
            || Ours::new(live, 0, false),
            &t,
            false,
        );
        // The same churn on offset-allocator (O(1) bins), to tell the algorithm's
        // growth from the memory hierarchy's.
        let peer = churn(
            &mut group,
            &format!("offset_allocator_live_{live}"),
            scale_samples,
            || {
                Offset(offset_allocator::Allocator::with_max_allocs(
                    space_pages(live) as u32,
                    4 * live as u32,
                ))
            },
            &t,
            false,
        );
        curve.push((live, v, peer));
    }
    group.finish();
    c.final_summary();

    println!();
    println!(
        "=== IOVA churn: 64k live ranges, 1-32 pages of 4 KiB, \
         ns per (free + alloc) pair, median of criterion's samples ==="
    );
    println!(
        "(our cached variants run with check_frees = false, as the address space uses \
         the arena; all ours are single-CPU, no contention)"
    );
    let rows = [
        ("gmem vmem, qcache 32 pages + magazines", ours_mag),
        ("gmem vmem, qcache 32 pages, locked stacks", ours_stack),
        ("gmem vmem, instant-fit, no caches", ours_plain),
        ("offset-allocator 0.2", offset),
        ("range-alloc 0.1", range),
        ("vm-allocator 0.1", vm),
    ];
    println!(
        "{:<44} {:>12} {:>16}",
        "allocator", "ns/op", "free fragments"
    );
    for (name, o) in &rows {
        println!(
            "{:<44} {:>12} {:>16}",
            name,
            fmt_ns(o.ns),
            fmt_count(o.fragments)
        );
    }
    println!();
    println!(
        "{:<44} {:>18} {:>14} {:>14}",
        "speedup (peer ns / ours ns)", "offset-allocator", "range-alloc", "vm-allocator"
    );
    for (name, ours) in &rows[..3] {
        let ratio = |peer: Outcome| match (peer.ns, ours.ns) {
            (Some(p), Some(o)) if o > 0.0 => format!("{:.2}x", p / o),
            _ => "n/a".into(),
        };
        println!(
            "{:<44} {:>18} {:>14} {:>14}",
            name,
            ratio(offset),
            ratio(range),
            ratio(vm)
        );
    }
    let target = |peer: Outcome, want: f64| match (peer.ns, ours_mag.ns) {
        (Some(p), Some(o)) if o > 0.0 => {
            let r = p / o;
            format!(
                "{r:.2}x (target >= {want}x: {})",
                if r >= want { "met" } else { "NOT met" }
            )
        }
        _ => "n/a".into(),
    };
    println!(
        "targets: caches+magazines vs offset-allocator {}; vs range-alloc {}",
        target(offset, 1.5),
        target(range, 20.0)
    );
    println!();
    println!("=== instant-fit, no caches: ns per (free + alloc) pair vs live ranges ===");
    println!(
        "{:>12} {:>12} {:>16} {:>22}",
        "live", "ns/op", "free segments", "offset-allocator ns/op"
    );
    for (live, o, peer) in curve {
        println!(
            "{:>12} {:>12} {:>16} {:>22}",
            live,
            fmt_ns(o.ns),
            fmt_count(o.fragments),
            fmt_ns(peer.ns)
        );
    }
}
