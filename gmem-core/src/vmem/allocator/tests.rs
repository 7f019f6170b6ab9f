//! Tests of the segment allocator: fit policies, constraints, coalescing, spans,
//! free validation and free announcements, each checked against every structural
//! invariant ([`SegmentAllocator::check`]).

use super::super::constraint::Constraint;
use super::*;

const Q: u64 = 0x1000;

fn arena(spans: &[(u64, u64)]) -> SegmentAllocator {
    let mut a = SegmentAllocator::new(Q);
    for &(b, s) in spans {
        a.add_span(b, s).unwrap();
    }
    a.check().unwrap();
    a
}

fn plain(size: u64) -> Placement {
    Placement::plain(size, Q)
}

fn alloc(a: &mut SegmentAllocator, size: u64, fit: FitPolicy) -> Option<u64> {
    let r = a.alloc(&plain(size), fit, Kind::Alloc);
    a.check().unwrap();
    r
}

fn free(a: &mut SegmentAllocator, addr: u64, size: u64) {
    a.free(addr, size).unwrap();
    a.check().unwrap();
}

/// Allocate `[0, 0x30000)` first-fit in six pieces and free three of them: free
/// holes of 2 q at 0x0, 5 q at 0x10000 and 3 q at 0x20000 (freed in that order),
/// allocated fillers between them, and the free tail from 0x30000.
fn holes(a: &mut SegmentAllocator) {
    let layout = [
        (2 * Q, true),
        (0x10000 - 2 * Q, false),
        (5 * Q, true),
        (0x10000 - 5 * Q, false),
        (3 * Q, true),
        (0x10000 - 3 * Q, false),
    ];
    let mut at = 0;
    let mut freed = Vec::new();
    for (size, hole) in layout {
        assert_eq!(alloc(a, size, FitPolicy::FirstFit), Some(at));
        if hole {
            freed.push((at, size));
        }
        at += size;
    }
    for (addr, size) in freed {
        free(a, addr, size);
    }
}

fn constrained(f: impl FnOnce(&mut Constraint)) -> Placement {
    let mut c = Constraint::new(Q);
    f(&mut c);
    Placement::from_constraint(&c, Q).unwrap()
}

#[test]
fn instant_fit_takes_the_head_of_the_smallest_sufficient_class() {
    let mut a = arena(&[(0, 0x100000)]);
    holes(&mut a);
    // Sizes below 64 quanta have exact classes: 3 q finds the 3 q hole, 4 q (no
    // 4 q hole) the 5 q one, and 1 q the 1 q remainder that split left.
    assert_eq!(alloc(&mut a, 3 * Q, FitPolicy::InstantFit), Some(0x20000));
    assert_eq!(alloc(&mut a, 4 * Q, FitPolicy::InstantFit), Some(0x10000));
    assert_eq!(alloc(&mut a, Q, FitPolicy::InstantFit), Some(0x14000));
    assert_eq!(alloc(&mut a, 2 * Q, FitPolicy::InstantFit), Some(0));
    // Nothing small is left: the tail.
    assert_eq!(alloc(&mut a, Q, FitPolicy::InstantFit), Some(0x30000));
}

#[test]
fn instant_fit_falls_back_to_the_sizes_own_class() {
    let mut a = arena(&[(0, 65 * Q)]);
    // The only free segment (65 q) is in class 64..=65 q. A 65 q request needs
    // class 66 q and up, finds nothing there, and falls back to scanning its own.
    assert_eq!(alloc(&mut a, 65 * Q, FitPolicy::InstantFit), Some(0));
    assert_eq!(alloc(&mut a, Q, FitPolicy::InstantFit), None);
}

#[test]
fn best_fit_takes_the_smallest_segment_that_fits() {
    let mut a = arena(&[(0, 0x100000)]);
    holes(&mut a);
    assert_eq!(alloc(&mut a, 3 * Q, FitPolicy::BestFit), Some(0x20000));
    assert_eq!(alloc(&mut a, 4 * Q, FitPolicy::BestFit), Some(0x10000));
    assert_eq!(alloc(&mut a, 2 * Q, FitPolicy::BestFit), Some(0));
}

#[test]
fn first_fit_takes_the_lowest_address_that_fits() {
    let mut a = arena(&[(0, 0x100000)]);
    holes(&mut a);
    assert_eq!(alloc(&mut a, Q, FitPolicy::FirstFit), Some(0));
    assert_eq!(alloc(&mut a, 3 * Q, FitPolicy::FirstFit), Some(0x10000));
    assert_eq!(alloc(&mut a, 3 * Q, FitPolicy::FirstFit), Some(0x20000));
    assert_eq!(alloc(&mut a, 3 * Q, FitPolicy::FirstFit), Some(0x30000));
}

