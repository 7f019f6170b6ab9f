//! The translation-stream recorder and offline replayer, and the TLB invariant.

use gmem_sim::{replay, HierarchyStats, TlbHierarchy, TlbStats};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::{pages_needed, run, Size};

fn d(a: TlbStats, b: TlbStats) -> TlbStats {
    TlbStats {
        hits: b.hits - a.hits,
        misses: b.misses - a.misses,
        fills: b.fills - a.fills,
        evictions: b.evictions - a.evictions,
        invalidated: b.invalidated - a.invalidated,
        invalidations: b.invalidations - a.invalidations,
    }
}

fn check_replay(m: &SimtMachine, name: &str) {
    let before = m.gpu_mmu();
    m.start_recording();
    let o = run(m, name, Size::Quick).unwrap();
    assert!(o.verified, "{name}");
    let log = m.take_recording();
    let live = m.gpu_mmu();
    assert!(log.translations() > 0);
    let mut caches = TlbHierarchy::new(mesc_tlbs(MESC_UNITS)).unwrap();
    let r = replay(&mut caches, &log, 4);
    let (b, l): (HierarchyStats, HierarchyStats) = (before.caches, live.caches);
    assert_eq!(r.caches.l1, d(b.l1, l.l1), "{name}: L1");
    assert_eq!(r.caches.l2, d(b.l2, l.l2), "{name}: L2");
    assert_eq!(
        r.caches.walk_cache,
        d(b.walk_cache, l.walk_cache),
        "{name}: page-walk cache"
    );
    assert!(
        r.caches.walk_cache.hits > 0,
        "{name}: the walk cache was used"
    );
    assert_eq!(r.caches.walks, l.walks - b.walks, "{name}: walks");
    assert_eq!(r.caches.walk_reads, l.walk_reads - b.walk_reads, "{name}");
    assert_eq!(
        r.caches.walk_faults,
        l.walk_faults - b.walk_faults,
        "{name}"
    );
    assert_eq!(
        r.translations,
        live.translations - before.translations,
        "{name}"
    );
    // A smaller shared TLB changes the counters: the replay really models the caches.
    let mut small = mesc_tlbs(MESC_UNITS);
    small.l2 = Some(gmem_sim::TlbConfig::new(4, 4, gmem_sim::Replacement::Lru));
    let mut caches = TlbHierarchy::new(small).unwrap();
    let s = replay(&mut caches, &log, 4);
    assert!(
        s.caches.l2.hits < r.caches.l2.hits,
        "{name}: smaller L2, fewer hits"
    );
    // Without a page-walk cache every walk reads the whole depth.
    let mut none = mesc_tlbs(MESC_UNITS);
    none.walk_cache = None;
    let mut caches = TlbHierarchy::new(none).unwrap();
    let w = replay(&mut caches, &log, 4);
    assert_eq!(w.caches.walks, r.caches.walks, "{name}");
    assert!(
        w.caches.walk_reads > r.caches.walk_reads,
        "{name}: no walk cache, more table reads"
    );
    assert_eq!(w.caches.walk_cache, TlbStats::default());
}

#[test]
fn replaying_a_recorded_stream_gives_the_live_counters() {
    // Integrated (no faults, shared table) and discrete (faults, migrations and
    // invalidations in the stream).
    for name in ["atax", "bfs-rmat"] {
        check_replay(
            &SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap(),
            name,
        );
        let p = pages_needed(name, Size::Quick) + 1024;
        let m = SimtMachine::new(p, GpuKind::Discrete { pages: p }, mesc_tlbs(MESC_UNITS)).unwrap();
        check_replay(&m, name);
    }
}

#[test]
fn replay_equals_live_with_timed_walks_and_scoreboarded_loads() {
    // Timed walks: non-blocking loads leave the walk queue out of issue order with the
    // warp's other instructions; the stream is recorded as the MMU sees it.
    for name in ["atax", "bfs-rmat"] {
        let mut m = SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap();
        m.cost.timed_walks = true;
        check_replay(&m, name);
    }
}

#[test]
fn every_cached_translation_equals_a_fresh_walk_after_runs_and_migrations() {
    let p = pages_needed("bfs-uniform", Size::Quick) + 1024;
    // Video memory for about half the data: the core evicts while the GPU runs.
    let m = SimtMachine::new(p, GpuKind::Discrete { pages: p / 2 }, mesc_tlbs(MESC_UNITS)).unwrap();
    let o = run(&m, "bfs-uniform", Size::Quick).unwrap();
    assert!(o.verified);
    let span = || {
        let lo = 1u64 << 32;
        (lo..lo + (p << 12)).step_by(4096)
    };
    let checked = m.audit_tlbs(span()).unwrap();
    assert!(checked > 0);
    // Another workload on the same GPU: video memory is full, so the core evicts the
    // BFS pages (unmap, invalidate, copy) while the GPU runs; check again.
    let o = run(&m, "vectoradd", Size::Quick).unwrap();
    assert!(o.verified);
    assert!(m.audit_tlbs(span()).unwrap() > 0);
    assert!(
        m.port().stats().faults > 0,
        "data faulted over to the discrete GPU"
    );
}
