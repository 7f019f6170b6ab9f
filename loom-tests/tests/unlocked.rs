//! Loom model (f): page-table edits made outside the space lock
//! (`Mmu::concurrent_edits`) racing the detach that destroys the table.
//!
//! Setup: a space with the CPU and one I/O device (cannot fault, tables that take
//! concurrent edits) attached. Then thread 1 maps a region onto caller-given frames
//! — the I/O table gets the mapping eagerly, without the lock — (test 1), or
//! deallocates a mapped region strictly — the I/O table is unmapped without the lock
//! — (test 2), while thread 2 detaches the I/O device, which empties and destroys its
//! table.
//!
//! Checked: no `map`, `unmap` or `protect` ever names a destroyed table (the test MMU
//! counts them: a real driver would write freed memory); the detached device's table
//! is destroyed in the end (none leaks); `check_invariants` holds; the call on the
//! region succeeded. Broken variant `gmem_loom_bug="destroy_table_during_unlocked_edit"`
//! destroys the table at once in the detach, under an edit still running.
//!
//! Tests 3 and 4 race the unlocked map with the other two edits of the core that
//! could reach its range: a fault of a faultable device whose replicate-mode table
//! takes the region eagerly (test 3), and the fill of a table that a device joins in
//! shared mode (test 4). Checked: no edit of the test MMU ever began while an
//! overlapping edit of the same table was in flight (the `Mmu::concurrent_edits`
//! promise); every page reachable in the end; the invariants hold. Broken variants
//! `fault_maps_busy_region` (the fault ignores the busy mark) and
//! `fill_mirrors_busy_pages` (the fill mirrors pages the edit is mapping) must be
//! caught.

#![cfg(gmem_loom)]

mod common;

use std::sync::Arc;

use gmem_core::testing::TestSystem;
use gmem_core::*;

/// Preemption bound of this model.
const PREEMPTIONS: usize = 3;

const FRAME: u64 = 0x7000_0000;

fn setup() -> (TestSystem, SpaceId, usize) {
    let mut s = TestSystem::new(2);
    let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
    s.concurrent_edits = true;
    let io = s.add_device(9, DevCaps::empty(), 0, 0);
    s.gm.as_attach(
        space,
        s.devices[io].id,
        MmuMode::Coherent,
        Activation::Switch,
    )
    .unwrap();
    (s, space, io)
}

fn check(s: &TestSystem, space: SpaceId, io: usize) {
    let store = s.devices[io].mmu.store();
    assert_eq!(
        store.edits_of_destroyed(),
        0,
        "an unlocked edit ran on a destroyed table"
    );
    assert_eq!(store.tables(), 0, "the detached device's table leaked");
    s.gm.check_invariants(space).unwrap();
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "destroy_table_during_unlocked_edit",
    should_panic(expected = "destroyed table")
)]
fn an_unlocked_map_never_edits_a_table_its_detach_destroyed() {
    common::model("unlocked map vs detach", PREEMPTIONS, || {
        let (s, space, io) = setup();
        let host = s.host().id;
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let s = Arc::new(s);
        let detacher = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_detach(s.devices[io].id, space).unwrap())
        };
        let frames = [PhysAddr::new(FRAME)];
        let mapped = s.gm.region_map(r, MapRequest::new(&frames, host));
        detacher.join().unwrap();
        check(&s, space, io);
        assert_eq!(mapped, Ok(()), "the map failed");
        assert!(s.gm.region_info(r).unwrap().mapped);
    });
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "destroy_table_during_unlocked_edit",
    should_panic(expected = "destroyed table")
)]
fn an_unlocked_strict_unmap_never_edits_a_table_its_detach_destroyed() {
    common::model("unlocked strict unmap vs detach", PREEMPTIONS, || {
        let (s, space, io) = setup();
        let host = s.host().id;
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        s.gm.region_map(r, MapRequest::new(&[PhysAddr::new(FRAME)], host))
            .unwrap();
        let s = Arc::new(s);
        let detacher = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_detach(s.devices[io].id, space).unwrap())
        };
        s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
        detacher.join().unwrap();
        s.gm.as_synchronize(space).unwrap();
        check(&s, space, io);
        assert_eq!(s.gm.region_info(r), Err(RegionError::StaleRegion(r)));
    });
}

