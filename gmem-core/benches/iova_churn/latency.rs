//! The host's floor under the growth curve: what one dependent random load costs in a
//! table about the size of the arena's at a million live ranges.
//!
//! A free of a random live range must read at least one cache line found from its
//! address (the allocated-segment hash slot) and, for most structures, a second one
//! found from the first (the record). When the tables are far larger than the
//! last-level cache, each such read is a memory access (and, with 4 KiB pages, a page
//! walk) that nothing in the free can overlap. This pointer chase measures that cost
//! on the machine and page size of the run, so the curve's growth can be read against
//! it: a pair costing `base` ns at 1k live ranges that waits on one such read at 1M
//! grows by at least `(base + load) / base`.

use std::time::Instant;

/// Bytes the chase runs through: about the arena's tables plus the bench's own
/// arrays at a million live ranges (47 MiB and 16 MiB).
pub const CHASE_BYTES: usize = 64 << 20;

/// One step of the chase per cache line: each line holds the index of the next.
#[repr(align(64))]
#[derive(Clone, Copy)]
struct Line(u64);

/// ns per dependent load through a random cyclic permutation of the cache lines of
/// `bytes` bytes (allocated through the bench's allocator, so `GMEM_BENCH_THP` applies
/// as it does to the allocators' tables); the median of three passes of `steps` loads.
pub fn dependent_load_ns(bytes: usize, steps: u64) -> f64 {
    let n = bytes / 64;
    let mut order: Vec<u64> = (0..n as u64).collect();
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        order.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let mut lines = vec![Line(0); n];
    for k in 0..n {
        lines[order[k] as usize] = Line(order[(k + 1) % n]);
    }
    drop(order);
    let mut passes: Vec<f64> = (0..3)
        .map(|_| {
            let mut at = 0u64;
            let start = Instant::now();
            for _ in 0..steps {
                at = lines[at as usize].0;
            }
            let ns = start.elapsed().as_nanos() as f64 / steps as f64;
            std::hint::black_box(at);
            ns
        })
        .collect();
    passes.sort_by(f64::total_cmp);
    passes[1]
}
