//! Races around page-table edits made outside the space lock, each forced
//! deterministically: a gate holds one driver call open ([`TestMmu::hold_next`]) while
//! the test makes another call of the core, and the recording test MMU reports what it
//! saw — overlapping edits of one table range ([`TableStore::overlapping_edits`]),
//! calls after the device was destroyed (the event log), and TLB contents.
//!
//! Each test failed before its fix (issue 37) and passes after it:
//! 1. a fault, or a shared-mode attach's fill, must not edit a range an unlocked
//!    `region_map` is editing;
//! 2. `dev_destroy` must refuse while a doomed table (or a strict dealloc's unlocked
//!    completion) still names the device;
//! 3. the detach of a table's last user must invalidate the whole table, so that a
//!    strict dealloc's late invalidation of a destroyed root is not needed;
//! 4. `region_map` must report a space destroyed during the call.

use gmem_core::testing::{Gate, GateCall, MmuEvent, TestMmu, TestSystem};
use gmem_core::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A page-table format of the I/O devices (not the host's).
const IO: u32 = 9;
/// The host's format: devices of it share one table store (shared mode).
const HOST_FORMAT: u32 = 1;

fn va(x: u64) -> VirtAddr {
    VirtAddr::new(x)
}

fn frame(k: u64) -> PhysAddr {
    PhysAddr::new(0x7000_0000 + k * PAGE_SIZE)
}

/// Add a device whose tables take unlocked edits (`concurrent`) and attach it.
fn device(
    s: &mut TestSystem,
    space: SpaceId,
    caps: DevCaps,
    mode: MmuMode,
    concurrent: bool,
) -> usize {
    s.concurrent_edits = concurrent;
    let d = s.add_device(IO, caps, 0, 0);
    s.gm.as_attach(space, s.devices[d].id, mode, Activation::Switch)
        .unwrap();
    d
}

/// Wait (10 s at most) until the gated call has arrived at its gate.
fn wait_held(gate: &Gate) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gate.is_held() {
        assert!(Instant::now() < deadline, "the gated call never came");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Start `region_map(r, frames 0..pages, host)` on a thread of its own, held at the
/// gate of `mmu`'s first `map`; returns once that call is held.
fn map_held_open(
    s: &Arc<TestSystem>,
    mmu: &TestMmu,
    r: Region,
    pages: u64,
) -> (Arc<Gate>, std::thread::JoinHandle<Result<(), MapError>>) {
    let gate = mmu.hold_next(GateCall::Map);
    let t = {
        let s = s.clone();
        std::thread::spawn(move || {
            let frames: Vec<PhysAddr> = (0..pages).map(frame).collect();
            s.gm.region_map(r, MapRequest::new(&frames, s.host().id))
        })
    };
    wait_held(&gate);
    (gate, t)
}

#[test]
fn a_fault_on_a_region_being_mapped_unlocked_is_answered_busy_and_edits_nothing() {
    let mut s = TestSystem::new(64);
    let space = s.space();
    // A faultable device on a replicate-mode table: its table takes the region's
    // pages eagerly (unlocked), and it can also fault on them.
    let gpu = device(&mut s, space, DevCaps::FAULTABLE, MmuMode::Replicate, true);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(2 * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    let (gate, mapper) = map_held_open(&s, &s.devices[gpu].mmu, r, 2);

    let id = s.devices[gpu].id;
    assert_eq!(
        s.gm.dev_fault(id, r.start, Prot::READ),
        Err(FaultError::Busy(r.start)),
        "a fault on the busy region must wait for the edit"
    );
    let store = s.devices[gpu].mmu.store();
    assert_eq!(
        store.overlapping_edits(),
        0,
        "the fault edited the busy range"
    );

    gate.open();
    assert_eq!(mapper.join().unwrap(), Ok(()));
    assert_eq!(store.overlapping_edits(), 0);
    // The edit's mapping is there and the fault now finds it.
    let pte = s.translate(gpu, r.start, Prot::WRITE).unwrap();
    assert_eq!(pte.pfn, frame(0).pfn().0);
    assert!(s.gm.dev_fault(id, r.start, Prot::READ).is_ok());
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn an_attach_during_an_unlocked_map_leaves_its_pages_to_the_edit_in_a_shared_table() {
    let mut s = TestSystem::new(64);
    // No CPU attached: the first table of the host's format (whose store all
    // devices of that format share, as shared mode needs) is the edited one.
    let space =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    // Devices that cannot fault: their tables get every wired page eagerly.
    s.concurrent_edits = true;
    let a = s.add_device(HOST_FORMAT, DevCaps::empty(), 0, 0);
    s.attach(space, a);
    let shared = s.add_device(HOST_FORMAT, DevCaps::empty(), 0, 0);
    let own = s.add_device(HOST_FORMAT, DevCaps::empty(), 0, 0);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    let (gate, mapper) = map_held_open(&s, &s.devices[a].mmu, r, 3);

    // One device joins the table being edited, one gets a table of its own.
    let sid = s.devices[shared].id;
    assert_eq!(
        s.gm.as_attach(space, sid, MmuMode::Shared, Activation::Switch),
        Ok(MmuMode::Shared)
    );
    let oid = s.devices[own].id;
    s.gm.as_attach(space, oid, MmuMode::Coherent, Activation::Switch)
        .unwrap();
    assert_eq!(
        s.devices[a].mmu.store().overlapping_edits(),
        0,
        "the shared table's fill mapped the range the edit is mapping"
    );

    gate.open();
    assert_eq!(mapper.join().unwrap(), Ok(()));
    // Every device reaches every page: the sharer through the edit, the new table
    // through its own fill (the edit never knew it).
    for d in [a, shared, own] {
        for k in 0..3 {
            let pte = s
                .translate(d, va(r.start.as_u64() + k * PAGE_SIZE), Prot::WRITE)
                .unwrap_or_else(|e| panic!("device {d} page {k}: {e:?}"));
            assert_eq!(pte.pfn, frame(k).pfn().0);
        }
    }
    assert_eq!(s.devices[a].mmu.store().overlapping_edits(), 0);
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn dev_destroy_is_refused_while_a_doomed_table_names_the_device() {
    let mut s = TestSystem::new(64);
    let space = s.space();
    let io = device(&mut s, space, DevCaps::empty(), MmuMode::Coherent, true);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let s = Arc::new(s);
    let (gate, mapper) = map_held_open(&s, &s.devices[io].mmu, r, 1);

    // Detached while the edit runs: its table is doomed, kept until the edit ends,
    // and the core will still call the device's MMU for it.
    let id = s.devices[io].id;
    s.gm.dev_detach(id, space).unwrap();
    assert_eq!(s.gm.dev_destroy(id), Err(DeviceError::EditsInFlight));

    gate.open();
    assert_eq!(mapper.join().unwrap(), Ok(()));
    s.take_events();
    s.gm.dev_destroy(id).unwrap();
    // Nothing the core does afterwards reaches the destroyed device's MMU.
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    s.gm.as_destroy(space).unwrap();
    let late: Vec<MmuEvent> = s
        .take_events()
        .into_iter()
        .filter(|e| event_mmu(e) == io as u32)
        .collect();
    assert!(late.is_empty(), "calls after dev_destroy: {late:?}");
    let store = s.devices[io].mmu.store();
    assert_eq!(store.tables(), 0, "the doomed table leaked");
    assert_eq!(store.edits_of_destroyed(), 0);
}

#[test]
fn the_last_detach_invalidates_the_whole_table_before_a_strict_deallocs_late_shootdown() {
    let mut s = TestSystem::new(64);
    let space = s.space();
    // Tables edited under the lock: a strict dealloc unmaps under it and invalidates
    // outside it.
    let io = device(&mut s, space, DevCaps::empty(), MmuMode::Coherent, false);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.region_map(r, MapRequest::new(&[frame(0)], s.host().id))
        .unwrap();
    // The device caches the translation.
    s.translate(io, r.start, Prot::READ).unwrap();
    let root = s.devices[io].mmu.active_root().unwrap();
    assert!(s.devices[io].mmu.tlb_holds(root, r.start));

    let s = Arc::new(s);
    let gate = s.devices[io].mmu.hold_next(GateCall::Invalidate);
    let dealloc = {
        let s = s.clone();
        std::thread::spawn(move || s.gm.region_dealloc(r, MapFlags::empty(), None))
    };
    wait_held(&gate);
    // The last user leaves while the dealloc's shootdown is still to come: the table
    // is destroyed now, and a driver may skip that late shootdown of an unknown root,
    // so the detach itself must have emptied the TLB of everything the table held.
    let id = s.devices[io].id;
    s.gm.dev_detach(id, space).unwrap();
    assert!(!s.devices[io].mmu.store().is_live(root));
    assert!(
        !s.devices[io].mmu.tlb_holds(root, r.start),
        "a translation to a frame the dealloc frees survived the detach"
    );
    // The dealloc's completion still names the device.
    assert_eq!(s.gm.dev_destroy(id), Err(DeviceError::EditsInFlight));

    gate.open();
    assert_eq!(dealloc.join().unwrap(), Ok(()));
    s.gm.check_invariants(space).unwrap();
    s.gm.dev_destroy(id).unwrap();
}

#[test]
fn region_map_reports_a_space_destroyed_during_the_call() {
    let mut s = TestSystem::new(64);
    let space = s.space();
    let io = device(&mut s, space, DevCaps::empty(), MmuMode::Coherent, true);
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    let s = Arc::new(s);
    let called = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = s.devices[io].mmu.hold_next(GateCall::Map);
    let mapper = {
        let (s, called) = (s.clone(), called.clone());
        std::thread::spawn(move || {
            let cb: Callback =
                Box::new(move |_| called.store(true, std::sync::atomic::Ordering::SeqCst));
            s.gm.region_map(r, MapRequest::new(&[frame(0)], s.host().id).callback(cb))
        })
    };
    wait_held(&gate);
    s.gm.as_destroy(space).unwrap();
    gate.open();
    assert_eq!(
        mapper.join().unwrap(),
        Err(MapError::Region(RegionError::UnknownSpace(space))),
        "the caller was told a mapping exists in a destroyed space"
    );
    assert!(
        !called.load(std::sync::atomic::Ordering::SeqCst),
        "a failed call's callback ran"
    );
    let store = s.devices[io].mmu.store();
    assert_eq!(store.tables(), 0, "the doomed table leaked");
    assert_eq!(store.edits_of_destroyed(), 0);
}

/// The recording MMU's number of an event.
fn event_mmu(e: &MmuEvent) -> u32 {
    match e {
        MmuEvent::Create { mmu, .. }
        | MmuEvent::Destroy { mmu, .. }
        | MmuEvent::Map { mmu, .. }
        | MmuEvent::Unmap { mmu, .. }
        | MmuEvent::Protect { mmu, .. }
        | MmuEvent::Invalidate { mmu, .. }
        | MmuEvent::InvalidateAll { mmu, .. }
        | MmuEvent::Activate { mmu, .. } => *mmu,
    }
}
