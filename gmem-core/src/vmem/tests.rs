//! Arena-level tests: configuration, the cache paths (stacks and magazines on a fake
//! multi-CPU platform), reaping, failure injection, and every error path leaving the
//! arena unchanged.

extern crate std;

use alloc::sync::Arc;
use alloc::vec::Vec;
use alloc::{format, vec};

use super::*;
use crate::sync::AtomicUsize;

const Q: u64 = 0x1000;

/// A platform whose current CPU is whatever the test set last.
struct FakeCpus {
    cpu: AtomicUsize,
    count: usize,
}

impl Platform for FakeCpus {
    fn current_cpu(&self) -> usize {
        self.cpu.load(Ordering::Relaxed)
    }
    fn cpu_count(&self) -> usize {
        self.count
    }
}

fn fake(count: usize) -> Arc<FakeCpus> {
    Arc::new(FakeCpus {
        cpu: AtomicUsize::new(0),
        count,
    })
}

fn config(qcache_quanta: u64, magazines: bool, check_frees: bool) -> ArenaConfig {
    ArenaConfig {
        qcache_max: qcache_quanta * Q,
        magazines,
        check_frees,
        ..ArenaConfig::new(Q)
    }
}

fn arena(cfg: ArenaConfig, span: u64) -> Arena {
    let a = Arena::new(cfg, None).unwrap();
    a.add_span(0x1000_0000, span).unwrap();
    a
}

/// Every cache mode: none, stacks (checked, trusted), magazines (checked, trusted).
fn all_modes() -> Vec<ArenaConfig> {
    vec![
        config(0, false, true),
        config(4, false, true),
        config(4, false, false),
        config(4, true, true),
        config(4, true, false),
    ]
}

fn balanced(a: &Arena) -> ArenaStats {
    let s = a.stats();
    assert_eq!(s.total, s.allocated + s.cached + s.free, "{s:?}");
    a.check().unwrap();
    s
}

/// Stats without the failure counter, which errors are allowed to bump.
fn space(a: &Arena) -> ArenaStats {
    ArenaStats {
        failures: 0,
        ..balanced(a)
    }
}

#[test]
fn arena_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Arena>();
}

#[test]
fn new_rejects_bad_quantum_and_bad_qcache_max() {
    for quantum in [0, 3, 0x1800] {
        assert_eq!(
            Arena::new(ArenaConfig::new(quantum), None).err(),
            Some(ArenaError::BadQuantum { quantum })
        );
    }
    for qcache_max in [0x800, 0x1800, (MAX_QCACHE_CLASSES + 1) * Q] {
        let cfg = ArenaConfig {
            qcache_max,
            ..ArenaConfig::new(Q)
        };
        assert_eq!(
            Arena::new(cfg, None).err(),
            Some(ArenaError::BadQcacheMax { qcache_max })
        );
    }
    assert!(Arena::new(config(64, true, true), None).is_ok());
    assert_eq!(ArenaConfig::new(Q).fit, FitPolicy::default());
    assert_eq!(Constraint::new(Q).max, u64::MAX);
}

#[test]
fn allocation_errors_are_typed_and_counted() {
    for cfg in all_modes() {
        let a = arena(cfg, 8 * Q);
        assert_eq!(a.alloc(0), Err(AllocError::ZeroSize));
        assert_eq!(
            a.alloc(Q + 1),
            Err(AllocError::Unaligned {
                size: Q + 1,
                quantum: Q
            })
        );
        assert_eq!(a.alloc(16 * Q), Err(AllocError::NoSpace { size: 16 * Q }));
        let mut c = Constraint::new(Q);
        c.align = 3 * Q;
        assert_eq!(
            a.xalloc(&c),
            Err(AllocError::BadConstraint {
                reason: ConstraintProblem::AlignNotPowerOfTwo
            })
        );
        let s = balanced(&a);
        assert_eq!((s.failures, s.allocs, s.allocated), (4, 0, 0));
        let empty = Arena::new(cfg, None).unwrap();
        assert_eq!(empty.alloc(Q), Err(AllocError::NoSpace { size: Q }));
    }
}

