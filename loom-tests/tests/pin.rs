//! Loom model: a fault that pins a thrashing page races its deallocation, or the end
//! of its pin (issue 35, thrashing mitigation).
//!
//! Setup: the host and a faultable device with four pages of local memory, attached
//! coherent to one space with thrashing detection on (pin mitigation, threshold 1,
//! lapse 1000, pin time 1, in nanoseconds of a platform clock that advances by one
//! at each reading), and a one-page region holding a pattern the host wrote, which
//! the device then the host read: two migrations within the lapse, so the page
//! thrashes, living in host memory. Then at once: the device faults on the page for a
//! store, which pins it where it lives and maps it remotely in the device's table (a
//! unique page with two mappings: the pin is what allows it); and the host either
//! deallocates the region strictly (`region_dealloc` without `ASYNC`) or ends the
//! pins whose time is up (`as_expire_pins`, which unmaps the page everywhere so that
//! its next access faults as usual).
//!
//! Checked: `check_invariants` holds; the fault succeeds (or, after the
//! deallocation, finds nothing allocated); after a deallocation no table maps the
//! page and every frame of both memories is free (no mapping of the freed frame
//! survives, also none in a TLB), and nothing was mapped again before the
//! invalidation of its old mapping (the event log); after an expiry the pattern
//! reads back through both devices, and an expired pin left no second mapping.
//!
//! Broken variant: `gmem_loom_bug="expire_pins_keeps_mappings"` ends a pin without
//! unmapping the page: the device's remote mapping survives the pin that allowed it,
//! and `check_invariants` reports a unique page mapped by more than one table.

#![cfg(gmem_loom)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gmem_core::policy::thrashing::{Mitigation, ThrashingConfig};
use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;
const PATTERN: &[u8] = b"pinned!!";

/// A platform clock that advances by one nanosecond at each reading: a loom atomic,
/// so that loom interleaves the readings with the other thread's steps (the expiry
/// reads the clock before it locks the space).
struct Ticks(loom::sync::atomic::AtomicU64);

