//! Handles and devices: stale handles, destruction, protection, detach, eviction
//! across spaces, concurrent faults, wiring, frame constraints, races with migration.

use super::*;

#[test]
fn stale_handles_and_double_frees_are_typed_errors() {
    let (s, space) = system();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.region_dealloc(r, MapFlags::empty(), None).unwrap();
    assert_eq!(
        s.gm.region_dealloc(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r))
    );
    assert_eq!(
        s.gm.region_unmap(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r))
    );
    assert_eq!(
        s.gm.region_protect(r, Prot::READ),
        Err(ProtectError::Region(RegionError::StaleRegion(r)))
    );
    let again = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    assert_eq!(again.start, r.start, "the range is reused");
    assert_eq!(
        s.gm.region_dealloc(r, MapFlags::empty(), None),
        Err(RegionError::StaleRegion(r)),
        "old handle still stale"
    );
    assert!(s.gm.region_info(again).is_ok());
    let other =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    let elsewhere = s.gm.as_alloc(other, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.gm.as_destroy(other).unwrap();
    assert_eq!(
        s.gm.region_info(elsewhere),
        Err(RegionError::UnknownSpace(other)),
        "a region of a destroyed space"
    );
    assert!(s.gm.region_info(again).is_ok());
    ok(&s, space);
}

#[test]
fn dev_destroy_refuses_while_attached_or_holding_pages() {
    let (mut s, space) = system();
    assert_eq!(s.gm.dev_destroy(s.host().id), Err(DeviceError::IsHost));
    let g = gpu(&mut s, space, 4);
    let gid = s.devices[g].id;
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::StillAttached { spaces: 1 })
    );
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(g, r.start, b"v").unwrap();
    s.gm.dev_detach(gid, space).unwrap();
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::MemoryInUse { frames: 1 })
    );
    s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
        .unwrap();
    s.gm.dev_destroy(gid).unwrap();
    assert_eq!(s.gm.dev_destroy(gid), Err(DeviceError::UnknownDevice(gid)));
    assert_eq!(s.read(0, r.start, 1).unwrap(), b"v");
    ok(&s, space);
}

#[test]
fn a_destroyed_device_is_freed_and_no_space_keeps_it() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 4);
    let gid = s.devices[g].id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(g, r.start, b"v").unwrap();
    s.gm.dev_detach(gid, space).unwrap();
    s.gm.region_migrate(r, s.host().id, MigrateScope::Populated)
        .unwrap();
    // The core holds the device's MMU and memory while the device lives (the space
    // names its memory: a page lived there).
    let mmu = s.devices[g].mmu.clone();
    let mem = s.devices[g].memory.clone().unwrap();
    assert!(Arc::strong_count(&mmu) > 2 && Arc::strong_count(&mem) > 2);
    s.gm.dev_destroy(gid).unwrap();
    // Only the test system's and this test's references are left: the device record
    // was freed, and the space forgot the memory it once used.
    assert_eq!(Arc::strong_count(&mmu), 2);
    assert_eq!(Arc::strong_count(&mem), 2);
    assert_eq!(s.read(0, r.start, 1).unwrap(), b"v");
    ok(&s, space);
}

#[test]
fn dev_destroy_refuses_while_caller_frames_of_its_memory_are_mapped() {
    let (mut s, space) = system();
    let g = s.add_device(GPU, DevCaps::FAULTABLE, GPU_BASE, 4);
    let gid = s.devices[g].id;
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    // A frame of the device's address space outside the memory the core manages.
    let frame = [PhysAddr::new(GPU_BASE + 64 * PAGE_SIZE)];
    s.gm.region_map(r, MapRequest::new(&frame, gid)).unwrap();
    assert_eq!(
        s.gm.dev_destroy(gid),
        Err(DeviceError::MemoryInUse { frames: 1 })
    );
    // Refused without change: the device and its memory still serve.
    assert_eq!(s.gm.dev_frames(gid).unwrap().free, 4);
    s.gm.region_unmap(r, MapFlags::empty(), None).unwrap();
    s.gm.dev_destroy(gid).unwrap();
    ok(&s, space);
}