/// The end check of tests 3 and 4: no overlapping edit, the invariants.
fn check_no_overlap(s: &TestSystem, space: SpaceId, dev: usize) {
    assert_eq!(
        s.devices[dev].mmu.store().overlapping_edits(),
        0,
        "an edit overlapped an unlocked edit of the same range"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "fault_maps_busy_region",
    should_panic(expected = "overlapped an unlocked edit")
)]
fn a_fault_never_edits_the_range_an_unlocked_map_is_editing() {
    common::model("unlocked map vs fault", PREEMPTIONS, || {
        let mut s = TestSystem::new(2);
        let space = common::space(&s, 4 * PAGE_SIZE, &[0]);
        s.concurrent_edits = true;
        let gpu = s.add_device(9, DevCaps::FAULTABLE, 0, 0);
        let id = s.devices[gpu].id;
        s.gm.as_attach(space, id, MmuMode::Replicate, Activation::Switch)
            .unwrap();
        let host = s.host().id;
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        // The region holds frames from the start (an explicit, still unmapped one):
        // the fault finds `NotMapped`, `Busy`, or the mapped frame.
        let s = Arc::new(s);
        let faulter = {
            let s = s.clone();
            loom::thread::spawn(move || s.gm.dev_fault(id, r.start, Prot::READ))
        };
        let mapped =
            s.gm.region_map(r, MapRequest::new(&[PhysAddr::new(FRAME)], host));
        let fault = faulter.join().unwrap();
        check_no_overlap(&s, space, gpu);
        // A fault before the map zero-fills the page: the map then finds it populated.
        match (mapped, fault) {
            (Ok(()), Ok(_) | Err(FaultError::Busy(_))) => {
                let pte = s.translate(gpu, r.start, Prot::READ).unwrap();
                assert_eq!(pte.pfn, FRAME / PAGE_SIZE);
            }
            (Err(MapError::AlreadyMapped), Ok(_)) => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    });
}

#[test]
#[cfg_attr(
    gmem_loom_bug = "fill_mirrors_busy_pages",
    should_panic(expected = "overlapped an unlocked edit")
)]
fn a_shared_attach_never_fills_the_range_an_unlocked_map_is_editing() {
    common::model("unlocked map vs shared attach", PREEMPTIONS, || {
        // Devices of the host's format share one table store (shared mode needs it);
        // no CPU attached, so the I/O device's table is the first of that format.
        let mut s = TestSystem::new(2);
        let space = common::space(&s, 4 * PAGE_SIZE, &[]);
        s.concurrent_edits = true;
        let io = s.add_device(1, DevCaps::empty(), 0, 0);
        s.gm.as_attach(
            space,
            s.devices[io].id,
            MmuMode::Coherent,
            Activation::Switch,
        )
        .unwrap();
        let joiner = s.add_device(1, DevCaps::empty(), 0, 0);
        let host = s.host().id;
        let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
        let s = Arc::new(s);
        let attacher = {
            let s = s.clone();
            loom::thread::spawn(move || {
                s.gm.as_attach(
                    space,
                    s.devices[joiner].id,
                    MmuMode::Shared,
                    Activation::Switch,
                )
            })
        };
        let mapped =
            s.gm.region_map(r, MapRequest::new(&[PhysAddr::new(FRAME)], host));
        assert_eq!(attacher.join().unwrap(), Ok(MmuMode::Shared));
        check_no_overlap(&s, space, io);
        assert_eq!(mapped, Ok(()), "the map failed");
        for d in [io, joiner] {
            let pte = s.translate(d, r.start, Prot::READ).unwrap();
            assert_eq!(pte.pfn, FRAME / PAGE_SIZE, "device {d}");
        }
    });
}
