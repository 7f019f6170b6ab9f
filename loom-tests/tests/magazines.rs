//! Loom model (a): the per-CPU magazines and the depot of a vmem arena's quantum
//! cache, on a fake two-CPU platform.
//!
//! Setup (one thread, no interleaving): an arena with one cached size class and
//! magazines; CPU 0 allocates 65 objects (three imports of 32 from the arena, 31 left
//! loaded), frees them all (its loaded and previous magazines fill, and one full
//! magazine is traded to the depot) and allocates 64 again, so both CPUs' magazines
//! are empty and the depot holds one full magazine. Two threads then run on CPUs 0 and 1
//! at once: each allocates (both want the depot's magazine: one gets it, the other
//! imports from the arena), frees an object handed to it, and allocates again.
//!
//! Checked: no object is held twice at the end (nothing handed out twice), and after
//! freeing everything and reaping, the arena is one free segment again (nothing lost).
//! Broken variant: `--cfg gmem_loom_bug="magazine_depot_race"` takes the depot's
//! magazine under two separate locks; the model must see an object handed out twice.

#![cfg(gmem_loom)]

mod common;

use std::cell::Cell;
use std::sync::Arc;

use gmem_core::vmem::{Arena, ArenaConfig, FitPolicy};
use gmem_core::Platform;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 4;
const Q: u64 = 4096;

loom::thread_local! {
    static CPU: Cell<usize> = Cell::new(0);
}

/// Two CPUs; each loom thread says which one it runs on.
struct TwoCpus;

impl Platform for TwoCpus {
    fn current_cpu(&self) -> usize {
        CPU.with(Cell::get)
    }
    fn cpu_count(&self) -> usize {
        2
    }
}

fn on_cpu(cpu: usize) {
    CPU.with(|c| c.set(cpu));
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "magazine_depot_race",
    should_panic(expected = "handed out twice")
)]
fn magazines_and_depot_hand_out_each_range_once_and_lose_none() {
    common::model("magazines", PREEMPTIONS, || {
        let config = ArenaConfig {
            quantum: Q,
            qcache_max: Q,
            magazines: true,
            check_frees: true,
            fit: FitPolicy::InstantFit,
        };
        let arena = Arc::new(Arena::new(config, Some(Arc::new(TwoCpus))).unwrap());
        arena.add_span(0x10_0000, 128 * Q).unwrap();
        on_cpu(0);
        let mut main: Vec<u64> = (0..65).map(|_| arena.alloc(Q).unwrap()).collect();
        for a in main.drain(..) {
            arena.free(a, Q).unwrap();
        }
        main.extend((0..64).map(|_| arena.alloc(Q).unwrap()));
        let st = arena.stats();
        assert_eq!(
            (st.depot_exchanges, st.cached),
            (1, 32 * Q),
            "setup: both CPUs' magazines empty, one full magazine in the depot"
        );
        let give: Vec<u64> = main.drain(..2).collect();

        let held = common::alloc_free_alloc_threads(&arena, give, Q, on_cpu, main);
        common::assert_each_once_then_all_back(&arena, held, Q);
    });
}
