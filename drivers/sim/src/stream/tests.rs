//! The split replay against the one-pass replay on random streams.

use super::*;
use crate::hierarchy::HierarchyConfig;
use crate::mmu::replay;
use crate::tlb::{Replacement, TlbConfig};
use gmem_core::PhysAddr;

/// A random stream over a few pages of two roots: loads and stores by four units,
/// pages that are writable or unmapped, dirty bits set by stores, 2 MiB pages,
/// invalidations of changed pages, root invalidations and flushes. One seed in three
/// is hostile to the split: read-only pages (a store hits a shared-TLB entry that
/// forbids it) and rare changes without an invalidation (a cached leaf that
/// differs from the answer). With `sticky`, a unit asks for the page of its previous
/// request three times in four (the L1 pass's memo of the last entry).
fn random_log(seed: u64, len: usize, sticky: bool) -> TraceLog {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    // Per root and page: Some((prot, dirty)) or unmapped; pages 0..24 of 4 KiB, 24..28 of 2 MiB.
    let mut spaces: Vec<Vec<Option<(Prot, bool)>>> =
        vec![(0..28).map(|_| Some((Prot::RW, false))).collect(); 2];
    let va_of = |p: u64| if p < 24 { p << 12 } else { (p - 23) << 21 };
    let shift_of = |p: u64| if p < 24 { 12 } else { 21 };
    let hostile = seed % 3 == 0;
    let mut log = TraceLog::default();
    let mut last = [None; 4];
    for _ in 0..len {
        let r = next(1000);
        let space = usize::from(next(8) == 0);
        let root = 0x1000 * (1 + space as u64);
        let pages = &mut spaces[space];
        if r < 20 {
            // Change a page and invalidate it (or, rarely, do not).
            let p = next(28);
            pages[p as usize] = match next(3) {
                0 => None,
                1 if hostile => Some((Prot::READ, false)),
                _ => Some((Prot::RW, false)),
            };
            if r >= 2 || !hostile {
                log.events.push(TraceEvent::Invalidate {
                    root,
                    first: log.ranges.len() as u32,
                    count: 1,
                });
                log.ranges.push((va_of(p), 1 << shift_of(p)));
            }
        } else if r < 23 {
            log.events.push(TraceEvent::InvalidateRoot { root });
        } else if r < 25 {
            log.events.push(TraceEvent::Flush);
        } else {
            let (unit, p) = if sticky {
                let u = next(4);
                let p = match last[u as usize] {
                    Some(p) if next(4) != 0 => p,
                    _ => next(28),
                };
                last[u as usize] = Some(p);
                (Some(u), p)
            } else {
                (None, next(28))
            };
            let access = if next(10) < 3 {
                Prot::WRITE
            } else {
                Prot::READ
            };
            // A store's walk sets the dirty bit of a writable leaf.
            if let Some((prot, dirty)) = pages[p as usize].as_mut() {
                if access == Prot::WRITE && prot.contains(Prot::WRITE) {
                    *dirty = true;
                }
            }
            let answer = pages[p as usize].map(|(prot, dirty)| Leaf {
                frame: PhysAddr::new(0x4000_0000 + va_of(p)),
                shift: shift_of(p),
                prot,
                dirty,
                local: false,
                bits: 0,
            });
            let walked = next(2) == 0;
            log.events.push(TraceEvent::Translate {
                unit: unit.unwrap_or_else(|| next(4)) as u32,
                root,
                va: va_of(p) + next(4096),
                access,
                answer,
                walked,
                reads: if walked { 1 + next(4) as u32 } else { 0 },
                writes: next(3) as u32,
                skipped: if walked { next(3) as u32 } else { 0 },
            });
        }
    }
    log
}

fn configs() -> Vec<HierarchyConfig> {
    let t = TlbConfig::new;
    let c = |l1, l2, walk_cache| HierarchyConfig {
        units: 4,
        l1,
        l2,
        walk_cache,
    };
    vec![
        c(
            t(1, 2, Replacement::Lru),
            Some(t(2, 2, Replacement::Lru)),
            Some(t(1, 4, Replacement::Lru)),
        ),
        c(
            t(2, 2, Replacement::Fifo),
            Some(t(1, 4, Replacement::Random { seed: 3 })),
            None,
        ),
        c(
            t(1, 4, Replacement::Lru),
            None,
            Some(t(2, 2, Replacement::Fifo)),
        ),
        c(
            t(1, 8, Replacement::Lru),
            Some(t(4, 8, Replacement::Lru)),
            Some(t(4, 4, Replacement::Lru)),
        ),
        HierarchyConfig {
            units: 6,
            ..c(
                t(1, 2, Replacement::Lru),
                Some(t(2, 4, Replacement::Fifo)),
                None,
            )
        },
    ]
}