#[test]
fn every_free_error_leaves_state_and_later_allocations_unchanged() {
    for cfg in all_modes() {
        let twins = [arena(cfg, 64 * Q), arena(cfg, 64 * Q)];
        let mut held = Vec::new();
        for a in &twins {
            held = [Q, 2 * Q, 8 * Q, 3 * Q]
                .iter()
                .map(|&s| (a.alloc(s).unwrap(), s))
                .collect();
            let (x, s) = held[3];
            a.free(x, s).unwrap();
        }
        let (small, big, freed) = (held[0], held[2], held[3]);
        let a = &twins[0];
        let before = space(a);
        assert_eq!(
            a.free(small.0 + 1, Q),
            Err(FreeError::Unaligned {
                addr: small.0 + 1,
                size: Q
            })
        );
        assert_eq!(
            a.free(small.0, 0),
            Err(FreeError::Unaligned {
                addr: small.0,
                size: 0
            })
        );
        assert_eq!(
            a.free(big.0 + Q, 7 * Q),
            Err(FreeError::NotAllocated { addr: big.0 + Q })
        );
        assert_eq!(
            a.free(0x10, 0x10),
            Err(FreeError::Unaligned {
                addr: 0x10,
                size: 0x10
            })
        );
        assert_eq!(a.free(0, 16 * Q), Err(FreeError::NotAllocated { addr: 0 }));
        assert_eq!(
            a.free(big.0, 9 * Q),
            Err(FreeError::SizeMismatch {
                addr: big.0,
                allocated: 8 * Q,
                given: 9 * Q
            })
        );
        if cfg.check_frees || cfg.qcache_max == 0 {
            // Double free and wrong-size free of cached sizes are caught too (without
            // check_frees they are trusted and would enter a cache).
            assert_eq!(
                a.free(big.0, 4 * Q),
                Err(FreeError::SizeMismatch {
                    addr: big.0,
                    allocated: 8 * Q,
                    given: 4 * Q
                })
            );
            assert_eq!(
                a.free(freed.0, freed.1),
                Err(FreeError::NotAllocated { addr: freed.0 }),
                "{cfg:?}"
            );
            let e = a.free(small.0, 2 * Q).unwrap_err();
            assert!(
                matches!(e, FreeError::SizeMismatch { allocated: Q, given, .. } if given == 2 * Q),
                "{cfg:?}: {e:?}"
            );
        }
        assert_eq!(space(a), before, "{cfg:?}");
        assert_eq!(
            a.stats().failures,
            0,
            "free errors are not allocation failures"
        );
        let seq = |a: &Arena| -> Vec<Result<u64, AllocError>> {
            [Q, 5 * Q, 3 * Q, 40 * Q, 2 * Q]
                .iter()
                .map(|&s| a.alloc(s))
                .collect()
        };
        assert_eq!(seq(&twins[0]), seq(&twins[1]), "{cfg:?}");
    }
}

