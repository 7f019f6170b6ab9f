//! Loom model (e): a strict `region_dealloc` whose TLB invalidation runs outside the
//! space lock, racing an allocation that needs the very range and frame it frees.
//!
//! Setup: a space of exactly one page and a host with exactly one frame; region `a`
//! fills both and is written through the host (its TLB caches the translation). Then
//! thread 1 deallocates `a` strictly while thread 2 allocates a one-page region and,
//! if it got one, writes it through the host (a fault that needs the only frame).
//!
//! Checked: when the strict dealloc returns the host's TLB no longer holds `a`'s page;
//! the allocation either fails (the range is still reserved) or gets the range only
//! after its invalidation — no virtual page and no frame is mapped again before the
//! invalidation of its old mapping (the event log, in order); `check_invariants`
//! holds and no frame is left pending. Broken variant
//! `gmem_loom_bug="strict_release_before_invalidation"` releases the frame and the
//! range under the lock, before the unlocked invalidation: the allocation then reuses
//! both while the TLB may still translate `a` (the write lands through the stale
//! translation and is lost when the page is then zero-filled).

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;

#[test]
#[cfg_attr(
    gmem_loom_bug = "strict_release_before_invalidation",
    should_panic(expected = "before the invalidation")
)]
fn a_strict_dealloc_invalidating_unlocked_frees_nothing_before_its_invalidation() {
    common::model("strict dealloc vs alloc", PREEMPTIONS, || {
        let s = TestSystem::new(1);
        let space = common::space(&s, PAGE_SIZE, &[0]);
        let a = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.write(0, a.start, b"a").unwrap();
        let root = s.host().mmu.active_root().unwrap();
        s.take_events();
        let s = Arc::new(s);
        let allocator = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let b = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).ok()?;
                s.write(0, b.start, b"b").unwrap();
                Some(s.read(0, b.start, 1).unwrap())
            })
        };
        s.gm.region_dealloc(a, MapFlags::empty(), None).unwrap();
        assert!(
            !s.host().mmu.tlb_holds(root, a.start) || s.gm.as_lookup(space, a.start).is_ok(),
            "a strict dealloc returned while the TLB still held the page"
        );
        let read = allocator.join().unwrap();
        common::check_reuse_after_invalidation(&s.take_events());
        if let Some(read) = read {
            assert_eq!(
                read, b"b",
                "the new region lost a write: it went through a stale translation of `a` \
                 before the invalidation"
            );
        }
        s.gm.as_synchronize(space).unwrap();
        s.gm.check_invariants(space).unwrap();
        assert_eq!(s.gm.dev_frames(s.host().id).unwrap().pending, 0);
    });
}
