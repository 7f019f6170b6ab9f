//! Loom model: free announcements (`Arena::prefetch_free`) racing frees and
//! allocations of an uncached arena.
//!
//! An announcement takes the segment lock only when it is free (`try_lock`) and
//! changes nothing under it but its own prefetch ring. Two threads run at once: one
//! announces three frees (one of a segment the other thread frees meanwhile, one of
//! an address never allocated) and then makes its own announced free; the other
//! frees a segment and allocates again.
//!
//! Checked: every free succeeds, no range is handed out twice, and after everything
//! is freed the arena is one free segment again (nothing lost, nothing corrupted),
//! whichever thread held the lock when an announcement came.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;
const Q: u64 = 4096;

#[test]
fn announcements_race_frees_without_changing_them() {
    common::model("announce", PREEMPTIONS, || {
        let config = ArenaConfig {
            quantum: Q,
            qcache_max: 0,
            magazines: false,
            check_frees: true,
            fit: FitPolicy::InstantFit,
        };
        let arena = Arc::new(Arena::new(config, None).unwrap());
        arena.add_span(0x10_0000, 16 * Q).unwrap();
        let a = arena.alloc(Q).unwrap();
        let b = arena.alloc(2 * Q).unwrap();
        let c = arena.alloc(Q).unwrap();

        let announcer = {
            let arena = arena.clone();
            loom::thread::spawn(move || {
                arena.prefetch_free(b, 2 * Q);
                arena.prefetch_free(0x10_0000 + 15 * Q, Q);
                arena.prefetch_free(a, Q);
                arena.free(a, Q).unwrap();
            })
        };
        let freer = {
            let arena = arena.clone();
            loom::thread::spawn(move || {
                arena.free(b, 2 * Q).unwrap();
                arena.alloc(3 * Q).unwrap()
            })
        };
        announcer.join().unwrap();
        let d = freer.join().unwrap();

        assert_ne!(d, c, "range handed out twice");
        arena.free(c, Q).unwrap();
        arena.free(d, 3 * Q).unwrap();
        let s = arena.stats();
        assert_eq!(
            (s.allocated, s.segments, s.free_segments),
            (0, 1, 1),
            "every range came back and coalesced: {s:?}"
        );
        assert_eq!(s.allocs, s.frees);
    });
}
