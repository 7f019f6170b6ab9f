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