#[test]
fn allocation_errors_leave_state_and_later_allocations_unchanged() {
    for cfg in all_modes() {
        let twins = [arena(cfg, 32 * Q), arena(cfg, 32 * Q)];
        for a in &twins {
            a.alloc(2 * Q).unwrap();
            a.alloc(9 * Q).unwrap();
        }
        let a = &twins[0];
        let before = space(a);
        let _ = a.alloc(0);
        let _ = a.alloc(Q / 2);
        assert_eq!(a.alloc(64 * Q), Err(AllocError::NoSpace { size: 64 * Q }));
        let mut c = Constraint::new(2 * Q);
        c.min = 0x2000_0000;
        assert_eq!(a.xalloc(&c), Err(AllocError::NoSpace { size: 2 * Q }));
        a.set_fail_every(1);
        assert_eq!(a.alloc(Q), Err(AllocError::Injected));
        assert_eq!(a.xalloc(&Constraint::new(Q)), Err(AllocError::Injected));
        a.set_fail_every(0);
        // A failed allocation reaps the caches before giving up (which only moves
        // free space from the caches to the arena): reap the twin too, then the two
        // must be indistinguishable.
        twins[1].reap();
        assert_eq!(space(a), space(&twins[1]), "{cfg:?}");
        assert_eq!(space(a).allocated, before.allocated);
        let seq = |a: &Arena| -> Vec<Result<u64, AllocError>> {
            [Q, 3 * Q, 7 * Q, 2 * Q]
                .iter()
                .map(|&s| a.alloc(s))
                .collect()
        };
        assert_eq!(seq(&twins[0]), seq(&twins[1]), "{cfg:?}");
    }
}

#[test]
fn failure_injection_fails_every_nth_attempt_and_changes_nothing() {
    let a = arena(config(4, true, true), 64 * Q);
    a.set_fail_every(3);
    let results: Vec<bool> = (0..9).map(|_| a.alloc(Q).is_ok()).collect();
    assert_eq!(
        results,
        [true, true, false, true, true, false, true, true, false]
    );
    let s = balanced(&a);
    assert_eq!((s.allocs, s.failures, s.allocated), (6, 3, 6 * Q));
    a.set_fail_every(0);
    assert!((0..10).all(|_| a.alloc(Q).is_ok()));
    // Invalid input is reported as such, not counted as an injection attempt.
    a.set_fail_every(2);
    assert_eq!(a.alloc(0), Err(AllocError::ZeroSize));
    assert!(a.alloc(Q).is_ok());
    assert_eq!(a.alloc(Q), Err(AllocError::Injected));
}

#[test]
fn reap_returns_every_cached_object_and_the_arena_coalesces() {
    for cfg in all_modes().into_iter().filter(|c| c.qcache_max != 0) {
        let a = arena(cfg, 256 * Q);
        let xs: Vec<(u64, u64)> = (0..40)
            .map(|i| {
                let s = (i % 4 + 1) * Q;
                (a.alloc(s).unwrap(), s)
            })
            .collect();
        for &(x, s) in &xs {
            a.free(x, s).unwrap();
        }
        let s = balanced(&a);
        assert!(s.cached > 0, "{cfg:?}");
        assert_eq!(s.allocated, 0);
        a.reap();
        let s = balanced(&a);
        assert_eq!((s.cached, s.allocated, s.free), (0, 0, 256 * Q), "{cfg:?}");
        assert_eq!((s.segments, s.free_segments), (1, 1));
        assert_eq!(s.allocs, 40);
        assert_eq!(s.frees, 40);
    }
}

#[test]
fn exhaustion_reaps_the_caches_and_retries_once() {
    for cfg in all_modes().into_iter().filter(|c| c.qcache_max != 0) {
        let a = arena(cfg, 64 * Q);
        let x = a.alloc(Q).unwrap();
        a.free(x, Q).unwrap();
        assert!(balanced(&a).cached > 0);
        // The whole span: only possible once the cached quanta went back.
        let all = a.alloc(64 * Q).unwrap();
        assert_eq!(balanced(&a).cached, 0);
        a.free(all, 64 * Q).unwrap();
        // Fill with 1 q objects through the cache; the last imports are partial.
        let xs: Vec<u64> = (0..64).map(|_| a.alloc(Q).unwrap()).collect();
        assert_eq!(a.alloc(Q), Err(AllocError::NoSpace { size: Q }));
        for x in xs {
            a.free(x, Q).unwrap();
        }
        // A 2 q class import on a cache-full arena reaps the 1 q class.
        assert!(a.alloc(2 * Q).is_ok(), "{cfg:?}");
        balanced(&a);
    }
}

