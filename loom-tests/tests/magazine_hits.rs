//! Loom model (b): the shared hit path of a vmem arena's per-CPU magazines, two
//! threads on one CPU record.
//!
//! The hit path (`Arena::alloc`/`Arena::free` with magazines and trusted frees) takes
//! the CPU record's lock with `try_lock`, pops or pushes one round, and falls back to
//! the full path (which waits for the lock, trades with the depot or imports) when
//! the lock is held or the stack is empty or full. Two threads that report the same
//! CPU (here: an arena without a platform, so every thread is CPU 0) race on one
//! record, so loom explores hits against hits, failed `try_lock`s that take the full
//! path, and hits against a depot trade.
//!
//! Setup (one thread, no interleaving): an arena with one cached size class (32-round
//! magazines); 65 allocations (three imports of 32 from the arena, 31 rounds left
//! cached), then 33 of them freed, so the CPU's two magazines are full (64 rounds)
//! and the depot is empty. Two threads then each allocate, free an object handed to
//! them, and allocate again: the first free of either finds both magazines full and
//! trades one with the depot under the record's lock, while the other thread's hits
//! try the same lock.
//!
//! Checked: no object is held twice at the end (nothing handed out twice), and after
//! freeing everything and reaping, the arena is one free segment again (nothing lost),
//! with as many allocations as frees counted.
//! Broken variant: `--cfg gmem_loom_bug="magazine_hit_split"` reads the top round
//! under one critical section and takes it under another; the model must see an
//! object handed out twice.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};

/// Preemption bound of this model.
const PREEMPTIONS: usize = 4;
const Q: u64 = 4096;

#[test]
#[cfg_attr(
    gmem_loom_bug = "magazine_hit_split",
    should_panic(expected = "handed out twice")
)]
fn shared_hits_on_one_record_hand_out_each_range_once_and_lose_none() {
    common::model("magazine_hits", PREEMPTIONS, || {
        let config = ArenaConfig {
            quantum: Q,
            qcache_max: Q,
            magazines: true,
            check_frees: false,
            fit: FitPolicy::InstantFit,
        };
        let arena = Arc::new(Arena::new(config, None).unwrap());
        arena.add_span(0x10_0000, 128 * Q).unwrap();
        let mut main: Vec<u64> = (0..65).map(|_| arena.alloc(Q).unwrap()).collect();
        for a in main.drain(..33) {
            arena.free(a, Q).unwrap();
        }
        let st = arena.stats();
        assert_eq!(
            (st.depot_exchanges, st.cached, st.cache_misses),
            (0, 64 * Q, 3),
            "setup: both magazines of CPU 0 full, the depot empty"
        );
        let give: Vec<u64> = main.drain(..2).collect();

        let held = common::alloc_free_alloc_threads(&arena, give, Q, |_| {}, main);
        common::assert_each_once_then_all_back(&arena, held, Q);
    });
}