#[test]
fn protect_updates_tables_and_invalidates_then_allows_the_write() {
    let (s, space) = system();
    let r = s.gm.as_alloc(space, AllocRequest::new(PAGE_SIZE)).unwrap();
    s.write(0, r.start, b"rw").unwrap();
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert!(matches!(
        s.write(0, r.start, b"no"),
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    ));
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"rw");
    s.gm.region_protect(r, Prot::RW).unwrap();
    s.write(0, r.start, b"ok").unwrap();
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"ok");
    let junk = Prot::from_bits_retain(0x80);
    assert_eq!(
        s.gm.region_protect(r, junk),
        Err(ProtectError::BadProt(junk))
    );
    // No access: every access faults, the data stays.
    s.gm.region_protect(r, Prot::empty()).unwrap();
    ok(&s, space);
    assert!(matches!(
        s.read(0, r.start, 2),
        Err(AccessError::Fault(FaultError::ProtectionViolation { .. }))
    ));
    s.gm.region_protect(r, Prot::READ).unwrap();
    assert_eq!(s.read(0, r.start, 2).unwrap(), b"ok");
    ok(&s, space);
}

#[test]
fn detach_removes_the_devices_table_and_destroy_frees_everything() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, &pattern(9, 4 * PAGE_SIZE as usize))
        .unwrap();
    let tables = s.devices[g].mmu.store().tables();
    s.take_events();
    s.gm.dev_detach(gid, space).unwrap();
    let ev = s.take_events();
    let off = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Activate { root: None, .. }))
        .expect("deactivated");
    let gone = ev
        .iter()
        .position(|e| matches!(e, MmuEvent::Destroy { .. }))
        .expect("table destroyed");
    assert!(
        off < gone,
        "the device stops translating before its table is destroyed: {ev:?}"
    );
    assert_eq!(s.devices[g].mmu.store().tables(), tables - 1);
    assert_eq!(
        s.read(0, r.start, 4 * PAGE_SIZE as usize).unwrap(),
        pattern(9, 4 * PAGE_SIZE as usize)
    );
    ok(&s, space);
    s.gm.as_destroy(space).unwrap();
    let host = s.gm.dev_frames(s.host().id).unwrap();
    let dev = s.gm.dev_frames(gid).unwrap();
    assert_eq!((host.active, dev.active, dev.free), (0, 0, 8));
    assert_eq!(s.gm.dev_active(s.host().id).unwrap(), None);
}

#[test]
fn eviction_reclaims_pages_of_another_space_sharing_the_device() {
    let (mut s, a) = system();
    let g = gpu(&mut s, a, 4);
    let gid = s.devices[g].id;
    let b =
        s.gm.as_create(va(1 << 30), va(2 << 30), AllocPolicy::empty())
            .unwrap();
    s.gm.as_attach(b, gid, MmuMode::Coherent, Activation::Leave)
        .unwrap();
    let ra = s.gm.as_alloc(a, AllocRequest::new(4 * PAGE_SIZE)).unwrap();
    s.write(g, ra.start, &pattern(1, 4 * PAGE_SIZE as usize))
        .unwrap();
    assert_eq!(
        s.gm.dev_frames(gid).unwrap().free,
        0,
        "space a filled the device"
    );
    s.gm.dev_switch(gid, b).unwrap();
    let rb = s.gm.as_alloc(b, AllocRequest::new(2 * PAGE_SIZE)).unwrap();
    s.write(g, rb.start, &pattern(2, 2 * PAGE_SIZE as usize))
        .unwrap();
    assert_eq!(
        s.gm.stats().evictions,
        2,
        "two pages of space a went to host memory"
    );
    s.gm.check_invariants(a).unwrap();
    s.gm.check_invariants(b).unwrap();
    assert_eq!(
        s.read(g, rb.start, 2 * PAGE_SIZE as usize).unwrap(),
        pattern(2, 2 * PAGE_SIZE as usize)
    );
    s.gm.dev_switch(gid, a).unwrap();
    assert_eq!(
        s.read(g, ra.start, 4 * PAGE_SIZE as usize).unwrap(),
        pattern(1, 4 * PAGE_SIZE as usize)
    );
    s.gm.check_invariants(a).unwrap();
    s.gm.check_invariants(b).unwrap();
}

