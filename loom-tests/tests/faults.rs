//! Loom model (c): two devices fault on one page at once.
//!
//! Setup: the host and two faultable devices with two pages of local memory each,
//! attached coherent to one space. A one-page region `r` holds a pattern written by
//! the host. A one-page region `s` was written by device 1 (its frame is the first of
//! device 1's memory) and then deallocated asynchronously: its frame is quarantined
//! and device 1's TLB may still translate `s` until the queue drains. Then device 1
//! and device 2 read `r` at once (fault-and-retry as hardware does), so under the
//! unique policy the page migrates into one device's memory, maybe back and forth.
//!
//! Checked: both reads see the pattern; afterwards at most one device table maps the
//! page (one owner), the host reads the pattern back, `check_invariants` holds, no
//! frame or virtual page was mapped again before the invalidation of its old mapping
//! (the event log), and after a synchronize no device's TLB holds a translation its
//! table lacks. Broken variant: `gmem_loom_bug="frames_before_invalidation"` releases
//! `s`'s frame at enqueue; the migration into device 1 then reuses it while device 1's
//! TLB may still map `s` to it.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;
const PATTERN: &[u8] = b"gmem-ok!";

#[test]
#[cfg_attr(
    gmem_loom_bug = "frames_before_invalidation",
    should_panic(expected = "reused before the invalidation")
)]
fn two_devices_faulting_on_one_page_leave_one_owner_and_the_bytes() {
    common::model("faults", PREEMPTIONS, || {
        let mut s = TestSystem::new(4);
        let d1 = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 2);
        let d2 = s.add_device(8, DevCaps::FAULTABLE, 0x9000_0000, 2);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0, d1, d2]);
        let gone = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.write(d1, gone.start, b"s").unwrap();
        s.gm.region_dealloc(gone, MapFlags::ASYNC, None).unwrap();
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.write(0, r.start, PATTERN).unwrap();
        let s = Arc::new(s);

        let readers: Vec<_> = [d1, d2]
            .into_iter()
            .map(|d| {
                let s = s.clone();
                loom::thread::spawn(move || {
                    assert_eq!(s.read(d, r.start, PATTERN.len()).unwrap(), PATTERN);
                })
            })
            .collect();
        for t in readers {
            t.join().unwrap();
        }
        s.gm.check_invariants(space).unwrap();
        let vpn = r.start.vpn().0;
        let owners = [d1, d2]
            .iter()
            .filter(|&&d| {
                let mmu = &s.devices[d].mmu;
                mmu.store()
                    .lookup(mmu.active_root().unwrap(), vpn)
                    .is_some()
            })
            .count();
        assert!(owners <= 1, "the page has one owner, not {owners}");
        assert_eq!(s.read(0, r.start, PATTERN.len()).unwrap(), PATTERN);
        s.gm.as_synchronize(space).unwrap();
        for d in [0, d1, d2] {
            let mmu = &s.devices[d].mmu;
            let root = mmu.active_root().unwrap();
            for va in [gone.start, r.start] {
                if mmu.tlb_holds(root, va) {
                    assert_eq!(
                        mmu.translate(va),
                        mmu.store().lookup(root, va.vpn().0),
                        "device {d}'s TLB is stale at {va:?}"
                    );
                }
            }
        }
        common::check_reuse_after_invalidation(&s.take_events());
        s.gm.check_invariants(space).unwrap();
    });
}