#[test]
fn constrained_and_next_fit_allocations_bypass_the_caches_and_free_correctly() {
    for cfg in all_modes().into_iter().filter(|c| c.qcache_max != 0) {
        let a = arena(cfg, 64 * Q);
        let mut c = Constraint::new(2 * Q);
        c.align = 8 * Q;
        c.phase = 4 * Q;
        let x = a.xalloc(&c).unwrap();
        assert_eq!(x % (8 * Q), 4 * Q);
        let y = a.alloc_fit(Q, FitPolicy::NextFit).unwrap();
        let s = balanced(&a);
        assert_eq!((s.cached, s.cache_hits, s.cache_misses), (0, 0, 0));
        assert!(a.contains_allocated(x + Q) && a.contains_allocated(y));
        a.free(x, 2 * Q).unwrap();
        a.free(y, Q).unwrap();
        a.reap();
        let s = balanced(&a);
        assert_eq!(
            (s.allocated, s.free_segments, s.segments),
            (0, 1, 1),
            "{cfg:?}"
        );
        assert!(!a.contains_allocated(x));
    }
}

#[test]
fn magazines_serve_each_cpu_locally_and_balance_through_the_depot() {
    let cpus = fake(4);
    let platform: Arc<dyn Platform> = cpus.clone();
    let a = Arena::new(config(2, true, true), Some(platform)).unwrap();
    a.add_span(0, 4096 * Q).unwrap();
    // CPU 0 allocates 200 objects (misses import a magazine each), CPU 1 frees them.
    let xs: Vec<u64> = (0..200).map(|_| a.alloc(Q).unwrap()).collect();
    let s = balanced(&a);
    assert_eq!(s.cache_misses, 7, "200 objects = 7 imports of 32");
    assert_eq!(s.cache_hits, 193);
    cpus.cpu.store(1, Ordering::Relaxed);
    for &x in &xs {
        a.free(x, Q).unwrap();
    }
    let s = balanced(&a);
    assert!(s.depot_exchanges >= 4, "{s:?}");
    assert_eq!(s.allocated, 0);
    // CPU 2 has empty magazines: it is fed full magazines from the depot, no import.
    cpus.cpu.store(2, Ordering::Relaxed);
    let misses = s.cache_misses;
    let ys: Vec<u64> = (0..64).map(|_| a.alloc(Q).unwrap()).collect();
    assert_eq!(balanced(&a).cache_misses, misses);
    // A double free on another CPU is still caught.
    cpus.cpu.store(3, Ordering::Relaxed);
    a.free(ys[0], Q).unwrap();
    assert_eq!(
        a.free(ys[0], Q),
        Err(FreeError::NotAllocated { addr: ys[0] })
    );
    // A platform reporting an out-of-range CPU is folded into range, not a panic.
    cpus.cpu.store(1000, Ordering::Relaxed);
    for &y in &ys[1..] {
        a.free(y, Q).unwrap();
    }
    a.reap();
    let s = balanced(&a);
    assert_eq!((s.allocated, s.cached, s.free_segments), (0, 0, 1));
}

#[test]
fn concurrent_threads_on_distinct_cpus_keep_the_arena_consistent() {
    use std::cell::Cell;
    std::thread_local!(static CPU: Cell<usize> = const { Cell::new(0) });
    struct ThreadCpus;
    impl Platform for ThreadCpus {
        fn current_cpu(&self) -> usize {
            CPU.with(Cell::get)
        }
        fn cpu_count(&self) -> usize {
            4
        }
    }
    for magazines in [true, false] {
        let a =
            Arc::new(Arena::new(config(8, magazines, true), Some(Arc::new(ThreadCpus))).unwrap());
        a.add_span(0, 1 << 30).unwrap();
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    CPU.with(|c| c.set(t));
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    let mut live: Vec<(u64, u64)> = Vec::new();
                    for _ in 0..4000 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        if live.len() < 64 && rng % 3 != 0 {
                            let s = (rng >> 8) % 12 * Q + Q;
                            live.push((a.alloc(s).unwrap(), s));
                        } else if let Some((x, s)) = live.pop() {
                            a.free(x, s).unwrap();
                        }
                    }
                    for (x, s) in live {
                        a.free(x, s).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        a.reap();
        let s = balanced(&a);
        assert_eq!((s.allocated, s.cached, s.segments), (0, 0, 1));
        assert_eq!(s.allocs, s.frees);
    }
}