#[test]
fn next_fit_resumes_after_the_previous_allocation_and_wraps() {
    let mut a = arena(&[(0, 8 * Q)]);
    let x = alloc(&mut a, Q, FitPolicy::NextFit).unwrap();
    let y = alloc(&mut a, Q, FitPolicy::NextFit).unwrap();
    assert_eq!((x, y), (0, Q));
    free(&mut a, x, Q);
    // The freed quantum at 0 is behind the rotor: not reused yet.
    assert_eq!(alloc(&mut a, 2 * Q, FitPolicy::NextFit), Some(2 * Q));
    free(&mut a, y, Q);
    assert_eq!(alloc(&mut a, 4 * Q, FitPolicy::NextFit), Some(4 * Q));
    // Wrap around to the coalesced [0, 2q).
    assert_eq!(alloc(&mut a, 2 * Q, FitPolicy::NextFit), Some(0));
    assert_eq!(alloc(&mut a, Q, FitPolicy::NextFit), None);
}

#[test]
fn next_fit_rotor_survives_coalescing_and_carving_of_its_segment() {
    let mut a = arena(&[(0, 16 * Q)]);
    let x = alloc(&mut a, 2 * Q, FitPolicy::NextFit).unwrap();
    // The rotor is in the free remainder [2q, 16q); freeing x merges it away.
    free(&mut a, x, 2 * Q);
    assert_eq!(alloc(&mut a, Q, FitPolicy::NextFit), Some(2 * Q));
    // The rotor (3q) is in [3q, 16q); a first-fit carve at 5q splits that segment
    // and the rotor moves to the part that still contains 3q.
    let p = constrained(|c| c.min = 5 * Q);
    assert_eq!(a.alloc(&p, FitPolicy::FirstFit, Kind::Alloc), Some(5 * Q));
    a.check().unwrap();
    assert_eq!(alloc(&mut a, Q, FitPolicy::NextFit), Some(3 * Q));
    assert_eq!(alloc(&mut a, 2 * Q, FitPolicy::NextFit), Some(6 * Q));
}

#[test]
fn freeing_coalesces_with_both_neighbours_but_never_across_spans() {
    let mut a = arena(&[(0, 4 * Q), (4 * Q, 4 * Q)]);
    let addrs: Vec<u64> = (0..8)
        .map(|_| alloc(&mut a, Q, FitPolicy::FirstFit).unwrap())
        .collect();
    assert_eq!(addrs, (0..8).map(|i| i * Q).collect::<Vec<_>>());
    for &x in &[0, 2 * Q, Q, 4 * Q, 3 * Q] {
        free(&mut a, x, Q);
    }
    // [0,4q) is one free segment; [4q,5q) another: spans never coalesce.
    assert_eq!(a.counts().free_segments, 2);
    assert_eq!(alloc(&mut a, 5 * Q, FitPolicy::FirstFit), None);
    assert_eq!(alloc(&mut a, 4 * Q, FitPolicy::FirstFit), Some(0));
}

#[test]
fn spans_reject_overlap_and_insert_in_address_order() {
    let mut a = arena(&[(0x10000, 0x10000)]);
    assert_eq!(
        a.add_span(0x8000, 0x9000),
        Err(SpanError::Overlaps {
            base: 0x8000,
            size: 0x9000
        })
    );
    assert_eq!(
        a.add_span(0x1f000, Q),
        Err(SpanError::Overlaps {
            base: 0x1f000,
            size: Q
        })
    );
    assert_eq!(a.add_span(0, 0), Err(SpanError::Empty));
    assert_eq!(
        a.add_span(0x800, Q),
        Err(SpanError::Unaligned {
            base: 0x800,
            size: Q,
            quantum: Q
        })
    );
    assert_eq!(
        a.add_span(u64::MAX - 0xfff, 0x2000),
        Err(SpanError::Overflow {
            base: u64::MAX - 0xfff,
            size: 0x2000
        })
    );
    a.add_span(0, 0x10000).unwrap();
    a.add_span(0x20000, Q).unwrap();
    a.add_span(u64::MAX - 0xfff, Q).unwrap();
    a.check().unwrap();
    assert_eq!(a.counts().spans, 4);
    assert_eq!(alloc(&mut a, Q, FitPolicy::FirstFit), Some(0));
}