#[test]
fn concurrent_faults_from_two_devices_keep_one_owner_and_every_byte() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(128 * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    // Each device owns alternate pages for writing, then both read everything: pages
    // migrate back and forth under the unique policy while the other thread faults.
    let writers: Vec<_> = [0usize, g]
        .into_iter()
        .enumerate()
        .map(|(k, dev)| {
            let s = s.clone();
            std::thread::spawn(move || {
                for p in (k as u64..128).step_by(2) {
                    let at = va(r.start.as_u64() + p * PAGE_SIZE);
                    s.write(dev, at, &pattern(p as u8, PAGE_SIZE as usize))
                        .unwrap();
                }
                for p in 0..128u64 {
                    let at = va(r.start.as_u64() + p * PAGE_SIZE);
                    let got = s.read(dev, at, PAGE_SIZE as usize);
                    // A page not yet written by the other thread reads as zeros.
                    let got = got.unwrap();
                    assert!(
                        got == pattern(p as u8, PAGE_SIZE as usize) || got.iter().all(|b| *b == 0),
                        "page {p}"
                    );
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for p in 0..128u64 {
        let at = va(r.start.as_u64() + p * PAGE_SIZE);
        assert_eq!(
            s.read(0, at, PAGE_SIZE as usize).unwrap(),
            pattern(p as u8, PAGE_SIZE as usize)
        );
    }
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn wiring_pins_pages_replicates_them_and_unwiring_releases_them() {
    let (mut s, space) = system();
    let host = s.host().id;
    let io = s.add_device(GPU, DevCaps::empty(), 0, 0);
    s.attach(space, io);
    let g = gpu(&mut s, space, 2);
    let gid = s.devices[g].id;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(0, r.start, b"pinned").unwrap();
    assert_eq!(
        s.read(io, r.start, 1),
        Err(AccessError::Unmapped(r.start)),
        "not wired yet"
    );
    assert_eq!(s.gm.region_wire(r).unwrap(), 4);
    assert_eq!(s.gm.dev_frames(host).unwrap().wired, 4);
    assert_eq!(
        s.read(io, r.start, 6).unwrap(),
        b"pinned",
        "replicated to the device that cannot fault"
    );
    ok(&s, space);
    // The GPU faults on the wired page: it is mapped where it is, not migrated.
    assert_eq!(s.read(g, r.start, 6).unwrap(), b"pinned");
    assert_eq!(s.gm.stats().faults_migrate, 0);
    assert_eq!(s.gm.dev_frames(gid).unwrap().active, 0);
    assert_eq!(
        s.gm.region_wire(r).unwrap(),
        0,
        "wiring twice wires nothing new"
    );
    s.gm.region_unwire(r).unwrap();
    assert_eq!(s.gm.dev_frames(host).unwrap().wired, 0);
    assert_eq!(
        s.read(io, r.start, 1),
        Err(AccessError::Unmapped(r.start)),
        "unwired pages leave the device"
    );
    ok(&s, space);
    // Wiring more than the target memory can hold fails and leaves nothing wired.
    let big =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    let on_gpu = Placement {
        target: PlacementTarget::Device(gid),
        mode: PlacementMode::Unique,
    };
    s.gm.region_set_policy(big, on_gpu).unwrap();
    assert!(matches!(
        s.gm.region_wire(big),
        Err(PopulateError::Move(gmem_core::MoveError::OutOfMemory(_)))
    ));
    assert_eq!(s.gm.dev_frames(gid).unwrap().wired, 0);
    ok(&s, space);
}

#[test]
fn driver_frame_constraint_steers_placement_and_forces_eviction_inside_its_window() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let lo = GPU_BASE + 4 * PAGE_SIZE;
    let hi = GPU_BASE + 6 * PAGE_SIZE;
    let window = FrameConstraint {
        align: 0,
        phase: 0,
        nocross: 0,
        min: PhysAddr::new(lo),
        max: PhysAddr::new(hi - 1),
    };
    s.devices[g]
        .memory
        .as_ref()
        .unwrap()
        .set_frame_placement(FramePlacement::Require(window));
    let r =
        s.gm.as_alloc(space, AllocRequest::new(3 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, &pattern(4, 3 * PAGE_SIZE as usize))
        .unwrap();
    let mut in_window = 0;
    for p in 0..3 {
        if let Some(pte) = s.devices[g]
            .mmu
            .translate(va(r.start.as_u64() + p * PAGE_SIZE))
        {
            let pa = pte.pfn * PAGE_SIZE;
            if pa >= GPU_BASE {
                assert!((lo..hi).contains(&pa), "frame {pa:#x} outside the window");
                in_window += 1;
            }
        }
    }
    assert_eq!(
        in_window, 2,
        "a two-frame window holds two of the three pages"
    );
    assert_eq!(s.gm.stats().evictions, 1);
    assert_eq!(
        s.read(0, r.start, 3 * PAGE_SIZE as usize).unwrap(),
        pattern(4, 3 * PAGE_SIZE as usize)
    );
    ok(&s, space);
}

#[test]
fn writes_racing_with_migration_of_the_same_page_are_never_lost() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 64);
    const PAGES: u64 = 2;
    const ROUNDS: u32 = 2000;
    let r =
        s.gm.as_alloc(space, AllocRequest::new(PAGES * PAGE_SIZE))
            .unwrap();
    let s = Arc::new(s);
    let half = (PAGE_SIZE / 2) as usize;
    let byte = |round: u32, dev: usize, p: u64| (round as u8) ^ (dev as u8 * 0x40) ^ p as u8;
    // The CPU owns the low half of two pages, the GPU the high half; each write by one
    // migrates the page away from the other (unique policy) while the other keeps
    // writing through the translation it holds: a migration that copied before it
    // invalidated would lose that write.
    let start = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = [(0usize, 0u64), (g, PAGE_SIZE / 2)]
        .into_iter()
        .map(|(dev, offset)| {
            let s = s.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for round in 1..=ROUNDS {
                    for p in 0..PAGES {
                        let at = va(r.start.as_u64() + p * PAGE_SIZE + offset);
                        s.write(dev, at, &vec![byte(round, dev, p); half]).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..PAGES {
        let page = s
            .read(0, va(r.start.as_u64() + p * PAGE_SIZE), PAGE_SIZE as usize)
            .unwrap();
        assert!(
            page[..half].iter().all(|b| *b == byte(ROUNDS, 0, p)),
            "page {p}: a CPU write was lost"
        );
        assert!(
            page[half..].iter().all(|b| *b == byte(ROUNDS, g, p)),
            "page {p}: a GPU write was lost"
        );
    }
    assert!(
        s.gm.stats().faults_migrate >= PAGES,
        "every page migrated at least once"
    );
    s.gm.check_invariants(space).unwrap();
}

#[test]
fn dropping_the_instance_frees_devices_and_spaces() {
    let (mut s, space) = system();
    let g = gpu(&mut s, space, 8);
    let r =
        s.gm.as_alloc(space, AllocRequest::new(4 * PAGE_SIZE))
            .unwrap();
    s.write(g, r.start, b"bytes").unwrap();
    let mmu = Arc::downgrade(&s.devices[g].mmu);
    let memory = Arc::downgrade(s.devices[g].memory.as_ref().unwrap());
    drop(s);
    assert!(mmu.upgrade().is_none(), "the GPU's MMU was freed");
    assert!(memory.upgrade().is_none(), "the GPU's memory was freed");
}