#[test]
fn trusted_frees_of_arena_allocations_into_a_cache_are_returned_by_reap() {
    let a = arena(config(4, true, false), 64 * Q);
    let mut c = Constraint::new(2 * Q);
    c.align = 16 * Q;
    let x = a.xalloc(&c).unwrap();
    a.free(x, 2 * Q).unwrap();
    assert_eq!(balanced(&a).cached, 2 * Q);
    a.reap();
    let s = balanced(&a);
    assert_eq!((s.cached, s.allocated, s.free_segments), (0, 0, 1));
}

#[test]
fn errors_display_their_values() {
    let shown = [
        format!("{}", ArenaError::BadQuantum { quantum: 3 }),
        format!(
            "{}",
            SpanError::Overlaps {
                base: 0x5000,
                size: Q
            }
        ),
        format!("{}", AllocError::NoSpace { size: 0x7000 }),
        format!(
            "{}",
            AllocError::BadConstraint {
                reason: ConstraintProblem::MinAboveMax
            }
        ),
        format!(
            "{}",
            FreeError::SizeMismatch {
                addr: 0x9000,
                allocated: Q,
                given: 2 * Q
            }
        ),
    ];
    assert!(shown[0].contains("0x3"));
    assert!(shown[1].contains("0x5000"));
    assert!(shown[2].contains("0x7000"));
    assert!(shown[3].contains("min is above max"));
    assert!(shown[4].contains("0x9000") && shown[4].contains("0x2000"));
}

/// Replay a seeded churn (free a random live range, allocate one of a random size from
/// `sizes`) on an uncached arena of `space` bytes with policy `fit`; returns the free
/// segments at the end, after checking the invariants.
fn churn_free_segments(fit: FitPolicy, sizes: &[u64], live: usize, space: u64) -> u64 {
    let a = arena(
        ArenaConfig {
            fit,
            ..config(0, false, true)
        },
        space,
    );
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut slots: Vec<(u64, u64)> = (0..live)
        .map(|_| {
            let size = sizes[(next() % sizes.len() as u64) as usize] * Q;
            (a.alloc(size).unwrap(), size)
        })
        .collect();
    for _ in 0..20 * live {
        let slot = &mut slots[(next() % live as u64) as usize];
        a.free(slot.0, slot.1).unwrap();
        let size = sizes[(next() % sizes.len() as u64) as usize] * Q;
        *slot = (a.alloc(size).unwrap(), size);
    }
    balanced(&a).free_segments
}

#[test]
fn instant_fit_keeps_free_segments_within_twice_best_fit_on_churn() {
    // The trace that shredded power-of-two instant-fit: 1..=32 pages, random frees,
    // four times the worst-case space.
    let sizes: Vec<u64> = (1..=32).collect();
    let live = 1000;
    let space = live as u64 * 32 * 4 * Q;
    let instant = churn_free_segments(FitPolicy::InstantFit, &sizes, live, space);
    let best = churn_free_segments(FitPolicy::BestFit, &sizes, live, space);
    assert!(
        instant <= 2 * best.max(4),
        "instant-fit {instant} free segments, best-fit {best}"
    );
    // Mixed sizes up to 128 pages in a space 1.25x the all-maximum-of-small set: the
    // same bound.
    let mixed: Vec<u64> = [1, 1, 2, 2, 3, 4, 5, 8, 13, 21, 32, 48, 64, 100, 128].to_vec();
    let space = live as u64 * 32 * 5 / 4 * Q * 2;
    let instant = churn_free_segments(FitPolicy::InstantFit, &mixed, live, space);
    let best = churn_free_segments(FitPolicy::BestFit, &mixed, live, space);
    assert!(
        instant <= 2 * best.max(4),
        "mixed: instant-fit {instant} free segments, best-fit {best}"
    );
}