#[test]
fn a_span_ending_at_two_to_the_64_allocates_its_last_quantum() {
    let top = u64::MAX - 0xfff;
    let mut a = arena(&[(top - 3 * Q, 4 * Q)]);
    assert_eq!(
        alloc(&mut a, 4 * Q, FitPolicy::InstantFit),
        Some(top - 3 * Q)
    );
    free(&mut a, top - 3 * Q, 4 * Q);
    let p = constrained(|c| c.min = top);
    assert_eq!(a.alloc(&p, FitPolicy::InstantFit, Kind::Alloc), Some(top));
    a.check().unwrap();
    assert_eq!(alloc(&mut a, Q, FitPolicy::NextFit), Some(top - 3 * Q));
    assert!(a.contains_allocated(u64::MAX));
    assert!(!a.contains_allocated(top - 1));
    free(&mut a, top, Q);
}

#[test]
fn the_total_of_all_spans_must_stay_below_two_to_the_64() {
    let mut a = arena(&[(0, 1 << 63)]);
    assert_eq!(
        a.add_span(1 << 63, 1 << 63),
        Err(SpanError::Overflow {
            base: 1 << 63,
            size: 1 << 63
        })
    );
    a.add_span(1 << 63, (1 << 63) - Q).unwrap();
}

#[test]
fn xalloc_splits_a_segment_into_three_parts() {
    let mut a = arena(&[(0, 16 * Q)]);
    let p = constrained(|c| {
        c.size = 2 * Q;
        c.align = 8 * Q;
        c.phase = 3 * Q;
    });
    assert_eq!(a.alloc(&p, FitPolicy::InstantFit, Kind::Alloc), Some(3 * Q));
    a.check().unwrap();
    assert_eq!(a.counts().free_segments, 2);
    assert_eq!(a.counts().segments, 3);
    free(&mut a, 3 * Q, 2 * Q);
    assert_eq!(a.counts().segments, 1);
}

#[test]
fn each_fit_policy_honours_constraints() {
    for fit in [
        FitPolicy::InstantFit,
        FitPolicy::BestFit,
        FitPolicy::FirstFit,
        FitPolicy::NextFit,
    ] {
        let mut a = arena(&[(0, 0x100000)]);
        holes(&mut a);
        let p = constrained(|c| {
            c.size = 2 * Q;
            c.nocross = 4 * Q;
            c.min = 0x11000;
        });
        let addr = a.alloc(&p, fit, Kind::Alloc).unwrap();
        a.check().unwrap();
        assert!(p.satisfied_by(addr), "{fit:?} gave {addr:#x}");
        assert!(addr >= 0x11000);
    }
}

#[test]
fn free_validates_address_size_and_kind_without_changing_state() {
    let mut a = arena(&[(0, 16 * Q)]);
    let x = alloc(&mut a, 2 * Q, FitPolicy::InstantFit).unwrap();
    let before = a.counts();
    assert_eq!(
        a.free(x + Q, Q),
        Err(FreeError::NotAllocated { addr: x + Q })
    );
    assert_eq!(
        a.free(x, Q),
        Err(FreeError::SizeMismatch {
            addr: x,
            allocated: 2 * Q,
            given: Q
        })
    );
    let mut cached = Vec::new();
    a.import(Q, 1, &mut cached);
    assert_eq!(
        a.free(cached[0], Q),
        Err(FreeError::NotAllocated { addr: cached[0] })
    );
    assert!(a.release_cached(cached[0]));
    assert!(!a.release_cached(cached[0]));
    assert_eq!(a.counts().free, before.free);
    a.check().unwrap();
    free(&mut a, x, 2 * Q);
    assert_eq!(a.free(x, 2 * Q), Err(FreeError::NotAllocated { addr: x }));
}

/// Announcements are hints: allocated, free, foreign and misaligned addresses, more
/// of them than the pipeline holds, change no count and break no invariant, and
/// the announced frees then succeed as unannounced ones do.
#[test]
fn announcing_frees_changes_nothing() {
    let mut a = arena(&[(0, 64 * Q)]);
    let xs: Vec<u64> = (0..8)
        .map(|_| alloc(&mut a, Q, FitPolicy::InstantFit).unwrap())
        .collect();
    free(&mut a, xs[1], Q);
    let before = a.counts();
    for &x in &xs {
        a.prefetch_free(x);
    }
    for junk in [xs[1], 1, u64::MAX, 1 << 63, 40 * Q] {
        a.prefetch_free(junk);
    }
    a.prefetch_batch(xs.iter().copied().chain([1, u64::MAX, 40 * Q]));
    assert_eq!(a.counts(), before);
    a.check().unwrap();
    for (k, &x) in xs.iter().enumerate().filter(|&(k, _)| k != 1) {
        a.prefetch_free(xs[(k + 3) % xs.len()]);
        free(&mut a, x, Q);
    }
    assert_eq!(a.counts().free, 64 * Q);
    a.check().unwrap();
}
