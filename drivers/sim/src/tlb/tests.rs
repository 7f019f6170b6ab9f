//! The TLB: hits, misses, replacement policies, page sizes, invalidation and refused configurations.

use super::*;

const P: u64 = 4096;

fn tlb(sets: usize, ways: usize, policy: Replacement) -> Tlb<u64> {
    Tlb::new(TlbConfig::new(sets, ways, policy)).unwrap()
}

#[test]
fn lru_evicts_the_least_recently_used_way() {
    let mut t = tlb(1, 2, Replacement::Lru);
    t.insert(0, 0, 12, 10);
    t.insert(0, P, 12, 11);
    assert_eq!(t.lookup(0, 0), Some((12, 10))); // page 0 is now most recent
    assert_eq!(t.insert(0, 2 * P, 12, 12), Some((0, P)));
    assert!(t.holds(0, 0) && !t.holds(0, P) && t.holds(0, 2 * P));
    assert_eq!(t.stats().evictions, 1);
}

#[test]
fn fifo_evicts_the_oldest_fill_whatever_was_used() {
    let mut t = tlb(1, 2, Replacement::Fifo);
    t.insert(0, 0, 12, 10);
    t.insert(0, P, 12, 11);
    assert_eq!(t.lookup(0, 0), Some((12, 10)));
    assert_eq!(t.insert(0, 2 * P, 12, 12), Some((0, 0)));
    assert!(!t.holds(0, 0) && t.holds(0, P));
}

#[test]
fn random_replacement_is_reproducible_from_its_seed_and_differs_across_seeds() {
    let run = |seed| {
        let mut t = tlb(1, 8, Replacement::Random { seed });
        (0..200u64)
            .filter_map(|i| t.insert(0, i * P, 12, i))
            .map(|(_, va)| va)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    assert_eq!(run(42).len(), 192);
}

#[test]
fn free_ways_fill_before_anything_is_evicted_and_sets_are_independent() {
    let mut t = tlb(4, 2, Replacement::Lru);
    for i in 0..8 {
        assert_eq!(t.insert(0, i * P, 12, i), None);
    }
    assert_eq!(t.len(), 8);
    // Page 8 maps to set 0 (pages 0 and 4 live there).
    assert!(matches!(t.insert(0, 8 * P, 12, 8), Some((0, va)) if va == 0 || va == 4 * P));
    assert!(t.holds(0, P) && t.holds(0, 7 * P));
}

#[test]
fn hits_and_misses_are_counted_per_lookup_and_asids_do_not_alias() {
    let mut t = tlb(2, 2, Replacement::Lru);
    t.insert(1, 0x5000, 12, 5);
    assert_eq!(t.lookup(1, 0x5abc), Some((12, 5)));
    assert_eq!(t.lookup(2, 0x5abc), None);
    assert_eq!(t.lookup(1, 0x6000), None);
    let s = t.stats();
    assert_eq!((s.hits, s.misses, s.fills), (1, 2, 1));
    assert!((s.hit_ratio() - 1.0 / 3.0).abs() < 1e-9);
}

#[test]
fn large_entries_cover_their_whole_page() {
    let mut t = tlb(8, 2, Replacement::Lru);
    t.insert(0, 0x20_0000, 21, 7);
    assert_eq!(t.lookup(0, 0x3f_f000), Some((21, 7)));
    assert_eq!(t.lookup(0, 0x40_0000), None);
    // A small invalidation inside the large page drops it.
    assert_eq!(t.invalidate(0, &[(0x30_0000, P)]), 1);
    assert!(!t.holds(0, 0x20_0000));
}

#[test]
fn range_invalidation_drops_exactly_the_overlapping_entries_of_the_asid() {
    for (sets, ways) in [(1, 32), (8, 4)] {
        let mut t = tlb(sets, ways, Replacement::Fifo);
        for i in 0..16 {
            t.insert(0, i * P, 12, i);
            t.insert(1, i * P, 12, i);
        }
        // Probing path (small list) and sweeping path (list bigger than the TLB).
        let big = [(0, 1 << 40)];
        let dropped = t.invalidate(0, &[(2 * P, 3 * P), (10 * P, P)]);
        assert_eq!(dropped, 4);
        for i in 0..16 {
            let gone = (2..5).contains(&i) || i == 10;
            assert_eq!(t.holds(0, i * P), !gone, "page {i}");
            assert!(t.holds(1, i * P));
        }
        assert_eq!(t.invalidate(1, &big), 16);
        assert_eq!(t.flush_asid(0), 12);
        assert!(t.is_empty());
        assert_eq!(t.stats().invalidated, 32);
    }
}

#[test]
fn remove_and_flush_drop_entries_and_count_them() {
    let mut t = tlb(4, 4, Replacement::Lru);
    t.insert(0, 0, 12, 1);
    t.insert(0, 0, 21, 2);
    assert_eq!(t.remove(0, 0x10), 2);
    t.insert(3, P, 12, 1);
    assert_eq!(t.flush(), 1);
    assert_eq!(t.stats().invalidated, 3);
}

/// The recency lists against a plain reference: per set a list of (asid, page)
/// ordered by last fill (FIFO) or use (LRU), the victim its oldest element.
#[test]
fn recency_lists_pick_the_same_victims_as_a_reference_model() {
    for policy in [Replacement::Lru, Replacement::Fifo] {
        for (sets, ways) in [(1, 32), (4, 4), (3, 2)] {
            let mut t = tlb(sets, ways, policy);
            let mut reference: Vec<Vec<(u64, u64)>> = vec![Vec::new(); sets];
            let mut x = 0x1234_5678_9abc_def1u64;
            for step in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (asid, page) = ((x >> 60) & 1, (x >> 8) % 97);
                let set = &mut reference[(page % sets as u64) as usize];
                let at = set.iter().position(|&e| e == (asid, page));
                match x % 5 {
                    0 | 1 => {
                        let got = t.lookup(asid, page * P).map(|(_, v)| v);
                        assert_eq!(got, at.map(|_| page), "step {step}");
                        if let (Some(i), Replacement::Lru) = (at, policy) {
                            let e = set.remove(i);
                            set.push(e);
                        }
                    }
                    2 => {
                        assert_eq!(t.remove(asid, page * P), u64::from(at.is_some()));
                        if let Some(i) = at {
                            set.remove(i);
                        }
                    }
                    _ => {
                        let evicted = t.insert(asid, page * P, 12, page);
                        let want = match at {
                            Some(i) => {
                                set.remove(i);
                                None
                            }
                            None if set.len() == ways => {
                                let (a, p) = set.remove(0);
                                Some((a, p * P))
                            }
                            None => None,
                        };
                        set.push((asid, page));
                        assert_eq!(evicted, want, "step {step}");
                    }
                }
            }
            assert_eq!(t.len(), reference.iter().map(Vec::len).sum::<usize>());
        }
    }
}