impl Platform for Ticks {
    fn current_cpu(&self) -> usize {
        0
    }
    fn cpu_count(&self) -> usize {
        1
    }
    fn now_ns(&self) -> Option<u64> {
        Some(self.0.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// The system, its space, the device's index and the thrashing one-page region
/// (see the module header).
fn thrashing_page() -> (TestSystem, SpaceId, usize, Region) {
    let mut s =
        TestSystem::with_platform(8, Arc::new(Ticks(loom::sync::atomic::AtomicU64::new(0))));
    let d = s.add_device(7, DevCaps::FAULTABLE, 0x8000_0000, 4);
    let space = common::space(&s, 4 * PAGE_SIZE, &[0, d]);
    let config = ThrashingConfig::new(1, 1000, 1, 1, Mitigation::Pin).unwrap();
    s.gm.as_set_thrashing(space, Some(config)).unwrap();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, r.start, PATTERN).unwrap();
    assert_eq!(s.read(d, r.start, PATTERN.len()).unwrap(), PATTERN);
    assert_eq!(s.read(0, r.start, PATTERN.len()).unwrap(), PATTERN);
    let st = s.gm.as_thrashing(space).unwrap().unwrap().stats;
    assert_eq!((st.detected, st.pins), (1, 0), "thrashing, not pinned yet");
    assert_eq!(
        s.gm.as_page_frame(space, r.start).unwrap().unwrap().0,
        s.gm.host(),
        "lives in host memory"
    );
    s.take_events();
    (s, space, d, r)
}

fn invariants(s: &TestSystem, space: SpaceId) {
    if let Err(v) = s.gm.check_invariants(space) {
        panic!("invariant broken: {v}");
    }
}

#[test]
fn a_fault_pinning_a_page_racing_its_strict_dealloc_leaves_no_mapping_of_the_freed_frame() {
    // Executions where the fault pinned the page before the deallocation, and after.
    let seen = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let count = seen.clone();
    common::model("pin_dealloc", PREEMPTIONS, move || {
        let (s, space, d, r) = thrashing_page();
        let gpu = s.devices[d].id;
        let s = Arc::new(s);
        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_fault(gpu, r.start, Prot::WRITE))
        };
        s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
        match faulter.join().unwrap() {
            // Pinned in host memory, mapped remotely by the device.
            Ok(res) => {
                assert_eq!(res.kind, FaultKind::Remote);
                count[0].fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                assert_eq!(e, FaultError::NotAllocated(r.start));
                count[1].fetch_add(1, Ordering::Relaxed);
            }
        }
        invariants(&s, space);
        for dev in [0, d] {
            let mmu = &s.devices[dev].mmu;
            let root = mmu.active_root().unwrap();
            assert_eq!(
                mmu.store().lookup(root, r.start.vpn().0),
                None,
                "device {dev} still maps the deallocated page"
            );
            assert!(
                !mmu.tlb_holds(root, r.start),
                "device {dev}'s TLB still translates the deallocated page"
            );
        }
        for dev in [s.gm.host(), gpu] {
            let f = s.gm.dev_frames(dev).unwrap();
            assert_eq!(f.free, f.registered, "a frame of {dev:?} is not free");
        }
        common::check_reuse_after_invalidation(&s.take_events());
        assert_eq!(
            s.read(d, r.start, 1),
            Err(gmem_core::testing::AccessError::Fault(
                FaultError::NotAllocated(r.start)
            ))
        );
    });
    let [pinned, late] = [0, 1].map(|i| seen[i].load(Ordering::Relaxed));
    assert!(
        pinned > 0 && late > 0,
        "both orders explored: {pinned}, {late}"
    );
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "expire_pins_keeps_mappings",
    should_panic(expected = "mapped by more than one page table")
)]
fn a_fault_pinning_a_page_racing_the_end_of_pins_keeps_the_bytes_and_one_mapping_per_pin() {
    // Executions where the expiry found the pin over (after the fault), and not.
    let seen = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let count = seen.clone();
    common::model("pin_expire", PREEMPTIONS, move || {
        let (s, space, d, r) = thrashing_page();
        let gpu = s.devices[d].id;
        let s = Arc::new(s);
        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_fault(gpu, r.start, Prot::WRITE))
        };
        let expired = s.gm.as_expire_pins(space).unwrap();
        count[usize::from(expired == 0)].fetch_add(1, Ordering::Relaxed);
        let res = faulter.join().unwrap().unwrap();
        assert_eq!(res.kind, FaultKind::Remote, "pinned where it lives");
        let st = s.gm.as_thrashing(space).unwrap().unwrap().stats;
        assert_eq!(st.pins, 1);
        assert_eq!(st.unpins, expired, "each expired pin counted");
        invariants(&s, space);
        if expired == 1 {
            // Unpinned: its mappings went, so at most one table maps it (checked by
            // the invariants above); none, unless a later access mapped it again.
            for dev in [0, d] {
                let mmu = &s.devices[dev].mmu;
                let root = mmu.active_root().unwrap();
                assert_eq!(mmu.store().lookup(root, r.start.vpn().0), None);
            }
        }
        for dev in [0, d] {
            let mmu = &s.devices[dev].mmu;
            let root = mmu.active_root().unwrap();
            common::assert_tlb_current(mmu, root, r.start, &format!("device {dev}"));
        }
        common::check_reuse_after_invalidation(&s.take_events());
        assert_eq!(s.read(d, r.start, PATTERN.len()).unwrap(), PATTERN);
        assert_eq!(s.read(0, r.start, PATTERN.len()).unwrap(), PATTERN);
        invariants(&s, space);
    });
    let [unpinned, kept] = [0, 1].map(|i| seen[i].load(Ordering::Relaxed));
    assert!(
        unpinned > 0 && kept > 0,
        "both orders explored: {unpinned}, {kept}"
    );
}
