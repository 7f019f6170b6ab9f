//! Loom model: read duplication's collapse races a read that makes a copy (issue 35,
//! item 4).
//!
//! Setup: the host and two faultable GPUs with local memory, attached coherent to one
//! space, and a one-page region holding a pattern the host wrote, advised read-mostly.
//! The first GPU has read the page once: it holds a read-only copy.
//! Then at once: the second GPU reads the page (a second copy, in its memory) and
//! reads it again; the first GPU writes a new pattern over it (the write fault
//! collapses every copy — unmaps them and invalidates the TLBs of the tables' users —
//! before the page moves to the writer).
//!
//! Checked: the second GPU's reads see the old pattern or the new one, never anything
//! else, and once the first GPU wrote, no read anywhere sees the old pattern; no TLB
//! holds a translation its table lacks; no frame is mapped again before the
//! invalidation of its old mapping (the event log); `check_invariants` holds.
//! The broken variant `collapse_skips_copy_invalidation` (the collapse unmaps the
//! copies without invalidating their tables' TLBs) must be caught.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::policy::advice::AdviceOp;
use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;
const OLD: &[u8] = b"old-data";
const NEW: &[u8] = b"NEW-DATA";

#[test]
#[cfg_attr(
    gmem_loom_bug = "collapse_skips_copy_invalidation",
    should_panic(expected = "reused before the invalidation")
)]
fn a_collapse_racing_a_duplicating_read_leaves_no_stale_copy() {
    common::model("readdup", PREEMPTIONS, || {
        let mut s = TestSystem::new(8);
        let g1 = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 2);
        let g2 = s.add_device(8, DevCaps::FAULTABLE, 0xA000_0000, 2);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0, g1, g2]);
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.write(0, r.start, OLD).unwrap();
        s.gm.region_advise(r, AdviceOp::SetReadMostly).unwrap();
        assert_eq!(s.read(g1, r.start, OLD.len()).unwrap(), OLD);
        assert_eq!(s.gm.stats().read_duplications, 1);
        let s = Arc::new(s);

        let reader = {
            let s = s.clone();
            loom::thread::spawn(move || {
                for _ in 0..2 {
                    let got = s.read(g2, r.start, OLD.len()).unwrap();
                    assert!(got == OLD || got == NEW, "the second GPU read {got:?}");
                }
            })
        };
        s.write(g1, r.start, NEW).unwrap();
        // The write returned: every copy of the old bytes is gone.
        assert_eq!(s.read(0, r.start, NEW.len()).unwrap(), NEW);
        reader.join().unwrap();

        for dev in [g2, g1, 0] {
            assert_eq!(
                s.read(dev, r.start, NEW.len()).unwrap(),
                NEW,
                "device {dev}"
            );
        }
        for dev in [0, g1, g2] {
            let mmu = &s.devices[dev].mmu;
            let root = mmu.active_root().unwrap();
            common::assert_tlb_current(mmu, root, r.start, &format!("device {dev}"));
        }
        common::check_reuse_after_invalidation(&s.take_events());
        s.gm.check_invariants(space).unwrap();
    });
}