#[test]
fn the_split_replay_counts_and_ends_as_the_one_pass_replay() {
    let (mut split, mut crossed) = (0, 0);
    for seed in 1..=60 {
        let log = random_log(seed, 3000, seed > 40);
        let stream = ReplayStream::new(&log, 4).unwrap();
        assert_eq!(stream.translations(), log.translations());
        for config in configs() {
            let mut one = TlbHierarchy::new(config).unwrap();
            let want = replay(&mut one, &log, 4);
            let mut compact = TlbHierarchy::new(config).unwrap();
            assert_eq!(stream.replay(&mut compact), want, "seed {seed}");
            let mut caches = TlbHierarchy::new(config).unwrap();
            let got = stream.replay_split(&mut caches);
            assert_eq!(got.stats, want, "seed {seed} {config:?} {:?}", got.path);
            for u in 0..config.units {
                assert_eq!(caches.l1_stats(u), one.l1_stats(u), "seed {seed} unit {u}");
            }
            // Same final state: replaying again from it counts the same.
            let again = replay(&mut one, &log, 4);
            assert_eq!(stream.replay_split(&mut caches).stats, again, "seed {seed}");
            match got.path {
                ReplayPath::Split => split += 1,
                ReplayPath::OnePass(Unsplit::CrossLevelFill { .. }) => crossed += 1,
                ReplayPath::OnePass(Unsplit::SharedL1) => unreachable!("4 units recorded"),
            }
        }
    }
    // Both paths ran: streams that split and streams with a fill across levels.
    assert!(
        split > 20 && crossed > 20,
        "split {split}, crossed {crossed}"
    );
}

#[test]
fn the_shared_pass_follows_the_original_interleaving_of_the_units() {
    // Units 0 and 1 touch pages 0..3 and 3..6 (read, then store through the clean
    // entry) in one order and in another with each unit's own order unchanged: the
    // shared TLB (two ways) sees a different sequence, so the counters differ.
    let t = |unit: u32, p: u64, access: Prot| TraceEvent::Translate {
        unit,
        root: 1,
        va: p << 12,
        access,
        answer: Some(Leaf {
            frame: PhysAddr::new(p << 12),
            shift: 12,
            prot: Prot::RW,
            dirty: access == Prot::WRITE,
            local: false,
            bits: 0,
        }),
        walked: true,
        reads: 4,
        writes: 0,
        skipped: 0,
    };
    let mut a = Vec::new();
    for round in 0..4 {
        let access = if round % 2 == 0 {
            Prot::READ
        } else {
            Prot::WRITE
        };
        for p in 0..3 {
            a.push(t(0, p, access));
            a.push(t(1, p + 3, access));
            a.push(t(1, p, access));
        }
    }
    // Unit 0's requests all first, then unit 1's.
    let mut b: Vec<TraceEvent> = a
        .iter()
        .copied()
        .filter(|e| matches!(e, TraceEvent::Translate { unit: 0, .. }))
        .collect();
    b.extend(
        a.iter()
            .copied()
            .filter(|e| matches!(e, TraceEvent::Translate { unit: 1, .. })),
    );
    let config = HierarchyConfig {
        units: 2,
        l1: TlbConfig::new(1, 2, Replacement::Lru),
        l2: Some(TlbConfig::new(1, 2, Replacement::Lru)),
        walk_cache: Some(TlbConfig::new(1, 2, Replacement::Lru)),
    };
    let mut results = Vec::new();
    for events in [a, b] {
        let log = TraceLog {
            events,
            ranges: Vec::new(),
        };
        let stream = ReplayStream::new(&log, 4).unwrap();
        let mut one = TlbHierarchy::new(config).unwrap();
        let want = replay(&mut one, &log, 4);
        let mut caches = TlbHierarchy::new(config).unwrap();
        let got = stream.replay_split(&mut caches);
        assert_eq!(got.stats, want);
        results.push((got.path, want));
    }
    assert_ne!(results[0].1.caches.l2, results[1].1.caches.l2);
    assert_eq!(results[0].1.caches.l1, results[1].1.caches.l1);
    assert_eq!(results[0].0, ReplayPath::Split);
}

#[test]
fn logs_beyond_the_compact_encoding_are_refused() {
    let e = |unit, writes| TraceEvent::Translate {
        unit,
        root: 1,
        va: 0,
        access: Prot::READ,
        answer: None,
        walked: true,
        reads: 4,
        writes,
        skipped: 0,
    };
    let log = |events| TraceLog {
        events,
        ranges: Vec::new(),
    };
    assert_eq!(
        ReplayStream::new(&log(vec![e(1 << 16, 0)]), 4).err(),
        Some(StreamError::TooManyUnits)
    );
    assert_eq!(
        ReplayStream::new(&log(vec![e(0, 16)]), 4).err(),
        Some(StreamError::TooManyWrites)
    );
    assert_eq!(
        ReplayStream::new(&log(vec![]), 9).err(),
        Some(StreamError::TooDeep { levels: 9 })
    );
    let roots = (0..257)
        .map(|r| TraceEvent::InvalidateRoot { root: r })
        .chain((0..257).map(|r| TraceEvent::Translate {
            unit: 0,
            root: r,
            va: 0,
            access: Prot::READ,
            answer: None,
            walked: true,
            reads: 4,
            writes: 0,
            skipped: 0,
        }))
        .collect();
    assert_eq!(
        ReplayStream::new(&log(roots), 4).err(),
        Some(StreamError::TooManyRoots)
    );
}
