//! A deterministic driver for counting the shared (`&self`) cached arena's hit path:
//! the `iova_churn` bench's iommu trace (same generator, same seed, 65 536 live
//! ranges) replayed on an arena shared through an `Arc` with quantum caches and
//! per-CPU magazines, driven through `alloc` and `free`.
//!
//! Run: `cargo run --release -p gmem-core --example shared_hits -- <pairs> [<trace>]`
//! with `<trace>` `iommu` (the default) or `fragmenting`.
//!
//! It prints a checksum of every address the replay allocated (in order) and the
//! arena's statistics, so two builds can be compared for identical behaviour, and
//! the replay's pairs. Under `valgrind --tool=callgrind`, run it with `<pairs>` = N
//! and = 3N: the difference of the two instruction counts over 2N is the
//! instructions per free + alloc pair, with the trace generation and the fill
//! cancelled out.

use std::sync::Arc;

use gmem_core::platform::Platform;
use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};

const PAGE: u64 = 4096;
const BASE: u64 = 1 << 32;
const LIVE: usize = 65_536;
/// Steps in a trace, replayed cyclically (as the bench does).
const TRACE_STEPS: usize = 1 << 20;

/// One CPU, as the bench's single-threaded rows use.
struct OneCpu;

impl Platform for OneCpu {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// A trace: the pages of each initial range, the (slot, pages) steps, the space in pages.
type Trace = (Vec<u64>, Vec<(u32, u32)>, u64);

/// The bench's iommu trace: orders 0..=5 of pages, FIFO-ish frees.
fn iommu_trace(live: usize, seed: u64) -> Trace {
    let mut s = seed;
    let mut size = move || {
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
            (((k + jitter) % live) as u32, size() as u32)
        })
        .collect();
    (initial, steps, live as u64 * 32 * 2)
}

/// The bench's fragmenting trace: mixed sizes up to 128 pages, random frees, a space
/// 1.25x the peak live total.
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
    let steps = (0..TRACE_STEPS)
        .map(|_| {
            let (pages, r) = size();
            let slot = (r % live as u64) as u32;
            live_pages = live_pages - cur[slot as usize] + pages;
            cur[slot as usize] = pages;
            peak = peak.max(live_pages);
            (slot, pages as u32)
        })
        .collect();
    (initial, steps, peak + peak / 4)
}

/// FNV-1a over one more address.
fn mix(h: u64, a: u64) -> u64 {
    (h ^ a).wrapping_mul(0x100_0000_01b3)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: usize = args
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1_000_000);
    let (initial, steps, space) = match args.next().as_deref() {
        None | Some("iommu") => iommu_trace(LIVE, 0x10_3300),
        Some("fragmenting") => fragmenting_trace(LIVE, 0xf4a9_3e11),
        Some(other) => {
            eprintln!("shared_hits: trace is iommu or fragmenting, got {other:?}");
            std::process::exit(2);
        }
    };
    let cfg = ArenaConfig {
        qcache_max: 128 * PAGE,
        magazines: true,
        check_frees: false,
        fit: FitPolicy::InstantFit,
        ..ArenaConfig::new(PAGE)
    };
    let platform: Arc<dyn Platform> = Arc::new(OneCpu);
    let arena = Arc::new(Arena::new(cfg, Some(platform)).expect("config"));
    arena.add_span(BASE, space * PAGE).expect("span");

    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut failures = 0u64;
    let mut slots: Vec<Option<(u64, u64)>> = initial
        .iter()
        .map(|&p| {
            let r = arena.alloc(p * PAGE).ok().map(|a| (a, p * PAGE));
            failures += u64::from(r.is_none());
            r
        })
        .collect();
    for &(slot, pages) in steps.iter().cycle().take(pairs) {
        let slot = &mut slots[slot as usize];
        if let Some((a, size)) = slot.take() {
            arena.free(a, size).expect("free of a live range");
        }
        let size = u64::from(pages) * PAGE;
        *slot = match arena.alloc(size) {
            Ok(a) => {
                hash = mix(hash, a);
                Some((a, size))
            }
            Err(_) => {
                failures += 1;
                None
            }
        };
    }
    println!("pairs {pairs} failures {failures} addresses {hash:#018x}");
    println!("{:?}", arena.stats());
}