/// Lookups in TLBs holding several page sizes and asids at once (pages below 4 KiB,
/// 2 MiB, 1 GiB and beyond 2^44 bytes; addresses above bit 44, where probe words alias)
/// against a plain reference: the entry found is the smallest page holding the address
/// for the asid, and replacement follows per-set recency as in the test above.
#[test]
fn mixed_page_sizes_and_asids_find_the_smallest_entry_as_a_reference_model() {
    const SHIFTS: [u8; 5] = [10, 12, 21, 30, 45];
    const ASIDS: [u64; 4] = [0, 1, 5, 1 << 33];
    for policy in [Replacement::Lru, Replacement::Fifo] {
        for (sets, ways) in [(1, 32), (1, 70), (1, 5), (4, 6)] {
            let mut t = tlb(sets, ways, policy);
            // Per set: (asid, tag, shift), oldest first.
            let mut reference: Vec<Vec<(u64, u64, u8)>> = vec![Vec::new(); sets];
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for step in 0..40_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let hi = [0u64, 1, 0x7f][(x >> 20) as usize % 3] << 44;
                let va = hi | ((x >> 24) % (16 << 20));
                let asid = ASIDS[(x >> 8) as usize % 4];
                let value = |tag: u64, shift: u8| tag.wrapping_mul(64) | u64::from(shift);
                match x % 5 {
                    0 | 1 => {
                        let best = reference
                            .iter()
                            .enumerate()
                            .flat_map(|(s, set)| {
                                set.iter().enumerate().map(move |(i, e)| (s, i, *e))
                            })
                            .filter(|&(_, _, (a, tag, sh))| a == asid && tag == va >> sh)
                            .min_by_key(|&(_, _, (_, _, sh))| sh);
                        let got = t.lookup(asid, va);
                        assert_eq!(
                            got,
                            best.map(|(_, _, (_, tag, sh))| (sh, value(tag, sh))),
                            "step {step}"
                        );
                        if let (Some((s, i, _)), Replacement::Lru) = (best, policy) {
                            let e = reference[s].remove(i);
                            reference[s].push(e);
                        }
                    }
                    2 => {
                        let before: usize = reference.iter().map(Vec::len).sum();
                        for set in &mut reference {
                            set.retain(|&(a, tag, sh)| !(a == asid && tag == va >> sh));
                        }
                        let after: usize = reference.iter().map(Vec::len).sum();
                        assert_eq!(t.remove(asid, va), (before - after) as u64, "step {step}");
                    }
                    _ => {
                        let sh = SHIFTS[(x >> 4) as usize % SHIFTS.len()];
                        let tag = va >> sh;
                        let set = &mut reference[(tag % sets as u64) as usize];
                        let at = set.iter().position(|&e| e == (asid, tag, sh));
                        let want = match at {
                            Some(i) => {
                                set.remove(i);
                                None
                            }
                            None if set.len() == ways => {
                                let (a, old, osh) = set.remove(0);
                                Some((a, old << osh))
                            }
                            None => None,
                        };
                        set.push((asid, tag, sh));
                        assert_eq!(t.insert(asid, va, sh, value(tag, sh)), want, "step {step}");
                    }
                }
            }
            assert_eq!(t.len(), reference.iter().map(Vec::len).sum::<usize>());
        }
    }
}