#[test]
fn free_run_frees_split_pieces_at_once_and_refuses_what_is_not_allocated() {
    for cfg in all_modes() {
        let a = arena(cfg, 64 * Q);
        let fresh = space(&a);
        let c = Constraint {
            align: 16 * Q,
            ..Constraint::new(16 * Q)
        };
        let run = a.xalloc(&c).unwrap();
        a.split(run, 16 * Q, Q).unwrap();
        // One piece freed alone: the run is no longer whole, a free_run over it fails
        // and changes nothing (pieces of a cached size go through the cache one by
        // one, so only the uncached arena can promise that).
        a.free(run + 3 * Q, Q).unwrap();
        let before = space(&a);
        if cfg.qcache_max == 0 {
            assert_eq!(
                a.free_run(run, 16 * Q, Q),
                Err(FreeError::NotAllocated { addr: run + 3 * Q })
            );
            assert!(a.free_run(run, 16 * Q, 3 * Q).is_err());
            assert_eq!(space(&a), before);
        }
        a.free_run(run, 3 * Q, Q).unwrap();
        a.free_run(run + 4 * Q, 12 * Q, Q).unwrap();
        a.reap();
        let end = space(&a);
        assert_eq!(
            (
                end.free,
                end.segments,
                end.free_segments,
                end.allocs,
                end.frees
            ),
            (fresh.free, fresh.segments, fresh.free_segments, 16, 16),
            "{cfg:?}"
        );
        assert_eq!(balanced(&a).allocated, 0);
        // The whole span is one free segment again: the largest run fits.
        let again = a.xalloc(&Constraint::new(64 * Q)).unwrap();
        a.free(again, 64 * Q).unwrap();
    }
}

#[test]
fn exclusive_and_shared_operations_agree_on_every_mode() {
    // The same seeded sequence through `alloc_mut`/`free_mut` and through
    // `alloc`/`free`: the same addresses, the same counters, a consistent arena, and
    // the same typed errors (with nothing changed by them).
    for cfg in all_modes() {
        let mut ex = arena(cfg, 256 * Q);
        let sh = arena(cfg, 256 * Q);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut x = 0x9e37_79b9_u64;
        for step in 0..4000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if live.len() > 20 || (x & 1 == 0 && !live.is_empty()) {
                let (addr, size) = live.swap_remove((x >> 8) as usize % live.len());
                assert_eq!(
                    ex.free_mut(addr, size),
                    sh.free(addr, size),
                    "{cfg:?} {step}"
                );
                // A second free of the same range is an error in checked modes and in
                // uncached sizes; both paths must agree on it.
                if cfg.check_frees {
                    let e = ex.free_mut(addr, size);
                    assert!(e.is_err());
                    assert_eq!(e, sh.free(addr, size));
                }
            } else {
                let size = ((x >> 16) % 6 + 1) * Q;
                let a = ex.alloc_mut(size);
                assert_eq!(a, sh.alloc(size), "{cfg:?} {step}");
                if let Ok(addr) = a {
                    live.push((addr, size));
                }
            }
        }
        assert_eq!(ex.alloc_mut(0), sh.alloc(0));
        assert_eq!(ex.free_mut(0x1000_0001, Q), sh.free(0x1000_0001, Q));
        assert_eq!(ex.stats(), sh.stats(), "{cfg:?}");
        ex.check().unwrap();
        for (addr, size) in live {
            ex.free_mut(addr, size).unwrap();
        }
        ex.reap();
        let s = balanced(&ex);
        assert_eq!((s.free_segments, s.allocs), (1, s.frees), "{cfg:?}");
    }
}

