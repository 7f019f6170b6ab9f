//! Loom model (i): `stats` racing `as_destroy`.
//!
//! The counters the fault path bumps under a space's lock live in that space's block
//! and are summed into `Gmem::stats` while the space is registered; `as_destroy` folds
//! the block into the global counters and unregisters the space in one hold of the
//! registry's write lock (see `gmem_core`'s `stats` module).
//!
//! Setup: the host attached to one space, two pages of it written by the host (two
//! zero-fill faults, counted in the space's block). Then one thread destroys the space
//! while another takes a snapshot. Checked: the snapshot, and one taken after both
//! threads end, show exactly the counts the faults made — none lost, none counted
//! twice. Broken variant `gmem_loom_bug="stats_fold_after_unregister"` unregisters the
//! space and folds its block only after releasing the registry: a snapshot in between
//! misses the space's counts.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;

/// The counters a space's block holds (the others are global and `as_destroy` itself
/// bumps some of them).
fn block(s: &Stats) -> [u64; 7] {
    [
        s.faults_zero_fill,
        s.faults_migrate,
        s.faults_remote,
        s.faults_map_existing,
        s.faults_spurious,
        s.pages_zeroed,
        s.mmu_maps,
    ]
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "stats_fold_after_unregister",
    should_panic(expected = "lost or double-counted")
)]
fn a_snapshot_racing_a_destroy_counts_the_space_once() {
    common::model("stats", PREEMPTIONS, || {
        let s = TestSystem::new(4);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
        let r =
            s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
                .unwrap();
        s.write(0, r.start, b"a").unwrap();
        s.write(0, VirtAddr::new(r.start.as_u64() + PAGE_SIZE), b"b")
            .unwrap();
        let before = s.gm.stats();
        assert_eq!(
            before.faults_zero_fill, 2,
            "the setup's two zero-fill faults"
        );
        let s = Arc::new(s);

        let destroyer = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.as_destroy(space).unwrap())
        };
        let during = s.gm.stats();
        destroyer.join().unwrap();
        let after = s.gm.stats();
        assert_eq!(
            block(&during),
            block(&before),
            "a snapshot racing the destroy lost or double-counted the space's counts"
        );
        assert_eq!(
            block(&after),
            block(&before),
            "the destroy lost or double-counted the space's counts"
        );
    });
}