#[test]
fn empty_or_huge_geometries_are_rejected() {
    assert_eq!(
        Tlb::<u64>::new(TlbConfig::new(0, 4, Replacement::Lru)).err(),
        Some(TlbConfigError::Empty)
    );
    assert_eq!(
        Tlb::<u64>::new(TlbConfig::new(1 << 20, 2, Replacement::Lru)).err(),
        Some(TlbConfigError::TooLarge { entries: 1 << 21 })
    );
}

/// [`Tlb::lookup_ref_recent`] against [`Tlb::lookup_ref`] on twin TLBs: the same
/// answers, counters and later victims (so the same recency order), through runs of
/// repeated pages (its fast path), other pages, removals, flushes and, at times, a
/// second page size (its fallback). A third twin asks [`Tlb::lookup_repeated`] first
/// and [`Tlb::lookup_ref_recent`] when it says nothing (as
/// `TlbHierarchy::lookup_level` does): the same again.
#[test]
fn the_recent_slot_fast_path_is_the_plain_lookup() {
    for policy in [Replacement::Lru, Replacement::Fifo] {
        for (sets, ways) in [(1, 32), (4, 4), (3, 2)] {
            let (mut a, mut b) = (tlb(sets, ways, policy), tlb(sets, ways, policy));
            let mut c = tlb(sets, ways, policy);
            let mut answered = 0u64;
            let mut x = 0x0dd_ba11_cafe_f00du64;
            let mut page = 0;
            let (mut prev, mut repeats) = (None, 0);
            for step in 0..30_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x % 4 == 0 {
                    // A new page; otherwise the run on the last one goes on.
                    page = (x >> 8) % 61;
                }
                let asid = (x >> 62) & 1;
                let va = page * P + (x >> 20) % P;
                match (x >> 32) % 16 {
                    0..=9 => {
                        let got = b.lookup_ref_recent(asid, va).copied();
                        assert_eq!(a.lookup_ref(asid, va).copied(), got, "step {step}");
                        let split = match c.lookup_repeated(asid, va).copied() {
                            Some(v) => {
                                answered += 1;
                                Some(v)
                            }
                            None => c.lookup_ref_recent(asid, va).copied(),
                        };
                        assert_eq!(split, got, "step {step}");
                        // A hit on the page of the lookup before: the fast path's case.
                        repeats += u64::from(got.is_some() && prev == Some((asid, page)));
                        prev = Some((asid, page));
                    }
                    10..=12 => {
                        let e = a.insert(asid, va, 12, page);
                        assert_eq!(b.insert(asid, va, 12, page), e, "step {step}");
                        assert_eq!(c.insert(asid, va, 12, page), e, "step {step}");
                    }
                    13 => {
                        let e = a.remove(asid, va);
                        assert_eq!(b.remove(asid, va), e, "step {step}");
                        assert_eq!(c.remove(asid, va), e, "step {step}");
                    }
                    14 => {
                        let e = a.insert(asid, va, 21, page);
                        assert_eq!(b.insert(asid, va, 21, page), e, "step {step}");
                        assert_eq!(c.insert(asid, va, 21, page), e, "step {step}");
                    }
                    _ => {
                        if x % 7 == 0 {
                            let e = a.flush();
                            assert_eq!(b.flush(), e);
                            assert_eq!(c.flush(), e);
                        }
                    }
                }
                assert_eq!(a.stats(), b.stats(), "step {step}");
                assert_eq!(a.stats(), c.stats(), "step {step}");
            }
            assert!(repeats > 100, "{repeats} repeated hits");
            assert!(answered > 100, "{answered} answered by lookup_repeated");
        }
    }
}

/// A clone keeps each set's recency order and is separate: after the clone, the
/// original and the clone evict the same victims in turn, and what one of them fills
/// the other does not hold.
#[test]
fn a_clone_keeps_the_recency_order_and_is_separate() {
    // Two sets of four ways: even pages in set 0, odd pages in set 1.
    let mut t = tlb(2, 4, Replacement::Lru);
    for p in 0..8 {
        t.insert(0, p * P, 12, p);
    }
    // Set 0, most recent first: pages 2, 6, 0, 4.
    for p in [4, 0, 6, 2] {
        assert!(t.lookup(0, p * P).is_some());
    }
    let mut c = t.clone();
    assert_eq!(c.len(), t.len());
    // Four more even pages evict set 0's pages least recent first, in both.
    for (new, victim) in [(16, 4), (18, 0), (20, 6), (22, 2)] {
        assert_eq!(t.insert(0, new * P, 12, new), Some((0, victim * P)));
        assert_eq!(c.insert(0, new * P, 12, new), Some((0, victim * P)));
    }
    // Separate: a fill in the clone is not in the original, and the other way round.
    c.insert(0, 31 * P, 12, 31);
    t.insert(0, 33 * P, 12, 33);
    assert!(c.holds(0, 31 * P) && !t.holds(0, 31 * P));
    assert!(t.holds(0, 33 * P) && !c.holds(0, 33 * P));
}