#[test]
fn exclusive_allocations_honour_failure_injection() {
    let mut a = arena(config(4, true, false), 64 * Q);
    a.set_fail_every(2);
    assert!(a.alloc_mut(Q).is_ok());
    assert_eq!(a.alloc_mut(Q), Err(AllocError::Injected));
    assert!(a.alloc_mut(Q).is_ok());
    assert_eq!(a.stats().failures, 1);
}

#[test]
fn a_reap_on_exhaustion_is_counted_and_a_callers_reap_is_not() {
    let a = arena(config(2, true, false), 64 * Q);
    let ones: Vec<u64> = (0..64).map(|_| a.alloc(Q).unwrap()).collect();
    for &x in &ones {
        a.free(x, Q).unwrap();
    }
    // Every quantum sits in the 1-quantum class's magazines: a 2-quantum allocation
    // finds the segment layer empty, reaps, and succeeds.
    assert_eq!(balanced(&a).cached, 64 * Q);
    assert_eq!(balanced(&a).reaps, 0);
    let two = a.alloc(2 * Q).unwrap();
    let s = balanced(&a);
    assert_eq!(s.reaps, 1);
    a.free(two, 2 * Q).unwrap();
    a.reap();
    assert_eq!(
        balanced(&a).reaps,
        1,
        "a caller's reap is not an exhaustion"
    );
    // A request that no reap can serve: the caches are empty, nothing is counted.
    let _held: Vec<u64> = (0..64).map(|_| a.alloc(Q).unwrap()).collect();
    a.reap();
    assert!(a.alloc(2 * Q).is_err());
    assert_eq!(balanced(&a).reaps, 1);
}

#[test]
fn the_hit_path_honours_injection_next_fit_and_bad_sizes_with_warm_magazines() {
    // Trusted frees with magazines: the configuration whose cache hits take the
    // inlined hit path. Warm a magazine first so a hit would be possible.
    let mut a = arena(config(4, true, false), 64 * Q);
    let x = a.alloc(Q).unwrap();
    a.free(x, Q).unwrap();
    let hits = a.stats().cache_hits;
    assert_eq!(a.alloc(Q), Ok(x), "a warm hit");
    assert_eq!(a.stats().cache_hits, hits + 1);
    a.free(x, Q).unwrap();
    // Injection still fails every second attempt, on both entry points.
    a.set_fail_every(2);
    let shared: Vec<bool> = (0..4).map(|_| a.alloc(Q).is_ok()).collect();
    assert_eq!(shared, [true, false, true, false]);
    let excl: Vec<bool> = (0..4).map(|_| a.alloc_mut(Q).is_ok()).collect();
    assert_eq!(excl, [true, false, true, false]);
    a.set_fail_every(0);
    // Sizes the classes do not serve, and misaligned frees, still get typed errors
    // and change nothing.
    let before = space(&a);
    assert_eq!(
        a.alloc(Q + 1),
        Err(AllocError::Unaligned {
            size: Q + 1,
            quantum: Q
        })
    );
    assert_eq!(a.alloc_mut(0), Err(AllocError::ZeroSize));
    assert_eq!(
        a.free(x + 1, Q),
        Err(FreeError::Unaligned {
            addr: x + 1,
            size: Q
        })
    );
    assert_eq!(
        a.free_mut(x, Q / 2),
        Err(FreeError::Unaligned {
            addr: x,
            size: Q / 2
        })
    );
    assert_eq!(space(&a), before);
    // A next-fit arena never serves `alloc` from its caches, even when warm.
    let nf = arena(
        ArenaConfig {
            fit: FitPolicy::NextFit,
            ..config(4, true, false)
        },
        64 * Q,
    );
    let y = nf.alloc_fit(Q, FitPolicy::InstantFit).unwrap();
    nf.free(y, Q).unwrap();
    assert_ne!(nf.alloc(Q).unwrap(), y, "next fit moves on");
    assert_eq!(nf.stats().cache_hits, 0);
}
