//! The replay split by level against the one-pass replay, on recorded GPU streams and
//! several cache geometries.

use gmem_sim::{
    replay, HierarchyConfig, Replacement, ReplayPath, ReplayStream, TlbConfig, TlbHierarchy,
    Unsplit,
};
use gmem_simt::machine::{mesc_tlbs, GpuKind, SimtMachine, MESC_UNITS};
use gmem_simt::workloads::{pages_needed, run, Size};

/// Geometries: the MESC one, a small shared TLB (its state depends on how the units'
/// misses interleave), no walk cache, no shared TLB, random and FIFO replacement, tiny
/// L1s, more units than recorded, fewer units than `recorded` (one pass).
fn configs(recorded: usize) -> Vec<(&'static str, HierarchyConfig)> {
    let m = mesc_tlbs(MESC_UNITS);
    let lru = Replacement::Lru;
    vec![
        ("mesc", m),
        (
            "small-l2",
            HierarchyConfig {
                l2: Some(TlbConfig::new(4, 4, lru)),
                ..m
            },
        ),
        (
            "no-walk-cache",
            HierarchyConfig {
                walk_cache: None,
                ..m
            },
        ),
        ("no-l2", HierarchyConfig { l2: None, ..m }),
        (
            "random-l2-fifo-l1",
            HierarchyConfig {
                l1: TlbConfig::new(2, 8, Replacement::Fifo),
                l2: Some(TlbConfig::new(8, 16, Replacement::Random { seed: 7 })),
                ..m
            },
        ),
        (
            "tiny-l1",
            HierarchyConfig {
                l1: TlbConfig::new(1, 2, lru),
                ..m
            },
        ),
        (
            "32-units",
            HierarchyConfig {
                units: 2 * MESC_UNITS,
                ..m
            },
        ),
        (
            "fewer-units",
            HierarchyConfig {
                units: recorded.saturating_sub(1).max(1),
                ..m
            },
        ),
    ]
}

fn check(m: &SimtMachine, name: &str) -> Vec<(&'static str, ReplayPath)> {
    m.start_recording();
    assert!(run(m, name, Size::Quick).unwrap().verified, "{name}");
    let log = m.take_recording();
    let stream = ReplayStream::new(&log, 4).unwrap();
    assert_eq!(stream.translations(), log.translations());
    let mut paths = Vec::new();
    assert!(stream.units() > 1, "{name}: {} units", stream.units());
    for (label, config) in configs(stream.units()) {
        let mut old = TlbHierarchy::new(config).unwrap();
        let want = replay(&mut old, &log, 4);
        let mut one = TlbHierarchy::new(config).unwrap();
        assert_eq!(
            stream.replay(&mut one),
            want,
            "{name} {label}: compact one pass"
        );
        let mut split = TlbHierarchy::new(config).unwrap();
        let got = stream.replay_split(&mut split);
        assert_eq!(got.stats, want, "{name} {label}: split ({:?})", got.path);
        for u in 0..config.units {
            assert_eq!(
                split.l1_stats(u),
                old.l1_stats(u),
                "{name} {label}: unit {u}"
            );
        }
        // The caches end in the same state: a second replay from it counts the same.
        let again = replay(&mut old, &log, 4);
        assert_eq!(
            stream.replay_split(&mut split).stats,
            again,
            "{name} {label}: warm"
        );
        if label == "fewer-units" {
            assert_eq!(got.path, ReplayPath::OnePass(Unsplit::SharedL1));
        }
        paths.push((label, got.path));
    }
    paths
}

#[test]
fn the_split_replay_counts_as_the_one_pass_replay_on_recorded_streams() {
    for name in ["atax", "bfs-rmat"] {
        let paths = check(
            &SimtMachine::mesc(pages_needed(name, Size::Quick)).unwrap(),
            name,
        );
        // The integrated GPU's streams split in the recorded geometry.
        assert_eq!(paths[0], ("mesc", ReplayPath::Split), "{name}");
        eprintln!("{name} integrated: {paths:?}");
        let p = pages_needed(name, Size::Quick) + 1024;
        let m = SimtMachine::new(p, GpuKind::Discrete { pages: p }, mesc_tlbs(MESC_UNITS)).unwrap();
        let paths = check(&m, name);
        eprintln!("{name} discrete: {paths:?}");
    }
}
